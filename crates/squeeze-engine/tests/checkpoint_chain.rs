//! The checkpoint chain: a checkpoint writes what changed since the last
//! one (a delta), not the whole map; a base restarts the chain once the
//! deltas outgrow it, and the old chain's segments come back; every reopen
//! rebuilds the same map from base + deltas.

mod common;

use common::*;
use rand::Rng;
use squeeze_engine::{SimStorage, Volume};
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
