//! The log across power cuts: random appends (alone and from several
//! threads at once, so groups hold several records), truncations and
//! power cuts (between operations and at a chosen I/O inside one, through
//! the engine's simulator, which keeps a random page-granular subset of
//! unsynced writes), against a model. After each crash the recovered log
//! must start at the last completed truncation (or the one in flight),
//! hold every acknowledged record after it with its place and payload, and
//! nothing else but records whose appends were in flight. A small volume
//! makes the log wrap around its area many times.
//!
//! Logs of record version 2 (what `Wal::create` makes), and of version 1
//! (the logs of earlier releases) on a quarter of the seeds.
//!
//! SQUEEZE_WAL_SIM_SEEDS=N runs N seeds per layout (default 100);
//! SQUEEZE_WAL_SIM_SEED=S replays one. (Variables of their own: the
//! SQUEEZE_SIM_SEEDS=2000 of scripts/test.sh sizes the engine's simulators.)

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::{SimFaults, SimStorage};
use squeeze_wal::{Layout, Lsn, RecordVersion, Wal, WalError};
use std::collections::HashSet;
use std::sync::Arc;

/// A payload, the outcome of its append, and whether it was refused as full.
type Appended = (Vec<u8>, Result<Lsn, String>, bool);

struct Model {
    /// Acknowledged live records, in order.
    log: Vec<(Lsn, Vec<u8>)>,
    /// Where the log starts: the last completed truncation; and one in flight.
    head_seq: u64,
    head_in_flight: Option<u64>,
    /// Payloads whose appends were issued and not acknowledged.
    in_flight: HashSet<Vec<u8>>,
}

impl Model {
    /// Checks what a reopened log holds (`got`, from its start `first`).
    fn check(&mut self, first: u64, got: Vec<(Lsn, Vec<u8>)>, seed: u64, step: usize) {
        if let Some((l, _)) = got.first() {
            assert_eq!(l.seq, first, "seed {seed} step {step}: first record");
        }
        let start_ok = first == self.head_seq || Some(first) == self.head_in_flight;
        assert!(
            start_ok,
            "seed {seed} step {step}: log starts at {first}, expected {} (or {:?})",
            self.head_seq, self.head_in_flight
        );
        let by_seq: std::collections::HashMap<u64, &(Lsn, Vec<u8>)> =
            got.iter().map(|r| (r.0.seq, r)).collect();
        for (lsn, p) in &self.log {
            if lsn.seq < first {
                continue;
            }
            let Some((l, q)) = by_seq.get(&lsn.seq) else {
                panic!(
                    "seed {seed} step {step}: acknowledged record {} lost",
                    lsn.seq
                );
            };
            assert_eq!(l, lsn, "seed {seed} step {step}: record moved");
            assert_eq!(q, p, "seed {seed} step {step}: record {} changed", lsn.seq);
        }
        let acked: HashSet<u64> = self.log.iter().map(|(l, _)| l.seq).collect();
        for (i, (lsn, p)) in got.iter().enumerate() {
            assert_eq!(
                lsn.seq,
                first + i as u64,
                "seed {seed} step {step}: seq gap"
            );
            if !acked.contains(&lsn.seq) {
                assert!(
                    self.in_flight.contains(p),
                    "seed {seed} step {step}: record {} holds a payload never appended",
                    lsn.seq
                );
            }
        }
        self.head_seq = first;
        self.head_in_flight = None;
        self.in_flight.clear();
        self.log = got;
    }
}

fn recover(
    r: &mut impl Rng,
    disk: &Arc<SimStorage>,
    layout: Layout,
    m: &mut Model,
    seed: u64,
    step: usize,
) -> (Arc<SimStorage>, Wal) {
    let disk = Arc::new(disk.crash(r));
    let vol = open_volume(&disk).unwrap_or_else(|e| panic!("seed {seed}: volume: {e}"));
    let (wal, got) = open_log(&vol, layout).unwrap_or_else(|e| panic!("seed {seed}: log: {e}"));
    m.check(wal.bounds().0.seq, got, seed, step);
    (disk, wal)
}

/// What a seed went through.
#[derive(Default)]
struct Seen {
    crashes: u64,
    full: u64,
    /// Laps of the record area the log made.
    laps: u64,
    multi_record_groups: u64,
}

