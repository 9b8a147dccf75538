//! The durability proof: a seeded simulator runs random operation sequences
//! (write, unaligned write, FUA write, overwrite, trim, write-zeroes, flush,
//! checkpoint, cleaner pass, merge, upgrade, compaction, clean reopen, crash between
//! operations, crash at a chosen I/O inside an operation, crash during
//! recovery, process kill) against a model, on a simulated disk that keeps
//! a random page-granular subset of unsynced writes at each crash.
//!
//! Two I/O paths run the same sequences: the engine straight over the
//! simulated disk (`random_sequences_survive_crashes`), and the engine over
//! the write-behind path every user runs, the same staging pool and chunk
//! writer `FileStorage` uses, over the simulated disk, with a tiny pool
//! (4-64 KiB chunks, 1-6 of them) and a seeded stand-in for the flusher
//! threads that writes completed chunks late and in any order
//! (`..._through_write_behind`). There a power cut also loses chunks still
//! staged, and tears and reorders the chunks written out.
//!
//! After every crash each sector must read back as its content at the last
//! flush (or FUA) or as one of the contents written to it since: nothing
//! acknowledged as durable is lost, and no sector ever holds bytes that were
//! never written to it. Reads never fail with a checksum error. After a
//! process kill (the page cache survives, the process's memory does not)
//! the same holds, and nothing acknowledged is lost unless the write-behind
//! pool held bytes not yet written out.
//!
//! Three seeds in five (seed % 5 < 3) run with no map cache: the map pages
//! out to the checkpoint chain after every checkpoint and is read back
//! chunk by chunk (`meta::pager`).
//!
//! A third of the seeds (seed % 3 == 1) run on an engine that reports itself
//! always behind (`common::Behind`): their writes go below the target codec
//! and their upgrade passes (and compactions) rewrite them.
//!
//! SQUEEZE_SIM_SEEDS=N runs N seeds per path (default 400 here; CI runs
//! 2000 via the README's test command), SQUEEZE_SIM_SEED=S replays one seed
//! (add the test's name to replay one path).

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::storage::{SimWriteBehind, SimWriteBehindConfig};
use squeeze_engine::{
    default_policy, CodecId, OpenOptions, SimFaults, SimStorage, Storage, Volume, SECTOR_SIZE,
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
    /// Checks a volume after a crash and adopts what it shows. Returns how
    /// many sectors lost their latest (acknowledged, unflushed) content.
    fn verify_after_crash(&mut self, v: &Volume, seed: u64, step: usize) -> usize {
        let mut all = vec![0u8; SIZE as usize];
        v.read(0, &mut all)
            .unwrap_or_else(|e| panic!("seed {seed} step {step}: read after crash: {e}"));
        let mut rolled_back = 0;
        for s in 0..SECTORS {
            let got = h(&all[s * SECTOR_SIZE..(s + 1) * SECTOR_SIZE]);
            let ok = got == self.durable[s] || self.cands.get(&s).is_some_and(|c| c.contains(&got));
            assert!(
                ok,
                "seed {seed} step {step}: sector {s} holds bytes never written to it \
                 (or lost a durable write)"
            );
            if got != h(self.sector(s)) {
                rolled_back += 1;
            }
        }
        v.verify_accounting()
            .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
        self.current = all;
        self.cands.clear();
        for s in 0..SECTORS {
            self.durable[s] = h(self.sector(s));
        }
        rolled_back
    }
}

/// The I/O path under the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IoPath {
    /// The engine straight over the simulated disk.
    Sim,
    /// The write-behind staging pool over the simulated disk.
    WriteBehind,
}

