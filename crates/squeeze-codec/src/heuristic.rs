//! The incompressibility heuristic (after btrfs's `btrfs_compress_heuristic`
//! in fs/btrfs/compression.c): decide from a small sample whether running a
//! codec on a blob is hopeless, so the write path can store it raw without
//! spending codec time.
//!
//! Like btrfs it samples short reads at strides, detects a repeated pattern
//! and judges the byte-value distribution. Unlike btrfs it measures the
//! distribution by its *collision* (Rényi order-2) entropy instead of
//! Shannon entropy: `sum c*(c-1) / (n*(n-1))` is an unbiased estimate of
//! the probability that two bytes are equal even for a sample of 64 bytes
//! (the plug-in Shannon estimate is badly biased there), it needs no sort
//! and no logarithm (integers only), and it can stop as soon as the sample
//! has shown enough equal pairs. That matters because the budget is a few
//! percent of lz4's time, and lz4 runs at ~4 GB/s: tens of nanoseconds for a
//! 4 KiB blob.
//!
//! Steps:
//! 1. Buffers under `LEN_MIN` bytes: not hopeless (the codec is cheap).
//! 2. Repeated pattern (btrfs: `sample_repeated_patterns`): if
//!    `HALF_PROBES` 8-byte reads in the first half all equal their twins
//!    half a buffer later, the buffer is likely "X X": compressible.
//! 3. Byte distribution: sample single bytes at quasi-random offsets (a
//!    golden-ratio sequence: evenly spread, never aliasing with fio-style
//!    power-of-two chunks) and count equal pairs; the blob is hopeless when
//!    the collision probability is at most `1 / COLLISION_INVERSE_HOPELESS`
//!    (collision entropy >= ~6.6 bits per byte). Stops early,
//!    "compressible", once the pair count exceeds what a hopeless sample
//!    could have.
//!
//! 4. Second opinion ([`lz4_finds_repeats`], run by the CPU engine on
//!    blobs the sample calls hopeless): single-byte statistics cannot see
//!    data whose bytes look random but repeat at a distance (machine code,
//!    tables of records). On the /usr tar of docs/benchmarks.md the sample
//!    called 579 of 7,444 128 KiB blobs hopeless, and 279 of those compress
//!    below 0.99 with zstd:3 (4 MiB, 1.2% of what the volume stores). lz4
//!    over the whole blob finds such repeats and is cheap where there are
//!    none; it caught 277 of the 279.
//!
//! Invariants and limits:
//! - Cost is bounded by the sample (48, 64 or 128 bytes plus 4 pairs of
//!   8-byte reads), not by the buffer length; compressible data usually exits
//!   after 16 or 32 sampled bytes.
//! - Deterministic: the same bytes always get the same answer.
//! - A `true` answer is only a prediction: single-byte statistics cannot
//!   see long-distance repeats other than "X X" (e.g. the same random
//!   4 KiB three times in a 12 KiB blob), and near the threshold it may go
//!   either way. Both answers are safe (raw is always correct data).

/// Reads compared between the two halves for the repeated-pattern test.
const HALF_PROBES: usize = 4;
/// Byte sample for buffers under `SAMPLE_MEDIUM_FROM` bytes. 48 bytes is
/// enough to tell: uniform random bytes have ~4.4 equal pairs among 48 (a
/// hopeless sample may have at most 11), text ~70, fio 60% ~400; a random
/// blob is wrongly called compressible with probability ~0.3% (one wasted
/// codec call). Small because lz4 needs under 1 us for a random 4 KiB.
const SAMPLE_BYTES_SMALL: usize = 48;
const SAMPLE_MEDIUM_FROM: usize = 8 * 1024;
/// Byte sample for buffers from `SAMPLE_MEDIUM_FROM` bytes (~7.9 pairs for
/// random, at most 21 for hopeless).
const SAMPLE_BYTES_MEDIUM: usize = 64;
/// Byte sample for larger buffers (more spread, same statistic).
const SAMPLE_BYTES_LARGE: usize = 128;
const SAMPLE_LARGE_FROM: usize = 64 * 1024;
/// Buffers shorter than this are never called hopeless.
const LEN_MIN: usize = 256;
/// The early-exit check runs every this many sampled bytes.
const CHECK_EVERY: usize = 16;
/// Hopeless when P(two bytes equal) is at most 1/96, i.e. a collision
/// entropy of at least log2(96) = 6.58 bits per byte. Uniform random bytes give 1/256;
/// fio data with 20% compressible gives about 1/24, text about 1/16. Data
/// at the threshold compresses to roughly 90% at best, which fails Ceph's
/// default `compression_required_ratio` of 0.875 anyway.
pub const COLLISION_INVERSE_HOPELESS: u32 = 96;

