//! The entries of a changed chunk that page out with it (issue 37).
//!
//! A chunk that changed since the last checkpoint may page out too: the
//! checkpoint chain holds it as the last checkpoint saw it, and the
//! entries changed since (marked in the map's `dirty` or `frozen` record)
//! stay in memory as its overlay, 10 bytes an entry. Reading it back
//! rebuilds the chunk from its pieces, then applies the overlay; a
//! checkpoint's delta takes the changed entries from the overlay, a base
//! the chunk rebuilt so.
//!
//! Invariants: an overlay holds exactly the sectors marked changed in its
//! chunk (`dirty` or `frozen`) when it paged out, in sector order; no
//! sector is marked while the chunk is paged out (a change pages it in
//! first), and when a checkpoint that took the marks is named by the
//! superblock, the overlay keeps only the sectors still marked `dirty`.

use super::chunk::Chunk;
use super::dirty_bits::{is_marked, marked, DirtyBits};
use squeeze_format::{MapEntry, CHUNK_ENTRIES};

/// Changed entries of a paged-out chunk, by sector.
#[derive(Debug)]
pub(super) struct Overlay {
    /// Chunk-relative sectors, ascending.
    at: Box<[u16]>,
    /// Their entries (mapped or not) when the chunk paged out.
    entries: Box<[MapEntry]>,
}

/// RAM of one entry of an overlay.
pub(super) const OVERLAY_ENTRY_BYTES: u64 = 10;

impl Overlay {
    /// The entries of `chunk` at the sectors `bits` marks.
    pub(super) fn take(chunk: &Chunk, bits: &DirtyBits) -> Overlay {
        let n = marked(bits);
        let mut at = Vec::with_capacity(n);
        let mut entries = Vec::with_capacity(n);
        for i in 0..CHUNK_ENTRIES {
            if is_marked(bits, i) {
                at.push(i as u16);
                entries.push(chunk.get(i as u16));
            }
        }
        Overlay {
            at: at.into_boxed_slice(),
            entries: entries.into_boxed_slice(),
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.at.len()
    }

    /// Bytes of RAM it uses.
    pub(super) fn memory_bytes(&self) -> u64 {
        self.at.len() as u64 * OVERLAY_ENTRY_BYTES
    }

    /// The entry of chunk-relative sector `i`, when it holds it.
    pub(super) fn get(&self, i: u16) -> Option<MapEntry> {
        self.at.binary_search(&i).ok().map(|k| self.entries[k])
    }

    /// The entries it holds, by chunk-relative sector, to lay over a chunk
    /// rebuilt from the chain (`paging`).
    pub(super) fn entries(&self) -> impl Iterator<Item = (u16, MapEntry)> + '_ {
        self.at.iter().copied().zip(self.entries.iter().copied())
    }

    /// Keeps only the sectors `bits` marks (None: none); returns false when
    /// nothing is left.
    pub(super) fn retain(&mut self, bits: Option<&DirtyBits>) -> bool {
        let Some(bits) = bits else {
            return false;
        };
        let keep: Vec<usize> = (0..self.at.len())
            .filter(|&k| is_marked(bits, usize::from(self.at[k])))
            .collect();
        if keep.len() < self.at.len() {
            self.at = keep.iter().map(|&k| self.at[k]).collect();
            self.entries = keep.iter().map(|&k| self.entries[k]).collect();
        }
        !self.at.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::chunk::RUNS_MAX;
    use super::super::tests::blob;
    use super::*;

    #[test]
    fn takes_applies_and_retains_marked_sectors() {
        let mut ch = Chunk::Runs {
            runs: Vec::new(),
            mapped: 0,
        };
        for i in 0..20u16 {
            ch.set(i * 7, blob(1 << 20, 1, 0).advance(0), RUNS_MAX);
        }
        let mut bits: DirtyBits = [0; CHUNK_ENTRIES / 64];
        for i in [0usize, 7, 8, 511] {
            bits[i / 64] |= 1 << (i % 64);
        }
        let mut o = Overlay::take(&ch, &bits);
        assert_eq!(o.len(), 4);
        assert_eq!(o.get(7), Some(blob(1 << 20, 1, 0)));
        assert_eq!(o.get(8), Some(MapEntry::UNMAPPED));
        assert_eq!(o.get(9), None);
        let laid: Vec<(u16, MapEntry)> = o.entries().collect();
        assert_eq!(laid.iter().filter(|(_, e)| e.is_mapped()).count(), 2);
        assert_eq!(laid[0].0, 0);
        let mut keep: DirtyBits = [0; CHUNK_ENTRIES / 64];
        keep[0] |= 1 << 8;
        assert!(o.retain(Some(&keep)));
        assert_eq!(
            (o.len(), o.get(7), o.get(8)),
            (1, None, Some(MapEntry::UNMAPPED))
        );
        assert!(!o.retain(None));
    }
}
