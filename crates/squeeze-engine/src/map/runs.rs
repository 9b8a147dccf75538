//! The map as a checkpoint's runs: a base written out of it
//! (`for_each_run`, reading paged chunks back through the caller;
//! `base_runs` counts it without), a delta of the frozen changes
//! (`delta_runs`), and bases, deltas and format 1 chunks read into it at
//! open (`load_run`, `apply_run`, `load_chunk`), none of them recorded as
//! changes.

use super::chunk::{follows, group_runs, join, Chunk, Run};
use super::dense::DenseEntries;
use super::dirty_bits::is_marked;
use super::page_in::LoadedChunk;
use super::pieces::Pieces;
use super::{split, SectorMap, Slot};
use squeeze_format::{MapEntry, MapRun, CHUNK_ENTRIES};
use std::sync::atomic::AtomicBool;

impl SectorMap {
    /// Runs a base of the map holds: what [`SectorMap::for_each_run`]
    /// emits, counted without reading paged chunks back.
    pub fn base_runs(&self) -> u64 {
        // As `for_each_run`: joins across the edges of resident chunks.
        let mut n = 0u64;
        let mut pending: Option<MapRun> = None;
        let mut paged = self.paged.iter().peekable();
        for (&k, s) in &self.chunks {
            while let Some((_, p)) = paged.next_if(|(&pk, _)| pk < k) {
                n += u64::from(pending.take().is_some()) + u64::from(p.runs);
            }
            s.chunk.for_each_run(k * CHUNK_ENTRIES as u64, &mut |r| {
                n += u64::from(join(&mut pending, r).is_some());
            });
        }
        n += u64::from(pending.is_some());
        n + paged.map(|(_, p)| u64::from(p.runs)).sum::<u64>()
    }

    /// Calls `f` with every mapped run, in LBA order (a checkpoint base).
    /// Runs that continue across a chunk edge are joined, except at the
    /// edges of a paged chunk, which `load` reads back (given the chunk and
    /// the pieces that hold it).
    pub fn for_each_run<E>(
        &self,
        mut load: impl FnMut(u64, &[u16]) -> Result<LoadedChunk, E>,
        mut f: impl FnMut(MapRun),
    ) -> Result<(), E> {
        let mut pending: Option<MapRun> = None;
        let mut paged = self.paged.iter().peekable();
        for (&k, s) in &self.chunks {
            while let Some((&c, p)) = paged.next_if(|(&pk, _)| pk < k) {
                if let Some(r) = pending.take() {
                    f(r);
                }
                let pieces = p.pieces.list().expect("only tracked chunks are paged");
                self.with_overlay(c, load(c, pieces)?).for_each_run(&mut f);
            }
            s.chunk.for_each_run(k * CHUNK_ENTRIES as u64, &mut |r| {
                if let Some(done) = join(&mut pending, r) {
                    f(done);
                }
            });
        }
        if let Some(r) = pending.take() {
            f(r);
        }
        for (&c, p) in paged {
            let pieces = p.pieces.list().expect("only tracked chunks are paged");
            self.with_overlay(c, load(c, pieces)?).for_each_run(&mut f);
        }
        Ok(())
    }

