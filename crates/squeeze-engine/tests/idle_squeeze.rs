//! The idle squeeze: with an idle level in the policy (the recompress
//! algorithm of the target's codec, zstd:9 over zstd:3), what clients wrote
//! at the target is rewritten with it, one sealed segment per pass (by the
//! maintenance thread once clients are idle), in chunks as it was written,
//! without changing a byte clients read; what it wrote is not squeezed
//! again; the upgrade of what the adaptive codec wrote below the target
//! goes straight to the idle level; a policy without an idle level
//! squeezes nothing.

mod common;
use common::*;
use squeeze_engine::{default_policy, CodecId, OpenOptions, Policy, SimStorage, Volume};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// zstd:3 with zstd:9 as its idle level, chunks of 32 KiB.
fn squeezing_policy() -> Policy {
    let mut p = default_policy();
    p.recompress_codec = CodecId::Zstd;
    p.recompress_level = 9;
    p.read_chunk = 32 << 10;
    p
}

fn create(policy: Policy) -> Arc<SimStorage> {
    let s = Arc::new(SimStorage::new());
    let mut o = small_opts(64 * MIB as u64);
    o.segment_size = 1 << 20;
    o.policy = policy;
    Volume::create(s.clone(), &o).unwrap().close().unwrap();
    s
}

/// `len` bytes of text in 1 MiB writes (128 KiB blobs), then one more MiB
/// past them so that their segments are sealed.
fn fill(v: &Volume, len: usize) -> Vec<u8> {
    let d = squeeze_codec::testdata::text(len, 5);
    for (k, c) in d.chunks(MIB).enumerate() {
        v.write((k * MIB) as u64, c, false).unwrap();
    }
    v.write(len as u64, &d[..MIB], false).unwrap();
    d
}

/// Every byte, and a 4 KiB read at every eleventh sector (one chunk each).
fn check_reads(v: &Volume, model: &[u8]) {
    let mut got = vec![0u8; model.len()];
    v.read(0, &mut got).unwrap();
    assert!(got == model);
    let mut one = vec![0u8; 4096];
    for at in (0..model.len()).step_by(11 * 4096) {
        v.read(at as u64, &mut one).unwrap();
        assert!(one[..] == model[at..at + 4096], "4 KiB read at {at}");
    }
}

#[test]
fn new_volumes_squeeze_to_zstd_9_when_idle() {
    let s = create(default_policy());
    let v = Volume::open(s, OpenOptions::default()).unwrap();
    assert_eq!(v.stats().idle_algorithm, "zstd:9");
}

#[test]
fn squeeze_passes_rewrite_target_data_with_the_idle_level_once() {
    let s = create(squeezing_policy());
    let v = Volume::open(s.clone(), OpenOptions::default()).unwrap();
    let model = fill(&v, 8 * MIB);
    let before = v.stats();
    assert_eq!(before.idle_algorithm, "zstd:9");
    assert!(
        before.unsqueezed_pending_bytes >= 8 * MIB as u64,
        "{before:?}"
    );
    let mut passes = 0;
    while let Some(r) = v.squeeze_pass().unwrap() {
        assert_eq!(r.corrupt_records, 0);
        passes += 1;
        assert!(passes < 100, "the squeeze never ends");
    }
    assert!(passes >= 3, "{passes} passes");
    v.checkpoint().unwrap();
    v.checkpoint().unwrap();
    let after = v.stats();
    // Each client byte once, and the squeezed records that shared a
    // segment with client data again (a segment is rewritten whole):
    // about one segment (3 MiB of this text) past the 9 MiB written.
    assert!(after.squeezed_bytes >= 7 * MIB as u64, "{after:?}");
    assert!(after.squeezed_bytes <= 13 * MIB as u64, "{after:?}");
    // What stays is in the head segment only (not sealed yet).
    assert!(
        after.unsqueezed_pending_bytes <= 2 * MIB as u64,
        "{}",
        after.unsqueezed_pending_bytes
    );
    assert!(
        after.stored_bytes < before.stored_bytes,
        "stored {} -> {}",
        before.stored_bytes,
        after.stored_bytes
    );
    check_reads(&v, &model);
    v.verify_accounting().unwrap();
    // What the squeeze wrote is not squeezed again: 4 MiB more of client
    // data is squeezed with at most the two segments (3 MiB of this text
    // each) it shares with squeezed records (a squeeze output noted
    // unsqueezed would never end).
    v.write(16 * MIB as u64, &model[..3 * MIB], false).unwrap();
    let squeezed = v.stats().squeezed_bytes;
    v.write(24 * MIB as u64, &model[..MIB], false).unwrap();
    let mut passes = 0;
    while v.squeeze_pass().unwrap().is_some() {
        passes += 1;
        assert!(passes < 100, "the squeeze never ends");
    }
    let again = v.stats().squeezed_bytes - squeezed;
    assert!(
        (4 * MIB as u64..=10 * MIB as u64).contains(&again),
        "{again} bytes squeezed again"
    );
    v.close().unwrap();
    let v = reopen(&s);
    check_reads(&v, &model);
    v.verify_accounting().unwrap();
    // A reopened volume knows no unsqueezed bytes (in memory only).
    assert_eq!(v.stats().unsqueezed_pending_bytes, 0);
    assert!(v.squeeze_pass().unwrap().is_none());
}

