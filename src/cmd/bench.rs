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
//! 5. all-zero writes from one thread.
//!
//! Steps 2 and 4 run --reps times (default 3; step 4 on a fresh volume each
//! time), interleaved (raw compress, engine write, raw decompress, engine
//! read), and every speed is the median; engine-against-raw is the median of
//! each repetition's ratio. In this VM the same pass varies by up to 2x from
//! one minute to the next (host load, the state of the guest's free memory),
//! so each engine pass is compared with the raw pass measured beside it.

use crate::machine::machine;
use crate::policy_args::PolicyArgs;
use crate::util::{bench_dir, human, parse_size};
use anyhow::{bail, Context, Result};
use squeeze_codec::process::cpu_seconds as process_cpu_seconds;
use squeeze_codec::{CompressEngine, Job, JobOutput};
use squeeze_engine::pipeline::policy::output_limit;
use squeeze_engine::{
    default_policy, CodecId, CompressionMode, CreateOptions, FileStorage, OpenOptions, Volume,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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

#[derive(serde::Serialize)]
struct Report {
    machine: String,
    cores: usize,
    threads: usize,
    /// Requests in flight, raw codec and engine alike.
    writers: usize,
    algorithm: String,
    /// The compression engine of both passes (isal-pool when ISA-L is
    /// present: it runs deflate:1..=3).
    engine: String,
    /// --adapt: the engine's writes could go below the algorithm.
    adaptive: bool,
    /// Share of the engine's last timed write stored with a faster codec
    /// than the algorithm (0 without --adapt).
    below_target_fraction: f64,
    mode: String,
    max_blob: u32,
    data: String,
    bytes: u64,
    /// Timed repetitions; every speed is the median over them.
    reps: u32,
    /// Until every write is acknowledged (fio's app bandwidth: no flush).
    write_mbps: f64,
    /// The same write on the untimed warm-up volume (0 with --no-warmup):
    /// what a first pass over never-touched memory costs.
    cold_write_mbps: f64,
    /// Including the final flush that makes it all durable.
    write_durable_mbps: f64,
    /// The second read of the same data: the page cache holds the
    /// compressed log, so this is the engine's own cost.
    read_mbps: f64,
    /// The first read, from the device (the log is written with O_DIRECT
    /// and bypasses the page cache).
    cold_read_mbps: f64,
    backing_write_mbps: f64,
    raw_compress_mbps: f64,
    raw_decompress_mbps: f64,
    write_vs_raw: f64,
    /// Each repetition's engine write against the raw compress beside it
    /// (write_vs_raw is their median).
    write_vs_raw_reps: Vec<f64>,
    read_vs_raw: f64,
    ratio: f64,
    raw_ratio: f64,
    cpu_utilization_write: f64,
    cpu_utilization_read: f64,
    cpu_seconds_per_gib_write: f64,
    cpu_seconds_per_gib_read: f64,
    /// The raw compress passes: process CPU seconds per GiB, and the share
    /// of the cores they kept busy (the engine's overhead is the difference
    /// in the first and the idle time in the second).
    raw_cpu_seconds_per_gib_compress: f64,
    raw_cpu_utilization_compress: f64,
    zero_write_mbps: f64,
    map_bytes_per_mapped_sector: f64,
    blobs_compressed: u64,
    blobs_rejected: u64,
    blobs_skipped: u64,
}

fn load_data(a: &Args) -> Result<(Vec<u8>, String)> {
    let size = a.size as usize / REQUEST * REQUEST;
    if size == 0 {
        bail!("--size must be at least 1 MiB");
    }
    match &a.file {
        Some(f) => {
            let mut d = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            if d.len() < REQUEST {
                bail!("{} is smaller than 1 MiB", f.display());
            }
            d.truncate(size.min(d.len() / REQUEST * REQUEST));
            Ok((d, format!("file {}", f.display())))
        }
        None => Ok((
            squeeze_codec::testdata::fio_like(size, a.compress_percentage, 4096, 0x5eed),
            format!(
                "fio-like, {}% compressible per 4 KiB",
                a.compress_percentage
            ),
        )),
    }
}

/// "83% of raw compress", or why there is no such figure.
fn of_raw(ratio: f64, what: &str) -> String {
    if ratio > 0.0 {
        format!("{:.0}% of raw {what}", 100.0 * ratio)
    } else {
        "no codec runs: nothing to compare".into()
    }
}

/// The median of `v` (the upper one of an even count).
fn mid(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Reads a file through the page cache, discarding the bytes.
fn cache_file(path: &std::path::Path) -> Result<()> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    while f.read(&mut buf)? > 0 {}
    Ok(())
}

/// Runs `f(request_index)` for every request on `n` threads; returns seconds.
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

pub fn run(a: Args) -> Result<ExitCode> {
    bench_dir(&a.dir)?;
    if a.overwrite {
        return overwrite(a);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = a.threads.unwrap_or(cores).max(1);
    let writers = a.writers.unwrap_or(threads).max(1);
    let policy = a.policy.apply(default_policy())?;
    let alg = squeeze_codec::Algorithm::new(policy.codec, policy.level);
    let (data, what) = load_data(&a)?;
    let data = Arc::new(data);
    let n_req = data.len() / REQUEST;
    let blob = policy.max_blob as usize;
    let mb = data.len() as f64 / 1e6;
    if !a.json {
        eprintln!(
            "bench: {} of {what}, {} {} max_blob {}, {threads} threads on {}",
            human(data.len() as u64),
            alg,
            policy.mode.name(),
            human(blob as u64),
            machine()
        );
    }

    // Raw codec, same blobs, same threads (after a warm-up batch).
    let pool = squeeze_codec::isal::default_engine(threads);
    // Mode none runs no codec in the engine: nothing to compare it with.
    let codec = policy.codec != CodecId::None && policy.mode != CompressionMode::None;
    let warm: Vec<Job> = (0..(REQUEST / blob).min(n_req * REQUEST / blob))
        .map(|k| Job::new(data.clone(), k * blob..(k + 1) * blob, blob, false))
        .collect();
    if codec {
        pool.compress_batch(alg, warm);
    }
    let compressed: Vec<parking_lot::Mutex<Vec<Option<Vec<u8>>>>> = (0..n_req)
        .map(|_| parking_lot::Mutex::new(Vec::new()))
        .collect();
    let reps = a.reps as usize;
    // The blobs of request i, as the engine cuts them.
    let jobs_of = |i: usize| -> Vec<Job> {
        (0..REQUEST / blob)
            .map(|k| {
                let s = i * REQUEST + k * blob;
                Job::new(
                    data.clone(),
                    s..s + blob,
                    output_limit(&policy, blob),
                    false,
                )
            })
            .collect()
    };
    // Untimed: the compressed blobs, kept for the decompression runs.
    if codec {
        parallel(threads, n_req, |i| {
            *compressed[i].lock() = pool
                .compress_batch(alg, jobs_of(i))
                .into_iter()
                .map(|r| match r.output {
                    JobOutput::Compressed(v) => Some(v),
                    _ => None,
                })
                .collect();
            Ok(())
        })?;
    }
    let raw_stored = if codec {
        compressed
            .iter()
            .map(|c| {
                c.lock()
                    .iter()
                    .map(|b| b.as_ref().map_or(blob, Vec::len))
                    .sum::<usize>()
            })
            .sum()
    } else {
        data.len()
    };
    // Timed raw codec passes; each runs right before the engine pass it is
    // compared with (the speed of this VM drifts between passes).
    // Compress outputs are dropped as the engine drops them after its write
    // (keeping 400 MB of fresh outputs would time page faults instead).
    // Returns (seconds, process CPU seconds).
    let raw_compress = || -> Result<(f64, f64)> {
        if !codec {
            return Ok((0.0, 0.0));
        }
        let cpu0 = process_cpu_seconds();
        let secs = parallel(writers, n_req, |i| {
            std::hint::black_box(pool.compress_batch(alg, jobs_of(i)));
            Ok(())
        })?;
        Ok((secs, process_cpu_seconds() - cpu0))
    };
    let raw_decompress = || -> Result<f64> {
        if !codec {
            return Ok(0.0);
        }
        parallel(threads, n_req, |i| {
            let mut out = vec![0u8; blob];
            for b in compressed[i].lock().iter().flatten() {
                squeeze_codec::decompress(policy.codec, b, &mut out)?;
            }
            Ok(())
        })
    };

    // Engine.
    let tmp = tempfile::Builder::new()
        .prefix(".squeeze-bench-")
        .tempdir_in(&a.dir)
        .with_context(|| format!("temporary directory in {}", a.dir.display()))?;
    let new_volume = |name: &str| -> Result<Volume> {
        let storage = Arc::new(FileStorage::create(&tmp.path().join(name))?);
        let mut opts = CreateOptions::new((data.len() as u64 * 2).max(1 << 30));
        opts.policy = policy;
        let engine: Arc<dyn CompressEngine> =
            Arc::new(squeeze_codec::isal::default_engine(threads));
        Ok(Volume::create_with(
            storage,
            &opts,
            OpenOptions {
                engine: Some(engine),
                no_adapt: !a.adapt,
                background: true,
                ..Default::default()
            },
        )?)
    };
    let write_all = |vol: &Volume| {
        parallel(writers, n_req, |i| {
            let off = i * REQUEST;
            vol.write_shared(off as u64, &data, off..off + REQUEST, false)?;
            Ok(())
        })
    };
    // Warm-up: the first touch of memory the process or the page cache has
    // never used costs page zeroing and, in a VM, the hypervisor's own
    // fault (here: dd into a new file 432 MB/s, the same dd again 4.5 GB/s).
    // A server's memory is warm after its first minutes; the raw codec's
    // reused buffers are warm already. So one untimed pass writes a volume
    // that is deleted (its page-cache pages go back to the free lists) before
    // the timed pass; its speed is reported as cold_write_mbps.
    let cold_write_mbps = if a.no_warmup {
        0.0
    } else {
        let vol = new_volume("warmup.sqz")?;
        let secs = write_all(&vol)?;
        vol.close()?;
        std::fs::remove_file(tmp.path().join("warmup.sqz"))?;
        mb / secs
    };
    let (mut w, mut fl, mut cw, mut r, mut cr) = (vec![], vec![], vec![], vec![], vec![]);
    let mut cold_r = vec![];
    let (mut rc, mut rd, mut rc_cpu) = (vec![], vec![], vec![]);
    let mut last: Option<Volume> = None;
    for _ in 0..reps {
        // Each repetition on a fresh volume; the previous one goes first.
        if let Some(old) = last.take() {
            old.close()?;
            std::fs::remove_file(tmp.path().join("bench.sqz"))?;
        }
        let vol = new_volume("bench.sqz")?;
        let (secs, cpu) = raw_compress()?;
        rc.push(secs);
        rc_cpu.push(cpu);
        let cpu0 = process_cpu_seconds();
        w.push(write_all(&vol)?);
        let t_flush = Instant::now();
        vol.flush()?;
        fl.push(t_flush.elapsed().as_secs_f64());
        cw.push(process_cpu_seconds() - cpu0);
        // Reads decompress on the calling thread, as the raw pass does:
        // --threads of them.
        let read_all = || {
            parallel(threads, n_req, |i| {
                let mut buf = vec![0u8; REQUEST];
                vol.read((i * REQUEST) as u64, &mut buf)?;
                std::hint::black_box(&buf);
                Ok(())
            })
        };
        cold_r.push(read_all()?);
        // Untimed: the backing file through the page cache once, so the
        // timed read finds every record there (streams take cached pages).
        cache_file(&tmp.path().join("bench.sqz"))?;
        rd.push(raw_decompress()?);
        let cpu1 = process_cpu_seconds();
        r.push(read_all()?);
        cr.push(process_cpu_seconds() - cpu1);
        last = Some(vol);
    }
    let vol = last.expect("at least one repetition");
    let (w_secs, flush_secs, cpu_w) = (mid(&w), mid(&fl), mid(&cw));
    let (r_secs, cpu_r) = (mid(&r), mid(&cr));
    let (raw_c_secs, raw_d_secs) = (mid(&rc), mid(&rd));
    // Engine against raw codec: the median of each repetition's ratio.
    // Each repetition's engine speed over the raw codec's (none without a
    // codec), and their median.
    let per_rep = |raw: &[f64], eng: &[f64]| -> Vec<f64> {
        if codec {
            raw.iter().zip(eng).map(|(r, e)| r / e).collect()
        } else {
            Vec::new()
        }
    };
    let median_or_zero = |v: &[f64]| if v.is_empty() { 0.0 } else { mid(v) };
    let write_vs_raw_reps = per_rep(&rc, &w);
    let write_vs_raw = median_or_zero(&write_vs_raw_reps);
    let read_vs_raw = median_or_zero(&per_rep(&rd, &r));
    let raw_cpu_c = mid(&rc_cpu);
    let st = vol.stats();
    // Untimed verification pass.
    parallel(threads, n_req, |i| {
        let mut buf = vec![0u8; REQUEST];
        vol.read((i * REQUEST) as u64, &mut buf)?;
        if buf[..] != data[i * REQUEST..(i + 1) * REQUEST] {
            bail!("read-back mismatch in request {i}");
        }
        Ok(())
    })?;

    // All-zero writes, one thread.
    let zeros = vec![0u8; 4 << 20];
    let zero_bytes = data.len().min(1 << 30) / zeros.len() * zeros.len();
    let t0 = Instant::now();
    for k in 0..zero_bytes / zeros.len() {
        vol.write((k * zeros.len()) as u64, &zeros, false)?;
    }
    let z_secs = t0.elapsed().as_secs_f64();
    vol.close()?;
    // The volume files go before anything is printed (a closed stdout
    // ends the process at the first line: see `outln!`).
    drop(tmp);

    let gib = data.len() as f64 / (1u64 << 30) as f64;
    let raw_c = if raw_c_secs > 0.0 {
        mb / raw_c_secs
    } else {
        0.0
    };
    let raw_d = if raw_d_secs > 0.0 {
        mb / raw_d_secs
    } else {
        0.0
    };
    let r = Report {
        machine: machine(),
        cores,
        threads,
        writers,
        algorithm: alg.to_string(),
        engine: pool.name().to_string(),
        adaptive: a.adapt,
        below_target_fraction: st.below_target_bytes as f64 / data.len().max(1) as f64,
        mode: policy.mode.name().into(),
        max_blob: policy.max_blob,
        data: what,
        bytes: data.len() as u64,
        reps: a.reps,
        write_mbps: mb / w_secs,
        cold_write_mbps,
        write_durable_mbps: mb / (w_secs + flush_secs),
        read_mbps: mb / r_secs,
        cold_read_mbps: mb / mid(&cold_r),
        backing_write_mbps: st.log_bytes_written as f64 / 1e6 / w_secs,
        raw_compress_mbps: raw_c,
        raw_decompress_mbps: raw_d,
        write_vs_raw,
        write_vs_raw_reps,
        read_vs_raw,
        ratio: st.compression_ratio,
        raw_ratio: data.len() as f64 / raw_stored.max(1) as f64,
        cpu_utilization_write: cpu_w / (w_secs + flush_secs) / cores as f64,
        cpu_utilization_read: cpu_r / r_secs / cores as f64,
        cpu_seconds_per_gib_write: cpu_w / gib,
        cpu_seconds_per_gib_read: cpu_r / gib,
        raw_cpu_seconds_per_gib_compress: raw_cpu_c / gib,
        raw_cpu_utilization_compress: if raw_c_secs > 0.0 {
            raw_cpu_c / raw_c_secs / cores as f64
        } else {
            0.0
        },
        zero_write_mbps: zero_bytes as f64 / 1e6 / z_secs,
        map_bytes_per_mapped_sector: st.map_bytes_per_mapped_sector,
        blobs_compressed: st.blobs_compressed,
        blobs_rejected: st.blobs_rejected,
        blobs_skipped: st.blobs_skipped,
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        outln!("machine          {}", r.machine);
        outln!("data             {} of {}", human(r.bytes), r.data);
        outln!(
            "policy           {} {} max_blob {}, {} threads, {} writers; speeds are medians of {} runs",
            r.algorithm,
            r.mode,
            human(u64::from(r.max_blob)),
            r.threads,
            r.writers,
            r.reps
        );
        outln!(
            "engine           {}{}",
            r.engine,
            if r.adaptive {
                format!(
                    ", adaptive codec: {:.1}% of the last write below {}",
                    100.0 * r.below_target_fraction,
                    r.algorithm
                )
            } else {
                String::new()
            }
        );
        outln!(
            "engine write     {:>8.1} MB/s  ({}), backing file {:.1} MB/s, CPU {:.0}%, {:.2} CPU s/GiB",
            r.write_mbps,
            of_raw(r.write_vs_raw, "compress"),
            r.backing_write_mbps,
            100.0 * r.cpu_utilization_write,
            r.cpu_seconds_per_gib_write
        );
        outln!(
            "  with the flush {:>8.1} MB/s  (the final fdatasync of the backing file included)",
            r.write_durable_mbps
        );
        if r.cold_write_mbps > 0.0 {
            outln!(
                "  cold           {:>8.1} MB/s  (the untimed warm-up pass: first touch of fresh memory and page cache)",
                r.cold_write_mbps
            );
        }
        outln!(
            "engine read      {:>8.1} MB/s  ({}), CPU {:.0}%, {:.2} CPU s/GiB",
            r.read_mbps,
            of_raw(r.read_vs_raw, "decompress"),
            100.0 * r.cpu_utilization_read,
            r.cpu_seconds_per_gib_read
        );
        outln!(
            "  cold           {:>8.1} MB/s  (the first read, from the device: the log bypasses the page cache)",
            r.cold_read_mbps
        );
        outln!(
            "raw compress     {:>8.1} MB/s  CPU {:.0}%, {:.2} CPU s/GiB",
            r.raw_compress_mbps,
            100.0 * r.raw_cpu_utilization_compress,
            r.raw_cpu_seconds_per_gib_compress
        );
        if r.write_vs_raw_reps.len() > 1 {
            let reps: Vec<String> = r
                .write_vs_raw_reps
                .iter()
                .map(|x| format!("{:.0}%", 100.0 * x))
                .collect();
            outln!("  write vs raw by run: {}", reps.join(", "));
        }
        outln!("raw decompress   {:>8.1} MB/s", r.raw_decompress_mbps);
        outln!(
            "ratio            {:.3} stored (raw codec alone: {:.3}); blobs {} compressed, {} rejected, {} skipped",
            r.ratio, r.raw_ratio, r.blobs_compressed, r.blobs_rejected, r.blobs_skipped
        );
        outln!(
            "zero writes      {:>8.1} MB/s (one thread)",
            r.zero_write_mbps
        );
        outln!(
            "map memory       {:.2} bytes per mapped sector",
            r.map_bytes_per_mapped_sector
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(serde::Serialize)]
struct OverwritePhase {
    cleaner: bool,
    seconds: f64,
    write_mbps: f64,
    latency_p50_us: f64,
    latency_p99_us: f64,
    latency_max_us: f64,
    physical_bytes: u64,
    stored_bytes: u64,
    ratio_after: f64,
    write_amplification: f64,
    cleaner_bytes_moved: u64,
    cleaner_seconds: f64,
    cleaner_mbps: f64,
    catch_up_seconds: f64,
    physical_over_stored_after_catch_up: f64,
}

#[derive(serde::Serialize)]
struct OverwriteReport {
    machine: String,
    algorithm: String,
    max_blob: u32,
    dataset_bytes: u64,
    passes: u32,
    writers: usize,
    ratio_before: f64,
    without_cleaner: OverwritePhase,
    with_cleaner: OverwritePhase,
    p99_with_over_without: f64,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted[i])
}

/// One phase of the overwrite workload on a fresh volume.
fn overwrite_phase(a: &Args, cleaner: bool, writers: usize) -> Result<(OverwritePhase, f64)> {
    let policy = a.policy.apply(default_policy())?;
    let dataset = (a.size as usize / REQUEST * REQUEST).max(REQUEST);
    let tmp = tempfile::Builder::new()
        .prefix(".squeeze-bench-")
        .tempdir_in(&a.dir)?;
    let storage = Arc::new(FileStorage::create(&tmp.path().join("ow.sqz"))?);
    let mut opts = CreateOptions::new(dataset as u64);
    opts.policy = policy;
    let vol = Volume::create_with(
        storage,
        &opts,
        OpenOptions {
            background: cleaner,
            ..Default::default()
        },
    )?;
    // Fill.
    parallel(writers, dataset / REQUEST, |i| {
        let d = squeeze_codec::testdata::fio_like(REQUEST, a.compress_percentage, 4096, i as u64);
        vol.write((i * REQUEST) as u64, &d, false)?;
        Ok(())
    })?;
    vol.flush()?;
    let ratio_before = vol.stats().compression_ratio;
    // Overwrite: the same pseudo-random sequence in both phases.
    let total = dataset as u64 * u64::from(a.passes);
    let per_writer = total / writers as u64;
    let lat = parking_lot::Mutex::new(Vec::<u32>::new());
    let t0 = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..writers)
            .map(|w| {
                let vol = &vol;
                let lat = &lat;
                s.spawn(move || -> Result<()> {
                    let mut rng = squeeze_codec::testdata::SplitMix64::new(1000 + w as u64);
                    let pool = squeeze_codec::testdata::fio_like(
                        4 << 20,
                        a.compress_percentage,
                        4096,
                        w as u64,
                    );
                    let mut mine = Vec::new();
                    let mut done = 0u64;
                    while done < per_writer {
                        let sectors = 1 + (rng.next_u64() % 32) as usize;
                        let len = sectors * 4096;
                        let off = (rng.next_u64() % ((dataset - len) / 4096) as u64) * 4096;
                        let src =
                            (rng.next_u64() % ((pool.len() - len) / 4096) as u64) as usize * 4096;
                        let t = Instant::now();
                        vol.write(off, &pool[src..src + len], false)?;
                        mine.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                        done += len as u64;
                    }
                    lat.lock().extend(mine);
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().expect("writer")?;
        }
        Ok(())
    })?;
    vol.flush()?;
    let secs = t0.elapsed().as_secs_f64();
    let st = vol.stats();
    let t1 = Instant::now();
    vol.compact(|_, _| {})?;
    let catch_up = t1.elapsed().as_secs_f64();
    let after = vol.stats();
    vol.close()?;
    let mut l = lat.into_inner();
    l.sort_unstable();
    Ok((
        OverwritePhase {
            cleaner,
            seconds: secs,
            write_mbps: total as f64 / 1e6 / secs,
            latency_p50_us: percentile(&l, 0.50),
            latency_p99_us: percentile(&l, 0.99),
            latency_max_us: l.last().map_or(0.0, |&v| f64::from(v)),
            physical_bytes: st.physical_bytes,
            stored_bytes: st.stored_bytes,
            ratio_after: after.compression_ratio,
            write_amplification: after.write_amplification,
            cleaner_bytes_moved: after.cleaner_bytes_moved,
            cleaner_seconds: after.cleaner_seconds,
            cleaner_mbps: if after.cleaner_seconds > 0.0 {
                after.cleaner_bytes_moved as f64 / 1e6 / after.cleaner_seconds
            } else {
                0.0
            },
            catch_up_seconds: catch_up,
            physical_over_stored_after_catch_up: after.physical_bytes as f64
                / after.stored_bytes.max(1) as f64,
        },
        ratio_before,
    ))
}

fn overwrite(a: Args) -> Result<ExitCode> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let writers = 2 * a.threads.unwrap_or(cores).max(1);
    let policy = a.policy.apply(default_policy())?;
    if !a.json {
        eprintln!(
            "bench --overwrite: {} data set, {} passes, {writers} writers, {} max_blob {}",
            human(a.size),
            a.passes,
            squeeze_codec::Algorithm::new(policy.codec, policy.level),
            human(u64::from(policy.max_blob))
        );
    }
    let (without, ratio_before) = overwrite_phase(&a, false, writers)?;
    let (with, _) = overwrite_phase(&a, true, writers)?;
    let r = OverwriteReport {
        machine: machine(),
        algorithm: squeeze_codec::Algorithm::new(policy.codec, policy.level).to_string(),
        max_blob: policy.max_blob,
        dataset_bytes: a.size,
        passes: a.passes,
        writers,
        ratio_before,
        p99_with_over_without: with.latency_p99_us / without.latency_p99_us.max(1.0),
        without_cleaner: without,
        with_cleaner: with,
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!("machine            {}", r.machine);
    outln!(
        "workload           {} data set ({}), rewritten {}x with random 4K..128K writes, {} writers",
        human(r.dataset_bytes),
        r.algorithm,
        r.passes,
        r.writers
    );
    for p in [&r.without_cleaner, &r.with_cleaner] {
        outln!(
            "{:<18} {:.1} MB/s, latency p50 {:.0} us p99 {:.0} us max {:.0} us; physical {} for {} stored at the end",
            if p.cleaner { "with cleaner" } else { "without cleaner" },
            p.write_mbps,
            p.latency_p50_us,
            p.latency_p99_us,
            p.latency_max_us,
            human(p.physical_bytes),
            human(p.stored_bytes)
        );
    }
    let w = &r.with_cleaner;
    outln!("p99 with/without   {:.2}x", r.p99_with_over_without);
    outln!(
        "cleaner            {} moved in {:.1} s ({:.1} MB/s); catch-up compaction {:.1} s",
        human(w.cleaner_bytes_moved),
        w.cleaner_seconds,
        w.cleaner_mbps,
        w.catch_up_seconds
    );
    outln!(
        "after catch-up     physical/stored {:.3}, write amplification {:.3}, ratio {:.3} (before overwrites {:.3})",
        w.physical_over_stored_after_catch_up,
        w.write_amplification,
        w.ratio_after,
        r.ratio_before
    );
    Ok(ExitCode::SUCCESS)
}
