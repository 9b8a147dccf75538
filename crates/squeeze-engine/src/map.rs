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

use squeeze_format::{MapEntry, MapRun, CHUNK_ENTRIES};
use std::collections::BTreeMap;

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

#[derive(Default)]
pub struct SectorMap {
    chunks: BTreeMap<u64, Chunk>,
    mapped: u64,
    weight: u64,
    dirty: Dirty,
}

/// Approximate heap cost of one BTreeMap slot (key, value, node slack).
const TREE_SLOT_BYTES: usize = 48;

impl SectorMap {
    pub fn new() -> SectorMap {
        SectorMap::default()
    }

    pub fn get(&self, lba: u64) -> MapEntry {
        let (c, i) = split(lba);
        self.chunks
            .get(&c)
            .map_or(MapEntry::UNMAPPED, |ch| ch.get(i))
    }

    /// Fills `out` with the entries of `lba..lba + out.len()`: one tree
    /// lookup and one run search per chunk instead of one per sector (a
    /// 1 MiB read spent a quarter of its time in per-sector lookups).
    pub fn get_range(&self, lba: u64, out: &mut [MapEntry]) {
        let mut done = 0;
        while done < out.len() {
            let (c, i) = split(lba + done as u64);
            let n = (CHUNK_ENTRIES - i as usize).min(out.len() - done);
            let dst = &mut out[done..done + n];
            match self.chunks.get(&c) {
                None => dst.fill(MapEntry::UNMAPPED),
                Some(ch) => ch.get_range(i, dst),
            }
            done += n;
        }
    }

    /// Sets an entry, returning the previous one.
    pub fn set(&mut self, lba: u64, entry: MapEntry) -> MapEntry {
        let (c, i) = split(lba);
        if !entry.is_mapped() {
            let Some(ch) = self.chunks.get_mut(&c) else {
                return MapEntry::UNMAPPED;
            };
            let before = ch.weight();
            let old = ch.set(i, entry);
            if old.is_mapped() {
                self.mapped -= 1;
                self.weight = self.weight + ch.weight() - before;
                if ch.mapped() == 0 {
                    self.weight -= ch.weight();
                    self.chunks.remove(&c);
                }
                mark(&mut self.dirty, c, i);
            }
            return old;
        }
        let ch = self.chunks.entry(c).or_insert_with(|| Chunk::Runs {
            runs: Vec::new(),
            mapped: 0,
        });
        let before = ch.weight();
        let old = ch.set(i, entry);
        self.weight = self.weight + ch.weight() - before;
        if old != entry {
            mark(&mut self.dirty, c, i);
        }
        if !old.is_mapped() {
            self.mapped += 1;
        }
        old
    }

    /// Sets the sectors of a run read from a checkpoint delta (loading: not
    /// recorded as a change).
    pub fn apply_run(&mut self, r: MapRun) {
        let mut lba = r.lba;
        while lba < r.end() {
            let (c, i) = split(lba);
            let n = (CHUNK_ENTRIES as u64 - u64::from(i)).min(r.end() - lba) as u16;
            let first = r.entry((lba - r.lba) as u32);
            match self.chunks.get_mut(&c) {
                Some(ch) => {
                    let (before_w, before_m) = (ch.weight(), ch.mapped());
                    ch.set_span(i, n, first);
                    self.weight = self.weight + ch.weight() - before_w;
                    self.mapped = self.mapped + u64::from(ch.mapped()) - u64::from(before_m);
                    if ch.mapped() == 0 {
                        self.weight -= ch.weight();
                        self.chunks.remove(&c);
                    }
                }
                None if first.is_mapped() => {
                    let ch = Chunk::Runs {
                        runs: vec![Run {
                            start: i,
                            len: n,
                            first,
                        }],
                        mapped: u32::from(n),
                    };
                    self.weight += ch.weight();
                    self.mapped += u64::from(n);
                    self.chunks.insert(c, ch);
                }
                None => {}
            }
            lba += u64::from(n);
        }
    }

