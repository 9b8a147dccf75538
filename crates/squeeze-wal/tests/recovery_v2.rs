//! Version 2 records that recovery must refuse, laid out by hand: each test
//! leaves a record that differs from the one the chain expects in one thing
//! only that the header does not store (the log, the seq, the epoch), or is
//! damaged or torn, so that it fails if that check is removed. And the
//! header's start epoch, which the chain starts from after a truncation.

mod common;
use common::*;
use squeeze_engine::Volume;
use squeeze_wal::header::Header;
use squeeze_wal::record_v2::RecordHeaderV2;
use squeeze_wal::wal::read_header;
use squeeze_wal::{Layout, Lsn, RecordVersion, Wal, WalError};
use std::sync::Arc;

const AREA: u64 = 4096;

/// How a hand-made record is encoded.
#[derive(Clone, Copy)]
struct Rec {
    log_id: u64,
    seq: u64,
    epoch: u32,
    first: bool,
    store_epoch: bool,
}

impl Rec {
    fn of(h: &Header, seq: u64, epoch: u32) -> Rec {
        Rec {
            log_id: h.log_id,
            seq,
            epoch,
            first: true,
            store_epoch: false,
        }
    }
}

/// Writes record `r` by hand at log position `pos`, keeping the bytes of
/// its sector before it (the rest of that sector zeros).
fn put(vol: &Volume, pos: u64, r: Rec, p: &[u8]) {
    let start = pos / 4096 * 4096;
    let mut b = vec![0u8; (pos - start) as usize];
    vol.read(AREA + start, &mut b).unwrap();
    RecordHeaderV2::new(p.len() as u32, r.seq, r.epoch, r.first, r.store_epoch)
        .encode_into(r.log_id, r.seq, r.epoch, p, &mut b);
    b.resize(b.len().next_multiple_of(4096), 0);
    vol.write(AREA + start, &b, false).unwrap();
}

fn create(vol: &Arc<Volume>, layout: Layout) -> Wal {
    let wal = Wal::create(vol.clone(), layout).unwrap();
    assert_eq!(wal.version(), RecordVersion::V2);
    wal
}

fn reopen(vol: &Arc<Volume>, layout: Layout) -> (Wal, Vec<(Lsn, Vec<u8>)>) {
    open_log(vol, layout).unwrap()
}

#[test]
fn new_logs_are_version_2_and_round_trip() {
    for layout in LAYOUTS {
        let (_d, vol) = sim_volume(8 << 20);
        let wal = create(&vol, layout);
        let mut want = Vec::new();
        for i in 0..40u32 {
            let p = i.to_le_bytes().repeat(i as usize * 20 + 1);
            want.push((wal.append(&p).unwrap(), p));
        }
        // Records of 6- to 13-byte headers, not 40.
        let (_, next) = wal.bounds();
        if layout == Layout::Dense {
            let payload: u64 = want.iter().map(|(_, p)| p.len() as u64).sum();
            assert!(
                next.pos - payload <= 40 * 14,
                "{} header bytes",
                next.pos - payload
            );
        }
        drop(wal);
        assert_eq!(read_header(&vol).unwrap().version, RecordVersion::V2);
        let (wal, got) = reopen(&vol, layout);
        assert_eq!(got, want, "{layout:?}");
        // A second open: the next record stores the new epoch.
        let l = wal.append(b"after").unwrap();
        drop(wal);
        let (_w, got) = reopen(&vol, layout);
        assert_eq!(got.last().unwrap(), &(l, b"after".to_vec()));
    }
}

#[test]
fn a_torn_record_ends_the_log() {
    for layout in LAYOUTS {
        let (_d, vol) = sim_volume(8 << 20);
        let wal = create(&vol, layout);
        wal.append(&[1; 300]).unwrap();
        let last = wal.append(&[2; 300]).unwrap();
        drop(wal);
        // The last record's payload cut short: its second half zeros.
        vol.write(AREA + last.pos + 160, &[0; 150], false).unwrap();
        let (wal, got) = reopen(&vol, layout);
        assert_eq!(got.len(), 1, "{layout:?}");
        assert_eq!(wal.append(b"x").unwrap(), last);
    }
}

