//! A bucket: one 4 KiB sector holding records, zeros after them.
//! I/O-free parse, edit and encode.
//!
//! ```text
//! 0   magic u16 "KB"
//! 2   flags u8           bit 0: spill (a key whose chain passed here
//!                        found this bucket full and went on to the next)
//! 3   reserved u8 (0)
//! 4   count u16          records
//! 6   used u16           bytes of records
//! 8   crc u32            CRC32C of bytes 0..8 and the records
//! 12  records: klen u16, vlen u16, key, value; then zeros
//! ```
//!
//! An all-zero sector is an empty bucket without spill (never written, or
//! trimmed when its last record went). Invariants: `used` bytes of
//! well-formed records follow the header; every key occurs once per bucket.

use squeeze_format::SECTOR_SIZE;

pub const BUCKET_MAGIC: u16 = u16::from_le_bytes(*b"KB");
pub const BUCKET_HEADER_BYTES: usize = 12;
pub const RECORD_OVERHEAD: usize = 4;
/// Most bytes of records a bucket holds.
pub const RECORDS_MAX: usize = SECTOR_SIZE - BUCKET_HEADER_BYTES;
const SPILL: u8 = 1;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub spill: bool,
    /// (key, value) in the order stored.
    pub records: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Bucket {
    /// Parses a sector; `Err` says why it is not a well-formed bucket.
    pub fn decode(b: &[u8]) -> Result<Bucket, String> {
        assert_eq!(b.len(), SECTOR_SIZE);
        if b.iter().all(|&x| x == 0) {
            return Ok(Bucket::default());
        }
        let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as usize;
        if u16_at(0) != BUCKET_MAGIC as usize {
            return Err("no bucket magic".into());
        }
        let (count, used) = (u16_at(4), u16_at(6));
        if used > RECORDS_MAX {
            return Err(format!("{used} bytes of records"));
        }
        let want = u32::from_le_bytes(b[8..12].try_into().expect("4"));
        let mut crc = crc32c::crc32c(&b[..8]);
        crc = crc32c::crc32c_append(crc, &b[BUCKET_HEADER_BYTES..BUCKET_HEADER_BYTES + used]);
        if crc != want {
            return Err(format!("checksum {crc:#010x}, expected {want:#010x}"));
        }
        let mut records = Vec::with_capacity(count);
        let mut at = BUCKET_HEADER_BYTES;
        let end = BUCKET_HEADER_BYTES + used;
        for _ in 0..count {
            if at + RECORD_OVERHEAD > end {
                return Err("records run past their length".into());
            }
            let (k, v) = (u16_at(at), u16_at(at + 2));
            at += RECORD_OVERHEAD;
            if at + k + v > end {
                return Err("records run past their length".into());
            }
            records.push((b[at..at + k].to_vec(), b[at + k..at + k + v].to_vec()));
            at += k + v;
        }
        if at != end {
            return Err("records do not fill their length".into());
        }
        Ok(Bucket {
            spill: b[2] & SPILL != 0,
            records,
        })
    }

    pub fn used(&self) -> usize {
        self.records
            .iter()
            .map(|(k, v)| RECORD_OVERHEAD + k.len() + v.len())
            .sum()
    }

    /// True if nothing needs storing (the sector can be a hole).
    pub fn is_empty(&self) -> bool {
        !self.spill && self.records.is_empty()
    }

    pub fn find(&self, key: &[u8]) -> Option<usize> {
        self.records.iter().position(|(k, _)| k == key)
    }

    /// True if a record of this key and value fits (replacing the key's
    /// record here, if any).
    pub fn fits(&self, key: &[u8], value: &[u8]) -> bool {
        let old = self
            .find(key)
            .map_or(0, |i| RECORD_OVERHEAD + key.len() + self.records[i].1.len());
        self.used() - old + RECORD_OVERHEAD + key.len() + value.len() <= RECORDS_MAX
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SECTOR_SIZE];
        if self.is_empty() {
            return b;
        }
        b[0..2].copy_from_slice(&BUCKET_MAGIC.to_le_bytes());
        b[2] = if self.spill { SPILL } else { 0 };
        let mut at = BUCKET_HEADER_BYTES;
        for (k, v) in &self.records {
            b[at..at + 2].copy_from_slice(&(k.len() as u16).to_le_bytes());
            b[at + 2..at + 4].copy_from_slice(&(v.len() as u16).to_le_bytes());
            at += RECORD_OVERHEAD;
            b[at..at + k.len()].copy_from_slice(k);
            at += k.len();
            b[at..at + v.len()].copy_from_slice(v);
            at += v.len();
        }
        let used = at - BUCKET_HEADER_BYTES;
        assert!(used <= RECORDS_MAX);
        b[4..6].copy_from_slice(&(self.records.len() as u16).to_le_bytes());
        b[6..8].copy_from_slice(&(used as u16).to_le_bytes());
        let mut crc = crc32c::crc32c(&b[..8]);
        crc = crc32c::crc32c_append(crc, &b[BUCKET_HEADER_BYTES..at]);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_fill_and_damage() {
        let mut b = Bucket::default();
        assert_eq!(b.encode(), vec![0u8; SECTOR_SIZE]);
        let mut n = 0u32;
        while b.fits(&n.to_le_bytes(), &[7; 400]) {
            b.records.push((n.to_le_bytes().to_vec(), vec![7; 400]));
            n += 1;
        }
        assert_eq!(n, 10); // 10 x 408 bytes of 4084
        b.spill = true;
        let e = b.encode();
        assert_eq!(Bucket::decode(&e).unwrap(), b);
        for i in [0usize, 2, 5, 7, 9, 13, 500, 4083] {
            let mut bad = e.clone();
            bad[i] ^= 1;
            assert!(Bucket::decode(&bad).is_err(), "flip at {i} not detected");
        }
    }
}
