//! Shared helpers for the log's tests: volumes on the power-cut simulator.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use squeeze_engine::{CreateOptions, OpenOptions, SimStorage, Volume};
use squeeze_wal::{Layout, Lsn, Wal};
use std::sync::Arc;

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// A volume of `size` bytes with 512 KiB segments on a simulated disk.
pub fn sim_volume(size: u64) -> (Arc<SimStorage>, Arc<Volume>) {
    let disk = Arc::new(SimStorage::new());
    let mut o = CreateOptions::new(size);
    o.segment_size = 512 << 10;
    let v = Volume::create(disk.clone(), &o).unwrap();
    (disk, Arc::new(v))
}

pub fn open_volume(disk: &Arc<SimStorage>) -> squeeze_engine::Result<Arc<Volume>> {
    Volume::open(disk.clone(), OpenOptions::default()).map(Arc::new)
}

/// Records as a log's recovery hands them over.
pub type Records = Vec<(Lsn, Vec<u8>)>;

/// Opens the log and collects its records.
pub fn open_log(vol: &Arc<Volume>, layout: Layout) -> squeeze_wal::Result<(Wal, Records)> {
    let mut got = Vec::new();
    let wal = Wal::open(vol.clone(), Some(layout), |lsn, p| {
        got.push((lsn, p.to_vec()))
    })?;
    Ok((wal, got))
}

/// A payload naming its writer and number, padded to `len` with
/// half-compressible bytes.
pub fn payload(r: &mut impl Rng, writer: u32, n: u64, len: usize) -> Vec<u8> {
    let mut p = format!("w{writer}n{n}:").into_bytes();
    while p.len() < len {
        if r.gen_bool(0.5) {
            p.push(r.gen());
        } else {
            p.push(b'a');
        }
    }
    p.truncate(len.max(12));
    p
}

pub const LAYOUTS: [Layout; 2] = [Layout::Dense, Layout::Sparse];
