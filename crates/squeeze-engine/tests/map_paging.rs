//! The sector map pages out to the checkpoint chain when it uses more RAM
//! than its cache, and reads chunks back when they are needed: reads,
//! overwrites, trims, checkpoints (bases and deltas), reopen and crashes
//! all see the data written; a chain damaged under a paged-out chunk is
//! reported, never served.

mod common;

use common::*;
use squeeze_engine::{EngineError, OpenOptions, SimStorage, Volume};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 256 * MIB; // 128 chunks of 2 MiB

fn read_all(v: &Volume) -> Vec<u8> {
    let mut b = vec![0u8; SIZE as usize];
    for off in (0..SIZE).step_by(MIB as usize) {
        v.read(off, &mut b[off as usize..(off + MIB) as usize])
            .unwrap();
    }
    b
}

/// Scattered 4 KiB writes: every chunk gets some, each a record of its own
/// (chunks of many runs: what pages out for real).
fn scatter(v: &Volume, model: &mut [u8], seed: u64, writes: usize) {
    let mut r = rng(seed);
    for _ in 0..writes {
        let off = rand::Rng::gen_range(&mut r, 0..SIZE / 4096) * 4096;
        let d = data(&mut r, 3, 4096);
        v.write(off, &d, false).unwrap();
        model[off as usize..off as usize + 4096].copy_from_slice(&d);
    }
    v.flush().unwrap();
}

fn paged_options() -> OpenOptions {
    OpenOptions {
        map_cache: Some(64 << 10),
        ..Default::default()
    }
}

/// A volume with a 64 KiB map cache, 8000 scattered writes and a
/// checkpoint: most of its map pages out.
fn paged_volume(seed: u64) -> (Arc<SimStorage>, Volume, Vec<u8>) {
    let s = Arc::new(SimStorage::new());
    let v = Volume::create_with(s.clone(), &small_opts(SIZE), paged_options()).unwrap();
    let mut model = vec![0u8; SIZE as usize];
    scatter(&v, &mut model, seed, 8000);
    v.checkpoint().unwrap();
    (s, v, model)
}

#[test]
fn a_paged_map_serves_what_was_written() {
    let (s, v, mut model) = paged_volume(1);
    let st = v.stats();
    assert_eq!(st.map_chunks, 128, "{st:?}");
    assert!(st.map_paged_chunks > 64, "{st:?}");
    assert!(st.map_memory_bytes < 256 << 10, "{st:?}");
    assert_eq!(read_all(&v), model);
    assert!(v.stats().map_faults >= st.map_paged_chunks);
    // Overwrites and trims over paged-out chunks, deltas and bases.
    v.set_rebase_threshold(1, 0);
    for round in 0..6u64 {
        scatter(&v, &mut model, 10 + round, 1500);
        let off = round * 37 * MIB / 2;
        v.trim(off, 3 * MIB, false).unwrap();
        model[off as usize..(off + 3 * MIB) as usize].fill(0);
        v.checkpoint().unwrap();
        assert!(v.stats().map_paged_chunks > 0);
        assert_eq!(read_all(&v), model, "round {round}");
    }
    v.verify_accounting().unwrap();
    let st = v.stats();
    assert!(st.map_evictions > 100 && st.map_faults > 100, "{st:?}");
    // Reopen: recovery reads the whole map, then trims it to the cache.
    v.close().unwrap();
    let v = Volume::open(s.clone(), paged_options()).unwrap();
    let st = v.stats();
    assert!(st.map_paged_chunks > 64, "{st:?}");
    assert_eq!(read_all(&v), model);
    // Writes not checkpointed, then a power cut: replay over a chain the
    // map had paged out to.
    scatter(&v, &mut model, 99, 2000);
    let img = s.crash(&mut rng(5));
    drop(v);
    let v = Volume::open(Arc::new(img), paged_options()).unwrap();
    assert_eq!(read_all(&v), model);
    v.verify_accounting().unwrap();
    assert!(squeeze_engine::check::check(&v, |_, _| {}).is_clean());
}

/// The map's RAM stays near its cache while a volume many times the cache
/// is written over and over (chunks changed since the last checkpoint stay
/// in memory: checkpoints come often enough here).
#[test]
fn map_memory_follows_the_cache() {
    let s = Arc::new(SimStorage::new());
    let cache = 128 << 10;
    let v = Volume::create_with(
        s.clone(),
        &small_opts(SIZE),
        OpenOptions {
            map_cache: Some(cache),
            ..Default::default()
        },
    )
    .unwrap();
    let mut model = vec![0u8; SIZE as usize];
    let mut peak = 0;
    for round in 0..10u64 {
        scatter(&v, &mut model, 100 + round, 1200);
        v.checkpoint().unwrap();
        peak = peak.max(v.stats().map_memory_bytes);
    }
    let st = v.stats();
    // Without paging: 128 dense chunks of 4 KiB and more.
    assert!(st.map_chunks == 128 && st.map_paged_chunks > 32, "{st:?}");
    assert!(
        peak <= cache + (64 << 10),
        "peak {peak} over a cache of {cache}"
    );
    assert_eq!(read_all(&v), model);
}

