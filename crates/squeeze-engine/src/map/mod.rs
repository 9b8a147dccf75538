//! The sector map: logical sector -> packed [`MapEntry`] (8 bytes).
//!
//! Never-written space costs nothing: entries live in chunks of
//! [`CHUNK_ENTRIES`] sectors (2 MiB of logical space), allocated on the first
//! mapping inside them and dropped when their last mapping goes. This file
//! holds the map's type, its lookups and updates, and its sizes; the rest,
//! one concept a file, from the bottom up:
//! - `dense`: a dense chunk's entries, 5 bytes each while they allow it
//! - `chunk`: one chunk's entries, as runs or dense, and run arithmetic
//! - `pieces`: the pieces of the checkpoint chain that hold a chunk
//! - `paging`: chunks paged out to the checkpoint chain
//! - `page_in`: a chunk read back from the chain put back in the map, and
//!   a fault that read it without the write lock checked still current
//! - `overlay`: the changed entries a changed chunk pages out with
//! - `dirty_bits`: one bit per sector of a chunk, and the changes by chunk
//! - `dirty`: what changed since the last checkpoint, and the handshake
//!   with a checkpoint that takes it
//! - `runs`: the map written as a checkpoint's runs (base, delta) and read
//!   back from them at open
//!
//! Invariants: `mapped` = number of mapped sectors over all chunks; `weight`
//! = the sum of the chunks' weights (runs, or mapped sectors of a dense
//! chunk: at least the runs a checkpoint of the chunk holds); every chunk in
//! the tree maps at least one sector; runs are sorted, disjoint, non-empty,
//! and two adjacent runs are never mergeable.

mod chunk;
mod dense;
mod dirty;
mod dirty_bits;
mod overlay;
pub mod page_in;
pub mod paging;
mod pieces;
mod runs;

use chunk::{Chunk, RUNS_MAX};
use dirty_bits::{mark, Dirty, DirtyBits};
use paging::PagedChunk;
use pieces::Pieces;
use squeeze_format::{MapEntry, MapRun, CHUNK_ENTRIES};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

// What `state` names from here (callers import the rest from `paging`).
pub use paging::Paged;

/// A chunk in memory.
struct Slot {
    chunk: Chunk,
    pieces: Pieces,
    /// Looked up since the eviction clock last passed (second chance).
    referenced: AtomicBool,
}

impl Slot {
    /// A chunk that maps nothing yet, in `pieces`.
    fn empty(pieces: Pieces, referenced: bool) -> Slot {
        Slot {
            chunk: Chunk::Runs {
                runs: Vec::new(),
                mapped: 0,
            },
            pieces,
            referenced: AtomicBool::new(referenced),
        }
    }
}

pub struct SectorMap {
    chunks: BTreeMap<u64, Slot>,
    paged: BTreeMap<u64, PagedChunk>,
    mapped: u64,
    weight: u64,
    dirty: Dirty,
    /// The changes a checkpoint in progress took (`freeze`): not paged out
    /// until the chain holds them (`note_base`, `note_delta`).
    frozen: Dirty,
    /// Heap bytes of the resident chunks' own storage.
    chunk_bytes: u64,
    /// Heap bytes of the paged-out chunks' overlays.
    overlay_bytes: u64,
    /// The eviction clock's hand: the chunk it looks at next.
    hand: u64,
    /// Moves on whenever chunks' pieces, or the chain they index, may
    /// change (`page_in`: a fault read outside the write lock installs
    /// only at the epoch it read at).
    chain_epoch: u64,
    /// Runs a chunk keeps as a run list before it turns dense
    /// ([`RUNS_MAX`] unless `set_runs_max` says otherwise).
    runs_max: usize,
}

impl Default for SectorMap {
    fn default() -> SectorMap {
        SectorMap {
            chunks: BTreeMap::new(),
            paged: BTreeMap::new(),
            mapped: 0,
            weight: 0,
            dirty: Dirty::default(),
            frozen: Dirty::default(),
            chunk_bytes: 0,
            overlay_bytes: 0,
            hand: 0,
            chain_epoch: 0,
            runs_max: RUNS_MAX,
        }
    }
}

/// Approximate heap cost of one BTreeMap slot (key, value, node slack).
const TREE_SLOT_BYTES: usize = 48;
/// RAM of a resident chunk beside its runs or entries.
const SLOT_BYTES: u64 = (TREE_SLOT_BYTES + std::mem::size_of::<Slot>()) as u64;
/// RAM of a paged-out chunk.
const PAGED_SLOT_BYTES: u64 = (TREE_SLOT_BYTES / 2 + std::mem::size_of::<PagedChunk>()) as u64;

