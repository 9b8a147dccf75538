//! The checkpoint chain: a checkpoint writes what changed since the last
//! one (a delta), not the whole map; a base restarts the chain once the
//! deltas outgrow it, and the old chain's segments come back; every reopen
//! rebuilds the same map from base + deltas.

mod common;

use common::*;
use rand::Rng;
use squeeze_engine::{SimFaults, SimStorage, Volume};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn read_all(v: &Volume, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    v.read(0, &mut b).unwrap();
    b
}

/// Fills `len` bytes with 4 KiB writes of scattered data (a map of many
/// small records: a large base).
fn fill(v: &Volume, model: &mut [u8], len: u64, seed: u64) {
    let mut r = rng(seed);
    for off in (0..len).step_by(4096) {
        let d = data(&mut r, 3, 4096);
        v.write(off, &d, false).unwrap();
        model[off as usize..off as usize + 4096].copy_from_slice(&d);
    }
    v.flush().unwrap();
}

#[test]
fn a_checkpoint_writes_what_changed_not_the_map() {
    let (s, v) = sim_volume(64 * MIB, None);
    let mut model = vec![0u8; 64 * MIB as usize];
    fill(&v, &mut model, 32 * MIB, 1);
    v.checkpoint().unwrap();
    let st = v.stats();
    // 8192 sectors in 4 KiB records: 8192 runs of 20 bytes in the chain.
    assert!(
        st.checkpoint_base_bytes + st.checkpoint_delta_bytes > 8192 * 20,
        "{st:?}"
    );
    let before = v.stats();
    for k in 0..5u64 {
        let d = vec![k as u8 + 1; 8192];
        v.write(k * MIB, &d, false).unwrap();
        model[(k * MIB) as usize..(k * MIB) as usize + 8192].copy_from_slice(&d);
        v.checkpoint().unwrap();
    }
    let after = v.stats();
    // Five deltas of one 4 KiB block each, plus a superblock each.
    assert_eq!(after.checkpoints - before.checkpoints, 5);
    assert_eq!(
        after.checkpoint_bytes_written - before.checkpoint_bytes_written,
        5 * 8192,
        "{after:?}"
    );
    assert_eq!(after.checkpoint_deltas, before.checkpoint_deltas + 5);
    assert_eq!(after.checkpoint_base_bytes, before.checkpoint_base_bytes);
    assert_eq!(after.map_dirty_sectors, 0);
    v.close().unwrap();
    // The chain reads back as it was written.
    let v = reopen(&s);
    let st = v.stats();
    assert_eq!(st.checkpoint_base_bytes, after.checkpoint_base_bytes);
    // (the close added one more delta)
    assert_eq!(st.checkpoint_deltas, after.checkpoint_deltas + 1);
    // Loading the chain is not a change: the next delta starts empty.
    assert_eq!(st.map_dirty_sectors, 0);
    assert!(read_all(&v, 64 * MIB) == model);
}

#[test]
fn a_base_restarts_the_chain_and_the_old_chain_is_freed() {
    let (s, v) = sim_volume(64 * MIB, None);
    let mut model = vec![0u8; 64 * MIB as usize];
    fill(&v, &mut model, 16 * MIB, 2);
    // Bases as soon as the deltas reach the base's size.
    v.set_rebase_threshold(1, 0);
    v.checkpoint().unwrap();
    let mut r = rng(3);
    let mut free_at = Vec::new();
    let mut bases = 0;
    let mut last_base = v.stats().checkpoint_base_bytes;
    let mut saw_deltas = false;
    for k in 0..60u64 {
        // Changes big enough that a few deltas outgrow the base.
        for _ in 0..256 {
            let off = 4096 * r.gen_range(0..4096u64);
            let d = data(&mut r, 3, 4096);
            v.write(off, &d, false).unwrap();
            model[off as usize..off as usize + 4096].copy_from_slice(&d);
        }
        v.checkpoint().unwrap();
        let st = v.stats();
        if st.checkpoint_deltas == 0 {
            bases += 1;
            last_base = st.checkpoint_base_bytes;
        } else {
            saw_deltas = true;
            assert_eq!(st.checkpoint_base_bytes, last_base);
        }
        free_at.push(st.segments_free);
        if k % 20 == 19 {
            // Reopen in the middle of a chain or just after a base.
            v.flush().unwrap();
            let img = Arc::new(s.kill());
            let v2 = Volume::open(img.clone() as Arc<_>, Default::default()).unwrap();
            assert!(
                read_all(&v2, 64 * MIB) == model,
                "crash after checkpoint {k}"
            );
            v2.close().unwrap();
        }
    }
    assert!(bases >= 4 && saw_deltas, "{bases} bases");
    // The old chains' segments came back: no checkpoint segment leaks.
    let settled = &free_at[20..];
    let (lo, hi) = (settled.iter().min().unwrap(), settled.iter().max().unwrap());
    assert!(hi - lo <= 3, "free segments drift: {free_at:?}");
    v.close().unwrap();
    let v = reopen(&s);
    assert!(read_all(&v, 64 * MIB) == model);
    v.verify_accounting().unwrap();
}

