//! The volume a store makes for itself (`squeeze_kv::create_volume`, what
//! `squeeze kv bench` and squeeze-ycsb embed): small segments and a small
//! write-behind pool, and a file that any `squeeze` command opens as usual.

use squeeze_engine::pipeline::adapt::Why;
use squeeze_engine::{FileStorage, OpenOptions, Volume};
use squeeze_kv::{create_volume, CreateStore, Expect, Store};
use std::sync::Arc;

#[test]
fn a_store_on_its_own_volume_reopens_through_the_usual_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.sqz");
    // Values that do not compress (an xorshift stream), 100-400 bytes.
    let value = |i: u32| {
        let mut x = u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..100 + i as usize % 300)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>()
    };
    {
        let vol = create_volume(&path, 16384).unwrap();
        assert_eq!(vol.stats().segment_size, squeeze_kv::volume::SEGMENT_SIZE);
        let s = Store::create(
            vol.clone(),
            CreateStore {
                buckets: Some(16384),
                ..Default::default()
            },
        )
        .unwrap();
        // More than the pool's 2 MiB of chunks and than a segment, so
        // chunks are evicted and the log crosses segments.
        for i in 0..20_000u32 {
            s.put(format!("key{i}").as_bytes(), &value(i)).unwrap();
        }
        s.flush().unwrap();
        let st = vol.stats();
        assert!(
            st.physical_bytes > 2 * squeeze_kv::volume::SEGMENT_SIZE,
            "physical {} stored {}",
            st.physical_bytes,
            st.stored_bytes
        );
        drop(s);
        Arc::try_unwrap(vol).ok().unwrap().close().unwrap();
    }
    assert!(
        create_volume(&path, 4096).is_err(),
        "an existing file is not overwritten"
    );
    let vol = Arc::new(
        Volume::open(
            Arc::new(FileStorage::open(&path).unwrap()),
            OpenOptions::default(),
        )
        .unwrap(),
    );
    let s = Store::open(vol, Expect::default()).unwrap();
    for i in 0..20_000u32 {
        assert_eq!(
            s.get(format!("key{i}").as_bytes()).unwrap(),
            Some(value(i)),
            "key{i}"
        );
    }
}

#[test]
fn a_stores_own_volume_defers_compression_and_compact_brings_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let vol = create_volume(&dir.path().join("kv.sqz"), 8192).unwrap();
    let s = Store::create(
        vol.clone(),
        CreateStore {
            buckets: Some(8192),
            ..Default::default()
        },
    )
    .unwrap();
    // Compressible values (db_bench's kind: a random half, repeated).
    let value = |i: u32| {
        let half: Vec<u8> = (0..200u32)
            .map(|k| b' ' + ((i.wrapping_mul(2654435761) ^ k.wrapping_mul(40503)) % 95) as u8)
            .collect();
        [half.clone(), half].concat()
    };
    for i in 0..12_000u32 {
        s.put(format!("user{i}").as_bytes(), &value(i)).unwrap();
    }
    s.flush().unwrap();
    let st = vol.stats();
    assert_eq!(st.write_algorithm, "lz4", "{st:?}");
    assert_eq!(st.write_algorithm_why, Some(Why::Deferred));
    assert!(st.below_target_bytes > 0);
    let before = st.stored_bytes;
    let rep = vol.compact(|_, _| {}).unwrap();
    let st = vol.stats();
    assert!(rep.upgraded_bytes > 0, "{rep:?}");
    // Every segment's, the log head's too.
    assert_eq!(st.below_target_pending_bytes, 0, "{st:?}");
    assert!(
        st.stored_bytes < before,
        "zstd:3 stores {} against lz4's {before}",
        st.stored_bytes
    );
    for i in (0..12_000u32).step_by(7) {
        assert_eq!(
            s.get(format!("user{i}").as_bytes()).unwrap(),
            Some(value(i))
        );
    }
}

/// Every bucket of a store gets mapped, one sector each, so its own volume
/// makes a chunk of the map dense from its first entry
/// (`OpenOptions::map_runs_max`): 2560 bytes a chunk at once, never a run
/// list built only to be dropped (docs/KV.md, "Memory"). A volume opened
/// the usual way keeps a few scattered buckets as runs, 16 bytes each.
#[test]
fn a_stores_own_volume_keeps_its_map_dense_from_the_first_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.sqz");
    let map_of = |vol: &Arc<Volume>| {
        let st = vol.stats();
        (st.map_chunks, st.map_memory_bytes)
    };
    let vol = create_volume(&path, 16384).unwrap();
    let s = Store::create(
        vol.clone(),
        CreateStore {
            buckets: Some(16384),
            ..Default::default()
        },
    )
    .unwrap();
    // About 4 of the 512 buckets of each chunk.
    for i in 0..128u32 {
        s.put(format!("key{i}").as_bytes(), b"value").unwrap();
    }
    s.flush().unwrap();
    let (chunks, bytes) = map_of(&vol);
    assert!(chunks >= 30, "{chunks} chunks");
    assert!(bytes >= chunks * 2560, "{bytes} bytes for {chunks} chunks");
    drop(s);
    Arc::try_unwrap(vol).ok().unwrap().close().unwrap();
    let vol = Arc::new(
        Volume::open(
            Arc::new(FileStorage::open(&path).unwrap()),
            OpenOptions::default(),
        )
        .unwrap(),
    );
    let (chunks, bytes) = map_of(&vol);
    assert!(bytes < chunks * 1024, "{bytes} bytes for {chunks} chunks");
    let s = Store::open(vol, Expect::default()).unwrap();
    for i in 0..128u32 {
        assert_eq!(
            s.get(format!("key{i}").as_bytes()).unwrap().as_deref(),
            Some(&b"value"[..])
        );
    }
}
