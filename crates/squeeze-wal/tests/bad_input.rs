//! Bad input of every kind gets a clear error and loses nothing: not a log,
//! the wrong layout, a damaged header, a record over the limit, a full
//! log, a full volume (--max-physical), a truncation to a place that is
//! not a record.

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::{CreateOptions, SimStorage, Volume};
use squeeze_wal::{Layout, Lsn, Wal, WalError, PAYLOAD_MAX};
use std::sync::Arc;

#[test]
fn a_volume_that_is_not_a_log_is_refused() {
    let (_d, vol) = sim_volume(8 << 20);
    let e = Wal::open(vol.clone(), None, |_, _| {}).err().unwrap();
    assert!(
        matches!(&e, WalError::NotALog(m) if m.contains("empty")),
        "{e}"
    );
    vol.write(0, &[0x42; 4096], false).unwrap();
    let e = Wal::open(vol.clone(), None, |_, _| {}).err().unwrap();
    assert!(
        matches!(&e, WalError::NotALog(m) if m.contains("magic")),
        "{e}"
    );
    // And nothing was written to it.
    let mut b = [0u8; 4096];
    vol.read(0, &mut b).unwrap();
    assert_eq!(b, [0x42; 4096]);
}

#[test]
fn create_refuses_a_volume_with_data() {
    let (_d, vol) = sim_volume(8 << 20);
    vol.write(5 << 20, &[1; 4096], false).unwrap();
    let e = Wal::create(vol.clone(), Layout::Sparse).err().unwrap();
    assert!(
        matches!(&e, WalError::Invalid(m) if m.contains("not empty")),
        "{e}"
    );
    let mut b = [0u8; 4096];
    vol.read(0, &mut b).unwrap();
    assert_eq!(b, [0; 4096], "create wrote a header anyway");
}

#[test]
fn the_wrong_layout_is_refused() {
    let (_d, vol) = sim_volume(8 << 20);
    let wal = Wal::create(vol.clone(), Layout::Sparse).unwrap();
    wal.append(b"x").unwrap();
    drop(wal);
    let e = Wal::open(vol.clone(), Some(Layout::Dense), |_, _| {})
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            WalError::LayoutMismatch {
                found: Layout::Sparse,
                wanted: Layout::Dense
            }
        ),
        "{e}"
    );
    // Without a wish, the log opens as what it is.
    let (wal, got) = open_log(&vol, Layout::Sparse).unwrap();
    assert_eq!(wal.layout(), Layout::Sparse);
    assert_eq!(got.len(), 1);
}

#[test]
fn a_damaged_header_is_refused() {
    let (_d, vol) = sim_volume(8 << 20);
    drop(Wal::create(vol.clone(), Layout::Dense).unwrap());
    let mut b = vec![0u8; 4096];
    vol.read(0, &mut b).unwrap();
    b[45] ^= 4;
    vol.write(0, &b, false).unwrap();
    let e = Wal::open(vol.clone(), None, |_, _| {}).err().unwrap();
    assert!(matches!(e, WalError::HeaderChecksum { .. }), "{e}");
}

#[test]
fn a_record_over_the_limit_is_an_error_and_changes_nothing() {
    for layout in LAYOUTS {
        let (_d, vol) = sim_volume(8 << 20);
        let wal = Wal::create(vol.clone(), layout).unwrap();
        let a = wal.append(b"before").unwrap();
        let e = wal.append(&vec![0; PAYLOAD_MAX + 1]).err().unwrap();
        assert!(matches!(e, WalError::TooLarge { .. }), "{e}");
        assert_eq!(e.errno(), libc::EINVAL);
        wal.append(&vec![1; PAYLOAD_MAX]).unwrap();
        let c = wal.append(b"after").unwrap();
        assert_eq!(c.seq, a.seq + 2);
    }
}

#[test]
fn a_full_log_refuses_appends_until_truncated() {
    for layout in LAYOUTS {
        let (_d, vol) = sim_volume(64 << 10); // 15 sectors of area
        let wal = Wal::create(vol.clone(), layout).unwrap();
        let mut acked = Vec::new();
        let e = loop {
            match wal.append(&[7; 1000]) {
                Ok(l) => acked.push(l),
                Err(e) => break e,
            }
        };
        assert!(matches!(e, WalError::Full(_)), "{layout:?}: {e}");
        assert_eq!(e.errno(), libc::ENOSPC);
        assert!(
            acked.len() >= 14,
            "{layout:?}: only {} records",
            acked.len()
        );
        // Consistent: a reopen finds every acknowledged record.
        let vol2 = wal.volume().clone();
        drop(wal);
        let (wal, got) = open_log(&vol2, layout).unwrap();
        assert_eq!(got.iter().map(|(l, _)| *l).collect::<Vec<_>>(), acked);
        // Truncating makes room; appends go on with the next seq.
        wal.truncate(acked[acked.len() / 2]).unwrap();
        let l = wal.append(&[8; 1000]).unwrap();
        assert_eq!(l.seq, acked.len() as u64);
    }
}

#[test]
fn a_full_volume_answers_enospc_and_the_log_stays_consistent() {
    for layout in LAYOUTS {
        let disk = Arc::new(SimStorage::new());
        let mut o = CreateOptions::new(1 << 30);
        o.segment_size = 512 << 10;
        o.max_physical = 6 << 20;
        let vol = Arc::new(Volume::create(disk.clone(), &o).unwrap());
        let wal = Wal::create(vol.clone(), layout).unwrap();
        let mut r = rng(1);
        let mut acked = Vec::new();
        let e = loop {
            let p: Vec<u8> = (0..60_000).map(|_| r.gen()).collect();
            match wal.append(&p) {
                Ok(l) => acked.push((l, p)),
                Err(e) => break e,
            }
            assert!(acked.len() < 1000, "never ran out of room");
        };
        assert_eq!(e.errno(), libc::ENOSPC, "{layout:?}: {e}");
        // The log is not broken: a reopen of the volume finds every
        // acknowledged record, and nothing else.
        drop(wal);
        Arc::try_unwrap(vol).ok().unwrap().close().unwrap();
        let vol = open_volume(&disk).unwrap();
        let (wal, got) = open_log(&vol, layout).unwrap();
        assert_eq!(got, acked);
        // Truncating gives the space back (after the cleaner runs).
        let (_, next) = wal.bounds();
        wal.truncate(next).unwrap();
        vol.checkpoint().unwrap();
        vol.compact(|_, _| {}).unwrap();
        wal.append(&[1; 60_000]).unwrap();
    }
}

#[test]
fn truncation_to_a_place_that_is_not_a_record_is_refused() {
    let (_d, vol) = sim_volume(8 << 20);
    let wal = Wal::create(vol.clone(), Layout::Dense).unwrap();
    let a = wal.append(&[1; 100]).unwrap();
    let b = wal.append(&[2; 100]).unwrap();
    for bad in [
        Lsn { seq: 1, pos: 7 },
        Lsn { seq: 9, pos: b.pos },
        Lsn {
            seq: 0,
            pos: a.pos + 1,
        },
    ] {
        let e = wal.truncate(bad).err().unwrap();
        assert!(matches!(e, WalError::Invalid(_)), "{bad:?}: {e}");
    }
    wal.truncate(b).unwrap();
    let e = wal.truncate(a).err().unwrap();
    assert!(
        matches!(e, WalError::Invalid(_)),
        "truncated backwards: {e}"
    );
    drop(wal);
    let (_w, got) = open_log(&vol, Layout::Dense).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, b);
}
