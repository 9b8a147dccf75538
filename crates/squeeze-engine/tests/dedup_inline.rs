//! Dedup mode inline (docs/DEDUP.md, `dedup/inline.rs`): a write of
//! content written before is linked instead of stored (its first copy
//! promoted to hidden addresses, later copies linked to them); clients read
//! back exactly what they wrote through overwrites, trims, the idle pass
//! and reopens; a fingerprint found again whose bytes differ is never
//! linked; a write of at most one blob is shared whole or not at all; and
//! modes off and idle share nothing as they write.

mod common;
use common::*;
use squeeze_engine::{DedupMode, DedupSettings, SettingsChange, SimStorage, Volume, SECTOR_SIZE};
use std::sync::Arc;

const S: u64 = SECTOR_SIZE as u64;

fn mode(m: DedupMode) -> SettingsChange {
    SettingsChange {
        dedup: Some(DedupSettings {
            mode: m,
            index_mib: 16,
        }),
        ..Default::default()
    }
}

/// A 32 MiB volume in dedup mode inline, and its model.
fn inline_volume() -> (Arc<SimStorage>, Volume, Vec<u8>) {
    let (s, v) = sim_volume(32 << 20, None);
    v.set_settings(mode(DedupMode::Inline)).unwrap();
    let model = vec![0u8; v.size() as usize];
    (s, v, model)
}

#[test]
fn copies_share_and_read_back_through_overwrites_trims_and_reopens() {
    let (s, v, mut model) = inline_volume();
    assert_eq!(v.stats().dedup_mode, "inline");
    let mut r = rng(38);
    let a = data(&mut r, 1, 1 << 20);
    let sectors = a.len() as u64 / S;
    // The first copy is stored; the second promotes it (both linked to
    // one copy at hidden addresses); the third links to that copy.
    write_model(&v, &mut model, 0, &a);
    assert_eq!(v.stats().dedup_linked_sectors, 0);
    write_model(&v, &mut model, 8 << 20, &a);
    let st = v.stats();
    assert_eq!(st.dedup_inline_linked_sectors, sectors);
    assert_eq!(st.dedup_linked_sectors, 2 * sectors);
    assert_eq!(st.dedup_shared_writes, sectors);
    write_model(&v, &mut model, 16 << 20, &a);
    let st = v.stats();
    assert_eq!(st.dedup_inline_linked_sectors, 2 * sectors);
    assert_eq!(st.dedup_shared_writes, sectors, "the third copy is linked");
    assert_eq!(st.dedup_saved_bytes, 2 * sectors * S);
    assert!(st.dedup_inline_index_bytes > 0);
    check_model(&v, &model);
    // Overwrite part of one copy, trim part of another: the rest still
    // reads the shared content.
    let b = data(&mut r, 2, 256 << 10);
    write_model(&v, &mut model, (8 << 20) + (64 << 10), &b);
    v.trim(16 << 20, 128 << 10, false).unwrap();
    model[16 << 20..(16 << 20) + (128 << 10)].fill(0);
    check_model(&v, &model);
    // A copy of part of the content, at an offset that is not a multiple
    // of the run: linked to the hidden addresses in the middle.
    let part = &a[(100 << 12)..(100 << 12) + (512 << 10)];
    write_model(&v, &mut model, 24 << 20, part);
    assert_eq!(
        v.stats().dedup_inline_linked_sectors,
        2 * sectors + part.len() as u64 / S
    );
    check_model(&v, &model);
    v.flush().unwrap();
    v.close().unwrap();
    let v = reopen(&s);
    assert_eq!(v.dedup_settings().mode, DedupMode::Inline);
    check_model(&v, &model);
    // After the reopen the index starts empty: a copy of a copy is found
    // again once written twice.
    write_model(&v, &mut model, 28 << 20, &b);
    write_model(&v, &mut model, 30 << 20, &b);
    assert!(v.stats().dedup_inline_linked_sectors >= b.len() as u64 / S);
    // Every sharer of a content overwritten: its hidden copy is an orphan
    // (zeroed by a pass or the maintenance thread).
    for at in [0u64, 8 << 20, 16 << 20, 24 << 20] {
        let z = data(&mut r, 1, 1 << 20);
        write_model(&v, &mut model, at, &z);
    }
    v.compact(|_, _| {}).unwrap();
    check_model(&v, &model);
    v.close().unwrap();
    let v = reopen(&s);
    check_model(&v, &model);
    assert!(squeeze_engine::check::check(&v, |_, _| {}).is_clean());
}

