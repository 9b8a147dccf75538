//! `squeeze scan --dedup`: what deduplication of 4 KiB sectors would save
//! on the user's data, beside the codecs.
//!
//! Every 4 KiB block of every data extent is read and fingerprinted with
//! XXH3-128. A file's blocks start at its offset 0, as a file system lays
//! them out, and a short tail is padded with zeros, as a volume stores it.
//! All-zero blocks are counted apart: squeeze stores them as holes with or
//! without deduplication.
//!
//! The other fingerprints go into a set bounded by `--dedup-mem`. The
//! count is exact while the set fits. Past that, the estimator keeps only
//! the fingerprints whose top `shift` bits are zero, raising `shift` by one
//! each time the set fills (content-defined sampling, as in Harnik et al.'s
//! estimators and VDO's sparse index): every copy of a block is kept or
//! dropped together, so the duplicate share of the kept blocks estimates
//! that of all blocks without bias, and the report says at which rate.
//!
//! Invariants: `blocks` = `zero_blocks` + the non-zero blocks seen;
//! `counts` holds only sampled fingerprints, each with the number of
//! blocks seen with it; `counts.len()` <= `limit` after every `add`.

use serde::Serialize;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use xxhash_rust::xxh3::xxh3_128;

/// The unit deduplication works in: one sector.
pub const BLOCK: usize = 4096;

/// RAM of one entry of the set: a `(u128, u32)` slot padded to 32 bytes,
/// its control byte, and the table's empty share at 7/8 load.
pub const ENTRY_BYTES: usize = 38;

/// The fingerprint's low half is already uniform: hash tables use it as it
/// is (sampling uses the top half, so the two never correlate).
#[derive(Default)]
struct LowHalf(u64);

impl Hasher for LowHalf {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u128 keys are hashed here; this path is a fallback.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

pub struct DedupEstimator {
    limit: usize,
    shift: u32,
    counts: HashMap<u128, u32, BuildHasherDefault<LowHalf>>,
    blocks: u64,
    zero_blocks: u64,
}

/// What the estimate says, for the report.
#[derive(Debug, Serialize)]
pub struct DedupReport {
    pub block_size: usize,
    /// 4 KiB blocks read (tails padded).
    pub blocks: u64,
    pub zero_blocks: u64,
    /// 1 when every fingerprint was kept; else 2^-shift.
    pub sample_rate: f64,
    /// Non-zero blocks whose fingerprint was kept, and how many of those
    /// were distinct.
    pub sampled_blocks: u64,
    pub sampled_distinct: u64,
    /// Share of the non-zero blocks that repeat an earlier one.
    pub duplicate_fraction: f64,
    /// Estimated bytes deduplication saves (duplicate blocks x 4 KiB).
    pub bytes_saved_estimate: u64,
    /// The set's RAM at the end (entries x ENTRY_BYTES).
    pub index_bytes: u64,
}

impl DedupEstimator {
    /// An estimator whose set holds at most `mem` bytes (at least one
    /// entry).
    pub fn new(mem: u64) -> DedupEstimator {
        let limit = (mem / ENTRY_BYTES as u64).clamp(1, usize::MAX as u64) as usize;
        DedupEstimator {
            limit,
            shift: 0,
            counts: HashMap::default(),
            blocks: 0,
            zero_blocks: 0,
        }
    }

    /// Counts one block of at most `BLOCK` bytes (a shorter one is a
    /// file's tail, padded with zeros).
    pub fn add(&mut self, block: &[u8]) {
        assert!(block.len() <= BLOCK && !block.is_empty());
        self.blocks += 1;
        if block.iter().all(|&b| b == 0) {
            self.zero_blocks += 1;
            return;
        }
        let fp = if block.len() == BLOCK {
            xxh3_128(block)
        } else {
            let mut padded = [0u8; BLOCK];
            padded[..block.len()].copy_from_slice(block);
            xxh3_128(&padded)
        };
        if !self.sampled(fp) {
            return;
        }
        *self.counts.entry(fp).or_insert(0) += 1;
        while self.counts.len() > self.limit {
            self.shift += 1;
            let shift = self.shift;
            self.counts.retain(|&fp, _| sampled_at(fp, shift));
        }
    }

