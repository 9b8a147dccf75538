//! Paging a chunk in: a chunk read back from the checkpoint chain
//! ([`LoadedChunk`], built by `meta::pager` from the pieces that hold it)
//! put in place of its paged-out slot (`install`), its overlay laid over
//! it, then checked against the totals it was paged out with.
//!
//! A fault need not hold the map's write lock while it reads
//! (`meta::pager::with_map` reads under the read lock, then takes the
//! write lock to install): `fault` names what it reads back ([`Fault`]:
//! the chunk, its pieces, the map's chain epoch), and `install_fault`
//! installs what was read only if the chunk is still paged out in the same
//! pieces of the same chain; otherwise nothing (the lookup faults again).
//!
//! Invariants: a paged-out chunk holds what its pieces of the current
//! chain rebuild, with its overlay as it is now laid over them (the
//! overlay is read at install, never when the fault began). A chunk's
//! pieces, and the chain they index, change only when a checkpoint is
//! named (`note_base`, `note_delta`) or the map is untracked, each of which
//! moves `chain_epoch` on, or when its last sector is unmapped and it is
//! mapped again, in no piece. So a chunk read back at one epoch in pieces
//! P, and found paged out in P at the same epoch, is rebuilt by what was
//! read.

use super::chunk::{Chunk, RUNS_MAX};
use super::dense::DenseEntries;
use super::{SectorMap, Slot};
use crate::error::ChunkMismatch;
use squeeze_format::{MapEntry, MapRun, CHUNK_ENTRIES};
use std::sync::atomic::AtomicBool;

/// A chunk rebuilt from the checkpoint chain's runs (`meta::pager`), to be
/// installed in the map or read through.
pub struct LoadedChunk {
    base: u64,
    chunk: Chunk,
}

