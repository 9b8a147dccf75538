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
//!
//! An **indirect** entry (deduplication, docs/DEDUP.md) names a hidden
//! address instead of a record: its length field is 0, which no direct
//! entry has, and the rest holds the address.
//!
//! ```text
//! bits  0..50  hidden address - SHARED_BASE + 1   (never 0)
//!      50..64  0
//! ```
//! The hidden address's own entry (direct) says where its record is.

use crate::layout::{
    MAX_BACKING_BYTES, MAX_BLOB_SECTORS, RECORD_ALIGN, SHARED_BASE, SHARED_SECTORS,
};

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

    /// An indirect entry: the sector's content is that of hidden address
    /// `target` (in `SHARED_BASE..SHARED_BASE + SHARED_SECTORS`).
    pub fn indirect(target: u64) -> MapEntry {
        assert!(is_shared(target), "{target:#x} is not a hidden address");
        MapEntry(target - SHARED_BASE + 1)
    }

    /// The same extent's sector `index` (a neighbour inside the record).
    pub fn with_index(self, index: u32) -> MapEntry {
        debug_assert!(self.is_direct() && index < self.sectors());
        MapEntry((self.0 & !(31u64 << 40)) | (u64::from(index) << 40))
    }

    /// The entry `i` sectors further along a run that starts with this
    /// one: the extent's next sectors, or the next hidden addresses.
    pub fn advance(self, i: u32) -> MapEntry {
        match self.target() {
            _ if !self.is_mapped() => MapEntry::UNMAPPED,
            Some(t) => MapEntry::indirect(t + u64::from(i)),
            None => self.with_index(self.index() + i),
        }
    }

    pub fn is_mapped(self) -> bool {
        self.0 != 0
    }
    /// Mapped to a record (not unmapped, not indirect).
    pub fn is_direct(self) -> bool {
        self.0 >> 50 != 0
    }
    pub fn is_indirect(self) -> bool {
        self.is_mapped() && !self.is_direct()
    }
    /// The hidden address of an indirect entry.
    pub fn target(self) -> Option<u64> {
        self.is_indirect().then(|| SHARED_BASE + self.0 - 1)
    }
    /// Byte offset of the record in the backing file (direct entries; 0
    /// for the others).
    pub fn record_offset(self) -> u64 {
        if self.is_direct() {
            (self.0 & ((1 << 40) - 1)) * RECORD_ALIGN
        } else {
            0
        }
    }
    pub fn index(self) -> u32 {
        ((self.0 >> 40) & 31) as u32
    }
    pub fn sectors(self) -> u32 {
        ((self.0 >> 45) & 31) as u32 + 1
    }
    /// Bytes the record occupies, header included (0 when not direct: an
    /// indirect entry holds no bytes, its hidden address's entry does).
    pub fn record_len(self) -> u64 {
        (self.0 >> 50) * RECORD_ALIGN
    }
    /// This sector's share of the record's bytes; the shares of all sectors
    /// of one record add up to its length exactly.
    pub fn stored_share(self) -> u64 {
        if !self.is_direct() {
            return 0;
        }
        let len = self.record_len();
        let n = u64::from(self.sectors());
        len / n + u64::from(u64::from(self.index()) < len % n)
    }
}

/// Whether `lba` is a hidden address (never a client's).
pub fn is_shared(lba: u64) -> bool {
    (SHARED_BASE..SHARED_BASE + SHARED_SECTORS).contains(&lba)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indirect_entries() {
        for t in [
            SHARED_BASE,
            SHARED_BASE + 1,
            SHARED_BASE + SHARED_SECTORS - 1,
        ] {
            let e = MapEntry::indirect(t);
            assert!(e.is_mapped() && e.is_indirect() && !e.is_direct());
            assert_eq!(e.target(), Some(t));
            assert_eq!(
                (e.record_len(), e.stored_share(), e.record_offset()),
                (0, 0, 0)
            );
        }
        let d = MapEntry::new(1 << 20, 3, 8, 4160);
        assert!(d.is_direct() && !d.is_indirect() && d.target().is_none());
        assert!(!MapEntry::UNMAPPED.is_direct() && !MapEntry::UNMAPPED.is_indirect());
        assert_eq!(MapEntry::UNMAPPED.target(), None);
        assert_eq!(d.advance(4), d.with_index(7));
        assert_eq!(
            MapEntry::indirect(SHARED_BASE + 9).advance(3),
            MapEntry::indirect(SHARED_BASE + 12)
        );
        assert_eq!(MapEntry::UNMAPPED.advance(3), MapEntry::UNMAPPED);
        assert!(!is_shared(SHARED_BASE - 1) && !is_shared(SHARED_BASE + SHARED_SECTORS));
    }

    #[test]
    #[should_panic(expected = "is not a hidden address")]
    fn a_client_address_is_not_a_target() {
        MapEntry::indirect(5);
    }

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