// Counts are u8: no bucket can pass the sample size.
const _: () = assert!(SAMPLE_BYTES_LARGE <= u8::MAX as usize);
// Whole early-exit rounds only.
const _: () = assert!(
    SAMPLE_BYTES_SMALL / CHECK_EVERY * CHECK_EVERY == SAMPLE_BYTES_SMALL
        && SAMPLE_BYTES_MEDIUM / CHECK_EVERY * CHECK_EVERY == SAMPLE_BYTES_MEDIUM
        && SAMPLE_BYTES_LARGE / CHECK_EVERY * CHECK_EVERY == SAMPLE_BYTES_LARGE
);
const _: () = assert!(LEN_MIN >= SAMPLE_BYTES_LARGE && LEN_MIN >= 16 * HALF_PROBES);

/// The btrfs-style heuristic: `true` when compressing `data` is hopeless.
/// Cheap (reads at most 160 bytes of the buffer); says `false` for text
/// and fio-style compressible data and `true` for random bytes.
pub fn looks_incompressible(data: &[u8]) -> bool {
    judge(data).is_some()
}

/// lz4 shrinks at most to this fraction (per mille) of the input: then the
/// blob has repeats worth the real codec. Above it zstd, which adds entropy
/// coding but finds the same repeats, rarely meets a 0.875 required ratio
/// (1 in 80 such blobs of the tar).
pub const LZ4_REPEATS_PERMILLE: usize = 990;

/// Second opinion on a blob [`looks_incompressible`] calls hopeless: `true`
/// when lz4 over the whole blob shrinks it to at most
/// [`LZ4_REPEATS_PERMILLE`], i.e. it has long-distance repeats the byte
/// sample cannot see. Costs one lz4 pass (liblz4 accelerates through
/// data without matches and gives up as soon as the output passes the
/// bound); uses a per-thread scratch buffer.
pub fn lz4_finds_repeats(data: &[u8]) -> bool {
    use std::cell::RefCell;
    thread_local! {
        static LZ4: RefCell<(Box<dyn crate::Compressor>, Vec<u8>)> = RefCell::new((
            crate::new_compressor(crate::Algorithm::new(squeeze_format::CodecId::Lz4, 0)),
            Vec::new(),
        ));
    }
    let limit = data.len() * LZ4_REPEATS_PERMILLE / 1000;
    LZ4.with_borrow_mut(|(c, out)| matches!(c.compress(data, out, limit), Ok(Some(_))))
}

/// The sample's collision entropy in bits per byte when the blob looks
/// hopeless, `None` when it looks compressible (for tests and `scan`).
pub fn sample_entropy_bits(data: &[u8]) -> Option<f64> {
    judge(data)
}