/// A simulated disk and what the volume sees of it: the disk itself, or
/// the write-behind path over it.
struct Rig {
    path: IoPath,
    disk: Arc<SimStorage>,
    wb: Option<Arc<SimWriteBehind>>,
    /// The volume runs on an engine that reports itself always behind
    /// (`common::Behind`): client writes go below the target and
    /// `upgrade_pass` has work.
    behind: bool,
    prewrite: bool,
    /// Dedup mode inline's index keeps 1 fingerprint in this many
    /// (`OpenOptions::dedup_inline_sample`).
    inline_sample: u64,
    /// The cleaner's garbage budget: mostly the smallest (the most
    /// cleaning, so the most relocations under power cuts), sometimes the
    /// default.
    budget: f64,
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
        let budget = if r.gen_ratio(3, 4) {
            squeeze_engine::GARBAGE_BUDGET_MIN
        } else {
            squeeze_engine::GcPolicy::default().garbage_budget
        };
        Rig {
            path,
            disk,
            wb,
            behind: false,
            prewrite: false,
            inline_sample: squeeze_engine::dedup::INLINE_SAMPLE_DEFAULT,
            budget,
        }
    }

    fn prewrite(mut self, prewrite: bool) -> Rig {
        self.prewrite = prewrite;
        self
    }

    fn inline_sample(mut self, sample: u64) -> Rig {
        self.inline_sample = sample;
        self
    }

    fn behind(mut self, behind: bool) -> Rig {
        self.behind = behind;
        self
    }

    fn options(&self) -> OpenOptions {
        let mut o = if self.behind {
            behind_options()
        } else {
            OpenOptions::default()
        };
        o.gc = Some(squeeze_engine::GcPolicy {
            garbage_budget: self.budget,
        });
        o.prewrite = self.prewrite;
        o.dedup_inline_sample = Some(self.inline_sample);
        // No cache: the map pages out as it loads at open, too.
        if PAGE_OUT.with(|c| c.get()) {
            o.map_cache = Some(0);
        }
        o
    }

    fn storage(&self) -> Arc<dyn Storage> {
        match &self.wb {
            Some(wb) => wb.clone(),
            None => self.disk.clone(),
        }
    }

    /// Staged bytes a process kill would lose now.
    fn unwritten_bytes(&self) -> u64 {
        self.wb.as_ref().map_or(0, |wb| wb.unwritten_bytes())
    }
}

thread_local! {
    /// This seed's volumes write a checkpoint base as often as every other
    /// checkpoint (odd seeds), so that crashes land in new chains too.
    static REBASE_OFTEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// This seed's volumes have no map cache (seed % 5 < 3): every chunk
    /// pages out (as the map loads at open, too), one that changed since
    /// the last checkpoint with its changed entries as its overlay, and
    /// every operation reads its chunks back from the checkpoint chain.
    static PAGE_OUT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn tune(vol: &Volume) {
    if REBASE_OFTEN.with(|c| c.get()) {
        vol.set_rebase_threshold(1, 0);
    }
    if PAGE_OUT.with(|c| c.get()) {
        vol.set_map_cache(0);
    }
}

fn open(rig: &Rig) -> squeeze_engine::Result<Volume> {
    let v = Volume::open(rig.storage(), rig.options())?;
    tune(&v);
    Ok(v)
}

/// Crashes the disk, optionally crashes again during recovery, reopens.
fn crash_and_recover(r: &mut impl Rng, rig: &Rig, vol: Volume, seed: u64) -> (Rig, Volume) {
    let mut img = Rig::over(rig.path, rig.disk.crash(r), r).behind(rig.behind);
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
        img = Rig::over(rig.path, img.disk.crash(r), r).behind(rig.behind);
    }
    let v = open(&img).unwrap_or_else(|e| panic!("seed {seed}: recovery failed: {e}"));
    (img, v)
}

/// What a seed saw of process kills.
#[derive(Default)]
struct KillStats {
    kills: u64,
    /// Kills that found staged bytes not yet written out.
    kills_with_staged: u64,
    /// Sectors that lost an acknowledged, unflushed write to a kill.
    sectors_lost: u64,
    /// Upgrade passes that rewrote a segment.
    upgrades: u64,
    /// Map chunks read back from the checkpoint chain.
    faults: u64,
    /// Client sectors deduplication passes linked to hidden addresses.
    dedup_linked: u64,
    /// Steps of the idle pass (dedup mode idle) that read a window or more:
    /// cut after 1 to 3 windows, resumed from the cursor by the next.
    dedup_idle_steps: u64,
    /// Client sectors dedup mode inline linked as they were written (as
    /// the last checkpoint before the seed's end counted them).
    dedup_inline_linked: u64,
}

