//! One bit per sector of a chunk, and the record of changed sectors by
//! chunk built from them: what the map's change record (`dirty`), the
//! overlays of changed chunks paged out (`overlay`), eviction (`paging`)
//! and the run arithmetic (`runs`) share, below all of them.

use squeeze_format::CHUNK_ENTRIES;
use std::collections::BTreeMap;

/// One bit per sector of a chunk.
pub(super) type DirtyBits = [u64; CHUNK_ENTRIES / 64];
/// Sectors changed since the last checkpoint, by chunk.
pub(super) type Dirty = BTreeMap<u64, DirtyBits>;

pub(super) fn mark(dirty: &mut Dirty, c: u64, i: u16) {
    dirty.entry(c).or_insert([0; CHUNK_ENTRIES / 64])[usize::from(i / 64)] |= 1 << (i % 64);
}

pub(super) fn is_marked(bits: &DirtyBits, i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

/// Sectors `bits` marks.
pub(super) fn marked(bits: &DirtyBits) -> usize {
    bits.iter().map(|w| w.count_ones() as usize).sum()
}
