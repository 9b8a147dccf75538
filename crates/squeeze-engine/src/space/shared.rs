//! References of hidden addresses (deduplication, docs/DEDUP.md): how many
//! client sectors hold an indirect entry to each hidden address.
//!
//! Not persisted: the map is the truth. `MapState::replace` keeps the
//! counts in step with every change of an entry, and the open rebuilds
//! them as it applies the checkpoint chain and the log (as it rebuilds
//! segment usage).
//!
//! Invariants:
//! - `counts[h]` = the number of map entries indirect to `h`; absent
//!   when 0;
//! - `orphans` = the hidden addresses whose count fell to 0 and which have
//!   not been zeroed yet (their record still costs space): the engine
//!   zeroes them (a Zero record of the hidden address), and takes them off
//!   with `zeroed`. An address the open finds mapped with no reference is
//!   an orphan too (a crash between the last reference going and its Zero).
//! - `next` is above every hidden address mapped or referenced since the
//!   open: new ones are taken from it (`allocate`), so none is handed out
//!   twice while the log after the open's checkpoint may still name it
//!   (after a reopen, addresses above the highest in use may be again:
//!   replay never reaches back past the open's own checkpoint).

use squeeze_format::{MapEntry, SHARED_BASE};
use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Default)]
pub struct SharedRefs {
    counts: HashMap<u64, u32>,
    orphans: BTreeSet<u64>,
    next: u64,
    /// Sum of the counts.
    references: u64,
    /// Hidden addresses mapped to a record (referenced or orphans).
    mapped: u64,
}

/// RAM of one counted hidden address (key, value and the table's slack).
const COUNT_BYTES: u64 = 24;

impl SharedRefs {
    /// One more indirect entry `e` (ignored unless indirect).
    pub fn add(&mut self, e: MapEntry) {
        if let Some(t) = e.target() {
            *self.counts.entry(t).or_insert(0) += 1;
            self.references += 1;
            self.orphans.remove(&t);
            self.next = self.next.max(t + 1);
        }
    }

    /// One indirect entry `e` fewer (ignored unless indirect); a count
    /// that falls to 0 makes its address an orphan.
    pub fn remove(&mut self, e: MapEntry) {
        if let Some(t) = e.target() {
            let c = self
                .counts
                .get_mut(&t)
                .expect("an indirect entry removed that was never counted");
            *c -= 1;
            self.references -= 1;
            if *c == 0 {
                self.counts.remove(&t);
                self.orphans.insert(t);
            }
        }
    }

    /// A hidden address is mapped (its own record installed): noted so
    /// that `allocate` never hands it out again, and an orphan until a
    /// reference comes.
    pub fn note_mapped(&mut self, h: u64) {
        self.next = self.next.max(h + 1);
        if !self.counts.contains_key(&h) {
            self.orphans.insert(h);
        }
    }

    /// `n` hidden addresses mapped to records (`add`) or no longer.
    pub fn count_mapped(&mut self, n: u64, add: bool) {
        if add {
            self.mapped += n;
        } else {
            self.mapped -= n;
        }
    }

    /// Hidden addresses mapped to records: sectors of the map that are not
    /// client sectors.
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    /// Orphans not zeroed yet.
    pub fn orphan_count(&self) -> u64 {
        self.orphans.len() as u64
    }

    /// `n` consecutive fresh hidden addresses.
    pub fn allocate(&mut self, n: u64) -> u64 {
        let h = self.next.max(SHARED_BASE);
        self.next = h + n;
        h
    }

    /// Every counted hidden address with its count, in no order.
    pub fn counts(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.counts.iter().map(|(&t, &c)| (t, c))
    }

    pub fn count(&self, h: u64) -> u32 {
        self.counts.get(&h).copied().unwrap_or(0)
    }

    /// The orphans, lowest first (at most `max`).
    pub fn orphans(&self, max: usize) -> Vec<u64> {
        self.orphans.iter().take(max).copied().collect()
    }

    /// `h`'s record was zeroed (or `h` was never mapped): no longer an orphan.
    pub fn zeroed(&mut self, h: u64) {
        self.orphans.remove(&h);
    }

    /// Hidden addresses with at least one reference.
    pub fn shared_sectors(&self) -> u64 {
        self.counts.len() as u64
    }

    /// Indirect entries in the map.
    pub fn references(&self) -> u64 {
        self.references
    }

    pub fn memory_bytes(&self) -> u64 {
        (self.counts.capacity() as u64 + self.orphans.len() as u64) * COUNT_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_orphans_and_allocation() {
        let mut r = SharedRefs::default();
        let h = r.allocate(4);
        assert_eq!(h, SHARED_BASE);
        assert_eq!(r.allocate(1), SHARED_BASE + 4);
        r.note_mapped(h);
        assert_eq!(r.orphans(10), vec![h]);
        r.add(MapEntry::indirect(h));
        r.add(MapEntry::indirect(h));
        r.add(MapEntry::new(1 << 20, 0, 1, 4160)); // direct: not counted
        assert!(r.orphans(10).is_empty());
        assert_eq!((r.count(h), r.shared_sectors(), r.references()), (2, 1, 2));
        r.remove(MapEntry::indirect(h));
        assert!(r.orphans(10).is_empty());
        r.remove(MapEntry::indirect(h));
        assert_eq!((r.count(h), r.shared_sectors(), r.references()), (0, 0, 0));
        assert_eq!(r.orphans(10), vec![h]);
        r.zeroed(h);
        assert!(r.orphans(10).is_empty());
        // An address seen in the map is never handed out again.
        r.add(MapEntry::indirect(SHARED_BASE + 100));
        assert_eq!(r.allocate(2), SHARED_BASE + 101);
    }
}
