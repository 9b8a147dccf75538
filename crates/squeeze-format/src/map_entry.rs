//! The packed sector-map entry: 8 bytes per written 4 KiB sector, the whole
//! per-sector cost of the map (DESIGN principle 8). Checkpoints store these
//! words verbatim.
//!
//! ```text
//! bits  0..40  record byte offset / 16   (0 = unmapped: reads as zeros)
//!      40..45  index of this sector inside the extent (0..32)
//!      45..50  sectors in the extent minus one
//!      50..64  record length / 16, header included
//! ```
//! Offset 0 is the superblock, never a record, so the all-zero word is free
//! to mean "unmapped".

use crate::layout::{MAX_BACKING_BYTES, MAX_BLOB_SECTORS, RECORD_ALIGN};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct MapEntry(pub u64);

impl MapEntry {
    pub const UNMAPPED: MapEntry = MapEntry(0);

    /// Packs a mapping. `record_offset` and `record_len` are multiples of 16.
    pub fn new(record_offset: u64, index: u32, sectors: u32, record_len: u64) -> MapEntry {
        assert!(record_offset > 0 && record_offset < MAX_BACKING_BYTES);
        assert!(
            record_offset.is_multiple_of(RECORD_ALIGN) && record_len.is_multiple_of(RECORD_ALIGN)
        );
        assert!((1..=MAX_BLOB_SECTORS).contains(&sectors) && index < sectors);
        let len16 = record_len / RECORD_ALIGN;
        assert!(len16 > 0 && len16 < (1 << 14));
        MapEntry(
            (record_offset / RECORD_ALIGN)
                | (u64::from(index) << 40)
                | (u64::from(sectors - 1) << 45)
                | (len16 << 50),
        )
    }

    /// The same extent's sector `index` (a neighbour inside the record).
    pub fn with_index(self, index: u32) -> MapEntry {
        debug_assert!(index < self.sectors());
        MapEntry((self.0 & !(31u64 << 40)) | (u64::from(index) << 40))
    }

    pub fn is_mapped(self) -> bool {
        self.0 != 0
    }
    /// Byte offset of the record in the backing file.
    pub fn record_offset(self) -> u64 {
        (self.0 & ((1 << 40) - 1)) * RECORD_ALIGN
    }
    pub fn index(self) -> u32 {
        ((self.0 >> 40) & 31) as u32
    }
    pub fn sectors(self) -> u32 {
        ((self.0 >> 45) & 31) as u32 + 1
    }
    /// Bytes the record occupies, header included.
    pub fn record_len(self) -> u64 {
        (self.0 >> 50) * RECORD_ALIGN
    }
    /// This sector's share of the record's bytes; the shares of all sectors
    /// of one record add up to its length exactly.
    pub fn stored_share(self) -> u64 {
        let len = self.record_len();
        let n = u64::from(self.sectors());
        len / n + u64::from(u64::from(self.index()) < len % n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_and_unpacks() {
        let e = MapEntry::new(MAX_BACKING_BYTES - 16, 31, 32, 131136);
        assert_eq!(e.record_offset(), MAX_BACKING_BYTES - 16);
        assert_eq!(e.index(), 31);
        assert_eq!(e.sectors(), 32);
        assert_eq!(e.record_len(), 131136);
        assert!(e.is_mapped());
        assert!(!MapEntry::UNMAPPED.is_mapped());
    }

    #[test]
    fn shares_sum_to_length() {
        for n in 1..=32u32 {
            for len in [16u64, 1072, 4160, 131136] {
                let sum: u64 = (0..n)
                    .map(|i| MapEntry::new(1 << 20, i, n, len).stored_share())
                    .sum();
                assert_eq!(sum, len);
            }
        }
    }
}
