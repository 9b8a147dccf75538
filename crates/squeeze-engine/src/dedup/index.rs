//! The fingerprint index: XXH3-128 of a 4 KiB sector -> where that content
//! lies, for the sectors seen most recently, within a memory budget
//! (oldest first out: a window, as VDO's index is).
//!
//! A hit is a candidate, never a proof: the pass compares bytes before it
//! shares anything (a collision costs a read, never data).

use std::collections::{HashMap, VecDeque};
use xxhash_rust::xxh3::xxh3_128;

/// Where a fingerprinted content lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    /// A client sector that holds it in its own record.
    Client(u64),
    /// A hidden address (already shared).
    Shared(u64),
}

impl Loc {
    /// The location of the next sector of a run that starts here.
    pub(crate) fn next(self, i: u64) -> Loc {
        match self {
            Loc::Client(l) => Loc::Client(l + i),
            Loc::Shared(h) => Loc::Shared(h + i),
        }
    }
}

/// RAM of one entry: the table's slot (16 + 16 bytes, slack at 7/8 load)
/// and the eviction queue's 16 bytes.
pub(crate) const ENTRY_BYTES: u64 = 56;

pub(crate) struct Index {
    map: HashMap<u128, Loc>,
    order: VecDeque<u128>,
    limit: usize,
    /// Entries pushed out by the budget over the index's life.
    pub(crate) evicted: u64,
}

pub(crate) fn fingerprint(sector: &[u8]) -> u128 {
    xxh3_128(sector)
}

impl Index {
    /// An index of at most `budget` bytes (at least one entry).
    pub(crate) fn new(budget: u64) -> Index {
        Index {
            map: HashMap::new(),
            order: VecDeque::new(),
            limit: (budget / ENTRY_BYTES).max(1) as usize,
            evicted: 0,
        }
    }

    pub(crate) fn get(&self, fp: u128) -> Option<Loc> {
        self.map.get(&fp).copied()
    }

    /// Records (or moves) `fp`'s content to `loc`.
    pub(crate) fn insert(&mut self, fp: u128, loc: Loc) {
        if self.map.insert(fp, loc).is_none() {
            self.order.push_back(fp);
            while self.map.len() > self.limit {
                let old = self.order.pop_front().expect("order holds every key");
                self.map.remove(&old);
                self.evicted += 1;
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn memory_bytes(&self) -> u64 {
        self.map.capacity() as u64 * 33 + self.order.capacity() as u64 * 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_out_first_within_the_budget() {
        let mut ix = Index::new(3 * ENTRY_BYTES);
        for k in 0..3u128 {
            ix.insert(k, Loc::Client(k as u64));
        }
        ix.insert(1, Loc::Shared(9)); // a move, not a new entry
        assert_eq!((ix.len(), ix.evicted), (3, 0));
        ix.insert(7, Loc::Client(7));
        assert_eq!((ix.len(), ix.evicted), (3, 1));
        assert_eq!(ix.get(0), None);
        assert_eq!(ix.get(1), Some(Loc::Shared(9)));
        assert_eq!(Loc::Shared(9).next(2), Loc::Shared(11));
        assert_eq!(Loc::Client(4).next(1), Loc::Client(5));
    }
}
