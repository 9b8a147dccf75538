//! The atomic-write guarantee (docs/RELIABILITY.md, "Atomic writes"): a
//! write the pipeline turns into exactly one log record is all-or-nothing
//! across a power cut. That is a write whose byte range touches at most
//! `max_blob / 4096` sectors, all-zero ones among them or not (`write.rs`
//! `atomic_split` makes such a write one blob, and `append.rs` one record
//! with one header CRC and one payload CRC); a write all of whose sectors
//! are zero (one zero record); and a trim or write-zeroes of whole sectors
//! (one zero record). Replay applies a
//! record whole or not at all (`meta/recovery.rs`), so after a crash the
//! sectors of such a write show either all of it or none of it.
//!
//! The check: every write gets an id; the model records, per sector, the
//! content each write left there. After a crash each sector's content names
//! the write that produced it (its version). A write is torn when one of
//! its sectors shows it and another of its sectors shows something older
//! than it. `eligible_writes_never_tear` (both I/O paths) runs random
//! sequences of eligible writes, whole-sector trims, flushes, checkpoints,
//! cleaner passes, compactions and power cuts (between operations, at a
//! chosen I/O inside one, during recovery) and fails on any torn write; it
//! also checks that nothing flushed is lost and no sector holds bytes never
//! written. `writes_of_several_records_do_tear` runs the same sequences with
//! writes that become several records (more sectors than max_blob, some
//! with all-zero sectors inside) and fails unless the simulator tears one: the
//! conditions of the guarantee are necessary, and the checker sees tears.
//!
//! SQUEEZE_SIM_SEEDS=N runs N seeds per test (default 200).

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::storage::{SimWriteBehind, SimWriteBehindConfig};
use squeeze_engine::{
    default_policy, CodecId, OpenOptions, SimFaults, SimStorage, Storage, Volume, SECTOR_SIZE,
};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

const SECTORS: usize = 1024; // a 4 MiB volume
const SIZE: u64 = (SECTORS * SECTOR_SIZE) as u64;

fn h(b: &[u8]) -> u64 {
    let mut s = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut s);
    s.finish()
}

/// One write since the model last adopted the volume's state.
struct Written {
    id: u64,
    first: usize,
    last: usize,
}

struct Model {
    current: Vec<u8>,
    /// Per sector: (content hash, id of the write that left it); id 0 is
    /// the content adopted after the last crash.
    versions: Vec<Vec<(u64, u64)>>,
    /// Per sector: the id of its content at the last flush.
    durable: Vec<u64>,
    /// Per sector: the id of its current content.
    latest: Vec<u64>,
    /// Writes not yet covered by a flush.
    pending: Vec<Written>,
    next_id: u64,
}

impl Model {
    fn new() -> Model {
        let zero = h(&[0u8; SECTOR_SIZE]);
        Model {
            current: vec![0; SIZE as usize],
            versions: vec![vec![(zero, 0)]; SECTORS],
            durable: vec![0; SECTORS],
            latest: vec![0; SECTORS],
            pending: Vec::new(),
            next_id: 1,
        }
    }

    fn sector(&self, s: usize) -> &[u8] {
        &self.current[s * SECTOR_SIZE..(s + 1) * SECTOR_SIZE]
    }

    /// Applies a write of `data` at `off` (zeros for a trim) as one write.
    fn apply(&mut self, off: u64, data: &[u8]) {
        let id = self.next_id;
        self.next_id += 1;
        self.current[off as usize..off as usize + data.len()].copy_from_slice(data);
        let first = off as usize / SECTOR_SIZE;
        let last = (off as usize + data.len()).div_ceil(SECTOR_SIZE);
        for s in first..last {
            let hs = h(self.sector(s));
            self.versions[s].push((hs, id));
            self.latest[s] = id;
        }
        self.pending.push(Written { id, first, last });
    }

    fn flush(&mut self) {
        self.durable.clone_from(&self.latest);
        self.pending.clear();
    }

    /// The ids of the writes whose content sector `s` shows (several when
    /// several wrote the same bytes, as trims write zeros).
    fn versions_of(&self, s: usize, got: u64) -> Vec<u64> {
        self.versions[s]
            .iter()
            .filter(|(hs, _)| *hs == got)
            .map(|(_, id)| *id)
            .collect()
    }

