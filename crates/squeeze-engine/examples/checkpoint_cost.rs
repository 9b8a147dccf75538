//! What checkpoints cost as a volume grows (issue 15's benchmark).
//!
//! Creates a thin volume of `--logical` bytes in `--dir` (lz4), maps its
//! first `--mapped` bytes sequentially with provisioned zeros (NBD's
//! WRITE_ZEROES with NO_HOLE: records of 128 KiB blobs that
//! cost a few bytes each, so hundreds of GiB map in minutes and fit this
//! machine's disk; the map holds the same entries as for data) and
//! checkpoints them (the window counts the overwrite alone), then writes
//! `--overwrite` bytes of random 4-128 KiB writes over that range with data
//! that compresses about 2:1 (so the log, and the checkpoints it triggers,
//! grow as with real data), with the maintenance thread running
//! (checkpoints every 256 MiB of log, the cleaner, the merger) as under
//! `squeeze serve`. Then it flushes and exits without closing (a crash:
//! write-behind buffers are lost), reopens the volume and times the
//! recovery.
//!
//! Prints one JSON object: checkpoint bytes per GiB overwritten, log bytes,
//! write amplification, map RAM (its peak, sampled every 4096 writes, and
//! the paging a `--map-cache SIZE` brings: chunks paged out, read back),
//! chain shape, and the open after the crash: its time, the map's peak RAM
//! meanwhile (`open_map_peak_bytes`) and the process's peak resident set.
//!
//! ```sh
//! cargo run --release -p squeeze-engine --example checkpoint_cost -- \
//!     --dir /tmp/ck --logical 64G --mapped 32G --overwrite 8G
//! ```

use rand::{Rng, SeedableRng};
use squeeze_engine::{CodecId, CreateOptions, FileStorage, OpenOptions, Volume};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

const SECTOR: u64 = 4096;

struct Args {
    dir: PathBuf,
    logical: u64,
    mapped: u64,
    overwrite: u64,
    child: bool,
    /// Keep the volume afterwards (for --reopen).
    keep: bool,
    /// Only open the volume a --keep run left (after its crash, or a
    /// previous --reopen's close) and report the open.
    reopen: bool,
    /// The map's cache (`OpenOptions::map_cache`); None: the default.
    map_cache: Option<u64>,
}

