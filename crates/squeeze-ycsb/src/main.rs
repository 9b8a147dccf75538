//! `squeeze-ycsb`: YCSB's core workloads against squeeze-kv and RocksDB.
//!
//!   squeeze-ycsb run --db kv --dir D --records 5000000 --ops 1000000 >> out.jsonl
//!   squeeze-ycsb run --db rocksdb --compression lz4-zstd --dir D2 ... >> out.jsonl
//!   squeeze-ycsb table out.jsonl
//!
//! One store per process, so that peak RSS is the store's own. RocksDB
//! needs the binary built with `--features rocksdb` (bench/ycsb.sh does).

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use squeeze_ycsb::db::{Db, KvDb, RocksCompression};
use squeeze_ycsb::runner::{self, Config, Inserts, PhaseReport};
use squeeze_ycsb::workload::Workload;
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "squeeze-ycsb",
    version,
    about = "YCSB core workloads against squeeze-kv and RocksDB"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Load the records, run the workloads, compact; one JSON line per phase
    /// on stdout, progress on stderr.
    Run(RunArgs),
    /// A markdown table of the JSON lines of runs.
    Table { files: Vec<PathBuf> },
}

#[derive(clap::Args)]
struct RunArgs {
    /// kv (squeeze-kv on a thin squeeze volume) or rocksdb.
    #[arg(long)]
    db: String,
    /// RocksDB's compression: none, lz4, lz4-zstd (lz4, zstd at the bottom level).
    #[arg(long, default_value = "none")]
    compression: RocksCompression,
    /// An empty directory (created) for the store.
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Operations per workload, over all threads.
    #[arg(long, default_value_t = 1_000_000)]
    ops: u64,
    #[arg(long, default_value_t = 2)]
    threads: u64,
    /// Workloads in the order YCSB recommends (D inserts, so it comes last).
    #[arg(long, default_value = "a,b,c,f,d")]
    workloads: String,
    #[arg(long, default_value_t = 400)]
    value_size: usize,
    /// Each thread makes its writes durable every N writes (0: at phase ends).
    #[arg(long, default_value_t = 1000)]
    sync_every: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// squeeze-kv buckets (4 KiB each) per record, loaded and inserted
    /// (a quarter: four records to a bucket, whose records share its
    /// header and compression frame; 0.5 writes faster and stores ~7% more).
    #[arg(long, default_value_t = squeeze_kv::BUCKETS_PER_KEY_DEFAULT)]
    buckets_per_key: f64,
    /// squeeze-kv: bytes of RAM its volume's sector map may use (K, M, G
    /// suffixes; default squeeze-kv's own).
    #[arg(long, value_parser = parse_size)]
    map_cache: Option<u64>,
    /// Skip the final compaction.
    #[arg(long)]
    no_compact: bool,
}

fn main() -> Result<()> {
    tune_allocator();
    match Cli::parse().cmd {
        Cmd::Run(a) => run(a),
        Cmd::Table { files } => table(&files),
    }
}

/// glibc's allocator as a long-running embedded store would set it, for
/// every store alike: two arenas rather than eight per core, and buffers
/// from 256 KiB up mapped and unmapped on their own rather than kept in an
/// arena after they are freed (glibc otherwise raises that threshold to the
/// largest buffer freed, up to 32 MiB, and a freed checkpoint piece or
/// segment buffer stays resident). On the 5 M-record squeeze-kv load this
/// took peak RSS from 91 to 81 MiB (docs/benchmarks-history.md). Free
/// memory at the top of an arena goes back to the system from 128 KiB
/// (not 1 MiB), and the heap grows by what it needs plus 16 KiB (not
/// 128 KiB): 14.7 against 14.4 MiB at 5 M records in session 27 (one run
/// each, a shared machine).
fn tune_allocator() {
    // SAFETY: mallopt with plain integer arguments, before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 10);
        libc::mallopt(libc::M_TOP_PAD, 16 << 10);
    }
}

/// A size in bytes, with an optional K, M or G suffix (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let (num, shift) = match s.strip_suffix(['K', 'k']) {
        Some(n) => (n, 10),
        None => match s.strip_suffix(['M', 'm']) {
            Some(n) => (n, 20),
            None => match s.strip_suffix(['G', 'g']) {
                Some(n) => (n, 30),
                None => (s, 0),
            },
        },
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or a number with K, M or G)"))
}

