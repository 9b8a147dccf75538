//! The merger: windows fragmented by small overwrites are rewritten as whole
//! blobs without changing a byte clients read (windows with a few small
//! overwrites are left to the cleaner), the stored size falls back
//! towards that of sequential writes, merging races safely with client
//! writes (also across a reopen), a corrupt record keeps its window out of
//! it, and a volume whose clients go idle merges by itself.

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::{
    default_policy, storage::Storage, EngineError, OpenOptions, SimStorage, Volume, SECTOR_SIZE,
};
use squeeze_format::RecordHeader;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const S: u64 = SECTOR_SIZE as u64;
/// Sectors per window with the default policy (128 KiB blobs).
const W: u64 = 32;

/// Writes `len` bytes of fio-like data in 128 KiB requests, then overwrites
/// 12 random sectors of every third window with fresh data (fragmented
/// enough to merge) and 2 of the next window (not enough). Returns the
/// model and the heavily overwritten windows.
fn fragment(v: &Volume, seed: u64, len: usize) -> (Vec<u8>, BTreeSet<u64>) {
    let mut r = rng(seed);
    let mut model = data(&mut r, 3, len);
    for (k, c) in model.chunks(128 << 10).enumerate() {
        v.write((k as u64) << 17, c, false).unwrap();
    }
    let mut heavy = BTreeSet::new();
    for win in 0..len as u64 / S / W {
        let n = match win % 3 {
            0 => 12,
            1 => 2,
            _ => 0,
        };
        let mut lbas = BTreeSet::new();
        while lbas.len() < n {
            lbas.insert(win * W + r.gen_range(0..W));
        }
        for lba in lbas {
            let d = data(&mut r, 3, SECTOR_SIZE);
            v.write(lba * S, &d, false).unwrap();
            model[(lba * S) as usize..((lba + 1) * S) as usize].copy_from_slice(&d);
        }
        if n == 12 {
            heavy.insert(win);
        }
    }
    (model, heavy)
}

fn read_all(v: &Volume, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    v.read(0, &mut b).unwrap();
    b
}

#[test]
fn merge_rewrites_fragmented_windows_as_whole_blobs() {
    let (s, v) = sim_volume(64 * MIB, Some(default_policy()));
    let len = 4 * MIB as usize;
    let (model, touched) = fragment(&v, 7, len);
    let before = v.stats();
    let rep = v.merge(|_, _| {}).unwrap();
    assert_eq!(rep.windows, touched.len() as u64, "{rep:?}");
    assert_eq!(rep.sectors, touched.len() as u64 * W, "{rep:?}");
    assert_eq!(rep.corrupt_windows, 0);
    let after = v.stats();
    assert_eq!(after.merged_bytes, rep.sectors * S);
    assert_eq!(after.merge_bytes_written, rep.bytes_written);
    // Merging is not client data: write amplification counts it as extra.
    assert_eq!(after.bytes_written, before.bytes_written);
    assert!(after.write_amplification > before.write_amplification);
    // 4 KiB records compressed alone cost more than the same sectors in a
    // 128 KiB blob: the live records shrink.
    assert!(
        after.stored_bytes < before.stored_bytes,
        "stored {} -> {}",
        before.stored_bytes,
        after.stored_bytes
    );
    assert!(read_all(&v, len) == model);
    v.verify_accounting().unwrap();
    // Nothing is left to merge.
    let again = v.merge(|_, _| {}).unwrap();
    assert_eq!(again.windows, 0, "{again:?}");
    // The replaced records are garbage the cleaner frees.
    v.compact(|_, _| {}).unwrap();
    let compacted = v.stats();
    assert!(compacted.physical_bytes < before.physical_bytes);
    drop(v);
    let v = reopen(&s);
    assert!(read_all(&v, len) == model);
    v.verify_accounting().unwrap();
    assert_eq!(v.stats().merged_bytes, rep.sectors * S);
}

#[test]
fn whole_blobs_and_holes_are_left_alone() {
    let (_s, v) = sim_volume(64 * MIB, Some(default_policy()));
    let mut r = rng(3);
    // Sequential 128 KiB writes, an unaligned 128 KiB write, a trimmed hole.
    let d = data(&mut r, 3, 2 * MIB as usize);
    v.write(0, &d, false).unwrap();
    let u = data(&mut r, 3, 128 << 10);
    v.write(3 * MIB + (64 << 10), &u, false).unwrap();
    v.trim(256 << 10, 8192, false).unwrap();
    let rep = v.merge(|_, _| {}).unwrap();
    assert_eq!(rep.windows, 0, "{rep:?}");
    assert_eq!(v.stats().merged_bytes, 0);
}

