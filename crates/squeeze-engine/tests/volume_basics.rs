//! Reads return what was written, at any offset and length, across
//! compression choices, zero runs, trims and a clean reopen.

mod common;
use common::*;
use squeeze_engine::{default_policy, CodecId, CompressionMode, FileStorage, OpenOptions, Volume};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

#[test]
fn aligned_and_unaligned_round_trip() {
    let (s, v) = sim_volume(16 * MIB, None);
    let mut r = rng(1);
    let mut model = vec![0u8; 16 * MIB as usize];
    for k in 0..200 {
        let off = r.gen_range(0..16 * MIB - 300_000);
        let len = r.gen_range(1..300_000usize);
        let d = data(&mut r, k % 4, len);
        v.write(off, &d, k % 7 == 0).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&d);
        let mut back = vec![0u8; len];
        v.read(off, &mut back).unwrap();
        assert!(back == d, "read-back after write {k}");
    }
    let mut all = vec![0u8; model.len()];
    v.read(0, &mut all).unwrap();
    assert!(all == model);
    v.verify_accounting().unwrap();
    v.close().unwrap();
    let v = reopen(&s);
    let mut all = vec![0u8; model.len()];
    v.read(0, &mut all).unwrap();
    assert!(all == model, "after reopen");
    v.verify_accounting().unwrap();
}

use rand::Rng;

#[test]
fn shared_buffer_writes_match_copied_writes() {
    // write_shared hands sub-ranges of one buffer to the compression
    // engine without a copy; what reads back must be what write() gives,
    // aligned or not, across batch boundaries (requests over 4 MiB).
    let (_s, v) = sim_volume(32 * MIB, None);
    let mut r = rng(11);
    let mut model = vec![0u8; 32 * MIB as usize];
    let big = Arc::new(data(&mut r, 0, 12 * MIB as usize));
    for k in 0..60 {
        let len = if k % 10 == 0 {
            r.gen_range(4 * MIB as usize..9 * MIB as usize)
        } else {
            r.gen_range(1..300_000usize)
        };
        let start = if k % 3 == 0 {
            r.gen_range(0..big.len() - len) / 4096 * 4096
        } else {
            r.gen_range(0..big.len() - len)
        };
        let off = if k % 2 == 0 {
            r.gen_range(0..32 * MIB - len as u64) / 4096 * 4096
        } else {
            r.gen_range(0..32 * MIB - len as u64)
        };
        v.write_shared(off, &big, start..start + len, k % 9 == 0)
            .unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&big[start..start + len]);
    }
    let mut all = vec![0u8; model.len()];
    v.read(0, &mut all).unwrap();
    assert!(all == model);
    v.verify_accounting().unwrap();
    // A range outside the buffer is an error, not a panic.
    let e = v.write_shared(0, &big, big.len() - 10..big.len() + 10, false);
    assert!(e.unwrap_err().to_string().contains("outside a buffer"));
}

#[test]
fn every_codec_and_mode() {
    for codec in CodecId::ALL {
        for mode in CompressionMode::ALL {
            let mut p = default_policy();
            p.codec = codec;
            p.mode = mode;
            p.max_blob = 128 << 10;
            let (s, v) = sim_volume(4 * MIB, Some(p));
            let mut r = rng(codec as u64 * 10 + mode as u64);
            let d = data(&mut r, 2, 1 << 20);
            v.write(4096, &d, false).unwrap();
            let st = v.stats();
            let compressing = codec != CodecId::None && mode != CompressionMode::None;
            assert_eq!(st.blobs_compressed > 0, compressing, "{codec:?} {mode:?}");
            if compressing {
                assert!(
                    st.compression_ratio > 2.0,
                    "{codec:?} {mode:?}: {}",
                    st.compression_ratio
                );
            }
            v.close().unwrap();
            let v = reopen(&s);
            let mut back = vec![0u8; d.len()];
            v.read(4096, &mut back).unwrap();
            assert!(back == d, "{codec:?} {mode:?}");
        }
    }
}

