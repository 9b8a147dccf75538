//! Chunked payloads (format 5) on the read path: blobs of more than one
//! chunk (the default policy's 32 KiB) are stored as independent chunks
//! behind a table, compressed and raw alike; every sector, every span
//! across chunks and records, and unaligned reads read back as written; a
//! damaged chunk fails the reads of its own sectors (never serving them)
//! while the record's other chunks still read; a damaged table fails them
//! all; and a policy of one frame a blob writes no chunks.

mod common;

use common::{data, rng, sim_volume};
use squeeze_engine::check::check;
use squeeze_engine::{CodecId, EngineError, SimStorage, Storage, Volume};
use squeeze_format::{RecordHeader, RecordScan, Stride, DATA_START};
use std::sync::Arc;

const SECTOR: usize = 4096;
const SEG: u64 = 512 << 10;

/// The extent records of the image: (byte offset, header).
fn extents(s: &SimStorage, uuid: [u8; 16]) -> Vec<(u64, RecordHeader)> {
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

/// A volume holding 1 MiB written in 128 KiB writes: fio-like, text and
/// random blobs in turn (random ones are stored raw). Returns the storage,
/// the volume and the model.
fn written() -> (Arc<SimStorage>, Volume, Vec<u8>) {
    let (s, v) = sim_volume(8 << 20, None);
    let mut r = rng(37);
    let mut model = Vec::new();
    for k in 0..8 {
        let d = data(&mut r, [3, 2, 1][k % 3], 128 << 10);
        v.write(model.len() as u64, &d, false).unwrap();
        model.extend_from_slice(&d);
    }
    v.flush().unwrap();
    (s, v, model)
}

#[test]
fn every_sector_and_every_span_reads_back() {
    let (s, v, model) = written();
    let recs = extents(&s, v.uuid());
    assert_eq!(recs.len(), 8);
    assert!(recs.iter().all(|(_, h)| h.chunk_sectors == 8), "{recs:?}");
    assert!(recs.iter().any(|(_, h)| h.codec == CodecId::Zstd));
    assert!(recs.iter().any(|(_, h)| h.codec == CodecId::None));
    let read = |off: usize, len: usize| {
        let mut b = vec![0u8; len];
        v.read(off as u64, &mut b).unwrap();
        assert!(b == model[off..off + len], "read of {len} at {off}");
    };
    for lba in 0..model.len() / SECTOR {
        read(lba * SECTOR, SECTOR);
    }
    // Across chunks, across records, unaligned, whole records.
    for (off, len) in [
        (28 << 10, 8 << 10),
        (30 << 10, 40 << 10),
        ((30 << 10) + 100, 5000),
        ((124 << 10) + 7, 9000),
        (0, 128 << 10),
        (64 << 10, 256 << 10),
        (0, 1 << 20),
    ] {
        read(off, len);
    }
    let rep = check(&v, |_, _| {});
    assert!(rep.is_clean(), "{rep:?}");
}

#[test]
fn a_damaged_chunk_fails_only_its_own_sectors_and_a_damaged_table_all() {
    let (s, v, model) = written();
    let uuid = v.uuid();
    let (at, h) = extents(&s, uuid)
        .into_iter()
        .find(|(_, h)| h.codec == CodecId::Zstd)
        .unwrap();
    let lba = h.lba as usize;
    let mut head = vec![0u8; 64 + h.table_len()];
    s.read_at(&mut head, at).unwrap();
    let hl = h.header_len();
    let table = squeeze_format::record::chunk_table(&h, &head[hl..]).unwrap();
    // A bit of chunk 1 (the record's sectors 8..16).
    let c = &table.chunks()[1];
    s.flip_bit(at + (hl + c.stored.start + 3) as u64, 2);
    let sector = |i: usize| {
        let mut b = vec![0u8; SECTOR];
        let r = v.read(((lba + i) * SECTOR) as u64, &mut b);
        (r, b)
    };
    for i in 0..32 {
        let (r, b) = sector(i);
        if (8..16).contains(&i) {
            assert!(
                matches!(r, Err(EngineError::Corrupt { .. })),
                "sector {i}: {r:?}"
            );
        } else {
            r.unwrap_or_else(|e| panic!("sector {i}: {e}"));
            assert!(
                b == model[(lba + i) * SECTOR..(lba + i + 1) * SECTOR],
                "sector {i}"
            );
        }
    }
    // A read across the damage fails whole; `check` names the record.
    let mut b = vec![0u8; 128 << 10];
    assert!(v.read((lba * SECTOR) as u64, &mut b).is_err());
    // `check` names exactly the chunk's sectors.
    let rep = check(&v, |_, _| {});
    assert!(!rep.is_clean());
    assert_eq!(rep.damaged_sectors(), 8, "{rep:?}");
    assert_eq!(rep.damaged[0].first_lba, h.lba + 8, "{rep:?}");
    // The table itself: every sector of the record fails.
    s.flip_bit(at + hl as u64 + 1, 0);
    for i in [0, 20, 31] {
        assert!(
            matches!(sector(i).0, Err(EngineError::Corrupt { .. })),
            "sector {i}"
        );
    }
}

#[test]
fn one_frame_a_blob_when_the_policy_says_so() {
    let mut p = squeeze_engine::options::default_policy();
    p.read_chunk = 0;
    let (s, v) = sim_volume(8 << 20, Some(p));
    let d = data(&mut rng(1), 3, 256 << 10);
    v.write(0, &d, false).unwrap();
    v.flush().unwrap();
    let recs = extents(&s, v.uuid());
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().all(|(_, h)| !h.is_chunked()));
    let mut b = vec![0u8; SECTOR];
    v.read(40 << 10, &mut b).unwrap();
    assert!(b == d[40 << 10..44 << 10]);
}
