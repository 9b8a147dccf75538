//! Inline deduplication (dedup mode `inline`, docs/DEDUP.md): the write
//! path fingerprints each written non-zero 4 KiB sector, looks it up in an
//! index of recent content (`index::Index`, dense, within the volume's
//! `--dedup-index` budget, oldest chapter out first) and, where a run of
//! sectors is found again, links it instead of storing it:
//! - content already at consecutive hidden addresses: one Link record;
//! - content another client run holds in its own records (the common
//!   case: the first copy of anything is a plain write): *promoted* as
//!   the idle pass does, written once at fresh hidden addresses (compressed
//!   as the write would have been) and both runs linked to it.
//!
//! What is not shared (no hit, bytes that differ, a source run busy, the
//! dedup lock busy) goes down the ordinary write path; afterwards its
//! sectors enter the index as client sectors.
//!
//! Invariants:
//! - A hit is a candidate only: nothing is linked before its bytes were
//!   compared with the written ones (a hidden run read under the dedup
//!   lock, shared among writers, which keeps the orphan zeroing away from
//!   it until the Link is installed; a client source run read under its
//!   range lock).
//! - Every Link is appended under the range lock of the sectors it links
//!   (the writer's own, or the source run's, taken with `try_lock`: a
//!   writer never waits for a second range while it holds one) and after
//!   the Extent it names is installed (a separate, earlier append).
//! - A write of at most `max_blob` sectors is one record today, atomic
//!   across a crash (docs/RELIABILITY.md, "Atomic writes"): it is shared
//!   only whole (one Link, or one Extent and its Link: a Link applies only
//!   where its hidden address holds a record, so a crash leaves the old
//!   content or the new, never a mix); otherwise it is written as usual.
//! - Modes off and idle never come here (`InlineDedup::on`, an atomic
//!   read): their write path is unchanged.
//!
//! Crash safety is the pass's (`dedup/pass.rs`): Extents at hidden
//! addresses and Links, flushed with the write's other records; a Link
//! whose Extent a crash lost leaves its sectors as they were, an Extent
//! whose Links it lost is an orphan, zeroed later.

