//! Block payloads (format 6): small zstd frames are stored as the body of
//! their one block (chunk code 6), read back sector by sector and whole,
//! survive a crash (replayed from the log) and a compaction (copied as
//! they are), and `check` finds them clean; a damaged one fails its reads.

mod common;

use common::{rng, sim_volume};
use rand::Rng;
use squeeze_engine::check::check;
use squeeze_engine::{OpenOptions, SimStorage, Storage, Volume};
use squeeze_format::{RecordHeader, RecordScan, Stride, DATA_START};
use std::sync::Arc;

const SECTOR: usize = 4096;
const SEG: u64 = 512 << 10;

/// The extent and relocation records of the image: (byte offset, header).
fn records(s: &SimStorage, uuid: [u8; 16]) -> Vec<(u64, RecordHeader)> {
    let len = s.len().unwrap();
    let mut img = vec![0u8; (len - DATA_START) as usize];
    s.read_at(&mut img, DATA_START).unwrap();
    let mut out = Vec::new();
    for (k, seg) in img.chunks(SEG as usize).enumerate() {
        for r in RecordScan::new(seg, uuid, Stride::Record) {
            if r.header.kind.has_payload() {
                out.push((DATA_START + k as u64 * SEG + r.offset as u64, r.header));
            }
        }
    }
    out
}

/// Sectors like a sparse log's commits: `len` bytes (half random, half a
/// repeat), then zeros.
fn commit(r: &mut impl Rng, len: usize) -> Vec<u8> {
    let half: Vec<u8> = (0..len / 2).map(|_| r.gen()).collect();
    let mut s = half.clone();
    s.extend_from_slice(&half);
    s.resize(SECTOR, 0);
    s
}

fn read_all(v: &Volume, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    v.read(0, &mut b).unwrap();
    b
}

#[test]
fn small_frames_are_block_payloads_that_read_back_after_a_crash_and_a_compaction() {
    let (s, v) = sim_volume(4 << 20, None);
    let mut r = rng(61);
    let mut model = Vec::new();
    for k in 0..64 {
        let c = commit(&mut r, 64 + 32 * (k % 8));
        v.write(model.len() as u64, &c, false).unwrap();
        v.flush().unwrap();
        model.extend_from_slice(&c);
    }
    let recs = records(&s, v.uuid());
    assert_eq!(recs.len(), 64);
    assert!(
        recs.iter().all(|(_, h)| h.block && h.sectors == 1),
        "{recs:?}"
    );
    for lba in 0..64 {
        let mut b = vec![0u8; SECTOR];
        v.read(lba * SECTOR as u64, &mut b).unwrap();
        assert!(
            b[..] == model[lba as usize * SECTOR..][..SECTOR],
            "lba {lba}"
        );
    }
    assert!(read_all(&v, model.len()) == model);
    // A crash after the flushes: replay finds every block payload.
    let crashed = Arc::new(s.crash(&mut r));
    drop(v);
    let v = Volume::open(crashed.clone(), OpenOptions::default()).unwrap();
    assert!(read_all(&v, model.len()) == model);
    let rep = check(&v, |_, _| {});
    assert!(rep.is_clean(), "{rep:?}");
    // A compaction copies them as they are.
    v.compact(|_, _| {}).unwrap();
    assert!(read_all(&v, model.len()) == model);
    v.close().unwrap();
    let v = Volume::open(crashed.clone(), OpenOptions::default()).unwrap();
    assert!(read_all(&v, model.len()) == model);
    let recs = records(&crashed, v.uuid());
    assert!(recs.iter().filter(|(_, h)| h.block).count() >= 64);
}

#[test]
fn a_damaged_block_payload_fails_its_read() {
    let (s, v) = sim_volume(4 << 20, None);
    let mut r = rng(62);
    let c0 = commit(&mut r, 128);
    let c1 = commit(&mut r, 128);
    v.write(0, &c0, false).unwrap();
    v.write(SECTOR as u64, &c1, false).unwrap();
    v.flush().unwrap();
    let recs = records(&s, v.uuid());
    let (off, h) = recs.iter().find(|(_, h)| h.lba == 0).unwrap();
    assert!(h.block);
    // Flip a byte of the body.
    let at = off + h.header_len() as u64 + 10;
    let mut b = [0u8; 1];
    s.read_at(&mut b, at).unwrap();
    s.write_at(&[b[0] ^ 0x40], at).unwrap();
    let mut out = vec![0u8; SECTOR];
    assert!(v.read(0, &mut out).is_err());
    v.read(SECTOR as u64, &mut out).unwrap();
    assert!(out == c1);
}
