//! The default `squeeze bench` run: the engine's write and read against
//! the raw codec on the same data (steps 1 to 5 of the module docs of
//! `bench`).

use super::report::Report;
use super::{parallel, random_read, with_buf, Args, REQUEST};
use crate::machine::machine;
use crate::util::human;
use anyhow::{bail, Context, Result};
use squeeze_codec::process::cpu_seconds as process_cpu_seconds;
use squeeze_codec::{CompressEngine, Job, JobOutput};
use squeeze_engine::pipeline::policy::output_limit;
use squeeze_engine::{
    default_policy, CodecId, CompressionMode, CreateOptions, FileStorage, OpenOptions, Volume,
};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

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

pub(super) fn run(a: Args) -> Result<ExitCode> {
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
    // Untimed: the same blobs cut as the engine stores them when the
    // policy chunks its payloads (`read_chunk`: independent frames of that
    // many raw bytes), for a raw decompress of the engine's own layout.
    let chunk = policy.read_chunk as usize;
    let chunked = codec && chunk != 0 && chunk < blob;
    let compressed_chunks: Vec<Vec<Option<Vec<u8>>>> = if chunked {
        let out: Vec<parking_lot::Mutex<Vec<Option<Vec<u8>>>>> = (0..n_req)
            .map(|_| parking_lot::Mutex::new(Vec::new()))
            .collect();
        parallel(threads, n_req, |i| {
            let mut c = squeeze_codec::new_compressor(alg);
            let mut scratch = Vec::new();
            let req = &data[i * REQUEST..(i + 1) * REQUEST];
            let mut v = Vec::with_capacity(REQUEST / chunk);
            for piece in req.chunks(chunk) {
                let frame = c.compress(piece, &mut scratch, piece.len() - 1)?;
                v.push(frame.map(|n| scratch[..n].to_vec()));
            }
            *out[i].lock() = v;
            Ok(())
        })?;
        out.into_iter().map(|m| m.into_inner()).collect()
    } else {
        Vec::new()
    };
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
            with_buf(blob, |out| -> Result<()> {
                for b in compressed[i].lock().iter().flatten() {
                    squeeze_codec::decompress(policy.codec, b, out)?;
                }
                Ok(())
            })
        })
    };
    // The same, chunk by chunk (a chunk that did not compress is copied,
    // as the engine copies a raw chunk).
    let raw_decompress_chunks = || -> Result<f64> {
        if !chunked {
            return Ok(0.0);
        }
        parallel(threads, n_req, |i| {
            with_buf(chunk, |out| -> Result<()> {
                let src = &data[i * REQUEST..(i + 1) * REQUEST];
                for (k, c) in compressed_chunks[i].iter().enumerate() {
                    match c {
                        Some(frame) => squeeze_codec::decompress(policy.codec, frame, out)?,
                        None => out.copy_from_slice(&src[k * chunk..(k + 1) * chunk]),
                    }
                    std::hint::black_box(&*out);
                }
                Ok(())
            })
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
    // The plain file the 4 KiB random reads are compared with: the same
    // bytes, in the page cache like the engine's records.
    let plain_path = tmp.path().join("plain.bin");
    std::fs::write(&plain_path, &data[..])?;
    cache_file(&plain_path)?;
    let plain = std::fs::File::open(&plain_path)?;
    let rr_offsets =
        random_read::offsets(random_read::READS.min(data.len() / 4096), data.len() as u64);
    let (mut rr_e, mut rr_f) = (vec![], vec![]);
    let (mut rr_e_cpu, mut rr_f_cpu) = (vec![], vec![]);
    let (mut w, mut fl, mut cw, mut r, mut cr) = (vec![], vec![], vec![], vec![], vec![]);
    let mut cold_r = vec![];
    let (mut rc, mut rd, mut rdc, mut rc_cpu) = (vec![], vec![], vec![], vec![]);
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
                with_buf(REQUEST, |buf| -> Result<()> {
                    vol.read((i * REQUEST) as u64, buf)?;
                    std::hint::black_box(&*buf);
                    Ok(())
                })
            })
        };
        cold_r.push(read_all()?);
        // Untimed: the backing file through the page cache once, so the
        // timed read finds every record there (streams take cached pages).
        cache_file(&tmp.path().join("bench.sqz"))?;
        rd.push(raw_decompress()?);
        rdc.push(raw_decompress_chunks()?);
        let cpu1 = process_cpu_seconds();
        r.push(read_all()?);
        cr.push(process_cpu_seconds() - cpu1);
        // 4 KiB random reads, the plain file's pass right before the
        // engine's (this VM's speed drifts between passes).
        let f = random_read::file(&plain, threads, &rr_offsets)?;
        let e = random_read::engine(&vol, &data, threads, &rr_offsets)?;
        rr_f.push(f.secs);
        rr_f_cpu.push(f.cpu);
        rr_e.push(e.secs);
        rr_e_cpu.push(e.cpu);
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
    let read_vs_raw_chunks = if chunked {
        median_or_zero(&per_rep(&rdc, &r))
    } else {
        0.0
    };
    let raw_dc_secs = if chunked { mid(&rdc) } else { 0.0 };
    let random_read_vs_raw_file = mid(&rr_f
        .iter()
        .zip(&rr_e)
        .map(|(f, e)| f / e)
        .collect::<Vec<_>>());
    let n_rr = rr_offsets.len() as f64;
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
        raw_decompress_chunks_mbps: if raw_dc_secs > 0.0 {
            mb / raw_dc_secs
        } else {
            0.0
        },
        read_chunk: chunk as u32,
        write_vs_raw,
        write_vs_raw_reps,
        read_vs_raw,
        read_vs_raw_chunks,
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
        random_read_iops: n_rr / mid(&rr_e),
        raw_file_random_read_iops: n_rr / mid(&rr_f),
        random_read_vs_raw_file,
        cpu_us_per_random_read: mid(&rr_e_cpu) / n_rr * 1e6,
        raw_file_cpu_us_per_random_read: mid(&rr_f_cpu) / n_rr * 1e6,
        map_bytes_per_mapped_sector: st.map_bytes_per_mapped_sector,
        blobs_compressed: st.blobs_compressed,
        blobs_rejected: st.blobs_rejected,
        blobs_skipped: st.blobs_skipped,
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        r.print();
    }
    Ok(ExitCode::SUCCESS)
}