    /// Checks the volume after a crash, adopts what it shows, and returns
    /// the number of torn pending writes.
    fn verify_after_crash(&mut self, v: &Volume, seed: u64, step: usize) -> usize {
        let mut all = vec![0u8; SIZE as usize];
        v.read(0, &mut all)
            .unwrap_or_else(|e| panic!("seed {seed} step {step}: read after crash: {e}"));
        let mut shown = vec![Vec::new(); SECTORS];
        for (s, shown) in shown.iter_mut().enumerate() {
            let got = h(&all[s * SECTOR_SIZE..(s + 1) * SECTOR_SIZE]);
            *shown = self.versions_of(s, got);
            assert!(
                !shown.is_empty(),
                "seed {seed} step {step}: sector {s} holds bytes never written to it"
            );
            assert!(
                shown.iter().any(|&id| id >= self.durable[s]),
                "seed {seed} step {step}: sector {s} lost a flushed write"
            );
        }
        // Torn: one sector certainly shows the write (its bytes are that
        // write's alone), another certainly shows something older.
        let torn: Vec<&Written> = self
            .pending
            .iter()
            .filter(|w| {
                let range = &shown[w.first..w.last];
                range.iter().any(|ids| ids == &[w.id])
                    && range.iter().any(|ids| ids.iter().all(|&id| id < w.id))
            })
            .collect();
        for w in &torn {
            println!(
                "seed {seed} step {step}: write {} of sectors {}..{} torn: {:?}",
                w.id,
                w.first,
                w.last,
                &shown[w.first..w.last]
            );
        }
        let torn = torn.len();
        v.verify_accounting()
            .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
        self.current = all;
        for s in 0..SECTORS {
            let hs = h(self.sector(s));
            self.versions[s] = vec![(hs, 0)];
        }
        self.durable = vec![0; SECTORS];
        self.latest = vec![0; SECTORS];
        self.pending.clear();
        torn
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IoPath {
    Sim,
    WriteBehind,
}

/// What kind of writes a run makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Writes {
    /// Only writes the guarantee covers (one record each).
    Eligible,
    /// Writes of several records: more sectors than max_blob.
    SeveralRecords,
}

struct Rig {
    path: IoPath,
    disk: Arc<SimStorage>,
    wb: Option<Arc<SimWriteBehind>>,
}

impl Rig {
    fn over(path: IoPath, disk: SimStorage, r: &mut impl Rng) -> Rig {
        let disk = Arc::new(disk);
        let wb = (path == IoPath::WriteBehind).then(|| {
            let config = SimWriteBehindConfig {
                chunk: 4096 << r.gen_range(0..5),
                chunks: r.gen_range(1..=6),
                seed: r.gen(),
                write_out_chance: [0.0, 0.2, 0.7, 1.0][r.gen_range(0..4)],
                flusher_threads: 0,
            };
            Arc::new(SimWriteBehind::new(disk.clone(), config))
        });
        Rig { path, disk, wb }
    }