impl SectorMap {
    pub fn new() -> SectorMap {
        SectorMap::default()
    }

    /// Chunks turn dense once a change could take their run list past `n`
    /// runs (`OpenOptions::map_runs_max`), not past [`RUNS_MAX`]; chunks
    /// already resident keep their form until they next change.
    pub fn set_runs_max(&mut self, n: usize) {
        self.runs_max = n;
    }

    fn slot(&self, c: u64) -> Result<Option<&Slot>, Paged> {
        match self.chunks.get(&c) {
            Some(s) => {
                // Load first: readers of a hot chunk do not all write its
                // cache line.
                if !s.referenced.load(Ordering::Relaxed) {
                    s.referenced.store(true, Ordering::Relaxed);
                }
                Ok(Some(s))
            }
            None if self.paged.contains_key(&c) => Err(Paged(c)),
            None => Ok(None),
        }
    }

    pub fn get(&self, lba: u64) -> Result<MapEntry, Paged> {
        let (c, i) = split(lba);
        Ok(self.slot(c)?.map_or(MapEntry::UNMAPPED, |s| s.chunk.get(i)))
    }

    /// Fills `out` with the entries of `lba..lba + out.len()`: one tree
    /// lookup and one run search per chunk instead of one per sector (a
    /// 1 MiB read spent a quarter of its time in per-sector lookups).
    pub fn get_range(&self, lba: u64, out: &mut [MapEntry]) -> Result<(), Paged> {
        let mut done = 0;
        while done < out.len() {
            let (c, i) = split(lba + done as u64);
            let n = (CHUNK_ENTRIES - i as usize).min(out.len() - done);
            let dst = &mut out[done..done + n];
            match self.slot(c)? {
                None => dst.fill(MapEntry::UNMAPPED),
                Some(s) => s.chunk.get_range(i, dst),
            }
            done += n;
        }
        Ok(())
    }

    /// Every chunk of `lba..lba + n` is in memory (or holds nothing).
    pub fn need(&self, lba: u64, n: u64) -> Result<(), Paged> {
        if n == 0 {
            return Ok(());
        }
        let (c0, _) = split(lba);
        let (c1, _) = split(lba + n - 1);
        match self.paged.range(c0..=c1).next() {
            Some((&c, _)) => Err(Paged(c)),
            None => Ok(()),
        }
    }

    /// Sets an entry, returning the previous one.
    pub fn set(&mut self, lba: u64, entry: MapEntry) -> Result<MapEntry, Paged> {
        let (c, i) = split(lba);
        if !self.chunks.contains_key(&c) {
            if self.paged.contains_key(&c) {
                return Err(Paged(c));
            }
            if !entry.is_mapped() {
                return Ok(MapEntry::UNMAPPED);
            }
            self.chunks.insert(c, Slot::empty(Pieces::none(), true));
        }
        let slot = self.chunks.get_mut(&c).expect("inserted above");
        let ch = &mut slot.chunk;
        let (before_w, before_b) = (ch.weight(), ch.memory_bytes() as u64);
        let old = ch.set(i, entry, self.runs_max);
        self.weight = self.weight + ch.weight() - before_w;
        self.chunk_bytes = self.chunk_bytes + ch.memory_bytes() as u64 - before_b;
        if old != entry {
            mark(&mut self.dirty, c, i);
        }
        match (old.is_mapped(), entry.is_mapped()) {
            (false, true) => self.mapped += 1,
            (true, false) => self.mapped -= 1,
            _ => {}
        }
        if ch.mapped() == 0 {
            self.drop_slot(c);
        }
        Ok(old)
    }

    /// Removes a resident chunk that maps nothing.
    fn drop_slot(&mut self, c: u64) {
        if let Some(s) = self.chunks.remove(&c) {
            debug_assert_eq!(s.chunk.mapped(), 0);
            self.weight -= s.chunk.weight();
            self.chunk_bytes -= s.chunk.memory_bytes() as u64;
        }
    }

    /// Calls `f` with the mapped runs of `lo..hi`, cut to it, in LBA order
    /// (runs are not joined across chunk edges).
    pub fn runs_in(&self, lo: u64, hi: u64, mut f: impl FnMut(MapRun)) -> Result<(), Paged> {
        self.need(lo, hi.saturating_sub(lo))?;
        let (c0, _) = split(lo);
        for (&c, s) in self.chunks.range(c0..) {
            let base = c * CHUNK_ENTRIES as u64;
            if base >= hi {
                break;
            }
            s.chunk.for_each_run(base, &mut |r| {
                let (a, b) = (r.lba.max(lo), r.end().min(hi));
                if a < b {
                    f(MapRun {
                        lba: a,
                        sectors: (b - a) as u32,
                        first: r.entry((a - r.lba) as u32),
                    });
                }
            });
        }
        Ok(())
    }

