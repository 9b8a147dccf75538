//! The cleaner keeps space honest without touching data: overwrites and
//! trims leave garbage that cleaning reclaims (the backing file shrinks),
//! the stored ratio survives 4 KiB overwrites, relocation racing with client
//! writes never resurrects old data (also after a crash and replay), and
//! recompression with a stronger codec is counted.

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::{
    default_policy, CodecId, CreateOptions, FileStorage, OpenOptions, SimStorage, Volume,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

#[test]
fn random_overwrites_then_compact_bound_space_and_write_amplification() {
    let (s, v) = sim_volume(64 * MIB, None);
    let mut r = rng(21);
    let dataset = 16 * MIB;
    // Fill, then rewrite the data set five times at random (4K..128K writes).
    let mut model = vec![0u8; dataset as usize];
    let mut written = 0u64;
    while written < 6 * dataset {
        let len = 4096 * r.gen_range(1..=32usize);
        let off = 4096 * r.gen_range(0..(dataset as usize - len) / 4096) as u64;
        let d = data(&mut r, 3, len);
        v.write(off, &d, false).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&d);
        written += len as u64;
        if r.gen_ratio(1, 50) {
            v.clean_pass().unwrap();
        }
    }
    v.compact(|_, _| {}).unwrap();
    let st = v.stats();
    let in_use = (st.segments_total - st.segments_free) * st.segment_size;
    assert!(
        (in_use as f64) < 1.3 * st.stored_bytes as f64 + 3.0 * st.segment_size as f64,
        "{in_use} in use for {} stored: {st:?}",
        st.stored_bytes
    );
    assert!(
        st.write_amplification < 2.0,
        "write amplification {}",
        st.write_amplification
    );
    let mut back = vec![0u8; dataset as usize];
    v.read(0, &mut back).unwrap();
    assert!(back == model);
    v.verify_accounting().unwrap();
    drop(v);
    let v = Volume::open(s, OpenOptions::default()).unwrap();
    v.read(0, &mut back).unwrap();
    assert!(back == model);
}

#[test]
fn ratio_survives_4k_overwrites() {
    let mut p = default_policy();
    p.max_blob = 128 << 10;
    let (_s, v) = sim_volume(64 * MIB, Some(p));
    let mut r = rng(22);
    let dataset = 16 * MIB as usize;
    v.write(0, &data(&mut r, 3, dataset), false).unwrap();
    let before = v.stats().compression_ratio;
    for _ in 0..2000 {
        let off = 4096 * r.gen_range(0..dataset / 4096) as u64;
        v.write(off, &data(&mut r, 3, 4096), false).unwrap();
    }
    v.compact(|_, _| {}).unwrap();
    let st = v.stats();
    let physical_ratio = st.mapped_bytes as f64
        / ((st.segments_total - st.segments_free - 2) * st.segment_size) as f64;
    assert!(
        st.compression_ratio > before * 0.95,
        "ratio {before} -> {}",
        st.compression_ratio
    );
    assert!(
        physical_ratio > before * 0.9,
        "on-disk ratio {physical_ratio} vs {before}"
    );
}

#[test]
fn trim_everything_shrinks_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sqz");
    let s = Arc::new(FileStorage::create(&path).unwrap());
    let mut o = CreateOptions::new(256 * MIB);
    o.segment_size = MIB;
    let v = Volume::create(s.clone(), &o).unwrap();
    let mut r = rng(23);
    v.write(0, &data(&mut r, 1, 64 * MIB as usize), true)
        .unwrap();
    let full = v.stats().physical_bytes;
    assert!(full > 60 * MIB, "{full}");
    v.trim(0, 256 * MIB, true).unwrap();
    v.compact(|_, _| {}).unwrap();
    let after = v.stats().physical_bytes;
    // Below 1% of what the data occupied, plus fixed metadata (superblocks,
    // the head segment and one checkpoint segment).
    assert!(
        after < full / 100 + 3 * MIB,
        "physical bytes {after} after trimming {full}"
    );
    let du = std::fs::metadata(&path).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::blocks(&du) * 512, after);
}

