//! A log head exactly at the end of its segment (issue 13, torture seed
//! 3003): the last record of a segment ends on the segment boundary, so the
//! head's byte offset is also the first byte of the next segment.
//!
//! Recovery once took that offset for a position in the next segment:
//! - replay read the next segment's header at the boundary, went on into it
//!   and still called the segment it came from the head; the allocation
//!   ahead was then given back from that segment's end to the head, which
//!   punched the records just replayed (reads: "bad magic"), and every
//!   later append asked the file for a zero-length allocation (EINVAL)
//!   while the volume stayed writable;
//! - a checkpoint taken with the head on the boundary made recovery open
//!   its log in the segment after it, whatever that segment held.
//!
//! Each test builds the layout byte for byte with 512 KiB segments and
//! uncompressed 4 KiB records (a short header: 32 + 4096 bytes each): 126
//! of them and 64 zero records of 64 bytes fill a segment's 524,224 bytes
//! after its header.

mod common;
use common::*;
use squeeze_engine::{
    CompressionMode, CreateOptions, OpenOptions, Policy, SimStorage, Storage, Volume,
};
use squeeze_format::{RecordHeader, RecordKind, DATA_START};
use std::sync::Arc;

const SEG: u64 = 512 << 10;
const SECTOR: u64 = 4096;
/// Uncompressed 4 KiB records that fit a segment after its header ...
const RECORDS_PER_SEGMENT: u64 = 126;
/// ... and the zero records (64 bytes: a full header) that fill the rest.
const ZERO_RECORDS: u64 = (SEG - 64 - RECORDS_PER_SEGMENT * (32 + SECTOR)) / 64;
const _: () = assert!(64 + RECORDS_PER_SEGMENT * (32 + SECTOR) + ZERO_RECORDS * 64 == SEG);

fn raw_policy() -> Policy {
    Policy {
        mode: CompressionMode::None,
        ..squeeze_engine::default_policy()
    }
}

fn create(s: &Arc<SimStorage>, open: OpenOptions) -> Volume {
    let mut o: CreateOptions = small_opts(64 << 20);
    o.policy = raw_policy();
    Volume::create_with(s.clone(), &o, open).unwrap()
}

fn background() -> OpenOptions {
    OpenOptions {
        background: true,
        no_idle_merge: true,
        ..Default::default()
    }
}

fn header_at(s: &dyn Storage, offset: u64, uuid: [u8; 16]) -> Option<RecordHeader> {
    let mut b = [0u8; 64];
    s.read_at(&mut b, offset).unwrap();
    RecordHeader::decode(&b, &uuid).ok()
}

fn seg_start(seg: u64) -> u64 {
    DATA_START + seg * SEG
}

/// Fills the rest of the log segment `seg` (whose head is right after its
/// header) with sectors `lba..`, exactly to its end; returns the next LBA.
fn fill_segment(v: &Volume, s: &SimStorage, seg: u64, lba: u64, pattern: &mut u8) -> u64 {
    for k in 0..RECORDS_PER_SEGMENT {
        *pattern = pattern.wrapping_add(1);
        v.write((lba + k) * SECTOR, &sector(*pattern, lba + k), false)
            .unwrap();
    }
    // The rest: zero records (trims of sectors never written, apart).
    for z in 0..ZERO_RECORDS {
        v.trim((16_000 + 2 * z) * SECTOR, SECTOR, false).unwrap();
    }
    let last = header_at(s, seg_start(seg + 1) - 64, v.uuid()).expect("a record ends the segment");
    assert_eq!(
        last.kind,
        RecordKind::Zero,
        "setup: the zero record fills segment {seg} exactly"
    );
    lba + RECORDS_PER_SEGMENT
}

/// A sector that does not compress and names its LBA and pattern.
fn sector(pattern: u8, lba: u64) -> Vec<u8> {
    let mut r = rng(lba * 256 + u64::from(pattern));
    let mut d = data(&mut r, 1, SECTOR as usize);
    d[0] = pattern;
    d
}

fn check_all(v: &Volume, expect: &[(u64, Vec<u8>)]) {
    let mut b = vec![0u8; SECTOR as usize];
    for (lba, want) in expect {
        v.read(lba * SECTOR, &mut b)
            .unwrap_or_else(|e| panic!("LBA {lba}: {e}"));
        assert!(b == *want, "LBA {lba} reads back what was written");
    }
}