#[test]
fn zeros_take_no_space_and_trim_unmaps() {
    let (_s, v) = sim_volume(64 * MIB, None);
    v.write(0, &vec![0u8; 8 << 20], false).unwrap();
    let st = v.stats();
    assert_eq!(st.mapped_bytes, 0);
    assert_eq!(st.zero_sectors_written, 2048);
    assert_eq!(st.stored_bytes, 0);
    let mut r = rng(5);
    let d = data(&mut r, 3, 8 << 20);
    v.write(MIB, &d, false).unwrap();
    assert_eq!(v.stats().mapped_bytes, 8 << 20);
    v.trim(MIB + 100, 4 * MIB, false).unwrap();
    let mut back = vec![0u8; 8 << 20];
    v.read(MIB, &mut back).unwrap();
    assert_eq!(&back[..100], &d[..100]);
    assert!(back[100..4 * MIB as usize + 100].iter().all(|&b| b == 0));
    assert_eq!(
        &back[4 * MIB as usize + 100..],
        &d[4 * MIB as usize + 100..]
    );
    let runs = v.block_status(0, 64 * MIB, 100).unwrap();
    assert!(runs.iter().any(|r| r.1), "holes reported: {runs:?}");
    assert_eq!(runs.iter().map(|r| r.0).sum::<u64>(), 64 * MIB);
    v.write_zeroes(0, 64 * MIB, true).unwrap();
    assert_eq!(v.stats().mapped_bytes, 0);
    assert_eq!(
        v.block_status(0, 64 * MIB, 100).unwrap(),
        vec![(64 * MIB, true)]
    );
    v.verify_accounting().unwrap();
}

#[test]
fn out_of_range_is_rejected() {
    let (_s, v) = sim_volume(MIB, None);
    let mut b = [0u8; 10];
    assert!(matches!(
        v.read(MIB - 5, &mut b),
        Err(squeeze_engine::EngineError::OutOfRange { .. })
    ));
    assert!(v.write(MIB, &[1], false).is_err());
    assert!(v.write(u64::MAX, &[1], false).is_err());
    assert!(v.trim(0, MIB + 1, false).is_err());
    assert!(v.write(MIB - 1, &[1], false).is_ok());
}

#[test]
fn concurrent_writers_and_readers() {
    let (s, v) = sim_volume(32 * MIB, None);
    let v = Arc::new(v);
    let mut hs = Vec::new();
    for t in 0..4u64 {
        let v = v.clone();
        hs.push(std::thread::spawn(move || {
            let mut r = rng(t);
            // each thread owns an 8 MiB region
            let base = t * 8 * MIB;
            let mut model = vec![0u8; 8 * MIB as usize];
            for k in 0..100 {
                let off = r.gen_range(0..8 * MIB - 140_000);
                let len = r.gen_range(1..140_000usize);
                let d = data(&mut r, k % 4, len);
                v.write(base + off, &d, false).unwrap();
                model[off as usize..off as usize + len].copy_from_slice(&d);
                if k % 10 == 0 {
                    v.flush().unwrap();
                }
            }
            let mut back = vec![0u8; model.len()];
            v.read(base, &mut back).unwrap();
            assert!(back == model);
            model
        }));
    }
    let models: Vec<Vec<u8>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    v.verify_accounting().unwrap();
    Arc::try_unwrap(v).ok().unwrap().close().unwrap();
    let v = reopen(&s);
    for (t, m) in models.iter().enumerate() {
        let mut back = vec![0u8; m.len()];
        v.read(t as u64 * 8 * MIB, &mut back).unwrap();
        assert!(&back == m);
    }
}

#[test]
fn overwrites_free_segments_at_checkpoint() {
    let (_s, v) = sim_volume(8 * MIB, None);
    let mut r = rng(9);
    for _ in 0..20 {
        let d = data(&mut r, 1, 4 << 20);
        v.write(0, &d, false).unwrap();
        v.checkpoint().unwrap();
    }
    let st = v.stats();
    assert!(st.segments_reclaimed > 0);
    // 4 MiB live, incompressible: about 9 segments of 512 KiB plus checkpoint and head.
    assert!(st.segments_total - st.segments_free <= 14, "{st:?}");
    v.verify_accounting().unwrap();
}

