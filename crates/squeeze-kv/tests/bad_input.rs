//! Bad input gets a clear error and loses nothing: a volume that is not a
//! store, a store opened with another bucket count or hash seed, a damaged
//! header, a damaged bucket, a volume that is not empty at create, and a
//! full volume (--max-physical), which answers ENOSPC and stays consistent.

use rand::{Rng, SeedableRng};
use squeeze_engine::{CreateOptions, OpenOptions, SimStorage, Volume};
use squeeze_kv::{CreateStore, Expect, KvError, Store};
use std::sync::Arc;

fn volume(size: u64, max_physical: u64) -> (Arc<SimStorage>, Arc<Volume>) {
    let disk = Arc::new(SimStorage::new());
    let mut o = CreateOptions::new(size);
    o.segment_size = 512 << 10;
    o.max_physical = max_physical;
    (disk.clone(), Arc::new(Volume::create(disk, &o).unwrap()))
}

#[test]
fn a_volume_that_is_not_a_store_is_refused() {
    let (_d, vol) = volume(16 << 20, 0);
    let e = Store::open(vol.clone(), Expect::default()).err().unwrap();
    assert!(
        matches!(&e, KvError::NotAStore(m) if m.contains("empty")),
        "{e}"
    );
    vol.write(0, &[0x33; 4096], false).unwrap();
    let e = Store::open(vol.clone(), Expect::default()).err().unwrap();
    assert!(
        matches!(&e, KvError::NotAStore(m) if m.contains("magic")),
        "{e}"
    );
    // A write-ahead log is not a store either.
    let (_d, vol) = volume(16 << 20, 0);
    drop(squeeze_wal_like_header(&vol));
    let e = Store::open(vol, Expect::default()).err().unwrap();
    assert!(matches!(e, KvError::NotAStore(_)), "{e}");
}

/// Sector 0 as another application would leave it.
fn squeeze_wal_like_header(vol: &Volume) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[..8].copy_from_slice(b"SQZWAL\0\0");
    vol.write(0, &b, false).unwrap();
    b
}

#[test]
fn another_seed_or_bucket_count_is_refused() {
    let (_d, vol) = volume(16 << 20, 0);
    let c = CreateStore {
        buckets: Some(1000),
        seed: 7,
        ..Default::default()
    };
    let s = Store::create(vol.clone(), c).unwrap();
    s.put(b"k", b"v").unwrap();
    drop(s);
    let e = Store::open(
        vol.clone(),
        Expect {
            seed: Some(8),
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            e,
            KvError::Mismatch {
                what: "hash seed",
                found: 7,
                wanted: 8
            }
        ),
        "{e}"
    );
    let e = Store::open(
        vol.clone(),
        Expect {
            buckets: Some(999),
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            e,
            KvError::Mismatch {
                what: "bucket count",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.errno(), libc::EINVAL);
    let s = Store::open(
        vol,
        Expect {
            buckets: Some(1000),
            seed: Some(7),
        },
    )
    .unwrap();
    assert_eq!(s.get(b"k").unwrap(), Some(b"v".to_vec()));
}

#[test]
fn a_damaged_header_or_bucket_is_reported() {
    let (_d, vol) = volume(16 << 20, 0);
    let s = Store::create(vol.clone(), CreateStore::default()).unwrap();
    s.put(b"k", b"value").unwrap();
    let home = s.home(b"k");
    drop(s);
    let mut b = vec![0u8; 4096];
    vol.read(0, &mut b).unwrap();
    b[20] ^= 1;
    vol.write(0, &b, false).unwrap();
    let e = Store::open(vol.clone(), Expect::default()).err().unwrap();
    assert!(matches!(e, KvError::HeaderChecksum { .. }), "{e}");
    b[20] ^= 1;
    vol.write(0, &b, false).unwrap();
    // Damage the key's bucket (another writer's bytes: the engine's own
    // checksums see nothing wrong).
    let at = (1 + home) * 4096;
    vol.read(at, &mut b).unwrap();
    b[14] ^= 0x40;
    vol.write(at, &b, false).unwrap();
    let s = Store::open(vol, Expect::default()).unwrap();
    let e = s.get(b"k").err().unwrap();
    assert!(
        matches!(e, KvError::CorruptBucket { bucket, .. } if bucket == home),
        "{e}"
    );
    assert!(s.put(b"k", b"new").is_err(), "a put over a corrupt bucket");
}

#[test]
fn create_refuses_a_volume_with_data() {
    let (_d, vol) = volume(16 << 20, 0);
    vol.write(8 << 20, &[1; 4096], false).unwrap();
    let e = Store::create(vol, CreateStore::default()).err().unwrap();
    assert!(
        matches!(&e, KvError::Invalid(m) if m.contains("not empty")),
        "{e}"
    );
}

#[test]
fn a_full_volume_answers_enospc_and_stays_consistent() {
    let (disk, vol) = volume(1 << 30, 6 << 20);
    let s = Store::create(vol.clone(), CreateStore::default()).unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(3);
    let mut stored = Vec::new();
    let e = loop {
        let k = format!("key{}", stored.len()).into_bytes();
        let v: Vec<u8> = (0..3000).map(|_| r.gen()).collect();
        match s.put(&k, &v) {
            Ok(()) => stored.push((k, v)),
            Err(e) => break e,
        }
        assert!(stored.len() < 100_000, "never ran out of room");
    };
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    s.flush().unwrap();
    for (k, v) in &stored {
        assert_eq!(s.get(k).unwrap().as_ref(), Some(v));
    }
    // Deletes still work on a full volume and give room back.
    for (k, _) in stored.iter().take(stored.len() / 2) {
        assert!(s.delete(k).unwrap());
    }
    s.flush().unwrap();
    drop(s);
    Arc::try_unwrap(vol).ok().unwrap().close().unwrap();
    let vol = Arc::new(Volume::open(disk, OpenOptions::default()).unwrap());
    let s = Store::open(vol, Expect::default()).unwrap();
    for (i, (k, v)) in stored.iter().enumerate() {
        let want = (i >= stored.len() / 2).then(|| v.clone());
        assert_eq!(s.get(k).unwrap(), want);
    }
    s.put(b"after", &[5; 3000]).unwrap();
}
