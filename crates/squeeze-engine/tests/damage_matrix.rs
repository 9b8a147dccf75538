//! The damage matrix (docs/RELIABILITY.md, "Damage"): for each region of a
//! volume file (either superblock slot zeroed, randomised or partly zeroed;
//! a checkpoint piece; the log's first, middle and last segment after the
//! checkpoint; the flush marks; truncation at a segment boundary and inside
//! a record) and for both a cleanly closed and a crashed volume (a process
//! kill after a flush), one of:
//!
//! - the volume opens and every sector reads back as written, or fails its
//!   read and `check` names it;
//! - the open is refused (`EngineError::Damaged`, or a metadata error), and
//!   `check` (which accepts the loss) does not call the volume clean.
//!
//! Never wrong data served without an error. A superblock slot's damage
//! must cost nothing: the volume opens from the other slot, intact.

mod common;

use common::{data, rng};
use rand::Rng;
use squeeze_engine::check::check;
use squeeze_engine::{CreateOptions, EngineError, OpenOptions, SimStorage, Storage, Volume};
use squeeze_format::{RecordHeader, RecordKind, RECORD_HEADER_SIZE, SUPERBLOCK_SIZE};
use std::sync::Arc;

const SIZE: u64 = 24 << 20;
const SEG: u64 = 512 << 10;
const SECTOR: usize = 4096;

/// A volume written in two phases around a checkpoint, then flushed; with
/// `clean`, closed, else left as a killed process leaves it. Returns the
/// image, the logical content, and the log segments (by their header seq)
/// opened after the checkpoint, in log order.
struct Built {
    image: SimStorage,
    model: Vec<u8>,
    after_checkpoint: Vec<u32>,
    checkpoint_segments: Vec<u32>,
}

fn segment_offset(s: u32) -> u64 {
    squeeze_format::segment_offset(SEG, s)
}

/// (seq, segment) of every valid segment header in the image.
fn segment_headers(img: &dyn Storage, uuid: &[u8; 16]) -> Vec<(u64, u32)> {
    let len = img.len().unwrap();
    let n = len.saturating_sub(squeeze_format::DATA_START).div_ceil(SEG) as u32;
    let mut out = Vec::new();
    for s in 0..n {
        let mut h = [0u8; RECORD_HEADER_SIZE];
        img.read_at(&mut h, segment_offset(s)).unwrap();
        if let Ok(h) = RecordHeader::decode(&h, uuid) {
            if h.kind == RecordKind::SegmentHeader && h.aux == u64::from(s) {
                out.push((h.seq, s));
            }
        }
    }
    out.sort_unstable();
    out
}

fn build(seed: u64, clean: bool) -> Built {
    let mut r = rng(seed);
    let s = Arc::new(SimStorage::new());
    let mut o = CreateOptions::new(SIZE);
    o.segment_size = SEG;
    let v = Volume::create(s.clone(), &o).unwrap();
    let uuid = v.uuid();
    let mut model = vec![0u8; SIZE as usize];
    let mut write = |v: &Volume, r: &mut rand::rngs::StdRng, n: usize| {
        for _ in 0..n {
            let sectors = r.gen_range(1..=32usize);
            let lba = r.gen_range(0..(SIZE as usize / SECTOR - sectors));
            let kind = r.gen_range(1..4);
            let d = data(r, kind, sectors * SECTOR);
            v.write((lba * SECTOR) as u64, &d, false).unwrap();
            model[lba * SECTOR..(lba + sectors) * SECTOR].copy_from_slice(&d);
        }
    };
    write(&v, &mut r, 120);
    v.flush().unwrap();
    v.checkpoint().unwrap();
    let before = segment_headers(&*s, &uuid);
    let last_before = before.last().map_or(0, |h| h.0);
    write(&v, &mut r, 160);
    v.flush().unwrap();
    let checkpoint_segments = v.superblock().checkpoint.segments;
    let image = if clean {
        v.close().unwrap();
        s.kill()
    } else {
        let img = s.kill();
        drop(v);
        img
    };
    let after: Vec<u32> = segment_headers(&image, &uuid)
        .into_iter()
        .filter(|&(q, _)| q > last_before)
        .map(|(_, s)| s)
        .collect();
    assert!(
        after.len() >= 3,
        "the log after the checkpoint spans {after:?}"
    );
    Built {
        image,
        model,
        after_checkpoint: after,
        checkpoint_segments,
    }
}

/// The end of the last non-zero byte of segment `s` (where its records end).
fn written_end(img: &dyn Storage, s: u32) -> u64 {
    let mut b = vec![0u8; SEG as usize];
    img.read_at(&mut b, segment_offset(s)).unwrap();
    let n = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    segment_offset(s) + n as u64
}