fn run_seed(layout: Layout, version: RecordVersion, seed: u64, seen: &mut Seen) {
    let mut r = rng(seed);
    // Small volumes, so the log fills its area and wraps around it.
    let size: u64 = match layout {
        Layout::Dense => 256 << 10,
        Layout::Sparse => 1 << 20,
    };
    let (mut disk, vol) = sim_volume(size);
    let mut wal = Wal::create_with(vol, layout, version).unwrap();
    let mut m = Model {
        log: Vec::new(),
        head_seq: 0,
        head_in_flight: None,
        in_flight: HashSet::new(),
    };
    let mut n = 0u64;
    let steps = r.gen_range(100..400);
    let mut armed = false;
    for step in 0..steps {
        let op = r.gen_range(0..100);
        if std::env::var("SQUEEZE_WAL_SIM_SEED").is_ok() {
            println!("step {step}: op {op}, bounds {:?}", wal.bounds());
        }
        let failed = match op {
            0..=59 | 87..=99 => {
                let len = [1, 100, 128, 1000, 4000, 9000][r.gen_range(0..6)];
                let p = payload(&mut r, 0, n, len);
                n += 1;
                match wal.append(&p) {
                    Ok(lsn) => {
                        m.log.push((lsn, p));
                        false
                    }
                    Err(WalError::Full(_)) => {
                        seen.full += 1;
                        false
                    }
                    Err(_) => {
                        m.in_flight.insert(p);
                        true
                    }
                }
            }
            60..=69 => {
                // Several threads at once: groups of several records.
                let threads = r.gen_range(2..5u32);
                let wal_ref = &wal;
                let batches: Vec<Vec<Vec<u8>>> = (0..threads)
                    .map(|t| {
                        (0..r.gen_range(1..6))
                            .map(|_| {
                                n += 1;
                                let len = [40, 128, 600, 3000][r.gen_range(0..4)];
                                payload(&mut r, t + 1, n, len)
                            })
                            .collect()
                    })
                    .collect();
                let results: Vec<Vec<Appended>> = std::thread::scope(|s| {
                    let hs: Vec<_> = batches
                        .into_iter()
                        .map(|b| {
                            s.spawn(move || {
                                b.into_iter()
                                    .map(|p| {
                                        let res = wal_ref.append(&p);
                                        let full = matches!(res, Err(WalError::Full(_)));
                                        (p, res.map_err(|e| e.to_string()), full)
                                    })
                                    .collect()
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).collect()
                });
                let mut any_failed = false;
                let mut ok: Vec<(Lsn, Vec<u8>)> = Vec::new();
                for (p, res, full) in results.into_iter().flatten() {
                    match res {
                        Ok(lsn) => ok.push((lsn, p)),
                        Err(_) if full => {}
                        Err(_) => {
                            any_failed = true;
                            m.in_flight.insert(p);
                        }
                    }
                }
                ok.sort_by_key(|(l, _)| l.seq);
                seen.multi_record_groups += u64::from(
                    ok.windows(2)
                        .any(|w| w[1].0.pos < w[0].0.pos.next_multiple_of(4096)),
                );
                m.log.extend(ok);
                any_failed
            }
            70..=75 => {
                // Truncate to a random acknowledged record (or the end).
                let (head, next) = wal.bounds();
                let live: Vec<Lsn> = m
                    .log
                    .iter()
                    .map(|(l, _)| *l)
                    .filter(|l| l.seq >= head.seq)
                    .chain([next])
                    .collect();
                let to = live[r.gen_range(0..live.len())];
                m.head_in_flight = Some(to.seq);
                match wal.truncate(to) {
                    Ok(_) => {
                        m.head_seq = to.seq;
                        m.head_in_flight = None;
                        m.log.retain(|(l, _)| l.seq >= to.seq);
                        false
                    }
                    Err(_) => true,
                }
            }
            76..=79 if !armed => {
                disk.set_faults(SimFaults {
                    crash_at_write: Some(r.gen_range(1..6)),
                    ..Default::default()
                });
                armed = true;
                false
            }
            80..=83 if !armed => {
                // Clean reopen of the log (the volume stays open).
                let vol = wal.volume().clone();
                drop(wal);
                let (w, got) = open_log(&vol, layout).unwrap();
                m.check(w.bounds().0.seq, got, seed, step);
                wal = w;
                false
            }
            _ => true,
        };
        if failed || disk.is_dead() {
            seen.crashes += 1;
            seen.laps = seen.laps.max(wal.bounds().1.pos / size);
            drop(wal);
            let (d, w) = recover(&mut r, &disk, layout, &mut m, seed, step);
            (disk, wal, armed) = (d, w, false);
        }
    }
    drop(wal);
    disk.set_faults(SimFaults::default());
    let (_d, _w) = recover(&mut r, &disk, layout, &mut m, seed, steps);
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("SQUEEZE_WAL_SIM_SEED") {
        return vec![s.parse().expect("SQUEEZE_WAL_SIM_SEED is a number")];
    }
    let n: u64 = std::env::var("SQUEEZE_WAL_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    (0..n).collect()
}

fn run(layout: Layout, version: RecordVersion) {
    let mut seen = Seen::default();
    let mut seeds = seeds();
    if version == RecordVersion::V1 && seeds.len() > 1 {
        seeds.truncate(seeds.len().div_ceil(4));
    }
    for &seed in &seeds {
        let mut s = Seen::default();
        run_seed(layout, version, seed, &mut s);
        seen.crashes += s.crashes;
        seen.full += s.full;
        seen.laps += s.laps;
        seen.multi_record_groups += s.multi_record_groups;
    }
    println!(
        "{layout:?} {version:?}: {} seeds, {} crashes, {} appends refused as full, {} laps of the area, \
         {} bursts with groups of several records",
        seeds.len(),
        seen.crashes,
        seen.full,
        seen.laps,
        seen.multi_record_groups
    );
    if seeds.len() >= 50 {
        // A full ring is reached here only by timing (8-9 of ~1,600 crashes
        // on a quiet machine, none once under CI load), so it is not a
        // coverage condition; tests/bad_input.rs fills the ring on purpose.
        assert!(seen.crashes > 0 && seen.laps > 0 && seen.multi_record_groups > 0);
    }
}

#[test]
fn dense_log_survives_power_cuts() {
    run(Layout::Dense, RecordVersion::V2);
}

#[test]
fn sparse_log_survives_power_cuts() {
    run(Layout::Sparse, RecordVersion::V2);
}

#[test]
fn dense_version_1_log_survives_power_cuts() {
    run(Layout::Dense, RecordVersion::V1);
}

#[test]
fn sparse_version_1_log_survives_power_cuts() {
    run(Layout::Sparse, RecordVersion::V1);
}
