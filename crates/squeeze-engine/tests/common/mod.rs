//! Shared helpers for the engine's integration tests.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use squeeze_codec::{CpuPool, Saturated};
use squeeze_engine::pipeline::law::{Law, LAW_DEFAULT};
use squeeze_engine::{CreateOptions, OpenOptions, Policy, SimStorage, Volume};
use std::sync::Arc;

/// A real CPU pool that reports itself always far behind
/// (`squeeze_codec::Saturated`): with [`AT_ONCE`] every client write batch
/// then takes the next rung of the adaptive codec's ladder (a deterministic
/// stand-in for a saturated pool).
pub type Behind = Saturated<CpuPool>;

/// A law that steps down at every batch while the backlog is high.
pub const AT_ONCE: Law = Law {
    down_hold_ns: 0,
    ..LAW_DEFAULT
};

/// Open options with a [`Behind`] engine of one thread and [`AT_ONCE`].
pub fn behind_options() -> OpenOptions {
    OpenOptions {
        engine: Some(Arc::new(Saturated(CpuPool::new(1)))),
        adapt_law: Some(AT_ONCE),
        ..Default::default()
    }
}

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// A small volume for fast tests: 512 KiB segments.
pub fn small_opts(size: u64) -> CreateOptions {
    let mut o = CreateOptions::new(size);
    o.segment_size = 512 << 10;
    o
}

pub fn sim_volume(size: u64, policy: Option<Policy>) -> (Arc<SimStorage>, Volume) {
    let s = Arc::new(SimStorage::new());
    let mut o = small_opts(size);
    if let Some(p) = policy {
        o.policy = p;
    }
    let v = Volume::create(s.clone(), &o).unwrap();
    (s, v)
}

pub fn reopen(s: &Arc<SimStorage>) -> Volume {
    Volume::open(s.clone(), OpenOptions::default()).unwrap()
}

/// Data of a chosen kind: 0 zeros, 1 random, 2 compressible text-like,
/// 3 fio-like 60% compressible.
pub fn data(rng: &mut impl Rng, kind: u32, len: usize) -> Vec<u8> {
    match kind {
        0 => vec![0; len],
        1 => (0..len).map(|_| rng.gen()).collect(),
        2 => {
            let words = [
                &b"squeeze "[..],
                b"block ",
                b"store ",
                b"compress ",
                b"the ",
            ];
            let mut v = Vec::with_capacity(len);
            while v.len() < len {
                v.extend_from_slice(words[rng.gen_range(0..words.len())]);
            }
            v.truncate(len);
            v
        }
        _ => squeeze_codec::testdata::fio_like(len, 60, 4096, rng.gen()),
    }
}

/// Writes 256 KiB blocks of random bytes from `at` on until a write fails
/// (at most up to `limit`, else panics); returns where the failed write
/// would have gone and its error.
pub fn write_until_error(
    v: &Volume,
    rng: &mut impl Rng,
    mut at: u64,
    limit: u64,
) -> (u64, squeeze_engine::EngineError) {
    loop {
        let d = data(rng, 1, 256 << 10);
        match v.write(at, &d, false) {
            Ok(()) => at += d.len() as u64,
            Err(e) => return (at, e),
        }
        assert!(at < limit, "never ran out of room");
    }
}

/// The machine's busy share as a test says it is, read at most once per
/// the CPU source's interval as /proc/stat is.
pub struct Busy(pub f64, pub parking_lot::Mutex<Option<std::time::Instant>>);

impl squeeze_engine::pipeline::headroom::BusySource for Busy {
    fn busy(&self) -> Option<f64> {
        let mut last = self.1.lock();
        if last.is_some_and(|t| t.elapsed() < squeeze_engine::pipeline::headroom::MIN_INTERVAL) {
            return None;
        }
        *last = Some(std::time::Instant::now());
        Some(self.0)
    }
}

/// `len` bytes read back from `at`.
pub fn read_back(v: &Volume, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    v.read(at, &mut b).unwrap();
    b
}

/// The volume reads back exactly `model` from 0, and its accounting holds.
pub fn check_model(v: &Volume, model: &[u8]) {
    assert!(
        read_back(v, 0, model.len()) == model,
        "the volume reads other bytes than were written"
    );
    v.verify_accounting().unwrap();
}

/// Writes `d` at `at` and into `model`.
pub fn write_model(v: &Volume, model: &mut [u8], at: u64, d: &[u8]) {
    v.write(at, d, false).unwrap();
    model[at as usize..at as usize + d.len()].copy_from_slice(d);
}
