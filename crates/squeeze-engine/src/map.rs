//! The sector map: logical sector -> packed [`MapEntry`] (8 bytes).
//!
//! Never-written space costs nothing: entries live in chunks of
//! [`CHUNK_ENTRIES`] sectors (2 MiB of logical space), allocated on the first
//! mapping inside them and dropped when their last mapping goes. A chunk is
//! kept in one of two forms:
//! - **runs**: a sorted list of (first sector, length, entry of the first
//!   sector), where the sectors of a run are consecutive sectors of one
//!   record. Data written in blobs needs one run per blob: a 64 KiB blob
//!   costs 16 bytes for its 16 sectors, 1 byte per sector.
//! - **dense**: 512 entries, 8 bytes per sector, once runs would cost more
//!   (after scattered 4 KiB overwrites).
//!
//! The map also remembers which sectors changed since the last checkpoint
//! (one bit per sector, per chunk touched), so that a checkpoint can write
//! only those (`delta_runs`) instead of the whole map (`for_each_run`).
//!
//! Invariants: `mapped` = number of mapped sectors over all chunks; `weight`
//! = the sum of the chunks' weights (runs, or mapped sectors of a dense
//! chunk: at least the runs a checkpoint of the chunk holds); every chunk in
//! the tree maps at least one sector; runs are sorted, disjoint, non-empty,
//! and two adjacent runs are never mergeable.

use crate::error::ChunkMismatch;
use squeeze_format::{MapEntry, MapRun, CHUNK_ENTRIES};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// One bit per sector of a chunk.
pub type DirtyBits = [u64; CHUNK_ENTRIES / 64];
/// Sectors changed since the last checkpoint, by chunk.
pub type Dirty = BTreeMap<u64, DirtyBits>;

/// A run of sectors `start..start+len` (chunk-relative) mapped to
/// consecutive indices of one record, beginning with `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    start: u16,
    len: u16,
    first: MapEntry,
}

impl Run {
    fn end(&self) -> u16 {
        self.start + self.len
    }
    fn entry(&self, i: u16) -> MapEntry {
        debug_assert!(i >= self.start && i < self.end());
        self.first
            .with_index(self.first.index() + u32::from(i - self.start))
    }
}

/// True when `next` is the entry that follows `prev` inside one record.
fn follows(prev: MapEntry, next: MapEntry) -> bool {
    next.record_offset() == prev.record_offset()
        && next.sectors() == prev.sectors()
        && next.record_len() == prev.record_len()
        && next.index() == prev.index() + 1
}

/// More runs than this and a chunk turns dense (runs cost 16 bytes each
/// with the vector's slack; dense costs 4096).
const RUNS_MAX: usize = 160;

enum Chunk {
    Runs {
        runs: Vec<Run>,
        mapped: u32,
    },
    Dense {
        entries: Box<[MapEntry; CHUNK_ENTRIES]>,
        mapped: u32,
    },
}

impl Chunk {
    fn mapped(&self) -> u32 {
        match self {
            Chunk::Runs { mapped, .. } | Chunk::Dense { mapped, .. } => *mapped,
        }
    }

    /// At least the runs a checkpoint of this chunk holds.
    fn weight(&self) -> u64 {
        match self {
            Chunk::Runs { runs, .. } => runs.len() as u64,
            Chunk::Dense { mapped, .. } => u64::from(*mapped),
        }
    }

    /// Calls `f` with each run of the chunk whose base sector is `base`.
    fn for_each_run(&self, base: u64, f: &mut impl FnMut(MapRun)) {
        match self {
            Chunk::Runs { runs, .. } => {
                for r in runs {
                    f(MapRun {
                        lba: base + u64::from(r.start),
                        sectors: u32::from(r.len),
                        first: r.first,
                    });
                }
            }
            Chunk::Dense { entries, .. } => group_runs(base, &entries[..], false, f),
        }
    }

    fn get(&self, i: u16) -> MapEntry {
        match self {
            Chunk::Dense { entries, .. } => entries[i as usize],
            Chunk::Runs { runs, .. } => {
                let k = runs.partition_point(|r| r.end() <= i);
                match runs.get(k) {
                    Some(r) if r.start <= i => r.entry(i),
                    _ => MapEntry::UNMAPPED,
                }
            }
        }
    }

