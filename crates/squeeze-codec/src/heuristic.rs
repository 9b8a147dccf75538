//! The incompressibility heuristic (after btrfs's `btrfs_compress_heuristic`
//! in fs/btrfs/compression.c): decide from a small sample whether running a
//! codec on a blob is hopeless, so the write path can store it raw without
//! spending codec time.
//!
//! The sample is `SAMPLE_READ_BYTES`-byte reads spread evenly over the
//! buffer (a stride that is not a power of two, so fio-style fixed-size
//! chunks do not alias with it). Then, like btrfs:
//! 1. the sample's first half equals its second half: repeated pattern,
//!    compressible;
//! 2. fewer than `BYTE_SET_THRESHOLD` distinct byte values: compressible;
//! 3. otherwise the order-0 Shannon entropy of the sample (Miller-Madow
//!    corrected for the small sample) decides: at or above
//!    [`ENTROPY_BITS_HOPELESS`] bits per byte the blob is incompressible.
//!
//! btrfs's "core set" test (sorting the histogram) is left out: it costs a
//! sort and the entropy test already separates the same cases.
//!
//! Invariants and limits:
//! - Cost is bounded by the sample size (at most `SAMPLE_BYTES_MAX`), not by
//!   the buffer length: one pass that builds the histogram and the entropy
//!   sum together (the sum of `c*log2(c)` is kept incrementally through a
//!   table of differences), no sort, no floating point in the loop.
//! - A `true` answer is only a prediction: entropy of single bytes cannot
//!   see long-distance repeats (e.g. the same random 4 KiB twice in one
//!   blob). It errs towards `false` (try the codec) on small buffers.

use std::sync::OnceLock;

/// Bytes per sample read (btrfs: SAMPLING_READ_SIZE).
const SAMPLE_READ_BYTES: usize = 16;
/// Upper bound of the sample; with 16-byte reads, 128 reads.
const SAMPLE_BYTES_MAX: usize = 2048;
/// Buffers shorter than this are never called hopeless: the codec is cheap
/// on them and a sample would be most of the buffer anyway.
const LEN_MIN: usize = 512;
/// btrfs's BYTE_SET_THRESHOLD: fewer distinct byte values is compressible.
const BYTE_SET_THRESHOLD: usize = 64;

/// Order-0 entropy (bits per byte, 8 = uniform random) at or above which
/// compression is hopeless. 7.2 bits is 90% of 8: a Huffman stage could at
/// best reach ~90% of the raw size, which fails Ceph's default
/// `compression_required_ratio` of 0.875 anyway.
pub const ENTROPY_BITS_HOPELESS: f64 = 7.2;

/// Fixed-point scale of the `c*log2(c)` table.
const FIXED_ONE: f64 = (1u64 << 20) as f64;

/// `DELTA[c] = c*log2(c) - (c-1)*log2(c-1)` in fixed point, for counts
/// 1..=SAMPLE_BYTES_MAX: adding `DELTA[new_count]` on every increment keeps
/// the sum of `c*log2(c)` over the histogram.
fn delta_table() -> &'static [u32; SAMPLE_BYTES_MAX + 1] {
    static TABLE: OnceLock<Box<[u32; SAMPLE_BYTES_MAX + 1]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let clog = |c: usize| if c < 2 { 0.0 } else { c as f64 * (c as f64).log2() };
        let mut t = Box::new([0u32; SAMPLE_BYTES_MAX + 1]);
        for (c, slot) in t.iter_mut().enumerate().skip(1) {
            *slot = ((clog(c) - clog(c - 1)) * FIXED_ONE).round() as u32;
        }
        t
    })
}

/// Sample size for a buffer of `len` bytes: about 1/8 of a 4 KiB block,
/// growing slowly (the estimate's error shrinks with the sample, not with
/// the buffer).
fn sample_bytes(len: usize) -> usize {
    match len {
        0..=8191 => 256,
        8192..=32767 => 512,
        32768..=131071 => 1024,
        _ => SAMPLE_BYTES_MAX,
    }
}

