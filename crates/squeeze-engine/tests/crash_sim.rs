//! The durability proof: a seeded simulator runs random operation sequences
//! (write, unaligned write, FUA write, overwrite, trim, write-zeroes, flush,
//! checkpoint, cleaner pass, merge, compaction, clean reopen, crash between operations, crash at a chosen
//! I/O inside an operation, crash during recovery) against a model, on a
//! simulated disk that keeps a random page-granular subset of unsynced
//! writes at each crash.
//!
//! After every crash each sector must read back as its content at the last
//! flush (or FUA) or as one of the contents written to it since: nothing
//! acknowledged as durable is lost, and no sector ever holds bytes that were
//! never written to it. Reads never fail with a checksum error.
//!
//! SQUEEZE_SIM_SEEDS=N runs N seeds (default 400 here; CI runs 2000 via
//! the README's test command), SQUEEZE_SIM_SEED=S replays one seed.

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::{
    default_policy, CodecId, OpenOptions, SimFaults, SimStorage, Volume, SECTOR_SIZE,
};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

const SECTORS: usize = 1024; // a 4 MiB volume
const SIZE: u64 = (SECTORS * SECTOR_SIZE) as u64;

fn h(b: &[u8]) -> u64 {
    let mut s = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut s);
    s.finish()
}

struct Model {
    current: Vec<u8>,
    durable: Vec<u64>,
    cands: HashMap<usize, Vec<u64>>,
}

impl Model {
    fn new() -> Model {
        let zero = h(&[0u8; SECTOR_SIZE]);
        Model {
            current: vec![0; SIZE as usize],
            durable: vec![zero; SECTORS],
            cands: HashMap::new(),
        }
    }
    fn sector(&self, s: usize) -> &[u8] {
        &self.current[s * SECTOR_SIZE..(s + 1) * SECTOR_SIZE]
    }
    /// Applies bytes at `off` to `current`, recording candidates.
    fn apply(&mut self, off: u64, data: &[u8]) {
        self.current[off as usize..off as usize + data.len()].copy_from_slice(data);
        let first = off as usize / SECTOR_SIZE;
        let last = (off as usize + data.len()).div_ceil(SECTOR_SIZE);
        for s in first..last {
            let hs = h(self.sector(s));
            self.cands.entry(s).or_default().push(hs);
        }
    }
    fn make_durable(&mut self, off: u64, len: u64) {
        let first = off as usize / SECTOR_SIZE;
        let last = (off + len).div_ceil(SECTOR_SIZE as u64) as usize;
        for s in first..last {
            self.durable[s] = h(self.sector(s));
            self.cands.remove(&s);
        }
    }
    fn flush(&mut self) {
        self.make_durable(0, SIZE);
    }
    /// Checks a volume after a crash and adopts what it shows.
    fn verify_after_crash(&mut self, v: &Volume, seed: u64, step: usize) {
        let mut all = vec![0u8; SIZE as usize];
        v.read(0, &mut all)
            .unwrap_or_else(|e| panic!("seed {seed} step {step}: read after crash: {e}"));
        for s in 0..SECTORS {
            let got = h(&all[s * SECTOR_SIZE..(s + 1) * SECTOR_SIZE]);
            let ok = got == self.durable[s] || self.cands.get(&s).is_some_and(|c| c.contains(&got));
            assert!(
                ok,
                "seed {seed} step {step}: sector {s} holds bytes never written to it \
                 (or lost a durable write)"
            );
        }
        v.verify_accounting()
            .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
        self.current = all;
        self.cands.clear();
        for s in 0..SECTORS {
            self.durable[s] = h(self.sector(s));
        }
    }
}

fn open(s: &Arc<SimStorage>) -> squeeze_engine::Result<Volume> {
    Volume::open(s.clone(), OpenOptions::default())
}

/// Crashes the disk, optionally crashes again during recovery, reopens.
fn crash_and_recover(
    r: &mut impl Rng,
    disk: &Arc<SimStorage>,
    vol: Volume,
    seed: u64,
) -> (Arc<SimStorage>, Volume) {
    let mut img = Arc::new(disk.crash(r));
    drop(vol);
    for _ in 0..3 {
        if !r.gen_bool(0.3) {
            break;
        }
        img.set_faults(SimFaults {
            crash_at_write: Some(r.gen_range(1..6)),
            ..Default::default()
        });
        if let Ok(v) = open(&img) {
            if !img.is_dead() {
                img.set_faults(SimFaults::default());
                return (img, v);
            }
            drop(v);
        }
        img = Arc::new(img.crash(r));
    }
    let v = open(&img).unwrap_or_else(|e| panic!("seed {seed}: recovery failed: {e}"));
    (img, v)
}