fn size(s: &str) -> u64 {
    let (num, mul) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        Some('T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .unwrap_or_else(|_| panic!("bad size {s}"))
        * mul
}

fn args() -> Args {
    let mut a = Args {
        dir: PathBuf::from("/tmp/squeeze-checkpoint-cost"),
        logical: 4 << 30,
        mapped: 2 << 30,
        overwrite: 8 << 30,
        child: false,
        keep: false,
        reopen: false,
        map_cache: None,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let val = || v.get(i + 1).cloned().expect("missing value");
        match v[i].as_str() {
            "--dir" => a.dir = PathBuf::from(val()),
            "--logical" => a.logical = size(&val()),
            "--mapped" => a.mapped = size(&val()),
            "--overwrite" => a.overwrite = size(&val()),
            "--map-cache" => a.map_cache = Some(size(&val())),
            "--child" => {
                a.child = true;
                i -= 1;
            }
            "--keep" => {
                a.keep = true;
                i -= 1;
            }
            "--reopen" => {
                a.reopen = true;
                i -= 1;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    assert!(a.mapped <= a.logical && a.mapped >= 1 << 20);
    a
}

/// Sectors that compress about 2:1: half random bytes, half a pattern.
fn fill(r: &mut impl Rng, buf: &mut [u8], lba: u64, gen: u64) {
    const PATTERN: &[u8] = b"squeeze checkpoint benchmark: compressible sector data ";
    for (k, s) in buf.chunks_mut(SECTOR as usize).enumerate() {
        r.fill(&mut s[..2048]);
        for (j, b) in s[2048..].iter_mut().enumerate() {
            *b = PATTERN[j % PATTERN.len()];
        }
        s[..8].copy_from_slice(&(lba + k as u64).to_le_bytes());
        s[8..16].copy_from_slice(&gen.to_le_bytes());
    }
}

fn path(a: &Args) -> PathBuf {
    a.dir.join("volume.sqz")
}

/// The workload, in a child process that "crashes" at the end.
fn child(a: &Args) {
    let storage = Arc::new(FileStorage::create(&path(a)).expect("create the backing file"));
    let mut o = CreateOptions::new(a.logical);
    o.policy.codec = CodecId::Lz4;
    o.policy.level = 0;
    let vol = Volume::create_with(
        storage,
        &o,
        OpenOptions {
            background: true,
            map_cache: a.map_cache,
            ..Default::default()
        },
    )
    .expect("create");
    let t = Instant::now();
    let mut at = 0;
    while at < a.mapped {
        let n = (a.mapped - at).min(64 << 20);
        vol.write_zeroes_no_hole(at, n, false).expect("fill");
        at += n;
        if at % (32 << 30) == 0 {
            eprintln!("mapped {} GiB of {}", at >> 30, a.mapped >> 30);
        }
    }
    vol.flush().expect("flush");
    // The fill is setup, not workload: its map changes go into the chain
    // before the window opens (two pieces: the fill's changes, then
    // whatever the chain has come due for, a base after a large fill), so
    // the window counts what the overwrite itself costs.
    vol.checkpoint().expect("checkpoint the fill");
    vol.checkpoint().expect("checkpoint the fill");
    let mut buf = vec![0u8; 128 << 10];
    let fill_s = t.elapsed().as_secs_f64();
    let before = vol.stats();
    let t = Instant::now();
    let mut r = rand::rngs::StdRng::seed_from_u64(15);
    let sectors = a.mapped / SECTOR;
    let mut written = 0;
    let mut gen = 1;
    let mut peak = before.map_memory_bytes;
    while written < a.overwrite {
        let n = r.gen_range(1..=32u64).min(sectors);
        let lba = r.gen_range(0..=sectors - n);
        let len = (n * SECTOR) as usize;
        fill(&mut r, &mut buf[..len], lba, gen);
        vol.write(lba * SECTOR, &buf[..len], false)
            .expect("overwrite");
        written += len as u64;
        gen += 1;
        if gen % 4096 == 0 {
            vol.flush().expect("flush");
            peak = peak.max(vol.stats().map_memory_bytes);
        }
    }
    vol.flush().expect("flush");
    let overwrite_s = t.elapsed().as_secs_f64();
    let after = vol.stats();
    let gib = written as f64 / (1u64 << 30) as f64;
    let out = serde_json::json!({
        "logical_bytes": a.logical,
        "mapped_bytes": after.mapped_bytes,
        "fill_seconds": fill_s,
        "overwrite_bytes": written,
        "overwrite_seconds": overwrite_s,
        "checkpoints": after.checkpoints - before.checkpoints,
        "checkpoint_bytes": after.checkpoint_bytes_written - before.checkpoint_bytes_written,
        "checkpoint_bytes_per_gib": (after.checkpoint_bytes_written - before.checkpoint_bytes_written) as f64 / gib,
        "log_bytes_per_gib": (after.log_bytes_written - before.log_bytes_written) as f64 / gib,
        "write_amplification": after.write_amplification,
        "map_memory_bytes": after.map_memory_bytes,
        "map_memory_peak_bytes": peak.max(after.map_memory_bytes),
        "map_cache_bytes": after.map_cache_bytes,
        "map_chunks": after.map_chunks,
        "map_paged_chunks": after.map_paged_chunks,
        "map_faults": after.map_faults - before.map_faults,
        "map_evictions": after.map_evictions - before.map_evictions,
        "map_bytes_per_mapped_sector": after.map_bytes_per_mapped_sector,
        "physical_bytes": after.physical_bytes,
        "writes": gen - 1,
        "chain_deltas": after.checkpoint_deltas,
        "chain_delta_bytes": after.checkpoint_delta_bytes,
        "chain_base_bytes": after.checkpoint_base_bytes,
        "cleaner_bytes_moved": after.cleaner_bytes_moved - before.cleaner_bytes_moved,
        "merged_bytes": after.merged_bytes - before.merged_bytes,
        "segments_reclaimed": after.segments_reclaimed - before.segments_reclaimed,
    });
    println!("{out}");
    // A crash: no close, no final checkpoint; what the write-behind pool
    // holds is lost (nothing flushed is).
    std::process::exit(0);
}

fn main() {
    let a = args();
    if a.child {
        child(&a);
        return;
    }
    let mut result = if a.reopen {
        serde_json::json!({})
    } else {
        let _ = std::fs::remove_dir_all(&a.dir);
        std::fs::create_dir_all(&a.dir).expect("create --dir");
        let out = std::process::Command::new(std::env::current_exe().expect("own path"))
            .args(std::env::args().skip(1))
            .arg("--child")
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run the workload");
        assert!(out.status.success(), "workload failed");
        serde_json::from_slice(&out.stdout).expect("workload JSON")
    };
    let t = Instant::now();
    let storage = Arc::new(FileStorage::open(&path(&a)).expect("open the backing file"));
    let vol = Volume::open(
        storage,
        OpenOptions {
            map_cache: a.map_cache,
            ..Default::default()
        },
    )
    .expect("open after the crash");
    let open_s = t.elapsed().as_secs_f64();
    let s = vol.stats();
    result["open_after_crash_seconds"] = open_s.into();
    result["open_replayed_records"] = s.open_replayed_records.into();
    result["checkpoint_base_bytes"] = s.checkpoint_base_bytes.into();
    result["checkpoint_deltas"] = s.checkpoint_deltas.into();
    result["checkpoint_delta_bytes"] = s.checkpoint_delta_bytes.into();
    result["map_memory_bytes_after_open"] = s.map_memory_bytes.into();
    result["map_paged_chunks_after_open"] = s.map_paged_chunks.into();
    result["open_map_peak_bytes"] = s.open_map_peak_bytes.into();
    result["open_process_peak_rss_bytes"] = peak_rss().into();
    if a.reopen {
        // Leave it as the crash left it for the next --reopen.
        std::process::exit(print(&result));
    }
    vol.close().expect("close");
    print(&result);
    if !a.keep {
        let _ = std::fs::remove_dir_all(&a.dir);
    }
}

/// The process's peak resident set (VmHWM): this process only opens the
/// volume (the workload ran in a child).
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb << 10)
}

fn print(v: &serde_json::Value) -> i32 {
    println!("{}", serde_json::to_string_pretty(v).expect("json"));
    0
}
