//! Flushes racing each other, as a database's committing clients make them:
//! several threads each write a few KiB and flush, over and over, so one
//! flush writes out its group while another's fdatasync runs (the pipelined
//! flush, `append::flush`), and every flush is small enough to pre-write the
//! log past its head (`space::prewrite`). A power cut is taken while they
//! run; after recovery every write whose flush had returned is there (or a
//! later version of the same sectors), and no sector holds bytes nobody
//! wrote. SQUEEZE_FLUSH_SEEDS=N runs N seeds per test (default 4; each
//! seed is six rounds of threads and a power cut, at points the threads'
//! timing decides, so a seed costs far more than a crash_sim seed and has
//! its own count: CI's SQUEEZE_SIM_SEEDS=2000 would take an hour here).

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::storage::{SimWriteBehind, SimWriteBehindConfig};
use squeeze_engine::{OpenOptions, SimStorage, Storage, Volume};

/// Pre-writing on, so that the small flushes exercise it.
fn prewriting() -> OpenOptions {
    OpenOptions {
        prewrite: true,
        ..Default::default()
    }
}
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const THREADS: usize = 6;
/// Sectors each thread owns (its writes stay inside them).
const OWN: u64 = 64;
const SECTOR: usize = 4096;
const SIZE: u64 = 8 << 20;

/// The bytes of version `v` of `sector`: its identity up front, then data
/// derived from it (so a recovered sector names the version it holds).
fn content(sector: u64, v: u64) -> Vec<u8> {
    let mut out = vec![0u8; SECTOR];
    out[..8].copy_from_slice(&sector.to_le_bytes());
    out[8..16].copy_from_slice(&v.to_le_bytes());
    let mut x = sector.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ v;
    for (i, b) in out[16..].iter_mut().enumerate() {
        if i % 3 == 0 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        *b = if i % 64 < 40 {
            b'a' + (i % 7) as u8
        } else {
            x as u8
        };
    }
    out
}

/// Which version a recovered sector holds (0: never written), or a panic if
/// its bytes are no version of it.
fn version_of(sector: u64, got: &[u8]) -> u64 {
    if got.iter().all(|&b| b == 0) {
        return 0;
    }
    let s = u64::from_le_bytes(got[..8].try_into().unwrap());
    let v = u64::from_le_bytes(got[8..16].try_into().unwrap());
    assert_eq!(s, sector, "sector {sector} holds sector {s}'s bytes");
    assert!(
        got == content(sector, v).as_slice(),
        "sector {sector}: version {v} with wrong bytes"
    );
    v
}

