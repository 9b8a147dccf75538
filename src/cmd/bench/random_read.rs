//! 4 KiB random reads (step 4b of `bench`'s module docs): the engine's
//! `Volume::read` of one sector at random offsets of the data it wrote,
//! against `pread` of the same offsets from a plain file holding the same
//! bytes. Both sides read through the page cache (every record and every
//! page of the file is there), from the same number of threads, so the
//! ratio is the engine's own cost of a small read: finding the record,
//! checking it and decoding the sector out of its blob.

use super::parallel;
use anyhow::{bail, Result};
use squeeze_codec::process::cpu_seconds as process_cpu_seconds;
use squeeze_engine::Volume;
use std::os::unix::fs::FileExt;

/// Reads a pass makes (split among the threads, in batches of `BATCH`):
/// this many, or one per sector of smaller data.
pub(super) const READS: usize = 100_000;
const BATCH: usize = 250;
const SECTOR: u64 = 4096;

/// One pass: seconds and process CPU seconds.
pub(super) struct Pass {
    pub secs: f64,
    pub cpu: f64,
}

/// `n` sector-aligned offsets below `bytes`, the same for every pass
/// (a fixed seed: both sides read the same sectors in the same order).
pub(super) fn offsets(n: usize, bytes: u64) -> Vec<u64> {
    let sectors = (bytes / SECTOR).max(1);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            // xorshift64*: enough spread for offsets, no dependency.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) % sectors) * SECTOR
        })
        .collect()
}

fn timed(
    threads: usize,
    offs: &[u64],
    read: impl Fn(u64, &mut [u8]) -> Result<()> + Sync,
) -> Result<Pass> {
    let batches = offs.len().div_ceil(BATCH);
    let cpu0 = process_cpu_seconds();
    let secs = parallel(threads, batches, |b| {
        let mut buf = [0u8; SECTOR as usize];
        for &off in &offs[b * BATCH..((b + 1) * BATCH).min(offs.len())] {
            read(off, &mut buf)?;
            std::hint::black_box(&buf);
        }
        Ok(())
    })?;
    Ok(Pass {
        secs,
        cpu: process_cpu_seconds() - cpu0,
    })
}

/// The engine's pass; the first reads are checked against `data`.
pub(super) fn engine(vol: &Volume, data: &[u8], threads: usize, offs: &[u64]) -> Result<Pass> {
    for &off in offs.iter().take(64) {
        let mut buf = [0u8; SECTOR as usize];
        vol.read(off, &mut buf)?;
        if buf[..] != data[off as usize..(off + SECTOR) as usize] {
            bail!("random read at byte {off}: the engine returned other bytes than were written");
        }
    }
    timed(threads, offs, |off, buf| {
        vol.read(off, buf)?;
        Ok(())
    })
}

/// The plain file's pass.
pub(super) fn file(f: &std::fs::File, threads: usize, offs: &[u64]) -> Result<Pass> {
    timed(threads, offs, |off, buf| {
        f.read_exact_at(buf, off)?;
        Ok(())
    })
}
