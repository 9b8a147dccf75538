//! The idle squeeze ("squeeze harder when idle"): while clients are idle,
//! the sealed segment holding the most compressed bytes not yet squeezed
//! (`Usage::unsqueezed`) has every live record rewritten with the policy's
//! idle algorithm (`ActivePolicy::idle_algorithm`: the target's codec at a
//! higher level, e.g. zstd:9 over zstd:3) through relocation
//! (`space::relocate`, `Rewrite::Squeeze`), and is freed. Clients write at
//! the target's speed; their cold data ends at the idle level, whose frames
//! decode as fast (zstd's decoder does not slow with the level), so reads
//! pay nothing for it. It recovers what independent read chunks
//! (`Policy::read_chunk`) cost the ratio (docs/benchmarks.md, "W3 after
//! idle").
//!
//! A segment is tried once: its note is cleared whatever came of it (a
//! corrupt record stays, no room: not retried). The notes are in memory
//! only: what was written before a reopen keeps its level.

use crate::error::Result;
use crate::space::relocate::{rewrite_segment, CleanReport, Rewrite};
use crate::space::victim::sealed;
use crate::state::Inner;

/// One step of the idle squeeze: the sealed segment with the most bytes not
/// yet squeezed is rewritten with the idle algorithm. None when the policy
/// has no idle algorithm or no sealed segment holds such bytes.
pub(crate) fn squeeze_pass(inner: &Inner) -> Result<Option<CleanReport>> {
    if inner.policy.read().idle_algorithm().is_none() {
        return Ok(None);
    }
    let _one = inner.cleaner_lock.lock();
    let (segs, _) = sealed(inner);
    let best = {
        let st = inner.state.read();
        segs.iter()
            .map(|&(s, ..)| (s, st.usage.unsqueezed(s)))
            .filter(|&(_, b)| b > 0)
            .max_by_key(|&(_, b)| b)
    };
    let Some((s, _)) = best else {
        return Ok(None);
    };
    let r = rewrite_segment(inner, s, Rewrite::Squeeze);
    inner.state.write().usage.clear_unsqueezed(s);
    r.map(Some)
}
