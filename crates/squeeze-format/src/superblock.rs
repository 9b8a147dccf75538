//! The superblock: identity, geometry, compression policy and the pointer to
//! the newest durable checkpoint. Two 4 KiB slots are written alternately
//! (slot = generation % 2), each fsynced before it counts; the valid slot
//! with the higher generation wins, so a torn superblock write leaves the
//! previous one in force.
//!
//! ```text
//! byte  0  magic             [8]  "SQUEEZE\0"
//!       8  version           u32  1 to 7 (see `FORMAT_VERSION`)
//!      12  flags             u32  bit 0: clean (closed with a final checkpoint)
//!      16  uuid              [16]
//!      32  generation        u64  bumped on every superblock write
//!      40  logical_size      u64  bytes, a multiple of SECTOR_SIZE
//!      48  sector_size       u32  4096
//!      52  segment_size      u32  bytes, power of two
//!      56  max_physical      u64  cap on the backing file, 0 = none
//!      64  algorithm codec   u8   CodecId
//!      65  mode              u8   CompressionMode
//!      66  recompress codec  u8   CodecId used by the cleaner, 0 = off
//!      67  read chunk        u8   format 5: records' chunk code (`record.rs`),
//!                                 0 = one frame; 0 before format 5
//!      68  algorithm level   i32
//!      72  required ratio    u32  parts per million (875000 = 0.875)
//!      76  min_blob          u32  bytes
//!      80  max_blob          u32  bytes
//!      84  recompress level  i32
//!      88  created           u64  unix seconds
//!      96  ckpt_len          u64  checkpoint bytes (v2: the chain; v1: the stream)
//!     104  ckpt_crc          u32  v2: CRC-32C of the chain's last piece;
//!                                 v1: CRC-32C of the whole stream
//!     108  ckpt_segments     u32  number of segment ids that follow
//!     112  segment ids       u32 x ckpt_segments (at most MAX_CKPT_SEGMENTS;
//!                                 before format 7, MAX_CKPT_SEGMENTS_BEFORE_7)
//!    4080  dedup settings    [12] format 7: mode, index budget
//!                                 (`dedup_settings.rs`); before 7, segment ids
//!    4092  crc               u32  CRC-32C of bytes 0..4092
//! ```

use crate::dedup_settings::{DedupSettings, DEDUP_SETTINGS_OFFSET};
use crate::layout::{
    MAX_BACKING_BYTES, MAX_BLOB_SECTORS, SECTOR_SIZE, SEGMENT_SIZE_MAX, SEGMENT_SIZE_MIN,
    SUPERBLOCK_SIZE,
};
use crate::le::{get_i32, get_u32, get_u64, put_i32, put_u32, put_u64};
use crate::{checksum, CodecId, FormatError};

pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"SQUEEZE\0";
/// The format version this build writes. It also reads versions 1 to 3:
/// version 1's checkpoint is one dense stream instead of a chain of
/// pieces, version 2's pieces carry no segment notes (`checkpoint/`);
/// the first checkpoint written on such a volume is a base in this
/// version, which upgrades it. Version 3 differs from 4 only in its log:
/// every record has a full header, where version 4 writes short ones
/// (`record.rs`) once its superblock says 4; the first checkpoint (a
/// delta) upgrades it. Version 4 differs from 5 only in its log and
/// policy: version 5 records may carry chunked payloads (`chunks.rs`), which
/// a version 4 volume writes once its first checkpoint has made it 5 and
/// its policy asks for them (`Policy::read_chunk`). Version 5 differs from
/// 6 only in its log: version 6 records may carry block payloads
/// (`zstd_block.rs`), which a version 5 volume writes once its first
/// checkpoint has made it 6. Version 6 differs from 7 only in its log and
/// map: version 7 may hold Link records and indirect map entries
/// (deduplication, docs/DEDUP.md), which a volume writes once a
/// checkpoint has made it 7.
pub const FORMAT_VERSION: u32 = 7;
/// The first version whose records may have short headers.
pub const SHORT_HEADER_VERSION: u32 = 4;
/// The first version whose records may be chunked.
pub const CHUNKED_VERSION: u32 = 5;
/// The first version whose records may carry block payloads.
pub const BLOCK_VERSION: u32 = 6;
/// The first version whose log may hold Link records and whose map may
/// hold indirect entries (deduplication).
pub const DEDUP_VERSION: u32 = 7;
/// The oldest version whose checkpoint chain this build extends with a
/// delta (older chains restart with a base).
pub const CHAIN_VERSION: u32 = 3;
/// The oldest format version this build opens.
pub const OLDEST_READABLE_VERSION: u32 = 1;
/// Most segments one checkpoint may span (format 7: the ids end where the
/// dedup settings begin).
pub const MAX_CKPT_SEGMENTS: usize = (DEDUP_SETTINGS_OFFSET - 112) / 4;
/// ... in a superblock of a version before 7, whose ids could run up to
/// the checksum.
pub const MAX_CKPT_SEGMENTS_BEFORE_7: usize = (SUPERBLOCK_SIZE - 4 - 112) / 4;

