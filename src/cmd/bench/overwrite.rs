//! `squeeze bench --overwrite` (issue 4's workload): fill a data set,
//! rewrite it with random 4K..128K writes, once without and once with the
//! cleaner; write latency, cleaner speed, write amplification and space
//! after the cleaner caught up.

use super::{parallel, Args, REQUEST};
use crate::machine::machine;
use crate::util::human;
use anyhow::Result;
use squeeze_engine::{default_policy, CreateOptions, FileStorage, OpenOptions, Volume};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

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

pub(super) fn run(a: Args) -> Result<ExitCode> {
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
