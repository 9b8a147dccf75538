//! Log records: the log is the journal (DESIGN principle 1). Each record is
//! self-describing, so recovery can replay the log after a checkpoint and a
//! scrub can verify every record without any other metadata.
//!
//! A record's header comes in one of two forms. The **full** header (64
//! bytes, every kind, the only form before format 4):
//!
//! ```text
//! byte  0  magic        u32  "SQZR"
//!       4  kind         u8   RecordKind
//!       5  codec        u8   CodecId of the payload (extents), 0 otherwise
//!       6  flags        u16  bits 0..3 chunk code (format 5, see below), other
//!                            bits reserved, zero
//!       8  seq          u64  log sequence number, strictly increasing
//!      16  uuid         [16] volume uuid (a record of another volume is foreign)
//!      32  lba          u64  first logical sector
//!      40  sectors      u32  sector count (extents: 1..=MAX_BLOB_SECTORS)
//!      44  stored_len   u32  payload bytes following the header
//!      48  aux          u64  kind-specific: segment id (SegmentHeader),
//!                            byte offset of the record being moved (Relocate),
//!                            the first hidden address linked to (Link)
//!      56  payload_crc  u32  CRC-32C of the payload (0 when empty)
//!      60  header_crc   u32  CRC-32C of bytes 0..60
//! ```
//!
//! The **short** header (32 bytes, format 4: extents and relocations whose
//! sectors lie below 2^40): the uuid is not stored but seeds the header's
//! CRC, so a record of another volume fails it. Its encoding and decoding
//! are in `record_short.rs`.
//!
//! ```text
//! byte  0  magic        [2]  "sz"
//!       2  fields       u32  bits 0..5 sectors - 1, 5..23 stored_len,
//!                            23..26 codec, 26 kind (0 Extent, 1 Relocate),
//!                            27..30 chunk code (format 5), 30..32 zero
//!       6  seq          u64
//!      14  lba          u40
//!      19  aux / 16     u40  Relocate: the moved record's byte offset / 16; Extent: 0
//!      24  payload_crc  u32
//!      28  header_crc   u32  CRC-32C of the volume uuid, then bytes 0..28
//! ```
//!
//! The chunk code (format 5) says how the payload is laid out: 0, one frame
//! of the codec (or the raw bytes when the codec is `None`); `c` in 1..=5,
//! independent chunks of `1 << (c - 1)` sectors behind a table
//! (`chunks.rs`), only on an extent or relocation of more sectors than one
//! chunk. The payload CRC is then the table's. 6 (format 6), a zstd
//! extent or relocation whose payload is the body of one compressed zstd
//! block, its frame implied and its raw bytes past the block's content
//! zeros (`zstd_block.rs`). 7 is reserved.
//!
//! A record occupies `align_record(header + stored_len)` bytes. Invariants
//! checked on decode: magic, header checksum, known kind and codec,
//! reserved bits zero, sector count within bounds for the kind, and (for
//! extents) a payload that fits the uncompressed size when the codec is
//! `None`.

use crate::chunks::{self, ChunkTable};
use crate::layout::{
    align_record, MAX_BLOB_SECTORS, RECORD_ALIGN, RECORD_HEADER_SIZE, SECTOR_SIZE, SHARED_BASE,
    SHORT_HEADER_SIZE, SHORT_MAX_SECTORS,
};
use crate::le::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use crate::zstd_block::BLOCK_CODE;
use crate::{checksum, CodecId, FormatError};

pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SQZR");
/// The first two bytes of a short header (format 4).
pub const SHORT_MAGIC: [u8; 2] = *b"sz";

/// Largest field values a short header holds.
pub(crate) const SHORT_STORED_MAX: u32 = (1 << 18) - 1;
pub(crate) const SHORT_U40_MAX: u64 = (1 << 40) - 1;

