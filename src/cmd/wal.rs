//! `squeeze wal ...`: a write-ahead log (crate squeeze-wal) on a volume.
//!
//! - `create VOLUME --layout dense|sparse [--record-version 2|1]`: a log on
//!   an empty volume (record version 2 unless told; 1 makes the logs of
//!   earlier releases)
//! - `append VOLUME RECORD...`: each argument one record, one commit each
//! - `dump VOLUME`: every live record (seq, position, length, bytes)
//! - `truncate VOLUME --seq N`: drop the records before seq N (trimmed)
//! - `bench`: bytes squeeze writes to its backing file per commit and
//!   commit latency, dense against sparse, at several record sizes and
//!   numbers of committing threads, on fresh volumes in `--dir`
//!   (`--record-version 1` measures the 40-byte record headers of before)

use crate::util::{bench_dir, human, open_volume, parse_size};
use anyhow::{bail, Context, Result};
use rand::Rng;
use squeeze_engine::{CreateOptions, FileStorage, OpenOptions, Volume};
use squeeze_wal::{Layout, Lsn, RecordVersion, Wal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: WalCommand,
}

#[derive(clap::Subcommand)]
pub enum WalCommand {
    /// Create a log on an empty volume.
    Create {
        volume: PathBuf,
        /// dense (records packed, the tail sector rewritten at each
        /// commit) or sparse (each commit starts a new 4 KiB sector).
        #[arg(long)]
        layout: String,
        /// Record version: 2 (6- to 13-byte record headers), or 1 (40
        /// bytes: the logs of releases before issue 37).
        #[arg(long, default_value = "2")]
        record_version: u32,
    },
    /// Append records (one commit each; durable when the command returns).
    Append {
        volume: PathBuf,
        #[arg(required = true)]
        records: Vec<String>,
    },
    /// Print every live record.
    Dump {
        volume: PathBuf,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Drop the records before seq N; their sectors are trimmed.
    Truncate {
        volume: PathBuf,
        #[arg(long)]
        seq: u64,
    },
    /// Measure backing bytes per commit and commit latency, dense against
    /// sparse.
    Bench(BenchArgs),
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Directory for the temporary volumes (the file system measured).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Record sizes (bytes of payload per commit), comma separated.
    #[arg(long, default_value = "128,256,512,1024,2048")]
    pub sizes: String,
    /// Numbers of committing threads, comma separated.
    #[arg(long, default_value = "1,8")]
    pub threads: String,
    /// Commits per run (split among the threads).
    #[arg(long, default_value = "4000")]
    pub commits: u64,
    /// Logical size of each volume.
    #[arg(long, default_value = "64G", value_parser = parse_size)]
    pub volume_size: u64,
    /// Record version of the logs measured: 2, or 1 (the 40-byte record
    /// headers of earlier releases).
    #[arg(long, default_value = "2")]
    pub record_version: u32,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn layout_arg(s: &str) -> Result<Layout> {
    Layout::parse(s).ok_or_else(|| anyhow::anyhow!("unknown layout {s:?}: use dense or sparse"))
}

/// A log's records as recovery hands them over.
type Records = Vec<(Lsn, Vec<u8>)>;

fn open_log(path: &std::path::Path) -> Result<(Arc<Volume>, Wal, Records)> {
    let vol = Arc::new(open_volume(path, false)?);
    let mut records = Vec::new();
    let wal = Wal::open(vol.clone(), None, |lsn, p| records.push((lsn, p.to_vec())))
        .with_context(|| format!("cannot open the log on {}", path.display()))?;
    Ok((vol, wal, records))
}

fn close(vol: Arc<Volume>, wal: Wal) -> Result<()> {
    drop(wal);
    match Arc::try_unwrap(vol) {
        Ok(v) => Ok(v.close()?),
        Err(_) => bail!("the volume is still in use"),
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.command {
        WalCommand::Create {
            volume,
            layout,
            record_version,
        } => {
            let layout = layout_arg(&layout)?;
            let version = version_arg(record_version)?;
            let vol = Arc::new(open_volume(&volume, false)?);
            let wal = Wal::create_with(vol.clone(), layout, version)
                .with_context(|| format!("cannot create a log on {}", volume.display()))?;
            close(vol, wal)?;
            outln!("created a {} log on {}", layout.name(), volume.display());
        }
        WalCommand::Append { volume, records } => {
            let (vol, wal, _) = open_log(&volume)?;
            for r in &records {
                let lsn = wal.append(r.as_bytes())?;
                outln!("seq {} at {}", lsn.seq, lsn.pos);
            }
            close(vol, wal)?;
        }
        WalCommand::Dump { volume, json } => {
            let (vol, wal, records) = open_log(&volume)?;
            for (lsn, p) in &records {
                if json {
                    outln!(
                        "{}",
                        serde_json::json!({
                            "seq": lsn.seq, "pos": lsn.pos, "len": p.len(),
                            "text": String::from_utf8_lossy(p),
                        })
                    );
                } else {
                    outln!(
                        "{:>10} {:>14} {:>8} {}",
                        lsn.seq,
                        lsn.pos,
                        p.len(),
                        String::from_utf8_lossy(&p[..p.len().min(60)]).escape_debug()
                    );
                }
            }
            close(vol, wal)?;
        }
        WalCommand::Truncate { volume, seq } => {
            let (vol, wal, records) = open_log(&volume)?;
            let (_, next) = wal.bounds();
            let to = if seq == next.seq {
                next
            } else {
                match records.iter().find(|(l, _)| l.seq == seq) {
                    Some((l, _)) => *l,
                    None => bail!(
                        "no record {seq} in the log (it holds {}..{})",
                        records.first().map_or(next.seq, |(l, _)| l.seq),
                        next.seq
                    ),
                }
            };
            let trimmed = wal.truncate(to)?;
            close(vol, wal)?;
            outln!("the log starts at seq {seq}; {} trimmed", human(trimmed));
        }
        WalCommand::Bench(b) => bench(b)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn list(s: &str, what: &str) -> Result<Vec<u64>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<u64>()
                .map_err(|_| anyhow::anyhow!("--{what}: {x:?} is not a number"))
        })
        .collect()
}

/// One run's results.
#[derive(serde::Serialize)]
struct Row {
    layout: &'static str,
    record_bytes: u64,
    threads: u64,
    commits: u64,
    groups: u64,
    /// Log and checkpoint bytes written to the backing file, per commit.
    backing_bytes_per_commit: f64,
    log_bytes_per_commit: f64,
    /// Bytes the log handed the volume per commit (whole sectors).
    volume_bytes_per_commit: f64,
    /// Growth of the backing file's allocated blocks per commit.
    physical_bytes_per_commit: f64,
    commits_per_second: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
    latency_us_p999: f64,
}

/// A payload like db_bench's values: half random, half a repeat of it
/// (compresses to about half).
fn payload(r: &mut impl Rng, len: usize) -> Vec<u8> {
    let half: Vec<u8> = (0..len.div_ceil(2)).map(|_| r.gen()).collect();
    let mut p = half.clone();
    p.extend_from_slice(&half);
    p.truncate(len);
    p
}

/// The record version a `--record-version` names.
fn version_arg(v: u32) -> Result<RecordVersion> {
    RecordVersion::from_code(v).with_context(|| format!("no record version {v} (1 or 2)"))
}

fn run_one(
    dir: &std::path::Path,
    size: u64,
    version: RecordVersion,
    layout: Layout,
    record: usize,
    threads: u64,
    commits: u64,
) -> Result<Row> {
    let path = dir.join(format!("wal-{}-{record}-{threads}.sqz", layout.name()));
    let storage = Arc::new(FileStorage::create(&path)?);
    let vol = Arc::new(Volume::create_with(
        storage,
        &CreateOptions::new(size),
        OpenOptions {
            background: true,
            ..Default::default()
        },
    )?);
    let wal = Arc::new(Wal::create_with(vol.clone(), layout, version)?);
    // Warm up (the first segment's allocation, the page cache).
    let mut r = rand::thread_rng();
    for _ in 0..50 {
        wal.append(&payload(&mut r, record))?;
    }
    let s0 = vol.stats();
    let w0 = wal.stats();
    let per = commits / threads;
    let t0 = Instant::now();
    let lat: Vec<Vec<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let wal = wal.clone();
                s.spawn(move || -> Result<Vec<f64>> {
                    let mut r = rand::thread_rng();
                    let mut lat = Vec::with_capacity(per as usize);
                    for _ in 0..per {
                        let p = payload(&mut r, record);
                        let t = Instant::now();
                        wal.append(&p)?;
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    Ok(lat)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect::<Result<Vec<_>>>()
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let s1 = vol.stats();
    let w1 = wal.stats();
    let mut lat: Vec<f64> = lat.into_iter().flatten().collect();
    lat.sort_by(f64::total_cmp);
    let pct = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize];
    let n = (per * threads) as f64;
    let log = (s1.log_bytes_written - s0.log_bytes_written) as f64;
    let ckpt = (s1.checkpoint_bytes_written - s0.checkpoint_bytes_written) as f64;
    let row = Row {
        layout: layout.name(),
        record_bytes: record as u64,
        threads,
        commits: per * threads,
        groups: w1.groups - w0.groups,
        backing_bytes_per_commit: (log + ckpt) / n,
        log_bytes_per_commit: log / n,
        volume_bytes_per_commit: (w1.volume_bytes - w0.volume_bytes) as f64 / n,
        physical_bytes_per_commit: s1.physical_bytes.saturating_sub(s0.physical_bytes) as f64 / n,
        commits_per_second: n / secs,
        latency_us_p50: pct(0.5),
        latency_us_p99: pct(0.99),
        latency_us_p999: pct(0.999),
    };
    drop(wal);
    if let Ok(v) = Arc::try_unwrap(vol) {
        v.close()?;
    }
    std::fs::remove_file(&path)?;
    Ok(row)
}

fn bench(b: BenchArgs) -> Result<()> {
    let sizes = list(&b.sizes, "sizes")?;
    let threads = list(&b.threads, "threads")?;
    if sizes
        .iter()
        .any(|&s| s == 0 || s > squeeze_wal::PAYLOAD_MAX as u64)
        || threads.iter().any(|&t| t == 0 || t > 256)
        || b.commits == 0
    {
        bail!(
            "sizes must be 1..={} bytes, threads 1..=256, commits > 0",
            squeeze_wal::PAYLOAD_MAX
        );
    }
    let version = version_arg(b.record_version)?;
    bench_dir(&b.dir)?;
    let tmp = tempfile::Builder::new()
        .prefix(".squeeze-wal-bench-")
        .tempdir_in(&b.dir)
        .with_context(|| format!("temporary directory in {}", b.dir.display()))?;
    let mut rows = Vec::new();
    if !b.json {
        outln!(
            "{:<7} {:>6} {:>7} {:>7} {:>7} {:>11} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}",
            "layout",
            "bytes",
            "threads",
            "commits",
            "groups",
            "backing/c",
            "log/c",
            "volume/c",
            "commit/s",
            "p50 us",
            "p99 us",
            "p99.9 us"
        );
    }
    for &t in &threads {
        for &s in &sizes {
            for layout in [Layout::Dense, Layout::Sparse] {
                let row = run_one(
                    tmp.path(),
                    b.volume_size,
                    version,
                    layout,
                    s as usize,
                    t,
                    b.commits,
                )?;
                if !b.json {
                    outln!(
                        "{:<7} {:>6} {:>7} {:>7} {:>7} {:>11.1} {:>10.1} {:>10.1} {:>9.0} {:>9.0} {:>9.0} {:>9.0}",
                        row.layout,
                        row.record_bytes,
                        row.threads,
                        row.commits,
                        row.groups,
                        row.backing_bytes_per_commit,
                        row.log_bytes_per_commit,
                        row.volume_bytes_per_commit,
                        row.commits_per_second,
                        row.latency_us_p50,
                        row.latency_us_p99,
                        row.latency_us_p999
                    );
                }
                rows.push(row);
            }
            if !b.json {
                let (d, sp) = (&rows[rows.len() - 2], &rows[rows.len() - 1]);
                outln!(
                    "        sparse writes {:.1}% fewer backing bytes per commit than dense",
                    100.0 * (1.0 - sp.backing_bytes_per_commit / d.backing_bytes_per_commit)
                );
            }
        }
    }
    if b.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}
