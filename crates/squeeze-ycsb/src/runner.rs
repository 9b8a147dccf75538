//! Runs YCSB's phases against a store: the load (every record inserted),
//! then workloads, each a seeded operation stream per thread, so that two
//! stores run with the same seed see the same requests (D's inserts
//! interleave as the threads' timing has it). Measures throughput, the
//! latency of every read and write, CPU per operation (the whole process:
//! a store's background threads count), peak RSS and the bytes on disk.

use crate::db::Db;
use crate::generator::key_name;
use crate::workload::{Chooser, Op, Workload};
use anyhow::{bail, Result};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use squeeze_codec::process::{cpu_seconds, peak_rss};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Config {
    /// Records loaded (YCSB's recordcount).
    pub records: u64,
    /// Operations per workload (YCSB's operationcount), over all threads.
    pub ops: u64,
    pub threads: u64,
    pub value_size: usize,
    /// Each thread makes its writes durable every this many writes (0:
    /// only at the end of a phase).
    pub sync_every: u64,
    pub seed: u64,
}

/// One phase's figures (a line of the JSON output).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PhaseReport {
    pub db: String,
    /// "load", a workload's letter, or "compact".
    pub phase: String,
    pub records: u64,
    pub ops: u64,
    pub threads: u64,
    pub seconds: f64,
    pub ops_per_second: f64,
    pub cpu_seconds: f64,
    pub cpu_us_per_op: f64,
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub read_us_p50: f64,
    pub read_us_p99: f64,
    pub read_us_p999: f64,
    pub write_us_p50: f64,
    pub write_us_p99: f64,
    /// VmHWM of the process so far.
    pub peak_rss_bytes: u64,
    /// `du` of the store after the phase.
    pub physical_bytes: u64,
    pub details: serde_json::Value,
}

/// A value as db_bench makes them: half random bytes, half a repeat of
/// them (compresses about 2:1).
pub fn value(rng: &mut impl Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let half = len.div_ceil(2);
    rng.fill(&mut v[..half]);
    let (a, b) = v.split_at_mut(half);
    let n = b.len();
    b.copy_from_slice(&a[..n]);
    v
}

/// The records inserted so far: numbers handed out, and the prefix of
/// them all acknowledged (what reads may ask for, as YCSB's
/// `AcknowledgedCounterGenerator`).
pub struct Inserts {
    next: AtomicU64,
    acked: Mutex<(u64, BTreeSet<u64>)>,
}

impl Inserts {
    pub fn new(records: u64) -> Inserts {
        Inserts {
            next: AtomicU64::new(records),
            acked: Mutex::new((records, BTreeSet::new())),
        }
    }

    fn take(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn ack(&self, n: u64) {
        let mut a = self.acked.lock();
        let (limit, waiting) = &mut *a;
        waiting.insert(n);
        while waiting.remove(limit) {
            *limit += 1;
        }
    }

    /// Every record below this is present.
    pub fn present(&self) -> u64 {
        self.acked.lock().0
    }
}

/// Latencies of one kind, in nanoseconds: a log-linear histogram (32
/// steps per power of two, so a percentile is within about 3%), a few KiB
/// whatever the number of operations, so that the driver's own memory does
/// not weigh on the stores' peak RSS.
#[derive(Clone)]
pub struct Lat {
    counts: Vec<u64>,
    n: u64,
}

impl Default for Lat {
    fn default() -> Self {
        Lat {
            counts: vec![0; 64 + 58 * 32],
            n: 0,
        }
    }
}

impl Lat {
    fn index(v: u64) -> usize {
        if v < 64 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros() as usize; // 6..=63
        64 + (e - 6) * 32 + ((v >> (e - 5)) & 31) as usize
    }

    /// The smallest value of bucket `i`.
    fn low(i: usize) -> u64 {
        if i < 64 {
            return i as u64;
        }
        let (e, sub) = ((i - 64) / 32 + 6, ((i - 64) % 32) as u64);
        (32 + sub) << (e - 5)
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.n += 1;
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn merge(&mut self, o: &Lat) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.n += o.n;
    }

    /// The `q` quantile in microseconds (the middle of its bucket).
    pub fn pct(&self, q: f64) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        let rank = ((self.n - 1) as f64 * q).round() as u64;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > rank {
                let (lo, hi) = (Self::low(i), Self::low(i + 1));
                return (lo + hi) as f64 / 2.0 / 1e3;
            }
        }
        unreachable!("rank below the count")
    }
}

