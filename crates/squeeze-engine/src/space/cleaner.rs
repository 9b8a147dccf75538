//! The cleaner: garbage collection of the segment log.
//!
//! Every overwrite or trim leaves dead bytes behind in the segment that held
//! the old data. The cleaner picks a victim by cost-benefit
//! (`space::victim`) and relocates what is still live in it to the log head
//! (`space::relocate`); the victim then holds no live sector and the next
//! checkpoint frees it and punches it out of the file. This file holds the
//! passes: when to clean, and which counter the copied bytes go to.
//!
//! The cleaner is five modules of `space`, each one concept: the policy
//! (`gc_policy`, below `state`), victim choice (`victim`), relocation
//! (`relocate`), the passes that decide when to clean (this file), and the
//! upgrade and compaction (`upgrade`). Making room for a write that found
//! none (`make_room`) sits above them and the checkpoint.
//!
//! Policy ([`GcPolicy`]): a garbage budget decides when the background
//! thread cleans and which victims are worth their copy. It cleans one
//! victim at a time and sleeps as long as the victim took before the next,
//! so client I/O keeps at least half of the machine; once clients have been
//! idle for a second it works without pause on cheap victims (at most half
//! live, `idle_pass`), and the merger (`space::merge`) rewrites fragmented
//! windows first. A write that finds no room cleans in the foreground
//! before answering ENOSPC (`space::make_room`).

use crate::counters::Counter;
use crate::error::Result;
#[cfg(doc)]
use crate::space::gc_policy::GcPolicy;
use crate::space::gc_policy::{IDLE_VICTIM_LIVE_MAX, TIGHT_SEGMENTS, VICTIM_LIVE_MAX_TIGHT};
use crate::space::relocate::{clean_segment, CleanReport};
use crate::space::victim::{budget, collectable, pick_victim};
use crate::state::Inner;

/// Why a pass cleaned: the counter its bytes go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Busy,
    Idle,
}

/// One bounded background pass: at most one victim. Returns None when there
/// is nothing worth cleaning.
pub(crate) fn background_pass(inner: &Inner) -> Result<Option<CleanReport>> {
    pass(inner, Reason::Busy)
}

/// One pass while clients are idle (see [`GcPolicy`]).
pub(crate) fn idle_pass(inner: &Inner) -> Result<Option<CleanReport>> {
    pass(inner, Reason::Idle)
}

/// Cleans one victim when [`GcPolicy`] says so for `reason` (any victim
/// below the tight limit when free segments run short).
fn pass(inner: &Inner, reason: Reason) -> Result<Option<CleanReport>> {
    let _one = inner.cleaner_lock.lock();
    let (dead, total) = collectable(inner);
    let b = budget(inner, total);
    let (start, max_live) = match reason {
        Reason::Busy => (b, 1.0 - b),
        Reason::Idle => (b / 2.0, IDLE_VICTIM_LIVE_MAX),
    };
    let tight = {
        let log = inner.log.lock();
        log.table.available() < TIGHT_SEGMENTS
    };
    let max_live = if tight {
        VICTIM_LIVE_MAX_TIGHT
    } else if total > 0 && dead > 0 && dead as f64 > start * total as f64 {
        max_live
    } else {
        return Ok(None);
    };
    // Short of free segments, every dead byte counts (several tails may
    // add up to a segment); otherwise a victim must hold more than a tail.
    let Some(v) = pick_victim(inner, max_live, u64::MAX, &[], !tight) else {
        return Ok(None);
    };
    let rep = clean_segment(inner, v)?;
    let counter = match (tight, reason) {
        (true, _) => Counter::CleanerSpaceBytes,
        (false, Reason::Busy) => Counter::CleanerOverBudgetBytes,
        (false, Reason::Idle) => Counter::CleanerIdleBytes,
    };
    inner.counters.add(counter, rep.bytes_written);
    Ok(Some(rep))
}