/// How a record's header is laid out (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderForm {
    /// 64 bytes, every kind.
    Full,
    /// 32 bytes, extents and relocations (format 4).
    Short,
}

impl HeaderForm {
    /// Bytes of a header in this form.
    pub const fn header_bytes(self) -> usize {
        match self {
            HeaderForm::Full => RECORD_HEADER_SIZE,
            HeaderForm::Short => SHORT_HEADER_SIZE,
        }
    }

    /// Bytes a record with `payload_len` bytes of payload and a header in
    /// this form occupies in the log.
    pub const fn record_bytes(self, payload_len: u64) -> u64 {
        align_record(self.header_bytes() as u64 + payload_len)
    }

    /// The form a record gets: short where `short_allowed` (the volume is
    /// in format 4) and its fields fit one, full otherwise.
    pub fn choose(
        short_allowed: bool,
        kind: RecordKind,
        lba: u64,
        sectors: u32,
        stored_len: u32,
        aux: u64,
    ) -> HeaderForm {
        let fits = kind.has_payload()
            && (1..=MAX_BLOB_SECTORS).contains(&sectors)
            && stored_len <= SHORT_STORED_MAX
            && lba
                .checked_add(u64::from(sectors))
                .is_some_and(|end| end <= SHORT_MAX_SECTORS)
            && aux.is_multiple_of(RECORD_ALIGN)
            && aux / RECORD_ALIGN <= SHORT_U40_MAX;
        if short_allowed && fits {
            HeaderForm::Short
        } else {
            HeaderForm::Full
        }
    }
}

/// What a record means to replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// First record of every log segment: names the segment (aux) and
    /// continues the sequence; replay finds the next segment by its seq.
    SegmentHeader = 1,
    /// Client data for `sectors` sectors from `lba`, in codec `codec`.
    Extent = 2,
    /// `sectors` sectors from `lba` read as zeros and hold no space (trim,
    /// write-zeroes, or all-zero client data).
    Zero = 3,
    /// The cleaner moved an extent: applies to each sector only where the
    /// map still points at the record at byte offset `aux`.
    Relocate = 4,
    /// Deduplication (docs/DEDUP.md): `sectors` client sectors from `lba`
    /// read as the hidden addresses from `aux` on (indirect map entries);
    /// no payload. Full header only.
    Link = 5,
}

impl RecordKind {
    pub fn from_u8(v: u8) -> Result<RecordKind, FormatError> {
        match v {
            1 => Ok(RecordKind::SegmentHeader),
            2 => Ok(RecordKind::Extent),
            3 => Ok(RecordKind::Zero),
            4 => Ok(RecordKind::Relocate),
            5 => Ok(RecordKind::Link),
            _ => Err(FormatError::Invalid {
                what: "record",
                why: format!("unknown record kind {v}"),
            }),
        }
    }
    /// Kinds that carry sector data in a payload.
    pub fn has_payload(self) -> bool {
        matches!(self, RecordKind::Extent | RecordKind::Relocate)
    }
}

/// A decoded record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub codec: CodecId,
    pub seq: u64,
    pub uuid: [u8; 16],
    pub lba: u64,
    pub sectors: u32,
    pub stored_len: u32,
    pub aux: u64,
    pub payload_crc: u32,
    /// 0: the payload is one frame of the codec (or raw); otherwise
    /// (format 5) independent chunks of this many sectors behind a table
    /// (`chunks.rs`), and `payload_crc` is the table's.
    pub chunk_sectors: u32,
    /// The payload is a zstd block without its frame, the raw bytes past
    /// its content zeros (format 6, chunk code 6: `zstd_block.rs`).
    pub block: bool,
    /// How the header is (to be) laid out; `uuid` is in a short header's
    /// CRC, not in its bytes.
    pub form: HeaderForm,
}

impl RecordHeader {
    /// Bytes the whole record occupies in the segment.
    pub fn record_len(&self) -> u64 {
        self.form.record_bytes(u64::from(self.stored_len))
    }