#[test]
fn a_record_of_another_log_is_not_applied() {
    let (_d, vol) = sim_volume(8 << 20);
    let wal = create(&vol, Layout::Sparse);
    wal.append(&[1; 10]).unwrap();
    drop(wal);
    let h = read_header(&vol).unwrap();
    // Seq 1 of the current epoch, as the writer would put it, but for
    // another log id: the CRC's seed alone tells them apart.
    let ours = Rec::of(&h, 1, h.epoch);
    put(
        &vol,
        4096,
        Rec {
            log_id: h.log_id ^ 1,
            ..ours
        },
        b"other log",
    );
    let (_w, got) = reopen(&vol, Layout::Sparse);
    assert_eq!(got.len(), 1);
    // The same record of this log is applied (the test's control).
    let (_d, vol) = sim_volume(8 << 20);
    let wal = create(&vol, Layout::Sparse);
    wal.append(&[1; 10]).unwrap();
    drop(wal);
    let h = read_header(&vol).unwrap();
    put(&vol, 4096, Rec::of(&h, 1, h.epoch), b"ours");
    let (_w, got) = reopen(&vol, Layout::Sparse);
    assert_eq!(got.len(), 2);
}

#[test]
fn a_record_of_an_earlier_lap_with_the_same_low_seq_bits_is_not_applied() {
    let (_d, vol) = sim_volume(8 << 20);
    let wal = create(&vol, Layout::Sparse);
    drop(wal);
    // A log whose chain starts at seq 70,000.
    let mut h = read_header(&vol).unwrap();
    h.start_seq = 70_000;
    vol.write(0, &h.encode(), true).unwrap();
    let (wal, _) = reopen(&vol, Layout::Sparse);
    let a = wal.append(&[1; 10]).unwrap();
    assert_eq!(a.seq, 70_000);
    drop(wal);
    let h = read_header(&vol).unwrap();
    let epoch = h.epoch; // the epoch of seq 70,000, as seq 70,001's would be
                         // Seq 70,001 - 256: seq8 and the epoch match, only the seed's seq differs.
    put(
        &vol,
        4096,
        Rec::of(&h, 70_001 - 256, epoch),
        b"an earlier lap",
    );
    let (_w, got) = reopen(&vol, Layout::Sparse);
    assert_eq!(got.len(), 1, "a record of another seq was applied");
    // Control: the right seq is.
    put(&vol, 4096, Rec::of(&h, 70_001, epoch), b"this lap");
    let (_w, got) = reopen(&vol, Layout::Sparse);
    assert_eq!(got.len(), 2);
}

#[test]
fn a_leftover_of_an_older_epoch_is_not_applied_after_newer_records() {
    for store_epoch in [false, true] {
        let (_d, vol) = sim_volume(8 << 20);
        let wal = create(&vol, Layout::Dense);
        // Seq 0 at 0: 11 bytes of header (FIRST, the epoch stored) and 100.
        assert_eq!(wal.append(&[1; 100]).unwrap(), Lsn { seq: 0, pos: 0 });
        drop(wal);
        // The epoch of seq 0, older than seq 1's.
        let old = read_header(&vol).unwrap().epoch;
        let (wal, _) = reopen(&vol, Layout::Dense);
        // The next epoch's seq 1 (12 bytes of header: a two-byte length)
        // ends at 8192.
        let l = wal.append(&vec![5; 8192 - 111 - 12]).unwrap();
        assert_eq!(l, Lsn { seq: 1, pos: 111 });
        assert_eq!(wal.bounds().1, Lsn { seq: 2, pos: 8192 });
        drop(wal);
        // At 8192, seq 2 of the older epoch: the rest of that epoch's torn
        // last group (seq 1 never landed). Not FIRST, unless it stores its
        // epoch.
        let h = read_header(&vol).unwrap();
        let left = Rec {
            first: store_epoch,
            store_epoch,
            ..Rec::of(&h, 2, old)
        };
        put(&vol, 8192, left, b"never acknowledged");
        let (wal, got) = reopen(&vol, Layout::Dense);
        assert_eq!(
            got.len(),
            2,
            "store_epoch {store_epoch}: the older epoch's record was taken for seq 2"
        );
        assert_eq!(wal.bounds().1, Lsn { seq: 2, pos: 8192 });
    }
}

