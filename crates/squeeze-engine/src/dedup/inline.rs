//! Inline deduplication (dedup mode `inline`, docs/DEDUP.md): the write
//! path fingerprints each written non-zero 4 KiB sector and looks its
//! *hooks* up in an index of recent content (`index::Index`, sampled: 1
//! fingerprint in `sample`, 8 by default, `OpenOptions::dedup_inline_sample`;
//! within the volume's `--dedup-index` budget, oldest chapter out first).
//! A hook found again names an alignment (this sector's content lies at
//! that address); the write's sectors around the hook are compared byte
//! for byte with the sectors around that address (`dedup/extend.rs`), and
//! the run of equal sectors, before and after the hook, is linked instead
//! of stored:
//! - content already at consecutive hidden addresses: one Link record;
//! - content another client run holds in its own records (the common
//!   case: the first copy of anything is a plain write): *promoted* as
//!   the idle pass does, written once at fresh hidden addresses (compressed
//!   as the write would have been) and both runs linked to it.
//!
//! What is not shared (no hook found again, bytes that differ, a source
//! run busy, the dedup lock busy) goes down the ordinary write path;
//! afterwards its hooks enter the index as client sectors. A duplicate run
//! none of whose sectors is a hook is not found (a run of `k` sectors at 1
//! in 8: probability (7/8)^k; the idle pass finds it later).
//!
//! Invariants:
//! - A hit is a candidate only: nothing is linked before its bytes were
//!   compared with the written ones (a hidden run read under the dedup
//!   lock, shared among writers, which keeps the orphan zeroing away from
//!   it until the Link is installed; a client source run read under its
//!   range locks, held until its Link is appended).
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

use super::extend::{self, Extended};
use super::index::{Index, Loc};
use super::share;
use crate::counters::Counter;
use crate::error::Result;
use crate::pipeline::policy::{ActivePolicy, Hint};
use crate::pipeline::split::sector_is_zero;
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
    let hits = {
        let ix = dd.index.lock();
        match ix.as_ref() {
            Some(ix) => hits(ix, &fps, lba, n),
            None => Vec::new(),
        }
    };
    if hits.is_empty() {
        return Ok(whole(fps));
    }
    let Some(_one) = inner.dedup_lock.try_read_for(LOCK_WAIT) else {
        return Ok(whole(fps));
    };
    // A write of at most one blob is shared whole or not at all.
    let atomic = n <= max_blob as usize;
    let nonzero: Vec<bool> = fps.iter().map(Option::is_some).collect();
    let mut done: Vec<(usize, usize)> = Vec::new();
    // Alignments tried and the sectors they were compared equal over,
    // not shared (too short, or a part of an atomic write): not read again.
    let mut tried: Vec<(i128, usize, usize)> = Vec::new();
    // The end of the last run shared: runs never overlap.
    let mut floor = 0;
    let mut mismatched = 0u64;
    for (i, src) in hits {
        let d = src.addr() as i128 - (lba + i as u64) as i128;
        if i < floor || tried.iter().any(|&(t, a, b)| t == d && (a..b).contains(&i)) {
            continue;
        }
        let f = match extend::extend(inner, chunk, &nonzero, lba, i, src, floor)? {
            Extended::Run(f) => f,
            Extended::Differ => {
                mismatched += 1;
                continue;
            }
            Extended::Busy | Extended::Gone => continue,
        };
        let k = f.b - f.a;
        if k < MIN_RUN_SECTORS || (atomic && k < n) {
            tried.push((d, f.a, f.b));
            continue;
        }
        let run = &chunk[f.a * SECTOR_SIZE..f.b * SECTOR_SIZE];
        let x = lba + f.a as u64;
        let h = match src {
            Loc::Shared(_) => {
                share::link(inner, &[x], k as u64, f.source)?;
                f.source
            }
            Loc::Client(_) => {
                // Under the source's range locks (`f`), still held.
                let buf = buf.map(|(b, base)| (b, base + f.a * SECTOR_SIZE));
                share::promote(inner, policy, (codec, hint, buf), run, &[x, f.source])?
            }
        };
        done.push((f.a, f.b));
        floor = f.b;
        let mut ix = dd.index.lock();
        if let Some(ix) = ix.as_mut() {
            for (q, fp) in fps[f.a..f.b].iter().enumerate() {
                if let Some(fp) = *fp {
                    ix.insert(fp, Loc::Shared(h + q as u64));
                }
            }
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

/// After the ordinary write of `s.rest` (from `lba`): its hooks enter the
/// index as client sectors holding their content.
pub(crate) fn remember(inner: &Inner, lba: u64, s: &Shared) {
    let dd = &inner.inline;
    let mut ix = dd.index.lock();
    let ix = ix.get_or_insert_with(|| Index::new(dd.budget.load(Ordering::Relaxed), dd.sample));
    for &(a, b) in &s.rest {
        for (q, fp) in s.fps[a..b].iter().enumerate() {
            if let Some(fp) = *fp {
                ix.insert(fp, Loc::Client(lba + (a + q) as u64));
            }
        }
    }
}

/// The hooks of the chunk (`lba`, `n` sectors) the index knows, in chunk
/// order, with where it places their content; a client source inside the
/// chunk is left out (its range is the writer's own).
fn hits(ix: &Index, fps: &[Option<u128>], lba: u64, n: usize) -> Vec<(usize, Loc)> {
    fps.iter()
        .enumerate()
        .filter_map(|(i, f)| {
            let fp = f.filter(|&fp| ix.is_hook(fp))?;
            let loc = ix.get(fp)?;
            match loc {
                Loc::Client(y) if (lba..lba + n as u64).contains(&y) => None,
                _ => Some((i, loc)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use squeeze_format::SHARED_BASE;

    #[test]
    fn hits_are_the_hooks_the_index_knows_outside_the_write() {
        let mut ix = Index::new(1 << 20, 8);
        // Hooks (high bits 0) 1, 2, 3 and a fingerprint that is not one.
        let hook = |k: u64| u128::from(k);
        let not_hook = (1u128 << 64) | 4;
        ix.insert(hook(1), Loc::Client(100));
        ix.insert(hook(2), Loc::Shared(SHARED_BASE + 7));
        ix.insert(hook(3), Loc::Client(11));
        ix.insert(not_hook, Loc::Client(200));
        let fps = [
            Some(hook(1)),
            None,
            Some(not_hook),
            Some(hook(2)),
            Some(hook(3)),
        ];
        // Written at 10..15: hook 3's source, 11, is the write's own.
        assert_eq!(
            hits(&ix, &fps, 10, fps.len()),
            vec![(0, Loc::Client(100)), (3, Loc::Shared(SHARED_BASE + 7))]
        );
        // Elsewhere, it is a hit.
        assert_eq!(hits(&ix, &fps, 20, fps.len()).len(), 3);
    }
}