/// Most segments a checkpoint of a superblock in `version` may span.
fn max_ckpt_segments(version: u32) -> usize {
    if version < DEDUP_VERSION {
        MAX_CKPT_SEGMENTS_BEFORE_7
    } else {
        MAX_CKPT_SEGMENTS
    }
}

/// BlueStore's compression_mode, with its meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CompressionMode {
    /// Never compress.
    None = 0,
    /// Compress only when the client hints that data is compressible.
    Passive = 1,
    /// Compress unless the client hints that data is incompressible.
    Aggressive = 2,
    /// Compress always, ignoring hints.
    Force = 3,
}

impl CompressionMode {
    pub const ALL: [CompressionMode; 4] = [
        CompressionMode::None,
        CompressionMode::Passive,
        CompressionMode::Aggressive,
        CompressionMode::Force,
    ];
    pub fn from_u8(v: u8) -> Result<Self, FormatError> {
        Self::ALL
            .into_iter()
            .find(|m| *m as u8 == v)
            .ok_or_else(|| FormatError::Invalid {
                what: "superblock",
                why: format!("unknown compression mode {v}"),
            })
    }
    pub fn name(self) -> &'static str {
        match self {
            CompressionMode::None => "none",
            CompressionMode::Passive => "passive",
            CompressionMode::Aggressive => "aggressive",
            CompressionMode::Force => "force",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// The compression policy stored in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub codec: CodecId,
    pub level: i32,
    pub mode: CompressionMode,
    /// Keep a compressed blob only if its size is at most this fraction
    /// of the raw size, in parts per million.
    pub required_ratio_ppm: u32,
    pub min_blob: u32,
    pub max_blob: u32,
    /// Codec the cleaner recompresses moved extents with (None = keep).
    pub recompress_codec: CodecId,
    pub recompress_level: i32,
    /// Bytes of the independent chunks a record's payload is cut into
    /// (format 5, `chunks.rs`), so a small read decodes one chunk instead
    /// of the blob: 0 for one frame per record, else a power of two from
    /// 4 KiB to 64 KiB.
    pub read_chunk: u32,
}

impl Policy {
    /// Checks the invariants every stored policy obeys.
    pub fn validate(&self) -> Result<(), FormatError> {
        let bad = |why: String| {
            Err(FormatError::Invalid {
                what: "policy",
                why,
            })
        };
        let sector = SECTOR_SIZE as u32;
        let max = MAX_BLOB_SECTORS * sector;
        if self.min_blob == 0 || !self.min_blob.is_multiple_of(sector) || self.min_blob > max {
            return bad(format!(
                "min_blob {} must be a multiple of {sector} up to {max}",
                self.min_blob
            ));
        }
        if !self.max_blob.is_multiple_of(sector)
            || self.max_blob < self.min_blob
            || self.max_blob > max
        {
            return bad(format!(
                "max_blob {} must be a multiple of {sector} between min_blob ({}) and {max}",
                self.max_blob, self.min_blob
            ));
        }
        if self.required_ratio_ppm == 0 || self.required_ratio_ppm > 1_000_000 {
            return bad(format!(
                "required ratio {} must be in (0, 1]",
                f64::from(self.required_ratio_ppm) / 1e6
            ));
        }
        if self.read_chunk != 0
            && (!self.read_chunk.is_multiple_of(sector)
                || !crate::chunks::valid_chunk_sectors(self.read_chunk / sector))
        {
            return bad(format!(
                "read chunk {} must be 0 (one frame a record) or a power of two from 4 KiB to {} KiB",
                self.read_chunk,
                crate::chunks::MAX_CHUNK_SECTORS * 4
            ));
        }
        Ok(())
    }