    /// Entries `i..i + out.len()` (one run search, then a walk).
    fn get_range(&self, i: u16, out: &mut [MapEntry]) {
        match self {
            Chunk::Dense { entries, .. } => {
                out.copy_from_slice(&entries[i as usize..i as usize + out.len()]);
            }
            Chunk::Runs { runs, .. } => {
                let mut k = runs.partition_point(|r| r.end() <= i);
                for (j, o) in out.iter_mut().enumerate() {
                    let at = i + j as u16;
                    while k < runs.len() && runs[k].end() <= at {
                        k += 1;
                    }
                    *o = match runs.get(k) {
                        Some(r) if r.start <= at => r.entry(at),
                        _ => MapEntry::UNMAPPED,
                    };
                }
            }
        }
    }

    fn to_dense(&self) -> Box<[MapEntry; CHUNK_ENTRIES]> {
        match self {
            Chunk::Dense { entries, .. } => entries.clone(),
            Chunk::Runs { runs, .. } => {
                let mut d = Box::new([MapEntry::UNMAPPED; CHUNK_ENTRIES]);
                for r in runs {
                    for i in r.start..r.end() {
                        d[i as usize] = r.entry(i);
                    }
                }
                d
            }
        }
    }

    /// Sets entry `i`, returning the old one.
    fn set(&mut self, i: u16, e: MapEntry) -> MapEntry {
        match self {
            Chunk::Dense { entries, mapped } => {
                let old = std::mem::replace(&mut entries[i as usize], e);
                *mapped = *mapped + u32::from(e.is_mapped()) - u32::from(old.is_mapped());
                old
            }
            Chunk::Runs { runs, mapped } => {
                let old = set_in_runs(runs, i, e);
                *mapped = *mapped + u32::from(e.is_mapped()) - u32::from(old.is_mapped());
                if runs.len() > RUNS_MAX {
                    let entries = self.to_dense();
                    let m = self.mapped();
                    *self = Chunk::Dense { entries, mapped: m };
                }
                old
            }
        }
    }

    /// Sets sectors `i..i + n` to consecutive entries from `first` (all
    /// unmapped when it is): one splice of the run list instead of `n`
    /// single sets (loading a checkpoint delta).
    fn set_span(&mut self, i: u16, n: u16, first: MapEntry) {
        let end = i + n;
        match self {
            Chunk::Dense { entries, mapped } => {
                for k in 0..n {
                    let e = if first.is_mapped() {
                        first.with_index(first.index() + u32::from(k))
                    } else {
                        MapEntry::UNMAPPED
                    };
                    let old = std::mem::replace(&mut entries[usize::from(i + k)], e);
                    *mapped = *mapped + u32::from(e.is_mapped()) - u32::from(old.is_mapped());
                }
            }
            Chunk::Runs { runs, mapped } => {
                let k0 = runs.partition_point(|r| r.end() <= i);
                let k1 = runs.partition_point(|r| r.start < end);
                let mut removed = 0u32;
                let mut with: Vec<Run> = Vec::with_capacity(3);
                for r in &runs[k0..k1.max(k0)] {
                    removed += u32::from(r.end().min(end) - r.start.max(i));
                }
                if let Some(r) = runs.get(k0).filter(|r| k0 < k1 && r.start < i) {
                    with.push(Run {
                        start: r.start,
                        len: i - r.start,
                        first: r.first,
                    });
                }
                if first.is_mapped() {
                    with.push(Run {
                        start: i,
                        len: n,
                        first,
                    });
                }
                if k1 > k0 {
                    let r = runs[k1 - 1];
                    if r.end() > end {
                        with.push(Run {
                            start: end,
                            len: r.end() - end,
                            first: r.entry(end),
                        });
                    }
                }
                let added = with.len();
                runs.splice(k0..k1.max(k0), with);
                // Join what the splice made adjacent and joinable.
                let lo = k0.saturating_sub(1);
                let mut k = (k0 + added).min(runs.len().saturating_sub(1));
                while k > lo {
                    let (p, q) = (runs[k - 1], runs[k]);
                    if p.end() == q.start && follows(p.entry(p.end() - 1), q.first) {
                        runs[k - 1].len += q.len;
                        runs.remove(k);
                    }
                    k -= 1;
                }
                *mapped = *mapped - removed + if first.is_mapped() { u32::from(n) } else { 0 };
                if runs.len() > RUNS_MAX {
                    let entries = self.to_dense();
                    let m = self.mapped();
                    *self = Chunk::Dense { entries, mapped: m };
                }
            }
        }
    }

