//! Paging of map chunks out to the checkpoint chain and back.
//!
//! A resident chunk that did not change since the last checkpoint, and
//! whose runs the chain holds in at most [`PIECES_MAX`] pieces, may be
//! paged out (`evict`: a clock with a second chance): its entries are
//! dropped from memory and only its totals (`PagedChunk`) and the pieces
//! that hold it (`Pieces`) stay. A lookup that meets it answers
//! [`Paged`]; the caller reads it back (`meta::pager` builds a
//! [`LoadedChunk`] from its pieces) and `install`s it, checked against the
//! totals it was paged out with.
//!
//! Invariant: only tracked chunks (whose pieces are known) are paged out.

use super::chunk::Chunk;
use super::{SectorMap, Slot};
use crate::error::ChunkMismatch;
use squeeze_format::{MapEntry, MapRun, CHUNK_ENTRIES};
use std::sync::atomic::{AtomicBool, Ordering};

/// A chunk is paged out: its entries are in the checkpoint chain, not in
/// memory. The caller pages it in (`meta::pager`) and tries again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paged(pub u64);

/// Most pieces of the checkpoint chain a chunk's runs may be spread over
/// and still be paged out (reading it back reads each of them).
pub const PIECES_MAX: usize = 6;

/// The pieces of the current checkpoint chain that hold runs of a chunk, in
/// chain order: applied in that order to an empty chunk, their runs inside
/// the chunk rebuild it as the last checkpoint saw it. A chunk spread over
/// more than [`PIECES_MAX`] pieces is untracked (it stays in memory until
/// a checkpoint rewrites it whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pieces {
    n: u8,
    at: [u16; PIECES_MAX],
}

impl Pieces {
    const UNTRACKED: u8 = u8::MAX;

    /// In no piece yet (a chunk mapped since the last checkpoint: dirty).
    pub(super) fn none() -> Pieces {
        Pieces {
            n: 0,
            at: [0; PIECES_MAX],
        }
    }

    pub(super) fn untracked() -> Pieces {
        Pieces {
            n: Self::UNTRACKED,
            at: [0; PIECES_MAX],
        }
    }

    /// Only in the piece `k` (a base, or a delta that covered all of it).
    pub(super) fn only(k: u16) -> Pieces {
        let mut p = Pieces::none();
        p.add(k);
        p
    }

    pub(super) fn add(&mut self, k: u16) {
        let n = usize::from(self.n);
        if self.n == Self::UNTRACKED || (n > 0 && self.at[n - 1] == k) {
            return;
        }
        if n == PIECES_MAX {
            *self = Pieces::untracked();
            return;
        }
        self.at[n] = k;
        self.n += 1;
    }

    /// The pieces, or None when untracked.
    pub(super) fn list(&self) -> Option<&[u16]> {
        (self.n != Self::UNTRACKED).then(|| &self.at[..usize::from(self.n)])
    }
}

/// A chunk paged out: what the map's totals and the next base need
/// without reading it back.
#[derive(Clone, Copy, Debug)]
pub(super) struct PagedChunk {
    pub(super) mapped: u16,
    /// Runs its base holds (`Chunk::for_each_run`), and its weight.
    pub(super) runs: u16,
    pub(super) pieces: Pieces,
}

/// A chunk rebuilt from the checkpoint chain's runs (`meta::pager`), to be
/// installed in the map or read through.
pub struct LoadedChunk {
    base: u64,
    chunk: Chunk,
}

impl LoadedChunk {
    /// An empty chunk `c`.
    pub fn new(c: u64) -> LoadedChunk {
        LoadedChunk {
            base: c * CHUNK_ENTRIES as u64,
            chunk: Chunk::Runs {
                runs: Vec::new(),
                mapped: 0,
            },
        }
    }

    /// Applies the part of a piece's run that lies inside the chunk (runs
    /// of later pieces override earlier ones).
    pub fn apply(&mut self, r: MapRun) {
        let end = self.base + CHUNK_ENTRIES as u64;
        let lo = r.lba.max(self.base);
        let hi = r.end().min(end);
        if lo >= hi {
            return;
        }
        let first = r.entry((lo - r.lba) as u32);
        self.chunk
            .set_span((lo - self.base) as u16, (hi - lo) as u16, first);
    }

    pub fn mapped(&self) -> u32 {
        self.chunk.mapped()
    }

    /// The runs a base of this chunk holds.
    pub fn runs(&self) -> u64 {
        let mut n = 0;
        self.chunk.for_each_run(self.base, &mut |_| n += 1);
        n
    }

    pub fn for_each_run(&self, mut f: impl FnMut(MapRun)) {
        self.chunk.for_each_run(self.base, &mut f);
    }