fn copy(img: &SimStorage) -> SimStorage {
    img.kill()
}

enum Outcome {
    /// Opened; every sector read back as written or failed and was named.
    Intact,
    /// Opened; some sectors failed their read, and check named them all.
    ReadErrorsNamed,
    /// Refused, and check reported it.
    Refused,
}

/// A copy of the undamaged image, opened read-only: it finds no damage.
fn open_undamaged(img: &SimStorage) -> Volume {
    let v = Volume::open(
        Arc::new(copy(img)),
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(v.damage().is_empty(), "{}", v.damage());
    v
}

/// The slot of the undamaged image's newest flush mark (one after the
/// checkpoint).
fn newest_mark_slot(img: &SimStorage) -> u64 {
    let newest = open_undamaged(img)
        .damage()
        .flushed_seq
        .expect("a mark after the checkpoint");
    let mut area = vec![0u8; 16 * 4096];
    img.read_at(&mut area, squeeze_format::FLUSH_MARK_START)
        .unwrap();
    (0..16u64)
        .find(|&s| {
            squeeze_format::flush_mark::FlushMark::decode(&area[s as usize * 4096..])
                .is_ok_and(|m| m.flushed_seq == newest)
        })
        .expect("the newest mark's slot")
}

/// Opens the damaged image and checks the rule; returns what happened.
fn verify(img: SimStorage, model: &[u8], what: &str) -> Outcome {
    let img = Arc::new(img);
    let strict = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let lenient = OpenOptions {
        read_only: true,
        accept_loss: true,
        ..Default::default()
    };
    match Volume::open(img.clone(), strict) {
        Ok(v) => {
            assert!(!v.damage().is_loss(), "{what}: opened with loss");
            let report = check(&v, |_, _| {});
            let named = |lba: u64| {
                report
                    .damaged
                    .iter()
                    .any(|d| (d.first_lba..d.first_lba + d.sectors).contains(&lba))
            };
            let mut errors = 0;
            let mut buf = vec![0u8; SECTOR];
            for lba in 0..SIZE / SECTOR as u64 {
                let want = &model[lba as usize * SECTOR..(lba as usize + 1) * SECTOR];
                match v.read(lba * SECTOR as u64, &mut buf) {
                    Ok(()) => assert!(buf == want, "{what}: LBA {lba} read back wrong, silently"),
                    Err(e) => {
                        assert!(
                            named(lba),
                            "{what}: LBA {lba} failed ({e}) but check names it not"
                        );
                        errors += 1;
                    }
                }
            }
            if errors > 0 {
                assert!(!report.is_clean(), "{what}");
                Outcome::ReadErrorsNamed
            } else {
                Outcome::Intact
            }
        }
        Err(e) => {
            match Volume::open(img, lenient) {
                Ok(v) => {
                    let report = check(&v, |_, _| {});
                    assert!(
                        !report.is_clean(),
                        "{what}: the open was refused ({e}) but check finds it clean"
                    );
                    if let EngineError::Damaged(d) = &e {
                        assert!(d.is_loss(), "{what}");
                        assert_eq!(**d, report.recovery, "{what}");
                    }
                }
                // Unreadable whatever is accepted: check exits 2 naming why.
                Err(e2) => assert!(
                    !matches!(e2, EngineError::Damaged(_)),
                    "{what}: accepting the loss still refused with Damaged: {e2}"
                ),
            }
            Outcome::Refused
        }
    }
}

/// Damage done to the image at a byte offset.
type Damager = Box<dyn Fn(&SimStorage, u64)>;

fn slot_cases() -> Vec<(&'static str, Damager)> {
    vec![
        (
            "zeroed",
            Box::new(|i: &SimStorage, at| i.overwrite(at, &[0u8; SUPERBLOCK_SIZE])),
        ),
        (
            "randomised",
            Box::new(|i: &SimStorage, at| {
                let mut r = rng(at + 7);
                let b: Vec<u8> = (0..SUPERBLOCK_SIZE).map(|_| r.gen()).collect();
                i.overwrite(at, &b)
            }),
        ),
        (
            "partly zeroed",
            Box::new(|i: &SimStorage, at| i.overwrite(at + 64, &[0u8; 512])),
        ),
    ]
}

fn run_matrix(clean: bool, seed: u64) {
    let kind = if clean { "clean" } else { "crashed" };
    let b = build(seed, clean);
    let b = &b;
    // Undamaged: intact, and check is clean.
    assert!(matches!(
        verify(copy(&b.image), &b.model, &format!("{kind}: undamaged")),
        Outcome::Intact
    ));
    // Either superblock slot: always intact, and check reports the slot.
    for slot in 0..2u64 {
        for (name, damage) in slot_cases() {
            let what = format!("{kind}: superblock slot {slot} {name}");
            let img = copy(&b.image);
            damage(&img, slot * SUPERBLOCK_SIZE as u64);
            assert!(
                matches!(verify(copy(&img), &b.model, &what), Outcome::Intact),
                "{what}: a superblock slot must cost nothing"
            );
            let v = Volume::open(
                Arc::new(img),
                OpenOptions {
                    read_only: true,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(
                !check(&v, |_, _| {}).is_clean(),
                "{what}: check calls it clean"
            );
        }
    }
    // A checkpoint piece: its first block and one in the middle.
    for (name, at) in [
        ("first block", segment_offset(b.checkpoint_segments[0])),
        (
            "middle",
            (segment_offset(b.checkpoint_segments[0]) + 4096)
                .max(written_end(&b.image, b.checkpoint_segments[0]) / 2 / 4096 * 4096),
        ),
    ] {
        let img = copy(&b.image);
        let mut r = rng(at);
        let junk: Vec<u8> = (0..4096).map(|_| r.gen()).collect();
        img.overwrite(at, &junk);
        verify(img, &b.model, &format!("{kind}: checkpoint piece {name}"));
    }
    // The log's first, middle and last segment after the checkpoint: 4 KiB
    // of random bytes in the middle of what each holds.
    let after = &b.after_checkpoint;
    for (name, s) in [
        ("first", after[0]),
        ("middle", after[after.len() / 2]),
        ("last", *after.last().unwrap()),
    ] {
        let start = segment_offset(s) + RECORD_HEADER_SIZE as u64;
        let end = written_end(&b.image, s);
        let at = (start + (end - start) / 2) / 4096 * 4096;
        let img = copy(&b.image);
        let mut r = rng(at);
        let junk: Vec<u8> = (0..4096).map(|_| r.gen()).collect();
        img.overwrite(at, &junk);
        let what = format!("{kind}: log segment {s} ({name} after the checkpoint), 4 KiB at {at}");
        let outcome = verify(img, &b.model, &what);
        if !clean {
            // Flushed records after the checkpoint are what replay reads:
            // damage there is reported, never passed over.
            assert!(
                !matches!(outcome, Outcome::Intact),
                "{what}: damage passed over"
            );
        }
    }
    // The flush marks: damage to them costs no data, but after a crash a
    // damaged slot may have held the newest mark, so what replay did not
    // find can no longer be told from unflushed writes: refused (session
    // 30). After a clean close nothing needs them.
    for slot in 0..2u64 {
        let img = copy(&b.image);
        img.overwrite(squeeze_format::flush_mark::slot_offset(slot), &[0xa5; 4096]);
        let what = format!("{kind}: flush mark slot {slot}");
        let outcome = verify(img, &b.model, &what);
        if clean {
            assert!(matches!(outcome, Outcome::Intact), "{what}");
        } else {
            assert!(matches!(outcome, Outcome::Refused), "{what}");
        }
    }
    // Truncation at the start of the last log segment, and inside its last
    // record.
    let last = *after.last().unwrap();
    for (name, len) in [
        ("at a segment boundary", segment_offset(last)),
        ("inside a record", written_end(&b.image, last) - 1000),
    ] {
        let img = copy(&b.image);
        img.truncate(len);
        let what = format!("{kind}: truncated {name} ({len} bytes)");
        assert!(
            matches!(verify(img, &b.model, &what), Outcome::Refused),
            "{what}: a file cut short must be refused"
        );
    }
}

#[test]
fn damage_on_a_crashed_volume_is_reported_never_served() {
    for seed in [1, 2] {
        run_matrix(false, seed);
    }
}

#[test]
fn damage_on_a_clean_volume_is_reported_never_served() {
    for seed in [3, 4] {
        run_matrix(true, seed);
    }
}

/// The case: the newest superblock slot zeroed after a crash read
/// back all zeros. Now the older slot's checkpoint and the log replayed
/// after it bring back every flushed byte.
#[test]
fn a_zeroed_newest_slot_after_a_crash_loses_nothing() {
    let b = build(5, false);
    let v = open_undamaged(&b.image);
    let newest = v.superblock().slot();
    drop(v);
    let img = copy(&b.image);
    img.overwrite(newest * SUPERBLOCK_SIZE as u64, &[0u8; SUPERBLOCK_SIZE]);
    assert!(matches!(
        verify(copy(&img), &b.model, "newest slot zeroed"),
        Outcome::Intact
    ));
    // Opened writable, the damage is repaired: check is clean afterwards.
    let img = Arc::new(img);
    let v = Volume::open(img.clone(), OpenOptions::default()).unwrap();
    assert!(v.damage().superblock.is_some());
    v.close().unwrap();
    let v = Volume::open(img, OpenOptions::default()).unwrap();
    assert!(v.damage().is_empty(), "{}", v.damage());
    assert!(check(&v, |_, _| {}).is_clean());
}

/// Accepting the loss opens the volume, keeps every record after the gap,
/// and the counters say what was lost.
#[test]
fn accepting_a_loss_keeps_what_survives_and_counts_it() {
    let b = build(6, false);
    let s = b.after_checkpoint[1];
    let start = segment_offset(s) + RECORD_HEADER_SIZE as u64;
    let at = (start + (written_end(&b.image, s) - start) / 2) / 4096 * 4096;
    let img = Arc::new(copy(&b.image));
    img.overwrite(at, &[0x5a; 4096]);
    let e = Volume::open(img.clone(), OpenOptions::default())
        .err()
        .expect("refused");
    let EngineError::Damaged(d) = e else {
        panic!("{e}")
    };
    assert!(!d.lost.is_empty());
    let v = Volume::open(
        img.clone(),
        OpenOptions {
            accept_loss: true,
            ..Default::default()
        },
    )
    .unwrap();
    let st = v.stats();
    assert_eq!(st.lost_flushed_records, d.lost_records());
    assert_eq!(st.damaged_opens, 1);
    assert!(st.damage_at_open.is_some());
    // Records of the segments after the damaged one were replayed: the
    // last segment's data reads back.
    let last = *b.after_checkpoint.last().unwrap();
    assert!(last != s);
    v.close().unwrap();
    // The loss was made permanent: the volume opens from now on, and the
    // counters stay.
    let v = Volume::open(img, OpenOptions::default()).unwrap();
    assert!(v.damage().is_empty());
    assert_eq!(v.stats().lost_flushed_records, d.lost_records());
}

/// The fuzz input of session 30 (`fuzz/corpus/volume_damage/
/// regress-newest-mark-and-tail`): after a crash, the slot of the newest
/// flush mark overwritten and the file cut short inside the records that
/// mark had claimed. The older mark claims nothing after the checkpoint,
/// so replay took the cut for a tail of unflushed writes and served the
/// checkpoint's older data without an error. Now the damaged slot is loss:
/// refused, then opened when the loss is accepted, and once opened writable
/// the slot is cleared and the volume opens clean.
#[test]
fn a_damaged_newest_mark_and_a_cut_tail_are_refused_not_served() {
    let b = build(7, false);
    let slot = newest_mark_slot(&b.image);
    let img = copy(&b.image);
    img.overwrite(squeeze_format::flush_mark::slot_offset(slot), &[0xa5; 4096]);
    let last = *b.after_checkpoint.last().unwrap();
    img.truncate(segment_offset(last));
    assert!(matches!(
        verify(copy(&img), &b.model, "newest mark damaged, tail cut"),
        Outcome::Refused
    ));
    let img = Arc::new(img);
    let e = Volume::open(img.clone(), OpenOptions::default())
        .err()
        .expect("refused");
    let EngineError::Damaged(d) = e else {
        panic!("{e}")
    };
    let m = d.damaged_marks.clone().expect("the damaged slot named");
    assert_eq!(m.slots, vec![slot]);
    assert!(m.after_crash);
    assert!(d.to_string().contains("flush mark slot"), "{d}");
    let v = Volume::open(
        img.clone(),
        OpenOptions {
            accept_loss: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(v.damage().is_loss());
    v.close().unwrap();
    let v = Volume::open(img, OpenOptions::default()).unwrap();
    assert!(v.damage().is_empty(), "{}", v.damage());
}

/// The second fuzz input of session 30 (`fuzz/corpus/volume_damage/
/// regress-zeroed-mark`): after a crash, the newest mark's slot zeroed
/// (as if never written) and a block of the log after the checkpoint
/// overwritten. Every slot of a new volume holds a placeholder mark, so a
/// zeroed slot is damage: refused, never older data served.
#[test]
fn a_zeroed_newest_mark_and_a_damaged_log_are_refused_not_served() {
    let b = build(8, false);
    let slot = newest_mark_slot(&b.image);
    let img = copy(&b.image);
    img.overwrite(squeeze_format::flush_mark::slot_offset(slot), &[0; 256]);
    let s = *b.after_checkpoint.last().unwrap();
    let start = segment_offset(s) + RECORD_HEADER_SIZE as u64;
    let at = (start + (written_end(&b.image, s) - start) / 2) / 4096 * 4096;
    img.overwrite(at, &[0x5a; 4096]);
    assert!(matches!(
        verify(img, &b.model, "newest mark zeroed, log damaged"),
        Outcome::Refused
    ));
}
