//! `CpuPool`, the default [`CompressEngine`]: worker threads named
//! `sqz-compress-N`, each with its own cached [`Compressor`] per
//! [`Algorithm`], fed one job per task through a bounded queue (a mutex and
//! two condition variables: idle workers sleep at once instead of spinning,
//! which on a 2-core machine shared with NBD workers costs real throughput).
//!
//! `compress_batch` (the synchronous path the engine uses) runs the first
//! job on the calling thread and hands only the rest to the workers: a
//! single-blob write (a 4 KiB random write) then costs no thread handoff.
//!
//! Invariants:
//! - At most `threads * TASKS_IN_FLIGHT_PER_THREAD` jobs are queued;
//!   `submit` blocks while the queue is full (the limit on work in flight).
//! - `backlog_bytes` = raw bytes of the jobs pushed and not yet popped
//!   (counted before the push and after the pop, so never negative).
//! - A batch's jobs spread over all workers; each worker writes its job's
//!   own result slot, then decrements the batch's `remaining` counter; the
//!   worker that brings it to zero collects the slots in job order and
//!   calls `done` — exactly once.
//! - A codec error or panic inside a job becomes `TooBig` (store raw) and is
//!   counted in [`CpuPool::failed_jobs`]; it never loses a batch.
//! - Dropping the pool closes the queue, lets the workers finish every job
//!   already queued (so every `done` still runs) and joins them.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::engine::run_job;
use crate::{
    try_new_compressor, Algorithm, CodecError, CompressEngine, Compressor, Job, JobOutput,
    JobResult,
};

/// Queue depth per worker thread (4 * 32: enough to keep every worker busy
/// across batch boundaries without unbounded memory).
pub const TASKS_IN_FLIGHT_PER_THREAD: usize = 4 * 32;

type Done = Box<dyn FnOnce(Vec<JobResult>) + Send>;

/// Makes a worker's compressor for an algorithm (which library runs it).
pub type CompressorFactory = fn(Algorithm) -> Result<Box<dyn Compressor>, CodecError>;

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
    /// Raw bytes of the queued jobs (added before a push, taken off after
    /// the pop), the engine's backlog.
    queued_bytes: AtomicU64,
}

/// A bounded multi-producer multi-consumer queue that parks idle consumers.
struct Queue<T> {
    state: Mutex<QueueState<T>>,
    not_empty: Condvar,
    not_full: Condvar,
    cap: usize,
}

struct QueueState<T> {
    items: VecDeque<T>,
    closed: bool,
}

