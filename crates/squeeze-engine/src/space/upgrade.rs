//! The upgrade of bytes written below the target codec (the adaptive
//! write path's fast codec, `pipeline::adapt`) and the compaction behind
//! `squeeze compact`: both rewrite whole segments through relocation
//! (`space::relocate`) under the cleaner's lock, then clear the segment's
//! note of bytes below the target (and counts what of it the ladder's raw
//! rung had stored raw: `Counter::BurstRawUpgradedBytes`).

use crate::counters::Counter;
use crate::error::{EngineError, Result};
use crate::meta::checkpoint;
use crate::space::relocate::{clean_segment, rewrite_segment, CleanReport, Rewrite};
use crate::space::victim::{pick_victim, sealed};
use crate::space::SegmentId;
use crate::state::Inner;

/// Rewrites the live records of sealed segment `s` with the target (all
/// of them, or with `!all` those of a codec below the target's; the
/// segment is then freed), and clears its note of bytes below the target
/// whatever came of it: a segment is tried once, and what stays in it (a
/// corrupt record, no room) is not retried.
fn upgrade_segment(inner: &Inner, s: SegmentId, all: bool) -> Result<CleanReport> {
    // Read first: the relocation empties the segment, which drops its notes.
    let burst = inner.state.read().usage.burst_raw(s);
    let r = rewrite_segment(
        inner,
        s,
        Rewrite::Upgrade {
            all,
            keep_others: false,
        },
    );
    inner.state.write().usage.clear_below_target(s);
    if r.is_ok() {
        inner.counters.add(Counter::BurstRawUpgradedBytes, burst);
    }
    r
}

/// One step of the idle upgrade: the sealed segment holding the most bytes
/// written below the target is rewritten with the target (every live
/// record of it). None when no sealed segment holds any. A segment is tried
/// once: whatever stays in it (a corrupt record, no room) is not retried.
pub(crate) fn upgrade_pass(inner: &Inner) -> Result<Option<CleanReport>> {
    let _one = inner.cleaner_lock.lock();
    let (segs, _) = sealed(inner);
    let best = {
        let st = inner.state.read();
        segs.iter()
            .map(|&(s, ..)| (s, st.usage.below_target(s)))
            .filter(|&(_, b)| b > 0)
            .max_by_key(|&(_, b)| b)
    };
    let Some((s, _)) = best else {
        return Ok(None);
    };
    upgrade_segment(inner, s, true).map(Some)
}

/// Upgrades what was written below the target (see [`compact`]), then
/// cleans every segment sealed before the call that holds any dead byte,
/// upgrades the records of a codec below the target's in the head segment
/// (that of the call's start and the current one), then checkpoints so the
/// victims are freed. `progress(done, total)`.
pub(crate) fn compact(inner: &Inner, mut progress: impl FnMut(u64, u64)) -> Result<CleanReport> {
    let _one = inner.cleaner_lock.lock();
    let (start_seq, head_at_start) = {
        let log = inner.log.lock();
        (log.next_seq, log.head_segment)
    };
    let mut rep = CleanReport::default();
    let total = sealed(inner).0.len() as u64;
    // Each victim once: one holding a corrupt record keeps it (and stays).
    let mut done = Vec::new();
    // First the upgrade of what was written below the target: the segments
    // known to hold such bytes, and when the counters say some were never
    // upgraded (a reopened volume knows no segment), every segment with a
    // record of a codec below the target's.
    let by_codec =
        inner.counters.get(Counter::BelowTargetBytes) > inner.counters.get(Counter::UpgradedBytes);
    for (s, _, _, sectors) in sealed(inner).0 {
        let flagged = inner.state.read().usage.below_target(s) > 0;
        if sectors == 0 || !(flagged || by_codec) {
            continue;
        }
        let r = match upgrade_segment(inner, s, flagged) {
            // No room for the rewrite: the cleaning below makes some.
            Err(EngineError::NoSpace(_)) => break,
            r => r?,
        };
        if r.records_moved > 0 {
            rep.add(&r);
            done.push(s);
            progress(rep.victims, total);
        }
    }
    while let Some(v) = pick_victim(inner, 1.0 - 1e-9, start_seq, &done, false) {
        let r = match clean_segment(inner, v) {
            // The victims cleaned so far, and segments trimmed empty, keep
            // their room until two checkpoints free them (see `make_room`):
            // on a nearly full volume, free them and go on.
            Err(EngineError::NoSpace(_)) if checkpoint::reclaimable(inner) => {
                checkpoint::write(inner, false)?;
                checkpoint::write(inner, false)?;
                clean_segment(inner, v)?
            }
            r => r?,
        };
        rep.add(&r);
        done.push(v);
        progress(rep.victims, total);
    }
    // The head segment of the call's start was no victim (the log was
    // still filling it; the relocations may have sealed it since), nor is
    // the head now: their records of a codec below the target's are
    // upgraded where they are (a head's copies go to the head itself, and
    // the walk passes over them: their codec is the target's). A note is
    // cleared unless a client wrote below the target meanwhile.
    for step in 0..2 {
        let s = match step {
            0 => head_at_start,
            _ => inner.log.lock().head_segment,
        };
        let below = inner.state.read().usage.below_target(s);
        if done.contains(&s) || !(below > 0 || by_codec) {
            continue;
        }
        done.push(s);
        // The head keeps what is at the target; a sealed one is rewritten
        // whole (and freed).
        let keep_others = s == inner.log.lock().head_segment;
        let burst = inner.state.read().usage.burst_raw(s);
        let mode = Rewrite::Upgrade {
            all: false,
            keep_others,
        };
        match rewrite_segment(inner, s, mode) {
            // No room: the segment keeps its bytes as they are.
            Err(EngineError::NoSpace(_)) => {}
            r => {
                let r = r?;
                let mut st = inner.state.write();
                if st.usage.below_target(s) == below {
                    st.usage.clear_below_target(s);
                }
                inner.counters.add(Counter::BurstRawUpgradedBytes, burst);
                if r.records_moved > 0 {
                    rep.add(&r);
                }
            }
        }
    }
    // Two checkpoints free every victim (see `make_room`). The first is a
    // base where there is room for one, so that the chain left is the map
    // as it now is, not the base before plus deltas of every sector moved.
    checkpoint::write_base_if_room(inner)?;
    checkpoint::write(inner, false)?;
    Ok(rep)
}
