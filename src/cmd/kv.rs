//! `squeeze kv ...`: a table-less hash key-value store (crate squeeze-kv)
//! on a volume.
//!
//! - `create VOLUME [--buckets N] [--seed S] [--probe-max P]`
//! - `put VOLUME KEY VALUE`, `get VOLUME KEY`, `delete VOLUME KEY`
//! - `load VOLUME --keys N`: N keys with db_bench-like values
//! - `bench`: load a fresh store, then uniform random reads and updates;
//!   ops/s, read latency, CPU per operation, peak memory, physical bytes.

use crate::util::{bench_dir, human, open_volume};
use anyhow::{bail, Context, Result};
use rand::Rng;
use squeeze_codec::process::{cpu_seconds as process_cpu_seconds, peak_rss};
use squeeze_engine::{Volume, MAX_LOGICAL_SIZE, SECTOR_SIZE};
use squeeze_kv::{CreateStore, Expect, Store, PROBE_MAX_DEFAULT};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: KvCommand,
}

#[derive(clap::Subcommand)]
pub enum KvCommand {
    /// Create a store on an empty volume.
    Create {
        volume: PathBuf,
        /// Buckets (4 KiB sectors); default every sector after the header.
        #[arg(long)]
        buckets: Option<u64>,
        /// XXH64 seed of the key hash.
        #[arg(long, default_value = "0")]
        seed: u64,
        /// Buckets a key may spill over into, from its home.
        #[arg(long, default_value_t = PROBE_MAX_DEFAULT)]
        probe_max: u32,
    },
    /// Store a value (durable when the command returns).
    Put {
        volume: PathBuf,
        key: String,
        value: String,
    },
    /// Print a key's value (exit 1 if there is none).
    Get { volume: PathBuf, key: String },
    /// Remove a key (durable when the command returns).
    Delete { volume: PathBuf, key: String },
    /// Put N keys (user000000000000...) with db_bench-like values, each a
    /// function of its key (so a reader can verify them).
    Load {
        volume: PathBuf,
        #[arg(long)]
        keys: u64,
        #[arg(long, default_value = "400")]
        value_size: usize,
        #[arg(long, default_value = "2")]
        threads: u64,
        /// Flush after every this many keys (0: only at the end) and print
        /// `durable through key N` (every key below N is durable).
        #[arg(long, default_value = "0")]
        sync_every: u64,
    },
    /// Load a fresh store, then read and update at random.
    Bench(BenchArgs),
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Directory for the temporary volume.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    #[arg(long, default_value = "1000000")]
    pub keys: u64,
    #[arg(long, default_value = "400")]
    pub value_size: usize,
    /// Buckets per key (the logical space wasted on purpose; a quarter:
    /// four 400-byte records to a 4 KiB bucket): a positive number.
    #[arg(long, default_value_t = squeeze_kv::BUCKETS_PER_KEY_DEFAULT,
          value_parser = parse_buckets_per_key)]
    pub buckets_per_key: f64,
    #[arg(long, default_value = "2")]
    pub threads: u64,
    /// Random operations after the load.
    #[arg(long, default_value = "1000000")]
    pub ops: u64,
    /// Percent of the random operations that are updates (the rest reads).
    #[arg(long, default_value = "50")]
    pub update_percent: u32,
    /// Flush after every this many operations per thread (0: only at the end).
    #[arg(long, default_value = "0")]
    pub sync_every: u64,
    #[arg(long)]
    pub json: bool,
}

/// `--buckets-per-key`: a finite number above 0.
fn parse_buckets_per_key(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok(n),
        _ => Err("give a number above 0 (0.25: four records to a bucket)".into()),
    }
}

fn open_store(path: &Path) -> Result<(Arc<Volume>, Store)> {
    let vol = Arc::new(open_volume(path, false)?);
    let s = Store::open(vol.clone(), Expect::default())
        .with_context(|| format!("cannot open the store on {}", path.display()))?;
    Ok((vol, s))
}

fn close(vol: Arc<Volume>, s: Store) -> Result<()> {
    drop(s);
    match Arc::try_unwrap(vol) {
        Ok(v) => Ok(v.close()?),
        Err(_) => bail!("the volume is still in use"),
    }
}

/// The key of index `i` (YCSB's shape).
fn key(i: u64) -> Vec<u8> {
    format!("user{i:012}").into_bytes()
}

/// The value `load` puts under key `i`: db_bench-like, a function of `i`.
pub fn load_value(i: u64, len: usize) -> Vec<u8> {
    let half = squeeze_codec::testdata::random(len.div_ceil(2), i);
    let mut v = half.clone();
    v.extend_from_slice(&half);
    v.truncate(len);
    v
}