    /// First mapped LBA at or after `lba`, if any before `end`.
    pub fn next_mapped(&self, lba: u64, end: u64) -> Result<Option<u64>, Paged> {
        let (c0, i0) = split(lba);
        let first_paged = self.paged.range(c0..).next().map(|(&k, _)| k);
        for (k, s) in self.chunks.range(c0..) {
            // A paged-out chunk comes first: it maps something.
            if first_paged.is_some_and(|p| p < *k) {
                break;
            }
            let base = k * CHUNK_ENTRIES as u64;
            if base >= end {
                return Ok(None);
            }
            let start = if *k == c0 { i0 } else { 0 };
            let found = match &s.chunk {
                Chunk::Dense { entries, .. } => entries.first_mapped(start),
                Chunk::Runs { runs, .. } => {
                    let k = runs.partition_point(|r| r.end() <= start);
                    runs.get(k).map(|r| r.start.max(start))
                }
            };
            if let Some(i) = found {
                let l = base + u64::from(i);
                return Ok((l < end).then_some(l));
            }
        }
        match first_paged {
            Some(p) if p * (CHUNK_ENTRIES as u64) < end => Err(Paged(p)),
            _ => Ok(None),
        }
    }

    /// Mapped entries of resident chunk `c` with their LBA.
    pub fn chunk_entries(&self, c: u64) -> Result<Vec<(u64, MapEntry)>, Paged> {
        let Some(s) = self.slot(c)? else {
            return Ok(Vec::new());
        };
        let mut v = Vec::with_capacity(s.chunk.mapped() as usize);
        s.chunk.for_each_run(c * CHUNK_ENTRIES as u64, &mut |r| {
            for i in 0..r.sectors {
                v.push((r.lba + u64::from(i), r.entry(i)));
            }
        });
        Ok(v)
    }

    /// Mapped entries with their LBA, in LBA order (resident chunks).
    #[cfg(test)]
    pub fn iter_mapped(&self) -> impl Iterator<Item = (u64, MapEntry)> + '_ {
        assert!(self.paged.is_empty(), "iter_mapped over a paged map");
        self.chunks.iter().flat_map(|(k, s)| {
            let base = k * CHUNK_ENTRIES as u64;
            let v: Vec<(u64, MapEntry)> = match &s.chunk {
                Chunk::Dense { entries, .. } => entries
                    .to_array()
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.is_mapped())
                    .map(|(i, e)| (base + i as u64, *e))
                    .collect(),
                Chunk::Runs { runs, .. } => runs
                    .iter()
                    .flat_map(|r| {
                        (r.start..r.end()).map(move |i| (base + u64::from(i), r.entry(i)))
                    })
                    .collect(),
            };
            v.into_iter()
        })
    }

    /// At least the runs a checkpoint base of the map holds.
    pub fn weight(&self) -> u64 {
        self.weight
    }

    /// Number of mapped sectors.
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    /// Bytes of RAM the map uses: resident chunks, paged-out chunks' slots
    /// and overlays, and the record of what changed since the last
    /// checkpoint.
    pub fn memory_bytes(&self) -> u64 {
        let dirty = (self.dirty.len() + self.frozen.len())
            * (std::mem::size_of::<DirtyBits>() + TREE_SLOT_BYTES);
        self.chunk_bytes
            + self.overlay_bytes
            + self.chunks.len() as u64 * SLOT_BYTES
            + self.paged.len() as u64 * PAGED_SLOT_BYTES
            + dirty as u64
    }

    /// Chunks that map something, in memory or paged out.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len() + self.paged.len()
    }

    /// Chunks paged out.
    pub fn paged_count(&self) -> usize {
        self.paged.len()
    }

    /// Chunks in memory.
    pub fn resident_count(&self) -> usize {
        self.chunks.len()
    }
}

fn split(lba: u64) -> (u64, u16) {
    (
        lba / CHUNK_ENTRIES as u64,
        (lba % CHUNK_ENTRIES as u64) as u16,
    )
}

#[cfg(test)]
mod tests {
    use super::page_in::LoadedChunk;
    use super::*;
    use rand::{Rng, SeedableRng};

    pub(super) fn no_load(c: u64, _: &[u16]) -> Result<LoadedChunk, ()> {
        panic!("chunk {c} is paged out")
    }

