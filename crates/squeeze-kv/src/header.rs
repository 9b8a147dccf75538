//! The store header: sector 0 of the volume. I/O-free encode/decode.
//!
//! ```text
//! 0   magic "SQZKV\0\0\0"   8
//! 8   version u32 (1)
//! 12  bucket_bytes u32 (4096)
//! 16  buckets u64         buckets at sectors 1..=buckets
//! 24  seed u64            XXH64 seed of the key hash
//! 32  probe_max u32       buckets a key may probe from its home
//! 36  reserved u32 (0)
//! 40  crc u32             CRC32C of bytes 0..40
//! ```

use crate::error::{KvError, Result};
use squeeze_format::SECTOR_SIZE;

pub const STORE_MAGIC: [u8; 8] = *b"SQZKV\0\0\0";
pub const STORE_VERSION: u32 = 1;
const CRC_AT: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreHeader {
    pub buckets: u64,
    pub seed: u64,
    pub probe_max: u32,
}

impl StoreHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SECTOR_SIZE];
        b[0..8].copy_from_slice(&STORE_MAGIC);
        b[8..12].copy_from_slice(&STORE_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.buckets.to_le_bytes());
        b[24..32].copy_from_slice(&self.seed.to_le_bytes());
        b[32..36].copy_from_slice(&self.probe_max.to_le_bytes());
        let crc = crc32c::crc32c(&b[..CRC_AT]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<StoreHeader> {
        assert!(b.len() >= SECTOR_SIZE);
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        if b[0..8] != STORE_MAGIC {
            return Err(KvError::NotAStore(if b.iter().all(|&x| x == 0) {
                "sector 0 is empty".into()
            } else {
                "sector 0 has no squeeze-kv magic".into()
            }));
        }
        let expected = u32_at(CRC_AT);
        let got = crc32c::crc32c(&b[..CRC_AT]);
        if expected != got {
            return Err(KvError::HeaderChecksum { expected, got });
        }
        if u32_at(8) != STORE_VERSION {
            return Err(KvError::UnsupportedVersion(u32_at(8)));
        }
        if u32_at(12) != SECTOR_SIZE as u32 {
            return Err(KvError::Mismatch {
                what: "bucket size",
                found: u64::from(u32_at(12)),
                wanted: SECTOR_SIZE as u64,
            });
        }
        let h = StoreHeader {
            buckets: u64_at(16),
            seed: u64_at(24),
            probe_max: u32_at(32),
        };
        if h.buckets == 0 || h.probe_max == 0 {
            return Err(KvError::NotAStore(
                "header names no buckets or no probes".into(),
            ));
        }
        Ok(h)
    }
}