    /// Bytes of the header: the payload starts here.
    pub fn header_len(&self) -> usize {
        self.form.header_bytes()
    }

    /// Whether the payload is chunked (format 5).
    pub fn is_chunked(&self) -> bool {
        self.chunk_sectors != 0
    }

    /// Bytes of the payload's chunk table (0 when not chunked).
    pub fn table_len(&self) -> usize {
        if self.is_chunked() {
            chunks::table_len(self.sectors, self.chunk_sectors)
        } else {
            0
        }
    }

    /// The chunk code of the header's bits (see the module's
    /// documentation).
    pub(crate) fn chunk_code(&self) -> u32 {
        if self.block {
            BLOCK_CODE
        } else if self.chunk_sectors == 0 {
            0
        } else {
            self.chunk_sectors.trailing_zeros() + 1
        }
    }

    /// Uncompressed payload size.
    pub fn raw_len(&self) -> usize {
        self.sectors as usize * SECTOR_SIZE
    }

    /// Encodes into the first `header_len()` bytes of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        assert!(out.len() >= self.header_len());
        self.check_bounds()
            .expect("encoding an invalid record header");
        if self.form == HeaderForm::Short {
            return self.encode_short(&mut out[..SHORT_HEADER_SIZE]);
        }
        let b = &mut out[..RECORD_HEADER_SIZE];
        put_u32(b, 0, RECORD_MAGIC);
        b[4] = self.kind as u8;
        b[5] = self.codec as u8;
        put_u16(b, 6, self.chunk_code() as u16);
        put_u64(b, 8, self.seq);
        b[16..32].copy_from_slice(&self.uuid);
        put_u64(b, 32, self.lba);
        put_u32(b, 40, self.sectors);
        put_u32(b, 44, self.stored_len);
        put_u64(b, 48, self.aux);
        put_u32(b, 56, self.payload_crc);
        let crc = checksum::crc32c(&b[..60]);
        put_u32(b, 60, crc);
    }

    /// Decodes and validates a header (not the payload, see
    /// [`verify_payload`]) of the volume `uuid`: a short one must carry it
    /// in its CRC, and gets it; a full one carries its own (the caller
    /// compares). `b` holds at least the header (32 bytes may be a short
    /// header's whole record start; a full one needs 64).
    pub fn decode(b: &[u8], uuid: &[u8; 16]) -> Result<RecordHeader, FormatError> {
        if b.len() >= 2 && b[..2] == SHORT_MAGIC {
            return Self::decode_short(b, uuid);
        }
        if b.len() < RECORD_HEADER_SIZE {
            return Err(FormatError::Truncated {
                what: "record header",
                need: RECORD_HEADER_SIZE,
                have: b.len(),
            });
        }
        if get_u32(b, 0) != RECORD_MAGIC {
            return Err(FormatError::BadMagic { what: "record" });
        }
        let expected = get_u32(b, 60);
        let got = checksum::crc32c(&b[..60]);
        if expected != got {
            return Err(FormatError::ChecksumMismatch {
                what: "record header",
                expected,
                got,
            });
        }
        let flags = get_u16(b, 6);
        if flags & !7 != 0 {
            return Err(FormatError::Invalid {
                what: "record",
                why: "reserved flags set".into(),
            });
        }
        let h = RecordHeader {
            kind: RecordKind::from_u8(b[4])?,
            codec: CodecId::from_u8(b[5])?,
            seq: get_u64(b, 8),
            uuid: b[16..32].try_into().expect("16 bytes"),
            lba: get_u64(b, 32),
            sectors: get_u32(b, 40),
            stored_len: get_u32(b, 44),
            aux: get_u64(b, 48),
            payload_crc: get_u32(b, 56),
            chunk_sectors: chunk_sectors_of(u32::from(flags))?,
            block: u32::from(flags) == BLOCK_CODE,
            form: HeaderForm::Full,
        };
        h.check_bounds()?;
        Ok(h)
    }

    pub(crate) fn check_bounds(&self) -> Result<(), FormatError> {
        let bad = |why: String| {
            Err(FormatError::Invalid {
                what: "record",
                why,
            })
        };
        match self.kind {
            RecordKind::Extent | RecordKind::Relocate => {
                if self.sectors == 0 || self.sectors > MAX_BLOB_SECTORS {
                    return bad(format!("extent of {} sectors", self.sectors));
                }
                // A chunked payload is its table and at least a byte a chunk.
                let table = self.table_len();
                if self.is_chunked()
                    && (!chunks::valid_chunk_sectors(self.chunk_sectors)
                        || self.chunk_sectors >= self.sectors)
                {
                    return bad(format!(
                        "chunks of {} sectors in an extent of {}",
                        self.chunk_sectors, self.sectors
                    ));
                }
                let least = if self.is_chunked() {
                    table + chunks::chunk_count(self.sectors, self.chunk_sectors)
                } else {
                    1
                };
                let len = self.stored_len as usize;
                if len < least || len > self.raw_len() + table {
                    return bad(format!(
                        "stored length {} for {} sectors",
                        self.stored_len, self.sectors
                    ));
                }
                if self.codec == CodecId::None && len != self.raw_len() + table {
                    return bad("uncompressed extent with a short payload".into());
                }
                // A block payload: zstd's, one block, shorter than its sectors.
                if self.block
                    && (self.codec != CodecId::Zstd || len >= self.raw_len() || self.is_chunked())
                {
                    return bad(format!(
                        "a block payload of {len} bytes in {:?} for {} sectors",
                        self.codec, self.sectors
                    ));
                }
            }
            RecordKind::Zero | RecordKind::SegmentHeader | RecordKind::Link
                if self.is_chunked() || self.block =>
            {
                return bad(format!("a chunked {:?} record", self.kind));
            }
            RecordKind::Zero => {
                if self.sectors == 0 || self.stored_len != 0 {
                    return bad("zero record with a payload or no sectors".into());
                }
            }
            RecordKind::SegmentHeader => {
                if self.sectors != 0 || self.stored_len != 0 {
                    return bad("segment header with sectors or payload".into());
                }
            }
            RecordKind::Link => {
                if self.sectors == 0 || self.stored_len != 0 || self.codec != CodecId::None {
                    return bad("link record with a payload, a codec or no sectors".into());
                }
                let n = u64::from(self.sectors);
                if self.lba.checked_add(n).is_none_or(|end| end > SHARED_BASE)
                    || !crate::map_entry::is_shared(self.aux)
                    || !crate::map_entry::is_shared(self.aux + n - 1)
                {
                    return bad(format!(
                        "link of {} sectors from {} to {:#x} leaves the client or the hidden range",
                        self.sectors, self.lba, self.aux
                    ));
                }
            }
        }
        if self.lba.checked_add(u64::from(self.sectors)).is_none() {
            return bad("LBA range overflows".into());
        }
        Ok(())
    }
}