#[test]
fn merge_races_with_client_writes() {
    let (s, v) = sim_volume(64 * MIB, Some(default_policy()));
    let len = 2 * MIB as usize;
    let (model, _) = fragment(&v, 11, len);
    let v = Arc::new(v);
    let model = Arc::new(parking_lot::Mutex::new(model));
    // Writers own the sectors of their residue mod 3, so the final content
    // of every sector is known; the merger works across all of them.
    let writers: Vec<_> = (0..3u64)
        .map(|t| {
            let v = v.clone();
            let model = model.clone();
            std::thread::spawn(move || {
                let mut r = rng(100 + t);
                for _ in 0..400 {
                    let lba = r.gen_range(0..len as u64 / S / 3) * 3 + t;
                    let d = data(&mut r, 3, SECTOR_SIZE);
                    v.write(lba * S, &d, false).unwrap();
                    model.lock()[(lba * S) as usize..((lba + 1) * S) as usize].copy_from_slice(&d);
                }
            })
        })
        .collect();
    let merger = {
        let v = v.clone();
        std::thread::spawn(move || {
            let mut windows = 0;
            for _ in 0..20 {
                windows += v.merge(|_, _| {}).unwrap().windows;
                v.clean_pass().unwrap();
            }
            windows
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    let windows = merger.join().unwrap();
    assert!(windows > 0);
    let model = model.lock().clone();
    assert!(read_all(&v, len) == model);
    v.verify_accounting().unwrap();
    let v = Arc::into_inner(v).unwrap();
    v.flush().unwrap();
    drop(v);
    let v = reopen(&s);
    assert!(read_all(&v, len) == model, "after replay");
    v.verify_accounting().unwrap();
}

/// Finds the record that starts at `lba`, newest first.
fn find_newest_record(s: &SimStorage, uuid: [u8; 16], lba: u64) -> u64 {
    let len = s.len().unwrap();
    let mut buf = vec![0u8; len as usize];
    s.read_at(&mut buf, 0).unwrap();
    let mut best: Option<(u64, u64)> = None;
    let mut off = 1 << 20;
    while off + 64 <= len {
        if let Ok(h) = RecordHeader::decode(&buf[off as usize..off as usize + 64], &uuid) {
            if h.uuid == uuid
                && h.lba == lba
                && h.kind.has_payload()
                && best.is_none_or(|b| h.seq > b.1)
            {
                best = Some((off, h.seq));
            }
        }
        off += 16;
    }
    best.expect("record").0
}

#[test]
fn a_corrupt_record_keeps_its_window_out_of_the_merge() {
    let (s, v) = sim_volume(64 * MIB, Some(default_policy()));
    let mut r = rng(5);
    let len = MIB as usize;
    let mut model = data(&mut r, 3, len);
    v.write(0, &model, false).unwrap();
    // Eight small overwrites in window 0 (LBA 5 among them) and in window 2.
    for lba in (0..8)
        .map(|i| i * 3 + 2)
        .chain((0..8).map(|i| 2 * W + i * 3 + 1))
    {
        let d = data(&mut r, 3, SECTOR_SIZE);
        v.write(lba * S, &d, false).unwrap();
        model[(lba * S) as usize..((lba + 1) * S) as usize].copy_from_slice(&d);
    }
    let uuid = v.uuid();
    v.close().unwrap();
    let off = find_newest_record(&s, uuid, 5);
    s.flip_bit(off + 64 + 40, 2);
    let v = reopen(&s);
    let rep = v.merge(|_, _| {}).unwrap();
    assert_eq!(rep.corrupt_windows, 1, "{rep:?}");
    assert_eq!(rep.windows, 1, "{rep:?}");
    // The damaged sector is still reported, never rewritten as data ...
    let mut b = vec![0u8; SECTOR_SIZE];
    let e = v.read(5 * S, &mut b).expect_err("checksum error");
    assert!(matches!(e, EngineError::Corrupt { lba: 5, .. }), "{e}");
    // ... and everything else reads as written.
    let mut rest = vec![0u8; len - 6 * SECTOR_SIZE];
    v.read(6 * S, &mut rest).unwrap();
    assert!(rest[..] == model[6 * SECTOR_SIZE..]);
}

#[test]
fn idle_clients_get_their_ratio_back() {
    let (s, v) = sim_volume(64 * MIB, Some(default_policy()));
    let len = 4 * MIB as usize;
    let (model, touched) = fragment(&v, 9, len);
    v.close().unwrap();
    let v = Volume::open(
        s.clone(),
        OpenOptions {
            background: true,
            ..Default::default()
        },
    )
    .unwrap();
    // No client request: after a second the maintenance thread merges
    // every fragmented window.
    let want = touched.len() as u64 * W * S;
    let t0 = Instant::now();
    while v.stats().merged_bytes < want {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "merged {} of {want} bytes after a minute idle",
            v.stats().merged_bytes
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The idle cleaner may have split a window again (relocating the live
    // runs of a partly dead blob) and the merger merge it once more: the
    // sweep is over when the count stops moving.
    let mut last = (v.stats().merged_bytes, Instant::now());
    while last.1.elapsed() < Duration::from_millis(1500) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "merging never settled"
        );
        std::thread::sleep(Duration::from_millis(50));
        let now = v.stats().merged_bytes;
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    assert!(read_all(&v, len) == model);
    drop(v);
    let v = reopen(&s);
    assert!(read_all(&v, len) == model);
    assert_eq!(v.merge(|_, _| {}).unwrap().windows, 0);
}