#[test]
fn cleaning_races_with_writers_and_survives_a_crash() {
    for seed in 0..6u64 {
        let s = Arc::new(SimStorage::new());
        let mut o = small_opts(32 * MIB);
        o.policy.max_blob = 32 << 10;
        let v = Arc::new(Volume::create(s.clone(), &o).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let cleaner = {
            let v = v.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    v.compact(|_, _| {}).unwrap();
                }
            })
        };
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let v = v.clone();
                std::thread::spawn(move || {
                    let mut r = rng(seed * 10 + t);
                    let region = 2 * MIB as usize;
                    let base = t * 4 * MIB;
                    let mut model = vec![0u8; region];
                    for _ in 0..400 {
                        let len = 4096 * r.gen_range(1..=16usize);
                        let off = 4096 * r.gen_range(0..(region - len) / 4096);
                        let kind = r.gen_range(1..4);
                        let d = data(&mut r, kind, len);
                        v.write(base + off as u64, &d, false).unwrap();
                        model[off..off + len].copy_from_slice(&d);
                    }
                    model
                })
            })
            .collect();
        let models: Vec<Vec<u8>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        cleaner.join().unwrap();
        v.flush().unwrap();
        let st = v.stats();
        assert!(st.segments_reclaimed > 0 || st.log_bytes_written > 0);
        let img = Arc::new(s.crash(&mut rng(seed)));
        drop(v);
        let v = Volume::open(img, OpenOptions::default()).unwrap();
        for (t, m) in models.iter().enumerate() {
            let mut back = vec![0u8; m.len()];
            v.read(t as u64 * 4 * MIB, &mut back).unwrap();
            assert!(
                &back == m,
                "seed {seed}: region {t} differs after crash and replay"
            );
        }
        v.verify_accounting().unwrap();
    }
}

#[test]
fn recompression_when_cleaning_is_counted() {
    let mut p = default_policy();
    p.codec = CodecId::Lz4;
    p.level = 0;
    p.recompress_codec = CodecId::Zstd;
    p.recompress_level = 9;
    let (_s, v) = sim_volume(32 * MIB, Some(p));
    let mut r = rng(24);
    let d = data(&mut r, 2, 8 * MIB as usize);
    v.write(0, &d, false).unwrap();
    v.write(0, &data(&mut r, 2, 4096), false).unwrap();
    let lz4_ratio = v.stats().compression_ratio;
    v.compact(|_, _| {}).unwrap();
    let st = v.stats();
    assert!(st.bytes_per_algorithm["lz4"] > 0);
    let rep_recompressed = st.recompressed_blobs;
    assert!(rep_recompressed > 0, "{st:?}");
    assert!(
        st.compression_ratio > lz4_ratio,
        "{} vs {lz4_ratio}",
        st.compression_ratio
    );
    let mut back = vec![0u8; d.len() - 4096];
    v.read(4096, &mut back).unwrap();
    assert!(back[..] == d[4096..]);
}

/// Segments full of raw 128 KiB blobs are only 75% live in 512 KiB segments
/// (a fourth blob does not fit), with nothing dead in them: background
/// passes must leave them alone. Before the fix each pass rewrote one into
/// a new segment just as full, for ever (issue 16).
#[test]
fn segments_full_of_raw_blobs_are_not_cleaned_for_their_tail() {
    let (_s, v) = sim_volume(32 * MIB, None); // 512 KiB segments
    let d = data(&mut rng(11), 1, 8 * MIB as usize);
    for (k, c) in d.chunks(128 << 10).enumerate() {
        v.write(k as u64 * (128 << 10), c, false).unwrap();
    }
    v.flush().unwrap();
    let before = v.stats();
    assert!(
        before.stored_bytes as f64 / before.allocated_bytes as f64 <= 0.8,
        "not the layout this test is about: {before:?}"
    );
    for pass in 0..20 {
        if let Some(r) = v.clean_pass().unwrap() {
            panic!("pass {pass} cleaned a segment with nothing dead in it: {r:?}");
        }
    }
    assert_eq!(v.stats().cleaner_bytes_moved, 0);
    // Real garbage is still cleaned: overwrite two blobs of every three,
    // which leaves the old segments about a third live (a segment left
    // with nothing live needs no cleaning, only a checkpoint).
    for (k, c) in d.chunks(128 << 10).enumerate() {
        if k % 3 != 0 {
            v.write(k as u64 * (128 << 10), c, false).unwrap();
        }
    }
    v.flush().unwrap();
    assert!(
        v.clean_pass().unwrap().is_some(),
        "dead segments left alone"
    );
    let mut got = vec![0u8; d.len()];
    v.read(0, &mut got).unwrap();
    assert!(got == d);
}