#[test]
fn file_backed_volume_and_physical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sqz");
    let s = Arc::new(FileStorage::create(&path).unwrap());
    let v = Volume::create(s, &small_opts(1 << 30)).unwrap();
    let mut r = rng(3);
    let d = data(&mut r, 2, 8 << 20);
    v.write(0, &d, true).unwrap();
    let st = v.stats();
    assert!(
        st.physical_bytes > 0 && st.physical_bytes < 8 << 20,
        "{st:?}"
    );
    v.close().unwrap();
    let s = Arc::new(FileStorage::open(&path).unwrap());
    let v = Volume::open(s, OpenOptions::default()).unwrap();
    let mut back = vec![0u8; d.len()];
    v.read(0, &mut back).unwrap();
    assert!(back == d);
}

#[test]
fn a_volume_file_is_opened_by_one_writer_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sqz");
    let s = Arc::new(FileStorage::create(&path).unwrap());
    let v = Volume::create(s, &small_opts(1 << 30)).unwrap();
    let e = FileStorage::open(&path)
        .err()
        .expect("second writer refused");
    assert!(e.to_string().contains("in use"), "{e}");
    let ro = FileStorage::open_read_only(&path).unwrap();
    assert!(ro.lock_shared().is_err(), "check must not race a writer");
    drop(ro);
    v.close().unwrap();
    let again = FileStorage::open(&path).unwrap();
    drop(again);
    let ro = FileStorage::open_read_only(&path).unwrap();
    ro.lock_shared().unwrap();
}

/// WRITE_ZEROES with NO_HOLE (issue 13): the zeros are stored as data, so
/// the range stays mapped and block status reports it allocated, not a
/// hole; without the flag, zeros are holes. Both read back as zeros, and
/// provisioned zeros cost almost nothing once compressed.
#[test]
fn zeroes_without_holes_stay_provisioned() {
    let (s, v) = sim_volume(64 << 20, None);
    v.write(0, &vec![7u8; 1 << 20], false).unwrap();
    // Unaligned edges, more than one 4 MiB batch.
    let (off, len) = (4096 + 100, (9 << 20) + 5000);
    v.write_zeroes_no_hole(off, len, false).unwrap();
    let runs = v.block_status(0, 16 << 20, 100).unwrap();
    let end = off + len;
    let allocated_to = end.div_ceil(4096) * 4096;
    assert_eq!(
        runs[0],
        (allocated_to, false),
        "everything up to the end of the zeroes is allocated: {runs:?}"
    );
    let mut b = vec![1u8; len as usize];
    v.read(off, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    let mut head = vec![0u8; 100];
    v.read(4096, &mut head).unwrap();
    assert_eq!(
        head,
        vec![7u8; 100],
        "the partial head sector keeps its data"
    );
    let st = v.stats();
    assert!(
        st.stored_bytes < (1 << 20) + (64 << 10),
        "provisioned zeros compress: {} stored",
        st.stored_bytes
    );
    // Without NO_HOLE the same range becomes holes again.
    v.write_zeroes(8192, 1 << 20, false).unwrap();
    let runs = v.block_status(8192, 1 << 20, 10).unwrap();
    assert_eq!(runs, vec![(1 << 20, true)]);
    v.close().unwrap();
    let v = reopen(&s);
    let runs = v.block_status(2 << 20, 1 << 20, 10).unwrap();
    assert_eq!(runs, vec![(1 << 20, false)], "provisioned after a reopen");
}

/// One map walk answers both the read and "is it all a hole" (a structured
/// NBD READ of a hole is answered with OFFSET_HOLE).
#[test]
fn read_or_hole_tells_holes_from_data() {
    let (_s, v) = sim_volume(16 << 20, None);
    v.write(8192, &[3u8; 4096], false).unwrap();
    let mut b = vec![9u8; 8192];
    assert!(
        v.read_or_hole(0, &mut b).unwrap(),
        "two never-written sectors"
    );
    assert!(b.iter().all(|&x| x == 0));
    let mut b = vec![9u8; 3 * 4096];
    assert!(!v.read_or_hole(100, &mut b).unwrap(), "reaches the data");
    assert_eq!(&b[8192 - 100..8192 - 100 + 4096], &[3u8; 4096][..]);
    v.trim(8192, 4096, false).unwrap();
    assert!(v.read_or_hole(4096, &mut b).unwrap(), "trimmed");
}
