//! Log records: the log is the journal (DESIGN principle 1). Each record is
//! self-describing, so recovery can replay the log after a checkpoint and a
//! scrub can verify every record without any other metadata.
//!
//! ```text
//! byte  0  magic        u32  "SQZR"
//!       4  kind         u8   RecordKind
//!       5  codec        u8   CodecId of the payload (extents), 0 otherwise
//!       6  flags        u16  0 (reserved, must be zero)
//!       8  seq          u64  log sequence number, strictly increasing
//!      16  uuid         [16] volume uuid (a record of another volume is foreign)
//!      32  lba          u64  first logical sector
//!      40  sectors      u32  sector count (extents: 1..=MAX_BLOB_SECTORS)
//!      44  stored_len   u32  payload bytes following the header
//!      48  aux          u64  kind-specific: segment id (SegmentHeader),
//!                            byte offset of the record being moved (Relocate)
//!      56  payload_crc  u32  CRC-32C of the payload (0 when empty)
//!      60  header_crc   u32  CRC-32C of bytes 0..60
//! ```
//!
//! A record occupies `align_record(64 + stored_len)` bytes. Invariants checked
//! on decode: magic, header checksum, known kind and codec, flags zero,
//! sector count within bounds for the kind, and (for extents) a payload that
//! fits the uncompressed size when the codec is `None`.

use crate::layout::{
    align_record, MAX_BLOB_SECTORS, RECORD_ALIGN, RECORD_HEADER_SIZE, SECTOR_SIZE,
};
use crate::le::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use crate::{checksum, CodecId, FormatError};

pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SQZR");

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
}

impl RecordKind {
    pub fn from_u8(v: u8) -> Result<RecordKind, FormatError> {
        match v {
            1 => Ok(RecordKind::SegmentHeader),
            2 => Ok(RecordKind::Extent),
            3 => Ok(RecordKind::Zero),
            4 => Ok(RecordKind::Relocate),
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
}

impl RecordHeader {
    /// Bytes the whole record occupies in the segment.
    pub fn record_len(&self) -> u64 {
        align_record(RECORD_HEADER_SIZE as u64 + u64::from(self.stored_len))
    }

    /// Uncompressed payload size.
    pub fn raw_len(&self) -> usize {
        self.sectors as usize * SECTOR_SIZE
    }

    /// Encodes into the first 64 bytes of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        assert!(out.len() >= RECORD_HEADER_SIZE);
        self.check_bounds()
            .expect("encoding an invalid record header");
        let b = &mut out[..RECORD_HEADER_SIZE];
        put_u32(b, 0, RECORD_MAGIC);
        b[4] = self.kind as u8;
        b[5] = self.codec as u8;
        put_u16(b, 6, 0);
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

    /// Decodes and validates a header (not the payload, see [`verify_payload`]).
    pub fn decode(b: &[u8]) -> Result<RecordHeader, FormatError> {
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
        if get_u16(b, 6) != 0 {
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
        };
        h.check_bounds()?;
        Ok(h)
    }

    fn check_bounds(&self) -> Result<(), FormatError> {
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
                if self.stored_len == 0 || self.stored_len as usize > self.raw_len() {
                    return bad(format!(
                        "stored length {} for {} sectors",
                        self.stored_len, self.sectors
                    ));
                }
                if self.codec == CodecId::None && self.stored_len as usize != self.raw_len() {
                    return bad("uncompressed extent with a short payload".into());
                }
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
        }
        if self.lba.checked_add(u64::from(self.sectors)).is_none() {
            return bad("LBA range overflows".into());
        }
        Ok(())
    }
}

/// Checks a payload against the header's checksum.
pub fn verify_payload(h: &RecordHeader, payload: &[u8]) -> Result<(), FormatError> {
    if payload.len() != h.stored_len as usize {
        return Err(FormatError::Truncated {
            what: "record payload",
            need: h.stored_len as usize,
            have: payload.len(),
        });
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

/// How a [`RecordScan`] goes on after a record it yielded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stride {
    /// Past the record: a walk over a segment's records (the cleaner).
    Record,
    /// To the next aligned offset: a probe for valid records among bytes
    /// that may hold torn or stale ones (recovery after a gap).
    Probe,
}

/// One record a [`RecordScan`] found: its offset in the buffer, its header
/// and its payload (not yet checked against the payload CRC).
#[derive(Clone, Copy, Debug)]
pub struct ScannedRecord<'a> {
    pub offset: usize,
    pub header: RecordHeader,
    pub payload: &'a [u8],
}

/// The records in a buffer of log bytes: at each [`RECORD_ALIGN`]ed offset,
/// a header that decodes (magic, version, header CRC), carries `uuid` and
/// whose record ends inside the buffer is yielded; other bytes are passed
/// over at the next aligned offset. The one record walk of the engine's
/// cleaner and recovery.
pub struct RecordScan<'a> {
    buf: &'a [u8],
    uuid: [u8; 16],
    stride: Stride,
    off: usize,
}

