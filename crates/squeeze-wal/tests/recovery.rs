//! One test per row of the recovery decision table (src/recovery.rs),
//! with the log's bytes laid out by hand where a crash would have to be
//! lucky to leave them so. The rows that need no hand-made record run on
//! logs of both record versions; the hand-made records here are version
//! 1's, on version 1 logs (the logs of earlier releases, which must still
//! open and recover); `recovery_v2.rs` makes version 2's.

mod common;
use common::*;
use squeeze_engine::Volume;
use squeeze_wal::header::Header;
use squeeze_wal::record::RecordHeader;
use squeeze_wal::wal::read_header;
use squeeze_wal::{Layout, Lsn, RecordVersion, Wal, WalError};
use std::sync::Arc;

const AREA: u64 = 4096;

/// Writes a record of `h`'s log by hand at log position `pos`, in a
/// sector of its own (the rest of that sector zeros).
fn put_record(vol: &Volume, h: &Header, pos: u64, seq: u64, group: u64, epoch: u32, p: &[u8]) {
    let start = pos / 4096 * 4096;
    let mut b = vec![0u8; (pos - start) as usize];
    vol.read(AREA + start, &mut b).unwrap();
    RecordHeader {
        log_id: h.log_id,
        seq,
        group,
        epoch,
        len: p.len() as u32,
    }
    .encode_into(p, &mut b);
    b.resize(b.len().next_multiple_of(4096), 0);
    vol.write(AREA + start, &b, false).unwrap();
}

const VERSIONS: [RecordVersion; 2] = [RecordVersion::V1, RecordVersion::V2];

fn create(vol: &Arc<Volume>, layout: Layout, version: RecordVersion) -> Wal {
    let wal = Wal::create_with(vol.clone(), layout, version).unwrap();
    assert_eq!(wal.version(), version);
    wal
}

fn reopen(vol: &Arc<Volume>, layout: Layout) -> (Wal, Vec<(Lsn, Vec<u8>)>) {
    open_log(vol, layout).unwrap()
}

#[test]
fn records_in_order_are_applied() {
    for (layout, version) in LAYOUTS.into_iter().flat_map(|l| VERSIONS.map(|v| (l, v))) {
        let (_d, vol) = sim_volume(8 << 20);
        let wal = create(&vol, layout, version);
        let lsns: Vec<Lsn> = (0..50u8).map(|i| wal.append(&[i; 300]).unwrap()).collect();
        drop(wal);
        let (_w, got) = reopen(&vol, layout);
        assert_eq!(got.iter().map(|(l, _)| *l).collect::<Vec<_>>(), lsns);
    }
}

#[test]
fn a_torn_last_record_ends_the_log() {
    for (layout, version) in LAYOUTS.into_iter().flat_map(|l| VERSIONS.map(|v| (l, v))) {
        let (_d, vol) = sim_volume(8 << 20);
        let wal = create(&vol, layout, version);
        wal.append(&[1; 300]).unwrap();
        let last = wal.append(&[2; 300]).unwrap();
        drop(wal);
        // Damage the last record's payload (as a torn write would).
        let at = AREA + last.pos + 100;
        let mut b = [0u8; 1];
        vol.read(at, &mut b).unwrap();
        vol.write(at, &[b[0] ^ 0xff], false).unwrap();
        let (wal, got) = reopen(&vol, layout);
        assert_eq!(got.len(), 1, "{layout:?} {version:?}");
        // The next append takes the torn record's seq and place.
        let again = wal.append(&[3; 10]).unwrap();
        assert_eq!(again, last);
        drop(wal);
        let (_w, got) = reopen(&vol, layout);
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].1, vec![3; 10]);
    }
}

#[test]
fn a_sparse_group_starts_at_the_next_sector() {
    let (_d, vol) = sim_volume(8 << 20);
    let wal = create(&vol, Layout::Sparse, RecordVersion::V1);
    let a = wal.append(&[1; 10]).unwrap();
    drop(wal);
    let h = read_header(&vol).unwrap();
    // Seq 1 at the next sector, as the sparse writer puts a new group.
    put_record(&vol, &h, 4096, 1, 1, h.epoch, b"second");
    let (_w, got) = reopen(&vol, Layout::Sparse);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0, a);
    assert_eq!(got[1].0, Lsn { seq: 1, pos: 4096 });
    // A dense log does not look there.
    let (_d, vol) = sim_volume(8 << 20);
    let wal = create(&vol, Layout::Dense, RecordVersion::V1);
    wal.append(&[1; 10]).unwrap();
    drop(wal);
    let h = read_header(&vol).unwrap();
    put_record(&vol, &h, 4096, 1, 1, h.epoch, b"second");
    let (_w, got) = reopen(&vol, Layout::Dense);
    assert_eq!(got.len(), 1);
}

