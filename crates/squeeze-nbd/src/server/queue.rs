//! The workers' job queue, shared by every connection of a server.
//!
//! Place in the data path: a connection's reader (`transmission.rs`)
//! pushes validated requests; the worker threads pop and run them.
//! Invariants: at most `write_slots` jobs that are writes run at once (a
//! write popped holds a slot until `write_done`); a worker passes over
//! queued writes while the slots are full and takes the first other job;
//! after `close` nothing more is queued, what is queued is still handed
//! out, then `pop` returns `None`.

use std::collections::VecDeque;

use parking_lot::{Condvar, Mutex};

/// The workers' job queue: unbounded (each connection bounds what it
/// dispatches), and idle workers sleep on a condition variable at once
/// rather than spinning, which on a small machine would take CPU from the
/// engine's compression. At most `write_slots` WRITE requests run at once
/// (CPU-bound in a compressing device, which says how many it wants in
/// `BlockDevice::max_concurrent_writes`); a worker skips queued writes
/// while the slots are all taken and runs the first other request, so
/// reads keep the device busy.
pub(crate) struct JobQueue<J> {
    state: Mutex<QueueState<J>>,
    ready: Condvar,
    write_slots: usize,
}

struct QueueState<J> {
    jobs: VecDeque<J>,
    closed: bool,
    writes_running: usize,
}

/// What the queue needs to know of a job.
pub(crate) trait Queued {
    fn is_write(&self) -> bool;
}

impl<J: Queued> JobQueue<J> {
    pub(crate) fn new(write_slots: usize) -> JobQueue<J> {
        JobQueue {
            state: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                closed: false,
                writes_running: 0,
            }),
            ready: Condvar::new(),
            write_slots: write_slots.max(1),
        }
    }

    /// Writes that may run at once.
    pub(crate) fn write_slots(&self) -> usize {
        self.write_slots
    }

    /// Queues a job; gives it back if the queue is closed.
    pub(crate) fn push(&self, job: J) -> Result<(), J> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(job);
        }
        // A write that must wait for a slot wakes nobody: `write_done` will.
        let runnable = !job.is_write() || s.writes_running < self.write_slots;
        s.jobs.push_back(job);
        drop(s);
        if runnable {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// The next job that may run; None once closed and drained. A write
    /// taken here holds a slot until `write_done`.
    pub(crate) fn pop(&self) -> Option<J> {
        let mut s = self.state.lock();
        loop {
            let writes_full = s.writes_running >= self.write_slots;
            let next = if writes_full {
                s.jobs.iter().position(|j| !j.is_write())
            } else if s.jobs.is_empty() {
                None
            } else {
                Some(0)
            };
            if let Some(i) = next {
                let j = s.jobs.remove(i).expect("index in range");
                if j.is_write() {
                    s.writes_running += 1;
                }
                if s.closed && s.jobs.is_empty() {
                    // Drained: workers asleep behind a full write slot
                    // must wake to see that and exit.
                    self.ready.notify_all();
                }
                return Some(j);
            }
            if s.closed && s.jobs.is_empty() {
                return None;
            }
            self.ready.wait(&mut s);
        }
    }

    /// A write taken by `pop` has finished: its slot is free.
    pub(crate) fn write_done(&self) {
        let mut s = self.state.lock();
        s.writes_running -= 1;
        let waiting = !s.jobs.is_empty();
        drop(s);
        // Idle workers are alike: one of them takes the queued write now
        // allowed (waking all of them for each write costs CPU).
        if waiting {
            self.ready.notify_one();
        }
    }

    pub(crate) fn close(&self) {
        self.state.lock().closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::{JobQueue, Queued};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[derive(Debug, PartialEq)]
    struct T(&'static str, bool);
    impl Queued for T {
        fn is_write(&self) -> bool {
            self.1
        }
    }

    #[test]
    fn reads_pass_writes_waiting_for_a_slot() {
        let q = JobQueue::new(1);
        for j in [T("w1", true), T("w2", true), T("r1", false), T("w3", true)] {
            q.push(j).unwrap();
        }
        assert_eq!(q.pop(), Some(T("w1", true)));
        // The one write slot is taken: the read behind w2 goes first.
        assert_eq!(q.pop(), Some(T("r1", false)));
        q.write_done();
        assert_eq!(q.pop(), Some(T("w2", true)));
        q.write_done();
        q.close();
        assert_eq!(q.pop(), Some(T("w3", true)), "closing drains the queue");
        q.write_done();
        assert_eq!(q.pop(), None);
        assert!(q.push(T("late", false)).is_err());
    }

    /// Many workers, many writes and reads: every job runs once, never more
    /// than the slots' worth of writes at a time, and nobody sleeps through
    /// a freed slot (the test would hang).
    #[test]
    fn workers_never_exceed_the_write_slots_nor_stall() {
        let q = Arc::new(JobQueue::<T>::new(2));
        let running = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (q, running, ran) = (q.clone(), running.clone(), ran.clone());
                std::thread::spawn(move || {
                    while let Some(j) = q.pop() {
                        if j.is_write() {
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= 2, "{now} writes at once");
                            std::thread::yield_now();
                            running.fetch_sub(1, Ordering::SeqCst);
                            q.write_done();
                        }
                        ran.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for i in 0..20_000 {
            q.push(T("j", i % 3 != 0)).unwrap();
        }
        q.close();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 20_000);
    }
}