/// The garbage budget decides when the busy cleaner copies: a log a
/// quarter dead is left alone under a budget of 35% or 50%, cleaned under
/// 15%; and a budget is spent only from free room, so a cap that leaves
/// less room than the budget would hold brings cleaning back (issue 15).
#[test]
fn the_garbage_budget_decides_when_cleaning_starts() {
    use squeeze_engine::GcPolicy;
    let s = Arc::new(SimStorage::new());
    let open = |budget: f64| OpenOptions {
        gc: Some(GcPolicy::with_budget(budget).unwrap()),
        ..Default::default()
    };
    let v = Volume::create_with(s.clone(), &small_opts(128 * MIB), open(0.5)).unwrap();
    // 64 MiB of fio-like (60% compressible) blobs, then every third blob
    // again: every segment about a third dead, a quarter of the log.
    let d = data(&mut rng(12), 3, 64 * MIB as usize);
    for (k, c) in d.chunks(128 << 10).enumerate() {
        v.write(k as u64 * (128 << 10), c, false).unwrap();
    }
    for (k, c) in d.chunks(128 << 10).enumerate().step_by(3) {
        v.write(k as u64 * (128 << 10), c, false).unwrap();
    }
    v.flush().unwrap();
    let st = v.stats();
    let sealed = st.allocated_bytes as f64;
    let dead = st.garbage_bytes as f64 / sealed;
    assert!((0.2..0.33).contains(&dead), "{dead}: {st:?}");
    assert_eq!(st.garbage_budget, 0.5);
    assert!(
        v.clean_pass().unwrap().is_none(),
        "cleaned under its budget"
    );
    drop(v);

    let v = Volume::open(s.clone(), open(0.35)).unwrap();
    assert!(
        v.clean_pass().unwrap().is_none(),
        "cleaned under its budget"
    );
    drop(v);

    let v = Volume::open(s.clone(), open(0.15)).unwrap();
    let r = v.clean_pass().unwrap().expect("over a 15% budget: cleans");
    assert!(r.bytes_written > 0, "{r:?}");
    assert_eq!(v.stats().cleaner_over_budget_bytes, r.bytes_written);
    drop(v);

    // Budget 50% again, but a cap leaves 9 free segments (one more than
    // the cleaner's tight mode): less room than the budget would let
    // garbage take, so the budget shrinks.
    let v = Volume::open(s.clone(), open(0.5)).unwrap();
    let st = v.stats();
    v.set_max_physical(st.allocated_bytes + 9 * st.segment_size)
        .unwrap();
    let b = v.stats().garbage_budget;
    assert!(b < 0.25, "budget {b} with a cap that leaves little room");
    assert!(
        v.clean_pass().unwrap().is_some(),
        "the cap's room was spent"
    );
    let mut got = vec![0u8; d.len()];
    v.read(0, &mut got).unwrap();
    assert!(got == d);
    v.verify_accounting().unwrap();
    assert!(GcPolicy::with_budget(0.1).is_err() && GcPolicy::with_budget(0.9).is_err());
}

/// While clients write, the maintenance thread frees the segments the
/// cleaner empties in batches (a checkpoint for several), and once clients
/// are idle it frees every one that waits.
#[test]
fn busy_cleaning_frees_segments_in_batches_and_all_when_idle() {
    let s = Arc::new(SimStorage::new());
    let v = Volume::create_with(
        s.clone(),
        &small_opts(32 * MIB),
        OpenOptions {
            background: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mut r = rng(15);
    let region = 8 * MIB as usize;
    let first = data(&mut r, 3, region);
    v.write(0, &first, false).unwrap();
    v.flush().unwrap();
    let before = v.stats();
    // Busy: overwrites back to back, until the cleaner has emptied and
    // the maintenance thread freed a good number of segments.
    let t = std::time::Instant::now();
    let mut most_waiting = 0;
    loop {
        let len = 4096 * r.gen_range(1..=16usize);
        let off = 4096 * r.gen_range(0..(region - len) / 4096) as u64;
        v.write(off, &data(&mut r, 3, len), false).unwrap();
        let st = v.stats();
        most_waiting = most_waiting.max(st.segments_waiting);
        if st.segments_reclaimed - before.segments_reclaimed >= 24 {
            break;
        }
        assert!(
            t.elapsed().as_secs() < 120,
            "no segments freed while busy: {st:?}"
        );
    }
    let busy = v.stats();
    let reclaimed = busy.segments_reclaimed - before.segments_reclaimed;
    let checkpoints = busy.checkpoints - before.checkpoints;
    assert!(
        reclaimed >= 2 * checkpoints,
        "{reclaimed} segments freed by {checkpoints} checkpoints while busy: not batched"
    );
    assert!(most_waiting >= 1, "stats never showed a segment waiting");
    // Idle: the thread settles (nothing written or freed for 1.5 s), and
    // then no dead segment is left for a checkpoint to free.
    let mut last = (busy.segments_reclaimed, busy.log_bytes_written);
    let mut still = std::time::Instant::now();
    while still.elapsed().as_millis() < 1500 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let st = v.stats();
        let now = (st.segments_reclaimed, st.log_bytes_written);
        if now != last {
            last = now;
            still = std::time::Instant::now();
        }
        assert!(t.elapsed().as_secs() < 180, "never settled: {st:?}");
    }
    let settled = v.stats().segments_reclaimed;
    assert_eq!(v.stats().segments_waiting, 0);
    v.checkpoint().unwrap();
    v.checkpoint().unwrap();
    assert_eq!(
        v.stats().segments_reclaimed,
        settled,
        "dead segments were left waiting once clients were idle"
    );
    v.verify_accounting().unwrap();
}