/// One round: threads write and flush until a power cut is taken; returns
/// the image and, per sector, the newest version whose flush returned
/// before the cut, and the newest version written at all. `durable`: the
/// version each sector holds durably now; `last`: the newest version
/// written so far (new versions continue after it, so a version number
/// never names two contents).
fn round(
    vol: &Volume,
    disk: &SimStorage,
    r: &mut impl Rng,
    durable: &[u64],
    last: &[u64],
) -> (SimStorage, Vec<u64>, Vec<u64>) {
    let acked: Vec<AtomicU64> = durable.iter().map(|&v| AtomicU64::new(v)).collect();
    let written: Vec<AtomicU64> = last.iter().map(|&v| AtomicU64::new(v)).collect();
    let stop = AtomicBool::new(false);
    let seeds: Vec<u64> = (0..THREADS).map(|_| r.gen()).collect();
    let cut_after = r.gen_range(20..400u64);
    let flushes = AtomicU64::new(0);
    let image = std::thread::scope(|s| {
        for (t, seed) in seeds.iter().enumerate() {
            let (acked, written, stop, flushes) = (&acked, &written, &stop, &flushes);
            s.spawn(move || {
                let mut r = rng(*seed);
                while !stop.load(Ordering::Relaxed) {
                    // One to three sectors, as a commit of a few KiB.
                    let n = r.gen_range(1..=3u64);
                    let first = t as u64 * OWN + r.gen_range(0..OWN - n + 1);
                    let mut buf = Vec::with_capacity(n as usize * SECTOR);
                    let mut versions = Vec::new();
                    for k in first..first + n {
                        let v = written[k as usize].fetch_add(1, Ordering::Relaxed) + 1;
                        buf.extend(content(k, v));
                        versions.push((k, v));
                    }
                    if vol.write(first * SECTOR as u64, &buf, false).is_err()
                        || vol.flush().is_err()
                    {
                        return; // the cut killed the old disk under us
                    }
                    for (k, v) in versions {
                        acked[k as usize].fetch_max(v, Ordering::Relaxed);
                    }
                    flushes.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        while flushes.load(Ordering::Relaxed) < cut_after {
            std::thread::yield_now();
        }
        // What was acknowledged before the cut: read first, then cut.
        let promised: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        let image = disk.crash(r);
        stop.store(true, Ordering::Relaxed);
        (image, promised)
    });
    let newest: Vec<u64> = written.iter().map(|w| w.load(Ordering::Relaxed)).collect();
    (image.0, image.1, newest)
}

fn run(seed: u64, behind: bool) {
    let mut r = rng(seed);
    let mk = |disk: Arc<SimStorage>| -> Arc<dyn Storage> {
        if behind {
            Arc::new(SimWriteBehind::new(
                disk,
                SimWriteBehindConfig {
                    chunk: 64 << 10,
                    chunks: 4,
                    seed,
                    write_out_chance: 0.0,
                    flusher_threads: 2,
                },
            ))
        } else {
            disk
        }
    };
    let mut disk = Arc::new(SimStorage::new());
    let mut vol = Volume::create_with(mk(disk.clone()), &small_opts(SIZE), prewriting()).unwrap();
    let sectors = THREADS * OWN as usize;
    let (mut durable, mut last) = (vec![0u64; sectors], vec![0u64; sectors]);
    for n in 0..6 {
        let (image, promised, newest) = round(&vol, &disk, &mut r, &durable, &last);
        drop(vol);
        disk = Arc::new(image);
        vol = Volume::open(mk(disk.clone()), prewriting())
            .unwrap_or_else(|e| panic!("seed {seed} round {n}: recovery: {e}"));
        let mut got = vec![0u8; sectors * SECTOR];
        vol.read(0, &mut got).unwrap();
        for (k, g) in got.chunks(SECTOR).enumerate() {
            let v = version_of(k as u64, g);
            durable[k] = v;
            assert!(
                v >= promised[k],
                "seed {seed} round {n}: sector {k} holds version {v}, but {} was flushed",
                promised[k]
            );
            assert!(
                v <= newest[k],
                "seed {seed} round {n}: sector {k}: version {v} never written"
            );
        }
        last = newest;
        vol.flush().unwrap();
    }
}

fn seeds() -> u64 {
    std::env::var("SQUEEZE_FLUSH_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

#[test]
fn racing_small_flushes_survive_a_power_cut() {
    for seed in 0..seeds() {
        run(seed, false);
    }
}

#[test]
fn racing_small_flushes_survive_a_power_cut_with_write_behind() {
    for seed in 0..seeds() {
        run(1 << 32 | seed, true);
    }
}

/// Pre-writing happens only when asked for, only for small flushes, and is
/// counted: its zeros are device writes (`prewritten_bytes`, part of the
/// write amplification).
#[test]
fn prewriting_is_opt_in_and_counted() {
    for on in [false, true] {
        let disk = Arc::new(SimStorage::new());
        let open = OpenOptions {
            prewrite: on,
            ..Default::default()
        };
        let vol = Volume::create_with(disk, &small_opts(SIZE), open).unwrap();
        for k in 0..16u64 {
            vol.write(k * SECTOR as u64, &content(k, 1), false).unwrap();
            vol.flush().unwrap();
        }
        let small = vol.stats().prewritten_bytes;
        // One large write between two flushes: no pre-write for it.
        let big: Vec<u8> = (100..200u64).flat_map(|k| content(k, 1)).collect();
        vol.write(100 * SECTOR as u64, &big, false).unwrap();
        vol.flush().unwrap();
        let after_big = vol.stats().prewritten_bytes;
        if on {
            assert!(small > 0, "small flushes pre-wrote nothing");
            assert_eq!(after_big, small, "a flush after 400 KiB of log pre-wrote");
        } else {
            assert_eq!(after_big, 0, "pre-writing is off by default");
        }
    }
}