    fn storage(&self) -> Arc<dyn Storage> {
        match &self.wb {
            Some(wb) => wb.clone(),
            None => self.disk.clone(),
        }
    }
}

/// The smallest garbage budget: the most cleaning, so the most relocations
/// of the atomic records under power cuts.
fn options() -> OpenOptions {
    OpenOptions {
        gc: Some(squeeze_engine::GcPolicy {
            garbage_budget: squeeze_engine::GARBAGE_BUDGET_MIN,
        }),
        ..Default::default()
    }
}

fn open(rig: &Rig) -> squeeze_engine::Result<Volume> {
    Volume::open(rig.storage(), options())
}

/// Crashes the disk, optionally crashes again during recovery, reopens.
fn crash_and_recover(r: &mut impl Rng, rig: &Rig, vol: Volume, seed: u64) -> (Rig, Volume) {
    let mut img = Rig::over(rig.path, rig.disk.crash(r), r);
    drop(vol);
    for _ in 0..3 {
        if !r.gen_bool(0.3) {
            break;
        }
        img.disk.set_faults(SimFaults {
            crash_at_write: Some(r.gen_range(1..6)),
            ..Default::default()
        });
        if let Ok(v) = open(&img) {
            if !img.disk.is_dead() {
                img.disk.set_faults(SimFaults::default());
                return (img, v);
            }
            drop(v);
        }
        img = Rig::over(rig.path, img.disk.crash(r), r);
    }
    let v = open(&img).unwrap_or_else(|e| panic!("seed {seed}: recovery failed: {e}"));
    (img, v)
}

/// Data without an all-zero sector once written at `off` over `model`.
fn nonzero_data(r: &mut impl Rng, m: &Model, off: u64, len: usize) -> Vec<u8> {
    let kind = r.gen_range(1..4);
    let mut d = data(r, kind, len);
    let first = off as usize / SECTOR_SIZE;
    let last = (off as usize + len).div_ceil(SECTOR_SIZE);
    for s in first..last {
        let lo = (s * SECTOR_SIZE).max(off as usize);
        let hi = ((s + 1) * SECTOR_SIZE).min(off as usize + len);
        let old = m.sector(s);
        let zero_after = (s * SECTOR_SIZE..(s + 1) * SECTOR_SIZE).all(|b| {
            if (lo..hi).contains(&b) {
                d[b - off as usize] == 0
            } else {
                old[b - s * SECTOR_SIZE] == 0
            }
        });
        if zero_after {
            d[lo - off as usize] = 0x5a;
        }
    }
    d
}

/// Zeroes a few of the sectors `d` (written at `off`) covers whole, so
/// that some sectors of the write are all-zero after it and others not
/// (a database page with an empty 4 KiB half). The first covered sector is
/// left alone, so at least one stays non-zero when there are two or more.
fn zero_some_sectors(r: &mut impl Rng, off: u64, d: &mut [u8]) {
    let first = (off as usize).div_ceil(SECTOR_SIZE);
    let end = (off as usize + d.len()) / SECTOR_SIZE;
    for s in first + 1..end {
        if r.gen_bool(0.5) {
            let at = s * SECTOR_SIZE - off as usize;
            d[at..at + SECTOR_SIZE].fill(0);
        }
    }
}

/// One write of the run's kind: (offset, data).
fn pick_write(r: &mut impl Rng, m: &Model, max_blob: usize, writes: Writes) -> (u64, Vec<u8>) {
    match writes {
        Writes::Eligible if r.gen_bool(0.1) => {
            // All zeros, whole sectors: one zero record.
            let n = r.gen_range(1..=64);
            let s = r.gen_range(0..=SECTORS - n);
            ((s * SECTOR_SIZE) as u64, vec![0; n * SECTOR_SIZE])
        }
        Writes::Eligible => {
            // Touches 1..=max_blob sectors, aligned or not.
            let touched = r.gen_range(1..=max_blob);
            let s = r.gen_range(0..=SECTORS - touched);
            let (off, len) = if r.gen_bool(0.6) {
                ((s * SECTOR_SIZE) as u64, touched * SECTOR_SIZE)
            } else {
                let head = r.gen_range(0..SECTOR_SIZE);
                let span = touched * SECTOR_SIZE - head;
                let min = if touched == 1 {
                    1
                } else {
                    (touched - 1) * SECTOR_SIZE - head + 1
                };
                ((s * SECTOR_SIZE + head) as u64, r.gen_range(min..=span))
            };
            let mut d = nonzero_data(r, m, off, len);
            if r.gen_bool(0.4) {
                zero_some_sectors(r, off, &mut d);
            }
            (off, d)
        }
        Writes::SeveralRecords => {
            // More sectors than one blob holds; sometimes with all-zero
            // sectors inside, which are zero records of their own there.
            let n = r.gen_range(max_blob + 1..=max_blob * 3);
            let s = r.gen_range(0..=SECTORS - n);
            let off = (s * SECTOR_SIZE) as u64;
            let mut d = nonzero_data(r, m, off, n * SECTOR_SIZE);
            if r.gen_bool(0.3) {
                zero_some_sectors(r, off, &mut d);
            }
            (off, d)
        }
    }
}

/// Runs one seed; returns the number of torn writes it saw.
fn run_seed(path: IoPath, writes: Writes, seed: u64) -> usize {
    let mut r = rng(seed);
    let mut policy = default_policy();
    policy.codec = [CodecId::Lz4, CodecId::Zstd, CodecId::None][r.gen_range(0..3)];
    policy.max_blob = 4096 << r.gen_range(0..6);
    let max_blob = policy.max_blob as usize / SECTOR_SIZE;
    let mut rig = Rig::over(path, SimStorage::new(), &mut r);
    let mut opts = small_opts(SIZE);
    opts.policy = policy;
    let mut vol = Volume::create_with(rig.storage(), &opts, options()).unwrap();
    let mut m = Model::new();
    let mut torn = 0;
    let mut armed = false;
    let steps = r.gen_range(20..80);
    for step in 0..steps {
        let res: squeeze_engine::Result<()> = match r.gen_range(0..100) {
            0..=49 => {
                let (off, d) = pick_write(&mut r, &m, max_blob, writes);
                m.apply(off, &d);
                let fua = r.gen_bool(0.05);
                let res = vol.write(off, &d, fua);
                if res.is_ok() && fua {
                    // FUA flushes everything before it too.
                    m.flush();
                }
                res
            }
            50..=57 => {
                // A trim or write-zeroes of whole sectors: one zero record.
                let n = r.gen_range(1..=64);
                let s = r.gen_range(0..=SECTORS - n);
                let (off, len) = ((s * SECTOR_SIZE) as u64, (n * SECTOR_SIZE) as u64);
                m.apply(off, &vec![0u8; len as usize]);
                if r.gen_bool(0.5) {
                    vol.trim(off, len, false)
                } else {
                    vol.write_zeroes(off, len, false)
                }
            }
            58..=69 => {
                let res = vol.flush();
                if res.is_ok() {
                    m.flush();
                }
                res
            }
            70..=72 => vol.checkpoint(),
            73..=75 => vol.clean_pass().map(|_| ()),
            76 => vol.compact(|_, _| {}).map(|_| ()),
            77..=89 if !armed => {
                rig.disk.set_faults(SimFaults {
                    crash_at_write: Some(r.gen_range(1..8)),
                    ..Default::default()
                });
                armed = true;
                Ok(())
            }
            _ => {
                let (d, v) = crash_and_recover(&mut r, &rig, vol, seed);
                (rig, vol, armed) = (d, v, false);
                torn += m.verify_after_crash(&vol, seed, step);
                Ok(())
            }
        };
        if res.is_err() || rig.disk.is_dead() {
            assert!(
                rig.disk.is_dead(),
                "seed {seed} step {step}: operation failed without a fault: {res:?}"
            );
            let (d, v) = crash_and_recover(&mut r, &rig, vol, seed);
            (rig, vol, armed) = (d, v, false);
            torn += m.verify_after_crash(&vol, seed, step);
        }
    }
    rig.disk.set_faults(SimFaults::default());
    let (_d, v) = crash_and_recover(&mut r, &rig, vol, seed);
    torn += m.verify_after_crash(&v, seed, steps);
    torn
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("SQUEEZE_SIM_SEED") {
        return vec![s.parse().expect("SQUEEZE_SIM_SEED is a number")];
    }
    let n: u64 = std::env::var("SQUEEZE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    (0..n).collect()
}

fn eligible(path: IoPath) {
    for seed in seeds() {
        let torn = run_seed(path, Writes::Eligible, seed);
        assert_eq!(
            torn, 0,
            "seed {seed} ({path:?}): {torn} writes of one record tore across a crash"
        );
    }
}

#[test]
fn eligible_writes_never_tear() {
    eligible(IoPath::Sim);
}

#[test]
fn eligible_writes_never_tear_through_write_behind() {
    eligible(IoPath::WriteBehind);
}

#[test]
fn writes_of_several_records_do_tear() {
    // Tears show in most seeds: a few hundred are plenty.
    let seeds: Vec<u64> = seeds().into_iter().take(200).collect();
    let torn: usize = seeds
        .iter()
        .map(|&seed| run_seed(IoPath::Sim, Writes::SeveralRecords, seed))
        .sum();
    println!(
        "{} seeds: {torn} writes of several records torn",
        seeds.len()
    );
    if seeds.len() >= 50 {
        assert!(
            torn > 0,
            "no write of several records tore in {} seeds: the checker cannot see tears",
            seeds.len()
        );
    }
}
