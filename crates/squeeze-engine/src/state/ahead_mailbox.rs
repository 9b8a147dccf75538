//! The mailbox between the log reservation (`append`, which posts) and the
//! allocator thread (`space::ahead`, which takes): a part of `Inner` below
//! it, holding one request at a time.
//!
//! Invariant: at most one request is pending (the poster checks
//! `LogState::ahead_pending` under the log lock before it posts).

use crate::space::SegmentId;
use parking_lot::{Condvar, Mutex};

/// One allocation for the thread: `[from, to)` in `segment`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub segment: SegmentId,
    pub from: u64,
    pub to: u64,
}

#[derive(Default)]
struct Slot {
    next: Option<Request>,
    stop: bool,
}

/// The mailbox between `reserve` and the allocator thread.
#[derive(Default)]
pub struct Ahead {
    slot: Mutex<Slot>,
    cv: Condvar,
    /// When a flush last gave the allocation back.
    released_at: Mutex<Option<std::time::Instant>>,
}

impl Ahead {
    pub(crate) fn post(&self, r: Request) {
        self.slot.lock().next = Some(r);
        self.cv.notify_one();
    }

    /// Ends the thread after the allocation it is doing.
    pub fn stop(&self) {
        self.slot.lock().stop = true;
        self.cv.notify_one();
    }

    /// The next request, waiting for one; None once stopped.
    pub(crate) fn next(&self) -> Option<Request> {
        let mut s = self.slot.lock();
        loop {
            if s.stop {
                return None;
            }
            if let Some(r) = s.next.take() {
                return Some(r);
            }
            self.cv.wait(&mut s);
        }
    }

    /// True (and the time noted) unless a release was noted in the last
    /// `every`.
    pub(crate) fn release_due(&self, every: std::time::Duration) -> bool {
        let mut at = self.released_at.lock();
        if at.is_some_and(|t| t.elapsed() < every) {
            return false;
        }
        *at = Some(std::time::Instant::now());
        true
    }
}