    /// Every block of `data`, which starts at a multiple of `BLOCK` in its
    /// file.
    pub fn add_all(&mut self, data: &[u8]) {
        for block in data.chunks(BLOCK) {
            self.add(block);
        }
    }

    fn sampled(&self, fp: u128) -> bool {
        sampled_at(fp, self.shift)
    }

    pub fn report(&self) -> DedupReport {
        let sampled_blocks: u64 = self.counts.values().map(|&c| u64::from(c)).sum();
        let sampled_distinct = self.counts.len() as u64;
        let duplicate_fraction = if sampled_blocks == 0 {
            0.0
        } else {
            (sampled_blocks - sampled_distinct) as f64 / sampled_blocks as f64
        };
        let nonzero = self.blocks - self.zero_blocks;
        DedupReport {
            block_size: BLOCK,
            blocks: self.blocks,
            zero_blocks: self.zero_blocks,
            sample_rate: 0.5f64.powi(self.shift as i32),
            sampled_blocks,
            sampled_distinct,
            duplicate_fraction,
            bytes_saved_estimate: (duplicate_fraction * nonzero as f64).round() as u64
                * BLOCK as u64,
            index_bytes: (self.counts.capacity() * ENTRY_BYTES) as u64,
        }
    }
}

/// Whether a fingerprint is kept at sampling rate 2^-shift: its top
/// `shift` bits are zero.
fn sampled_at(fp: u128, shift: u32) -> bool {
    shift == 0 || (fp >> (128 - shift)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: u64) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK];
        b[..8].copy_from_slice(&n.to_le_bytes());
        b[4000..4008].copy_from_slice(&(!n).to_le_bytes());
        b
    }

    #[test]
    fn exact_while_the_set_fits() {
        let mut e = DedupEstimator::new(1 << 20);
        for n in 0..100 {
            e.add(&block(n));
        }
        for n in 0..25 {
            e.add(&block(n));
        }
        e.add(&[0u8; BLOCK]);
        let r = e.report();
        assert_eq!(r.blocks, 126);
        assert_eq!(r.zero_blocks, 1);
        assert_eq!(r.sample_rate, 1.0);
        assert_eq!((r.sampled_blocks, r.sampled_distinct), (125, 100));
        assert!((r.duplicate_fraction - 0.2).abs() < 1e-12);
        assert_eq!(r.bytes_saved_estimate, 25 * BLOCK as u64);
    }

    #[test]
    fn a_tail_is_padded_with_zeros() {
        let mut e = DedupEstimator::new(1 << 20);
        let mut full = vec![0u8; BLOCK];
        full[..100].fill(7);
        e.add(&full);
        e.add(&[7u8; 100]);
        e.add(&[0u8; 10]);
        let r = e.report();
        assert_eq!((r.blocks, r.zero_blocks), (3, 1));
        assert_eq!((r.sampled_blocks, r.sampled_distinct), (2, 1));
    }

    #[test]
    fn sampling_bounds_the_set_and_estimates_the_share() {
        // 60,000 distinct blocks, 40,000 of them written twice: 40,000 of
        // the 100,000 blocks repeat an earlier one.
        let limit_entries = 2_000;
        let mut e = DedupEstimator::new((limit_entries * ENTRY_BYTES) as u64);
        for n in 0..60_000 {
            e.add(&block(n));
        }
        for n in 0..40_000 {
            e.add(&block(n));
        }
        let r = e.report();
        assert!(r.sampled_distinct as usize <= limit_entries);
        assert!(r.sample_rate < 1.0 / 16.0, "{r:?}");
        // Kept together: a sampled block's copy is sampled too, so the
        // estimate is close (the sample holds about 1,000-2,000 distinct
        // blocks: a few percent of error).
        assert!((r.duplicate_fraction - 0.4).abs() < 0.06, "{r:?}");
        assert_eq!(r.blocks, 100_000);
    }
}