/// Threads that write and read blocks interleaved over every chunk while
/// checkpoints are named: their reads fault chunks in (read back under the
/// read lock, installed only while still current) as the others write into
/// the same chunks and page them out, and every read sees what its thread
/// wrote last, the whole volume what all wrote.
#[test]
fn faults_race_writes_and_checkpoints() {
    let (_s, v, model) = paged_volume(11);
    let v = &v;
    let threads = 3u64;
    let blocks = SIZE / 4096;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let models: Vec<Vec<u8>> = std::thread::scope(|sc| {
        let ckpt = sc.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                v.checkpoint().unwrap();
                n += 1;
            }
            n
        });
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let mut mine = model.clone();
                sc.spawn(move || {
                    let mut r = rng(200 + t);
                    let mut buf = vec![0u8; 4096];
                    for _ in 0..1500 {
                        // Block b is thread (b % threads)'s to write.
                        let b = rand::Rng::gen_range(&mut r, 0..blocks / threads) * threads + t;
                        let off = (b * 4096) as usize;
                        let d = data(&mut r, 3, 4096);
                        v.write(off as u64, &d, false).unwrap();
                        mine[off..off + 4096].copy_from_slice(&d);
                        let b = rand::Rng::gen_range(&mut r, 0..blocks / threads) * threads + t;
                        let off = (b * 4096) as usize;
                        v.read(off as u64, &mut buf).unwrap();
                        assert_eq!(buf, mine[off..off + 4096], "thread {t}, block {b}");
                        // Someone else's block: read, whatever it holds.
                        let b = rand::Rng::gen_range(&mut r, 0..blocks);
                        v.read(b * 4096, &mut buf).unwrap();
                    }
                    mine
                })
            })
            .collect();
        let models = workers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(ckpt.join().unwrap() > 2, "checkpoints ran alongside");
        models
    });
    let mut all = model;
    for b in 0..blocks {
        let off = (b * 4096) as usize;
        let t = (b % threads) as usize;
        if b < blocks / threads * threads {
            all[off..off + 4096].copy_from_slice(&models[t][off..off + 4096]);
        }
    }
    assert_eq!(read_all(v), all);
    v.verify_accounting().unwrap();
    let st = v.stats();
    assert!(st.map_faults > 1000, "{st:?}");
}

/// A group of runs damaged in the chain under a paged-out chunk: the read
/// that needs it fails with a metadata error (never other bytes), and the
/// volume turns read-only.
#[test]
fn a_damaged_chain_is_reported_not_served() {
    let (s, v, model) = paged_volume(7);
    v.set_map_cache(0);
    assert_eq!(v.stats().map_paged_chunks, 128);
    // Flip a bit in the middle of the runs of the delta after the (empty)
    // base: header, counters, then 20 bytes per run.
    let st = v.stats();
    assert_eq!((st.checkpoint_base_bytes, st.checkpoint_deltas), (4096, 1));
    let sb = v.superblock();
    let seg = sb.checkpoint.segments[0];
    let run = 4096 + 128 + 8 * squeeze_engine::counters::COUNTERS as u64 + 20 * 4000;
    s.flip_bit(sb.segment_offset(seg) + run + 3, 2);
    let mut failed = 0;
    let mut b = vec![0u8; MIB as usize];
    for off in (0..SIZE).step_by(MIB as usize) {
        match v.read(off, &mut b) {
            Ok(()) => assert_eq!(b[..], model[off as usize..(off + MIB) as usize]),
            Err(e) => {
                assert!(matches!(e, EngineError::Metadata(_)), "{e}");
                failed += 1;
            }
        }
    }
    assert!(failed > 0);
    let e = v.write(0, &[1u8; 4096], false).unwrap_err();
    assert!(matches!(e, EngineError::ReadOnly(_)), "{e}");
}