impl<'a> RecordScan<'a> {
    /// Scans `buf` from its start (which must be record-aligned in the log).
    pub fn new(buf: &'a [u8], uuid: [u8; 16], stride: Stride) -> RecordScan<'a> {
        RecordScan {
            buf,
            uuid,
            stride,
            off: 0,
        }
    }
}

impl<'a> Iterator for RecordScan<'a> {
    type Item = ScannedRecord<'a>;

    fn next(&mut self) -> Option<ScannedRecord<'a>> {
        let align = RECORD_ALIGN as usize;
        while self.off + RECORD_HEADER_SIZE <= self.buf.len() {
            let at = self.off;
            if let Ok(h) = RecordHeader::decode(&self.buf[at..at + RECORD_HEADER_SIZE]) {
                let len = h.record_len() as usize;
                if h.uuid == self.uuid && at + len <= self.buf.len() {
                    self.off += match self.stride {
                        Stride::Record => len,
                        Stride::Probe => align,
                    };
                    let p = at + RECORD_HEADER_SIZE;
                    return Some(ScannedRecord {
                        offset: at,
                        header: h,
                        payload: &self.buf[p..p + h.stored_len as usize],
                    });
                }
            }
            self.off += align;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    #[test]
    fn round_trip_and_len() {
        let h = sample();
        let mut b = [0u8; 64];
        h.encode(&mut b);
        assert_eq!(RecordHeader::decode(&b).unwrap(), h);
        assert_eq!(h.record_len(), align_record(1064));
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let mut b = [0u8; 64];
        sample().encode(&mut b);
        for bit in 0..64 * 8 {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(RecordHeader::decode(&c).is_err(), "bit {bit}");
        }
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
            RecordHeader::decode(&b),
            Err(FormatError::Invalid { .. })
        ));
        b[5] = 99;
        let crc = checksum::crc32c(&b[..60]);
        put_u32(&mut b, 60, crc);
        assert!(matches!(
            RecordHeader::decode(&b),
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

    #[test]
    fn record_scan_walks_records_and_passes_over_other_bytes() {
        let uuid = [7u8; 16];
        let rec = |lba: u64, seq: u64, payload: &[u8]| {
            let h = RecordHeader {
                kind: RecordKind::Extent,
                codec: CodecId::Lz4,
                seq,
                uuid,
                lba,
                sectors: 1,
                stored_len: payload.len() as u32,
                aux: 0,
                payload_crc: crate::checksum::crc32c(payload),
            };
            let mut b = vec![0u8; crate::layout::record_bytes(payload.len() as u64) as usize];
            h.encode(&mut b[..RECORD_HEADER_SIZE]);
            b[RECORD_HEADER_SIZE..RECORD_HEADER_SIZE + payload.len()].copy_from_slice(payload);
            b
        };
        let mut buf = rec(1, 10, &[1u8; 40]);
        buf.extend_from_slice(&[0xa5u8; 48]); // garbage, three aligned slots
        let second = buf.len();
        buf.extend(rec(2, 11, &[2u8; 100]));
        let mut other = rec(3, 12, &[3u8; 8]);
        other[8] ^= 0xff; // a damaged header
        buf.extend(other);
        let walk: Vec<_> = RecordScan::new(&buf, uuid, Stride::Record).collect();
        assert_eq!(walk.len(), 2);
        assert_eq!((walk[0].offset, walk[0].header.lba), (0, 1));
        assert_eq!(walk[0].payload, &[1u8; 40][..]);
        assert_eq!((walk[1].offset, walk[1].header.lba), (second, 2));
        // Another volume's records are not ours.
        assert_eq!(RecordScan::new(&buf, [8u8; 16], Stride::Record).count(), 0);
        // A record cut by the end of the buffer is not yielded.
        assert_eq!(
            RecordScan::new(&buf[..second + 70], uuid, Stride::Probe).count(),
            1
        );
    }
}