    /// Adds a run read from a checkpoint base (loading: not recorded as a
    /// change); runs come in LBA order into a map that holds nothing at or
    /// after them.
    pub fn load_run(&mut self, r: MapRun) {
        let mut lba = r.lba;
        while lba < r.end() {
            let (c, i) = split(lba);
            let n = (CHUNK_ENTRIES as u64 - u64::from(i)).min(r.end() - lba) as u16;
            let first = r.entry((lba - r.lba) as u32);
            let ch = self.chunks.entry(c).or_insert_with(|| Chunk::Runs {
                runs: Vec::new(),
                mapped: 0,
            });
            let before = ch.weight();
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
            self.mapped += u64::from(n);
            lba += u64::from(n);
        }
    }

    /// Calls `f` with every mapped run, in LBA order (a checkpoint base).
    pub fn for_each_run(&self, mut f: impl FnMut(MapRun)) {
        // Runs that continue across a chunk edge are joined.
        let mut pending: Option<MapRun> = None;
        let mut emit = |r: MapRun| {
            if let Some(p) = &mut pending {
                if p.end() == r.lba && follows(p.entry(p.sectors - 1), r.first) {
                    p.sectors += r.sectors;
                    return;
                }
                f(*p);
            }
            pending = Some(r);
        };
        for (k, c) in &self.chunks {
            c.for_each_run(k * CHUNK_ENTRIES as u64, &mut emit);
        }
        if let Some(p) = pending {
            f(p);
        }
    }