    fn memory_bytes(&self) -> usize {
        match self {
            Chunk::Dense { .. } => CHUNK_ENTRIES * 8,
            Chunk::Runs { runs, .. } => runs.capacity() * std::mem::size_of::<Run>(),
        }
    }

    /// Builds the cheaper form from dense entries.
    fn from_dense(entries: Box<[MapEntry; CHUNK_ENTRIES]>) -> Chunk {
        let mapped = entries.iter().filter(|e| e.is_mapped()).count() as u32;
        let mut runs: Vec<Run> = Vec::new();
        for (i, &e) in entries.iter().enumerate() {
            if !e.is_mapped() {
                continue;
            }
            match runs.last_mut() {
                Some(r) if r.end() as usize == i && follows(r.entry(r.end() - 1), e) => r.len += 1,
                _ => runs.push(Run {
                    start: i as u16,
                    len: 1,
                    first: e,
                }),
            }
            if runs.len() > RUNS_MAX {
                return Chunk::Dense { entries, mapped };
            }
        }
        runs.shrink_to_fit();
        Chunk::Runs { runs, mapped }
    }
}

/// Sets sector `i` in a run list, splitting and merging runs; returns the
/// previous entry.
fn set_in_runs(runs: &mut Vec<Run>, i: u16, e: MapEntry) -> MapEntry {
    let k = runs.partition_point(|r| r.end() <= i);
    let mut old = MapEntry::UNMAPPED;
    let mut at = k; // where a new run for `i` goes
    if let Some(&r) = runs.get(k) {
        if r.start <= i {
            old = r.entry(i);
            if old == e {
                return old;
            }
            // Cut `i` out of r: left part, right part.
            let left = Run {
                start: r.start,
                len: i - r.start,
                first: r.first,
            };
            let right = Run {
                start: i + 1,
                len: r.end() - i - 1,
                first: if i + 1 < r.end() {
                    r.entry(i + 1)
                } else {
                    r.first
                },
            };
            runs.remove(k);
            let mut ins = k;
            if left.len > 0 {
                runs.insert(ins, left);
                ins += 1;
            }
            if right.len > 0 {
                runs.insert(ins, right);
            }
            at = if left.len > 0 { k + 1 } else { k };
        }
    }
    if !e.is_mapped() {
        return old;
    }
    // Merge with the run ending at i, or the one starting at i+1, or insert.
    let merge_prev = at > 0 && {
        let p = runs[at - 1];
        p.end() == i && follows(p.entry(p.end() - 1), e)
    };
    let merge_next = at < runs.len() && {
        let n = runs[at];
        n.start == i + 1 && follows(e, n.first)
    };
    match (merge_prev, merge_next) {
        (true, true) => {
            let n = runs.remove(at);
            runs[at - 1].len += 1 + n.len;
        }
        (true, false) => runs[at - 1].len += 1,
        (false, true) => {
            let n = &mut runs[at];
            n.start = i;
            n.len += 1;
            n.first = e;
        }
        (false, false) => runs.insert(
            at,
            Run {
                start: i,
                len: 1,
                first: e,
            },
        ),
    }
    old
}

