//! Logs of record version 1 (written before issue 37's version 2) open,
//! recover and go on in their version: one laid out byte by byte from the
//! format as documented (a fixture that owes nothing to the kept writer),
//! and one made by the writer kept for them (`Wal::create_with`).

mod common;
use common::*;
use squeeze_wal::wal::read_header;
use squeeze_wal::{Layout, Lsn, RecordVersion, Wal};
use std::sync::Arc;

const AREA: u64 = 4096;
const LOG_ID: u64 = 0x5eed_0000_1234_5679;

/// A version 1 log header (docs: src/header.rs), by hand.
fn v1_header(layout: u32, epoch: u32, area_bytes: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[0..8].copy_from_slice(b"SQZWAL\0\0");
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    b[12..16].copy_from_slice(&layout.to_le_bytes());
    b[16..24].copy_from_slice(&LOG_ID.to_le_bytes());
    b[24..28].copy_from_slice(&epoch.to_le_bytes());
    b[32..40].copy_from_slice(&4096u64.to_le_bytes());
    b[40..48].copy_from_slice(&area_bytes.to_le_bytes());
    // start_pos, start_seq: 0
    let crc = crc32c::crc32c(&b[..64]);
    b[64..68].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A version 1 record (docs: src/record.rs), by hand.
fn v1_record(seq: u64, group: u64, epoch: u32, p: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"SWR1");
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&LOG_ID.to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&group.to_le_bytes());
    b.extend_from_slice(&epoch.to_le_bytes());
    b.extend_from_slice(&(p.len() as u32).to_le_bytes());
    b.extend_from_slice(p);
    let crc = crc32c::crc32c(&b[8..]);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn a_version_1_log_laid_out_by_hand_opens_recovers_and_goes_on_in_version_1() {
    for layout in LAYOUTS {
        let (_d, vol) = sim_volume(8 << 20);
        let area_bytes = (8 << 20) - AREA;
        vol.write(0, &v1_header(layout.code(), 3, area_bytes), true)
            .unwrap();
        // Epoch 2 wrote group 0 (seqs 0, 1); epoch 3 group 2 (seq 2).
        let recs = [(0u64, 0u64, 2u32), (1, 0, 2), (2, 2, 3)];
        let mut want = Vec::new();
        let mut pos = 0u64;
        let mut bytes = Vec::new();
        for (seq, group, epoch) in recs {
            if layout == Layout::Sparse && seq == group && !pos.is_multiple_of(4096) {
                pos = pos.next_multiple_of(4096);
                bytes.resize(pos as usize, 0);
            }
            let p = format!("record {seq}").into_bytes();
            let r = v1_record(seq, group, epoch, &p);
            want.push((Lsn { seq, pos }, p));
            bytes.extend_from_slice(&r);
            pos += r.len() as u64;
        }
        bytes.resize(bytes.len().next_multiple_of(4096), 0);
        vol.write(AREA, &bytes, true).unwrap();

        let (wal, got) = open_log(&vol, layout).unwrap();
        assert_eq!(got, want, "{layout:?}");
        assert_eq!(wal.version(), RecordVersion::V1);
        // The log stays version 1: its header, and the records it appends.
        let l = wal.append(b"appended").unwrap();
        drop(wal);
        let h = read_header(&vol).unwrap();
        assert_eq!(
            (h.version, h.start_epoch, h.epoch),
            (RecordVersion::V1, 0, 4)
        );
        let mut b = [0u8; 40];
        vol.read(AREA + l.pos, &mut b).unwrap();
        assert_eq!(&b[..4], b"SWR1");
        assert_eq!(b[8..16], LOG_ID.to_le_bytes());
        let (_w, got) = open_log(&vol, layout).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[3], (l, b"appended".to_vec()));
    }
}

#[test]
fn a_version_1_log_of_the_kept_writer_round_trips_with_threads_and_truncation() {
    for layout in LAYOUTS {
        let (_d, vol) = sim_volume(64 << 10); // 15 sectors: the ring wraps
        let wal = Arc::new(Wal::create_with(vol.clone(), layout, RecordVersion::V1).unwrap());
        let mut all: Vec<Lsn> = Vec::new();
        for round in 0..80u8 {
            let lsns: Vec<Lsn> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4u8)
                    .map(|t| {
                        let wal = wal.clone();
                        s.spawn(move || wal.append(&[round ^ t; 200]).unwrap())
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            all.extend(lsns);
            all.sort();
            if all.len() > 8 {
                wal.truncate(all[all.len() - 8]).unwrap();
            }
        }
        let (head, next) = wal.bounds();
        assert!(next.pos > 15 * 4096, "{layout:?}: never wrapped");
        drop(wal);
        let (wal, got) = open_log(&vol, layout).unwrap();
        assert_eq!(wal.version(), RecordVersion::V1);
        assert_eq!(got.first().unwrap().0, head);
        assert_eq!(
            got.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
            all[all.len() - 8..].to_vec()
        );
        assert_eq!(wal.bounds().1, next);
    }
}
