//! Recovery's decision table (crates/squeeze-engine/src/meta/recovery.rs),
//! one test per row: a valid record is applied; a gap left by a write that
//! never completed is passed over, and the records after it are applied
//! (a killed process loses only what was in flight); a torn tail ends
//! replay; the log is followed across segments; a clean close replays
//! nothing.

mod common;
use common::*;
use squeeze_engine::{OpenOptions, SimStorage, Storage, Volume};
use squeeze_format::RecordHeader;
use std::sync::Arc;

fn find_record(s: &SimStorage, uuid: [u8; 16], lba: u64) -> Option<u64> {
    let len = s.len().unwrap();
    let mut buf = vec![0u8; len as usize];
    s.read_at(&mut buf, 0).unwrap();
    let mut off = 1 << 20;
    let mut found = None;
    while off + 64 <= len {
        if let Ok(h) = RecordHeader::decode(&buf[off as usize..off as usize + 64], &uuid) {
            if h.uuid == uuid && h.lba == lba && h.kind.has_payload() {
                found = Some(off); // the newest one wins
            }
        }
        off += 16;
    }
    found
}

fn open(s: SimStorage) -> Volume {
    Volume::open(Arc::new(s), OpenOptions::default()).unwrap()
}

fn read(v: &Volume, lba: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    v.read(lba * 4096, &mut b).unwrap();
    b
}

#[test]
fn a_gap_from_an_unfinished_write_is_passed_over() {
    let (s, v) = sim_volume(16 << 20, None);
    let uuid = v.uuid();
    v.write(0, &[1u8; 4096], true).unwrap();
    // Three unflushed writes; the middle one's record never reaches the file.
    v.write(4096, &[2u8; 4096], false).unwrap();
    v.write(8192, &[3u8; 4096], false).unwrap();
    v.write(12288, &[4u8; 4096], false).unwrap();
    let img = s.kill();
    drop(v);
    let off = find_record(&img, uuid, 2).expect("record of LBA 2");
    // The whole record, and no byte of the next (a sector of one byte value
    // is a record of 48 bytes since format 6's block payloads).
    let mut hdr = [0u8; 64];
    img.read_at(&mut hdr, off).unwrap();
    let len = RecordHeader::decode(&hdr, &uuid).unwrap().record_len() as usize;
    img.write_at(&vec![0u8; len], off).unwrap();
    let v = open(img);
    assert_eq!(read(&v, 0), vec![1u8; 4096]);
    assert_eq!(read(&v, 1), vec![2u8; 4096]);
    assert_eq!(
        read(&v, 2),
        vec![0u8; 4096],
        "the unfinished write is not there"
    );
    assert_eq!(
        read(&v, 3),
        vec![4u8; 4096],
        "the write after the gap survives"
    );
    v.verify_accounting().unwrap();
}

#[test]
fn a_killed_process_loses_nothing_it_wrote() {
    let (s, v) = sim_volume(64 << 20, None);
    let mut r = rng(31);
    let d = data(&mut r, 3, 12 << 20); // spans several 512 KiB segments
    v.write(0, &d, false).unwrap();
    let img = s.kill();
    drop(v);
    let v = open(img);
    let mut back = vec![0u8; d.len()];
    v.read(0, &mut back).unwrap();
    assert!(back == d, "replay followed the log across segments");
}

#[test]
fn a_torn_tail_ends_replay_and_the_volume_goes_on() {
    let (s, v) = sim_volume(16 << 20, None);
    let uuid = v.uuid();
    v.write(0, &[1u8; 4096], true).unwrap();
    v.write(4096, &[2u8; 8192], false).unwrap();
    let img = s.kill();
    drop(v);
    let off = find_record(&img, uuid, 1).expect("record");
    // Tear the payload: the header is valid, the payload CRC is not.
    let mut hdr = [0u8; 64];
    img.read_at(&mut hdr, off).unwrap();
    let h = RecordHeader::decode(&hdr, &uuid).unwrap();
    img.write_at(&[0xffu8; 8], off + h.header_len() as u64 + 2)
        .unwrap();
    let v = open(img);
    assert_eq!(read(&v, 0), vec![1u8; 4096]);
    assert_eq!(read(&v, 1), vec![0u8; 4096]);
    v.write(4096, &[5u8; 4096], true).unwrap();
    assert_eq!(read(&v, 1), vec![5u8; 4096]);
}

#[test]
fn a_clean_close_replays_nothing_and_reopens_fast() {
    let (s, v) = sim_volume(16 << 20, None);
    v.write(0, &[9u8; 65536], false).unwrap();
    v.close().unwrap();
    let v = reopen(&s);
    assert_eq!(read(&v, 15), vec![9u8; 4096]);
    assert!(!v.superblock().clean, "an open volume is marked dirty");
}