#[test]
fn a_record_of_a_newer_epoch_than_the_header_is_not_applied() {
    let (_d, vol) = sim_volume(8 << 20);
    let wal = create(&vol, Layout::Sparse);
    wal.append(&[1; 10]).unwrap();
    drop(wal);
    let h = read_header(&vol).unwrap();
    let newer = Rec {
        store_epoch: true,
        ..Rec::of(&h, 1, h.epoch + 1)
    };
    put(&vol, 4096, newer, b"from the future");
    let (_w, got) = reopen(&vol, Layout::Sparse);
    assert_eq!(got.len(), 1);
}

#[test]
fn damage_before_a_later_group_is_an_error_in_both_layouts_and_with_many_threads() {
    for layout in LAYOUTS {
        let (_d, vol) = sim_volume(8 << 20);
        let wal = Arc::new(create(&vol, layout));
        // Groups of several records: eight appenders at once.
        let lsns: Vec<Lsn> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8u8)
                .map(|t| {
                    let wal = wal.clone();
                    s.spawn(move || {
                        (0..20u8)
                            .map(|i| wal.append(&[t ^ i; 50]).unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        drop(wal);
        let damaged = lsns.iter().find(|l| l.seq == 30).unwrap();
        vol.write(AREA + damaged.pos + 7, &[0xee; 4], false)
            .unwrap();
        let e = Wal::open(vol.clone(), Some(layout), |_, _| {})
            .err()
            .expect("opened a log with a damaged durable record");
        assert!(
            matches!(&e, WalError::Corrupt(m) if m.contains("record 30")),
            "{layout:?}: {e}"
        );
    }
}

#[test]
fn a_torn_group_left_after_the_end_is_no_false_alarm() {
    let (_d, vol) = sim_volume(8 << 20);
    let wal = create(&vol, Layout::Dense);
    wal.append(&[1; 100]).unwrap(); // seq 0, 111 bytes
    drop(wal);
    let h = read_header(&vol).unwrap();
    let e = h.epoch;
    // A group of seqs 1 and 2 whose first never landed: seq 2 (not FIRST)
    // lies after the end, and so does an old FIRST record of seq 0.
    let second = Rec {
        first: false,
        ..Rec::of(&h, 2, e)
    };
    put(&vol, 8192, second, b"the rest of a torn group");
    put(&vol, 3 * 4096, Rec::of(&h, 0, e), b"an old seq");
    let (_w, got) = reopen(&vol, Layout::Dense);
    assert_eq!(got.len(), 1);
}

#[test]
fn the_chain_starts_from_the_header_s_start_epoch_after_a_truncation() {
    for layout in LAYOUTS {
        let (_d, vol) = sim_volume(8 << 20);
        let mut lsns = Vec::new();
        // Three opens, three records each: only the first of each open
        // stores its epoch.
        for open in 0..3u8 {
            let wal = if open == 0 {
                create(&vol, layout)
            } else {
                reopen(&vol, layout).0
            };
            for i in 0..3u8 {
                lsns.push(wal.append(&[open * 10 + i; 64]).unwrap());
            }
        }
        // Truncate to a record that does not store its epoch (the second of
        // the second open), then to the first of the third, then to the end.
        let mut from = 0;
        for k in [4, 6, 9] {
            let (wal, got) = reopen(&vol, layout);
            let have: Vec<Lsn> = got.iter().map(|(l, _)| *l).collect();
            assert_eq!(have, lsns[from..], "{layout:?}: truncated to {from}");
            let to = if k < 9 { lsns[k] } else { wal.bounds().1 };
            wal.truncate(to).unwrap();
            drop(wal);
            from = k;
        }
        let (wal, got) = reopen(&vol, layout);
        assert!(got.is_empty());
        drop(wal);
        // And the log goes on after the last truncation.
        let (wal, _) = reopen(&vol, layout);
        let l = wal.append(b"more").unwrap();
        drop(wal);
        let (_w, got) = reopen(&vol, layout);
        assert_eq!(got, vec![(l, b"more".to_vec())]);
    }
}