#[test]
fn create_writes_a_base_and_the_next_checkpoint_a_delta() {
    // (The upgrade of a format 1 volume by a base: tests/format_fixtures.rs.)
    let s = Arc::new(SimStorage::new());
    let v = Volume::create(s.clone(), &small_opts(16 * MIB)).unwrap();
    let st = v.stats();
    assert_eq!(st.checkpoint_deltas, 0, "create writes a base");
    assert!(st.checkpoint_base_bytes >= 4096);
    v.write(0, &[7u8; 4096], false).unwrap();
    v.checkpoint().unwrap();
    assert_eq!(v.stats().checkpoint_deltas, 1);
}

/// Power cuts at each write of one checkpoint of a volume made by `made`
/// (closed), after `before` (the same every time, flushed): the volume
/// opens with everything flushed before, and an acknowledged checkpoint
/// survives. Returns the stats after the checkpoint that completed.
fn cut_at_each_write_of_a_checkpoint(
    s: &Arc<SimStorage>,
    model: &[u8],
    before: impl Fn(&Volume, &mut Vec<u8>),
) -> squeeze_engine::VolumeStats {
    let size = model.len() as u64;
    let mut cut = 1;
    loop {
        let img = Arc::new(s.kill());
        let v = Volume::open(img.clone() as Arc<_>, Default::default()).unwrap();
        let mut model = model.to_vec();
        before(&v, &mut model);
        v.flush().unwrap();
        img.set_faults(SimFaults {
            crash_at_write: Some(cut),
            ..Default::default()
        });
        let r = v.checkpoint();
        let completed = r.is_ok() && !img.is_dead();
        let st = v.stats();
        if completed {
            // Counted from set_faults: two stream chunks, the CRC, the superblock.
            assert!(
                img.writes() >= 4,
                "one write per stream chunk: {}",
                img.writes()
            );
        }
        drop(v);
        let after = Arc::new(img.crash(&mut rng(cut)));
        let v = Volume::open(after as Arc<_>, Default::default())
            .unwrap_or_else(|e| panic!("cut at write {cut}: {e}"));
        if completed {
            // Acknowledged: the volume opens from it, nothing to replay.
            assert_eq!(v.stats().open_replayed_records, 0, "cut at write {cut}");
        }
        assert!(read_all(&v, size) == model, "cut at write {cut}");
        v.verify_accounting().unwrap();
        if completed {
            return st;
        }
        cut += 1;
        assert!(cut < 64, "the checkpoint never completed");
    }
}

/// A volume of 65,536 records of 4 KiB (65,536 runs: pieces of 1.3 MB,
/// more than a stream chunk of 1 MiB and than a segment of 512 KiB).
fn many_runs() -> (Arc<SimStorage>, Vec<u8>) {
    let (s, v) = sim_volume(320 * MIB, None);
    let mut model = vec![0u8; 320 * MIB as usize];
    fill(&v, &mut model, 256 * MIB, 5);
    v.close().unwrap();
    (s, model)
}

/// A base bigger than a stream chunk and than a segment is written as it is
/// encoded, across segments, and survives a power cut at each write.
#[test]
fn a_base_bigger_than_its_segments_is_streamed_and_survives_power_cuts() {
    let (s, model) = many_runs();
    let st = cut_at_each_write_of_a_checkpoint(&s, &model, |v, _| v.set_rebase_threshold(0, 0));
    assert_eq!(st.checkpoint_deltas, 0, "{st:?}");
    assert!(
        st.checkpoint_base_bytes > 65_536 * 20 && st.checkpoint_base_bytes > 2 * st.segment_size,
        "{st:?}"
    );
}