#[test]
fn a_record_of_an_older_epoch_after_the_end_is_not_applied() {
    let (_d, vol) = sim_volume(8 << 20);
    let wal = create(&vol, Layout::Dense, RecordVersion::V1);
    wal.append(&[1; 100]).unwrap(); // seq 0 at 0, 140 bytes
    drop(wal);
    let h = read_header(&vol).unwrap();
    // The torn last group of that epoch: seq 1 never landed, seq 2 did.
    put_record(&vol, &h, 8192, 2, 1, h.epoch, b"never acknowledged");
    let (wal, got) = reopen(&vol, Layout::Dense);
    assert_eq!(got.len(), 1);
    // The next epoch's seq 1 ends exactly where the leftover seq 2 lies.
    let l = wal.append(&vec![5; 8192 - 140 - 40]).unwrap();
    assert_eq!(l, Lsn { seq: 1, pos: 140 });
    drop(wal);
    let (wal, got) = reopen(&vol, Layout::Dense);
    assert_eq!(got.len(), 2, "the older epoch's record was taken for seq 2");
    assert_eq!(wal.bounds().1, Lsn { seq: 2, pos: 8192 });
}

#[test]
fn a_record_of_another_log_is_not_applied() {
    let (_d, vol) = sim_volume(8 << 20);
    let wal = create(&vol, Layout::Sparse, RecordVersion::V1);
    wal.append(&[1; 10]).unwrap();
    drop(wal);
    let mut other = read_header(&vol).unwrap();
    other.log_id ^= 1;
    put_record(&vol, &other, 4096, 1, 1, other.epoch, b"other log");
    let (_w, got) = reopen(&vol, Layout::Sparse);
    assert_eq!(got.len(), 1);
}

#[test]
fn the_log_wraps_to_the_start_of_its_area() {
    for (layout, version) in LAYOUTS.into_iter().flat_map(|l| VERSIONS.map(|v| (l, v))) {
        let (_d, vol) = sim_volume(64 << 10); // 15 sectors of area
        let wal = create(&vol, layout, version);
        let mut all = Vec::new();
        for i in 0..250u32 {
            let lsn = wal.append(&i.to_le_bytes().repeat(300)).unwrap();
            all.push(lsn);
            if all.len() > 5 {
                wal.truncate(all[all.len() - 5]).unwrap();
            }
        }
        let (head, next) = wal.bounds();
        assert!(
            next.pos > 4 * 15 * 4096,
            "{layout:?} {version:?}: never wrapped"
        );
        drop(wal);
        let (_w, got) = reopen(&vol, layout);
        assert_eq!(got.first().unwrap().0, head);
        assert_eq!(got.len(), 5);
        assert_eq!(got.last().unwrap().1, 249u32.to_le_bytes().repeat(300));
    }
}

#[test]
fn damage_before_a_later_group_is_an_error_not_the_end() {
    for (layout, version) in LAYOUTS.into_iter().flat_map(|l| VERSIONS.map(|v| (l, v))) {
        let (_d, vol) = sim_volume(8 << 20);
        let wal = create(&vol, layout, version);
        let lsns: Vec<Lsn> = (0..20u8).map(|i| wal.append(&[i; 300]).unwrap()).collect();
        drop(wal);
        // Overwrite record 5's header through the volume (the engine's
        // checksums see nothing wrong: another writer's damage).
        let at = AREA + lsns[5].pos + 8;
        vol.write(at, &[0xee; 8], false).unwrap();
        let e = Wal::open(vol.clone(), Some(layout), |_, _| {})
            .err()
            .expect("opened a log with a damaged durable record");
        assert!(
            matches!(&e, WalError::Corrupt(m) if m.contains("record 5")),
            "{layout:?} {version:?}: {e}"
        );
    }
}
