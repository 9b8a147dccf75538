//! The sector map: logical sector -> packed [`MapEntry`] (8 bytes).
//!
//! Never-written space costs nothing: entries live in chunks of
//! [`CHUNK_ENTRIES`] sectors (2 MiB of logical space, 4 KiB of RAM), allocated
//! on the first mapping inside them and dropped when their last mapping goes.
//! Invariant: `mapped` = number of mapped entries over all chunks, and every
//! chunk in the tree has at least one mapped entry.

use squeeze_format::{MapEntry, CHUNK_ENTRIES};
use std::collections::BTreeMap;

struct Chunk {
    entries: Box<[MapEntry; CHUNK_ENTRIES]>,
    mapped: u32,
}

#[derive(Default)]
pub struct SectorMap {
    chunks: BTreeMap<u64, Chunk>,
    mapped: u64,
}

/// Approximate heap cost of one BTreeMap slot (key, value, node slack).
const TREE_SLOT_BYTES: usize = 40;

impl SectorMap {
    pub fn new() -> SectorMap {
        SectorMap::default()
    }

    pub fn get(&self, lba: u64) -> MapEntry {
        let (c, i) = split(lba);
        self.chunks
            .get(&c)
            .map_or(MapEntry::UNMAPPED, |ch| ch.entries[i])
    }

    /// Sets an entry, returning the previous one.
    pub fn set(&mut self, lba: u64, entry: MapEntry) -> MapEntry {
        let (c, i) = split(lba);
        if !entry.is_mapped() {
            let Some(ch) = self.chunks.get_mut(&c) else {
                return MapEntry::UNMAPPED;
            };
            let old = std::mem::replace(&mut ch.entries[i], entry);
            if old.is_mapped() {
                ch.mapped -= 1;
                self.mapped -= 1;
                if ch.mapped == 0 {
                    self.chunks.remove(&c);
                }
            }
            return old;
        }
        let ch = self.chunks.entry(c).or_insert_with(|| Chunk {
            entries: Box::new([MapEntry::UNMAPPED; CHUNK_ENTRIES]),
            mapped: 0,
        });
        let old = std::mem::replace(&mut ch.entries[i], entry);
        if !old.is_mapped() {
            ch.mapped += 1;
            self.mapped += 1;
        }
        old
    }

    /// Number of mapped sectors.
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    /// Bytes of RAM the map uses (chunks plus tree overhead).
    pub fn memory_bytes(&self) -> u64 {
        (self.chunks.len() * (CHUNK_ENTRIES * 8 + TREE_SLOT_BYTES)) as u64
    }

    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Chunks in index order (for checkpoints).
    pub fn chunks(&self) -> impl Iterator<Item = (u64, &[MapEntry; CHUNK_ENTRIES])> {
        self.chunks.iter().map(|(k, c)| (*k, &*c.entries))
    }

    /// Installs a whole chunk read from a checkpoint.
    pub fn load_chunk(&mut self, index: u64, entries: Box<[MapEntry; CHUNK_ENTRIES]>) {
        let mapped = entries.iter().filter(|e| e.is_mapped()).count() as u32;
        if mapped == 0 {
            return;
        }
        self.mapped += u64::from(mapped);
        if let Some(old) = self.chunks.insert(index, Chunk { entries, mapped }) {
            self.mapped -= u64::from(old.mapped);
        }
    }

    /// Mapped entries with their LBA, in LBA order.
    pub fn iter_mapped(&self) -> impl Iterator<Item = (u64, MapEntry)> + '_ {
        self.chunks.iter().flat_map(|(k, c)| {
            c.entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.is_mapped())
                .map(move |(i, e)| (k * CHUNK_ENTRIES as u64 + i as u64, *e))
        })
    }

    /// First mapped LBA at or after `lba`, if any before `end`.
    pub fn next_mapped(&self, lba: u64, end: u64) -> Option<u64> {
        let (c0, i0) = split(lba);
        for (k, ch) in self.chunks.range(c0..) {
            let base = k * CHUNK_ENTRIES as u64;
            if base >= end {
                return None;
            }
            let start = if *k == c0 { i0 } else { 0 };
            if let Some(i) = ch.entries[start..].iter().position(|e| e.is_mapped()) {
                let l = base + (start + i) as u64;
                return (l < end).then_some(l);
            }
        }
        None
    }

    /// Deep copy (for a checkpoint snapshot).
    pub fn snapshot(&self) -> Vec<(u64, Box<[MapEntry; CHUNK_ENTRIES]>)> {
        self.chunks
            .iter()
            .map(|(k, c)| (*k, c.entries.clone()))
            .collect()
    }
}

fn split(lba: u64) -> (u64, usize) {
    (
        lba / CHUNK_ENTRIES as u64,
        (lba % CHUNK_ENTRIES as u64) as usize,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_and_counts() {
        let mut m = SectorMap::new();
        let e = MapEntry::new(1 << 20, 0, 1, 4160);
        assert_eq!(m.set(5, e), MapEntry::UNMAPPED);
        assert_eq!(m.set(1 << 40, e), MapEntry::UNMAPPED);
        assert_eq!(m.mapped(), 2);
        assert_eq!(m.chunk_count(), 2);
        assert_eq!(m.get(5), e);
        assert_eq!(m.get(6), MapEntry::UNMAPPED);
        assert_eq!(m.next_mapped(6, u64::MAX), Some(1 << 40));
        assert_eq!(m.next_mapped(0, 5), None);
        assert_eq!(m.set(5, MapEntry::UNMAPPED), e);
        assert_eq!(m.chunk_count(), 1);
        assert_eq!(m.iter_mapped().collect::<Vec<_>>(), vec![(1 << 40, e)]);
    }

    #[test]
    fn dense_memory_is_about_eight_bytes_per_sector() {
        let mut m = SectorMap::new();
        let e = MapEntry::new(1 << 20, 0, 1, 4160);
        for l in 0..(64 * CHUNK_ENTRIES as u64) {
            m.set(l, e);
        }
        let per = m.memory_bytes() as f64 / m.mapped() as f64;
        assert!((8.0..8.1).contains(&per), "{per}");
    }
}