#[test]
fn a_fingerprint_found_again_with_other_bytes_is_not_linked() {
    let (_s, v, mut model) = inline_volume();
    // Fingerprints of 2 bits: nearly every sector "matches" another.
    v.debug_weak_inline_fingerprints(true);
    let mut r = rng(5);
    for i in 0..16u64 {
        let d = data(&mut r, 1, 1 << 20);
        write_model(&v, &mut model, i << 20, &d);
    }
    let st = v.stats();
    assert!(
        st.dedup_inline_mismatched_sectors > 0,
        "no candidate was refused: the hook did not collide"
    );
    assert_eq!(st.dedup_linked_sectors, 0, "different content was linked");
    check_model(&v, &model);
    // With real fingerprints again, copies share.
    v.debug_weak_inline_fingerprints(false);
    let a = data(&mut r, 1, 1 << 20);
    write_model(&v, &mut model, 20 << 20, &a);
    write_model(&v, &mut model, 24 << 20, &a);
    assert_eq!(v.stats().dedup_inline_linked_sectors, (1 << 20) / S);
    check_model(&v, &model);
}

#[test]
fn a_write_of_one_blob_is_shared_whole_or_not_at_all() {
    let (_s, v, mut model) = inline_volume();
    let blob = v.superblock().policy.max_blob as usize;
    let mut r = rng(9);
    let a = data(&mut r, 1, 4 * blob);
    write_model(&v, &mut model, 0, &a);
    // One blob whose first half is a copy and second half new: stored
    // whole (one record, atomic across a crash).
    let mut mixed = a[..blob / 2].to_vec();
    mixed.extend(data(&mut r, 1, blob / 2));
    write_model(&v, &mut model, 8 << 20, &mixed);
    assert_eq!(v.stats().dedup_linked_sectors, 0);
    // One blob that is all a copy: shared.
    write_model(&v, &mut model, 9 << 20, &a[blob..2 * blob]);
    assert_eq!(v.stats().dedup_inline_linked_sectors, blob as u64 / S);
    check_model(&v, &model);
}

#[test]
fn modes_off_and_idle_share_nothing_as_they_write_and_inline_runs_the_idle_pass() {
    for m in [DedupMode::Off, DedupMode::Idle] {
        let (_s, v) = sim_volume(32 << 20, None);
        v.set_settings(mode(m)).unwrap();
        let mut r = rng(3);
        let a = data(&mut r, 3, 1 << 20);
        v.write(0, &a, false).unwrap();
        v.write(8 << 20, &a, false).unwrap();
        let st = v.stats();
        assert_eq!(st.dedup_linked_sectors, 0, "{m:?}");
        assert_eq!(st.dedup_inline_index_bytes, 0, "{m:?}");
    }
    // Inline, then the idle pass finds what inline left: copies within
    // one write (the index learns a write's sectors after it).
    let (_s, v, mut model) = inline_volume();
    let mut r = rng(4);
    let a = data(&mut r, 3, 512 << 10);
    let mut twice = a.clone();
    twice.extend_from_slice(&a);
    write_model(&v, &mut model, 0, &twice);
    assert_eq!(v.stats().dedup_linked_sectors, 0);
    v.flush().unwrap();
    let rep = loop {
        match v.dedup_idle_step(u64::MAX).unwrap() {
            squeeze_engine::dedup::IdleStep::Finished(rep) => break rep,
            squeeze_engine::dedup::IdleStep::Stopped { .. } => {}
            squeeze_engine::dedup::IdleStep::Nothing => panic!("mode inline runs the idle pass"),
        }
    };
    assert!(rep.sectors_linked > 0);
    check_model(&v, &model);
    // Turned off: writes store copies again, and the index is given back.
    v.set_settings(mode(DedupMode::Off)).unwrap();
    assert_eq!(v.stats().dedup_inline_index_bytes, 0);
    let linked = v.stats().dedup_linked_sectors;
    write_model(&v, &mut model, 4 << 20, &a);
    assert_eq!(v.stats().dedup_linked_sectors, linked);
    check_model(&v, &model);
}
