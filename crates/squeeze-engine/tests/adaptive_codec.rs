//! The adaptive write codec in the engine: a compression pool that cannot
//! keep up makes client writes take faster rungs of the ladder (counted as
//! below target, stored with lz4 or raw, read back intact), an unloaded
//! pool gives every blob the target, and with adaptation off a saturated
//! pool still gives the target.

mod common;
use common::*;
use squeeze_codec::CpuPool;
use squeeze_engine::pipeline::adapt::Why;
use squeeze_engine::{default_policy, OpenOptions, SimStorage, Volume};
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// A volume on one compression thread with target zstd:19 (a few MB/s: any
/// two writers saturate it).
fn slow_target_volume(adaptive: bool) -> (Arc<SimStorage>, Volume) {
    let s = Arc::new(SimStorage::new());
    let mut o = small_opts(256 * MIB as u64);
    o.segment_size = 4 << 20;
    o.policy = default_policy();
    o.policy.level = 19;
    Volume::create(s.clone(), &o).unwrap().close().unwrap();
    let v = Volume::open(
        s.clone(),
        OpenOptions {
            engine: Some(Arc::new(CpuPool::new(1))),
            no_adapt: !adaptive,
            ..Default::default()
        },
    )
    .unwrap();
    (s, v)
}

/// `writers` threads each write `per_writer` bytes of fio-like data in 1 MiB
/// requests to their own region; returns what each wrote.
fn write_parallel(v: &Volume, writers: usize, per_writer: usize) -> Vec<Vec<u8>> {
    let datas: Vec<Vec<u8>> = (0..writers)
        .map(|w| squeeze_codec::testdata::fio_like(per_writer, 60, 4096, 100 + w as u64))
        .collect();
    std::thread::scope(|sc| {
        for (w, d) in datas.iter().enumerate() {
            sc.spawn(move || {
                for (k, chunk) in d.chunks(MIB).enumerate() {
                    let off = (w * per_writer + k * MIB) as u64;
                    v.write(off, chunk, false).unwrap();
                }
            });
        }
    });
    datas
}

fn check(v: &Volume, datas: &[Vec<u8>]) {
    for (w, d) in datas.iter().enumerate() {
        let mut got = vec![0u8; d.len()];
        v.read((w * d.len()) as u64, &mut got).unwrap();
        assert!(got == *d, "writer {w}: data differs");
    }
}

#[test]
fn a_saturated_pool_writes_below_target() {
    let (_s, v) = slow_target_volume(true);
    let datas = write_parallel(&v, 4, 16 * MIB);
    let st = v.stats();
    let total = 64 * MIB as u64;
    assert!(
        st.below_target_bytes > 0,
        "a pool at zstd:19 behind four writers never stepped down: {st:?}"
    );
    assert!(st.below_target_bytes <= total);
    assert!(st.below_target_pending_bytes > 0);
    assert_eq!(st.below_target_pending_bytes, st.below_target_bytes);
    // Below-target blobs are zstd:1 or lz4, never stored raw for it; all
    // read back intact.
    let fast = st.bytes_per_algorithm["lz4"];
    assert!(st.bytes_per_algorithm["none"] < total / 20, "{st:?}");
    eprintln!(
        "below target {} of {total}; lz4+none {fast}; ratio {:.2}",
        st.below_target_bytes, st.compression_ratio
    );
    check(&v, &datas);
    v.close().unwrap();
}

#[test]
fn a_saturated_pool_without_adaptation_writes_the_target() {
    let (_s, v) = slow_target_volume(false);
    let datas = write_parallel(&v, 4, 4 * MIB);
    let st = v.stats();
    assert_eq!(st.below_target_bytes, 0);
    assert_eq!(st.below_target_pending_bytes, 0);
    assert_eq!(st.bytes_per_algorithm["lz4"], 0);
    assert_eq!(st.write_algorithm, "zstd:19");
    check(&v, &datas);
    v.close().unwrap();
}

#[test]
fn an_unloaded_pool_writes_the_target() {
    // The default policy (zstd:3) on the default pool, one writer that
    // waits for each write: the engine's queue is empty at every submit.
    let s = Arc::new(SimStorage::new());
    let mut o = small_opts(64 * MIB as u64);
    o.segment_size = 4 << 20;
    Volume::create(s.clone(), &o).unwrap().close().unwrap();
    let v = Volume::open(s.clone(), OpenOptions::default()).unwrap();
    let datas = write_parallel(&v, 1, 32 * MIB);
    let st = v.stats();
    assert_eq!(st.below_target_bytes, 0, "{st:?}");
    assert_eq!(st.bytes_per_algorithm["lz4"], 0);
    assert_eq!(st.write_algorithm, "zstd:3");
    assert!(st.bytes_per_algorithm["zstd"] > 0);
    check(&v, &datas);
    v.close().unwrap();
}