impl<T> Queue<T> {
    fn new(cap: usize) -> Self {
        Queue {
            state: Mutex::new(QueueState {
                items: VecDeque::with_capacity(cap),
                closed: false,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            cap,
        }
    }

    /// Blocks while the queue is full.
    fn push(&self, t: T) {
        let mut s = lock(&self.state);
        while s.items.len() >= self.cap {
            s = self.not_full.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.items.push_back(t);
        drop(s);
        self.not_empty.notify_one();
    }

    /// The next item; None once closed and drained.
    fn pop(&self) -> Option<T> {
        let mut s = lock(&self.state);
        loop {
            if let Some(t) = s.items.pop_front() {
                drop(s);
                self.not_full.notify_one();
                return Some(t);
            }
            if s.closed {
                return None;
            }
            s = self.not_empty.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.not_empty.notify_all();
    }
}

/// A pool of compression worker threads.
pub struct CpuPool {
    queue: Arc<Queue<Task>>,
    workers: Vec<JoinHandle<()>>,
    counters: Arc<Counters>,
    name: &'static str,
    factory: CompressorFactory,
}

impl CpuPool {
    /// A pool of `threads` workers; 0 means one per available CPU.
    ///
    /// # Panics
    /// If the OS refuses to spawn a thread.
    pub fn new(threads: usize) -> Self {
        CpuPool::with_compressors(threads, "cpu-pool", try_new_compressor)
    }

    /// A pool of `threads` workers (0: one per CPU) whose compressors come
    /// from `factory` (e.g. ISA-L for deflate, see [`crate::isal`]), named
    /// `name` in statistics.
    ///
    /// # Panics
    /// If the OS refuses to spawn a thread.
    pub fn with_compressors(
        threads: usize,
        name: &'static str,
        factory: CompressorFactory,
    ) -> Self {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let queue = Arc::new(Queue::new(threads * TASKS_IN_FLIGHT_PER_THREAD));
        let counters = Arc::new(Counters::default());
        let workers = (0..threads)
            .map(|n| {
                let queue = Arc::clone(&queue);
                let counters = Arc::clone(&counters);
                std::thread::Builder::new()
                    .name(format!("sqz-compress-{n}"))
                    .spawn(move || worker(&queue, counters, factory))
                    .expect("spawn a compression worker")
            })
            .collect();
        CpuPool {
            queue,
            workers,
            counters,
            name,
            factory,
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
        self.name
    }

    fn threads(&self) -> usize {
        self.workers.len()
    }

    fn backlog_bytes(&self) -> u64 {
        self.counters.queued_bytes.load(Ordering::Relaxed)
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
        for index in 0..n {
            let len = batch.jobs[index].range.len() as u64;
            self.counters.queued_bytes.fetch_add(len, Ordering::Relaxed);
            self.queue.push(Task {
                batch: Arc::clone(&batch),
                index,
            });
        }
    }

    fn compress_batch(&self, alg: Algorithm, mut jobs: Vec<Job>) -> Vec<JobResult> {
        if jobs.is_empty() {
            return Vec::new();
        }
        let first = jobs.remove(0);
        assert!(first.is_valid(), "job 0: range outside its input");
        // The rest go to the workers while this thread compresses the first.
        let slot: Arc<(Mutex<Option<Vec<JobResult>>>, Condvar)> =
            Arc::new((Mutex::new(None), Condvar::new()));
        let rest = !jobs.is_empty();
        if rest {
            let slot = Arc::clone(&slot);
            self.submit(
                alg,
                jobs,
                Box::new(move |results| {
                    *lock(&slot.0) = Some(results);
                    slot.1.notify_one();
                }),
            );
        }
        let mut results = vec![self.run_inline(alg, &first)];
        if rest {
            let mut got = lock(&slot.0);
            while got.is_none() {
                got = slot.1.wait(got).unwrap_or_else(|e| e.into_inner());
            }
            results.extend(got.take().expect("results present"));
        }
        results
    }
}

/// A thread's compressors by pool kind and algorithm, and its output
/// scratch buffer.
type LocalCodecs = (
    HashMap<(&'static str, Algorithm), Box<dyn Compressor>>,
    Vec<u8>,
);

thread_local! {
    /// Compressors of threads that run jobs inline (the engine's callers).
    static LOCAL: RefCell<LocalCodecs> = RefCell::new((HashMap::new(), Vec::new()));
}

impl CpuPool {
    /// Runs one job on the calling thread with a thread-local compressor.
    fn run_inline(&self, alg: Algorithm, job: &Job) -> JobResult {
        let outcome = LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            let (compressors, scratch) = &mut *l;
            let r = catch_unwind(AssertUnwindSafe(|| {
                let c = match compressors.entry((self.name, alg)) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => match (self.factory)(alg) {
                        Ok(c) => e.insert(c),
                        Err(_) => return None,
                    },
                };
                run_job(c.as_mut(), job, scratch).ok()
            }));
            if r.is_err() {
                compressors.remove(&(self.name, alg));
            }
            r
        });
        match outcome {
            Ok(Some(r)) => r,
            _ => {
                self.counters.failed_jobs.fetch_add(1, Ordering::Relaxed);
                JobResult {
                    output: JobOutput::TooBig,
                    cpu_ns: 0,
                    output_crc32c: None,
                    block: false,
                }
            }
        }
    }
}

impl Drop for CpuPool {
    fn drop(&mut self) {
        self.queue.close();
        for w in self.workers.drain(..) {
            // A worker only ends by panicking outside the guarded sections,
            // which would be a bug in this module; nothing to recover here.
            let _ = w.join();
        }
    }
}

/// One worker: compress tasks until the queue is closed and empty.
fn worker(queue: &Queue<Task>, counters: Arc<Counters>, factory: CompressorFactory) {
    let mut compressors: HashMap<Algorithm, Box<dyn Compressor>> = HashMap::new();
    let mut scratch = Vec::new();
    while let Some(Task { batch, index }) = queue.pop() {
        let job = &batch.jobs[index];
        counters
            .queued_bytes
            .fetch_sub(job.range.len() as u64, Ordering::Relaxed);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let compressor = match compressors.entry(batch.alg) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => match factory(batch.alg) {
                    Ok(c) => e.insert(c),
                    Err(_) => return None,
                },
            };
            run_job(compressor.as_mut(), job, &mut scratch).ok()
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
                    output_crc32c: None,
                    block: false,
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