    pub(super) fn blob(offset: u64, sectors: u32, i: u32) -> MapEntry {
        MapEntry::new(offset, i, sectors, 4096 * u64::from(sectors) + 64)
    }

    /// The pieces of a model checkpoint chain (a base, then deltas).
    pub(super) type Chain = Vec<Vec<MapRun>>;

    /// Chunk `c` read back from `pieces` of `chain`.
    pub(super) fn load(chain: &Chain, c: u64, pieces: &[u16]) -> LoadedChunk {
        let mut l = LoadedChunk::new(c);
        for &k in pieces {
            for run in &chain[usize::from(k)] {
                l.apply(*run);
            }
        }
        l
    }

    /// Pages chunk `c` of `m` in from `chain`, under the write lock as
    /// `with_map_mut` does.
    pub(super) fn fault_in(m: &mut SectorMap, chain: &Chain, c: u64) {
        let pieces = m.paged_pieces(c).unwrap();
        m.install(c, load(chain, c, &pieces)).unwrap();
    }

    /// A model checkpoint of the frozen map `m` and of `never`, the map
    /// that never pages beside it: its piece (a base when `base`, else a
    /// delta), every chunk of `m` paged out that can be, then the piece
    /// named in `chain`, or both maps thawed when the checkpoint `failed`.
    pub(super) fn checkpoint(
        m: &mut SectorMap,
        never: &mut SectorMap,
        chain: &mut Chain,
        base: bool,
        failed: bool,
    ) {
        let piece = if base {
            let mut b = Vec::new();
            m.for_each_run(|c, p| Ok::<_, ()>(load(chain, c, p)), |run| b.push(run))
                .unwrap();
            assert_eq!(b.len() as u64, m.base_runs());
            b
        } else {
            let mut d = Vec::new();
            m.delta_runs(|run| d.push(run));
            d
        };
        m.evict(0, 2 * m.chunk_count(), u64::MAX);
        if failed {
            m.thaw();
            never.thaw();
        } else if base {
            *chain = vec![piece];
            m.note_base();
            never.note_base();
        } else {
            chain.push(piece);
            m.note_delta((chain.len() - 1) as u16);
            never.note_delta((chain.len() - 1) as u16);
        }
    }

    #[test]
    fn sparse_and_counts() {
        let mut m = SectorMap::new();
        let e = MapEntry::new(1 << 20, 0, 1, 4160);
        assert_eq!(m.set(5, e).unwrap(), MapEntry::UNMAPPED);
        assert_eq!(m.set(1 << 40, e).unwrap(), MapEntry::UNMAPPED);
        assert_eq!(m.mapped(), 2);
        assert_eq!(m.chunk_count(), 2);
        assert_eq!(m.get(5).unwrap(), e);
        assert_eq!(m.get(6).unwrap(), MapEntry::UNMAPPED);
        assert_eq!(m.next_mapped(6, u64::MAX).unwrap(), Some(1 << 40));
        assert_eq!(m.next_mapped(0, 5).unwrap(), None);
        assert_eq!(m.set(5, MapEntry::UNMAPPED).unwrap(), e);
        assert_eq!(m.chunk_count(), 1);
        assert_eq!(m.iter_mapped().collect::<Vec<_>>(), vec![(1 << 40, e)]);
    }

    #[test]
    fn blobs_cost_a_run_each() {
        let mut m = SectorMap::new();
        for b in 0..(64 * CHUNK_ENTRIES as u64 / 16) {
            for i in 0..16 {
                m.set(b * 16 + i, blob((1 << 20) + b * 65600, 16, i as u32))
                    .unwrap();
            }
        }
        m.freeze(true); // as a checkpoint does
        m.note_base();
        let per = m.memory_bytes() as f64 / m.mapped() as f64;
        assert!(per < 1.5, "{per} bytes per sector");
        assert_eq!(m.get(17).unwrap(), blob((1 << 20) + 65600, 16, 1));
    }

    #[test]
    fn scattered_overwrites_stay_at_about_eight_bytes() {
        let mut m = SectorMap::new();
        let mut r = rand::rngs::StdRng::seed_from_u64(1);
        let n = 64 * CHUNK_ENTRIES as u64;
        for l in 0..n {
            m.set(l, blob(1 << 20, 16, (l % 16) as u32)).unwrap();
        }
        for k in 0..(4 * n) {
            let l = r.gen_range(0..n);
            m.set(l, MapEntry::new((2 << 20) + 16 * k, 0, 1, 4160))
                .unwrap();
        }
        // Between checkpoints the record of changes adds a bit per sector.
        let per = m.memory_bytes() as f64 / m.mapped() as f64;
        assert!(per <= 8.45, "{per} bytes per sector");
        m.freeze(true);
        m.note_base();
        let per = m.memory_bytes() as f64 / m.mapped() as f64;
        assert!(per <= 8.2, "{per} bytes per sector");
    }

