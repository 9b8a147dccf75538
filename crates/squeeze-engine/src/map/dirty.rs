//! What changed in the map since the last checkpoint: one bit per sector,
//! per chunk touched (`mark`), so that a checkpoint writes only those
//! sectors (a delta) instead of the whole map.
//!
//! The handshake with a checkpoint: `freeze` takes the changes; when the
//! superblock names the checkpoint, `note_base` or `note_delta` records
//! which piece of the chain now holds each chunk; when it fails, `thaw`
//! makes them changes again. A changed or frozen chunk paged out keeps
//! its marked sectors' entries as its overlay (`overlay`); once the chain
//! holds the frozen ones, the overlay keeps only those still changed.

use super::dirty_bits::DirtyBits;
use super::overlay::Overlay;
use super::pieces::{Pieces, PIECES_MAX};
use super::SectorMap;
use squeeze_format::CHUNK_ENTRIES;

impl SectorMap {
    /// Takes the record of changes for a checkpoint: kept (`frozen`) until
    /// the checkpoint is named by the superblock (`note_base`,
    /// `note_delta`) or fails (`thaw`).
    /// With `whole_when_full` (the map is over its cache), a changed chunk
    /// already spread over [`PIECES_MAX`] pieces (or untracked) is taken
    /// whole: the delta then holds all of it, and it is in that piece
    /// alone, so it can page out. Without, such a chunk turns untracked
    /// (it stays in memory, and the delta holds only its changes).
    pub fn freeze(&mut self, whole_when_full: bool) {
        debug_assert!(self.frozen.is_empty(), "a checkpoint is in progress");
        self.frozen = std::mem::take(&mut self.dirty);
        if !whole_when_full {
            return;
        }
        for (c, bits) in self.frozen.iter_mut() {
            let full = self
                .chunks
                .get(c)
                .is_some_and(|s| s.pieces.list().is_none_or(|p| p.len() == PIECES_MAX));
            if full {
                *bits = [u64::MAX; CHUNK_ENTRIES / 64];
            }
        }
    }

    /// A checkpoint that took the changes failed: they are changes again.
    pub fn thaw(&mut self) {
        for (c, bits) in std::mem::take(&mut self.frozen) {
            let d = self.dirty.entry(c).or_insert([0; CHUNK_ENTRIES / 64]);
            for (w, b) in d.iter_mut().zip(bits) {
                *w |= b;
            }
        }
    }

    /// The checkpoint that took the changes wrote a base: every chunk is
    /// in piece 0 of the new chain.
    pub fn note_base(&mut self) {
        self.chain_epoch += 1;
        self.frozen.clear();
        for s in self.chunks.values_mut() {
            s.pieces = Pieces::only(0);
        }
        for (c, p) in self.paged.iter_mut() {
            p.pieces = Pieces::only(0);
            prune(&mut self.overlay_bytes, &mut p.overlay, self.dirty.get(c));
        }
    }

    /// The checkpoint that took the changes wrote them as piece `k` of the
    /// chain: a chunk it covers whole is in that piece alone.
    pub fn note_delta(&mut self, k: u16) {
        self.chain_epoch += 1;
        for (c, bits) in std::mem::take(&mut self.frozen) {
            let whole = bits.iter().all(|&w| w == u64::MAX);
            let resident = self.chunks.contains_key(&c);
            let pieces = match self.chunks.get_mut(&c) {
                Some(s) => &mut s.pieces,
                None => match self.paged.get_mut(&c) {
                    Some(p) => {
                        prune(&mut self.overlay_bytes, &mut p.overlay, self.dirty.get(&c));
                        &mut p.pieces
                    }
                    None => continue,
                },
            };
            if whole {
                *pieces = Pieces::only(k);
            } else {
                pieces.add(k);
            }
            debug_assert!(
                resident || pieces.list().is_some(),
                "a paged-out chunk turned untracked"
            );
        }
    }

    /// Sectors marked changed (for stats and tests).
    pub fn dirty_sectors(&self) -> u64 {
        self.dirty
            .values()
            .map(|b| b.iter().map(|w| u64::from(w.count_ones())).sum::<u64>())
            .sum()
    }
}

/// Keeps of a paged-out chunk's overlay the sectors still changed
/// (`bits`), once the chain holds the others.
fn prune(overlay_bytes: &mut u64, overlay: &mut Option<Box<Overlay>>, bits: Option<&DirtyBits>) {
    if let Some(o) = overlay {
        *overlay_bytes -= o.memory_bytes();
        if o.retain(bits) {
            *overlay_bytes += o.memory_bytes();
        } else {
            *overlay = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::blob;
    use super::*;
    use squeeze_format::MapEntry;

    #[test]
    fn only_changes_are_dirty() {
        let mut m = SectorMap::new();
        let e = blob(1 << 20, 1, 0);
        m.set(10, e).unwrap();
        m.set(11, MapEntry::UNMAPPED).unwrap(); // was unmapped already
        m.set(1 << 30, MapEntry::UNMAPPED).unwrap(); // no chunk at all
        assert_eq!(m.dirty_sectors(), 1);
        m.freeze(true);
        m.note_delta(1);
        m.set(10, e).unwrap(); // same entry
        assert_eq!(m.dirty_sectors(), 0);
        m.set(10, MapEntry::UNMAPPED).unwrap();
        assert_eq!(m.dirty_sectors(), 1);
    }
}
