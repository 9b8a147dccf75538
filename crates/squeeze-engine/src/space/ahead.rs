//! Allocation ahead of the log head.
//!
//! Records are placed only in backing-file space that is already allocated
//! (fallocated), so a full disk is a clean `NoSpace` at reservation time and
//! never a failed write of an acknowledged record. The head segment is
//! allocated ALLOC_STEP at a time as the log grows.
//!
//! When the writer that crossed the allocated end did that allocation
//! itself, under the log lock, it stalled every writer: on ext4 a fallocate
//! that extends the file waits for the direct writes in flight
//! (`inode_dio_wait`), about 0.3 ms here, while the other writers queued on
//! the log lock and the compression workers ran dry (perf sched: a third of
//! the CPU idle time of an engine write, docs/benchmarks-history.md). So a volume
//! opened with background threads keeps the head segment allocated up to
//! ALLOC_AHEAD past the head from a thread of its own, `sqz-allocate`:
//! `reserve` posts a request once less than half of that is left, and the
//! writers only allocate themselves when they outrun the thread. The writer
//! that opens a new head segment allocates its first ALLOC_AHEAD/2 in one
//! call (rather than racing the thread through the first steps), or only
//! what its records need if that much does not fit.
//!
//! Measured with `squeeze bench` (fio-like data, 2 cores, alternating
//! runs): the CPU utilisation of the engine write rose from 0.84-0.89 to
//! 0.90-0.96, and the write from 71-79% to 82-94% of raw compress.
//!
//! The allocation past the head is given back when the writing stops, as
//! XFS trims its speculative preallocation when a file is closed: after a
//! client's flush (at most once a second, `RELEASE_EVERY`), when clients
//! idle, and on close, the head segment keeps only the step its head is in
//! (`release`). So `du` of a volume that went quiet counts its records, not
//! ALLOC_AHEAD of reservation (the harness measures right after the
//! client's final flush).
//!
//! Invariants:
//! - `allocated_end` grows only after the fallocate of the bytes below it
//!   succeeded; it shrinks only by `release`, with no request pending, after
//!   the punch of the bytes above it.
//! - At most one request is pending (`LogState::ahead_pending`).
//! - A request whose segment is no longer the head when it completes
//!   changes nothing (the bytes it allocated in that segment's tail are
//!   freed with the segment).
//! - A failed request (ENOSPC) disables allocation ahead for that segment;
//!   the writers then allocate themselves and report the error. Any other
//!   error from the file turns the volume read-only, and so does a failed
//!   punch in `release`.
//! - `release` punches only at or after the head, inside the head segment
//!   (`LogState::head_in_segment`, checked: a broken one turns the volume
//!   read-only instead of punching).
//!
//! The mailbox the thread takes its requests from is a part of `Inner`
//! (`state::ahead_mailbox`); this module is the thread and the release.

use crate::error::Internal;
use crate::state::ahead_mailbox::Request;
use crate::state::log_state::LogState;
use crate::state::Inner;

/// Granularity of backing-file allocation inside a log segment.
pub const ALLOC_STEP: u64 = 1 << 20;

/// How far past the head the allocator keeps the head segment allocated:
/// a default segment's whole. Each fallocate waits for the direct writes in
/// flight and holds new ones back (ext4's exclusive inode lock and
/// `inode_dio_wait`), so fewer, larger ones: at 8 MiB (sessions 12-26) the
/// W3 copy made about 330 and its writes waited behind them; at 32 MiB it
/// copied 11% faster (docs/benchmarks.md, "Adaptive codec", session 27).
pub const ALLOC_AHEAD: u64 = 32 << 20;