/// The chunk size a header's chunk code (3 bits) stands for: 0 (one frame,
/// or a block payload: code 6) or `1 << (code - 1)` sectors for codes 1..=5.
pub(crate) fn chunk_sectors_of(code: u32) -> Result<u32, FormatError> {
    match code {
        0 | BLOCK_CODE => Ok(0),
        1..=5 => Ok(1 << (code - 1)),
        _ => Err(FormatError::Invalid {
            what: "record",
            why: format!("unknown chunk code {code}"),
        }),
    }
}

/// The chunk table of a chunked record's payload (at least its table's
/// bytes), checked against the header.
pub fn chunk_table(h: &RecordHeader, payload: &[u8]) -> Result<ChunkTable, FormatError> {
    ChunkTable::decode(
        payload,
        h.sectors,
        h.chunk_sectors,
        h.stored_len,
        h.payload_crc,
    )
}

/// Checks a payload against the header's checksum (a chunked one: its
/// table, then every chunk against the table).
pub fn verify_payload(h: &RecordHeader, payload: &[u8]) -> Result<(), FormatError> {
    if payload.len() != h.stored_len as usize {
        return Err(FormatError::Truncated {
            what: "record payload",
            need: h.stored_len as usize,
            have: payload.len(),
        });
    }
    if h.is_chunked() {
        let table = chunk_table(h, payload)?;
        for c in table.chunks() {
            c.verify(&payload[c.stored.clone()])?;
        }
        return Ok(());
    }
    let got = checksum::crc32c(payload);
    if got != h.payload_crc {
        return Err(FormatError::ChecksumMismatch {
            what: "record payload",
            expected: h.payload_crc,
            got,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record_short::short_crc;

    fn sample() -> RecordHeader {
        RecordHeader {
            kind: RecordKind::Extent,
            codec: CodecId::Zstd,
            seq: 77,
            uuid: [9; 16],
            lba: 1234,
            sectors: 2,
            stored_len: 1000,
            aux: 0,
            payload_crc: 0xdead_beef,
            chunk_sectors: 0,
            block: false,
            form: HeaderForm::Full,
        }
    }

    #[test]
    fn round_trip_and_len() {
        let h = sample();
        let mut b = [0u8; 64];
        h.encode(&mut b);
        assert_eq!(RecordHeader::decode(&b, &[9; 16]).unwrap(), h);
        assert_eq!(h.record_len(), align_record(1064));
    }

    /// Encodes `h` (uuid [9; 16]) and checks that each of its bits, flipped,
    /// makes the header fail to decode; returns the encoded bytes.
    fn every_flipped_bit_fails(h: &RecordHeader) -> Vec<u8> {
        let mut b = vec![0u8; h.header_len()];
        h.encode(&mut b);
        for bit in 0..b.len() * 8 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(RecordHeader::decode(&c, &[9; 16]).is_err(), "bit {bit}");
        }
        b
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        every_flipped_bit_fails(&sample());
    }

    #[test]
    fn bounds_are_enforced_on_decode() {
        let mut h = sample();
        h.sectors = MAX_BLOB_SECTORS + 1;
        let mut b = [0u8; 64];
        // encode asserts; build the bytes by hand to mimic a hostile file
        sample().encode(&mut b);
        put_u32(&mut b, 40, h.sectors);
        let crc = checksum::crc32c(&b[..60]);
        put_u32(&mut b, 60, crc);
        assert!(matches!(
            RecordHeader::decode(&b, &[9; 16]),
            Err(FormatError::Invalid { .. })
        ));
        b[5] = 99;
        let crc = checksum::crc32c(&b[..60]);
        put_u32(&mut b, 60, crc);
        assert!(matches!(
            RecordHeader::decode(&b, &[9; 16]),
            Err(FormatError::UnknownCodec(99))
        ));
    }

    #[test]
    fn payload_checksum() {
        let payload = vec![7u8; 1000];
        let mut h = sample();
        h.payload_crc = checksum::crc32c(&payload);
        verify_payload(&h, &payload).unwrap();
        let mut bad = payload.clone();
        bad[10] ^= 1;
        assert!(matches!(
            verify_payload(&h, &bad),
            Err(FormatError::ChecksumMismatch { .. })
        ));
    }

    fn short_sample() -> RecordHeader {
        RecordHeader {
            kind: RecordKind::Relocate,
            codec: CodecId::Lz4,
            seq: 0x0123_4567_89ab_cdef,
            uuid: [9; 16],
            lba: (1 << 40) - 32,
            sectors: 32,
            stored_len: 131072,
            aux: 0xff_ffff_fff0,
            payload_crc: 0xdead_beef,
            chunk_sectors: 0,
            block: false,
            form: HeaderForm::Short,
        }
    }

    #[test]
    fn short_round_trip_at_the_limits_of_its_fields() {
        for kind in [RecordKind::Extent, RecordKind::Relocate] {
            let mut h = short_sample();
            h.kind = kind;
            h.codec = if kind == RecordKind::Extent {
                CodecId::None
            } else {
                CodecId::Deflate
            };
            if kind == RecordKind::Extent {
                h.aux = 0;
            }
            let mut b = [0u8; 32];
            h.encode(&mut b);
            assert_eq!(b[..2], SHORT_MAGIC);
            assert_eq!(RecordHeader::decode(&b, &[9; 16]).unwrap(), h);
            assert_eq!(h.header_len(), 32);
            assert_eq!(h.record_len(), align_record(32 + 131072));
        }
        let mut h = short_sample();
        (h.lba, h.sectors, h.stored_len, h.aux) = (0, 1, 1, 0);
        let mut b = [0u8; 32];
        h.encode(&mut b);
        assert_eq!(RecordHeader::decode(&b, &[9; 16]).unwrap(), h);
        assert_eq!(h.record_len(), 48);
    }

    #[test]
    fn short_headers_detect_every_flipped_bit_and_another_volume() {
        let b = every_flipped_bit_fails(&short_sample());
        // The uuid is in the CRC: another volume's record does not decode.
        let mut other = [9u8; 16];
        other[15] = 8;
        assert!(matches!(
            RecordHeader::decode(&b, &other),
            Err(FormatError::ChecksumMismatch { .. })
        ));
        // A short extent never carries aux: refused, with a valid CRC.
        let mut ext = short_sample();
        (ext.kind, ext.aux) = (RecordKind::Extent, 0);
        let mut e = vec![0u8; 32];
        ext.encode(&mut e);
        e[19] = 1;
        let crc = short_crc(&[9; 16], &e[..28]);
        put_u32(&mut e, 28, crc);
        assert!(matches!(
            RecordHeader::decode(&e, &[9; 16]),
            Err(FormatError::Invalid { .. })
        ));
        // Reserved bits, with a valid CRC, are refused.
        let mut c = b.clone();
        c[5] |= 0x80;
        let crc = short_crc(&[9; 16], &c[..28]);
        put_u32(&mut c, 28, crc);
        assert!(matches!(
            RecordHeader::decode(&c, &[9; 16]),
            Err(FormatError::Invalid { .. })
        ));
    }

    #[test]
    fn chunked_headers_round_trip_in_both_forms_and_bad_codes_are_refused() {
        for form in [HeaderForm::Full, HeaderForm::Short] {
            for cs in [1u32, 2, 4, 8, 16] {
                let mut h = short_sample();
                (h.form, h.lba, h.aux) = (form, 1000, 4096);
                h.chunk_sectors = cs;
                h.stored_len = h.table_len() as u32 + 5000;
                let mut b = vec![0u8; h.header_len()];
                h.encode(&mut b);
                let d = RecordHeader::decode(&b, &[9; 16]).unwrap();
                assert_eq!((d, d.is_chunked()), (h, true), "{form:?} {cs}");
            }
        }
        // Code 7 is reserved; code 6 (a block payload) only for zstd, each
        // with a valid CRC.
        let mut h = sample();
        (h.sectors, h.codec) = (32, CodecId::Lz4);
        let mut b = [0u8; 64];
        h.encode(&mut b);
        for code in [6u16, 7] {
            put_u16(&mut b, 6, code);
            let crc = checksum::crc32c(&b[..60]);
            put_u32(&mut b, 60, crc);
            assert!(RecordHeader::decode(&b, &[9; 16]).is_err(), "{code}");
        }
        let mut s = vec![0u8; 32];
        let mut sh = short_sample();
        sh.chunk_sectors = 0;
        sh.encode(&mut s);
        let f = get_u32(&s, 2) | 6 << 27;
        put_u32(&mut s, 2, f);
        let crc = short_crc(&[9; 16], &s[..28]);
        put_u32(&mut s, 28, crc);
        assert!(RecordHeader::decode(&s, &[9; 16]).is_err());
    }

    /// A Link record (deduplication): full header, no payload, a client
    /// range linked to hidden addresses; the decoder refuses anything else.
    #[test]
    fn link_records() {
        let link = |lba, sectors, aux| {
            let mut h = sample();
            (h.kind, h.codec, h.stored_len, h.chunk_sectors) =
                (RecordKind::Link, CodecId::None, 0, 0);
            (h.lba, h.sectors, h.aux, h.payload_crc) = (lba, sectors, aux, 0);
            h.form = HeaderForm::choose(true, h.kind, h.lba, h.sectors, 0, h.aux);
            h
        };
        let h = link(100, 4096, SHARED_BASE + 9);
        assert_eq!(h.form, HeaderForm::Full);
        let mut b = vec![0u8; RECORD_HEADER_SIZE];
        h.encode(&mut b);
        assert_eq!(RecordHeader::decode(&b, &h.uuid).unwrap(), h);
        assert_eq!(h.record_len(), RECORD_HEADER_SIZE as u64);

        assert!(link(SHARED_BASE - 2, 2, SHARED_BASE).check_bounds().is_ok());
        for bad in [
            link(100, 0, SHARED_BASE),
            link(SHARED_BASE - 1, 2, SHARED_BASE),
            link(100, 1, SHARED_BASE - 1),
            link(100, 2, SHARED_BASE + crate::layout::SHARED_SECTORS - 1),
        ] {
            assert!(bad.check_bounds().is_err(), "{bad:?}");
        }
        let mut with_payload = link(100, 1, SHARED_BASE);
        with_payload.stored_len = 16;
        assert!(with_payload.check_bounds().is_err());
        let mut with_codec = link(100, 1, SHARED_BASE);
        with_codec.codec = CodecId::Zstd;
        assert!(with_codec.check_bounds().is_err());
    }

    #[test]
    fn block_payloads_round_trip_in_both_forms_and_only_where_they_may() {
        for form in [HeaderForm::Full, HeaderForm::Short] {
            let mut h = sample();
            (h.form, h.sectors, h.stored_len, h.block) = (form, 1, 100, true);
            let mut b = vec![0u8; h.header_len()];
            h.encode(&mut b);
            let d = RecordHeader::decode(&b, &[9; 16]).unwrap();
            assert_eq!(d, h, "{form:?}");
            assert!(!d.is_chunked());
            assert_eq!(d.record_len(), align_record(h.header_len() as u64 + 100));
            every_flipped_bit_fails(&h);
        }
        let ok = |codec, sectors, stored, chunk_sectors, kind| {
            let mut h = sample();
            (h.codec, h.sectors, h.stored_len, h.block) = (codec, sectors, stored, true);
            (h.chunk_sectors, h.kind) = (chunk_sectors, kind);
            h.check_bounds().is_ok()
        };
        use RecordKind::{Extent, Relocate, Zero};
        assert!(ok(CodecId::Zstd, 1, 1, 0, Extent));
        assert!(ok(CodecId::Zstd, 1, 4095, 0, Relocate));
        assert!(ok(CodecId::Zstd, 32, 131071, 0, Extent));
        assert!(
            !ok(CodecId::Zstd, 1, 4096, 0, Extent),
            "as long as its sector"
        );
        assert!(!ok(CodecId::Zstd, 1, 0, 0, Extent));
        assert!(!ok(CodecId::Lz4, 1, 100, 0, Extent));
        assert!(!ok(CodecId::None, 1, 4096, 0, Extent));
        assert!(
            !ok(CodecId::Zstd, 32, 1000, 8, Extent),
            "chunked and a block"
        );
        let mut z = sample();
        (z.kind, z.stored_len, z.block) = (Zero, 0, true);
        assert!(z.check_bounds().is_err());
    }

    #[test]
    fn chunked_bounds() {
        let ok = |sectors, cs, stored, codec| {
            let mut h = sample();
            (h.sectors, h.chunk_sectors, h.stored_len, h.codec) = (sectors, cs, stored, codec);
            h.check_bounds().is_ok()
        };
        let raw = 32 * SECTOR_SIZE as u32;
        assert!(ok(32, 8, 32 + 4, CodecId::Zstd));
        assert!(!ok(32, 8, 32 + 3, CodecId::Zstd), "a chunk of no bytes");
        assert!(ok(32, 8, 32 + raw, CodecId::Zstd));
        assert!(!ok(32, 8, 33 + raw, CodecId::Zstd));
        assert!(ok(32, 8, 32 + raw, CodecId::None));
        assert!(!ok(32, 8, raw, CodecId::None), "raw without its table");
        assert!(
            !ok(8, 8, 8 + 100, CodecId::Zstd),
            "one chunk is not chunked"
        );
        assert!(!ok(32, 3, 100, CodecId::Zstd));
        let mut z = sample();
        (z.kind, z.stored_len, z.chunk_sectors) = (RecordKind::Zero, 0, 4);
        assert!(z.check_bounds().is_err());
    }

    #[test]
    fn a_chunked_payload_is_verified_by_its_table_and_chunks() {
        let raw: Vec<u8> = (0..10 * SECTOR_SIZE).map(|i| (i % 251) as u8).collect();
        let (table, crc) = crate::chunks::raw_table(&raw, 4);
        let mut payload = table;
        payload.extend_from_slice(&raw);
        let mut h = sample();
        (h.codec, h.sectors, h.chunk_sectors) = (CodecId::None, 10, 4);
        (h.stored_len, h.payload_crc) = (payload.len() as u32, crc);
        h.check_bounds().unwrap();
        verify_payload(&h, &payload).unwrap();
        assert_eq!(chunk_table(&h, &payload).unwrap().chunks().len(), 3);
        // A flipped bit anywhere: in the table, or in any chunk.
        for at in [0, 23, 24, 24 + 4 * SECTOR_SIZE, payload.len() - 1] {
            let mut bad = payload.clone();
            bad[at] ^= 1;
            assert!(verify_payload(&h, &bad).is_err(), "byte {at}");
        }
    }

    #[test]
    fn the_short_form_only_where_its_fields_fit() {
        use HeaderForm::{Full, Short};
        let ok = |allowed, kind, lba, sectors, stored, aux| {
            HeaderForm::choose(allowed, kind, lba, sectors, stored, aux)
        };
        assert_eq!(ok(true, RecordKind::Extent, 0, 1, 100, 0), Short);
        assert_eq!(ok(false, RecordKind::Extent, 0, 1, 100, 0), Full);
        assert_eq!(
            ok(true, RecordKind::Relocate, 7, 32, 131072, 1 << 20),
            Short
        );
        // Kinds without a payload, and fields past the short form's bits.
        assert_eq!(ok(true, RecordKind::Zero, 0, 1, 0, 0), Full);
        assert_eq!(ok(true, RecordKind::SegmentHeader, 0, 0, 0, 3), Full);
        assert_eq!(ok(true, RecordKind::Extent, (1 << 40) - 1, 2, 100, 0), Full);
        assert_eq!(ok(true, RecordKind::Extent, u64::MAX, 1, 100, 0), Full);
        assert_eq!(ok(true, RecordKind::Relocate, 0, 1, 100, 1 << 44), Full);
        assert_eq!(ok(true, RecordKind::Relocate, 0, 1, 100, 8), Full);
        assert_eq!(ok(true, RecordKind::Extent, 0, 1, 1 << 18, 0), Full);
    }
}
