//! Deduplication (docs/DEDUP.md): the pass shares repeated content without
//! changing a byte clients read; the accounting (segment usage, references
//! of hidden addresses) stays exact through overwrites, trims, the
//! cleaner, checkpoints and reopens; hidden addresses nobody refers to are
//! zeroed; a damaged shared record is reported at every sector sharing it.

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::{storage::Storage, SECTOR_SIZE};
use std::sync::Arc;

const S: u64 = SECTOR_SIZE as u64;
const BUDGET: u64 = 16 << 20;

#[test]
fn shares_copies_and_reads_them_back() {
    let size = 32 << 20;
    let (s, v) = sim_volume(size, None);
    let mut r = rng(1);
    let mut model = vec![0u8; size as usize];
    // One 1 MiB content at three places (one unaligned to the windows by
    // 3 sectors), and unique data around it.
    let a = data(&mut r, 3, 1 << 20);
    for at in [0, 8 << 20, (16 << 20) + 3 * S] {
        write_model(&v, &mut model, at, &a);
    }
    let u = data(&mut r, 3, 2 << 20);
    write_model(&v, &mut model, 4 << 20, &u);
    v.flush().unwrap();
    let before = v.stats();
    let rep = v.dedup(BUDGET, |_, _| {}).unwrap();
    // 256 sectors at each of two later copies share the first's content.
    assert_eq!(rep.sectors_promoted, 256, "{rep:?}");
    assert_eq!(rep.sectors_linked, 3 * 256, "{rep:?}");
    assert_eq!(rep.sectors_mismatched, 0);
    check_model(&v, &model);
    // Honest stats: the same client bytes mapped, two copies saved, and
    // compression's ratio told apart from deduplication's.
    let st = v.stats();
    assert_eq!(st.mapped_bytes, before.mapped_bytes);
    assert_eq!(st.dedup_shared_sectors, 256);
    assert_eq!(st.dedup_references, 3 * 256);
    assert_eq!(st.dedup_saved_bytes, 2 * 256 * S);
    assert_eq!(st.dedup_linked_sectors, 3 * 256);
    assert_eq!(st.dedup_shared_writes, 256);
    assert!(st.data_reduction_ratio > st.compression_ratio);
    // The copies' records are garbage now: compact gives their room back.
    v.compact(|_, _| {}).unwrap();
    check_model(&v, &model);
    let after = v.stats();
    assert!(
        after.stored_bytes * 10 < before.stored_bytes * 7,
        "stored {} -> {}",
        before.stored_bytes,
        after.stored_bytes
    );
    // A second pass finds nothing more.
    let again = v.dedup(BUDGET, |_, _| {}).unwrap();
    assert_eq!(
        (again.sectors_linked, again.sectors_promoted),
        (0, 0),
        "{again:?}"
    );

    // Overwrites and trims of shared sectors: the others keep the content.
    let d = data(&mut r, 1, 64 << 10);
    write_model(&v, &mut model, 8 << 20, &d);
    v.trim(S * 10, S * 20, false).unwrap();
    model[10 * S as usize..30 * S as usize].fill(0);
    check_model(&v, &model);
    // The whole content overwritten everywhere: its hidden record goes.
    for at in [0, 8 << 20, (16 << 20) + 3 * S] {
        let d = data(&mut r, 3, 1 << 20);
        write_model(&v, &mut model, at, &d);
    }
    let rep = v.dedup(BUDGET, |_, _| {}).unwrap();
    assert!(rep.orphans_zeroed >= 256, "{rep:?}");
    check_model(&v, &model);

    // A reopen rebuilds the references from the checkpoint and the log.
    let a2 = data(&mut r, 2, 256 << 10);
    write_model(&v, &mut model, 20 << 20, &a2);
    write_model(&v, &mut model, 24 << 20, &a2);
    v.dedup(BUDGET, |_, _| {}).unwrap();
    v.checkpoint().unwrap();
    write_model(&v, &mut model, 28 << 20, &a2);
    v.dedup(BUDGET, |_, _| {}).unwrap();
    v.flush().unwrap();
    drop(v);
    let v = reopen(&s);
    check_model(&v, &model);
    v.close().unwrap();
    let v = reopen(&s);
    check_model(&v, &model);
    // Shared content lies past the volume's end: a shrink over free space
    // is not refused for it, and a grow leaves it alone.
    v.trim(30 << 20, 2 << 20, false).unwrap();
    v.resize(30 << 20).unwrap();
    v.resize(size).unwrap();
    model[30 << 20..].fill(0);
    check_model(&v, &model);
}

/// Content repeated inside one window, and a fingerprint index too small
/// to remember the first copy: nothing is shared wrongly either way.
#[test]
fn small_index_and_repeats_inside_a_window() {
    let size = 16 << 20;
    let (_s, v) = sim_volume(size, None);
    let mut r = rng(2);
    let mut model = vec![0u8; size as usize];
    let block = data(&mut r, 1, SECTOR_SIZE);
    for k in 0..40u64 {
        write_model(&v, &mut model, k * S, &block);
    }
    let far = data(&mut r, 3, 512 << 10);
    write_model(&v, &mut model, 1 << 20, &far);
    write_model(&v, &mut model, 12 << 20, &far);
    // Unique data between the copies.
    write_model(&v, &mut model, 4 << 20, &data(&mut r, 3, 6 << 20));
    // An index of a few entries (8 chapters of 3), sampling at its most:
    // the far copy is forgotten by the time its twin is read.
    let rep = v.dedup(8 * 4 * 17, |_, _| {}).unwrap();
    assert_eq!(rep.index_sample, 32, "{rep:?}");
    assert!(rep.index_evicted > 0, "{rep:?}");
    check_model(&v, &model);
    let rep = v.dedup(BUDGET, |_, _| {}).unwrap();
    assert!(rep.sectors_linked >= 128, "{rep:?}");
    check_model(&v, &model);
    // Random writes racing nothing here, but many small overwrites after.
    for _ in 0..200 {
        let lba = r.gen_range(0..size / S);
        let d = data(&mut r, 3, SECTOR_SIZE);
        write_model(&v, &mut model, lba * S, &d);
    }
    v.dedup(BUDGET, |_, _| {}).unwrap();
    check_model(&v, &model);
}