/// A value like db_bench's: half random, half a repeat (compresses ~2:1).
fn value(r: &mut impl Rng, len: usize) -> Vec<u8> {
    let half: Vec<u8> = (0..len.div_ceil(2)).map(|_| r.gen()).collect();
    let mut v = half.clone();
    v.extend_from_slice(&half);
    v.truncate(len);
    v
}

/// Puts keys `0..keys` from `threads` threads (key `i` on thread
/// `i % threads`), flushing every `sync_every` keys (0: at the end), and
/// prints how far every key is durable after each flush.
fn load(s: &Store, keys: u64, value_size: usize, threads: u64, sync_every: u64) -> Result<f64> {
    let t0 = Instant::now();
    // Keys each thread has put, in order.
    let done: Vec<std::sync::atomic::AtomicU64> =
        (0..threads).map(|_| Default::default()).collect();
    let flushed = parking_lot::Mutex::new(0u64);
    std::thread::scope(|sc| -> Result<()> {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (done, flushed) = (&done, &flushed);
                sc.spawn(move || -> Result<()> {
                    let mut i = t;
                    let mut n = 0u64;
                    while i < keys {
                        s.put(&key(i), &load_value(i, value_size))?;
                        n += 1;
                        done[t as usize].store(n, std::sync::atomic::Ordering::SeqCst);
                        if sync_every > 0 && n.is_multiple_of(sync_every.div_ceil(threads)) {
                            // Every put any thread finished before this
                            // flush started is durable after it.
                            let through = (0..threads)
                                .map(|u| {
                                    let k =
                                        done[u as usize].load(std::sync::atomic::Ordering::SeqCst);
                                    k * threads + u
                                })
                                .min()
                                .unwrap_or(0);
                            s.flush()?;
                            let mut f = flushed.lock();
                            if through > *f {
                                *f = through;
                                outln!("durable through key {through}");
                            }
                        }
                        i += threads;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().expect("load thread")?;
        }
        Ok(())
    })?;
    s.flush()?;
    if sync_every > 0 {
        outln!("durable through key {keys}");
    }
    Ok(t0.elapsed().as_secs_f64())
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.command {
        KvCommand::Create {
            volume,
            buckets,
            seed,
            probe_max,
        } => {
            let vol = Arc::new(open_volume(&volume, false)?);
            let s = Store::create(
                vol.clone(),
                CreateStore {
                    buckets,
                    seed,
                    probe_max,
                },
            )
            .with_context(|| format!("cannot create a store on {}", volume.display()))?;
            let h = s.header();
            close(vol, s)?;
            outln!(
                "created a store on {}: {} buckets, seed {}, probe_max {}",
                volume.display(),
                h.buckets,
                h.seed,
                h.probe_max
            );
        }
        KvCommand::Put { volume, key, value } => {
            let (vol, s) = open_store(&volume)?;
            s.put(key.as_bytes(), value.as_bytes())?;
            s.flush()?;
            close(vol, s)?;
        }
        KvCommand::Get { volume, key } => {
            let (vol, s) = open_store(&volume)?;
            let v = s.get(key.as_bytes())?;
            close(vol, s)?;
            match v {
                Some(v) => outln!("{}", String::from_utf8_lossy(&v)),
                None => {
                    eprintln!("no key {key:?}");
                    return Ok(ExitCode::from(1));
                }
            }
        }
        KvCommand::Delete { volume, key } => {
            let (vol, s) = open_store(&volume)?;
            let found = s.delete(key.as_bytes())?;
            s.flush()?;
            close(vol, s)?;
            if !found {
                eprintln!("no key {key:?}");
                return Ok(ExitCode::from(1));
            }
        }
        KvCommand::Load {
            volume,
            keys,
            value_size,
            threads,
            sync_every,
        } => {
            let (vol, s) = open_store(&volume)?;
            let secs = load(&s, keys, value_size, threads.max(1), sync_every)?;
            let st = vol.stats();
            close(vol, s)?;
            outln!(
                "loaded {keys} keys in {secs:.2} s ({:.0} puts/s); physical {}, stored {}",
                keys as f64 / secs,
                human(st.physical_bytes),
                human(st.stored_bytes)
            );
        }
        KvCommand::Bench(b) => bench(b)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn bench(b: BenchArgs) -> Result<()> {
    if b.keys == 0 || b.threads == 0 || b.update_percent > 100 {
        bail!("--keys and --threads must be positive, --update-percent <= 100");
    }
    // One 4 KiB sector per bucket, and the store's header.
    let most = MAX_LOGICAL_SIZE / SECTOR_SIZE as u64 - 1;
    let want = b.keys as f64 * b.buckets_per_key;
    if want > most as f64 {
        bail!(
            "--keys {} x --buckets-per-key {:e} is more buckets than a volume holds \
             ({most}, one 4 KiB sector each)",
            b.keys,
            b.buckets_per_key
        );
    }
    bench_dir(&b.dir)?;
    let tmp = tempfile::Builder::new()
        .prefix(".squeeze-kv-bench-")
        .tempdir_in(&b.dir)
        .with_context(|| format!("temporary directory in {}", b.dir.display()))?;
    let buckets = (want as u64).max(PROBE_MAX_DEFAULT as u64);
    let path = tmp.path().join("kv.sqz");
    let vol = squeeze_kv::create_volume(&path, buckets)?;
    let s = Store::create(
        vol.clone(),
        CreateStore {
            buckets: Some(buckets),
            ..Default::default()
        },
    )?;
    let cpu0 = process_cpu_seconds();
    let load_secs = load(&s, b.keys, b.value_size, b.threads, 0)?;
    let load_cpu = process_cpu_seconds() - cpu0;
    let loaded = vol.stats();
    let per = b.ops / b.threads;
    let cpu1 = process_cpu_seconds();
    let t0 = Instant::now();
    let lat: Vec<Vec<f64>> = std::thread::scope(|sc| -> Result<Vec<Vec<f64>>> {
        let hs: Vec<_> = (0..b.threads)
            .map(|_| {
                let s = &s;
                let b = &b;
                sc.spawn(move || -> Result<Vec<f64>> {
                    let mut r = rand::thread_rng();
                    let mut lat = Vec::new();
                    for n in 0..per {
                        let k = key(r.gen_range(0..b.keys));
                        if r.gen_range(0..100) < b.update_percent {
                            s.put(&k, &value(&mut r, b.value_size))?;
                        } else {
                            let t = Instant::now();
                            if s.get(&k)?.is_none() {
                                bail!("key {} lost", String::from_utf8_lossy(&k));
                            }
                            lat.push(t.elapsed().as_secs_f64() * 1e6);
                        }
                        if b.sync_every > 0 && (n + 1) % b.sync_every == 0 {
                            s.flush()?;
                        }
                    }
                    Ok(lat)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    })?;
    s.flush()?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu1;
    let mut lat: Vec<f64> = lat.into_iter().flatten().collect();
    lat.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * q).round() as usize]
        }
    };
    let st = vol.stats();
    let ops = (per * b.threads) as f64;
    let report = serde_json::json!({
        "keys": b.keys,
        "value_size": b.value_size,
        "buckets": buckets,
        "logical_bytes": (buckets + 1) * 4096,
        "threads": b.threads,
        "load_seconds": load_secs,
        "load_puts_per_second": b.keys as f64 / load_secs,
        "load_cpu_us_per_put": load_cpu * 1e6 / b.keys as f64,
        "physical_bytes_after_load": loaded.physical_bytes,
        "stored_bytes_after_load": loaded.stored_bytes,
        "ops": ops,
        "update_percent": b.update_percent,
        "ops_per_second": ops / secs,
        "cpu_us_per_op": cpu * 1e6 / ops,
        "read_latency_us_p50": pct(0.5),
        "read_latency_us_p99": pct(0.99),
        "read_latency_us_p999": pct(0.999),
        "physical_bytes": st.physical_bytes,
        "stored_bytes": st.stored_bytes,
        "peak_rss_bytes": peak_rss(),
    });
    drop(s);
    if let Ok(v) = Arc::try_unwrap(vol) {
        v.close()?;
    }
    if b.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(
            "loaded {} keys of {} B into {} buckets ({} logical) in {:.1} s: {:.0} puts/s, {:.1} us CPU/put; physical {}",
            b.keys,
            b.value_size,
            buckets,
            human((buckets + 1) * 4096),
            load_secs,
            b.keys as f64 / load_secs,
            load_cpu * 1e6 / b.keys as f64,
            human(loaded.physical_bytes)
        );
        outln!(
            "{} random ops ({}% updates): {:.0} ops/s, {:.1} us CPU/op; reads p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us",
            ops,
            b.update_percent,
            ops / secs,
            cpu * 1e6 / ops,
            pct(0.5),
            pct(0.99),
            pct(0.999)
        );
        outln!(
            "physical {} (stored {}), peak RSS {}",
            human(st.physical_bytes),
            human(st.stored_bytes),
            human(peak_rss())
        );
    }
    Ok(())
}
