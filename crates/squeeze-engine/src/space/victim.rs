//! Victim choice: the garbage the sealed log segments hold, the budget in
//! force (the [`GcPolicy`]'s, shrunk when free room is short) and the best
//! victim by cost-benefit (`(1 - u) * age / (1 + u)` with `u` the live
//! fraction, as in LFS). Reads the segment table and the usage; changes
//! nothing.

#[cfg(doc)]
use crate::space::gc_policy::GcPolicy;
use crate::space::gc_policy::GARBAGE_BUDGET_MIN;
use crate::space::{SegState, SegmentId};
use crate::state::Inner;

/// The budget in force: the policy's, or less when free room is short.
pub(crate) fn budget(inner: &Inner, sealed_total: u64) -> f64 {
    let want = inner.gc.garbage_budget;
    if sealed_total == 0 {
        return want;
    }
    let available = inner.log.lock().table.available() * inner.seg_size;
    let room = match inner.storage.free_bytes() {
        Ok(Some(fs_free)) => available.min(fs_free),
        _ => available,
    };
    want.min(room as f64 / sealed_total as f64)
        .max(GARBAGE_BUDGET_MIN)
}

/// Sealed log segments: (id, opened_seq, live bytes, live sectors), with the
/// log's next seq.
pub(crate) fn sealed(inner: &Inner) -> (Vec<(SegmentId, u64, u64, u64)>, u64) {
    let log = inner.log.lock();
    let head_seq = log.head_seq();
    let st = inner.state.read();
    let v = log
        .table
        .iter()
        .filter_map(|(s, state)| match state {
            SegState::Log { opened_seq } if opened_seq < head_seq => {
                let u = st.usage.get(s);
                Some((s, opened_seq, u.live_bytes, u.live_sectors))
            }
            _ => None,
        })
        .collect();
    (v, log.next_seq)
}

/// Dead bytes in sealed log segments, and their total size.
pub(crate) fn garbage(inner: &Inner) -> (u64, u64) {
    dead_and_total(inner, false)
}

/// As [`garbage`], over the sealed segments that still hold live data: an
/// empty one waits for a checkpoint to free it (the maintenance thread
/// batches those), and cleaning another segment would not free it sooner.
pub(crate) fn collectable(inner: &Inner) -> (u64, u64) {
    dead_and_total(inner, true)
}

fn dead_and_total(inner: &Inner, holding_only: bool) -> (u64, u64) {
    let (segs, _) = sealed(inner);
    let (n, live) = segs
        .iter()
        .filter(|s| !holding_only || s.3 > 0)
        .fold((0u64, 0u64), |(n, live), s| (n + 1, live + s.2));
    let total = n * inner.seg_size;
    (total.saturating_sub(live), total)
}

/// The largest record the log holds (a max-size blob stored raw, with its
/// header): a sealed segment's unused tail is always shorter, since the
/// next record did not fit there.
fn max_record_len() -> u64 {
    squeeze_format::align_record(
        (squeeze_format::RECORD_HEADER_SIZE
            + squeeze_format::MAX_BLOB_SECTORS as usize * squeeze_format::SECTOR_SIZE)
            as u64,
    )
}

/// The best victim by cost-benefit among sealed segments opened before
/// `opened_before`, holding live data below `max_live` of a segment and,
/// with `tail_is_not_garbage`, more dead bytes than the longest record:
/// a segment's bytes that are not live include the tail no record fitted
/// in, and a segment full of 128 KiB raw blobs is only 75% live in 512 KiB
/// segments; cleaning it writes the same blobs into a new segment as full,
/// again and again, for nothing (issue 16).
pub(crate) fn pick_victim(
    inner: &Inner,
    max_live: f64,
    opened_before: u64,
    exclude: &[SegmentId],
    tail_is_not_garbage: bool,
) -> Option<SegmentId> {
    let (segs, next_seq) = sealed(inner);
    let min_dead = if tail_is_not_garbage {
        max_record_len()
    } else {
        0
    };
    segs.into_iter()
        .filter(|&(s, opened, live, sectors)| {
            sectors > 0
                && opened < opened_before
                && (live as f64) < max_live * inner.seg_size as f64
                && inner.seg_size.saturating_sub(live) > min_dead
                && !exclude.contains(&s)
        })
        .map(|(s, opened, live, _)| {
            let u = live as f64 / inner.seg_size as f64;
            let age = (next_seq - opened) as f64;
            (s, (1.0 - u) * age / (1.0 + u))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(s, _)| s)
}