fn run_seed(path: IoPath, seed: u64) -> KillStats {
    let mut r = rng(seed);
    REBASE_OFTEN.with(|c| c.set(seed % 2 == 1));
    PAGE_OUT.with(|c| c.set(seed % 5 < 3));
    let mut kills = KillStats::default();
    let mut policy = default_policy();
    policy.codec = [CodecId::Lz4, CodecId::Zstd, CodecId::None][r.gen_range(0..3)];
    policy.max_blob = 4096 << r.gen_range(0..6);
    // A third of the seeds write below the target (taken from the seed,
    // not the generator, so every seed's sequence stays what it was), with
    // a zstd target (zstd:3 -> zstd:1 -> lz4: something to upgrade).
    let behind = seed % 3 == 1;
    if behind {
        policy.codec = CodecId::Zstd;
    }
    // Half the seeds pre-write the log past the head before small flushes
    // (also from the seed, not the generator).
    let mut rig = Rig::over(path, SimStorage::new(), &mut r)
        .behind(behind)
        .prewrite(seed % 4 >= 2)
        // Inline seeds (divisible by 4): half with a dense index, half
        // sampled 1 in 2, so that hooks are extended over sectors the
        // index does not hold (the copies here are short: at the default
        // 1 in 8 few would hold a hook).
        .inline_sample(if seed.is_multiple_of(8) { 1 } else { 2 });
    let mut opts = small_opts(SIZE);
    opts.policy = policy;
    // Even seeds deduplicate: in dedup mode idle, so the idle pass's steps
    // run too (the settings in the superblock survive the power cuts);
    // half of them (seeds divisible by 4) in mode inline, so their writes
    // of copies are linked as they are written as well (the index dense
    // or sampled: `inline_sample` above).
    if seed.is_multiple_of(2) {
        opts.dedup.mode = if seed.is_multiple_of(4) {
            squeeze_engine::DedupMode::Inline
        } else {
            squeeze_engine::DedupMode::Idle
        };
    }
    let mut vol = Volume::create_with(rig.storage(), &opts, rig.options()).unwrap();
    tune(&vol);
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
                let d = if aligned && kind == 1 && seed.is_multiple_of(2) {
                    // Even seeds: a copy of other sectors instead of
                    // random bytes, for deduplication to find.
                    let src = r.gen_range(0..=SECTORS - len / SECTOR_SIZE) * SECTOR_SIZE;
                    m.current[src..src + len].to_vec()
                } else {
                    data(&mut r, kind, len)
                };
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
            // Behind seeds upgrade where the others checkpoint, clean,
            // merge or compact, every other step.
            73..=79 if rig.behind && step % 2 == 1 => vol.upgrade_pass().map(|rep| {
                kills.upgrades += u64::from(rep.is_some_and(|r| r.upgraded_bytes > 0));
            }),
            73..=75 => vol.checkpoint(),
            76..=77 => vol.clean_pass().map(|_| ()),
            // Even seeds deduplicate where odd ones clean or merge.
            // Every other one a step of the idle pass (from the step, not
            // the generator: every seed's sequence stays what it was).
            76..=78 if seed.is_multiple_of(2) && step % 2 == 1 => {
                use squeeze_engine::dedup::IdleStep;
                vol.dedup_idle_step(1 + (step % 3) as u64).map(|s| match s {
                    IdleStep::Nothing => {}
                    IdleStep::Stopped { .. } => kills.dedup_idle_steps += 1,
                    IdleStep::Finished(rep) => {
                        kills.dedup_idle_steps += 1;
                        kills.dedup_linked += rep.sectors_linked;
                    }
                })
            }
            76..=78 if seed.is_multiple_of(2) => vol.dedup(1 << 20, |_, _| {}).map(|rep| {
                kills.dedup_linked += rep.sectors_linked;
            }),
            78 => vol.merge(|_, _| {}).map(|_| ()),
            79 => vol.compact(|_, _| {}).map(|_| ()),
            80..=84 if !armed => {
                // Clean close and reopen: everything is durable.
                vol.close().unwrap();
                m.flush();
                vol = open(&rig).unwrap();
                Ok(())
            }
            85..=91 if !armed => {
                // Arm a power cut at one of the next few I/Os.
                rig.disk.set_faults(SimFaults {
                    crash_at_write: Some(r.gen_range(1..12)),
                    ..Default::default()
                });
                armed = true;
                Ok(())
            }
            92..=93 if !armed => {
                // Process kill now: what reached the disk survives (synced
                // or not), bytes staged in the process's memory do not.
                let staged = rig.unwritten_bytes();
                let img = Rig::over(path, rig.disk.kill(), &mut r).behind(rig.behind);
                drop(vol);
                rig = img;
                vol = open(&rig).unwrap_or_else(|e| panic!("seed {seed}: reopen after kill: {e}"));
                let lost = m.verify_after_crash(&vol, seed, step);
                assert!(
                    lost == 0 || staged > 0,
                    "seed {seed} step {step}: a process kill lost {lost} acknowledged sectors \
                     though nothing was staged"
                );
                kills.kills += 1;
                kills.kills_with_staged += u64::from(staged > 0);
                kills.sectors_lost += lost as u64;
                Ok(())
            }
            _ => {
                // Power cut now, between operations.
                let (d, v) = crash_and_recover(&mut r, &rig, vol, seed);
                rig = d;
                vol = v;
                armed = false;
                m.verify_after_crash(&vol, seed, step);
                Ok(())
            }
        };
        if res.is_err() || rig.disk.is_dead() {
            assert!(
                rig.disk.is_dead(),
                "seed {seed} step {step}: operation failed without a fault: {res:?}"
            );
            let (d, v) = crash_and_recover(&mut r, &rig, vol, seed);
            rig = d;
            vol = v;
            armed = false;
            m.verify_after_crash(&vol, seed, step);
        }
    }
    // After a full clean the log holds little more than the live data.
    rig.disk.set_faults(SimFaults::default());
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
    kills.faults = vol.stats().map_faults;
    kills.dedup_inline_linked = vol.stats().dedup_inline_linked_sectors;
    let (_d, v) = crash_and_recover(&mut r, &rig, vol, seed);
    m.verify_after_crash(&v, seed, steps);
    kills
}

