//! The log header: sector 0 of the volume. I/O-free encode/decode.
//!
//! ```text
//! 0   magic "SQZWAL\0\0"      8
//! 8   version u32             the record version (1 or 2), fixed at creation
//! 12  layout u32 (1 dense, 2 sparse)
//! 16  log_id u64              random at creation; in every record (v1) or
//!                             every record's CRC (v2)
//! 24  epoch u32               +1 at every open that may write
//! 28  start_epoch u32         v2: the epoch of the record at start_pos (the
//!                             chain's first record stores it only if it was
//!                             the first of its open); v1: 0
//! 32  area_start u64          byte offset of the record area (4096)
//! 40  area_bytes u64          bytes of the record area (whole sectors)
//! 48  start_pos u64           log position of the first live record
//! 56  start_seq u64           its sequence number
//! 64  crc u32                 CRC32C of bytes 0..64
//! 68  zeros to 4096
//! ```
//!
//! Version history: 1, records with 40-byte headers (`record`); 2 (issue
//! 37), records with 6- to 13-byte headers (`record_v2`) and `start_epoch`
//! in what was a reserved word. A log keeps the version it was created with.
//!
//! Invariant: the header is rewritten only as one whole non-zero sector
//! (one engine record: atomic across a crash, docs/RELIABILITY.md), and
//! made durable before anything that depends on it (records of a new
//! epoch, trims of the prefix it drops).

use crate::error::{Result, WalError};
use crate::{Layout, RecordVersion};
use squeeze_format::SECTOR_SIZE;

pub const HEADER_MAGIC: [u8; 8] = *b"SQZWAL\0\0";
const CRC_AT: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: RecordVersion,
    pub layout: Layout,
    pub log_id: u64,
    pub epoch: u32,
    pub area_start: u64,
    pub area_bytes: u64,
    pub start_pos: u64,
    pub start_seq: u64,
    /// V2: the epoch of the record at `start_pos`; V1: 0.
    pub start_epoch: u32,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.version == RecordVersion::V2 || self.start_epoch == 0);
        let mut b = vec![0u8; SECTOR_SIZE];
        b[0..8].copy_from_slice(&HEADER_MAGIC);
        b[8..12].copy_from_slice(&self.version.code().to_le_bytes());
        b[12..16].copy_from_slice(&self.layout.code().to_le_bytes());
        b[16..24].copy_from_slice(&self.log_id.to_le_bytes());
        b[24..28].copy_from_slice(&self.epoch.to_le_bytes());
        b[28..32].copy_from_slice(&self.start_epoch.to_le_bytes());
        b[32..40].copy_from_slice(&self.area_start.to_le_bytes());
        b[40..48].copy_from_slice(&self.area_bytes.to_le_bytes());
        b[48..56].copy_from_slice(&self.start_pos.to_le_bytes());
        b[56..64].copy_from_slice(&self.start_seq.to_le_bytes());
        let crc = crc32c::crc32c(&b[..CRC_AT]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Header> {
        assert!(b.len() >= SECTOR_SIZE);
        if b[0..8] != HEADER_MAGIC {
            return Err(WalError::NotALog(if b.iter().all(|&x| x == 0) {
                "sector 0 is empty".into()
            } else {
                "sector 0 has no squeeze-wal magic".into()
            }));
        }
        let expected = u32_at(b, CRC_AT);
        let got = crc32c::crc32c(&b[..CRC_AT]);
        if expected != got {
            return Err(WalError::HeaderChecksum { expected, got });
        }
        let version = RecordVersion::from_code(u32_at(b, 8))
            .ok_or(WalError::UnsupportedVersion(u32_at(b, 8)))?;
        let layout = Layout::from_code(u32_at(b, 12))
            .ok_or_else(|| WalError::Corrupt(format!("unknown layout {}", u32_at(b, 12))))?;
        let h = Header {
            version,
            layout,
            log_id: u64_at(b, 16),
            epoch: u32_at(b, 24),
            area_start: u64_at(b, 32),
            area_bytes: u64_at(b, 40),
            start_pos: u64_at(b, 48),
            start_seq: u64_at(b, 56),
            start_epoch: u32_at(b, 28),
        };
        if h.area_start != SECTOR_SIZE as u64
            || h.area_bytes == 0
            || !h.area_bytes.is_multiple_of(SECTOR_SIZE as u64)
        {
            return Err(WalError::Corrupt(format!(
                "record area {}+{} is not whole sectors after the header",
                h.area_start, h.area_bytes
            )));
        }
        if (h.version == RecordVersion::V1 && h.start_epoch != 0) || h.start_epoch > h.epoch {
            return Err(WalError::Corrupt(format!(
                "start epoch {} of a version {} log at epoch {}",
                h.start_epoch,
                h.version.code(),
                h.epoch
            )));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let h = Header {
            version: RecordVersion::V2,
            layout: Layout::Sparse,
            log_id: 0x1234_5678_9abc_def0,
            epoch: 7,
            area_start: 4096,
            area_bytes: 1 << 30,
            start_pos: 81920,
            start_seq: 99,
            start_epoch: 5,
        };
        let b = h.encode();
        assert_eq!(Header::decode(&b).unwrap(), h);
        let mut bad = b.clone();
        bad[50] ^= 1;
        assert!(matches!(
            Header::decode(&bad),
            Err(WalError::HeaderChecksum { .. })
        ));
        assert!(matches!(
            Header::decode(&vec![0u8; 4096]),
            Err(WalError::NotALog(_))
        ));
    }

    #[test]
    fn version_1_headers_still_decode_and_unknown_versions_do_not() {
        let v1 = Header {
            version: RecordVersion::V1,
            layout: Layout::Dense,
            log_id: 3,
            epoch: 2,
            area_start: 4096,
            area_bytes: 8192,
            start_pos: 0,
            start_seq: 0,
            start_epoch: 0,
        };
        let b = v1.encode();
        assert_eq!(u32_at(&b, 8), 1);
        assert_eq!(Header::decode(&b).unwrap(), v1);
        let mut v9 = b.clone();
        v9[8] = 9;
        let crc = crc32c::crc32c(&v9[..CRC_AT]);
        v9[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Header::decode(&v9),
            Err(WalError::UnsupportedVersion(9))
        ));
    }
}
