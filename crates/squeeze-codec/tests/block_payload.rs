//! Block payloads (format 6, `squeeze_format::zstd_block`): zstd's body of
//! one block, the frame implied and the zero tail cut, round-trip at every
//! blob size and level; other codecs have none; a corrupt body is an
//! error, never a panic; a job asks for one and says it got one.

use squeeze_codec::testdata::{fio_like, random, text};
use squeeze_codec::{
    decompress_block, engine::run_job, new_compressor, Algorithm, BlockOutcome, Job, JobOutput,
};
use std::sync::Arc;

/// A sector like a sparse squeeze-wal commit's: bytes, then zeros.
fn commit_sector(len: usize) -> Vec<u8> {
    let mut s = random(len / 2, 5);
    s.extend_from_slice(&s.clone());
    s.resize(4096, 0);
    s
}

fn round_trip(alg: &str, src: &[u8], limit: usize) -> BlockOutcome {
    let mut c = new_compressor(Algorithm::parse(alg).unwrap());
    let mut dst = Vec::new();
    let out = c.compress_block(src, &mut dst, limit).unwrap();
    if let BlockOutcome::Body(n) = out {
        assert_eq!(dst.len(), n);
        assert!(n <= limit && n < src.len());
        let mut back = vec![0xa5u8; src.len()];
        decompress_block(&dst, &mut back).unwrap();
        assert!(back == src, "{alg}: {} bytes", src.len());
    }
    out
}

#[test]
fn block_payloads_round_trip() {
    for alg in ["zstd:-7", "zstd:1", "zstd:3", "zstd:19"] {
        let s = commit_sector(128);
        assert!(
            matches!(round_trip(alg, &s, 3584), BlockOutcome::Body(n) if n < 100),
            "{alg}"
        );
        for sectors in [1usize, 2, 3, 8, 32] {
            let len = sectors * 4096;
            // fio's data is random bytes and a zero tail: zstd stores the
            // bytes raw, which is no block payload (a frame then).
            let fio = fio_like(len, 60, 4096, 9);
            assert!(matches!(
                round_trip(alg, &fio, len * 7 / 8),
                BlockOutcome::Body(_) | BlockOutcome::NotABlock
            ));
            let mut wal = commit_sector(2048);
            wal.resize(len, 0);
            for src in [text(len, 8), wal] {
                let out = round_trip(alg, &src, len * 7 / 8);
                // zstd:19 may split 128 KiB into blocks: a frame then.
                let split = sectors == 32 && out == BlockOutcome::NotABlock;
                assert!(
                    matches!(out, BlockOutcome::Body(_)) || split,
                    "{alg} {sectors}: {out:?}"
                );
            }
        }
        // Nothing to store: zeros are not a block; random bytes too big.
        assert_eq!(round_trip(alg, &[0u8; 4096], 3584), BlockOutcome::NotABlock);
        assert_eq!(
            round_trip(alg, &random(4096, 1), 3584),
            BlockOutcome::TooBig
        );
    }
    // The limit is kept.
    let s = commit_sector(128);
    let BlockOutcome::Body(n) = round_trip("zstd:3", &s, 3584) else {
        panic!("no block");
    };
    // (The library wants a little room beyond the result: exactly `n` may
    // be too big for it, which only costs a frame.)
    assert_eq!(round_trip("zstd:3", &s, n + 16), BlockOutcome::Body(n));
    assert_eq!(round_trip("zstd:3", &s, n - 1), BlockOutcome::TooBig);
}

#[test]
fn other_codecs_have_no_block_payload() {
    for alg in ["lz4", "snappy", "deflate", "none"] {
        assert_eq!(
            round_trip(alg, &commit_sector(128), 3584),
            BlockOutcome::NotABlock,
            "{alg}"
        );
    }
}

#[test]
fn a_corrupt_block_payload_is_an_error() {
    let s = commit_sector(128);
    let mut c = new_compressor(Algorithm::parse("zstd:3").unwrap());
    let mut body = Vec::new();
    assert!(matches!(
        c.compress_block(&s, &mut body, 3584).unwrap(),
        BlockOutcome::Body(_)
    ));
    let mut out = vec![0u8; 4096];
    for at in 0..body.len() {
        for bit in [1u8, 0x80] {
            let mut bad = body.clone();
            bad[at] ^= bit;
            // Decodes to something or fails; never panics.
            let _ = decompress_block(&bad, &mut out);
        }
    }
    assert!(decompress_block(&body[..body.len() - 1], &mut out).is_err());
    assert!(decompress_block(&[], &mut out).is_err());
    assert!(decompress_block(&body, &mut [0u8; 64]).is_err(), "too long");
    assert!(decompress_block(&body, &mut vec![0u8; 256 << 10]).is_err());
}

#[test]
fn a_job_asks_for_a_block_payload_and_says_it_got_one() {
    // Only a small frame is tried again as a block.
    let big = Arc::new(text(32768, 3));
    let mut c = new_compressor(Algorithm::parse("zstd:3").unwrap());
    let mut scratch = Vec::new();
    let job = Job::new(big, 0..32768, 28672, false).with_block(true);
    let r = run_job(c.as_mut(), &job, &mut scratch).unwrap();
    assert!(
        matches!(&r.output, JobOutput::Compressed(o) if o.len() > squeeze_codec::engine::BLOCK_TRY_MAX)
    );
    assert!(!r.block);

    let s = Arc::new(commit_sector(128));
    for block in [false, true] {
        let job = Job::new(s.clone(), 0..4096, 3584, false)
            .with_checksum()
            .with_block(block);
        let r = run_job(c.as_mut(), &job, &mut scratch).unwrap();
        let JobOutput::Compressed(out) = &r.output else {
            panic!("not compressed");
        };
        assert_eq!(r.block, block);
        assert_eq!(r.output_crc32c, Some(squeeze_format::checksum::crc32c(out)));
        let mut back = vec![0u8; 4096];
        if block {
            decompress_block(out, &mut back).unwrap();
        } else {
            squeeze_codec::decompress(squeeze_format::CodecId::Zstd, out, &mut back).unwrap();
        }
        assert!(back[..] == s[..]);
    }
}
