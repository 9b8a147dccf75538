//! One chunk of the sector map in memory ([`CHUNK_ENTRIES`] sectors, 2 MiB
//! of logical space) and its two encodings:
//! - **runs**: a sorted list of (first sector, length, entry of the first
//!   sector), where the sectors of a run are consecutive sectors of one
//!   record. Data written in blobs needs one run per blob: a 64 KiB blob
//!   costs 16 bytes for its 16 sectors, 1 byte per sector.
//! - **dense**: 512 entries, once runs would cost more (after scattered
//!   4 KiB overwrites, at [`RUNS_MAX`] runs, or at the map's own bound:
//!   `SectorMap::set_runs_max`): 5 bytes per sector while they are
//!   single-sector records, else 8 (`dense`).
//!
//! Also the run arithmetic the map's checkpoint side uses: grouping entries
//! into maximal runs (`group_runs`) and joining runs across chunk edges
//! (`join`).
//!
//! Invariants: `mapped` = the mapped sectors of the chunk; runs are sorted,
//! disjoint, non-empty, and two adjacent runs are never mergeable.

use super::dense::DenseEntries;
use squeeze_format::{MapEntry, MapRun, CHUNK_ENTRIES};

/// A run of sectors `start..start+len` (chunk-relative) mapped to
/// consecutive indices of one record, beginning with `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run {
    pub(super) start: u16,
    pub(super) len: u16,
    pub(super) first: MapEntry,
}

impl Run {
    pub(super) fn end(&self) -> u16 {
        self.start + self.len
    }
    pub(super) fn entry(&self, i: u16) -> MapEntry {
        debug_assert!(i >= self.start && i < self.end());
        self.first.advance(u32::from(i - self.start))
    }
}

/// True when `next` is the entry that follows `prev` inside one record,
/// or (indirect entries) names the hidden address after `prev`'s.
pub(super) fn follows(prev: MapEntry, next: MapEntry) -> bool {
    match (prev.target(), next.target()) {
        (Some(a), Some(b)) => b == a + 1,
        (None, None) => {
            prev.is_direct()
                && next.is_direct()
                && next.record_offset() == prev.record_offset()
                && next.sectors() == prev.sectors()
                && next.record_len() == prev.record_len()
                && next.index() == prev.index() + 1
        }
        _ => false,
    }
}

/// A chunk holds no more runs than this by default (the map's `runs_max`,
/// passed to the calls below): a set that could pass it turns the chunk
/// dense first. Runs cost 16 bytes each and the vector doubles,
/// so the list stops at 2 KiB, where dense costs 2560 (single-sector
/// records) or 4096. At 160, every chunk of squeeze-kv's store held a
/// 4 KiB run list at once while it loaded, and the 2560-byte dense chunks
/// that replaced them left those holes in malloc's heap: peak RSS fell
/// 1 MiB where the map fell 3.6.
pub(super) const RUNS_MAX: usize = 128;

pub(super) enum Chunk {
    Runs { runs: Vec<Run>, mapped: u32 },
    Dense { entries: DenseEntries, mapped: u32 },
}

impl Chunk {
    pub(super) fn mapped(&self) -> u32 {
        match self {
            Chunk::Runs { mapped, .. } | Chunk::Dense { mapped, .. } => *mapped,
        }
    }

    /// At least the runs a checkpoint of this chunk holds.
    pub(super) fn weight(&self) -> u64 {
        match self {
            Chunk::Runs { runs, .. } => runs.len() as u64,
            Chunk::Dense { mapped, .. } => u64::from(*mapped),
        }
    }

    /// The runs `for_each_run` gives, counted without building them.
    pub(super) fn runs(&self) -> u64 {
        match self {
            Chunk::Runs { runs, .. } => runs.len() as u64,
            Chunk::Dense { entries, .. } => entries.with_slice(count_runs),
        }
    }

