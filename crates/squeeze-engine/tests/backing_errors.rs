//! Errors of the backing file nobody planned for (issue 13): any error
//! other than ENOSPC from an allocation, a punch or a write turns the
//! volume read-only with the reason in `stats`, the client sees EIO (not
//! the file's EINVAL), and the map is left as it was: every sector reads
//! what the last successful operation left, for client writes, trims, zero
//! writes, the cleaner and the merger alike; a reopen finds everything
//! flushed.

mod common;
use common::*;
use squeeze_engine::error::ReadOnly;
use squeeze_engine::{EngineError, OpenOptions, SimFaults, SimStorage, Volume};
use std::collections::BTreeMap;
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const SECTOR: u64 = 4096;
/// Sectors 0..SETUP hold flushed data before the fault.
const SETUP: u64 = 1024;
/// The operations after the fault write from here on.
const OPS_AT: u64 = 2048;

/// The errors a file may answer besides ENOSPC.
const ERRNOS: [i32; 4] = [libc::EINVAL, libc::EIO, libc::EBADF, libc::EROFS];

#[derive(Clone, Copy, Debug)]
enum Op {
    Write,
    Trim,
    WriteZeroes,
    Cleaner,
    Merger,
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Allocate(i32),
    Write(i32),
    ShortWrite,
}

/// A volume whose first SETUP sectors hold flushed data (in small,
/// fragmented records with garbage between them, so the cleaner and the
/// merger have work), and the model of every sector.
fn setup(seed: u64) -> (Arc<SimStorage>, Volume, BTreeMap<u64, Vec<u8>>) {
    let (s, v) = sim_volume(64 * MIB, None);
    let mut r = rng(seed);
    let mut model = BTreeMap::new();
    // Every sector twice, one at a time: the first copies become garbage.
    for pass in 0..2 {
        for lba in 0..SETUP {
            let d = data(&mut r, if pass == 0 { 1 } else { 3 }, SECTOR as usize);
            v.write(lba * SECTOR, &d, false).unwrap();
            model.insert(lba, d);
        }
    }
    v.flush().unwrap();
    (s, v, model)
}

fn check(v: &Volume, model: &BTreeMap<u64, Vec<u8>>, what: &str) {
    let mut b = vec![0u8; SECTOR as usize];
    for (lba, want) in model {
        v.read(lba * SECTOR, &mut b)
            .unwrap_or_else(|e| panic!("{what}: LBA {lba}: {e}"));
        assert!(b == *want, "{what}: LBA {lba} reads what was last written");
    }
}

/// Runs `op` until it fails (each success updates the model); returns the
/// error.
fn run_until_error(
    v: &Volume,
    op: Op,
    model: &mut BTreeMap<u64, Vec<u8>>,
    seed: u64,
) -> EngineError {
    let mut r = rng(seed);
    let zeros = vec![0u8; SECTOR as usize];
    for k in 0..20_000u64 {
        let lba = OPS_AT + k % 4096;
        let res = match op {
            Op::Write => {
                let d = data(&mut r, 3, 16 * SECTOR as usize);
                let res = v.write(lba * SECTOR, &d, false);
                if res.is_ok() {
                    for (i, c) in d.chunks(SECTOR as usize).enumerate() {
                        model.insert(lba + i as u64, c.to_vec());
                    }
                }
                res
            }
            Op::Trim | Op::WriteZeroes => {
                // Sectors with data first, so the zero record matters.
                let res = if matches!(op, Op::Trim) {
                    v.trim(lba * SECTOR, SECTOR, false)
                } else {
                    v.write_zeroes(lba * SECTOR, SECTOR, false)
                };
                if res.is_ok() {
                    model.insert(lba, zeros.clone());
                }
                res
            }
            Op::Cleaner => v.compact(|_, _| {}).map(|_| ()),
            Op::Merger => v.merge(|_, _| {}).map(|_| ()),
        };
        if let Err(e) = res {
            return e;
        }
        if matches!(op, Op::Cleaner | Op::Merger) {
            panic!("{op:?} finished without meeting the fault");
        }
    }
    panic!("{op:?}: the fault never fired");
}