fn judge(data: &[u8]) -> Option<f64> {
    let len = data.len();
    if len < LEN_MIN {
        return None;
    }
    if halves_repeat(data) {
        return None;
    }
    let n = if len < SAMPLE_MEDIUM_FROM {
        SAMPLE_BYTES_SMALL
    } else if len < SAMPLE_LARGE_FROM {
        SAMPLE_BYTES_MEDIUM
    } else {
        SAMPLE_BYTES_LARGE
    } as u32;
    // Equal pairs a hopeless sample may have: n(n-1)/2 * 1/K.
    let pairs_max = n * (n - 1) / 2 / COLLISION_INVERSE_HOPELESS;
    // Golden-ratio additive sequence over [0, len): evenly spread offsets
    // that never alias with power-of-two chunk sizes.
    let step = ((len as u128 * 0x9E37_79B9_7F4A_7C15u128) >> 64) as usize;
    let mut at = step / 2;
    let mut counts = [0u8; 256];
    let mut pairs = 0u32;
    for _ in 0..n as usize / CHECK_EVERY {
        for _ in 0..CHECK_EVERY {
            let c = &mut counts[usize::from(data[at])];
            pairs += u32::from(*c);
            *c += 1;
            at += step;
            if at >= len {
                at -= len;
            }
        }
        if pairs > pairs_max {
            return None;
        }
    }
    // Collision entropy: -log2(sum c(c-1) / n(n-1)) = -log2(2 pairs / n(n-1)).
    let p = f64::from((2 * pairs).max(1)) / f64::from(n * (n - 1));
    Some(-p.log2())
}

/// Whether the buffer looks like two copies of its first half.
fn halves_repeat(data: &[u8]) -> bool {
    let half = data.len() / 2;
    let stride = (half - 8) / HALF_PROBES;
    (0..HALF_PROBES).all(|i| {
        let at = i * stride + stride / 2;
        data[at..at + 8] == data[half + at..half + at + 8]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{fio_like, random, text};

    #[test]
    fn random_is_hopeless() {
        for len in [256usize, 512, 4096, 8192, 65536, 131072, 1 << 20] {
            for seed in 0..200 {
                let data = random(len, seed);
                assert!(
                    looks_incompressible(&data),
                    "random {len} seed {seed}: {:?}",
                    sample_entropy_bits(&data)
                );
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
                        assert!(
                            !looks_incompressible(&data),
                            "fio {pct}% chunk {chunk} len {len}: {:?}",
                            sample_entropy_bits(&data)
                        );
                    }
                }
                assert!(!looks_incompressible(&vec![0u8; len]));
            }
        }
        // Too short to judge.
        assert!(!looks_incompressible(&random(255, 1)));
        assert!(!looks_incompressible(&[]));
    }

    #[test]
    fn repeated_random_pattern_is_not_hopeless() {
        // The same 64 random bytes over and over: entropy is high but the
        // sample halves match, as in btrfs's repeated-pattern test.
        let unit = random(64, 9);
        let data: Vec<u8> = unit.iter().copied().cycle().take(4096).collect();
        assert!(!looks_incompressible(&data));
        // Two copies of one random half.
        let half = random(2048, 10);
        let data = [half.clone(), half].concat();
        assert!(!looks_incompressible(&data));
        let unit = random(16, 9);
        let data: Vec<u8> = unit.iter().copied().cycle().take(4096).collect();
        assert!(!looks_incompressible(&data));
    }

    #[test]
    fn lz4_second_opinion_sees_repeats_the_sample_cannot() {
        // Random bytes repeating every 20,000 bytes: the byte sample calls
        // the blob hopeless (the halves of 64 KiB are not copies), lz4 finds
        // the repeats.
        for len in [8192usize, 65536, 131072] {
            let unit = random(len.min(20_000) * 2 / 5, 3);
            let data: Vec<u8> = unit.iter().copied().cycle().take(len).collect();
            assert!(looks_incompressible(&data), "sample, len {len}");
            assert!(lz4_finds_repeats(&data), "lz4, len {len}");
        }
        // Truly random blobs stay hopeless.
        for len in [4096usize, 65536, 131072] {
            for seed in 0..20 {
                assert!(!lz4_finds_repeats(&random(len, seed)), "random {len}");
            }
        }
    }
}