/// An index too small for the volume samples its fingerprints (1 in 16
/// here) and still finds nearly all of the copies, whole runs from one
/// hook (docs/DEDUP.md, "Budget").
#[test]
fn a_sparse_index_finds_runs_from_their_hooks() {
    let size = 64 << 20;
    let (_s, v) = sim_volume(size, None);
    let mut r = rng(5);
    let mut model = vec![0u8; size as usize];
    // 16 contents of 64 KiB to 1 MiB, each at two places, the second
    // unaligned to the windows; unique data between.
    let mut copied = 0;
    for c in 0..16u64 {
        let len = (16 + 16 * c as usize) * SECTOR_SIZE;
        let d = data(&mut r, 3, len);
        write_model(&v, &mut model, c * (1 << 20), &d);
        write_model(&v, &mut model, (32 << 20) + c * (1 << 20) + (c % 7) * S, &d);
        copied += len as u64 / S;
    }
    write_model(&v, &mut model, 16 << 20, &data(&mut r, 3, 8 << 20));
    let mapped = v.stats().mapped_bytes / S;
    // A budget of about an eighth of the mapped sectors' entries (tables
    // of a power of two slots: 1 in 16 kept here).
    let budget = mapped / 8 * 20;
    let rep = v.dedup(budget, |_, _| {}).unwrap();
    assert!(rep.index_sample >= 8, "{rep:?}");
    assert_eq!(rep.sectors_mismatched, 0, "{rep:?}");
    // Each run is shared as a whole once one hook of it is found: all but
    // runs with no hook at all (about (15/16)^16 of the shortest).
    assert!(
        rep.sectors_promoted * 100 >= copied * 95,
        "{} of {copied} copied sectors shared: {rep:?}",
        rep.sectors_promoted
    );
    assert!(rep.index_entries * 6 <= mapped, "{rep:?}");
    check_model(&v, &model);
}

/// A damaged shared record: `check` names every client sector sharing it,
/// and reads of them fail rather than return other bytes.
#[test]
fn damage_of_a_shared_record_is_reported_at_every_sharer() {
    let size = 16 << 20;
    let (s, v) = sim_volume(size, None);
    let mut r = rng(3);
    let a = data(&mut r, 3, 128 << 10);
    for at in [0u64, 4 << 20, 8 << 20] {
        v.write(at, &a, false).unwrap();
    }
    v.flush().unwrap();
    let rep = v.dedup(BUDGET, |_, _| {}).unwrap();
    assert_eq!(rep.sectors_promoted, 32);
    v.compact(|_, _| {}).unwrap();
    v.flush().unwrap();
    // The one record of the content is the newest Extent at a hidden
    // address: find it in the backing file by its header and damage its
    // payload.
    let hidden = find_hidden_record(&s);
    let mut b = [0u8; 1];
    s.read_at(&mut b, hidden + 100).unwrap();
    b[0] ^= 0x55;
    s.write_at(&b, hidden + 100).unwrap();
    let mut out = vec![0u8; 4096];
    for at in [0u64, 4 << 20, 8 << 20] {
        assert!(
            v.read(at, &mut out).is_err(),
            "a damaged shared sector at {at} was served"
        );
    }
    // Every sharer of each damaged hidden sector (a chunked record loses
    // only its damaged chunk's sectors), in one entry per sharing run.
    let report = squeeze_engine::check::check(&v, |_, _| {});
    let (clients, hidden): (Vec<_>, Vec<_>) =
        report.damaged.iter().partition(|d| d.first_lba < size / S);
    let hidden_sectors: u64 = hidden.iter().map(|d| d.sectors).sum();
    assert!(hidden_sectors > 0, "{:#?}", report.damaged);
    assert_eq!(
        clients.iter().map(|d| d.sectors).sum::<u64>(),
        3 * hidden_sectors
    );
    assert_eq!(clients.len(), 3, "{:#?}", report.damaged);
    assert!(clients
        .iter()
        .all(|d| d.error.contains("shares the damaged hidden addresses")));
}

/// The byte offset of the last Extent record of a hidden address in the
/// backing file (a walk of the log's records).
fn find_hidden_record(s: &Arc<squeeze_engine::SimStorage>) -> u64 {
    use squeeze_format::{RecordHeader, RecordKind, RECORD_ALIGN, SHARED_BASE};
    let len = s.len().unwrap();
    let mut buf = vec![0u8; len as usize];
    s.read_at(&mut buf, 0).unwrap();
    let uuid = squeeze_format::Superblock::decode(&buf[..4096])
        .unwrap()
        .uuid;
    let mut found = None;
    let mut at = 0;
    while at + 64 <= len {
        if let Ok(h) = RecordHeader::decode(&buf[at as usize..], &uuid) {
            if h.kind == RecordKind::Extent && h.lba >= SHARED_BASE {
                found = Some(at);
            }
        }
        at += RECORD_ALIGN;
    }
    found.expect("no record at a hidden address")
}