fn fault_then(op: Op, fault: Fault, seed: u64) {
    let what = format!("{op:?} with {fault:?}");
    let (s, v, mut model) = setup(seed);
    let flushed = model.clone();
    let faults = match fault {
        Fault::Allocate(errno) => SimFaults {
            allocate_errno: Some(errno),
            ..Default::default()
        },
        Fault::Write(errno) => SimFaults {
            write_eio: 1,
            write_errno: Some(errno),
            ..Default::default()
        },
        Fault::ShortWrite => SimFaults {
            short_writes: 1,
            ..Default::default()
        },
    };
    s.set_faults(faults);
    let e = run_until_error(&v, op, &mut model, seed + 1);
    assert!(
        !matches!(e, EngineError::NoSpace(_)),
        "{what}: not a full disk: {e}"
    );
    assert_eq!(e.errno(), libc::EIO, "{what}: the client sees EIO: {e}");
    assert_eq!(
        e.into_io().raw_os_error(),
        None,
        "{what}: the file's errno is not passed to the client"
    );
    let reason = v.stats().read_only_reason;
    assert!(reason.is_some(), "{what}: read-only, with the reason");
    // Writes are refused, carrying the failure that turned the volume
    // read-only: typed, an EIO, the reason stats gives.
    let refused = v.write(0, &[1u8; 4096], false);
    let Err(EngineError::ReadOnly(ReadOnly::Failed(first))) = &refused else {
        panic!("{what}: writes refused after the failure: {refused:?}");
    };
    assert_eq!(first.errno(), libc::EIO, "{what}: {first}");
    assert_eq!(reason.as_deref(), Some(first.to_string().as_str()));
    assert!(matches!(
        v.trim(0, SECTOR, false),
        Err(EngineError::ReadOnly(_))
    ));
    // The map is as the last successful operation left it.
    check(&v, &model, &what);
    v.verify_accounting().unwrap();
    // Everything flushed before the fault survives a reopen.
    s.set_faults(SimFaults::default());
    let img = Arc::new(s.kill());
    drop(v);
    let v = Volume::open(img, OpenOptions::default()).unwrap();
    let setup_part: BTreeMap<u64, Vec<u8>> = flushed.into_iter().collect();
    check(&v, &setup_part, &format!("{what}, reopened"));
    v.verify_accounting().unwrap();
}

#[test]
fn an_allocation_error_turns_every_writer_read_only() {
    for (k, errno) in ERRNOS.into_iter().enumerate() {
        for op in [
            Op::Write,
            Op::Trim,
            Op::WriteZeroes,
            Op::Cleaner,
            Op::Merger,
        ] {
            fault_then(op, Fault::Allocate(errno), 100 + k as u64);
        }
    }
}

#[test]
fn a_write_error_turns_every_writer_read_only() {
    for (k, errno) in ERRNOS.into_iter().enumerate() {
        for op in [Op::Write, Op::Trim, Op::Cleaner, Op::Merger] {
            fault_then(op, Fault::Write(errno), 200 + k as u64);
        }
    }
    for op in [Op::Write, Op::Cleaner] {
        fault_then(op, Fault::ShortWrite, 300);
    }
}

#[test]
fn a_failed_punch_turns_the_volume_read_only() {
    let (s, v, model) = setup(7);
    s.set_faults(SimFaults {
        punch_errno: Some(libc::EINVAL),
        ..Default::default()
    });
    // Compaction frees the cleaned segments with punches.
    let e = v.compact(|_, _| {}).map(|_| ()).err();
    let reason = v.stats().read_only_reason;
    assert!(
        reason.is_some(),
        "read-only after a failed punch (compact said {e:?})"
    );
    check(&v, &model, "after a failed punch");
}

/// The SimStorage refuses what fallocate(2) refuses.
#[test]
fn the_simulated_file_refuses_empty_allocations_as_fallocate_does() {
    use squeeze_engine::Storage;
    let s = SimStorage::new();
    let e = s.allocate(4096, 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    let e = s.punch(4096, 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    s.allocate(0, 4096).unwrap();
}