impl LoadedChunk {
    /// An empty chunk `c`. Built dense (a run applied is a few stores,
    /// where splicing a run list cost a fault an eighth of its time at
    /// 5 M YCSB records); `install` keeps the cheaper form.
    pub fn new(c: u64) -> LoadedChunk {
        LoadedChunk {
            base: c * CHUNK_ENTRIES as u64,
            chunk: Chunk::Dense {
                entries: DenseEntries::unmapped(),
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
        // Dense from `new`: `runs_max` plays no part until `install`.
        self.chunk
            .set_span((lo - self.base) as u16, (hi - lo) as u16, first, RUNS_MAX);
    }

    pub fn mapped(&self) -> u32 {
        self.chunk.mapped()
    }

    /// The runs a base of this chunk holds.
    pub fn runs(&self) -> u64 {
        self.chunk.runs()
    }

    pub fn for_each_run(&self, mut f: impl FnMut(MapRun)) {
        self.chunk.for_each_run(self.base, &mut f);
    }

    /// Sets chunk-relative sector `i` (an overlay's entry).
    pub(super) fn set(&mut self, i: u16, e: MapEntry) {
        self.chunk.set(i, e, RUNS_MAX);
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

/// What a fault reads back: chunk `c` in `pieces` of the chain the map
/// knew at `epoch` (`SectorMap::fault`, then `install_fault`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub c: u64,
    pub pieces: Vec<u16>,
    epoch: u64,
}

impl SectorMap {
    /// The pieces a paged-out chunk is in (None when `c` is not paged out).
    pub fn paged_pieces(&self, c: u64) -> Option<Vec<u16>> {
        self.paged.get(&c).map(|p| {
            p.pieces
                .list()
                .expect("only tracked chunks are paged")
                .to_vec()
        })
    }

    /// Chunk `c` as it is now, from `l`, its pieces read back: its
    /// overlay, if it has one, laid over them.
    pub fn with_overlay(&self, c: u64, mut l: LoadedChunk) -> LoadedChunk {
        if let Some(o) = self.paged.get(&c).and_then(|p| p.overlay.as_ref()) {
            for (i, e) in o.entries() {
                l.set(i, e);
            }
        }
        l
    }

    /// Puts a chunk read back from the chain (its pieces, in chain order)
    /// in place of its paged-out slot, with its overlay laid over it;
    /// refuses one that does not then match what was paged out (the chain
    /// does not hold what the map wrote there).
    pub fn install(&mut self, c: u64, l: LoadedChunk) -> Result<(), ChunkMismatch> {
        if !self.paged.contains_key(&c) {
            return Ok(()); // paged in meanwhile
        }
        let l = self.with_overlay(c, l);
        let p = self.paged.get(&c).expect("checked above");
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
        let mut l = l;
        // Dense past the map's `runs_max` runs: `from_dense` would build
        // and drop them.
        if runs <= self.runs_max as u64 {
            if let Chunk::Dense { entries, .. } = l.chunk {
                l.chunk = Chunk::from_dense(entries, self.runs_max);
            }
        }
        if let Some(o) = &p.overlay {
            self.overlay_bytes -= o.memory_bytes();
        }
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

    /// What reading chunk `c` back takes now (None when it is not paged
    /// out).
    pub fn fault(&self, c: u64) -> Option<Fault> {
        self.paged_pieces(c).map(|pieces| Fault {
            c,
            pieces,
            epoch: self.chain_epoch,
        })
    }

    /// True when what `f` read back still rebuilds its chunk: paged out in
    /// the same pieces of the same chain (or paged in meanwhile: nothing
    /// to do).
    pub fn fault_current(&self, f: &Fault) -> bool {
        match self.paged.get(&f.c) {
            None => true,
            Some(p) => {
                f.epoch == self.chain_epoch && p.pieces.list().is_some_and(|l| l == &f.pieces[..])
            }
        }
    }

    /// `install` of what fault `f` read back, when it is still current
    /// (`fault_current`); returns false, installing nothing, when not.
    pub fn install_fault(&mut self, f: &Fault, l: LoadedChunk) -> Result<bool, ChunkMismatch> {
        if !self.fault_current(f) {
            return Ok(false);
        }
        self.install(f.c, l).map(|()| true)
    }
}

#[cfg(test)]
mod tests {
    use super::super::paging::Paged;
    use super::super::split;
    use super::super::tests::{blob, checkpoint, fault_in, load, Chain};
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Faults that read their chunk back outside the write lock and install
    /// it later, with writes, evictions, other faults and checkpoints
    /// (named, or failed) in between, as two threads interleave them: the
    /// map installs only what is still current, and answers as a map that
    /// never pages. A write made while a fault read its chunk is never
    /// lost (the overlay is laid at install), and a chunk read from pieces
    /// a checkpoint then extended or replaced is never installed. With the
    /// default bound on runs, and with chunks dense from their first entry
    /// (`set_runs_max(0)`, squeeze-kv's volume) beside a map that keeps runs.
    #[test]
    fn faults_read_outside_the_lock_install_only_when_current() {
        faults_install_only_when_current(RUNS_MAX);
        faults_install_only_when_current(0);
    }

    fn faults_install_only_when_current(runs_max: usize) {
        let mut r = rand::rngs::StdRng::seed_from_u64(41);
        let span = 6 * CHUNK_ENTRIES as u64;
        let mut m = SectorMap::new();
        m.set_runs_max(runs_max);
        let mut never = SectorMap::new();
        let mut chain: Chain = Vec::new();
        let mut reading: Vec<(Fault, LoadedChunk)> = Vec::new();
        let (mut installed, mut stale, mut kept_writes) = (0u64, 0u64, 0u64);
        for round in 0..150u64 {
            for k in 0..r.gen_range(1..60u64) {
                // A fault begins reading a paged-out chunk back.
                if r.gen_range(0..3) == 0 {
                    let paged: Vec<u64> = m.paged.keys().copied().collect();
                    if !paged.is_empty() {
                        let c = paged[r.gen_range(0..paged.len())];
                        let f = m.fault(c).unwrap();
                        let l = load(&chain, c, &f.pieces);
                        reading.push((f, l));
                    }
                }
                // A write, often into a chunk a fault is reading.
                let lba = match reading.first() {
                    Some((f, _)) if r.gen_range(0..2) == 0 => {
                        f.c * CHUNK_ENTRIES as u64 + r.gen_range(0..CHUNK_ENTRIES as u64)
                    }
                    _ => r.gen_range(0..span),
                };
                let e = if r.gen_range(0..8) == 0 {
                    MapEntry::UNMAPPED
                } else {
                    blob((1 << 20) + (round * 100 + k) * 4160, 1, 0)
                };
                kept_writes += u64::from(reading.iter().any(|(f, _)| f.c == split(lba).0));
                loop {
                    match m.set(lba, e) {
                        Ok(old) => {
                            assert_eq!(old, never.set(lba, e).unwrap(), "round {round}");
                            break;
                        }
                        Err(Paged(c)) => fault_in(&mut m, &chain, c),
                    }
                }
                if r.gen_range(0..3) == 0 {
                    m.evict(0, 4, u64::MAX);
                }
                // A fault's read ends: installed under the write lock.
                if !reading.is_empty() && r.gen_range(0..4) == 0 {
                    let (f, l) = reading.swap_remove(r.gen_range(0..reading.len()));
                    let was_paged = m.paged.contains_key(&f.c);
                    let current = m.fault_current(&f);
                    assert_eq!(m.install_fault(&f, l).unwrap(), current);
                    match (was_paged, current) {
                        (true, true) => installed += 1,
                        (_, false) => stale += 1,
                        _ => {}
                    }
                }
            }
            m.evict(0, 2 * m.chunk_count(), u64::MAX);
            // A checkpoint, named or failed, while faults may be reading.
            m.freeze(r.gen_range(0..2) == 0);
            never.freeze(false);
            let failed = r.gen_range(0..10) == 0;
            checkpoint(&mut m, &mut never, &mut chain, round % 5 == 0, failed);
            // Every answer as the map that never pages (faults that read
            // before the checkpoint still in flight).
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
            if runs_max == 0 {
                assert!(m
                    .chunks
                    .values()
                    .all(|s| matches!(s.chunk, Chunk::Dense { .. })));
            }
            if r.gen_range(0..2) == 0 {
                m.evict(0, 2 * m.chunk_count(), u64::MAX);
            }
        }
        assert!(
            installed > 50 && stale > 50 && kept_writes > 1000,
            "{installed} installed, {stale} stale, {kept_writes} writes while reading"
        );
    }
}