    /// Sectors of a record's chunks under this policy (0: one frame).
    pub fn read_chunk_sectors(&self) -> u32 {
        self.read_chunk / SECTOR_SIZE as u32
    }

    /// The superblock byte of `read_chunk`: 0, or log2 of its sectors + 1.
    fn read_chunk_code(&self) -> u8 {
        match self.read_chunk_sectors() {
            0 => 0,
            s => s.trailing_zeros() as u8 + 1,
        }
    }
}

/// Where the newest checkpoint lives.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CheckpointRef {
    pub len: u64,
    pub crc: u32,
    pub segments: Vec<u32>,
}

/// A decoded superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The format the volume is in (`FORMAT_VERSION` for everything this
    /// build writes; 1 to 3 for a volume not yet upgraded: its checkpoint is
    /// in that format, and its log has full record headers only).
    pub version: u32,
    pub uuid: [u8; 16],
    pub generation: u64,
    pub logical_size: u64,
    pub segment_size: u32,
    pub max_physical: u64,
    pub policy: Policy,
    /// Format 7: the deduplication mode and index budget (the default
    /// before 7).
    pub dedup: DedupSettings,
    pub created_unix: u64,
    /// Set by a clean close: nothing follows the checkpoint's replay position.
    pub clean: bool,
    pub checkpoint: CheckpointRef,
}

impl Superblock {
    /// Byte offset of a segment in the backing file.
    pub fn segment_offset(&self, segment: u32) -> u64 {
        crate::layout::segment_offset(u64::from(self.segment_size), segment)
    }

    /// The slot this generation is written to.
    pub fn slot(&self) -> u64 {
        self.generation % 2
    }

    /// Number of logical sectors.
    pub fn sectors(&self) -> u64 {
        self.logical_size / SECTOR_SIZE as u64
    }