/// The btrfs-style heuristic: `true` when compressing `data` is hopeless.
/// Cheap (reads at most 2 KiB of the buffer); says `false` for text and
/// fio-style 60%-compressible data and `true` for random bytes.
pub fn looks_incompressible(data: &[u8]) -> bool {
    sample_entropy_bits(data).is_some_and(|bits| bits >= ENTROPY_BITS_HOPELESS)
}

/// The corrected sample entropy in bits per byte, or `None` when an earlier
/// btrfs test already decided "compressible" (short buffer, repeated
/// pattern, small byte set).
pub fn sample_entropy_bits(data: &[u8]) -> Option<f64> {
    if data.len() < LEN_MIN {
        return None;
    }
    let mut sample = [0u8; SAMPLE_BYTES_MAX];
    let sample_len = sample_bytes(data.len());
    let reads = sample_len / SAMPLE_READ_BYTES;
    let span = data.len() - SAMPLE_READ_BYTES;
    for i in 0..reads {
        let at = i * span / (reads - 1);
        sample[i * SAMPLE_READ_BYTES..(i + 1) * SAMPLE_READ_BYTES]
            .copy_from_slice(&data[at..at + SAMPLE_READ_BYTES]);
    }
    let sample = &sample[..sample_len];

    // 1. Repeated pattern (btrfs: sample_repeated_patterns).
    let (a, b) = sample.split_at(sample_len / 2);
    if a == b {
        return None;
    }

    // 2 and 3 in one pass: histogram, distinct count, sum of c*log2(c).
    let delta = delta_table();
    let mut counts = [0u16; 256];
    let mut distinct = 0usize;
    let mut clog_sum = 0u64;
    for &byte in sample {
        let c = &mut counts[usize::from(byte)];
        *c += 1;
        distinct += usize::from(*c == 1);
        clog_sum += u64::from(delta[usize::from(*c)]);
    }
    if distinct < BYTE_SET_THRESHOLD {
        return None;
    }
    let n = sample_len as f64;
    let plug_in = n.log2() - clog_sum as f64 / FIXED_ONE / n;
    // Miller-Madow: the plug-in estimate is low by about (K-1)/(2 n ln 2).
    let corrected = plug_in + (distinct - 1) as f64 / (2.0 * n * std::f64::consts::LN_2);
    Some(corrected.min(8.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{fio_like, random, text};

    #[test]
    fn random_is_hopeless() {
        for len in [512usize, 4096, 8192, 65536, 131072, 1 << 20] {
            for seed in 0..20 {
                let data = random(len, seed);
                assert!(looks_incompressible(&data), "random {len} seed {seed}: {:?}", sample_entropy_bits(&data));
            }
        }
    }

    #[test]
    fn compressible_data_is_not() {
        for len in [512usize, 4096, 131072] {
            for seed in 0..20 {
                assert!(!looks_incompressible(&text(len, seed)), "text {len}");
                for chunk in [0, 512, 4096] {
                    for pct in [30, 60, 90] {
                        let data = fio_like(len, pct, chunk, seed);
                        assert!(!looks_incompressible(&data), "fio {pct}% chunk {chunk} len {len}: {:?}", sample_entropy_bits(&data));
                    }
                }
                assert!(!looks_incompressible(&vec![0u8; len]));
            }
        }
        // Too short to judge.
        assert!(!looks_incompressible(&random(100, 1)));
        assert!(!looks_incompressible(&[]));
    }

    #[test]
    fn repeated_random_pattern_is_not_hopeless() {
        // The same 64 random bytes over and over: entropy is high but the
        // sample halves match, as in btrfs's repeated-pattern test.
        let unit = random(64, 9);
        let data: Vec<u8> = unit.iter().copied().cycle().take(4096).collect();
        let _ = looks_incompressible(&data); // must not panic; value depends on alignment
        let unit = random(16, 9);
        let data: Vec<u8> = unit.iter().copied().cycle().take(4096).collect();
        assert!(!looks_incompressible(&data));
    }
}
