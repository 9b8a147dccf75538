//! The deduplication pass: reads the volume's client sectors in LBA
//! order, a window of `max_blob` sectors at a time, fingerprints each
//! (`index`), and shares the content of sectors found again:
//! - a run of sectors whose content is already at consecutive hidden
//!   addresses is linked to them (a Link record);
//! - a run whose content another client run holds in its own records is
//!   *promoted*: the content is written once at fresh hidden addresses (one
//!   blob, compressed with the policy's target) and both runs are linked
//!   to them; the records they held turn to garbage for the cleaner.
//!
//! Runs are found from *hooks*: the index keeps 1 fingerprint in
//! `sample` (all while the volume fits in its budget), and a hook found
//! again gives an *alignment* (this sector's content lies `delta` sectors
//! away); the pass reads what that alignment puts beside the whole window
//! and shares every run of equal sectors, before and after the hook, and
//! carries the alignment into the next window while a run goes on.
//!
//! Every share is verified by comparing bytes, read under the range locks
//! of the sectors linked (the window's, taken before it is read, and the
//! source run's): what is linked is what those sectors held when the Link
//! was appended, and a client write after it is ordered after it in the
//! log. A run that changed meanwhile is left as it is.
//!
//! At the end, hidden addresses no client sector refers to any more
//! (orphans: their last sharer was overwritten, or a pass was cut short
//! between a promotion's blob and its Links) are zeroed.
//!
//! Crash safety: each step is ordinary log records (an Extent at hidden
//! addresses, Links, Zeros), applied in log order by replay; the records a
//! Link made dead are freed only by a checkpoint, which syncs first. A
//! crash between a promotion's blob and its Links leaves an orphan, which
//! the next pass zeroes.

use super::index::{fingerprint, Index, Loc};
use super::share;
use crate::error::{EngineError, Result};
use crate::meta::pager;
use crate::pipeline::policy::{ActivePolicy, Hint};
use crate::read;
use crate::state::Inner;
use squeeze_format::{MapEntry, SECTOR_SIZE, SHARED_BASE, SHARED_SECTORS};

/// What a pass did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct DedupReport {
    /// Client sectors read and fingerprinted (mapped, not all zeros).
    pub sectors_fingerprinted: u64,
    /// Client sectors linked to hidden addresses by this pass.
    pub sectors_linked: u64,
    /// Sectors written at new hidden addresses (promotions).
    pub sectors_promoted: u64,
    /// Candidate runs whose bytes differed (a fingerprint collision, or
    /// a source rewritten since it was fingerprinted): left as they are.
    pub sectors_mismatched: u64,
    /// Windows left as they are because a read failed its checksum.
    pub corrupt_windows: u64,
    /// Hidden addresses zeroed: no client sector referred to them.
    pub orphans_zeroed: u64,
    /// The index at the end: entries, entries the budget pushed out, RAM.
    pub index_entries: u64,
    pub index_evicted: u64,
    pub index_bytes: u64,
    /// 1 fingerprint in this many kept in the index (1: all; more when the
    /// volume's sectors do not fit in the budget: `dedup/index.rs`).
    #[serde(default)]
    pub index_sample: u64,
}

/// One pass over the whole volume with an index of at most `budget` bytes
/// (`squeeze compact --dedup`). `progress(lba, total_sectors)`.
pub(crate) fn pass(
    inner: &Inner,
    budget: u64,
    mut progress: impl FnMut(u64, u64),
) -> Result<DedupReport> {
    let _one = inner.dedup_lock.write();
    let mut p = Pass::new(inner, 0, budget);
    let done = p.run(inner, || false, &mut progress)?;
    debug_assert!(done, "a pass never told to stop runs to the end");
    p.finish(inner)
}

/// A pass under way: the LBA it resumes at, its index and what it did so
/// far. The maintenance thread keeps one between idle periods (`run` stops
/// between windows when told to, `run` again goes on from `at`); the
/// caller holds `inner.dedup_lock` for each `run` and for `finish`.
pub(crate) struct Pass {
    /// The first LBA not read yet.
    pub(crate) at: u64,
    ix: Index,
    /// The alignment of a run shared up to the last window's end.
    carry: Option<Delta>,
    pub(crate) rep: DedupReport,
}

