//! The batch compression engine interface (DESIGN principle 7): the write
//! pipeline hands over batches of blobs and is called back when all of them
//! are compressed, so a CPU pool, ISA-L, QAT or a GPU can sit behind it.
//!
//! Invariants every engine keeps:
//! - `done` is called exactly once per `submit`, with one result per job,
//!   in job order (also for an empty batch).
//! - A job never yields output longer than its `limit`: such jobs are
//!   `TooBig`, and so is a job whose codec failed (storing raw is always
//!   correct; engines count these failures).
//! - `Skipped` means the heuristic judged the blob hopeless and no codec
//!   time was spent.

use std::ops::Range;
use std::sync::Arc;

use crate::codec::BlockOutcome;
use crate::heuristic::lz4_finds_repeats;

/// Frames of at most this many bytes are tried as a block payload too
/// ([`Job::block`]): there the saving is worth a second pass (2.5% or
/// more of the payload), and the pass is cheap (the blob compresses 8:1).
pub const BLOCK_TRY_MAX: usize = 512;
use crate::{looks_incompressible, Algorithm, CodecError, Compressor};

/// One blob to compress: `input[range]`, to at most `limit` bytes.
#[derive(Clone, Debug)]
pub struct Job {
    /// Shared buffer holding the blob (a write request's payload can be
    /// split into many jobs without copying).
    pub input: Arc<Vec<u8>>,
    /// The blob's bytes within `input`.
    pub range: Range<usize>,
    /// Largest acceptable compressed size in bytes (from the policy's
    /// required ratio); bigger output is `TooBig`.
    pub limit: usize,
    /// Run [`looks_incompressible`] first (with its lz4 second opinion,
    /// [`crate::heuristic::lz4_finds_repeats`]) and skip the codec when
    /// both say so.
    pub skip_if_incompressible: bool,
    /// Also return the CRC32C of the compressed output, as compression
    /// offload engines (QAT, ISA-L) return one with it. The CPU engine
    /// computes it right after the codec, while the output is in the
    /// worker's cache, and on the worker rather than on the caller.
    pub checksum: bool,
    /// Compress the blob as independent chunks of this many bytes behind a
    /// table (format 5's chunked payload, [`crate::chunked`]; the output's
    /// CRC is then the table's); 0 (or a blob no longer than one chunk):
    /// one frame.
    pub chunk_bytes: usize,
    /// Where the blob is not chunked and its frame is at most
    /// [`BLOCK_TRY_MAX`] bytes, also try a block payload (format 6,
    /// `squeeze_format::zstd_block`, [`Compressor::compress_block`]) and
    /// keep it if shorter: the result says whether it is one.
    pub block: bool,
}

impl Job {
    /// A job for `input[range]`.
    pub fn new(
        input: Arc<Vec<u8>>,
        range: Range<usize>,
        limit: usize,
        skip_if_incompressible: bool,
    ) -> Self {
        Job {
            input,
            range,
            limit,
            skip_if_incompressible,
            checksum: false,
            chunk_bytes: 0,
            block: false,
        }
    }

    /// The same job, trying a block payload where it is not chunked (see
    /// [`Job::block`]).
    pub fn with_block(mut self, block: bool) -> Self {
        self.block = block;
        self
    }

    /// The same job, asking for the CRC32C of its output.
    pub fn with_checksum(mut self) -> Self {
        self.checksum = true;
        self
    }

    /// The same job, compressing in chunks of `chunk_bytes` (0: one frame).
    pub fn with_chunks(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes;
        self
    }

    /// The blob's bytes.
    ///
    /// # Panics
    /// If `range` is not within `input` (a programmer error; engines check
    /// it at submit time).
    pub fn data(&self) -> &[u8] {
        &self.input[self.range.clone()]
    }

    /// Whether `range` lies within `input`.
    pub fn is_valid(&self) -> bool {
        self.range.start <= self.range.end && self.range.end <= self.input.len()
    }
}

/// What became of one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutput {
    /// The compressed bytes (`len() <= limit`).
    Compressed(Vec<u8>),
    /// The output would exceed `limit` (or the codec failed): store raw.
    TooBig,
    /// The heuristic said hopeless; no codec time spent: store raw.
    Skipped,
}