use super::index::{Index, Loc};
use super::share;
use crate::counters::Counter;
use crate::error::{EngineError, Result};
use crate::pipeline::policy::{ActivePolicy, Hint};
use crate::pipeline::split::sector_is_zero;
use crate::read;
use crate::state::Inner;
use squeeze_codec::Algorithm;
use squeeze_format::SECTOR_SIZE;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The longest a write waits for the dedup lock (shared with other
/// writers; held exclusively by a pass's window or an orphan zeroing)
/// before it writes its sectors as usual: a whole `compact --dedup` holds
/// it for minutes.
const LOCK_WAIT: Duration = Duration::from_millis(10);

/// The shortest run a write shares: a single sector is left to the idle
/// pass, rather than cut the write's blobs (and its compression) around it.
pub(crate) const MIN_RUN_SECTORS: usize = 2;

/// What [`share`] did with a chunk: the sector ranges it left to the
/// ordinary write path, and the fingerprints [`remember`] enters once
/// they are written.
pub(crate) struct Shared {
    /// Sector ranges (indices into the chunk) to write as usual.
    pub(crate) rest: Vec<(usize, usize)>,
    fps: Vec<Option<u128>>,
}

/// What became of a candidate run.
enum Tried {
    /// Linked to the hidden addresses from this one.
    Linked(u64),
    /// The source's bytes differ (or fail their checksum).
    Differ,
    /// The source run is being written (or is out of the volume): left.
    Busy,
}

/// A candidate run: chunk sectors `i..i + k` whose content the index
/// places at `src..src + k`.
#[derive(Clone, Copy, Debug)]
struct Run {
    i: usize,
    k: usize,
    src: Loc,
}

/// Shares what it can of `chunk` (whole sectors from `lba`, under the
/// caller's range lock): links runs found again, promotes runs found at
/// other client sectors. `codec`, `hint` and `buf` (the engine's owned
/// copy of `chunk`, as for `encode`) are the write's.
#[expect(
    clippy::too_many_arguments,
    reason = "the write's own state, passed on"
)]
pub(crate) fn share(
    inner: &Inner,
    policy: &ActivePolicy,
    codec: (Algorithm, bool),
    hint: Hint,
    lba: u64,
    chunk: &[u8],
    buf: Option<(&Arc<Vec<u8>>, usize)>,
    max_blob: u32,
) -> Result<Shared> {
    let dd = &inner.inline;
    let n = chunk.len() / SECTOR_SIZE;
    let sector = |i: usize| &chunk[i * SECTOR_SIZE..(i + 1) * SECTOR_SIZE];
    let fps: Vec<Option<u128>> = (0..n)
        .map(|i| (!sector_is_zero(sector(i))).then(|| dd.fingerprint(sector(i))))
        .collect();
    let whole = |fps| Shared {
        rest: vec![(0, n)],
        fps,
    };
    let runs = {
        let ix = dd.index.lock();
        match ix.as_ref() {
            Some(ix) => candidates(ix, &fps, lba, n),
            None => Vec::new(),
        }
    };
    // A write of at most one blob is shared whole or not at all.
    let atomic = n <= max_blob as usize;
    if runs.is_empty() || (atomic && !(runs.len() == 1 && runs[0].k == n)) {
        return Ok(whole(fps));
    }
    let Some(_one) = inner.dedup_lock.try_read_for(LOCK_WAIT) else {
        return Ok(whole(fps));
    };
    let mut done: Vec<(usize, usize)> = Vec::new();
    let mut mismatched = 0u64;
    for r in runs {
        let run = &chunk[r.i * SECTOR_SIZE..(r.i + r.k) * SECTOR_SIZE];
        let x = lba + r.i as u64;
        let shared = match r.src {
            Loc::Shared(h) => link_to_shared(inner, x, h, run)?,
            Loc::Client(y) => {
                let buf = buf.map(|(a, base)| (a, base + r.i * SECTOR_SIZE));
                promote(inner, policy, codec, hint, y, x, run, buf)?
            }
        };
        match shared {
            Tried::Linked(h) => {
                done.push((r.i, r.i + r.k));
                let mut ix = dd.index.lock();
                if let Some(ix) = ix.as_mut() {
                    for (q, fp) in fps[r.i..r.i + r.k].iter().enumerate() {
                        if let Some(fp) = *fp {
                            ix.insert(fp, Loc::Shared(h + q as u64));
                        }
                    }
                }
            }
            Tried::Differ => mismatched += r.k as u64,
            Tried::Busy => {}
        }
    }
    let c = &inner.counters;
    c.add(Counter::DedupInlineMismatchedSectors, mismatched);
    let linked: usize = done.iter().map(|(a, b)| b - a).sum();
    c.add(Counter::DedupInlineLinkedSectors, linked as u64);
    // What is left: the gaps between the runs shared, in order.
    let mut rest = Vec::new();
    let mut at = 0;
    for &(a, b) in &done {
        if a > at {
            rest.push((at, a));
        }
        at = b;
    }
    if at < n {
        rest.push((at, n));
    }
    Ok(Shared { rest, fps })
}

/// After the ordinary write of `s.rest` (from `lba`): its sectors enter
/// the index as client sectors holding their content.
pub(crate) fn remember(inner: &Inner, lba: u64, s: &Shared) {
    let dd = &inner.inline;
    let mut ix = dd.index.lock();
    let ix = ix.get_or_insert_with(|| Index::new(dd.budget.load(Ordering::Relaxed), 1));
    for &(a, b) in &s.rest {
        for (q, fp) in s.fps[a..b].iter().enumerate() {
            if let Some(fp) = *fp {
                ix.insert(fp, Loc::Client(lba + (a + q) as u64));
            }
        }
    }
}

/// The runs of at least MIN_RUN_SECTORS sectors of the chunk (`lba`, `n`
/// sectors) that the index places at consecutive addresses of one kind;
/// a client source overlapping the chunk is left out (its range is the
/// writer's own).
fn candidates(ix: &Index, fps: &[Option<u128>], lba: u64, n: usize) -> Vec<Run> {
    let locs: Vec<Option<Loc>> = fps.iter().map(|f| f.and_then(|f| ix.get(f))).collect();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < n {
        let Some(src) = locs[i] else {
            i += 1;
            continue;
        };
        let next = |q: usize| match src {
            Loc::Client(y) => Loc::Client(y + q as u64),
            Loc::Shared(h) => Loc::Shared(h + q as u64),
        };
        let mut j = i + 1;
        while j < n && locs[j] == Some(next(j - i)) {
            j += 1;
        }
        let k = j - i;
        let overlaps = match src {
            Loc::Client(y) => y < lba + n as u64 && lba < y + k as u64,
            Loc::Shared(_) => false,
        };
        if k >= MIN_RUN_SECTORS && !overlaps {
            runs.push(Run { i, k, src });
        }
        i = j;
    }
    runs
}