impl Pass {
    /// A pass that starts at LBA `at` with an empty index of at most
    /// `budget` bytes, sampled as the volume's mapped sectors need.
    pub(crate) fn new(inner: &Inner, at: u64, budget: u64) -> Pass {
        let mapped = inner.state.read().map.mapped();
        Pass {
            at,
            ix: Index::new(budget, Index::sample_for(budget, mapped)),
            carry: None,
            rep: DedupReport::default(),
        }
    }

    /// Windows from `at` on until the volume's end (true) or until `stop()`,
    /// asked after each window, says so (false: `at` is where to go on).
    /// At least one window is read when any is left. The policy is read
    /// again at each call (a pass resumed after `set` uses the new one).
    pub(crate) fn run(
        &mut self,
        inner: &Inner,
        mut stop: impl FnMut() -> bool,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<bool> {
        let policy = inner.policy.read().clone();
        let w = u64::from(policy.max_blob_sectors());
        let total = inner.size() / SECTOR_SIZE as u64;
        let mut buf = vec![0u8; w as usize * SECTOR_SIZE];
        while let Some(first) = pager::with_map(inner, |st| st.map.next_mapped(self.at, total))? {
            let end = (first + w).min(total);
            let n = (end - first) as usize;
            {
                let _window = inner.ranges.lock(first, end);
                let mut entries = vec![MapEntry::UNMAPPED; n];
                pager::with_map(inner, |st| st.map.get_range(first, &mut entries))?;
                let data = &mut buf[..n * SECTOR_SIZE];
                match read::read_sectors(inner, first, data) {
                    Ok(()) => window(
                        inner,
                        &policy,
                        &mut self.ix,
                        first,
                        &entries,
                        data,
                        &mut self.rep,
                        &mut self.carry,
                    )?,
                    Err(e @ (EngineError::Corrupt { .. } | EngineError::Codec { .. })) => {
                        tracing::warn!("dedup: window at LBA {first} left as it is: {e}");
                        self.rep.corrupt_windows += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            self.at = end;
            progress(end, total);
            if end < total && stop() {
                return Ok(false);
            }
        }
        self.at = total.max(self.at);
        Ok(true)
    }

    /// The end of the pass: orphans zeroed, the index's figures.
    pub(crate) fn finish(mut self, inner: &Inner) -> Result<DedupReport> {
        self.rep.orphans_zeroed = super::orphans::zero(inner)?;
        self.rep.index_entries = self.ix.len() as u64;
        self.rep.index_evicted = self.ix.evicted;
        self.rep.index_bytes = self.ix.memory_bytes();
        self.rep.index_sample = self.ix.sample();
        Ok(self.rep)
    }
}

/// Where the content of client sector `lba` is looked for: `lba + delta`
/// (negative for an earlier client sector, from `SHARED_BASE` up for a
/// hidden address).
type Delta = i128;

/// The bytes at one alignment, read once per window from the first sector
/// that needs them: `bytes[j - from]` is sector `first + j + delta`'s
/// (`None` where that address is out of range or, for a client source,
/// not a sector holding its own record).
struct Aligned {
    delta: Delta,
    from: usize,
    bytes: Vec<u8>,
    usable: Vec<bool>,
}

/// One window `first..first + entries.len()`, whose range lock the caller
/// holds and whose bytes `data` are. `carry` is the alignment of a run
/// shared up to the window's end, for the next window: a run that crosses
/// windows goes on without a hook.
#[allow(clippy::too_many_arguments)]
fn window(
    inner: &Inner,
    policy: &ActivePolicy,
    ix: &mut Index,
    first: u64,
    entries: &[MapEntry],
    data: &[u8],
    rep: &mut DedupReport,
    carry: &mut Option<Delta>,
) -> Result<()> {
    let n = entries.len();
    let sector = |i: usize| &data[i * SECTOR_SIZE..(i + 1) * SECTOR_SIZE];
    let fps: Vec<Option<u128>> = (0..n)
        .map(|i| {
            let s = sector(i);
            (entries[i].is_mapped() && s.iter().any(|&b| b != 0)).then(|| fingerprint(s))
        })
        .collect();
    rep.sectors_fingerprinted += fps.iter().flatten().count() as u64;
    // `done`: nothing (more) to share: a hole, zeros, shared already, or
    // linked by this window.
    let mut done: Vec<bool> = (0..n)
        .map(|i| fps[i].is_none() || !entries[i].is_direct())
        .collect();
    // The alignments this window's hooks name, before any is inserted: a
    // run is shared from its first sector, before its hook.
    let mut deltas: Vec<Delta> = carry.take().into_iter().collect();
    for i in 0..n {
        let Some(fp) = fps[i] else { continue };
        if let Some(t) = entries[i].target() {
            // Shared already: later copies can link to it.
            ix.insert(fp, Loc::Shared(t));
        } else if let Some(d) = delta_of(ix, fp, first + i as u64) {
            if !deltas.contains(&d) {
                deltas.push(d);
            }
        }
    }
    let mut aligned: Vec<Aligned> = Vec::new();
    let mut i = 0;
    while i < n {
        let Some(fp) = fps[i].filter(|_| !done[i]) else {
            i += 1;
            continue;
        };
        let x = first + i as u64;
        // The hook's own alignment now (a run shared earlier in this
        // window may have moved it), then the window's.
        let mut cands = deltas.clone();
        if let Some(d) = delta_of(ix, fp, x) {
            cands.retain(|&c| c != d);
            cands.insert(0, d);
        }
        let mut shared = false;
        for d in cands {
            let a = match aligned.iter().position(|a| a.delta == d) {
                Some(p) => p,
                None => match align(inner, first, n, i, d)? {
                    Some(a) => {
                        aligned.push(a);
                        aligned.len() - 1
                    }
                    None => continue,
                },
            };
            let matches = |j: usize| {
                let al = &aligned[a];
                j >= al.from
                    && !done[j]
                    && al.usable[j - al.from]
                    && al.bytes[(j - al.from) * SECTOR_SIZE..(j - al.from + 1) * SECTOR_SIZE]
                        == *sector(j)
                    // A client source inside the window not linked since.
                    && source_in_window(n, j, d).is_none_or(|s| !done[s])
            };
            if !matches(i) {
                continue;
            }
            let mut j = i + 1;
            // A client source lies wholly before the run (never overlapping it).
            let max = if d < 0 { (-d) as usize } else { n };
            while j < n && j - i < max && matches(j) {
                j += 1;
            }
            let k = j - i;
            let run = &data[i * SECTOR_SIZE..j * SECTOR_SIZE];
            let t = (x as i128 + d) as u64;
            let result = if d > 0 {
                link_to_shared(inner, x, t, run)?
            } else {
                promote(inner, policy, t, x, first, run)?
            };
            let Some((h, promoted)) = result else {
                rep.sectors_mismatched += k as u64;
                continue;
            };
            rep.sectors_linked += k as u64 + if promoted { k as u64 } else { 0 };
            if promoted {
                rep.sectors_promoted += k as u64;
            }
            for q in 0..k {
                done[i + q] = true;
                if let Some(s) = source_in_window(n, i + q, d) {
                    done[s] = true;
                }
                ix.insert(
                    fps[i + q].expect("a run's sectors have fingerprints"),
                    Loc::Shared(h + q as u64),
                );
            }
            if j == n {
                *carry = Some(d);
            }
            shared = true;
            i = j;
            break;
        }
        if !shared {
            // New content, or its hook named a place that no longer holds it.
            ix.insert(fp, Loc::Client(x));
            i += 1;
        }
    }
    Ok(())
}

/// The alignment a hook's match gives client sector `x`: None if `fp` is
/// not a hook, not in the index, or names `x` itself.
fn delta_of(ix: &Index, fp: u128, x: u64) -> Option<Delta> {
    let loc = ix.get(fp)?;
    let d = loc.addr() as i128 - x as i128;
    match loc {
        Loc::Client(_) if d < 0 => Some(d),
        Loc::Shared(_) => Some(d),
        Loc::Client(_) => None,
    }
}

/// The index in the window of the client source of window sector `j` at
/// alignment `d`, if it lies in the window.
fn source_in_window(n: usize, j: usize, d: Delta) -> Option<usize> {
    let s = j as i128 + d;
    (d < 0 && (0..n as i128).contains(&s)).then_some(s as usize)
}

/// Reads what alignment `d` puts beside window sectors `from..n`: a
/// candidate only (a client source is read again under its range lock
/// by `promote`; hidden addresses change only under the dedup lock,
/// which the pass holds). None where nothing there can be read whole.
fn align(inner: &Inner, first: u64, n: usize, from: usize, d: Delta) -> Result<Option<Aligned>> {
    let lo = first as i128 + from as i128 + d;
    let hi = first as i128 + n as i128 + d;
    let range = if d > 0 {
        SHARED_BASE as i128..(SHARED_BASE + SHARED_SECTORS) as i128
    } else {
        0..(inner.size() / SECTOR_SIZE as u64) as i128
    };
    let (lo_c, hi_c) = (lo.max(range.start), hi.min(range.end));
    let m = (hi - lo) as usize;
    let mut a = Aligned {
        delta: d,
        from,
        bytes: vec![0u8; m * SECTOR_SIZE],
        usable: vec![false; m],
    };
    if lo_c >= hi_c {
        return Ok(Some(a));
    }
    let off = (lo_c - lo) as usize;
    let cnt = (hi_c - lo_c) as usize;
    let src = lo_c as u64;
    let mut src_entries = vec![MapEntry::UNMAPPED; cnt];
    pager::with_map(inner, |st| st.map.get_range(src, &mut src_entries))?;
    match read::read_sectors(
        inner,
        src,
        &mut a.bytes[off * SECTOR_SIZE..(off + cnt) * SECTOR_SIZE],
    ) {
        Ok(()) => {}
        Err(EngineError::Corrupt { .. } | EngineError::Codec { .. }) => return Ok(None),
        Err(e) => return Err(e),
    }
    for (q, e) in src_entries.iter().enumerate() {
        // A hidden address must hold a record; a client source its own.
        a.usable[off + q] = e.is_direct();
    }
    Ok(Some(a))
}

/// Links client sectors from `x` (held by the caller's range lock, holding
/// `run`) to the hidden addresses from `h`, which the caller found holding
/// the same bytes under the dedup lock.
fn link_to_shared(inner: &Inner, x: u64, h: u64, run: &[u8]) -> Result<Option<(u64, bool)>> {
    share::link(inner, &[x], (run.len() / SECTOR_SIZE) as u64, h)?;
    Ok(Some((h, false)))
}

/// Promotes a content that client sectors from `y` and from `x` (the
/// window from `window_first`, locked by the caller) both hold: written
/// once at fresh hidden addresses, both runs linked to it. Checked under
/// `y`'s range lock: `y` still holds `run`.
fn promote(
    inner: &Inner,
    policy: &ActivePolicy,
    y: u64,
    x: u64,
    window_first: u64,
    run: &[u8],
) -> Result<Option<(u64, bool)>> {
    let k = (run.len() / SECTOR_SIZE) as u64;
    // The part of y's run outside the window (the window is locked).
    let lock_end = (y + k).min(window_first);
    let _source = (y < lock_end).then(|| inner.ranges.lock(y, lock_end));
    let mut held = vec![0u8; run.len()];
    match read::read_sectors(inner, y, &mut held) {
        Ok(()) if held == run => {}
        Ok(()) | Err(EngineError::Corrupt { .. } | EngineError::Codec { .. }) => return Ok(None),
        Err(e) => return Err(e),
    }
    // Block payloads once the superblock allows them (format 6), as the
    // merger does; one blob (the run lies within a window of max_blob
    // sectors).
    let blocks = inner
        .block_payloads
        .load(std::sync::atomic::Ordering::Acquire);
    let codec = ((policy.algorithm, blocks), Hint::None, None);
    let h = share::promote(inner, policy, codec, run, &[y, x])?;
    Ok(Some((h, true)))
}
