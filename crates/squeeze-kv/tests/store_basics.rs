//! The store's operations against a model: puts, updates (in place and
//! moving to another bucket), deletes, chains that spill over into the
//! next buckets, a chain that runs out (an error, never a silent drop),
//! limits on keys and values, and a reopen that finds everything.

use rand::{Rng, SeedableRng};
use squeeze_engine::{CreateOptions, OpenOptions, SimStorage, Volume};
use squeeze_kv::{CreateStore, Expect, KvError, Store, KEY_MAX, RECORD_MAX};
use std::collections::HashMap;
use std::sync::Arc;

fn volume(size: u64) -> (Arc<SimStorage>, Arc<Volume>) {
    let disk = Arc::new(SimStorage::new());
    let mut o = CreateOptions::new(size);
    o.segment_size = 512 << 10;
    let v = Arc::new(Volume::create(disk.clone(), &o).unwrap());
    (disk, v)
}

fn check(s: &Store, model: &HashMap<Vec<u8>, Vec<u8>>, universe: &[Vec<u8>]) {
    for k in universe {
        assert_eq!(s.get(k).unwrap().as_ref(), model.get(k), "key {k:?}");
    }
    let mut stored = 0;
    s.scan(|_, b| stored += b.records.len()).unwrap();
    assert_eq!(stored, model.len(), "records in buckets");
}