    /// Mapped entries with their LBA.
    pub fn entries(&self) -> Vec<(u64, MapEntry)> {
        let mut v = Vec::with_capacity(self.chunk.mapped() as usize);
        self.for_each_run(|r| {
            for i in 0..r.sectors {
                v.push((r.lba + u64::from(i), r.entry(i)));
            }
        });
        v
    }
}

/// What an eviction pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Chunks paged out.
    pub chunks: u64,
    /// Untracked chunks marked for the next checkpoint to write whole (so
    /// that they can be paged out after it).
    pub rewrites: u64,
}

impl SectorMap {
    /// The map no longer matches any chain (a checkpoint loaded from format
    /// 1): nothing is paged out until a base.
    pub fn untrack_all(&mut self) {
        debug_assert!(self.paged.is_empty());
        for s in self.chunks.values_mut() {
            s.pieces = Pieces::untracked();
        }
    }

    /// The first chunk at or after `c` that maps something, in memory or
    /// paged out.
    pub fn next_chunk(&self, c: u64) -> Option<u64> {
        let a = self.chunks.range(c..).next().map(|(&k, _)| k);
        let b = self.paged.range(c..).next().map(|(&k, _)| k);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The pieces a paged-out chunk is in (None when `c` is not paged out).
    pub fn paged_pieces(&self, c: u64) -> Option<Vec<u16>> {
        self.paged.get(&c).map(|p| {
            p.pieces
                .list()
                .expect("only tracked chunks are paged")
                .to_vec()
        })
    }

    /// Resident chunks that did not change since the last checkpoint and
    /// could page out, with their pieces (to check that the chain holds
    /// what they hold).
    pub fn clean_chunks(&self) -> Vec<(u64, Vec<u16>)> {
        self.chunks
            .iter()
            .filter(|(c, _)| !self.dirty.contains_key(c) && !self.frozen.contains_key(c))
            .filter_map(|(&c, s)| {
                s.pieces
                    .list()
                    .filter(|p| !p.is_empty())
                    .map(|p| (c, p.to_vec()))
            })
            .collect()
    }

    /// Puts a chunk read back from the chain in place of its paged-out
    /// slot; refuses one that does not match what was paged out (the chain
    /// does not hold what the map wrote there).
    pub fn install(&mut self, c: u64, l: LoadedChunk) -> Result<(), ChunkMismatch> {
        let Some(p) = self.paged.get(&c) else {
            return Ok(()); // paged in meanwhile
        };
        let (mapped, runs) = (l.mapped(), l.runs());
        if mapped != u32::from(p.mapped) || runs != u64::from(p.runs) {
            return Err(ChunkMismatch {
                chunk: c,
                mapped,
                runs,
                paged_mapped: u32::from(p.mapped),
                paged_runs: u64::from(p.runs),
            });
        }
        let p = self.paged.remove(&c).expect("checked above");
        self.weight = self.weight + l.chunk.weight() - u64::from(p.runs);
        self.chunk_bytes += l.chunk.memory_bytes() as u64;
        self.chunks.insert(
            c,
            Slot {
                chunk: l.chunk,
                pieces: p.pieces,
                referenced: AtomicBool::new(true),
            },
        );
        Ok(())
    }

    /// Pages chunks out until the map uses at most `budget` bytes or the
    /// clock has looked at `looks` chunks: a chunk looked up since the hand
    /// last passed gets a second chance; changed chunks (since the last
    /// checkpoint, or taken by one in progress) stay. An untracked chunk is
    /// marked changed whole, so that the next checkpoint writes it in one
    /// piece and it can go after that. Only chunks below chunk `below` are
    /// looked at (recovery pages out behind the piece it loads).
    pub fn evict(&mut self, budget: u64, looks: usize, below: u64) -> Evicted {
        let mut done = Evicted::default();
        let mut looked = 0;
        while self.memory_bytes() > budget && looked < looks {
            looked += 1;
            let next = self.chunks.range(self.hand.min(below)..below).next();
            let c = match next.or_else(|| self.chunks.range(..below).next()) {
                Some((&c, _)) => c,
                None => break,
            };
            self.hand = c + 1;
            if self.dirty.contains_key(&c) || self.frozen.contains_key(&c) {
                continue;
            }
            let s = self.chunks.get(&c).expect("found above");
            if s.referenced.swap(false, Ordering::Relaxed) {
                continue;
            }
            match s.pieces.list() {
                Some(p) if !p.is_empty() => {}
                _ => {
                    self.dirty.insert(c, [u64::MAX; CHUNK_ENTRIES / 64]);
                    done.rewrites += 1;
                    continue;
                }
            }
            let s = self.chunks.remove(&c).expect("found above");
            let mut runs = 0u64;
            s.chunk
                .for_each_run(c * CHUNK_ENTRIES as u64, &mut |_| runs += 1);
            self.weight = self.weight - s.chunk.weight() + runs;
            self.chunk_bytes -= s.chunk.memory_bytes() as u64;
            self.paged.insert(
                c,
                PagedChunk {
                    mapped: s.chunk.mapped() as u16,
                    runs: runs as u16,
                    pieces: s.pieces,
                },
            );
            done.chunks += 1;
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::blob;
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A map that pages out to a chain of pieces (a base, then deltas)
    /// and reads chunks back from them answers as a map that never pages.
    #[test]
    fn paged_chunks_come_back_from_their_pieces() {
        let mut r = rand::rngs::StdRng::seed_from_u64(21);
        let span = 12 * CHUNK_ENTRIES as u64;
        let mut m = SectorMap::new();
        let mut model = vec![MapEntry::UNMAPPED; span as usize];
        let mut chain: Vec<Vec<MapRun>> = Vec::new();
        let load = |chain: &Vec<Vec<MapRun>>, c: u64, pieces: &[u16]| {
            let mut l = LoadedChunk::new(c);
            for &k in pieces {
                for run in &chain[usize::from(k)] {
                    l.apply(*run);
                }
            }
            l
        };
        let (mut faults, mut evicted) = (0, 0);
        for round in 0..80u64 {
            for k in 0..r.gen_range(1..60u64) {
                let start = r.gen_range(0..span);
                let n = r.gen_range(1..=32u64).min(span - start);
                let trim = r.gen_range(0..6) == 0;
                let mut i = 0;
                while i < n {
                    let e = if trim {
                        MapEntry::UNMAPPED
                    } else {
                        blob((1 << 20) + (round * 1000 + k) * 65600, n as u32, i as u32)
                    };
                    match m.set(start + i, e) {
                        Ok(old) => {
                            assert_eq!(old, model[(start + i) as usize]);
                            model[(start + i) as usize] = e;
                            i += 1;
                        }
                        Err(Paged(c)) => {
                            let pieces = m.paged_pieces(c).unwrap();
                            m.install(c, load(&chain, c, &pieces)).unwrap();
                            faults += 1;
                        }
                    }
                }
            }
            m.freeze(true);
            if round % 15 == 0 {
                let mut base = Vec::new();
                m.for_each_run(|c, p| Ok::<_, ()>(load(&chain, c, p)), |run| base.push(run))
                    .unwrap();
                assert_eq!(base.len() as u64, m.base_runs());
                chain = vec![base];
                m.note_base();
            } else {
                let mut delta = Vec::new();
                m.delta_runs(|run| delta.push(run));
                chain.push(delta);
                m.note_delta((chain.len() - 1) as u16);
            }
            let budget = if round % 3 == 0 { 0 } else { 20_000 };
            evicted += m.evict(budget, 2 * m.chunk_count(), u64::MAX).chunks;
            for (l, want) in model.iter().enumerate() {
                let got = loop {
                    match m.get(l as u64) {
                        Ok(e) => break e,
                        Err(Paged(c)) => {
                            let pieces = m.paged_pieces(c).unwrap();
                            m.install(c, load(&chain, c, &pieces)).unwrap();
                            faults += 1;
                        }
                    }
                };
                assert_eq!(got, *want, "round {round}, sector {l}");
            }
            assert_eq!(
                m.mapped(),
                model.iter().filter(|e| e.is_mapped()).count() as u64
            );
            // The next mapped sector of ranges, with chunks paged out.
            m.evict(0, 2 * m.chunk_count(), u64::MAX);
            for _ in 0..40 {
                let lba = r.gen_range(0..span);
                let end = r.gen_range(lba..=span + 10);
                let want = (lba..end.min(span)).find(|&l| model[l as usize].is_mapped());
                let got = loop {
                    match m.next_mapped(lba, end) {
                        Ok(n) => break n,
                        Err(Paged(c)) => {
                            let pieces = m.paged_pieces(c).unwrap();
                            m.install(c, load(&chain, c, &pieces)).unwrap();
                        }
                    }
                };
                assert_eq!(got, want, "next_mapped({lba}, {end})");
            }
        }
        assert!(
            faults > 50 && evicted > 50,
            "{faults} faults, {evicted} evicted"
        );
    }

    /// A changed chunk spread over as many pieces as the map tracks goes
    /// whole into the next delta, and is then in that piece alone.
    #[test]
    fn untracked_chunks_are_rewritten_whole_then_page_out() {
        let mut m = SectorMap::new();
        let mut chain: Vec<Vec<MapRun>> = Vec::new();
        m.set(0, blob(1 << 20, 1, 0)).unwrap();
        m.freeze(true);
        let mut base = Vec::new();
        m.for_each_run(|_, _| Err(()), |run| base.push(run))
            .unwrap();
        chain.push(base);
        m.note_base();
        for k in 1..PIECES_MAX as u64 {
            m.set(k, blob((1 << 20) + k * 4160, 1, 0)).unwrap();
            m.freeze(true);
            let mut d = Vec::new();
            m.delta_runs(|run| d.push(run));
            assert_eq!(d.len(), 1);
            chain.push(d);
            m.note_delta(k as u16);
        }
        // In PIECES_MAX pieces: the next change takes it whole.
        m.set(PIECES_MAX as u64, blob(9 << 20, 1, 0)).unwrap();
        m.freeze(true);
        let mut d = Vec::new();
        m.delta_runs(|run| d.push(run));
        assert_eq!(
            d.iter().map(|r| r.sectors).sum::<u32>(),
            CHUNK_ENTRIES as u32
        );
        chain.push(d);
        m.note_delta((chain.len() - 1) as u16);
        assert_eq!(m.evict(0, 10, u64::MAX).chunks, 1);
        assert_eq!(m.paged_pieces(0), Some(vec![(chain.len() - 1) as u16]));
        assert_eq!(m.get(3), Err(Paged(0)));
        let mut l = LoadedChunk::new(0);
        for run in chain.last().unwrap() {
            l.apply(*run);
        }
        m.install(0, l).unwrap();
        assert_eq!(m.get(3).unwrap(), blob((1 << 20) + 3 * 4160, 1, 0));
        assert_eq!(m.mapped(), 1 + PIECES_MAX as u64);
        // Without pressure a chunk in PIECES_MAX pieces turns untracked
        // instead of going whole into the next delta.
        let mut q = SectorMap::new();
        q.set(0, blob(1 << 20, 1, 0)).unwrap();
        q.freeze(false);
        q.note_base();
        for k in 1..=PIECES_MAX as u64 {
            q.set(k, blob((1 << 20) + k * 4160, 1, 0)).unwrap();
            q.freeze(false);
            let mut d = Vec::new();
            q.delta_runs(|run| d.push(run));
            assert_eq!(d.len(), 1, "only the change");
            q.note_delta(k as u16);
        }
        assert_eq!(
            q.evict(0, 10, u64::MAX),
            Evicted {
                chunks: 0,
                rewrites: 1
            }
        );
        // Untracked (as a chain from format 1 leaves it): an eviction
        // marks it for a rewrite whole instead.
        m.untrack_all();
        assert_eq!(
            m.evict(0, 10, u64::MAX),
            Evicted {
                chunks: 0,
                rewrites: 1
            }
        );
        assert_eq!(m.dirty_sectors(), CHUNK_ENTRIES as u64);
    }

    /// `runs_in` gives the mapped runs of a range cut to it (what a
    /// delta's run replaces at load), and refuses a range over a paged-out
    /// chunk; `evict` with a bound looks only at chunks below it.
    #[test]
    fn runs_in_a_range_and_eviction_below_a_chunk() {
        let mut m = SectorMap::new();
        let n = CHUNK_ENTRIES as u64;
        // A 32-sector blob at 500 (across the edge of chunks 0 and 1), one
        // sector at 3 and one in each of chunks 2 to 5.
        m.apply_run(
            MapRun {
                lba: 500,
                sectors: 32,
                first: blob(1 << 20, 32, 0),
            },
            Some(0),
        );
        m.set(3, blob(2 << 20, 1, 0)).unwrap();
        for c in 2..6u64 {
            m.apply_run(
                MapRun {
                    lba: c * n + 7,
                    sectors: 1,
                    first: blob((3 + c) << 20, 1, 0),
                },
                Some(0),
            );
        }
        let runs = |m: &SectorMap, lo, hi| {
            let mut v = Vec::new();
            m.runs_in(lo, hi, |r| v.push((r.lba, r.sectors, r.first)))
                .map(|()| v)
        };
        assert_eq!(
            runs(&m, 2, 520).unwrap(),
            vec![
                (3, 1, blob(2 << 20, 1, 0)),
                (500, 12, blob(1 << 20, 32, 0)),
                (512, 8, blob(1 << 20, 32, 12)),
            ]
        );
        assert_eq!(runs(&m, 4, 500).unwrap(), vec![]);
        // Chunks 1..6 are in piece 0 and unchanged (chunk 0 changed: the
        // set at 3); the clock looks only below chunk 4.
        let out = m.evict(0, 100, 4);
        assert_eq!(out.chunks, 3, "chunks 1, 2 and 3 (chunk 0 changed)");
        assert_eq!(m.paged_count(), 3);
        assert!(m.chunks.contains_key(&4) && m.chunks.contains_key(&5));
        assert_eq!(runs(&m, 0, 10 * n), Err(Paged(1)));
        assert_eq!(runs(&m, 4 * n, 6 * n).unwrap().len(), 2);
    }
}