/// Calls `f` with the maximal runs of `entries` (sectors from `base`):
/// mapped runs of one extent, and, with `unmapped`, runs of unmapped
/// sectors too.
fn group_runs(base: u64, entries: &[MapEntry], unmapped: bool, f: &mut impl FnMut(MapRun)) {
    let mut cur: Option<MapRun> = None;
    for (i, &e) in entries.iter().enumerate() {
        if let Some(r) = &mut cur {
            let last = r.entry(r.sectors - 1);
            let extends = if e.is_mapped() {
                last.is_mapped() && follows(last, e)
            } else {
                !last.is_mapped()
            };
            if extends {
                r.sectors += 1;
                continue;
            }
            f(*r);
            cur = None;
        }
        if e.is_mapped() || unmapped {
            cur = Some(MapRun {
                lba: base + i as u64,
                sectors: 1,
                first: e,
            });
        }
    }
    if let Some(r) = cur {
        f(r);
    }
}

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
struct Pieces {
    n: u8,
    at: [u16; PIECES_MAX],
}

impl Pieces {
    const UNTRACKED: u8 = u8::MAX;

    /// In no piece yet (a chunk mapped since the last checkpoint: dirty).
    fn none() -> Pieces {
        Pieces {
            n: 0,
            at: [0; PIECES_MAX],
        }
    }

    fn untracked() -> Pieces {
        Pieces {
            n: Self::UNTRACKED,
            at: [0; PIECES_MAX],
        }
    }

    /// Only in the piece `k` (a base, or a delta that covered all of it).
    fn only(k: u16) -> Pieces {
        let mut p = Pieces::none();
        p.add(k);
        p
    }

    fn add(&mut self, k: u16) {
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
    fn list(&self) -> Option<&[u16]> {
        (self.n != Self::UNTRACKED).then(|| &self.at[..usize::from(self.n)])
    }
}

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

/// A chunk paged out: what the map's totals and the next base need
/// without reading it back.
#[derive(Clone, Copy, Debug)]
struct PagedChunk {
    mapped: u16,
    /// Runs its base holds (`Chunk::for_each_run`), and its weight.
    runs: u16,
    pieces: Pieces,
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

#[derive(Default)]
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
    /// The eviction clock's hand: the chunk it looks at next.
    hand: u64,
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
        let old = ch.set(i, entry);
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

