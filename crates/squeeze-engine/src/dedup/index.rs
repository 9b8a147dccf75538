//! The fingerprint index: a 64-bit key of a 4 KiB sector's XXH3-128 ->
//! where that content lies, for the sectors seen most recently, within a
//! memory budget (oldest out first: a window, as VDO's index is).
//!
//! The index holds 16-byte entries (the key, and the address: a client
//! LBA or, from `SHARED_BASE` up, a hidden one) in *chapters*, hash tables
//! filled to 7/8 of their slots and dropped whole, oldest first, when the
//! budget is reached (8 to 15 of them, as many tables of a power of two
//! slots as the budget holds): 19.4 bytes of RAM an entry (16 and a control byte
//! a slot, 7 entries in 8 slots), with no eviction
//! queue. A lookup asks the chapters newest first (at most
//! at most 15 of them).
//!
//! **Sampling** (a sparse index, as VDO's sparse mode): only fingerprints
//! whose high bits are 0 modulo `sample` are *hooks* kept in the index;
//! the pass finds the rest of a duplicate run by comparing the sectors
//! around a hook's match at the same alignment (`dedup/pass.rs`), so the
//! index holds 1/`sample` of the content for nearly all of its sharing.
//!
//! A hit is a candidate, never a proof: the pass compares bytes before it
//! shares anything (a collision of keys costs a read, never data).

use squeeze_format::SHARED_BASE;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
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
    fn pack(self) -> u64 {
        match self {
            Loc::Client(l) => l,
            Loc::Shared(h) => h,
        }
    }

    fn unpack(a: u64) -> Loc {
        if a >= SHARED_BASE {
            Loc::Shared(a)
        } else {
            Loc::Client(a)
        }
    }

    /// The address (a client LBA or a hidden address).
    pub(crate) fn addr(self) -> u64 {
        self.pack()
    }
}

/// Chapters of a full index, at least: eviction drops at most 1/CHAPTERS
/// of it at a time.
pub(crate) const CHAPTERS: usize = 8;

/// The most a pass samples: 1 hook in 32 sectors keeps about 95% of the
/// sharing a dense index finds (docs/DEDUP.md, "Budget").
pub(crate) const MAX_SAMPLE: u64 = 32;

/// The fingerprint: XXH3-128 of the sector.
pub(crate) fn fingerprint(sector: &[u8]) -> u128 {
    xxh3_128(sector)
}

/// Whether `fp` is a hook of an index keeping 1 fingerprint in `sample`:
/// its high 64 bits (not the key's) are 0 modulo `sample`.
pub(crate) fn hook(fp: u128, sample: u64) -> bool {
    ((fp >> 64) as u64) & (sample - 1) == 0
}

/// Keys are fingerprints already: hashing them again would only cost.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("the index hashes u64 keys only")
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = k;
    }
}

/// Entries of one chapter within `budget`: a table of a power of two
/// slots (at least 4) filled to hashbrown's load, 7/8 (3 of 4, 7 of 8
/// in the smallest tables), so that it never grows.
/// Returns (entries of a chapter, chapters): as many tables as fit.
fn chapter_cap(budget: u64) -> (usize, usize) {
    let slots = (budget / CHAPTERS as u64 / 17).max(4);
    let slots = 1u64 << (63 - slots.leading_zeros()); // down to a power of two
    let count = (budget / (slots * 17)).max(CHAPTERS as u64) as usize;
    (
        (if slots < 8 { slots - 1 } else { slots / 8 * 7 }) as usize,
        count,
    )
}

type Chapter = HashMap<u64, u64, BuildHasherDefault<KeyHasher>>;

pub(crate) struct Index {
    /// Newest last.
    chapters: VecDeque<Chapter>,
    chapter_cap: usize,
    max_chapters: usize,
    sample: u64,
    /// Entries pushed out by the budget over the index's life.
    pub(crate) evicted: u64,
}

impl Index {
    /// An index of at most `budget` bytes keeping 1 fingerprint in
    /// `sample` (a power of two; 1 keeps all).
    pub(crate) fn new(budget: u64, sample: u64) -> Index {
        debug_assert!(sample.is_power_of_two());
        Index {
            chapters: VecDeque::new(),
            chapter_cap: chapter_cap(budget).0,
            max_chapters: chapter_cap(budget).1,
            sample,
            evicted: 0,
        }
    }

    /// The sampling a pass over `sectors` sectors should use with
    /// `budget` bytes: dense while they all fit, then the smallest power
    /// of two that makes them fit, at most [`MAX_SAMPLE`].
    pub(crate) fn sample_for(budget: u64, sectors: u64) -> u64 {
        let (cap, count) = chapter_cap(budget);
        let entries = (cap * count) as u64;
        sectors
            .div_ceil(entries)
            .max(1)
            .next_power_of_two()
            .min(MAX_SAMPLE)
    }

    pub(crate) fn sample(&self) -> u64 {
        self.sample
    }

    /// Whether `fp` is a hook (kept in the index).
    pub(crate) fn is_hook(&self, fp: u128) -> bool {
        hook(fp, self.sample)
    }