fn open_db(a: &RunArgs, records_total: u64) -> Result<Box<dyn Db>> {
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create {}", a.dir.display()))?;
    if std::fs::read_dir(&a.dir)?.next().is_some() {
        bail!("{} is not empty", a.dir.display());
    }
    Ok(match a.db.as_str() {
        "kv" | "squeeze-kv" => {
            if a.buckets_per_key.is_nan() || a.buckets_per_key <= 0.0 {
                bail!("--buckets-per-key must be positive");
            }
            let buckets = ((records_total as f64 * a.buckets_per_key) as u64)
                .max(u64::from(squeeze_kv::PROBE_MAX_DEFAULT));
            // The default layout keeps the plain name; others say theirs.
            let name = if a.buckets_per_key == squeeze_kv::BUCKETS_PER_KEY_DEFAULT {
                "squeeze-kv".to_string()
            } else {
                format!("squeeze-kv ({} buckets/record)", a.buckets_per_key)
            };
            let mut v = squeeze_kv::VolumeOptions::default();
            if let Some(c) = a.map_cache {
                v.map_cache = c;
            }
            Box::new(KvDb::create(&a.dir, buckets, &name, v)?)
        }
        "rocksdb" => rocksdb(a)?,
        d => bail!("unknown --db {d:?} (kv, rocksdb)"),
    })
}

#[cfg(feature = "rocksdb")]
fn rocksdb(a: &RunArgs) -> Result<Box<dyn Db>> {
    Ok(Box::new(squeeze_ycsb::db::RocksDb::create(
        &a.dir,
        a.compression,
    )?))
}

#[cfg(not(feature = "rocksdb"))]
fn rocksdb(_: &RunArgs) -> Result<Box<dyn Db>> {
    bail!("this squeeze-ycsb was built without RocksDB: build it with --features rocksdb (bench/ycsb.sh)")
}

fn run(a: RunArgs) -> Result<()> {
    if a.records == 0 || a.threads == 0 || a.ops < a.threads {
        bail!("--records and --threads must be positive, --ops at least --threads");
    }
    let workloads: Vec<Workload> = a
        .workloads
        .split(',')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.trim().chars();
            match (c.next(), c.next()) {
                (Some(ch), None) => Workload::get(ch),
                _ => bail!("a workload is one letter, not {w:?}"),
            }
        })
        .collect::<Result<_>>()?;
    let inserts_expected: u64 = workloads
        .iter()
        .map(|w| a.ops * u64::from(w.insert) / 100 + a.threads)
        .sum();
    let db = open_db(&a, a.records + inserts_expected)?;
    let cfg = Config {
        records: a.records,
        ops: a.ops,
        threads: a.threads,
        value_size: a.value_size,
        sync_every: a.sync_every,
        seed: a.seed,
    };
    let out = |r: &PhaseReport| -> Result<()> {
        eprintln!(
            "{} {}: {:.0} ops/s, {:.1} us CPU/op, read p99 {:.0} us, RSS {} MiB, disk {} MiB",
            r.db,
            r.phase,
            r.ops_per_second,
            r.cpu_us_per_op,
            r.read_us_p99,
            r.peak_rss_bytes >> 20,
            r.physical_bytes >> 20
        );
        let mut o = std::io::stdout().lock();
        writeln!(o, "{}", serde_json::to_string(r)?)?;
        o.flush()?;
        Ok(())
    };
    eprintln!("{}: loading {} records", db.name(), a.records);
    out(&runner::load(db.as_ref(), &cfg)?)?;
    let inserts = Inserts::new(a.records);
    for w in &workloads {
        eprintln!("{}: workload {} ({})", db.name(), w.name, w.what);
        out(&runner::run(db.as_ref(), w, &cfg, &inserts)?)?;
    }
    if !a.no_compact {
        eprintln!("{}: compacting", db.name());
        out(&runner::compact(db.as_ref(), &cfg)?)?;
    }
    Ok(())
}

fn table(files: &[PathBuf]) -> Result<()> {
    let mut rows: Vec<PhaseReport> = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
        for (i, l) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            rows.push(
                serde_json::from_str(l)
                    .with_context(|| format!("{}:{}: not a phase report", f.display(), i + 1))?,
            );
        }
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!("| store | phase | ops/s | CPU us/op | read p50 / p99 / p99.9 us | write p50 / p99 us | peak RSS MiB | disk MiB |");
    println!("|---|---|---:|---:|---|---|---:|---:|");
    for r in &rows {
        if r.phase == "compact" {
            println!(
                "| {} | compact ({:.0} s) | | | | | {:.0} | {:.0} |",
                r.db,
                r.seconds,
                mib(r.peak_rss_bytes),
                mib(r.physical_bytes)
            );
            continue;
        }
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} | {:.0} | {:.0} |",
            r.db,
            r.phase,
            r.ops_per_second,
            r.cpu_us_per_op,
            r.read_us_p50,
            r.read_us_p99,
            r.read_us_p999,
            r.write_us_p50,
            r.write_us_p99,
            mib(r.peak_rss_bytes),
            mib(r.physical_bytes)
        );
    }
    Ok(())
}
