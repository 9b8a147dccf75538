//! Dedup mode inline's sampled index (docs/DEDUP.md, "Inline";
//! `dedup/inline.rs`, `dedup/extend.rs`): only hooks (1 fingerprint in 8
//! by default) are remembered, and a hook found again is extended to the
//! sectors around it in the write by comparing bytes. A duplicate run
//! whose only hook is in its middle is found whole, before and after the
//! hook; a sector that differs beside the hook ends the run there (the
//! equal sectors past it, with no hook of their own, are not found); a
//! run with no hook is not found (the documented miss: the idle pass
//! finds it later), while a dense index (`dedup_inline_sample` 1) finds
//! it as it is written; and a hook's run stops where its client source
//! is shared already (linked from that content's own hook, not promoted
//! twice).

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::dedup::{is_hook, IdleStep, INLINE_SAMPLE_DEFAULT};
use squeeze_engine::{DedupMode, OpenOptions, SimStorage, Volume, SECTOR_SIZE};
use std::sync::Arc;

const SAMPLE: u64 = INLINE_SAMPLE_DEFAULT;
/// Sectors of a run: more than a blob (32 sectors), so a part of it may
/// be shared.
const RUN: usize = 48;
/// The hook's place in the run.
const HOOK: usize = 20;

/// A 32 MiB volume in dedup mode inline whose index keeps 1 in `sample`.
fn volume(sample: u64) -> (Volume, Vec<u8>) {
    let mut o = small_opts(32 << 20);
    o.dedup.mode = DedupMode::Inline;
    o.dedup.index_mib = 16;
    let open = OpenOptions {
        dedup_inline_sample: Some(sample),
        ..Default::default()
    };
    let v = Volume::create_with(Arc::new(SimStorage::new()), &o, open).unwrap();
    let model = vec![0u8; v.size() as usize];
    (v, model)
}

/// A random sector that is (or is not) a hook at `SAMPLE`.
fn sector(r: &mut impl Rng, hook: bool) -> Vec<u8> {
    loop {
        let s: Vec<u8> = (0..SECTOR_SIZE).map(|_| r.gen()).collect();
        if is_hook(&s, SAMPLE) == hook {
            return s;
        }
    }
}

/// `RUN` random sectors, a hook at `hook` only (none if None).
fn run(r: &mut impl Rng, hook: Option<usize>) -> Vec<u8> {
    run_hooked(r, &hook.into_iter().collect::<Vec<_>>())
}

/// `RUN` random sectors, hooks at `hooks` only.
fn run_hooked(r: &mut impl Rng, hooks: &[usize]) -> Vec<u8> {
    (0..RUN)
        .flat_map(|i| sector(r, hooks.contains(&i)))
        .collect()
}

fn inline_linked(v: &Volume) -> u64 {
    v.stats().dedup_inline_linked_sectors
}

#[test]
fn a_run_whose_hook_is_in_its_middle_is_found_whole() {
    let (v, mut model) = volume(SAMPLE);
    let mut r = rng(81);
    let a = run(&mut r, Some(HOOK));
    write_model(&v, &mut model, 0, &a);
    let st = v.stats();
    assert_eq!(st.dedup_inline_index_sample, SAMPLE);
    assert_eq!(st.dedup_inline_index_entries, 1, "only the hook is kept");
    // The copy: every sector linked, the 20 before the hook and the 27
    // after it as well as the hook.
    write_model(&v, &mut model, 4 << 20, &a);
    assert_eq!(inline_linked(&v), RUN as u64);
    // Within a larger write, between new sectors: the run and no more.
    let mut w = run(&mut r, None)[..8 * SECTOR_SIZE].to_vec();
    w.extend_from_slice(&a);
    w.extend_from_slice(&run(&mut r, None)[..8 * SECTOR_SIZE]);
    write_model(&v, &mut model, 8 << 20, &w);
    assert_eq!(inline_linked(&v), 2 * RUN as u64);
    assert_eq!(v.stats().dedup_inline_mismatched_sectors, 0);
    check_model(&v, &model);
}