    pub fn validate(&self) -> Result<(), FormatError> {
        let bad = |why: String| {
            Err(FormatError::Invalid {
                what: "superblock",
                why,
            })
        };
        if self.logical_size == 0 || !self.logical_size.is_multiple_of(SECTOR_SIZE as u64) {
            return bad(format!(
                "logical size {} is not a positive multiple of {SECTOR_SIZE}",
                self.logical_size
            ));
        }
        let seg = u64::from(self.segment_size);
        if !seg.is_power_of_two() || !(SEGMENT_SIZE_MIN..=SEGMENT_SIZE_MAX).contains(&seg) {
            return bad(format!("segment size {seg} out of range"));
        }
        if self.max_physical > MAX_BACKING_BYTES {
            return bad(format!("max physical {} too large", self.max_physical));
        }
        if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&self.version) {
            return bad(format!("version {}", self.version));
        }
        if self.checkpoint.segments.len() > max_ckpt_segments(self.version) {
            return bad("too many checkpoint segments".into());
        }
        if self.version < DEDUP_VERSION && self.dedup != DedupSettings::default() {
            return bad(format!(
                "dedup settings in a version {} superblock (they need version {DEDUP_VERSION})",
                self.version
            ));
        }
        self.dedup.validate()?;
        if self.version < CHUNKED_VERSION && self.policy.read_chunk != 0 {
            return bad(format!(
                "a read chunk in a version {} superblock (chunked records need version {CHUNKED_VERSION})",
                self.version
            ));
        }
        self.policy.validate()
    }

    /// Encodes into exactly SUPERBLOCK_SIZE bytes.
    pub fn encode(&self) -> Vec<u8> {
        self.validate().expect("encoding an invalid superblock");
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        b[0..8].copy_from_slice(&SUPERBLOCK_MAGIC);
        put_u32(&mut b, 8, self.version);
        put_u32(&mut b, 12, u32::from(self.clean));
        b[16..32].copy_from_slice(&self.uuid);
        put_u64(&mut b, 32, self.generation);
        put_u64(&mut b, 40, self.logical_size);
        put_u32(&mut b, 48, SECTOR_SIZE as u32);
        put_u32(&mut b, 52, self.segment_size);
        put_u64(&mut b, 56, self.max_physical);
        let p = &self.policy;
        b[64] = p.codec as u8;
        b[65] = p.mode as u8;
        b[66] = p.recompress_codec as u8;
        b[67] = p.read_chunk_code();
        put_i32(&mut b, 68, p.level);
        put_u32(&mut b, 72, p.required_ratio_ppm);
        put_u32(&mut b, 76, p.min_blob);
        put_u32(&mut b, 80, p.max_blob);
        put_i32(&mut b, 84, p.recompress_level);
        put_u64(&mut b, 88, self.created_unix);
        put_u64(&mut b, 96, self.checkpoint.len);
        put_u32(&mut b, 104, self.checkpoint.crc);
        put_u32(&mut b, 108, self.checkpoint.segments.len() as u32);
        for (i, s) in self.checkpoint.segments.iter().enumerate() {
            put_u32(&mut b, 112 + 4 * i, *s);
        }
        if self.version >= DEDUP_VERSION {
            self.dedup.encode(&mut b);
        }
        let crc = checksum::crc32c(&b[..SUPERBLOCK_SIZE - 4]);
        put_u32(&mut b, SUPERBLOCK_SIZE - 4, crc);
        b
    }

    /// Decodes and validates one slot.
    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        if b.len() < SUPERBLOCK_SIZE {
            return Err(FormatError::Truncated {
                what: "superblock",
                need: SUPERBLOCK_SIZE,
                have: b.len(),
            });
        }
        if b[0..8] != SUPERBLOCK_MAGIC {
            return Err(FormatError::BadMagic { what: "volume" });
        }
        let expected = get_u32(b, SUPERBLOCK_SIZE - 4);
        let got = checksum::crc32c(&b[..SUPERBLOCK_SIZE - 4]);
        if expected != got {
            return Err(FormatError::ChecksumMismatch {
                what: "superblock",
                expected,
                got,
            });
        }
        let version = get_u32(b, 8);
        if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(FormatError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        if get_u32(b, 48) != SECTOR_SIZE as u32 {
            return Err(FormatError::Invalid {
                what: "superblock",
                why: format!("sector size {}", get_u32(b, 48)),
            });
        }
        let flags = get_u32(b, 12);
        if flags & !1 != 0 {
            return Err(FormatError::Invalid {
                what: "superblock",
                why: format!("unknown flags {flags:#x}"),
            });
        }
        let n = get_u32(b, 108) as usize;
        if n > max_ckpt_segments(version) {
            return Err(FormatError::Invalid {
                what: "superblock",
                why: format!("{n} checkpoint segments"),
            });
        }
        let sb = Superblock {
            version,
            uuid: b[16..32].try_into().expect("16 bytes"),
            generation: get_u64(b, 32),
            logical_size: get_u64(b, 40),
            segment_size: get_u32(b, 52),
            max_physical: get_u64(b, 56),
            policy: Policy {
                codec: CodecId::from_u8(b[64])?,
                mode: CompressionMode::from_u8(b[65])?,
                recompress_codec: CodecId::from_u8(b[66])?,
                level: get_i32(b, 68),
                required_ratio_ppm: get_u32(b, 72),
                min_blob: get_u32(b, 76),
                max_blob: get_u32(b, 80),
                recompress_level: get_i32(b, 84),
                read_chunk: match b[67] {
                    0 => 0,
                    c @ 1..=5 => (SECTOR_SIZE as u32) << (c - 1),
                    c => {
                        return Err(FormatError::Invalid {
                            what: "superblock",
                            why: format!("unknown read chunk code {c}"),
                        })
                    }
                },
            },
            dedup: if version >= DEDUP_VERSION {
                DedupSettings::decode(b)?
            } else {
                DedupSettings::default()
            },
            created_unix: get_u64(b, 88),
            clean: flags & 1 != 0,
            checkpoint: CheckpointRef {
                len: get_u64(b, 96),
                crc: get_u32(b, 104),
                segments: (0..n).map(|i| get_u32(b, 112 + 4 * i)).collect(),
            },
        };
        sb.validate()?;
        Ok(sb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Superblock {
        Superblock {
            version: FORMAT_VERSION,
            uuid: [3; 16],
            generation: 5,
            logical_size: 64 << 30,
            segment_size: 32 << 20,
            max_physical: 0,
            policy: Policy {
                codec: CodecId::Lz4,
                level: 0,
                mode: CompressionMode::Aggressive,
                required_ratio_ppm: 875_000,
                min_blob: 4096,
                max_blob: 131072,
                recompress_codec: CodecId::None,
                recompress_level: 0,
                read_chunk: 32 << 10,
            },
            dedup: DedupSettings::default(),
            created_unix: 1_700_000_000,
            clean: true,
            checkpoint: CheckpointRef {
                len: 12345,
                crc: 42,
                segments: vec![0, 7, 9],
            },
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        // A version 1 superblock stays version 1 until its volume upgrades.
        let mut v1 = Superblock {
            version: 1,
            ..sample()
        };
        // Before version 5 there are no chunks.
        assert!(v1.validate().is_err());
        v1.policy.read_chunk = 0;
        assert_eq!(Superblock::decode(&v1.encode()).unwrap().version, 1);
    }

    #[test]
    fn version_and_magic_and_checksum() {
        let mut b = sample().encode();
        b[0] = b'X';
        assert!(matches!(
            Superblock::decode(&b),
            Err(FormatError::BadMagic { .. })
        ));
        let mut b = sample().encode();
        b[100] ^= 1;
        assert!(matches!(
            Superblock::decode(&b),
            Err(FormatError::ChecksumMismatch { .. })
        ));
        let mut b = sample().encode();
        for v in [0, FORMAT_VERSION + 1, 99] {
            put_u32(&mut b, 8, v);
            let crc = checksum::crc32c(&b[..SUPERBLOCK_SIZE - 4]);
            put_u32(&mut b, SUPERBLOCK_SIZE - 4, crc);
            assert!(
                matches!(
                    Superblock::decode(&b),
                    Err(FormatError::UnsupportedVersion { found, .. }) if found == v
                ),
                "version {v}"
            );
        }
    }

    #[test]
    fn policy_bounds() {
        let mut p = sample().policy;
        p.max_blob = 256 << 10;
        assert!(p.validate().is_err());
        p.max_blob = 4096;
        p.min_blob = 8192;
        assert!(p.validate().is_err());
        p.min_blob = 4096;
        p.required_ratio_ppm = 0;
        assert!(p.validate().is_err());
        p.required_ratio_ppm = 875_000;
        for (chunk, ok) in [
            (0, true),
            (4096, true),
            (65536, true),
            (131072, false),
            (12288, false),
            (100, false),
        ] {
            p.read_chunk = chunk;
            assert_eq!(p.validate().is_ok(), ok, "{chunk}");
        }
    }

    #[test]
    fn the_read_chunk_round_trips_and_bad_codes_are_refused() {
        for chunk in [0, 4096, 8192, 16384, 32768, 65536] {
            let mut sb = sample();
            sb.policy.read_chunk = chunk;
            assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        }
        let mut b = sample().encode();
        b[67] = 6;
        let crc = checksum::crc32c(&b[..SUPERBLOCK_SIZE - 4]);
        put_u32(&mut b, SUPERBLOCK_SIZE - 4, crc);
        assert!(Superblock::decode(&b).is_err());
    }

    #[test]
    fn dedup_settings_from_format_7_and_segment_ids_before_it() {
        use crate::dedup_settings::DedupMode;
        let mut sb = sample();
        sb.dedup = DedupSettings {
            mode: DedupMode::Idle,
            index_mib: 32,
        };
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        // Format 7 holds at most MAX_CKPT_SEGMENTS ids: the settings follow.
        sb.checkpoint.segments = (0..MAX_CKPT_SEGMENTS as u32).collect();
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        sb.checkpoint.segments.push(7);
        assert!(sb.validate().is_err());
        // Before 7 the bytes are segment ids, and settings are refused.
        let mut v6 = Superblock {
            version: 6,
            ..sample()
        };
        v6.checkpoint.segments = (1..=MAX_CKPT_SEGMENTS_BEFORE_7 as u32).collect();
        let back = Superblock::decode(&v6.encode()).unwrap();
        assert_eq!(back, v6);
        assert_eq!(back.dedup, DedupSettings::default());
        v6.dedup.mode = DedupMode::Idle;
        assert!(v6.validate().is_err());
    }
}