/// The torture's sequence: segment 2 full to its last byte, the log goes
/// on in segment 3 right after it, the process dies, and the restarted
/// volume gives back its allocation ahead (after a client's flush) and
/// takes new writes.
#[test]
fn replay_across_a_full_segment_keeps_the_next_one_and_the_head() {
    let s = Arc::new(SimStorage::new());
    let v = create(&s, OpenOptions::default());
    // Segment 0 is the log, segment 1 the first checkpoint.
    assert_eq!(
        header_at(&*s, seg_start(0), v.uuid()).map(|h| h.kind),
        Some(RecordKind::SegmentHeader)
    );
    let mut pattern = 0u8;
    let mut lba = fill_segment(&v, &s, 0, 0, &mut pattern);
    // The next record opens segment 2 (the lowest free one).
    lba = fill_segment(&v, &s, 2, lba, &mut pattern);
    // ... and the next segment 3, right after the full segment 2.
    let mut expect: Vec<(u64, Vec<u8>)> = Vec::new();
    for k in 0..8 {
        pattern = pattern.wrapping_add(1);
        let d = sector(pattern, lba + k);
        v.write((lba + k) * SECTOR, &d, false).unwrap();
        expect.push((lba + k, d));
    }
    let h3 = header_at(&*s, seg_start(3), v.uuid()).expect("segment 3 opened");
    assert_eq!(h3.kind, RecordKind::SegmentHeader);
    v.flush().unwrap();
    let img = Arc::new(s.kill());
    drop(v);

    let v = Volume::open(img.clone(), background()).unwrap();
    check_all(&v, &expect);
    // A client's flush gives back the allocation past the head.
    v.flush().unwrap();
    check_all(&v, &expect);
    // Writes, zero writes and trims go on.
    let d = sector(0xaa, 5000);
    v.write(5000 * SECTOR, &d, false).unwrap();
    v.write_zeroes(5001 * SECTOR, 2 * SECTOR, false).unwrap();
    v.trim(5003 * SECTOR, SECTOR, false).unwrap();
    expect.push((5000, d));
    v.flush().unwrap();
    check_all(&v, &expect);
    assert_eq!(v.stats().read_only_reason, None);
    v.verify_accounting().unwrap();
    v.close().unwrap();
    let v = Volume::open(img, OpenOptions::default()).unwrap();
    check_all(&v, &expect);
}

/// A checkpoint taken while the head sits on the boundary: recovery must
/// go on in a new segment, not in the one after the boundary (here the
/// checkpoint segment before it, which a later checkpoint frees).
#[test]
fn a_checkpoint_with_the_head_on_the_boundary_reopens_in_its_segment() {
    let s = Arc::new(SimStorage::new());
    let v = create(&s, OpenOptions::default());
    let mut pattern = 0u8;
    let mut expect: Vec<(u64, Vec<u8>)> = Vec::new();
    let lba = fill_segment(&v, &s, 0, 0, &mut pattern);
    for k in 0..RECORDS_PER_SEGMENT {
        expect.push((k, sector(k as u8 + 1, k)));
    }
    v.checkpoint().unwrap();
    // The process dies with nothing written after the checkpoint.
    let img = Arc::new(s.kill());
    drop(v);
    let v = Volume::open(img.clone(), OpenOptions::default()).unwrap();
    check_all(&v, &expect);
    for k in 0..4 {
        pattern = pattern.wrapping_add(1);
        let d = sector(pattern, lba + k);
        v.write((lba + k) * SECTOR, &d, false).unwrap();
        expect.push((lba + k, d));
    }
    // More writes and two checkpoints (each frees what the one before the
    // previous left), then a crash: everything flushed is still there.
    for k in 0..40 {
        let d = sector(0x55, 3000 + k);
        v.write((3000 + k) * SECTOR, &d, false).unwrap();
        expect.push((3000 + k, d));
    }
    v.checkpoint().unwrap();
    v.checkpoint().unwrap();
    v.flush().unwrap();
    check_all(&v, &expect);
    let img2 = Arc::new(img.kill());
    drop(v);
    let v = Volume::open(img2, OpenOptions::default()).unwrap();
    check_all(&v, &expect);
    v.verify_accounting().unwrap();
}