/// The outcome of one job and what it cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobResult {
    pub output: JobOutput,
    /// Time spent on this job (heuristic + codec), nanoseconds: elapsed
    /// time around pure computation, so CPU time unless preempted.
    pub cpu_ns: u64,
    /// CRC32C (`squeeze_format::checksum::crc32c`) of the `Compressed`
    /// output when the job asked for it; None otherwise (an engine may
    /// leave it to the caller).
    pub output_crc32c: Option<u32>,
    /// The `Compressed` output is a block payload (format 6,
    /// `squeeze_format::zstd_block`), not a frame.
    pub block: bool,
}

/// A batch compression engine.
pub trait CompressEngine: Send + Sync {
    /// Short name for statistics ("cpu-pool").
    fn name(&self) -> &str;

    /// Number of worker threads (or hardware queues) behind the engine.
    fn threads(&self) -> usize;

    /// Raw bytes submitted and not yet started: the engine's backlog, the
    /// signal of the write path's adaptive codec
    /// (`squeeze_engine::pipeline::adapt`). An engine that cannot tell
    /// answers 0, and writes then always get the target codec.
    fn backlog_bytes(&self) -> u64 {
        0
    }

    /// Submits a batch; `done` is called exactly once, from any thread, with
    /// the results in job order. May block while the engine is full. `done`
    /// must not block on this engine (e.g. submit and wait) — it may run on
    /// one of the engine's own threads.
    fn submit(&self, alg: Algorithm, jobs: Vec<Job>, done: Box<dyn FnOnce(Vec<JobResult>) + Send>);

    /// Runs a batch and waits for the results. An engine may run some of
    /// it on the calling thread (the CPU pool runs the first job there);
    /// by default the same as [`CompressEngine::submit_and_wait`].
    fn compress_batch(&self, alg: Algorithm, jobs: Vec<Job>) -> Vec<JobResult> {
        self.submit_and_wait(alg, jobs)
    }

    /// Submits the whole batch to the engine and waits for the results:
    /// the calling thread runs none of it (the write path's choice for
    /// batches of several blobs: `squeeze_engine::pipeline::compress`).
    fn submit_and_wait(&self, alg: Algorithm, jobs: Vec<Job>) -> Vec<JobResult> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.submit(
            alg,
            jobs,
            Box::new(move |results| {
                // The receiver lives until it has the results.
                let _ = tx.send(results);
            }),
        );
        rx.recv()
            .expect("engine dropped a batch without calling done")
    }
}

/// Runs one job on the calling thread with `compressor`, using `scratch`
/// as the codec's output buffer; the building block of every CPU engine.
/// Returns the codec's error instead of mapping it, so the engine can count
/// it.
pub fn run_job(
    compressor: &mut dyn Compressor,
    job: &Job,
    scratch: &mut Vec<u8>,
) -> Result<JobResult, CodecError> {
    // Elapsed monotonic time (vDSO, ~20 ns) rather than the thread's CPU
    // clock, which is a system call costing ~0.4 us in a VM here: 10% of a
    // 4 KiB zstd:1 job. The codec call is pure computation, so the two agree
    // unless the thread is preempted mid-job.
    let start = std::time::Instant::now();
    let src = job.data();
    let mut output_crc32c = None;
    let mut block = false;
    let output = if job.skip_if_incompressible
        && looks_incompressible(src)
        && !lz4_finds_repeats(src)
    {
        JobOutput::Skipped
    } else if job.chunk_bytes != 0 && src.len() > job.chunk_bytes {
        match crate::chunked::compress_chunked(
            compressor,
            src,
            job.chunk_bytes,
            job.limit,
            scratch,
        )? {
            Some((payload, table_crc)) => {
                // The chunks' CRCs are in the table: its CRC is the
                // record's, whether or not the job asked for one.
                output_crc32c = Some(table_crc);
                JobOutput::Compressed(payload)
            }
            None => JobOutput::TooBig,
        }
    } else {
        match compressor.compress(src, scratch, job.limit)? {
            Some(n) => {
                let mut out = scratch[..n].to_vec();
                // A small frame: its block payload saves its headers and
                // its zero tail (about 14 bytes of a WAL commit's 118);
                // a second pass only where the first was cheap and small.
                if job.block && n <= BLOCK_TRY_MAX {
                    if let BlockOutcome::Body(m) = compressor.compress_block(src, scratch, n - 1)? {
                        out = scratch[..m].to_vec();
                        block = true;
                    }
                }
                if job.checksum {
                    output_crc32c = Some(squeeze_format::checksum::crc32c(&out));
                }
                JobOutput::Compressed(out)
            }
            None => JobOutput::TooBig,
        }
    };
    Ok(JobResult {
        output,
        cpu_ns: u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX),
        output_crc32c,
        block,
    })
}