    /// Calls `f` with the runs, mapped and unmapped, that cover the sectors
    /// of the frozen changes, in LBA order (a checkpoint delta); a paged-out
    /// chunk's come from its overlay.
    pub fn delta_runs(&self, mut f: impl FnMut(MapRun)) {
        let mut entries = [MapEntry::UNMAPPED; CHUNK_ENTRIES];
        for (&c, bits) in &self.frozen {
            let base = c * CHUNK_ENTRIES as u64;
            let ch = self.chunks.get(&c).map(|s| &s.chunk);
            let overlay = self.paged.get(&c).map(|p| {
                p.overlay
                    .as_deref()
                    .expect("a changed chunk paged out has an overlay")
            });
            let mut i = 0;
            while i < CHUNK_ENTRIES {
                if !is_marked(bits, i) {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < CHUNK_ENTRIES && is_marked(bits, i) {
                    i += 1;
                }
                let span = &mut entries[start..i];
                match (ch, overlay) {
                    (Some(ch), _) => ch.get_range(start as u16, span),
                    (None, Some(o)) => {
                        for (j, e) in span.iter_mut().enumerate() {
                            *e = o
                                .get((start + j) as u16)
                                .expect("an overlay holds every changed sector");
                        }
                    }
                    (None, None) => span.fill(MapEntry::UNMAPPED),
                }
                group_runs(base + start as u64, span, true, &mut f);
            }
        }
    }

    /// Adds a run read from a checkpoint base, piece 0 of its chain
    /// (loading: not recorded as a change); runs come in LBA order into a
    /// map that holds nothing at or after them.
    pub fn load_run(&mut self, r: MapRun) {
        let mut lba = r.lba;
        while lba < r.end() {
            let (c, i) = split(lba);
            let n = (CHUNK_ENTRIES as u64 - u64::from(i)).min(r.end() - lba) as u16;
            let first = r.entry((lba - r.lba) as u32);
            let slot = self
                .chunks
                .entry(c)
                .or_insert_with(|| Slot::empty(Pieces::only(0), false));
            let ch = &mut slot.chunk;
            let (before, before_b) = (ch.weight(), ch.memory_bytes() as u64);
            let mut too_many_runs = false;
            match ch {
                Chunk::Runs { runs, mapped } => {
                    match runs.last_mut() {
                        Some(p) if p.end() == i && follows(p.entry(p.end() - 1), first) => {
                            p.len += n;
                        }
                        Some(p) if p.end() > i => panic!("load_run out of order"),
                        _ => runs.push(Run {
                            start: i,
                            len: n,
                            first,
                        }),
                    }
                    *mapped += u32::from(n);
                    too_many_runs = runs.len() > self.runs_max;
                }
                Chunk::Dense { entries, mapped } => {
                    for k in 0..n {
                        let old = entries.set(i + k, first.advance(u32::from(k)));
                        debug_assert!(!old.is_mapped());
                    }
                    *mapped += u32::from(n);
                }
            }
            if too_many_runs {
                ch.make_dense();
            }
            self.weight = self.weight + ch.weight() - before;
            self.chunk_bytes = self.chunk_bytes + ch.memory_bytes() as u64 - before_b;
            self.mapped += u64::from(n);
            lba += u64::from(n);
        }
    }

    /// Sets the sectors of a run read from checkpoint piece `piece`, a
    /// delta (loading: not recorded as a change).
    pub fn apply_run(&mut self, r: MapRun, piece: Option<u16>) {
        self.chain_epoch += 1;
        let mut lba = r.lba;
        while lba < r.end() {
            let (c, i) = split(lba);
            let n = (CHUNK_ENTRIES as u64 - u64::from(i)).min(r.end() - lba) as u16;
            let first = r.entry((lba - r.lba) as u32);
            assert!(!self.paged.contains_key(&c), "loading into a paged map");
            if !self.chunks.contains_key(&c) && first.is_mapped() {
                self.chunks.insert(c, Slot::empty(Pieces::none(), false));
            }
            if let Some(slot) = self.chunks.get_mut(&c) {
                let ch = &mut slot.chunk;
                let (w, m, b) = (ch.weight(), ch.mapped(), ch.memory_bytes() as u64);
                ch.set_span(i, n, first, self.runs_max);
                self.weight = self.weight + ch.weight() - w;
                self.mapped = self.mapped + u64::from(ch.mapped()) - u64::from(m);
                self.chunk_bytes = self.chunk_bytes + ch.memory_bytes() as u64 - b;
                match piece {
                    Some(k) => slot.pieces.add(k),
                    None => slot.pieces = Pieces::untracked(),
                }
                if ch.mapped() == 0 {
                    self.drop_slot(c);
                }
            }
            lba += u64::from(n);
        }
    }

    /// The delta piece `k` being loaded covers chunk `c` whole (its runs,
    /// mapped and unmapped, span all of it): the chunk is in that piece
    /// alone, as `note_delta` records it when such a delta is written.
    pub fn loaded_whole(&mut self, c: u64, k: u16) {
        self.chain_epoch += 1;
        if let Some(s) = self.chunks.get_mut(&c) {
            s.pieces = Pieces::only(k);
        }
    }

    /// Installs a whole chunk read from a format 1 checkpoint.
    pub fn load_chunk(&mut self, index: u64, entries: Box<[MapEntry; CHUNK_ENTRIES]>) {
        let ch = Chunk::from_dense(DenseEntries::from_array(entries), self.runs_max);
        if ch.mapped() == 0 {
            return;
        }
        self.mapped += u64::from(ch.mapped());
        self.weight += ch.weight();
        self.chunk_bytes += ch.memory_bytes() as u64;
        let slot = Slot {
            chunk: ch,
            pieces: Pieces::untracked(),
            referenced: AtomicBool::new(false),
        };
        if let Some(old) = self.chunks.insert(index, slot) {
            self.mapped -= u64::from(old.chunk.mapped());
            self.weight -= old.chunk.weight();
            self.chunk_bytes -= old.chunk.memory_bytes() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{blob, no_load};
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A base and then deltas of what changed, applied in order, rebuild the
    /// map exactly, whatever happened in between; `weight` bounds the runs.
    #[test]
    fn a_base_plus_deltas_rebuild_the_map() {
        let mut r = rand::rngs::StdRng::seed_from_u64(11);
        let span = 5 * CHUNK_ENTRIES as u64;
        let mut m = SectorMap::new();
        let mut copy = SectorMap::new();
        for round in 0..60u64 {
            for k in 0..r.gen_range(1..200u64) {
                let start = r.gen_range(0..span);
                let n = r.gen_range(1..=32u64).min(span - start);
                let trim = r.gen_range(0..5) == 0;
                for i in 0..n {
                    let e = if trim {
                        MapEntry::UNMAPPED
                    } else {
                        blob((1 << 20) + (round * 1000 + k) * 65600, n as u32, i as u32)
                    };
                    m.set(start + i, e).unwrap();
                }
            }
            if r.gen_range(0..4) == 0 {
                // A whole chunk trimmed.
                let c = r.gen_range(0..5u64) * CHUNK_ENTRIES as u64;
                for l in c..c + CHUNK_ENTRIES as u64 {
                    m.set(l, MapEntry::UNMAPPED).unwrap();
                }
            }
            m.freeze(true);
            if round % 10 == 0 {
                copy = SectorMap::new();
                m.for_each_run(no_load, |run| copy.load_run(run)).unwrap();
                m.note_base();
            } else {
                let mut runs = Vec::new();
                m.delta_runs(|run| runs.push(run));
                m.note_delta(round as u16);
                for w in runs.windows(2) {
                    assert!(w[0].end() <= w[1].lba, "delta runs out of order");
                }
                for run in runs {
                    copy.apply_run(run, Some(round as u16));
                }
            }
            assert_eq!(
                copy.iter_mapped().collect::<Vec<_>>(),
                m.iter_mapped().collect::<Vec<_>>(),
                "round {round}"
            );
            assert_eq!(copy.mapped(), m.mapped());
            let mut runs = 0;
            m.for_each_run(no_load, |_| runs += 1).unwrap();
            assert!(m.weight() >= runs, "weight {} < {runs} runs", m.weight());
        }
    }

    /// Applying a run splices the run list exactly as setting each of its
    /// sectors would.
    #[test]
    fn apply_run_matches_setting_each_sector() {
        let mut r = rand::rngs::StdRng::seed_from_u64(5);
        let span = 3 * CHUNK_ENTRIES as u64;
        let mut fast = SectorMap::new();
        let mut slow = SectorMap::new();
        for k in 0..20_000u64 {
            let lba = r.gen_range(0..span);
            let n = r.gen_range(1..=40u64).min(span - lba) as u32;
            let first = match r.gen_range(0..5) {
                0 => MapEntry::UNMAPPED,
                // 32-sector extents, entered anywhere that leaves room.
                _ => blob((1 << 20) + k * 131_200, 32, r.gen_range(0..=32 - n.min(32))),
            };
            let n = if first.is_mapped() {
                n.min(32 - first.index())
            } else {
                n
            };
            let run = MapRun {
                lba,
                sectors: n,
                first,
            };
            fast.apply_run(run, None);
            for i in 0..n {
                slow.set(lba + u64::from(i), run.entry(i)).unwrap();
            }
            if k % 1000 == 0 {
                assert_eq!(
                    fast.iter_mapped().collect::<Vec<_>>(),
                    slow.iter_mapped().collect::<Vec<_>>(),
                    "after {k} runs"
                );
                assert_eq!(fast.mapped(), slow.mapped());
                assert_eq!(fast.chunk_count(), slow.chunk_count());
                let mut runs = 0;
                fast.for_each_run(no_load, |_| runs += 1).unwrap();
                assert!(fast.weight() >= runs);
            }
        }
    }
}
