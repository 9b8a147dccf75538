//! A put or delete acknowledged as durable (a flush returned after it)
//! survives any power cut; an unflushed one is there wholly or not at all;
//! no bucket is ever torn and no record holds bytes never put. Random puts
//! (of sizes that make chains spill and updates move), deletes, flushes,
//! reopens and power cuts (between operations and at a chosen I/O inside
//! one, through the engine's simulator, which keeps a random page-granular
//! subset of unsynced writes), checked against a model after every crash.
//!
//! SQUEEZE_KV_SIM_SEEDS=N runs N seeds (default 300); SQUEEZE_KV_SIM_SEED=S
//! replays one. (Variables of their own: the SQUEEZE_SIM_SEEDS=2000 of
//! scripts/test.sh sizes the engine's simulators.)

use rand::{Rng, SeedableRng};
use squeeze_engine::{CreateOptions, OpenOptions, SimFaults, SimStorage, Volume};
use squeeze_kv::{CreateStore, Expect, KvError, Store};
use std::collections::HashMap;
use std::sync::Arc;

type Value = Option<Vec<u8>>;

struct Model {
    durable: HashMap<Vec<u8>, Value>,
    /// Values written since the last flush, per key.
    since: HashMap<Vec<u8>, Vec<Value>>,
    /// Every (key, value) ever put: a crash may leave a copy behind the
    /// first one of its key (never read, removed when the key is next
    /// written), so a bucket may hold any of them.
    ever: std::collections::HashSet<(Vec<u8>, Vec<u8>)>,
}

impl Model {
    fn write(&mut self, k: &[u8], v: Value) {
        if let Some(v) = &v {
            self.ever.insert((k.to_vec(), v.clone()));
        }
        self.since.entry(k.to_vec()).or_default().push(v);
    }

    fn flush(&mut self, current: &HashMap<Vec<u8>, Value>) {
        self.durable.clone_from(current);
        self.since.clear();
    }

    fn allowed(&self, k: &[u8], got: &Value) -> bool {
        self.durable.get(k).unwrap_or(&None) == got
            || self.since.get(k).is_some_and(|c| c.contains(got))
    }
}

fn open(disk: &Arc<SimStorage>) -> Store {
    let vol = Arc::new(Volume::open(disk.clone(), OpenOptions::default()).unwrap());
    Store::open(vol, Expect::default()).unwrap()
}

/// Crash, recover, check against the model and adopt what the store shows.
fn crash_check(
    r: &mut impl Rng,
    disk: &Arc<SimStorage>,
    m: &mut Model,
    current: &mut HashMap<Vec<u8>, Value>,
    universe: &[Vec<u8>],
    seed: u64,
    step: usize,
) -> (Arc<SimStorage>, Store) {
    let disk = Arc::new(disk.crash(r));
    let s = open(&disk);
    for k in universe {
        let got = s
            .get(k)
            .unwrap_or_else(|e| panic!("seed {seed} step {step}: get: {e}"));
        assert!(
            m.allowed(k, &got),
            "seed {seed} step {step}: key {:?} reads {:?} bytes: neither durable nor written since",
            String::from_utf8_lossy(k),
            got.as_ref().map(Vec::len)
        );
        current.insert(k.clone(), got);
    }
    s.scan(|i, b| {
        for (k, v) in &b.records {
            assert!(
                m.ever.contains(&(k.clone(), v.clone())),
                "seed {seed} step {step}: bucket {i} holds a record never put"
            );
        }
    })
    .unwrap_or_else(|e| panic!("seed {seed} step {step}: a bucket is torn: {e}"));
    m.flush(current);
    (disk, s)
}

fn run_seed(seed: u64) -> u64 {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let mut disk = Arc::new(SimStorage::new());
    let mut o = CreateOptions::new(8 << 20);
    o.segment_size = 512 << 10;
    let vol = Arc::new(Volume::create(disk.clone(), &o).unwrap());
    let c = CreateStore {
        buckets: Some(r.gen_range(16..64)),
        seed: r.gen(),
        probe_max: 16,
    };
    let mut s = Store::create(vol, c).unwrap();
    let universe: Vec<Vec<u8>> = (0..120).map(|i| format!("key-{i}").into_bytes()).collect();
    let mut m = Model {
        durable: HashMap::new(),
        since: HashMap::new(),
        ever: Default::default(),
    };
    let mut current: HashMap<Vec<u8>, Value> = HashMap::new();
    let mut armed = false;
    let mut crashes = 0;
    for step in 0..r.gen_range(50..200) {
        let k = universe[r.gen_range(0..universe.len())].clone();
        let res: Result<(), KvError> = match r.gen_range(0..100) {
            0..=54 => {
                let len = [8, 100, 400, 1200, 2500][r.gen_range(0..5)];
                let v: Vec<u8> = (0..len).map(|_| r.gen()).collect();
                m.write(&k, Some(v.clone()));
                match s.put(&k, &v) {
                    Ok(()) => {
                        current.insert(k, Some(v));
                        Ok(())
                    }
                    Err(KvError::Full(_)) => {
                        m.since.get_mut(&k).unwrap().pop();
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            55..=69 => {
                m.write(&k, None);
                s.delete(&k).map(|_| {
                    current.insert(k, None);
                })
            }
            70..=84 => s.flush().map(|()| m.flush(&current)),
            85..=92 if !armed => {
                disk.set_faults(SimFaults {
                    crash_at_write: Some(r.gen_range(1..6)),
                    ..Default::default()
                });
                armed = true;
                Ok(())
            }
            93..=95 if !armed => {
                // Clean close and reopen.
                let vol = s.volume().clone();
                drop(s);
                Arc::try_unwrap(vol).ok().unwrap().close().unwrap();
                m.flush(&current);
                s = open(&disk);
                Ok(())
            }
            _ => Err(KvError::Invalid("power cut now".into())),
        };
        if res.is_err() || disk.is_dead() {
            if let Err(e) = &res {
                assert!(
                    disk.is_dead() || matches!(e, KvError::Invalid(_)),
                    "seed {seed} step {step}: failed without a fault: {e}"
                );
            }
            drop(s);
            crashes += 1;
            (disk, s) = crash_check(&mut r, &disk, &mut m, &mut current, &universe, seed, step);
            armed = false;
        }
    }
    drop(s);
    disk.set_faults(SimFaults::default());
    crash_check(&mut r, &disk, &mut m, &mut current, &universe, seed, 9999);
    crashes
}

#[test]
fn durable_puts_survive_power_cuts() {
    let seeds: Vec<u64> = match std::env::var("SQUEEZE_KV_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("SQUEEZE_KV_SIM_SEED is a number")],
        Err(_) => (0..std::env::var("SQUEEZE_KV_SIM_SEEDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300))
            .collect(),
    };
    let crashes: u64 = seeds.iter().map(|&s| run_seed(s)).sum();
    println!("{} seeds, {crashes} power cuts", seeds.len());
    assert!(seeds.len() < 20 || crashes > seeds.len() as u64);
}