    /// Sets the sectors of a run read from checkpoint piece `piece`, a
    /// delta (loading: not recorded as a change).
    pub fn apply_run(&mut self, r: MapRun, piece: Option<u16>) {
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
                ch.set_span(i, n, first);
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
        if let Some(s) = self.chunks.get_mut(&c) {
            s.pieces = Pieces::only(k);
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
                    too_many_runs = runs.len() > RUNS_MAX;
                }
                Chunk::Dense { entries, mapped } => {
                    for k in 0..n {
                        debug_assert!(!entries[usize::from(i + k)].is_mapped());
                        entries[usize::from(i + k)] =
                            first.with_index(first.index() + u32::from(k));
                    }
                    *mapped += u32::from(n);
                }
            }
            if too_many_runs {
                let entries = ch.to_dense();
                let m = ch.mapped();
                *ch = Chunk::Dense { entries, mapped: m };
            }
            self.weight = self.weight + ch.weight() - before;
            self.chunk_bytes = self.chunk_bytes + ch.memory_bytes() as u64 - before_b;
            self.mapped += u64::from(n);
            lba += u64::from(n);
        }
    }

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
                load(c, pieces)?.for_each_run(&mut f);
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
            load(c, pieces)?.for_each_run(&mut f);
        }
        Ok(())
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
        self.frozen.clear();
        for s in self.chunks.values_mut() {
            s.pieces = Pieces::only(0);
        }
        for p in self.paged.values_mut() {
            p.pieces = Pieces::only(0);
        }
    }

    /// The checkpoint that took the changes wrote them as piece `k` of the
    /// chain: a chunk it covers whole is in that piece alone.
    pub fn note_delta(&mut self, k: u16) {
        for (c, bits) in std::mem::take(&mut self.frozen) {
            if let Some(s) = self.chunks.get_mut(&c) {
                if bits.iter().all(|&w| w == u64::MAX) {
                    s.pieces = Pieces::only(k);
                } else {
                    s.pieces.add(k);
                }
            }
        }
    }

    /// The map no longer matches any chain (a checkpoint loaded from format
    /// 1): nothing is paged out until a base.
    pub fn untrack_all(&mut self) {
        debug_assert!(self.paged.is_empty());
        for s in self.chunks.values_mut() {
            s.pieces = Pieces::untracked();
        }
    }

    /// Calls `f` with the runs, mapped and unmapped, that cover the sectors
    /// of the frozen changes, in LBA order (a checkpoint delta).
    pub fn delta_runs(&self, mut f: impl FnMut(MapRun)) {
        let mut entries = [MapEntry::UNMAPPED; CHUNK_ENTRIES];
        for (&c, bits) in &self.frozen {
            let base = c * CHUNK_ENTRIES as u64;
            debug_assert!(!self.paged.contains_key(&c), "a changed chunk is paged");
            let ch = self.chunks.get(&c).map(|s| &s.chunk);
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
                match ch {
                    Some(ch) => ch.get_range(start as u16, span),
                    None => span.fill(MapEntry::UNMAPPED),
                }
                group_runs(base + start as u64, span, true, &mut f);
            }
        }
    }

    /// Sectors marked changed (for stats and tests).
    pub fn dirty_sectors(&self) -> u64 {
        self.dirty
            .values()
            .map(|b| b.iter().map(|w| u64::from(w.count_ones())).sum::<u64>())
            .sum()
    }

    /// At least the runs a checkpoint base of the map holds.
    pub fn weight(&self) -> u64 {
        self.weight
    }

    /// Number of mapped sectors.
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    /// Bytes of RAM the map uses: resident chunks, paged-out chunks' slots,
    /// and the record of what changed since the last checkpoint.
    pub fn memory_bytes(&self) -> u64 {
        let dirty = (self.dirty.len() + self.frozen.len())
            * (std::mem::size_of::<DirtyBits>() + TREE_SLOT_BYTES);
        self.chunk_bytes
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

    /// Installs a whole chunk read from a format 1 checkpoint.
    pub fn load_chunk(&mut self, index: u64, entries: Box<[MapEntry; CHUNK_ENTRIES]>) {
        let ch = Chunk::from_dense(entries);
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

    /// Mapped entries with their LBA, in LBA order (resident chunks).
    #[cfg(test)]
    pub fn iter_mapped(&self) -> impl Iterator<Item = (u64, MapEntry)> + '_ {
        assert!(self.paged.is_empty(), "iter_mapped over a paged map");
        self.chunks.iter().flat_map(|(k, s)| {
            let base = k * CHUNK_ENTRIES as u64;
            let v: Vec<(u64, MapEntry)> = match &s.chunk {
                Chunk::Dense { entries, .. } => entries
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
                Chunk::Dense { entries, .. } => entries[start as usize..]
                    .iter()
                    .position(|e| e.is_mapped())
                    .map(|p| start + p as u16),
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
}

/// Joins `r` to the pending run when it continues it; otherwise returns
/// the pending run, done, and `r` becomes pending.
fn join(pending: &mut Option<MapRun>, r: MapRun) -> Option<MapRun> {
    if let Some(p) = pending {
        if p.end() == r.lba && follows(p.entry(p.sectors - 1), r.first) {
            p.sectors += r.sectors;
            return None;
        }
    }
    pending.replace(r)
}

fn mark(dirty: &mut Dirty, c: u64, i: u16) {
    dirty.entry(c).or_insert([0; CHUNK_ENTRIES / 64])[usize::from(i / 64)] |= 1 << (i % 64);
}

fn is_marked(bits: &DirtyBits, i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

fn split(lba: u64) -> (u64, u16) {
    (
        lba / CHUNK_ENTRIES as u64,
        (lba % CHUNK_ENTRIES as u64) as u16,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn no_load(c: u64, _: &[u16]) -> Result<LoadedChunk, ()> {
        panic!("chunk {c} is paged out")
    }

    fn blob(offset: u64, sectors: u32, i: u32) -> MapEntry {
        MapEntry::new(offset, i, sectors, 4096 * u64::from(sectors) + 64)
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

    #[test]
    fn matches_a_dense_model() {
        let mut r = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..20 {
            let mut m = SectorMap::new();
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
                    m.for_each_run(no_load, |r| m2.load_run(r)).unwrap();
                    assert_eq!(m2.iter_mapped().collect::<Vec<_>>(), it);
                    assert_eq!(m2.mapped(), m.mapped());
                }
            }
        }
    }

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
