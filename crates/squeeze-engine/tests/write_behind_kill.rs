//! A process kill on the default I/O path (the write-behind pool over a
//! simulated disk whose page cache outlives the process): acknowledged
//! writes whose records were still staged in the pool are lost, at most the
//! pool's worth of log, and nothing flushed or written with FUA is.

mod common;
use common::*;
use squeeze_engine::storage::{SimWriteBehind, SimWriteBehindConfig};
use squeeze_engine::{default_policy, CodecId, OpenOptions, SimStorage, Volume};
use std::sync::Arc;

const SIZE: u64 = 8 << 20;
const CHUNK: usize = 64 << 10;
const CHUNKS: usize = 4;

/// A volume over a 4-chunk pool whose flusher never runs on its own:
/// completed chunks wait for eviction or a flush, the most a kill can find.
fn volume() -> (Arc<SimStorage>, Arc<SimWriteBehind>, Volume) {
    let disk = Arc::new(SimStorage::new());
    let wb = Arc::new(SimWriteBehind::new(
        disk.clone(),
        SimWriteBehindConfig {
            chunk: CHUNK,
            chunks: CHUNKS,
            seed: 1,
            write_out_chance: 0.0,
            flusher_threads: 0,
        },
    ));
    let mut opts = small_opts(SIZE);
    let mut policy = default_policy();
    policy.codec = CodecId::None; // log bytes = data bytes, for the bound
    opts.policy = policy;
    let v = Volume::create(wb.clone(), &opts).unwrap();
    (disk, wb, v)
}

/// Kills the process: the disk keeps what reached it, the pool is gone.
fn kill(disk: &SimStorage, v: Volume) -> Volume {
    let img = Arc::new(disk.kill());
    drop(v);
    Volume::open(img, OpenOptions::default()).unwrap()
}

fn write_in_pieces(v: &Volume, at: u64, data: &[u8], fua: bool) {
    for (i, piece) in data.chunks(64 << 10).enumerate() {
        v.write(at + (i * (64 << 10)) as u64, piece, fua).unwrap();
    }
}

#[test]
fn a_kill_loses_at_most_the_staged_log_and_nothing_flushed() {
    let mut r = rng(7);
    let (disk, wb, v) = volume();
    let flushed = data(&mut r, 1, 1 << 20);
    write_in_pieces(&v, 0, &flushed, false);
    v.flush().unwrap();
    let unflushed = data(&mut r, 1, 1 << 20);
    write_in_pieces(&v, 2 << 20, &unflushed, false);
    let staged = wb.unwritten_bytes();
    assert!(
        staged > 0 && staged <= (CHUNK * CHUNKS) as u64,
        "{staged} bytes staged"
    );

    let v = kill(&disk, v);
    let mut got = vec![0u8; 1 << 20];
    v.read(0, &mut got).unwrap();
    assert!(got == flushed, "a flushed write was lost to a kill");
    v.read(2 << 20, &mut got).unwrap();
    let mut lost = 0u64;
    for (g, w) in got.chunks(4096).zip(unflushed.chunks(4096)) {
        if g != w {
            assert!(
                g.iter().all(|&b| b == 0),
                "a sector holds bytes never written"
            );
            lost += 4096;
        }
    }
    // A record partly written out and partly staged is lost whole: at most
    // one blob more than the staged bytes.
    let bound = staged + (128 << 10);
    assert!(
        lost > 0,
        "the staged records survived a kill: nothing was staged?"
    );
    assert!(lost <= bound, "a kill lost {lost} bytes, more than {bound}");
}

#[test]
fn a_kill_after_a_flush_or_with_fua_loses_nothing() {
    let mut r = rng(8);
    let (disk, wb, v) = volume();
    let a = data(&mut r, 1, 1 << 20);
    write_in_pieces(&v, 0, &a, false);
    v.flush().unwrap();
    assert_eq!(
        wb.unwritten_bytes(),
        0,
        "a flush wrote out every staged byte"
    );
    let b = data(&mut r, 3, 512 << 10);
    write_in_pieces(&v, 3 << 20, &b, true);
    assert_eq!(
        wb.unwritten_bytes(),
        0,
        "a FUA write wrote out every staged byte"
    );

    let v = kill(&disk, v);
    let mut got = vec![0u8; 1 << 20];
    v.read(0, &mut got).unwrap();
    assert!(got == a, "a flushed write was lost to a kill");
    let mut got = vec![0u8; 512 << 10];
    v.read(3 << 20, &mut got).unwrap();
    assert!(got == b, "a FUA write was lost to a kill");
}

/// `Volume::write_out` after each write (what `serve --ublk` does before it
/// answers one): a kill loses none of them, small or large, overwrites and
/// trims included, though no flush ran.
#[test]
fn a_kill_after_write_out_loses_no_answered_write() {
    let mut r = rng(9);
    let (disk, wb, v) = volume();
    let mut model = vec![0u8; 4 << 20];
    for i in 0..200u64 {
        let len = [4096usize, 8192, 64 << 10, 128 << 10][(i % 4) as usize];
        let at = (i * 40_960) % ((4 << 20) - (128 << 10) as u64) / 4096 * 4096;
        let d = data(&mut r, 1 + (i % 3) as u32, len);
        if i % 17 == 16 {
            v.trim(at, len as u64, false).unwrap();
            model[at as usize..at as usize + len].fill(0);
        } else {
            v.write(at, &d, false).unwrap();
            model[at as usize..at as usize + len].copy_from_slice(&d);
        }
        v.write_out().unwrap();
        assert_eq!(wb.unwritten_bytes(), 0, "write {i}: bytes still staged");
    }
    let v = kill(&disk, v);
    let mut got = vec![0u8; 4 << 20];
    v.read(0, &mut got).unwrap();
    for (i, (g, m)) in got.chunks(4096).zip(model.chunks(4096)).enumerate() {
        assert!(g == m, "sector {i}: an answered write was lost to a kill");
    }
}
