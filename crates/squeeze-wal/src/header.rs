//! The log header: sector 0 of the volume. I/O-free encode/decode.
//!
//! ```text
//! 0   magic "SQZWAL\0\0"      8
//! 8   version u32 (1)         4
//! 12  layout u32 (1 dense, 2 sparse)
//! 16  log_id u64              random at creation; in every record
//! 24  epoch u32               +1 at every open that may write
//! 28  reserved u32 (0)
//! 32  area_start u64          byte offset of the record area (4096)
//! 40  area_bytes u64          bytes of the record area (whole sectors)
//! 48  start_pos u64           log position of the first live record
//! 56  start_seq u64           its sequence number
//! 64  crc u32                 CRC32C of bytes 0..64
//! 68  zeros to 4096
//! ```
//!
//! Invariant: the header is rewritten only as one whole non-zero sector
//! (one engine record: atomic across a crash, docs/RELIABILITY.md), and
//! made durable before anything that depends on it (records of a new
//! epoch, trims of the prefix it drops).

use crate::error::{Result, WalError};
use crate::Layout;
use squeeze_format::SECTOR_SIZE;

pub const HEADER_MAGIC: [u8; 8] = *b"SQZWAL\0\0";
pub const HEADER_VERSION: u32 = 1;
const CRC_AT: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub layout: Layout,
    pub log_id: u64,
    pub epoch: u32,
    pub area_start: u64,
    pub area_bytes: u64,
    pub start_pos: u64,
    pub start_seq: u64,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SECTOR_SIZE];
        b[0..8].copy_from_slice(&HEADER_MAGIC);
        b[8..12].copy_from_slice(&HEADER_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.layout.code().to_le_bytes());
        b[16..24].copy_from_slice(&self.log_id.to_le_bytes());
        b[24..28].copy_from_slice(&self.epoch.to_le_bytes());
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
        let version = u32_at(b, 8);
        if version != HEADER_VERSION {
            return Err(WalError::UnsupportedVersion(version));
        }
        let layout = Layout::from_code(u32_at(b, 12))
            .ok_or_else(|| WalError::Corrupt(format!("unknown layout {}", u32_at(b, 12))))?;
        let h = Header {
            layout,
            log_id: u64_at(b, 16),
            epoch: u32_at(b, 24),
            area_start: u64_at(b, 32),
            area_bytes: u64_at(b, 40),
            start_pos: u64_at(b, 48),
            start_seq: u64_at(b, 56),
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
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let h = Header {
            layout: Layout::Sparse,
            log_id: 0x1234_5678_9abc_def0,
            epoch: 7,
            area_start: 4096,
            area_bytes: 1 << 30,
            start_pos: 81920,
            start_seq: 99,
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
}