/// Whether `held`, read from the candidate source, is `run`: a failed
/// checksum is a mismatch (the source stays as it is), other errors are
/// the write's.
fn same(r: Result<()>, held: &[u8], run: &[u8]) -> Result<bool> {
    match r {
        Ok(()) => Ok(held == run),
        Err(EngineError::Corrupt { .. } | EngineError::Codec { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Links client sectors from `x` (the writer's, holding `run`) to the
/// hidden addresses from `h` if those hold `run`, compared under the
/// dedup lock (the caller's): nothing zeroes them before the Link is
/// installed. The hidden address's record is returned.
fn link_to_shared(inner: &Inner, x: u64, h: u64, run: &[u8]) -> Result<Tried> {
    let mut held = vec![0u8; run.len()];
    if !same(read::read_sectors(inner, h, &mut held), &held, run)? {
        return Ok(Tried::Differ);
    }
    share::link(inner, &[x], (run.len() / SECTOR_SIZE) as u64, h)?;
    Ok(Tried::Linked(h))
}

/// Promotes `run`, which the writer is writing at `x` and which client
/// sectors from `y` held when last written: if `y`'s range is free
/// (`try_lock`) and still holds `run`, the content is written once at
/// fresh hidden addresses (blobs of at most `max_blob` sectors) and both
/// runs are linked to it.
#[expect(
    clippy::too_many_arguments,
    reason = "the write's own state, passed on"
)]
fn promote(
    inner: &Inner,
    policy: &ActivePolicy,
    codec: (Algorithm, bool),
    hint: Hint,
    y: u64,
    x: u64,
    run: &[u8],
    buf: Option<(&Arc<Vec<u8>>, usize)>,
) -> Result<Tried> {
    let k = (run.len() / SECTOR_SIZE) as u64;
    if y + k > inner.size() / SECTOR_SIZE as u64 {
        return Ok(Tried::Busy);
    }
    let Some(_source) = inner.ranges.try_lock(y, y + k) else {
        return Ok(Tried::Busy);
    };
    let mut held = vec![0u8; run.len()];
    if !same(read::read_sectors(inner, y, &mut held), &held, run)? {
        return Ok(Tried::Differ);
    }
    // Blobs of at most max_blob sectors, as the write's own would be.
    let h = share::promote(inner, policy, (codec, hint, buf), run, &[x, y])?;
    Ok(Tried::Linked(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use squeeze_format::SHARED_BASE;

    fn fp(k: u64) -> Option<u128> {
        Some(u128::from(k))
    }

    #[test]
    fn runs_follow_consecutive_addresses_of_one_kind() {
        let mut ix = Index::new(1 << 20, 1);
        // Content 1, 2, 3 at client 100..103; 7, 8 at hidden H, H+1.
        for (k, l) in [(1u64, 100), (2, 101), (3, 102)] {
            ix.insert(u128::from(k), Loc::Client(l));
        }
        let h = SHARED_BASE + 40;
        ix.insert(7, Loc::Shared(h));
        ix.insert(8, Loc::Shared(h + 1));
        ix.insert(9, Loc::Client(500));
        // Written at 10..18: 1 2 3 | 7 8 | 9 (one sector: left) | 5 (new) | 2 3
        let fps = [
            fp(1),
            fp(2),
            fp(3),
            fp(7),
            fp(8),
            fp(9),
            fp(5),
            fp(2),
            fp(3),
        ];
        let runs = candidates(&ix, &fps, 10, fps.len());
        let got: Vec<(usize, usize, Loc)> = runs.iter().map(|r| (r.i, r.k, r.src)).collect();
        assert_eq!(
            got,
            vec![
                (0, 3, Loc::Client(100)),
                (3, 2, Loc::Shared(h)),
                (7, 2, Loc::Client(101)),
            ]
        );
        // A client source inside the chunk's own range is left out.
        let runs = candidates(&ix, &[fp(1), fp(2)], 99, 2);
        assert!(runs.is_empty(), "{runs:?}");
        // Zero sectors (no fingerprint) end a run.
        let runs = candidates(&ix, &[fp(1), None, fp(3)], 0, 3);
        assert!(runs.is_empty(), "{runs:?}");
    }
}
