//! Paging of map chunks out to the checkpoint chain and back.
//!
//! A resident chunk whose runs the chain holds in at most [`PIECES_MAX`]
//! pieces may be paged out (`evict`: a clock with a second chance): its
//! entries are dropped from memory and only its totals (`PagedChunk`), the
//! pieces that hold it (`Pieces`) and, when it changed since the last
//! checkpoint, the changed entries (`overlay`) stay. A lookup that meets
//! it answers [`Paged`]; the caller reads it back and installs it
//! (`page_in`).
//!
//! Invariants: only tracked chunks (whose pieces are known) are paged out;
//! a changed chunk only when its pieces, with the one or two the
//! checkpoints that will take its changes add, stay within [`PIECES_MAX`]
//! (so that it never turns untracked while paged out).

use super::dirty_bits::{marked, DirtyBits};
use super::overlay::{Overlay, OVERLAY_ENTRY_BYTES};
use super::pieces::{Pieces, PIECES_MAX};
use super::SectorMap;
use squeeze_format::CHUNK_ENTRIES;
use std::sync::atomic::Ordering;

/// A chunk is paged out: its entries are in the checkpoint chain, not in
/// memory. The caller pages it in (`meta::pager`) and tries again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paged(pub u64);

/// A chunk paged out: what the map's totals and the next base need
/// without reading it back.
#[derive(Debug)]
pub(super) struct PagedChunk {
    pub(super) mapped: u16,
    /// Runs its base holds (`Chunk::for_each_run`), and its weight.
    pub(super) runs: u16,
    pub(super) pieces: Pieces,
    /// The entries changed since the last checkpoint (`overlay`).
    pub(super) overlay: Option<Box<Overlay>>,
}