    /// squeeze-kv's map: every bucket its own one-sector record, so every
    /// chunk is dense; such chunks cost 5 bytes a sector, and one blob's
    /// sector makes only its own chunk 8.
    #[test]
    fn single_sector_records_cost_about_five_bytes() {
        let mut m = SectorMap::new();
        let n = 64 * CHUNK_ENTRIES as u64;
        for l in 0..n {
            m.set(
                l,
                MapEntry::new((1 << 20) + 4176 * l, 0, 1, 16 * (100 + l % 160)),
            )
            .unwrap();
        }
        m.freeze(true);
        m.note_base();
        let per = m.memory_bytes() as f64 / m.mapped() as f64;
        assert!(per <= 5.2, "{per} bytes per sector");
        let before = m.memory_bytes();
        m.set(7, blob(1 << 30, 4, 2)).unwrap();
        // The chunk turns 8 bytes a sector; the record of its change beside.
        let grew = m.memory_bytes() - before;
        assert!((1536..1536 + 256).contains(&grew), "grew by {grew}");
        for l in (0..n).step_by(97) {
            let want = if l == 7 {
                blob(1 << 30, 4, 2)
            } else {
                MapEntry::new((1 << 20) + 4176 * l, 0, 1, 16 * (100 + l % 160))
            };
            assert_eq!(m.get(l).unwrap(), want);
        }
    }

    /// Random sets and clears against a plain array, with the default
    /// bound on a chunk's runs, with dense chunks from the first entry
    /// (`set_runs_max(0)`) and with a small bound: the same answers, and no
    /// run list past the bound.
    #[test]
    fn matches_a_dense_model() {
        let mut r = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..21 {
            let runs_max = [RUNS_MAX, 0, 5][round % 3];
            let mut m = SectorMap::new();
            m.set_runs_max(runs_max);
            let mut model = vec![MapEntry::UNMAPPED; 3 * CHUNK_ENTRIES];
            for k in 0..3000u64 {
                let start = r.gen_range(0..model.len() as u64);
                let n = r.gen_range(1..=32u64).min(model.len() as u64 - start);
                let kind = r.gen_range(0..4);
                for i in 0..n {
                    let e = match kind {
                        0 => MapEntry::UNMAPPED,
                        _ => blob((1 << 20) + 16 * 4096 * k, n as u32, i as u32),
                    };
                    let old = m.set(start + i, e).unwrap();
                    assert_eq!(old, model[(start + i) as usize]);
                    model[(start + i) as usize] = e;
                }
                if k % 500 == 0 {
                    for (l, want) in model.iter().enumerate() {
                        assert_eq!(m.get(l as u64).unwrap(), *want);
                    }
                    // Ranges: across chunk edges and past the last chunk.
                    for _ in 0..50 {
                        let a = r.gen_range(0..model.len());
                        let n = r.gen_range(1..=(model.len() - a + 700).min(1500));
                        let mut out = vec![MapEntry::new(1 << 20, 0, 1, 4160); n];
                        m.get_range(a as u64, &mut out).unwrap();
                        for (j, e) in out.iter().enumerate() {
                            let want = model.get(a + j).copied().unwrap_or(MapEntry::UNMAPPED);
                            assert_eq!(*e, want, "get_range({a}, {n}) at {j}");
                        }
                    }
                    let mapped = model.iter().filter(|e| e.is_mapped()).count() as u64;
                    assert_eq!(m.mapped(), mapped);
                    let it: Vec<_> = m.iter_mapped().collect();
                    assert_eq!(it.len() as u64, mapped);
                    let first = model.iter().position(|e| e.is_mapped()).map(|p| p as u64);
                    assert_eq!(m.next_mapped(0, u64::MAX).unwrap(), first);
                    // Round trip through a checkpoint base.
                    let mut m2 = SectorMap::new();
                    m2.set_runs_max(runs_max);
                    m.for_each_run(no_load, |r| m2.load_run(r)).unwrap();
                    assert_eq!(m2.iter_mapped().collect::<Vec<_>>(), it);
                    assert_eq!(m2.mapped(), m.mapped());
                    for map in [&m, &m2] {
                        for s in map.chunks.values() {
                            if let Chunk::Runs { runs, .. } = &s.chunk {
                                assert!(runs.len() <= runs_max, "{} runs", runs.len());
                            }
                        }
                    }
                }
            }
        }
    }
}
