//! `Volume::try_read_cached`, the read a server's request reader makes
//! without waiting: it answers with exactly the bytes, holes and damage
//! reports of a blocking read when everything it needs is in memory, and
//! declines (`None`) instead of waiting for the disk: a page not in the page
//! cache, a read fault due. Damage is reported, never served.

mod common;

use common::{data, rng, sim_volume};
use squeeze_engine::{EngineError, FileStorage, IoMode, SimFaults, Volume};
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

const SECTOR: usize = 4096;

/// 1 MiB in 128 KiB writes of fio-like, text and random data, then 256 KiB
/// never written, then 256 KiB more data.
fn fill(v: &Volume) -> Vec<u8> {
    let mut r = rng(41);
    let mut model = vec![0u8; 1536 << 10];
    for k in 0..10u64 {
        if (8..10).contains(&k) {
            continue;
        }
        let at = (k as usize) * (128 << 10);
        let d = data(&mut r, [3, 2, 1][k as usize % 3], 128 << 10);
        v.write(at as u64, &d, false).unwrap();
        model[at..at + d.len()].copy_from_slice(&d);
    }
    let tail = data(&mut r, 3, 256 << 10);
    v.write(1280 << 10, &tail, false).unwrap();
    model[1280 << 10..].copy_from_slice(&tail);
    v.flush().unwrap();
    model
}

/// Reads of every shape: single sectors, spans across chunks and records,
/// unaligned ones, holes and part holes.
fn shapes() -> Vec<(u64, usize)> {
    let mut s = Vec::new();
    for k in 0..384u64 {
        s.push((k * SECTOR as u64, SECTOR));
    }
    s.extend([
        (0, 32 << 10),
        (28 << 10, 8 << 10),
        (120 << 10, 16 << 10),
        (1000, 3000),
        (4095, 2),
        (1020 << 10, 8 << 10),
        (1024 << 10, 64 << 10),
        (1270 << 10, 20 << 10),
        (200 << 10, 300 << 10),
    ]);
    s
}

#[test]
fn cached_reads_equal_blocking_reads() {
    let (_s, v) = sim_volume(8 << 20, None);
    let model = fill(&v);
    for (off, len) in shapes() {
        let mut got = vec![0xEE; len];
        let hole = v
            .try_read_cached(off, &mut got)
            .unwrap()
            .expect("memory never waits");
        let want = &model[off as usize..off as usize + len];
        assert_eq!(got, want, "{len} bytes at {off}");
        let mut again = vec![0u8; len];
        assert_eq!(v.read_or_hole(off, &mut again).unwrap(), hole, "{off}");
        assert_eq!(
            hole,
            want.iter().all(|&b| b == 0) && (1024 << 10..1280 << 10).contains(&off)
        );
    }
    // Out of range is the same error as a blocking read's.
    let mut b = vec![0u8; SECTOR];
    assert!(matches!(
        v.try_read_cached(8 << 20, &mut b),
        Err(EngineError::OutOfRange { .. })
    ));
}

/// Every byte of the records is damaged in turn, one bit at a time: a
/// cached read of any sector answers the written bytes or an error, never
/// other bytes.
#[test]
fn damage_is_reported_never_served() {
    let (s, v) = sim_volume(8 << 20, None);
    let model = fill(&v);
    let end = squeeze_engine::Storage::len(&*s).unwrap();
    let mut r = rng(43);
    let mut errors = 0;
    for _ in 0..60 {
        let at = rand::Rng::gen_range(&mut r, squeeze_format::DATA_START..end);
        s.flip_bit(at, (at % 8) as u8);
        for k in 0..384u64 {
            let mut got = vec![0u8; SECTOR];
            match v.try_read_cached(k * SECTOR as u64, &mut got) {
                Ok(Some(_)) => assert_eq!(
                    got,
                    model[k as usize * SECTOR..(k as usize + 1) * SECTOR],
                    "sector {k} served wrong after a flip at {at}"
                ),
                Ok(None) => panic!("memory never waits"),
                Err(EngineError::Corrupt { .. } | EngineError::Codec { .. }) => errors += 1,
                Err(e) => panic!("sector {k}: {e}"),
            }
        }
        s.flip_bit(at, (at % 8) as u8);
    }
    assert!(errors > 0, "no flip landed in a record read");
}

/// A read fault due is left to the blocking read, which meets it.
#[test]
fn a_read_fault_is_left_to_the_blocking_read() {
    let (s, v) = sim_volume(8 << 20, None);
    fill(&v);
    s.set_faults(SimFaults {
        read_eio: 1,
        ..Default::default()
    });
    let mut b = vec![0u8; SECTOR];
    assert!(v.try_read_cached(0, &mut b).unwrap().is_none());
    assert!(v.read(0, &mut b).is_err(), "the fault is still due");
    // A hole needs no disk at all.
    assert_eq!(v.try_read_cached(1100 << 10, &mut b).unwrap(), Some(true));
}

/// On a real file: what the page cache holds is read at once; once the
/// kernel drops it, the cached read declines and a blocking read brings it
/// back.
#[test]
fn pages_out_of_the_cache_are_not_waited_for() {
    for mode in [IoMode::Direct, IoMode::Buffered] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol.sqz");
        let storage = Arc::new(FileStorage::create_with(&path, mode).unwrap());
        let v = Volume::create(storage, &common::small_opts(8 << 20)).unwrap();
        let model = fill(&v);
        let mut got = vec![0u8; 8 << 10];
        let want = &model[200 << 10..208 << 10];
        v.read(200 << 10, &mut got).unwrap();
        assert_eq!(
            v.try_read_cached(200 << 10, &mut got).unwrap(),
            Some(false),
            "{mode:?}: just read, so cached"
        );
        assert_eq!(got, want);
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: fdatasync and posix_fadvise on a file this test opened.
        unsafe {
            assert_eq!(libc::fdatasync(f.as_raw_fd()), 0);
            assert_eq!(
                libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED),
                0
            );
        }
        assert_eq!(
            v.try_read_cached(200 << 10, &mut got).unwrap(),
            None,
            "{mode:?}: dropped from the page cache"
        );
        v.read(200 << 10, &mut got).unwrap();
        assert_eq!(got, want);
        assert_eq!(v.try_read_cached(200 << 10, &mut got).unwrap(), Some(false));
        assert_eq!(got, want);
    }
}
