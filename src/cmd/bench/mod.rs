//! `squeeze bench`: the engine in-process (no network), measured against the
//! raw codec on the same buffers with the same thread count, in one run.
//!
//! 1. data: fio-like (buffer_compress_percentage per 4 KiB chunk, default
//!    60) or the first --size bytes of --file, held in memory;
//! 2. raw codec: the blobs the engine would make (max_blob each) through a
//!    CPU pool of --threads workers fed by --writers threads (default one per
//!    codec thread), then decompressed by --threads threads;
//! 3. warm-up (unless --no-warmup): the engine write of step 4 on a
//!    throwaway volume, deleted before step 4, so that the timed pass does
//!    not pay the first touch of never-used memory (reported as
//!    cold_write_mbps);
//! 4. engine write: a fresh volume, --writers threads writing 1 MiB requests
//!    through `Volume::write_shared` (as the NBD server writes: the request
//!    buffer becomes the codec's input without a copy, as in step 2)
//!    (write_mbps until all are acknowledged, write_durable_mbps including
//!    the final flush); engine read: the same requests read back twice,
//!    first from the device (the log was written with O_DIRECT, and large
//!    reads bypass a page cache that does not hold them: cold_read_mbps),
//!    then, after an untimed read of the backing file through the page
//!    cache, with every record there (read_mbps: the engine against the
//!    codec, without the device), verified in a separate untimed pass;
//!    4b. 4 KiB reads at random offsets, the engine against a plain file
//!    holding the same bytes, both in the page cache (`random_read`);
//! 5. all-zero writes from one thread.
//!
//! Steps 2 and 4 run --reps times (default 3; step 4 on a fresh volume each
//! time), interleaved (raw compress, engine write, raw decompress, engine
//! read), and every speed is the median; engine-against-raw is the median of
//! each repetition's ratio. In this VM the same pass varies by up to 2x from
//! one minute to the next (host load, the state of the guest's free memory),
//! so each engine pass is compared with the raw pass measured beside it.
//!
//! Steps 1 to 5 are `throughput`, and what they print `report`;
//! `--overwrite` runs the overwrite workload (`overwrite`) instead.

mod overwrite;
mod random_read;
mod report;
mod throughput;

use crate::policy_args::PolicyArgs;
use crate::util::{bench_dir, parse_size};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const REQUEST: usize = 1 << 20;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Use the first --size bytes of this file instead of synthetic data.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Bytes to write and read.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// Compression worker threads (and raw-codec threads); default: cores.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Requests in flight (threads submitting 1 MiB requests), for the raw
    /// codec and the engine alike; default: one per compression thread (two
    /// per thread measured no better here).
    #[arg(long)]
    pub writers: Option<usize>,
    /// Synthetic data: percentage of each 4 KiB chunk that compresses away
    /// (fio's buffer_compress_percentage).
    #[arg(long, default_value_t = 60)]
    pub compress_percentage: u32,
    /// Directory for the temporary volume.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// The overwrite workload instead (issue 4's): fill --size, rewrite it
    /// --passes times with random 4K..128K writes, once without and once
    /// with the cleaner; report write latency, cleaner MB/s, write
    /// amplification and space after the cleaner caught up.
    #[arg(long)]
    pub overwrite: bool,
    /// Overwrite passes over the data set (with --overwrite).
    #[arg(long, default_value_t = 5)]
    pub passes: u32,
    /// Skip the untimed warm-up pass (a throwaway volume written once and
    /// deleted before the timed write; see the module docs for why).
    #[arg(long)]
    pub no_warmup: bool,
    /// Timed repetitions of the raw codec and of the engine's write and
    /// read (each on a fresh volume); the median of each is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub reps: u32,
    /// Let the engine's writes take the adaptive codec's faster rungs when
    /// the compression threads fall behind (as `serve` does by default).
    /// Off by default here: the bench compares the engine with the raw
    /// codec on the same algorithm.
    #[arg(long)]
    pub adapt: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    bench_dir(&a.dir)?;
    if a.overwrite {
        return overwrite::run(a);
    }
    throughput::run(a)
}

/// Runs `f(request_index)` for every request on `n` threads; returns seconds.
/// Runs `f` on this thread's output buffer of `len` bytes, kept across
/// the requests a [`parallel`] thread serves: a buffer allocated per
/// request would time the allocator zeroing it: until session 25 the
/// engine's read zeroed a fresh 1 MiB per 1 MiB request, the raw codec's
/// decompress a fresh 128 KiB, so the engine paid eight times as much.
fn with_buf<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with_borrow_mut(|b| {
        b.resize(len, 0);
        f(&mut b[..len])
    })
}

fn parallel(n: usize, requests: usize, f: impl Fn(usize) -> Result<()> + Sync) -> Result<f64> {
    let next = AtomicUsize::new(0);
    let t0 = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= requests {
                            return Ok(());
                        }
                        f(i)?;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("bench thread")?;
        }
        Ok(())
    })?;
    Ok(t0.elapsed().as_secs_f64())
}
