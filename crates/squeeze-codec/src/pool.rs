//! `CpuPool`, the default [`CompressEngine`]: worker threads named
//! `sqz-compress-N`, each with its own cached [`Compressor`] per
//! [`Algorithm`], fed one job per task through a bounded crossbeam channel.
//!
//! Invariants:
//! - At most `threads * TASKS_IN_FLIGHT_PER_THREAD` jobs are queued;
//!   `submit` blocks while the queue is full (the limit on work in flight).
//! - A batch's jobs spread over all workers; each worker writes its job's
//!   own result slot, then decrements the batch's `remaining` counter; the
//!   worker that brings it to zero collects the slots in job order and
//!   calls `done` — exactly once.
//! - A codec error or panic inside a job becomes `TooBig` (store raw) and is
//!   counted in [`CpuPool::failed_jobs`]; it never loses a batch.
//! - Dropping the pool closes the queue, lets the workers finish every job
//!   already queued (so every `done` still runs) and joins them.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::engine::run_job;
use crate::{try_new_compressor, Algorithm, CompressEngine, Compressor, Job, JobOutput, JobResult};

/// Queue depth per worker thread (4 * 32: enough to keep every worker busy
/// across batch boundaries without unbounded memory).
pub const TASKS_IN_FLIGHT_PER_THREAD: usize = 4 * 32;

type Done = Box<dyn FnOnce(Vec<JobResult>) + Send>;

struct Batch {
    alg: Algorithm,
    jobs: Vec<Job>,
    results: Vec<Mutex<Option<JobResult>>>,
    remaining: AtomicUsize,
    done: Mutex<Option<Done>>,
}

struct Task {
    batch: Arc<Batch>,
    index: usize,
}

#[derive(Default)]
struct Counters {
    failed_jobs: AtomicU64,
    done_panics: AtomicU64,
}

/// A pool of compression worker threads.
pub struct CpuPool {
    tx: Option<Sender<Task>>,
    workers: Vec<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl CpuPool {
    /// A pool of `threads` workers; 0 means one per available CPU.
    ///
    /// # Panics
    /// If the OS refuses to spawn a thread.
    pub fn new(threads: usize) -> Self {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let (tx, rx) = crossbeam_channel::bounded(threads * TASKS_IN_FLIGHT_PER_THREAD);
        let counters = Arc::new(Counters::default());
        let workers = (0..threads)
            .map(|n| {
                let rx: Receiver<Task> = rx.clone();
                let counters = Arc::clone(&counters);
                std::thread::Builder::new()
                    .name(format!("sqz-compress-{n}"))
                    .spawn(move || worker(rx, counters))
                    .expect("spawn a compression worker")
            })
            .collect();
        CpuPool {
            tx: Some(tx),
            workers,
            counters,
        }
    }

    /// Jobs that ended `TooBig` because their codec failed or panicked.
    pub fn failed_jobs(&self) -> u64 {
        self.counters.failed_jobs.load(Ordering::Relaxed)
    }

    /// `done` callbacks that panicked (the worker survived).
    pub fn done_panics(&self) -> u64 {
        self.counters.done_panics.load(Ordering::Relaxed)
    }
}

impl Default for CpuPool {
    /// One worker per available CPU.
    fn default() -> Self {
        CpuPool::new(0)
    }
}

impl CompressEngine for CpuPool {
    fn name(&self) -> &str {
        "cpu-pool"
    }

    fn threads(&self) -> usize {
        self.workers.len()
    }

    fn submit(&self, alg: Algorithm, jobs: Vec<Job>, done: Done) {
        for (i, job) in jobs.iter().enumerate() {
            assert!(
                job.is_valid(),
                "job {i}: range {:?} outside input of {} bytes",
                job.range,
                job.input.len()
            );
        }
        if jobs.is_empty() {
            done(Vec::new());
            return;
        }
        let n = jobs.len();
        let batch = Arc::new(Batch {
            alg,
            results: (0..n).map(|_| Mutex::new(None)).collect(),
            remaining: AtomicUsize::new(n),
            jobs,
            done: Mutex::new(Some(done)),
        });
        let tx = self.tx.as_ref().expect("sender lives until drop");
        for index in 0..n {
            tx.send(Task {
                batch: Arc::clone(&batch),
                index,
            })
            .expect("workers live until the pool is dropped");
        }
    }
}

impl Drop for CpuPool {
    fn drop(&mut self) {
        drop(self.tx.take());
        for w in self.workers.drain(..) {
            // A worker only ends by panicking outside the guarded sections,
            // which would be a bug in this module; nothing to recover here.
            let _ = w.join();
        }
    }
}

/// One worker: compress tasks until the queue is closed and empty.
fn worker(rx: Receiver<Task>, counters: Arc<Counters>) {
    let mut compressors: HashMap<Algorithm, Box<dyn Compressor>> = HashMap::new();
    let mut scratch = Vec::new();
    for Task { batch, index } in rx {
        let job = &batch.jobs[index];
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let compressor = match compressors.entry(batch.alg) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => match try_new_compressor(batch.alg)
                {
                    Ok(c) => e.insert(c),
                    Err(_) => return None,
                },
            };
            let (output, cpu_ns) = run_job(compressor.as_mut(), job, &mut scratch);
            output.ok().map(|output| JobResult { output, cpu_ns })
        }));
        let result = match outcome {
            Ok(Some(result)) => result,
            Ok(None) | Err(_) => {
                counters.failed_jobs.fetch_add(1, Ordering::Relaxed);
                if outcome.is_err() {
                    // A panicking codec may have left its context broken.
                    compressors.remove(&batch.alg);
                }
                JobResult {
                    output: JobOutput::TooBig,
                    cpu_ns: 0,
                }
            }
        };
        *lock(&batch.results[index]) = Some(result);
        // AcqRel: the last finisher sees every other worker's result slot.
        if batch.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let results = batch
                .results
                .iter()
                .map(|slot| lock(slot).take().expect("every job stored its result"))
                .collect();
            let done = lock(&batch.done).take().expect("done is called once");
            if catch_unwind(AssertUnwindSafe(|| done(results))).is_err() {
                counters.done_panics.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Locks a mutex, ignoring poisoning (the guarded data is a plain slot).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