/// How long a release waits for the allocator's pending request (one
/// fallocate: about 0.3 ms here).
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A flush gives back the allocation ahead at most this often.
pub const RELEASE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Called by `reserve` with the log lock held, after it placed its records:
/// posts a request if the head segment has less than half of ALLOC_AHEAD
/// allocated past the head.
pub(crate) fn maybe_request(inner: &Inner, log: &mut LogState) {
    if log.ahead_pending || log.ahead_failed == Some(log.head_segment) {
        return;
    }
    let seg_end = inner.segment_end(log.head_segment);
    let low = (log.head_offset + ALLOC_AHEAD / 2).min(seg_end);
    if log.allocated_end >= low {
        return;
    }
    let to = (log.head_offset + ALLOC_AHEAD)
        .div_ceil(ALLOC_STEP)
        .saturating_mul(ALLOC_STEP)
        .min(seg_end);
    log.ahead_pending = true;
    inner.ahead.post(Request {
        segment: log.head_segment,
        from: log.allocated_end,
        to,
    });
}

/// The allocator thread's loop; returns after `Ahead::stop`.
pub(crate) fn run(inner: &Inner) {
    while let Some(r) = inner.ahead.next() {
        let res = inner.storage.allocate(r.from, r.to - r.from);
        let mut log = inner.log.lock();
        log.ahead_pending = false;
        match res {
            Ok(()) => {
                if log.head_segment == r.segment && log.allocated_end >= r.from {
                    log.allocated_end = log.allocated_end.max(r.to);
                }
            }
            Err(e) => {
                log.ahead_failed = Some(r.segment);
                drop(log);
                if crate::error::EngineError::is_enospc(&e) {
                    tracing::debug!(
                        segment = r.segment,
                        "allocating ahead of the log head failed ({e}); writers allocate themselves"
                    );
                } else {
                    // Not a full disk: nothing was placed in these bytes, but
                    // the file answered something nobody planned for.
                    inner.storage_failed(e);
                }
            }
        }
    }
}

/// Gives back the head segment's allocation past the ALLOC_STEP boundary
/// after the head. A pending request is waited for first (its completion
/// would claim the punched bytes again), up to RELEASE_WAIT; after that the
/// release is skipped. Returns the bytes given back.
pub(crate) fn release(inner: &Inner) -> std::io::Result<u64> {
    let deadline = std::time::Instant::now() + RELEASE_WAIT;
    let mut log = inner.log.lock();
    while log.ahead_pending {
        if std::time::Instant::now() >= deadline {
            return Ok(0);
        }
        drop(log);
        std::thread::sleep(std::time::Duration::from_millis(1));
        log = inner.log.lock();
    }
    // Records lie below the head, in the head segment: the punch must start
    // at or after the head and end inside that segment (a head outside its
    // segment once made this punch the records replay had just found).
    if !log.head_in_segment(inner.seg_size) {
        let why = Internal::AllocationOutsideSegment {
            head_offset: log.head_offset,
            allocated_end: log.allocated_end,
            segment: log.head_segment,
        };
        drop(log);
        return Err(inner.internal(why).into_io());
    }
    // `keep` is a multiple of ALLOC_STEP (so of a write-behind chunk) or the
    // segment's end; only in the first case can there be anything past it.
    let seg_end = inner.segment_end(log.head_segment);
    let keep = (log.head_offset.div_ceil(ALLOC_STEP) * ALLOC_STEP).min(seg_end);
    if log.allocated_end <= keep {
        return Ok(0);
    }
    let n = log.allocated_end - keep;
    if let Err(e) = inner.storage.punch(keep, n) {
        drop(log);
        return Err(inner.storage_failed(e).into_io());
    }
    log.allocated_end = keep;
    // Zeros pre-written past `keep` are punched out with the rest.
    log.prewritten.to = log.prewritten.to.min(keep);
    Ok(n)
}

/// After a client's flush: `release`, unless one ran in the last
/// RELEASE_EVERY (a stream of flushes would otherwise punch and allocate
/// again at every one).
pub(crate) fn release_after_flush(inner: &Inner) {
    if !inner.ahead.release_due(RELEASE_EVERY) {
        return;
    }
    if let Err(e) = release(inner) {
        // Nothing is lost (the bytes stay allocated), but a punch that fails
        // says something about the disk: at most one line a second.
        tracing::warn!("giving back the allocation ahead of the log head: {e}");
    }
}