/// A changed chunk pages out only when its overlay costs at most this
/// share of what the chunk costs in memory (1/4).
const OVERLAY_SHARE_MAX: u64 = 4;

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
        self.chain_epoch += 1;
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

    /// True when the map pages and at least a quarter of its chunks are
    /// spread over `PIECES_MAX - 1` pieces or more (or untracked): a
    /// changed chunk in that many can soon no longer page out (the deltas
    /// that take its changes would spread it over more than
    /// [`PIECES_MAX`]), so changes spread over the whole map (random
    /// updates touch every chunk between two checkpoints) would hold it
    /// all in memory. A base puts every chunk back in one piece.
    pub fn crowded(&self) -> bool {
        if self.paged.is_empty() {
            return false;
        }
        let crowded = |p: &Pieces| p.list().is_none_or(|l| l.len() + 1 >= PIECES_MAX);
        let n = self.chunks.values().filter(|s| crowded(&s.pieces)).count()
            + self.paged.values().filter(|p| crowded(&p.pieces)).count();
        4 * n >= self.chunk_count()
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

    /// Pages chunks out until the map uses at most `budget` bytes or the
    /// clock has looked at `looks` chunks: a chunk looked up since the hand
    /// last passed gets a second chance. A changed chunk (since the last
    /// checkpoint, or taken by one in progress) goes with its changed
    /// entries as its overlay, when they cost at most a quarter of the
    /// chunk and the checkpoints that take them leave it in at most
    /// [`PIECES_MAX`] pieces; otherwise it stays. An untracked chunk is
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
            let (dirty, frozen) = (self.dirty.get(&c), self.frozen.get(&c));
            let s = self.chunks.get(&c).expect("found above");
            if s.referenced.swap(false, Ordering::Relaxed) {
                continue;
            }
            let pending = usize::from(dirty.is_some()) + usize::from(frozen.is_some());
            match s.pieces.list() {
                Some(p) if pending > 0 && p.len() + pending > PIECES_MAX => continue,
                Some(p) if pending > 0 || !p.is_empty() => {}
                _ if pending > 0 => continue,
                _ => {
                    self.dirty.insert(c, [u64::MAX; CHUNK_ENTRIES / 64]);
                    done.rewrites += 1;
                    continue;
                }
            }
            let overlay = match (dirty, frozen) {
                (None, None) => None,
                (a, b) => {
                    let mut bits: DirtyBits = [0; CHUNK_ENTRIES / 64];
                    for src in [a, b].into_iter().flatten() {
                        for (w, x) in bits.iter_mut().zip(src) {
                            *w |= x;
                        }
                    }
                    let cost = marked(&bits) as u64 * OVERLAY_ENTRY_BYTES * OVERLAY_SHARE_MAX;
                    if cost > s.chunk.memory_bytes() as u64 {
                        continue;
                    }
                    Some(Box::new(Overlay::take(&s.chunk, &bits)))
                }
            };
            let s = self.chunks.remove(&c).expect("found above");
            let runs = s.chunk.runs();
            self.weight = self.weight - s.chunk.weight() + runs;
            self.chunk_bytes -= s.chunk.memory_bytes() as u64;
            self.overlay_bytes += overlay.as_ref().map_or(0, |o| o.memory_bytes());
            self.paged.insert(
                c,
                PagedChunk {
                    mapped: s.chunk.mapped() as u16,
                    runs: runs as u16,
                    pieces: s.pieces,
                    overlay,
                },
            );
            done.chunks += 1;
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::super::page_in::LoadedChunk;
    use super::super::tests::{blob, checkpoint, fault_in, load, Chain};
    use super::*;
    use rand::{Rng, SeedableRng};
    use squeeze_format::{MapEntry, MapRun};

    /// A map that pages out to a chain of pieces (a base, then deltas)
    /// and reads chunks back from them answers as a map that never pages.
    #[test]
    fn paged_chunks_come_back_from_their_pieces() {
        let mut r = rand::rngs::StdRng::seed_from_u64(21);
        let span = 12 * CHUNK_ENTRIES as u64;
        let mut m = SectorMap::new();
        let mut model = vec![MapEntry::UNMAPPED; span as usize];
        let mut chain: Chain = Vec::new();
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
                            fault_in(&mut m, &chain, c);
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
                            fault_in(&mut m, &chain, c);
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
                            fault_in(&mut m, &chain, c);
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

    /// Changed chunks page out with their overlay at any moment (between
    /// changes, between a checkpoint's freeze and the superblock naming
    /// it, after a checkpoint that failed), under a cache of nothing: the
    /// map answers as a map that never pages, and the chain it wrote
    /// rebuilds it.
    #[test]
    fn changed_chunks_page_out_with_their_overlay() {
        let mut r = rand::rngs::StdRng::seed_from_u64(37);
        let span = 10 * CHUNK_ENTRIES as u64;
        let mut m = SectorMap::new();
        let mut never = SectorMap::new();
        let mut chain: Chain = Vec::new();
        let (mut with_overlay, mut faults) = (0u64, 0u64);
        for round in 0..120u64 {
            for k in 0..r.gen_range(1..80u64) {
                // Scattered single sectors (dense chunks), sometimes blobs.
                let start = r.gen_range(0..span);
                let n = if r.gen_range(0..4) == 0 {
                    r.gen_range(1..=16u64).min(span - start)
                } else {
                    1
                };
                let trim = r.gen_range(0..8) == 0;
                let mut i = 0;
                while i < n {
                    let e = if trim {
                        MapEntry::UNMAPPED
                    } else {
                        blob((1 << 20) + (round * 100 + k) * 65600, n as u32, i as u32)
                    };
                    match m.set(start + i, e) {
                        Ok(old) => {
                            assert_eq!(old, never.set(start + i, e).unwrap());
                            i += 1;
                        }
                        Err(Paged(c)) => {
                            fault_in(&mut m, &chain, c);
                            faults += 1;
                        }
                    }
                }
                if r.gen_range(0..10) == 0 {
                    m.evict(0, 8, u64::MAX);
                }
            }
            m.evict(0, 2 * m.chunk_count(), u64::MAX);
            with_overlay += m.paged.values().filter(|p| p.overlay.is_some()).count() as u64;
            // A checkpoint: freeze, the piece, chunks paged out meanwhile,
            // then named (or failed: thawed).
            let pressed = r.gen_range(0..2) == 0;
            m.freeze(pressed);
            never.freeze(false);
            let failed = r.gen_range(0..12) == 0;
            checkpoint(&mut m, &mut never, &mut chain, round % 25 == 0, failed);
            if !failed {
                // The chain holds the map as the checkpoint saw it.
                let mut copy = SectorMap::new();
                for (k, piece) in chain.iter().enumerate() {
                    for run in piece {
                        copy.apply_run(*run, Some(k as u16));
                    }
                }
                assert_eq!(
                    copy.iter_mapped().collect::<Vec<_>>(),
                    never.iter_mapped().collect::<Vec<_>>(),
                    "round {round}: the chain"
                );
            }
            if r.gen_range(0..2) == 0 {
                m.evict(0, 2 * m.chunk_count(), u64::MAX);
            }
            // Every answer as the map that never pages.
            for l in 0..span {
                let got = loop {
                    match m.get(l) {
                        Ok(e) => break e,
                        Err(Paged(c)) => fault_in(&mut m, &chain, c),
                    }
                };
                assert_eq!(got, never.get(l).unwrap(), "round {round}, sector {l}");
            }
            assert_eq!(m.mapped(), never.mapped());
            // What the overlays cost is counted, and goes with them.
            let counted: u64 = m
                .paged
                .values()
                .filter_map(|p| p.overlay.as_ref())
                .map(|o| o.memory_bytes())
                .sum();
            assert_eq!(m.overlay_bytes, counted);
        }
        // Page everything in: the map holds what never paged, and a base
        // of it rebuilds it.
        m.evict(0, 2 * m.chunk_count(), u64::MAX);
        let mut copy = SectorMap::new();
        m.for_each_run(
            |c, p| Ok::<_, ()>(load(&chain, c, p)),
            |run| copy.load_run(run),
        )
        .unwrap();
        assert_eq!(
            copy.iter_mapped().collect::<Vec<_>>(),
            never.iter_mapped().collect::<Vec<_>>()
        );
        assert!(
            with_overlay > 100 && faults > 100,
            "{with_overlay} chunks paged out with an overlay, {faults} faults"
        );
    }

    /// Changes over every chunk crowd the chain's pieces: once a quarter
    /// of the chunks are in `PIECES_MAX - 1` pieces and the map pages, a
    /// base is due (`crowded`), before changed chunks can no longer go.
    #[test]
    fn changes_everywhere_crowd_the_map_before_it_sticks() {
        let mut m = SectorMap::new();
        let n = CHUNK_ENTRIES as u64;
        let mut chain: Chain = Vec::new();
        for c in 0..8 {
            m.set(c * n, blob(1 << 20, 1, 0)).unwrap();
        }
        m.freeze(true);
        let mut base = Vec::new();
        m.for_each_run(|_, _| Err(()), |run| base.push(run))
            .unwrap();
        chain.push(base);
        m.note_base();
        assert!(!m.crowded(), "nothing paged");
        for k in 1..PIECES_MAX as u16 {
            for c in 0..8 {
                let lba = c * n + u64::from(k);
                while let Err(Paged(c)) = m.set(lba, blob(2 << 20, 1, 0)) {
                    fault_in(&mut m, &chain, c);
                }
            }
            m.freeze(true);
            let mut d = Vec::new();
            m.delta_runs(|run| d.push(run));
            chain.push(d);
            m.note_delta(k);
            assert_eq!(m.evict(0, 100, u64::MAX).chunks, 8);
            // Each chunk is in the base and k deltas.
            assert_eq!(m.crowded(), usize::from(k) + 2 >= PIECES_MAX, "{k} deltas");
        }
    }

    /// A changed chunk spread over as many pieces as the map tracks goes
    /// whole into the next delta, and is then in that piece alone.
    #[test]
    fn untracked_chunks_are_rewritten_whole_then_page_out() {
        let mut m = SectorMap::new();
        let mut chain: Chain = Vec::new();
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
        // Chunks 0..6 are in piece 0 (chunk 0 changed since: the set at 3
        // goes with it as its overlay); the clock looks only below chunk 4.
        let out = m.evict(0, 100, 4);
        assert_eq!(out.chunks, 4, "chunks 0 to 3");
        assert_eq!(m.paged_count(), 4);
        assert_eq!(m.paged[&0].overlay.as_ref().map(|o| o.len()), Some(1));
        assert!(m.chunks.contains_key(&4) && m.chunks.contains_key(&5));
        assert_eq!(runs(&m, 0, 10 * n), Err(Paged(0)));
        assert_eq!(runs(&m, 4 * n, 6 * n).unwrap().len(), 2);
    }
}