#[test]
fn random_operations_match_a_model_through_spills_and_reopens() {
    let (disk, vol) = volume(64 << 20);
    // Few buckets, so chains spill: 64 buckets of 4 KiB for ~300 keys.
    let c = CreateStore {
        buckets: Some(64),
        seed: 42,
        probe_max: 64,
    };
    let mut s = Store::create(vol.clone(), c).unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(5);
    let universe: Vec<Vec<u8>> = (0..300).map(|i| format!("key{i}").into_bytes()).collect();
    let mut model = HashMap::new();
    let mut spills = 0;
    for step in 0..6000 {
        let k = &universe[r.gen_range(0..universe.len())];
        match r.gen_range(0..10) {
            0..=5 => {
                let len = [10, 100, 400, 1500][r.gen_range(0..4)];
                let v: Vec<u8> = (0..len).map(|_| r.gen()).collect();
                match s.put(k, &v) {
                    Ok(()) => {
                        model.insert(k.clone(), v);
                    }
                    Err(KvError::Full(_)) => {}
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            6..=8 => {
                assert_eq!(
                    s.delete(k).unwrap(),
                    model.remove(k).is_some(),
                    "step {step}"
                );
            }
            _ => {
                s.flush().unwrap();
                drop(s);
                s = Store::open(vol.clone(), Expect::default()).unwrap();
            }
        }
        if step % 500 == 0 {
            check(&s, &model, &universe);
        }
    }
    s.scan(|_, b| spills += usize::from(b.spill)).unwrap();
    assert!(
        spills > 0,
        "no chain spilled: the test does not reach overflow"
    );
    check(&s, &model, &universe);
    drop(s);
    Arc::try_unwrap(vol).ok().unwrap().close().unwrap();
    let vol = Arc::new(Volume::open(disk, OpenOptions::default()).unwrap());
    let s = Store::open(
        vol,
        Expect {
            buckets: Some(64),
            seed: Some(42),
        },
    )
    .unwrap();
    check(&s, &model, &universe);
}

#[test]
fn a_chain_that_runs_out_is_an_error_and_keeps_everything() {
    let (_d, vol) = volume(16 << 20);
    let c = CreateStore {
        buckets: Some(4),
        seed: 1,
        probe_max: 2,
    };
    let s = Store::create(vol, c).unwrap();
    let mut stored = Vec::new();
    let mut refused = 0;
    for i in 0..100 {
        let k = format!("k{i}").into_bytes();
        match s.put(&k, &[9; 1000]) {
            Ok(()) => stored.push(k),
            Err(e @ KvError::Full(_)) => {
                assert_eq!(e.errno(), libc::ENOSPC);
                refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(refused > 0 && stored.len() >= 8, "{} stored", stored.len());
    for k in &stored {
        assert_eq!(s.get(k).unwrap(), Some(vec![9; 1000]));
    }
}

#[test]
fn an_update_that_outgrows_its_bucket_moves_the_key() {
    let (_d, vol) = volume(16 << 20);
    let c = CreateStore {
        buckets: Some(1),
        seed: 0,
        probe_max: 1,
    };
    let s = Store::create(vol.clone(), c).unwrap();
    s.put(b"a", &[1; 2000]).unwrap();
    s.put(b"b", &[2; 2000]).unwrap();
    // Growing "a" no longer fits the only bucket: an error, "a" unchanged.
    assert!(matches!(s.put(b"a", &[3; 2100]), Err(KvError::Full(_))));
    assert_eq!(s.get(b"a").unwrap(), Some(vec![1; 2000]));
    // With a second bucket in the chain it moves there.
    let (_d, vol) = volume(16 << 20);
    let c = CreateStore {
        buckets: Some(2),
        seed: 0,
        probe_max: 2,
    };
    let s = Store::create(vol, c).unwrap();
    let (a, b) = (b"a".as_slice(), b"b".as_slice());
    s.put(a, &[1; 2000]).unwrap();
    // Fill a's home with another key of the same home.
    let other: Vec<u8> = (0u32..)
        .map(|i| format!("o{i}").into_bytes())
        .find(|k| s.home(k) == s.home(a))
        .unwrap();
    s.put(&other, &[2; 2000]).unwrap();
    s.put(a, &[3; 3000]).unwrap();
    assert_eq!(s.get(a).unwrap(), Some(vec![3; 3000]));
    assert_eq!(s.get(&other).unwrap(), Some(vec![2; 2000]));
    let mut copies = 0;
    s.scan(|_, bk| copies += bk.records.iter().filter(|(k, _)| k == a).count())
        .unwrap();
    assert_eq!(copies, 1);
    assert!(s.get(b).unwrap().is_none());
}

#[test]
fn keys_and_values_over_the_limits_are_errors() {
    let (_d, vol) = volume(16 << 20);
    let s = Store::create(vol, CreateStore::default()).unwrap();
    let e = s.put(&vec![1; KEY_MAX + 1], b"v").err().unwrap();
    assert!(matches!(e, KvError::TooLarge { what: "key", .. }), "{e}");
    let e = s.put(b"k", &vec![1; RECORD_MAX]).err().unwrap();
    assert!(matches!(e, KvError::TooLarge { .. }), "{e}");
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(matches!(s.put(b"", b"v"), Err(KvError::Invalid(_))));
    // The largest record fits, and nothing was stored by the errors.
    s.put(b"k", &vec![1; RECORD_MAX - 1]).unwrap();
    assert_eq!(s.get(b"k").unwrap().unwrap().len(), RECORD_MAX - 1);
    let mut n = 0;
    s.scan(|_, b| n += b.records.len()).unwrap();
    assert_eq!(n, 1);
}

#[test]
fn many_threads_put_and_get() {
    let (_d, vol) = volume(64 << 20);
    let s = Arc::new(
        Store::create(
            vol,
            CreateStore {
                buckets: Some(512),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let hs: Vec<_> = (0..8)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..400 {
                    let k = format!("t{t}k{i}").into_bytes();
                    s.put(&k, &k.repeat(20)).unwrap();
                    if i % 3 == 0 {
                        s.delete(&k).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    for t in 0..8 {
        for i in 0..400 {
            let k = format!("t{t}k{i}").into_bytes();
            let want = (i % 3 != 0).then(|| k.repeat(20));
            assert_eq!(s.get(&k).unwrap(), want);
        }
    }
}