/// A volume on the default policy (zstd:3) and an idle two-thread pool
/// whose adaptive codec also reads a CPU share of `busy`.
fn cpu_volume(busy: f64) -> Volume {
    let s = Arc::new(SimStorage::new());
    let mut o = small_opts(64 * MIB as u64);
    o.segment_size = 4 << 20;
    Volume::create(s.clone(), &o).unwrap().close().unwrap();
    Volume::open(
        s,
        OpenOptions {
            engine: Some(Arc::new(CpuPool::new(2))),
            adapt_cpu: Some(Arc::new(Busy(busy, Default::default()))),
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn busy_cores_write_below_target_and_the_upgrade_restores_it() {
    // One writer that waits for each write: the engine is never behind,
    // but the cores are (the test says) 99% busy. After the law's hold
    // (200 ms) its writes go to lz4.
    let v = cpu_volume(0.99);
    let datas: Vec<Vec<u8>> = (0..8)
        .map(|k| squeeze_codec::testdata::fio_like(MIB, 60, 4096, k))
        .collect();
    let t = std::time::Instant::now();
    let mut model = std::collections::BTreeMap::new();
    let mut k = 0usize;
    let mut write = |v: &Volume| {
        let off = (k % 48 * MIB) as u64;
        v.write(off, &datas[k % 8], false).unwrap();
        model.insert(off, k % 8);
        k += 1;
    };
    while v.stats().write_algorithm != "lz4" {
        assert!(
            t.elapsed().as_secs() < 30,
            "never stepped down: {:?}",
            v.stats()
        );
        for _ in 0..16 {
            write(&v);
        }
    }
    // 24 MiB more, now below the target: more than two 4 MiB segments of
    // lz4, so sealed segments hold some whatever segment the step down
    // came in (8 MiB could all sit in the unsealed head, which the idle
    // upgrade leaves alone).
    for _ in 0..24 {
        write(&v);
    }
    let st = v.stats();
    assert_eq!(st.write_algorithm_why, Some(Why::Cpu), "{st:?}");
    assert_eq!(st.cpu_busy, Some(0.99));
    assert!(st.below_target_bytes >= 24 * MIB as u64, "{st:?}");
    assert!(st.bytes_per_algorithm["lz4"] > 0, "{st:?}");
    let check_model = |v: &Volume| {
        for (off, d) in &model {
            let mut got = vec![0u8; MIB];
            v.read(*off, &mut got).unwrap();
            assert!(got == datas[*d], "MiB at {off} differs");
        }
    };
    check_model(&v);
    // The idle upgrade brings such bytes in sealed segments to the target,
    // and compact those still in the head segment.
    v.flush().unwrap();
    while v.upgrade_pass().unwrap().is_some() {}
    let st = v.stats();
    assert!(st.upgraded_bytes > 0, "{st:?}");
    check_model(&v);
    v.compact(|_, _| {}).unwrap();
    let st = v.stats();
    assert_eq!(st.below_target_pending_bytes, 0, "{st:?}");
    check_model(&v);
    v.close().unwrap();
}

#[test]
fn cores_with_room_keep_the_target() {
    // 60% busy: below the law's 95%, whatever the writer does.
    let v = cpu_volume(0.6);
    let datas = write_parallel(&v, 1, 16 * MIB);
    let st = v.stats();
    assert_eq!(st.below_target_bytes, 0, "{st:?}");
    assert_eq!(st.write_algorithm, "zstd:3");
    assert_eq!(st.write_algorithm_why, Some(Why::Target));
    assert_eq!(st.cpu_busy, Some(0.6));
    check(&v, &datas);
    v.close().unwrap();
}

#[test]
fn deferred_compression_writes_lz4_and_compact_restores_the_target_after_a_reopen() {
    // Idle cores and an idle pool: only `adapt_defer` sends writes to lz4.
    let s = Arc::new(SimStorage::new());
    let mut o = small_opts(64 * MIB as u64);
    o.segment_size = 4 << 20;
    Volume::create(s.clone(), &o).unwrap().close().unwrap();
    let open = |defer: bool| {
        Volume::open(
            s.clone(),
            OpenOptions {
                engine: Some(Arc::new(CpuPool::new(2))),
                adapt_cpu: Some(Arc::new(Busy(0.1, Default::default()))),
                adapt_defer: defer,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let v = open(true);
    // Single sectors, as squeeze-kv writes its buckets.
    let data = squeeze_codec::testdata::text(8 * MIB, 5);
    for (i, sector) in data.chunks(4096).enumerate() {
        v.write(i as u64 * 4096, sector, false).unwrap();
    }
    v.flush().unwrap();
    let st = v.stats();
    assert_eq!(st.write_algorithm, "lz4", "{st:?}");
    assert_eq!(st.write_algorithm_why, Some(Why::Deferred));
    assert_eq!(st.below_target_bytes, 8 * MIB as u64, "{st:?}");
    assert_eq!(st.bytes_per_algorithm.get("zstd:3"), None, "{st:?}");
    let lz4_bytes = st.stored_bytes;
    v.close().unwrap();
    // Reopened without the per-segment marks: compact finds the records by
    // codec and rewrites them with the target.
    let v = open(false);
    let report = v.compact(|_, _| {}).unwrap();
    let st = v.stats();
    // Every lz4 record, the head segment's too.
    assert_eq!(report.upgraded_bytes, 8 * MIB as u64, "{report:?}");
    assert_eq!(st.below_target_pending_bytes, 0, "{st:?}");
    assert!(
        st.stored_bytes < lz4_bytes * 9 / 10,
        "zstd:3 stored {} against lz4's {lz4_bytes}",
        st.stored_bytes
    );
    let mut got = vec![0u8; data.len()];
    v.read(0, &mut got).unwrap();
    assert!(got == data);
    // Without deferral the same writes take the target.
    v.write(0, &data[..4096], false).unwrap();
    assert_eq!(v.stats().write_algorithm_why, Some(Why::Target));
    v.close().unwrap();
}