/// A delta as big (every sector rewritten) goes after the chain's end, in
/// the rest of its last segment and in new ones, and survives the same.
#[test]
fn a_delta_bigger_than_its_segments_is_streamed_and_survives_power_cuts() {
    let (s, model) = many_runs();
    let st = cut_at_each_write_of_a_checkpoint(&s, &model, |v, model| {
        v.set_rebase_threshold(1000, u64::MAX);
        let mut r = rng(77);
        for off in (0..256 * MIB).step_by(4096) {
            let d = data(&mut r, 3, 4096);
            v.write(off, &d, false).unwrap();
            model[off as usize..off as usize + 4096].copy_from_slice(&d);
        }
    });
    assert!(st.checkpoint_deltas >= 1, "{st:?}");
    assert!(st.checkpoint_delta_bytes > 65_536 * 20, "{st:?}");
}

#[test]
fn compact_leaves_one_base_and_frees_the_chain_before_it() {
    let (s, v) = sim_volume(64 * MIB, None);
    let mut model = vec![0u8; 64 * MIB as usize];
    fill(&v, &mut model, 32 * MIB, 5);
    v.checkpoint().unwrap();
    // Rounds of scattered overwrites, a checkpoint after each: deltas pile
    // up on the base (under the rebase threshold, as on a store whose
    // buckets change at random between two rebases).
    let mut r = rng(6);
    for _ in 0..20 {
        for _ in 0..1024 {
            let off = 4096 * r.gen_range(0..8192u64);
            let d = data(&mut r, 3, 4096);
            v.write(off, &d, false).unwrap();
            model[off as usize..off as usize + 4096].copy_from_slice(&d);
        }
        v.checkpoint().unwrap();
    }
    let before = v.stats();
    assert!(before.checkpoint_deltas >= 20, "{before:?}");
    assert!(
        before.checkpoint_delta_bytes > before.checkpoint_base_bytes,
        "{before:?}"
    );
    v.compact(|_, _| {}).unwrap();
    let after = v.stats();
    // A base of the map as it now is (8192 sectors in 4 KiB records: 8192
    // runs of 20 bytes, in 4 KiB pages), then the empty delta of the
    // checkpoint that freed the chain before it.
    assert_eq!(after.checkpoint_deltas, 1, "{after:?}");
    assert!(after.checkpoint_delta_bytes <= 8192, "{after:?}");
    assert!(
        after.checkpoint_base_bytes <= 8192 * 20 + 2 * 4096,
        "{after:?}"
    );
    // Nothing but the live records, one chain and the head's segment.
    let in_use = (after.segments_total - after.segments_free) * after.segment_size;
    let chain = after.checkpoint_base_bytes + after.checkpoint_delta_bytes;
    assert!(
        in_use <= after.stored_bytes + chain + 3 * after.segment_size,
        "{in_use} in use for {} stored and a chain of {chain}: {after:?}",
        after.stored_bytes
    );
    assert!(read_all(&v, 64 * MIB) == model);
    v.verify_accounting().unwrap();
    drop(v);
    let v = reopen(&s);
    assert!(read_all(&v, 64 * MIB) == model);
    v.verify_accounting().unwrap();
}

#[test]
fn compact_on_a_nearly_full_volume_writes_deltas_not_a_base() {
    let s = Arc::new(SimStorage::new());
    let mut o = small_opts(64 * MIB);
    o.max_physical = 8 * MIB;
    let v = Volume::create(s.clone(), &o).unwrap();
    let mut r = rng(7);
    let (written, err) = write_until_error(&v, &mut r, 0, 64 * MIB);
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    // Something for the compaction to clean: before, with no checkpoint
    // between victims, it ran out of room on such a volume ("backing store
    // full") and gave nothing back.
    v.trim(0, MIB, false).unwrap();
    v.flush().unwrap();
    let mut model = vec![0u8; written as usize];
    v.read(0, &mut model).unwrap();
    let before = v.stats();
    // The free segments cannot hold a base beside the cleaner's reserve:
    // the compaction ends with its two checkpoints as deltas.
    v.compact(|_, _| {}).unwrap();
    let after = v.stats();
    assert!(
        after.segments_free < 10,
        "room for a base after all: {after:?}"
    );
    assert_eq!(after.checkpoint_base_bytes, before.checkpoint_base_bytes);
    assert!(
        after.checkpoint_deltas >= before.checkpoint_deltas + 2,
        "{after:?}"
    );
    let mut back = vec![0u8; written as usize];
    v.read(0, &mut back).unwrap();
    assert!(back == model);
    v.verify_accounting().unwrap();
    drop(v);
    let v = reopen(&s);
    v.read(0, &mut back).unwrap();
    assert!(back == model);
}