#[test]
fn a_policy_without_an_idle_level_squeezes_nothing() {
    let mut off = default_policy();
    off.recompress_codec = CodecId::None;
    off.recompress_level = 0;
    let mut other_codec = default_policy();
    other_codec.recompress_codec = CodecId::Lz4;
    other_codec.recompress_level = 0;
    let mut same_level = default_policy();
    same_level.recompress_codec = CodecId::Zstd;
    same_level.recompress_level = 3;
    for p in [off, other_codec, same_level] {
        let s = create(p);
        let v = Volume::open(s.clone(), OpenOptions::default()).unwrap();
        fill(&v, 4 * MIB);
        assert!(v.squeeze_pass().unwrap().is_none(), "{p:?}");
        let st = v.stats();
        assert_eq!(st.idle_algorithm, "", "{p:?}");
        assert_eq!(st.unsqueezed_pending_bytes, 0);
        assert_eq!(st.squeezed_bytes, 0);
    }
}

#[test]
fn the_maintenance_thread_squeezes_once_clients_are_idle() {
    let s = create(squeezing_policy());
    let v = Volume::open(
        s.clone(),
        OpenOptions {
            background: true,
            ..Default::default()
        },
    )
    .unwrap();
    let model = fill(&v, 6 * MIB);
    v.flush().unwrap();
    let t0 = Instant::now();
    while v.stats().squeezed_bytes < 4 * MIB as u64 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "not squeezed: {:?}",
            v.stats()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    check_reads(&v, &model);
    v.close().unwrap();
    let v = reopen(&s);
    check_reads(&v, &model);
    v.verify_accounting().unwrap();
}

#[test]
fn the_upgrade_writes_straight_at_the_idle_level() {
    let s = create(squeezing_policy());
    // Every batch below the target (zstd:1, then lz4): see tests/upgrade.rs.
    let v = Volume::open(s.clone(), behind_options()).unwrap();
    let model = fill(&v, 8 * MIB);
    assert!(v.stats().below_target_bytes >= 7 * MIB as u64);
    let mut passes = 0;
    while v.upgrade_pass().unwrap().is_some() {
        passes += 1;
        assert!(passes < 100, "the upgrade never ends");
    }
    let upgraded = v.stats();
    assert!(upgraded.upgraded_bytes >= 7 * MIB as u64, "{upgraded:?}");
    // Left to squeeze: the head segment's client bytes and the segments
    // they share with the upgrade's output, not the upgraded bytes again.
    while v.squeeze_pass().unwrap().is_some() {
        passes += 1;
        assert!(passes < 200, "the squeeze never ends");
    }
    let after = v.stats();
    assert!(
        after.squeezed_bytes <= 4 * MIB as u64,
        "squeezed {} after upgrading {}",
        after.squeezed_bytes,
        upgraded.upgraded_bytes
    );
    check_reads(&v, &model);
    v.verify_accounting().unwrap();
}