    /// Calls `f` with the runs, mapped and unmapped, that cover the sectors
    /// marked in `dirty`, in LBA order (a checkpoint delta).
    pub fn delta_runs(&self, dirty: &Dirty, mut f: impl FnMut(MapRun)) {
        let mut entries = [MapEntry::UNMAPPED; CHUNK_ENTRIES];
        for (&c, bits) in dirty {
            let base = c * CHUNK_ENTRIES as u64;
            let ch = self.chunks.get(&c);
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

    /// The sectors changed since the last call, which starts a new set.
    pub fn take_dirty(&mut self) -> Dirty {
        std::mem::take(&mut self.dirty)
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

    /// Bytes of RAM the map uses (chunks, tree overhead and the record of
    /// what changed since the last checkpoint).
    pub fn memory_bytes(&self) -> u64 {
        let chunks: u64 = self
            .chunks
            .values()
            .map(|c| (c.memory_bytes() + TREE_SLOT_BYTES) as u64)
            .sum();
        chunks + (self.dirty.len() * (std::mem::size_of::<DirtyBits>() + TREE_SLOT_BYTES)) as u64
    }

    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Installs a whole chunk read from a checkpoint.
    pub fn load_chunk(&mut self, index: u64, entries: Box<[MapEntry; CHUNK_ENTRIES]>) {
        let ch = Chunk::from_dense(entries);
        if ch.mapped() == 0 {
            return;
        }
        self.mapped += u64::from(ch.mapped());
        self.weight += ch.weight();
        if let Some(old) = self.chunks.insert(index, ch) {
            self.mapped -= u64::from(old.mapped());
            self.weight -= old.weight();
        }
    }

    /// Mapped entries with their LBA, in LBA order.
    pub fn iter_mapped(&self) -> impl Iterator<Item = (u64, MapEntry)> + '_ {
        self.chunks.iter().flat_map(|(k, c)| {
            let base = k * CHUNK_ENTRIES as u64;
            let v: Vec<(u64, MapEntry)> = match c {
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
    pub fn next_mapped(&self, lba: u64, end: u64) -> Option<u64> {
        let (c0, i0) = split(lba);
        for (k, ch) in self.chunks.range(c0..) {
            let base = k * CHUNK_ENTRIES as u64;
            if base >= end {
                return None;
            }
            let start = if *k == c0 { i0 } else { 0 };
            let found = match ch {
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
                return (l < end).then_some(l);
            }
        }
        None
    }
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

    fn blob(offset: u64, sectors: u32, i: u32) -> MapEntry {
        MapEntry::new(offset, i, sectors, 4096 * u64::from(sectors) + 64)
    }

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
    fn blobs_cost_a_run_each() {
        let mut m = SectorMap::new();
        for b in 0..(64 * CHUNK_ENTRIES as u64 / 16) {
            for i in 0..16 {
                m.set(b * 16 + i, blob((1 << 20) + b * 65600, 16, i as u32));
            }
        }
        m.take_dirty(); // as a checkpoint does
        let per = m.memory_bytes() as f64 / m.mapped() as f64;
        assert!(per < 1.5, "{per} bytes per sector");
        assert_eq!(m.get(17), blob((1 << 20) + 65600, 16, 1));
    }

    #[test]
    fn scattered_overwrites_stay_at_about_eight_bytes() {
        let mut m = SectorMap::new();
        let mut r = rand::rngs::StdRng::seed_from_u64(1);
        let n = 64 * CHUNK_ENTRIES as u64;
        for l in 0..n {
            m.set(l, blob(1 << 20, 16, (l % 16) as u32));
        }
        for k in 0..(4 * n) {
            let l = r.gen_range(0..n);
            m.set(l, MapEntry::new((2 << 20) + 16 * k, 0, 1, 4160));
        }
        // Between checkpoints the record of changes adds a bit per sector.
        let per = m.memory_bytes() as f64 / m.mapped() as f64;
        assert!(per <= 8.35, "{per} bytes per sector");
        m.take_dirty();
        let per = m.memory_bytes() as f64 / m.mapped() as f64;
        assert!(per <= 8.1, "{per} bytes per sector");
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
                    let old = m.set(start + i, e);
                    assert_eq!(old, model[(start + i) as usize]);
                    model[(start + i) as usize] = e;
                }
                if k % 500 == 0 {
                    for (l, want) in model.iter().enumerate() {
                        assert_eq!(m.get(l as u64), *want);
                    }
                    // Ranges: across chunk edges and past the last chunk.
                    for _ in 0..50 {
                        let a = r.gen_range(0..model.len());
                        let n = r.gen_range(1..=(model.len() - a + 700).min(1500));
                        let mut out = vec![MapEntry::new(1 << 20, 0, 1, 4160); n];
                        m.get_range(a as u64, &mut out);
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
                    assert_eq!(m.next_mapped(0, u64::MAX), first);
                    // Round trip through a checkpoint base.
                    let mut m2 = SectorMap::new();
                    m.for_each_run(|r| m2.load_run(r));
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
                    m.set(start + i, e);
                }
            }
            if r.gen_range(0..4) == 0 {
                // A whole chunk trimmed.
                let c = r.gen_range(0..5u64) * CHUNK_ENTRIES as u64;
                for l in c..c + CHUNK_ENTRIES as u64 {
                    m.set(l, MapEntry::UNMAPPED);
                }
            }
            let dirty = m.take_dirty();
            if round % 10 == 0 {
                copy = SectorMap::new();
                m.for_each_run(|run| copy.load_run(run));
            } else {
                let mut runs = Vec::new();
                m.delta_runs(&dirty, |run| runs.push(run));
                for w in runs.windows(2) {
                    assert!(w[0].end() <= w[1].lba, "delta runs out of order");
                }
                for run in runs {
                    copy.apply_run(run);
                }
            }
            copy.take_dirty();
            assert_eq!(
                copy.iter_mapped().collect::<Vec<_>>(),
                m.iter_mapped().collect::<Vec<_>>(),
                "round {round}"
            );
            assert_eq!(copy.mapped(), m.mapped());
            let mut runs = 0;
            m.for_each_run(|_| runs += 1);
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
            fast.apply_run(run);
            for i in 0..n {
                slow.set(lba + u64::from(i), run.entry(i));
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
                fast.for_each_run(|_| runs += 1);
                assert!(fast.weight() >= runs);
            }
        }
    }

    #[test]
    fn only_changes_are_dirty() {
        let mut m = SectorMap::new();
        let e = blob(1 << 20, 1, 0);
        m.set(10, e);
        m.set(11, MapEntry::UNMAPPED); // was unmapped already
        m.set(1 << 30, MapEntry::UNMAPPED); // no chunk at all
        assert_eq!(m.dirty_sectors(), 1);
        m.take_dirty();
        m.set(10, e); // same entry
        assert_eq!(m.dirty_sectors(), 0);
        m.set(10, MapEntry::UNMAPPED);
        assert_eq!(m.dirty_sectors(), 1);
    }
}