    /// Calls `f` with each run of the chunk whose base sector is `base`.
    pub(super) fn for_each_run(&self, base: u64, f: &mut impl FnMut(MapRun)) {
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
            Chunk::Dense { entries, .. } => entries.with_slice(|e| group_runs(base, e, false, f)),
        }
    }

    pub(super) fn get(&self, i: u16) -> MapEntry {
        match self {
            Chunk::Dense { entries, .. } => entries.get(i),
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
    pub(super) fn get_range(&self, i: u16, out: &mut [MapEntry]) {
        match self {
            Chunk::Dense { entries, .. } => entries.get_range(i, out),
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

    /// Sets entry `i`, returning the old one; a run list that could pass
    /// `runs_max` runs turns dense first.
    pub(super) fn set(&mut self, i: u16, e: MapEntry, runs_max: usize) -> MapEntry {
        match self {
            Chunk::Dense { entries, mapped } => {
                let old = entries.set(i, e);
                *mapped = *mapped + u32::from(e.is_mapped()) - u32::from(old.is_mapped());
                old
            }
            // A set adds at most two runs (splitting one and inserting
            // one). One that could pass `RUNS_MAX` turns the chunk dense
            // first, so the list never grows past its last size (a 4 KiB
            // list allocated only to be dropped).
            Chunk::Runs { runs, .. } if runs.len() + 2 > runs_max => {
                self.make_dense();
                self.set(i, e, runs_max)
            }
            Chunk::Runs { runs, mapped } => {
                let old = set_in_runs(runs, i, e);
                *mapped = *mapped + u32::from(e.is_mapped()) - u32::from(old.is_mapped());
                old
            }
        }
    }

    /// Sets sectors `i..i + n` to consecutive entries from `first` (all
    /// unmapped when it is): one splice of the run list instead of `n`
    /// single sets (loading a checkpoint delta); dense past `runs_max` runs.
    pub(super) fn set_span(&mut self, i: u16, n: u16, first: MapEntry, runs_max: usize) {
        let end = i + n;
        match self {
            Chunk::Dense { entries, mapped } => {
                for k in 0..n {
                    let e = first.advance(u32::from(k));
                    let old = entries.set(i + k, e);
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
                if runs.len() > runs_max {
                    self.make_dense();
                }
            }
        }
    }

    /// Turns a run list dense (past the map's `runs_max` runs), narrow unless an
    /// entry needs 8 bytes (no 4 KiB array in between).
    pub(super) fn make_dense(&mut self) {
        if let Chunk::Runs { runs, mapped } = self {
            let mut entries = DenseEntries::unmapped();
            for r in runs.iter() {
                for i in r.start..r.end() {
                    entries.set(i, r.entry(i));
                }
            }
            let mapped = *mapped;
            *self = Chunk::Dense { entries, mapped };
        }
    }

    pub(super) fn memory_bytes(&self) -> usize {
        match self {
            Chunk::Dense { entries, .. } => entries.memory_bytes(),
            Chunk::Runs { runs, .. } => runs.capacity() * std::mem::size_of::<Run>(),
        }
    }

    /// Builds the cheaper form from dense entries: runs while they are at
    /// most `runs_max`.
    pub(super) fn from_dense(entries: DenseEntries, runs_max: usize) -> Chunk {
        let mapped = entries.with_slice(|s| s.iter().filter(|e| e.is_mapped()).count()) as u32;
        let mut runs: Vec<Run> = Vec::new();
        for i in 0..CHUNK_ENTRIES {
            let e = entries.get(i as u16);
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
            if runs.len() > runs_max {
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
pub(super) fn group_runs(
    base: u64,
    entries: &[MapEntry],
    unmapped: bool,
    f: &mut impl FnMut(MapRun),
) {
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

/// The runs of mapped entries `group_runs` gives of `entries`, counted: a
/// mapped entry starts one unless it follows the entry before it.
pub(super) fn count_runs(entries: &[MapEntry]) -> u64 {
    let mut n = 0;
    let mut last = MapEntry::UNMAPPED;
    for &e in entries {
        n += u64::from(e.is_mapped() && !(last.is_mapped() && follows(last, e)));
        last = e;
    }
    n
}

/// Joins `r` to the pending run when it continues it; otherwise returns
/// the pending run, done, and `r` becomes pending.
pub(super) fn join(pending: &mut Option<MapRun>, r: MapRun) -> Option<MapRun> {
    if let Some(p) = pending {
        if p.end() == r.lba && follows(p.entry(p.sectors - 1), r.first) {
            p.sectors += r.sectors;
            return None;
        }
    }
    pending.replace(r)
}