    pub(crate) fn get(&self, fp: u128) -> Option<Loc> {
        let k = fp as u64;
        self.chapters
            .iter()
            .rev()
            .find_map(|c| c.get(&k))
            .map(|&a| Loc::unpack(a))
    }

    /// Records (or moves) `fp`'s content to `loc`, if `fp` is a hook.
    pub(crate) fn insert(&mut self, fp: u128, loc: Loc) {
        if !self.is_hook(fp) {
            return;
        }
        let k = fp as u64;
        if let Some(a) = self.chapters.back_mut().and_then(|c| c.get_mut(&k)) {
            *a = loc.pack();
            return;
        }
        if self
            .chapters
            .back()
            .is_none_or(|c| c.len() >= self.chapter_cap)
        {
            if self.chapters.len() == self.max_chapters {
                let old = self.chapters.pop_front().expect("max_chapters > 0");
                self.evicted += old.len() as u64;
            }
            // Grown as filled (a volume smaller than the budget takes
            // what it needs), never past `chapter_cap`'s table.
            self.chapters.push_back(Chapter::default());
        }
        let c = self.chapters.back_mut().expect("just made");
        c.insert(k, loc.pack());
    }

    /// Entries held (a key moved to a newer chapter counts in both until
    /// the older one is dropped).
    pub(crate) fn len(&self) -> usize {
        self.chapters.iter().map(|c| c.len()).sum()
    }

    /// RAM of the tables: 17 bytes a slot.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let slots = |cap: usize| match cap {
            0 => 0,
            1..8 => cap + 1,
            _ => cap / 7 * 8,
        };
        self.chapters
            .iter()
            .map(|c| slots(c.capacity()) as u64 * 17)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fingerprint that is a hook at any sampling.
    fn hook(k: u64) -> u128 {
        u128::from(k)
    }

    #[test]
    fn oldest_chapter_out_first_within_the_budget() {
        // Chapters of 3 entries (tables of 4 slots).
        let mut ix = Index::new(CHAPTERS as u64 * 4 * 17, 1);
        assert_eq!(ix.chapter_cap, 3);
        let full = 3 * CHAPTERS as u64;
        for k in 0..full {
            ix.insert(hook(k), Loc::Client(k));
        }
        assert_eq!((ix.len() as u64, ix.evicted), (full, 0));
        assert_eq!(ix.memory_bytes(), CHAPTERS as u64 * 4 * 17);
        ix.insert(hook(4), Loc::Shared(SHARED_BASE + 9)); // an older chapter's key: moved
        assert_eq!(ix.get(hook(4)), Some(Loc::Shared(SHARED_BASE + 9)));
        // The new entry opened a chapter: the oldest (keys 0, 1, 2) went.
        assert_eq!(ix.evicted, 3);
        for k in 0..3 {
            assert_eq!(ix.get(hook(k)), None);
        }
        assert_eq!(ix.get(hook(3)), Some(Loc::Client(3)));
        ix.insert(hook(4), Loc::Client(77)); // in the newest chapter: in place
        assert_eq!(ix.get(hook(4)), Some(Loc::Client(77)));
        assert_eq!(ix.len() as u64, full - 3 + 1);
        // Tables never grow past their chapter's slots.
        assert_eq!(ix.memory_bytes(), CHAPTERS as u64 * 4 * 17);
    }

    #[test]
    fn only_hooks_are_kept() {
        let mut ix = Index::new(1 << 20, 8);
        let not_hook = (1u128 << 64) | 5;
        assert!(!ix.is_hook(not_hook));
        ix.insert(not_hook, Loc::Client(5));
        assert_eq!((ix.get(not_hook), ix.len()), (None, 0));
        let h = (8u128 << 64) | 6;
        ix.insert(h, Loc::Client(6));
        assert_eq!(ix.get(h), Some(Loc::Client(6)));
    }

    #[test]
    fn sampling_fits_the_sectors_in_the_budget() {
        // 8 chapters of 1024 slots: 896 entries each.
        let b = CHAPTERS as u64 * 1024 * 17;
        assert_eq!(chapter_cap(b), (896, CHAPTERS));
        // Down to a power of two slots, and as many more tables as fit.
        assert_eq!(chapter_cap(b + 17 * 1000), (896, CHAPTERS));
        assert_eq!(chapter_cap(2 * b - 1), (896, 2 * CHAPTERS - 1));
        let n = 896 * CHAPTERS as u64;
        assert_eq!(Index::sample_for(b, 0), 1);
        assert_eq!(Index::sample_for(b, n), 1);
        assert_eq!(Index::sample_for(b, n + 1), 2);
        assert_eq!(Index::sample_for(b, 7 * n), 8);
        assert_eq!(Index::sample_for(b, 1 << 40), MAX_SAMPLE);
    }

    #[test]
    fn addresses_pack_by_range() {
        for l in [
            Loc::Client(0),
            Loc::Client(SHARED_BASE - 1),
            Loc::Shared(SHARED_BASE + 5),
        ] {
            assert_eq!(Loc::unpack(l.pack()), l);
        }
    }
}