fn run_seed(seed: u64) {
    let mut r = rng(seed);
    let mut policy = default_policy();
    policy.codec = [CodecId::Lz4, CodecId::Zstd, CodecId::None][r.gen_range(0..3)];
    policy.max_blob = 4096 << r.gen_range(0..6);
    let mut disk = Arc::new(SimStorage::new());
    let mut opts = small_opts(SIZE);
    opts.policy = policy;
    let mut vol = Volume::create(disk.clone(), &opts).unwrap();
    let mut m = Model::new();
    let steps = r.gen_range(20..80);
    let mut armed = false;
    for step in 0..steps {
        let op = r.gen_range(0..100);
        let res: squeeze_engine::Result<()> = match op {
            0..=44 => {
                let aligned = r.gen_bool(0.7);
                let (off, len) = if aligned {
                    let s = r.gen_range(0..SECTORS);
                    let n = r.gen_range(1..=(SECTORS - s).min(48));
                    ((s * SECTOR_SIZE) as u64, n * SECTOR_SIZE)
                } else {
                    let off = r.gen_range(0..SIZE - 1);
                    (off, r.gen_range(1..=((SIZE - off) as usize).min(70_000)))
                };
                let kind = r.gen_range(0..4);
                let d = data(&mut r, kind, len);
                let fua = r.gen_bool(0.1);
                m.apply(off, &d);
                let res = vol.write(off, &d, fua);
                if res.is_ok() && fua {
                    m.make_durable(off, len as u64);
                }
                res
            }
            45..=57 => {
                let off = r.gen_range(0..SIZE - 1);
                let len = r.gen_range(1..=(SIZE - off).min(600_000));
                m.apply(off, &vec![0u8; len as usize]);
                if r.gen_bool(0.5) {
                    vol.trim(off, len, false)
                } else {
                    vol.write_zeroes(off, len, false)
                }
            }
            58..=72 => {
                let res = vol.flush();
                if res.is_ok() {
                    m.flush();
                }
                res
            }
            73..=75 => vol.checkpoint(),
            76..=77 => vol.clean_pass().map(|_| ()),
            78 => vol.merge(|_, _| {}).map(|_| ()),
            79 => vol.compact(|_, _| {}).map(|_| ()),
            80..=84 if !armed => {
                // Clean close and reopen: everything is durable.
                vol.close().unwrap();
                m.flush();
                vol = open(&disk).unwrap();
                Ok(())
            }
            85..=91 if !armed => {
                // Arm a power cut at one of the next few I/Os.
                disk.set_faults(SimFaults {
                    crash_at_write: Some(r.gen_range(1..12)),
                    ..Default::default()
                });
                armed = true;
                Ok(())
            }
            _ => {
                // Power cut now, between operations.
                let (d, v) = crash_and_recover(&mut r, &disk, vol, seed);
                disk = d;
                vol = v;
                armed = false;
                m.verify_after_crash(&vol, seed, step);
                Ok(())
            }
        };
        if res.is_err() || disk.is_dead() {
            assert!(
                disk.is_dead(),
                "seed {seed} step {step}: operation failed without a fault: {res:?}"
            );
            let (d, v) = crash_and_recover(&mut r, &disk, vol, seed);
            disk = d;
            vol = v;
            armed = false;
            m.verify_after_crash(&vol, seed, step);
        }
    }
    // After a full clean the log holds little more than the live data.
    disk.set_faults(SimFaults::default());
    vol.compact(|_, _| {}).unwrap();
    let st = vol.stats();
    let seg = st.segment_size;
    let in_use = (st.segments_total - st.segments_free) * seg;
    assert!(
        in_use as f64 <= st.stored_bytes as f64 * 1.3 + 4.0 * seg as f64,
        "seed {seed}: {in_use} bytes of segments in use for {} live bytes",
        st.stored_bytes
    );
    // Finally: a crash with nothing armed must keep everything flushed.
    vol.flush().unwrap();
    m.flush();
    let (_d, v) = crash_and_recover(&mut r, &disk, vol, seed);
    m.verify_after_crash(&v, seed, steps);
}

#[test]
fn random_sequences_survive_crashes() {
    if let Ok(s) = std::env::var("SQUEEZE_SIM_SEED") {
        run_seed(s.parse().expect("SQUEEZE_SIM_SEED is a number"));
        return;
    }
    let n: u64 = std::env::var("SQUEEZE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    for seed in 0..n {
        run_seed(seed);
    }
}