struct ThreadResult {
    reads: Lat,
    writes: Lat,
    syncs: u64,
}

/// Progress on stderr, about every 10 s.
struct Progress {
    done: AtomicU64,
    t0: Instant,
    last: Mutex<Instant>,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            done: AtomicU64::new(0),
            t0: Instant::now(),
            last: Mutex::new(Instant::now()),
        }
    }

    fn tick(&self, n: u64, total: u64, what: &str) {
        let d = self.done.fetch_add(n, Ordering::Relaxed) + n;
        let mut last = self.last.lock();
        if last.elapsed() >= Duration::from_secs(10) {
            *last = Instant::now();
            let s = self.t0.elapsed().as_secs_f64();
            eprintln!(
                "  {what}: {d} of {total} ops ({:.0}%), {:.0} ops/s",
                d as f64 * 100.0 / total as f64,
                d as f64 / s
            );
        }
    }
}

/// Runs `per_thread(thread, rng, lat)` on every thread and gathers the
/// phase's figures.
fn phase(
    db: &dyn Db,
    name: &str,
    cfg: &Config,
    ops: u64,
    body: impl Fn(u64, &mut StdRng, &mut ThreadResult, &Progress) -> Result<()> + Sync,
) -> Result<PhaseReport> {
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let progress = Progress::new();
    let results: Vec<ThreadResult> = std::thread::scope(|sc| -> Result<Vec<ThreadResult>> {
        let hs: Vec<_> = (0..cfg.threads)
            .map(|t| {
                let (body, progress) = (&body, &progress);
                sc.spawn(move || -> Result<ThreadResult> {
                    // The same stream for the same seed, phase and thread,
                    // whatever the store.
                    let seed = cfg.seed ^ (t << 32) ^ u64::from(name.as_bytes()[0]) << 48;
                    let mut rng = StdRng::seed_from_u64(seed);
                    let mut r = ThreadResult {
                        reads: Lat::default(),
                        writes: Lat::default(),
                        syncs: 0,
                    };
                    body(t, &mut rng, &mut r, progress)?;
                    Ok(r)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("worker thread"))
            .collect()
    })?;
    db.sync()?;
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let mut reads = Lat::default();
    let mut writes = Lat::default();
    for r in &results {
        reads.merge(&r.reads);
        writes.merge(&r.writes);
    }
    Ok(PhaseReport {
        db: db.name(),
        phase: name.into(),
        records: cfg.records,
        ops,
        threads: cfg.threads,
        seconds,
        ops_per_second: ops as f64 / seconds,
        cpu_seconds: cpu,
        cpu_us_per_op: cpu * 1e6 / ops as f64,
        reads: reads.len(),
        writes: writes.len(),
        syncs: results.iter().map(|r| r.syncs).sum::<u64>() + 1,
        read_us_p50: reads.pct(0.5),
        read_us_p99: reads.pct(0.99),
        read_us_p999: reads.pct(0.999),
        write_us_p50: writes.pct(0.5),
        write_us_p99: writes.pct(0.99),
        peak_rss_bytes: peak_rss(),
        physical_bytes: db.physical_bytes()?,
        details: db.details(),
    })
}

/// A timed put, with a sync every `sync_every` writes of the thread.
fn write(db: &dyn Db, cfg: &Config, r: &mut ThreadResult, k: &[u8], v: &[u8]) -> Result<()> {
    let t = Instant::now();
    db.put(k, v)?;
    r.writes.record(t.elapsed().as_nanos() as u64);
    if cfg.sync_every > 0 && r.writes.len().is_multiple_of(cfg.sync_every) {
        db.sync()?;
        r.syncs += 1;
    }
    Ok(())
}

/// A timed get of record `n`, which must be there.
fn read(db: &dyn Db, r: &mut ThreadResult, n: u64) -> Result<Vec<u8>> {
    let k = key_name(n);
    let t = Instant::now();
    let v = db.get(k.as_bytes())?;
    r.reads.record(t.elapsed().as_nanos() as u64);
    match v {
        Some(v) => Ok(v),
        None => bail!("record {n} (key {k}) is missing"),
    }
}

/// Inserts records `0..records`, record `i` by thread `i % threads`.
pub fn load(db: &dyn Db, cfg: &Config) -> Result<PhaseReport> {
    phase(db, "load", cfg, cfg.records, |t, rng, r, p| {
        let mut i = t;
        let mut n = 0;
        while i < cfg.records {
            write(
                db,
                cfg,
                r,
                key_name(i).as_bytes(),
                &value(rng, cfg.value_size),
            )?;
            i += cfg.threads;
            n += 1;
            if n % 4096 == 0 {
                p.tick(4096, cfg.records, "load");
            }
        }
        Ok(())
    })
}

/// Runs workload `w`: `cfg.ops` operations over all threads.
pub fn run(db: &dyn Db, w: &Workload, cfg: &Config, inserts: &Inserts) -> Result<PhaseReport> {
    let name = w.name.to_string();
    let per = cfg.ops / cfg.threads;
    let label = format!("workload {}", w.name);
    phase(db, &name, cfg, per * cfg.threads, |_, rng, r, p| {
        let mut chooser = Chooser::new(w.dist, cfg.records);
        for n in 0..per {
            match w.op(rng) {
                Op::Read => {
                    let k = chooser.next(rng, inserts.present());
                    read(db, r, k)?;
                }
                Op::Update => {
                    let k = chooser.next(rng, inserts.present());
                    let v = value(rng, cfg.value_size);
                    write(db, cfg, r, key_name(k).as_bytes(), &v)?;
                }
                Op::Insert => {
                    let k = inserts.take();
                    let v = value(rng, cfg.value_size);
                    write(db, cfg, r, key_name(k).as_bytes(), &v)?;
                    inserts.ack(k);
                }
                Op::ReadModifyWrite => {
                    let k = chooser.next(rng, inserts.present());
                    let mut v = read(db, r, k)?;
                    // Modify one "field" (a tenth of the value), as YCSB's
                    // read-modify-write updates one field of ten.
                    let f = v.len() / 10;
                    let at = rng.gen_range(0..10) * f;
                    rng.fill(&mut v[at..at + f]);
                    write(db, cfg, r, key_name(k).as_bytes(), &v)?;
                }
            }
            if (n + 1) % 4096 == 0 {
                p.tick(4096, per * cfg.threads, &label);
            }
        }
        Ok(())
    })
}

/// Compacts the store and measures what it then occupies.
pub fn compact(db: &dyn Db, cfg: &Config) -> Result<PhaseReport> {
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    db.compact()?;
    db.sync()?;
    let cpu = cpu_seconds() - cpu0;
    Ok(PhaseReport {
        db: db.name(),
        phase: "compact".into(),
        records: cfg.records,
        threads: cfg.threads,
        seconds: t0.elapsed().as_secs_f64(),
        cpu_seconds: cpu,
        peak_rss_bytes: peak_rss(),
        physical_bytes: db.physical_bytes()?,
        details: db.details(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_compress_about_half() {
        let mut r = StdRng::seed_from_u64(5);
        let v = value(&mut r, 400);
        assert_eq!(v.len(), 400);
        assert_eq!(v[..200], v[200..]);
        let v = value(&mut r, 401);
        assert_eq!(v[..200], v[201..]);
    }

    #[test]
    fn latency_percentiles_are_within_their_bucket() {
        let mut l = Lat::default();
        assert_eq!(l.pct(0.5), 0.0);
        for v in 1..=100_000u64 {
            l.record(v * 1000); // 1 us .. 100 ms
        }
        for (q, want) in [(0.5, 50_000.0), (0.99, 99_000.0), (0.999, 99_900.0)] {
            let got = l.pct(q);
            assert!(
                (got - want).abs() / want < 0.03,
                "p{q}: {got} us, want {want}"
            );
        }
        let mut m = Lat::default();
        m.record(5);
        m.merge(&l);
        assert_eq!(m.len(), 100_001);
        assert!(m.pct(0.0) < 0.01);
        // Every value falls in the bucket whose bounds hold it.
        for v in [0, 1, 63, 64, 65, 1000, 123_456_789, u64::MAX >> 1] {
            let i = Lat::index(v);
            assert!(Lat::low(i) <= v && v < Lat::low(i + 1).max(v + 1), "{v}");
        }
    }

    #[test]
    fn inserts_are_acknowledged_in_prefix_order() {
        let i = Inserts::new(10);
        let (a, b, c) = (i.take(), i.take(), i.take());
        assert_eq!((a, b, c), (10, 11, 12));
        i.ack(b);
        assert_eq!(i.present(), 10);
        i.ack(a);
        assert_eq!(i.present(), 12);
        i.ack(c);
        assert_eq!(i.present(), 13);
    }
}