/// A map many times its cache opens within the cache: the chain is read
/// piece by piece and the map pages out as it loads (a base, deltas with
/// trims across chunk edges, then the log replayed after a power cut), and
/// the volume it opens serves what was written with usage that adds up.
#[test]
fn a_map_bigger_than_its_cache_opens_within_it() {
    let s = Arc::new(SimStorage::new());
    let v = Volume::create_with(s.clone(), &small_opts(SIZE), OpenOptions::default()).unwrap();
    let mut model = vec![0u8; SIZE as usize];
    scatter(&v, &mut model, 21, 20_000);
    // One two-sector record in each chunk keeps its dense entries at 8
    // bytes (one-sector records alone take 5: `map/dense.rs`), so the map
    // is several times the bound below.
    let mut r = rng(22);
    for c in 0..SIZE / (2 * MIB) {
        let off = c * 2 * MIB + 8192;
        let d = data(&mut r, 3, 8192);
        v.write(off, &d, false).unwrap();
        model[off as usize..off as usize + 8192].copy_from_slice(&d);
    }
    v.flush().unwrap();
    v.checkpoint().unwrap();
    for round in 0..3u64 {
        scatter(&v, &mut model, 30 + round, 2000);
        let off = (round * 45 + 3) * MIB / 2;
        v.trim(off, 5 * MIB, false).unwrap();
        model[off as usize..(off + 5 * MIB) as usize].fill(0);
        v.checkpoint().unwrap();
    }
    let whole = v.stats();
    assert!(whole.checkpoint_deltas >= 3, "{whole:?}");
    assert_eq!(whole.map_paged_chunks, 0, "{whole:?}");
    // Not checkpointed: replayed at open, and in memory until the
    // checkpoint after it (as it was before the crash), so kept to the
    // first 4 chunks.
    let mut r = rng(40);
    for _ in 0..1000 {
        let off = rand::Rng::gen_range(&mut r, 0..8 * MIB / 4096) * 4096;
        let d = data(&mut r, 3, 4096);
        v.write(off, &d, false).unwrap();
        model[off as usize..off as usize + 4096].copy_from_slice(&d);
    }
    v.flush().unwrap();
    let img = Arc::new(s.crash(&mut rng(3)));
    drop(v);
    let cache = 16 << 10;
    let small = OpenOptions {
        map_cache: Some(cache),
        ..Default::default()
    };
    let v = Volume::open(img.clone(), small.clone()).unwrap();
    let st = v.stats();
    let bound = cache + (128 << 10);
    assert!(
        whole.map_memory_bytes > 3 * bound,
        "the map ({} bytes) is not much bigger than the bound",
        whole.map_memory_bytes
    );
    assert!(st.open_replayed_records > 0, "{st:?}");
    assert!(
        st.open_map_peak_bytes > 0 && st.open_map_peak_bytes <= bound,
        "open used {} bytes of map RAM, cache {cache}: {st:?}",
        st.open_map_peak_bytes
    );
    assert!(st.map_faults > 0 && st.map_paged_chunks > 64, "{st:?}");
    assert_eq!(read_all(&v), model);
    v.verify_accounting().unwrap();
    assert!(squeeze_engine::check::check(&v, |_, _| {}).is_clean());
    v.close().unwrap();
}

/// A chunk that eight deltas each rewrote whole is in the last of them
/// alone when the chain loads (as when those deltas were written), so it
/// pages out at open: it is not left spread over more pieces than a paged
/// chunk may be.
#[test]
fn a_chunk_rewritten_whole_by_many_deltas_pages_out_at_open() {
    let s = Arc::new(SimStorage::new());
    let v = Volume::create_with(s.clone(), &small_opts(SIZE), OpenOptions::default()).unwrap();
    v.set_rebase_threshold(1000, u64::MAX);
    let mut model = vec![0u8; SIZE as usize];
    let mut r = rng(60);
    for round in 0..8u64 {
        // All of chunk 3 (2 MiB), and a few sectors of chunk 9.
        let d = data(&mut r, 3, 2 * MIB as usize);
        v.write(6 * MIB, &d, false).unwrap();
        model[6 * MIB as usize..8 * MIB as usize].copy_from_slice(&d);
        let off = 18 * MIB + round * 8192;
        let d = data(&mut r, 3, 4096);
        v.write(off, &d, false).unwrap();
        model[off as usize..off as usize + 4096].copy_from_slice(&d);
        v.checkpoint().unwrap();
    }
    assert!(v.stats().checkpoint_deltas >= 8);
    v.close().unwrap();
    let v = Volume::open(
        s,
        OpenOptions {
            map_cache: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    let st = v.stats();
    // Chunk 9 is in the base and eight deltas: untracked, it stays in.
    assert_eq!((st.map_chunks, st.map_paged_chunks), (2, 1), "{st:?}");
    assert_eq!(read_all(&v), model);
    v.verify_accounting().unwrap();
}
