//! Concurrency primitives of the volume:
//! - [`RangeLocks`]: writers to overlapping sector ranges take turns, so the
//!   log order of their records equals the order they reach the map (replay
//!   then rebuilds exactly the map clients saw).
//! - [`Tickets`]: every log append holds a ticket until its records are
//!   written and installed in the map; a flush waits for all tickets issued
//!   before it, then syncs, so everything acknowledged before the flush is
//!   durable when it returns.

use parking_lot::{Condvar, Mutex};
use std::collections::BTreeSet;

#[derive(Default)]
pub struct RangeLocks {
    held: Mutex<Vec<(u64, u64)>>,
    cv: Condvar,
}

pub struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    range: (u64, u64),
}

impl RangeLocks {
    /// Locks sectors `[start, end)`, waiting for overlapping holders.
    pub fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let mut held = self.held.lock();
        while held.iter().any(|&(s, e)| s < end && start < e) {
            self.cv.wait(&mut held);
        }
        held.push((start, end));
        RangeGuard {
            locks: self,
            range: (start, end),
        }
    }

    /// Locks sectors `[start, end)` if no holder overlaps them, without
    /// waiting: for a holder of another range (inline dedup's source run),
    /// which must never wait for a second range while it holds one.
    pub fn try_lock(&self, start: u64, end: u64) -> Option<RangeGuard<'_>> {
        let mut held = self.held.lock();
        if held.iter().any(|&(s, e)| s < end && start < e) {
            return None;
        }
        held.push((start, end));
        Some(RangeGuard {
            locks: self,
            range: (start, end),
        })
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock();
        let i = held
            .iter()
            .position(|r| *r == self.range)
            .expect("range guard not held");
        held.swap_remove(i);
        self.locks.cv.notify_all();
    }
}

#[derive(Default)]
struct TicketState {
    next: u64,
    outstanding: BTreeSet<u64>,
}

#[derive(Default)]
pub struct Tickets {
    state: Mutex<TicketState>,
    cv: Condvar,
}

impl Tickets {
    /// Issues a ticket (call while holding the log lock, so ticket order is
    /// log order).
    pub fn issue(&self) -> u64 {
        let mut s = self.state.lock();
        let t = s.next;
        s.next += 1;
        s.outstanding.insert(t);
        t
    }

    pub fn complete(&self, t: u64) {
        let mut s = self.state.lock();
        assert!(s.outstanding.remove(&t), "ticket completed twice");
        self.cv.notify_all();
    }

    /// The next ticket to be issued.
    pub fn issued(&self) -> u64 {
        self.state.lock().next
    }

    /// Waits until every ticket below `t` has completed.
    pub fn wait_below(&self, t: u64) {
        let mut s = self.state.lock();
        while s.outstanding.first().is_some_and(|&o| o < t) {
            self.cv.wait(&mut s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn overlapping_ranges_serialize() {
        let l = Arc::new(RangeLocks::default());
        let g = l.lock(0, 10);
        let l2 = l.clone();
        let h = std::thread::spawn(move || {
            let _g = l2.lock(5, 6);
        });
        let _other = l.lock(10, 20); // disjoint: no wait
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!h.is_finished());
        drop(g);
        h.join().unwrap();
    }

    #[test]
    fn try_lock_never_waits() {
        let l = RangeLocks::default();
        let g = l.lock(10, 20);
        assert!(l.try_lock(15, 25).is_none());
        let h = l.try_lock(20, 30).expect("disjoint");
        drop(g);
        assert!(l.try_lock(0, 20).is_some());
        drop(h);
    }

    #[test]
    fn tickets_wait() {
        let t = Arc::new(Tickets::default());
        let a = t.issue();
        let b = t.issue();
        t.complete(b);
        let t2 = t.clone();
        let h = std::thread::spawn(move || t2.wait_below(2));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!h.is_finished());
        t.complete(a);
        h.join().unwrap();
    }
}