/// Runs SQUEEZE_SIM_SEEDS seeds (or SQUEEZE_SIM_SEED alone) over `path`.
fn run_seeds(path: IoPath) -> KillStats {
    if let Ok(s) = std::env::var("SQUEEZE_SIM_SEED") {
        return run_seed(path, s.parse().expect("SQUEEZE_SIM_SEED is a number"));
    }
    let n: u64 = std::env::var("SQUEEZE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let mut all = KillStats::default();
    for seed in 0..n {
        let k = run_seed(path, seed);
        all.kills += k.kills;
        all.kills_with_staged += k.kills_with_staged;
        all.sectors_lost += k.sectors_lost;
        all.upgrades += k.upgrades;
        all.faults += k.faults;
        all.dedup_linked += k.dedup_linked;
        all.dedup_idle_steps += k.dedup_idle_steps;
        all.dedup_inline_linked += k.dedup_inline_linked;
    }
    println!(
        "{path:?}: {n} seeds; {} process kills, {} with staged bytes, {} acknowledged \
         unflushed sectors lost to them; {} upgrade passes; {} map chunks paged in; {} \
         sectors deduplicated ({} idle pass steps; {} linked inline as written)",
        all.kills,
        all.kills_with_staged,
        all.sectors_lost,
        all.upgrades,
        all.faults,
        all.dedup_linked,
        all.dedup_idle_steps,
        all.dedup_inline_linked
    );
    if n >= 20 {
        assert!(all.faults > 0, "no seed paged its map in");
    }
    // A 4 MiB volume seals few segments: about one seed in forty upgrades
    // one (the dedicated power-cut test is `tests/upgrade.rs`).
    if n >= 400 {
        assert!(all.upgrades >= 3, "few upgrade passes rewrote anything");
    }
    if n >= 100 {
        assert!(
            all.dedup_linked > 0,
            "no deduplication pass shared anything"
        );
        assert!(all.dedup_idle_steps > 0, "no idle pass step read anything");
        assert!(
            all.dedup_inline_linked > 0,
            "no write in dedup mode inline was linked as written"
        );
    }
    all
}

#[test]
fn random_sequences_survive_crashes() {
    let k = run_seeds(IoPath::Sim);
    assert_eq!(
        k.sectors_lost, 0,
        "a kill lost writes on the page-cache path"
    );
}

/// The same sequences through the write-behind path (the default I/O path
/// of `FileStorage`): a tiny staging pool over the simulated disk.
#[test]
fn random_sequences_survive_crashes_through_write_behind() {
    let k = run_seeds(IoPath::WriteBehind);
    if std::env::var("SQUEEZE_SIM_SEED").is_err() && k.kills >= 20 {
        assert!(
            k.kills_with_staged > 0,
            "no process kill found staged bytes: the kill case does not reach the pool"
        );
    }
}