#[test]
fn a_sector_that_differs_beside_the_hook_ends_the_run_there() {
    let (v, mut model) = volume(SAMPLE);
    let mut r = rng(82);
    let a = run(&mut r, Some(HOOK));
    write_model(&v, &mut model, 0, &a);
    // The copy with sector HOOK + 6 changed: the run is 0..HOOK + 6; the
    // equal sectors after the change have no hook and are stored.
    let mut b = a.clone();
    let at = (HOOK + 6) * SECTOR_SIZE;
    b[at..at + SECTOR_SIZE].copy_from_slice(&sector(&mut r, false));
    write_model(&v, &mut model, 4 << 20, &b);
    assert_eq!(inline_linked(&v), (HOOK + 6) as u64);
    // Changed before the hook too: only the sectors between the changes.
    let mut c = b.clone();
    let at = (HOOK - 3) * SECTOR_SIZE;
    c[at..at + SECTOR_SIZE].copy_from_slice(&sector(&mut r, false));
    write_model(&v, &mut model, 8 << 20, &c);
    assert_eq!(inline_linked(&v), (HOOK + 6) as u64 + (3 - 1 + 6) as u64);
    check_model(&v, &model);
    v.flush().unwrap();
    assert!(squeeze_engine::check::check(&v, |_, _| {}).is_clean());
}

#[test]
fn a_run_with_no_hook_is_missed_inline_unless_the_index_is_dense() {
    let mut r = rng(83);
    let a = run(&mut r, None);
    // Sampled: the copy is stored (the documented miss), the index holds
    // nothing of it, and the idle pass shares it later.
    let (v, mut model) = volume(SAMPLE);
    write_model(&v, &mut model, 0, &a);
    assert_eq!(v.stats().dedup_inline_index_entries, 0);
    write_model(&v, &mut model, 4 << 20, &a);
    assert_eq!(inline_linked(&v), 0);
    v.flush().unwrap();
    let rep = loop {
        match v.dedup_idle_step(u64::MAX).unwrap() {
            IdleStep::Finished(rep) => break rep,
            IdleStep::Stopped { .. } => {}
            IdleStep::Nothing => panic!("mode inline runs the idle pass"),
        }
    };
    assert_eq!(rep.sectors_linked, 2 * RUN as u64);
    check_model(&v, &model);
    // Dense: every sector is a hook, and the copy is linked as written.
    let (v, mut model) = volume(1);
    write_model(&v, &mut model, 0, &a);
    let st = v.stats();
    assert_eq!(
        (st.dedup_inline_index_sample, st.dedup_inline_index_entries),
        (1, RUN as u64)
    );
    write_model(&v, &mut model, 4 << 20, &a);
    assert_eq!(inline_linked(&v), RUN as u64);
    check_model(&v, &model);
}

#[test]
fn a_one_blob_write_is_shared_whole_from_a_hook_in_its_middle() {
    let (v, mut model) = volume(SAMPLE);
    let blob = v.superblock().policy.max_blob as usize / SECTOR_SIZE;
    let mut r = rng(84);
    let a = run(&mut r, Some(HOOK));
    write_model(&v, &mut model, 0, &a);
    // One blob of the run around the hook: linked whole.
    let from = HOOK - blob / 2;
    let one = &a[from * SECTOR_SIZE..(from + blob) * SECTOR_SIZE];
    write_model(&v, &mut model, 4 << 20, one);
    assert_eq!(inline_linked(&v), blob as u64);
    // One blob whose last sector differs: stored whole, nothing linked.
    let mut part = one.to_vec();
    let end = part.len();
    part[end - SECTOR_SIZE..].copy_from_slice(&sector(&mut r, false));
    write_model(&v, &mut model, 8 << 20, &part);
    assert_eq!(inline_linked(&v), blob as u64);
    check_model(&v, &model);
}

#[test]
fn a_client_hooks_run_stops_where_its_source_is_shared_already() {
    let (v, mut model) = volume(SAMPLE);
    let mut r = rng(85);
    let a = run_hooked(&mut r, &[10, 30]);
    write_model(&v, &mut model, 0, &a);
    // A copy of sectors 26..40 (hook 30): LBAs 26..40 promoted, shared.
    let s = |x: usize, y: usize| &a[x * SECTOR_SIZE..y * SECTOR_SIZE];
    write_model(&v, &mut model, 4 << 20, s(26, 40));
    assert_eq!(v.stats().dedup_shared_writes, 14);
    // The whole run again: hook 10 (client LBA 10) extends up to 26, where
    // its source is shared already, and is promoted; hook 30 (hidden)
    // links 26..40; 40..48 has no hook and is stored. Nothing of 26..40 is
    // written at hidden addresses twice.
    write_model(&v, &mut model, 8 << 20, &a);
    let st = v.stats();
    assert_eq!(st.dedup_shared_writes, 14 + 26);
    assert_eq!(st.dedup_inline_linked_sectors, 14 + 26 + 14);
    check_model(&v, &model);
}
