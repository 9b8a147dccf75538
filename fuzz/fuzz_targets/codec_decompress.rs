//! squeeze_codec::decompress for every CodecId on arbitrary payloads with an
//! arbitrary expected length (<= 256 KiB): an `Err` or exactly that many
//! bytes, never a panic; the same for `decompress_block` (format 6's block
//! payloads).
//! Also, on the same bytes used as data: every codec's
//! compressor round-trips them, honours its limit, and squeeze's lz4 output
//! and lz4_flex's decode with each other (on-disk compatibility).
//!
//! Input: 3 bytes of expected length (little-endian, modulo 256 KiB + 1),
//! then the payload.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;

use squeeze_codec::{
    decompress, decompress_block, new_compressor, Algorithm, BlockOutcome, CodecId, Compressor,
};

const MAX_LEN: usize = 256 << 10;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let len = (usize::from(data[0]) | usize::from(data[1]) << 8 | usize::from(data[2]) << 16)
        % (MAX_LEN + 1);
    let payload = &data[3..];
    // Decode twice into buffers of different prior content: a decoder
    // that accepts must fill every byte itself (no stale data from an
    // earlier read leaks into the output).
    let mut a = vec![0x00u8; len];
    let mut b = vec![0xffu8; len];
    for codec in CodecId::ALL {
        let ra = decompress(codec, payload, &mut a);
        let rb = decompress(codec, payload, &mut b);
        assert_eq!(
            ra.is_ok(),
            rb.is_ok(),
            "{codec:?}: accepts depending on dst"
        );
        if ra.is_ok() {
            assert!(a == b, "{codec:?}: output depends on dst's prior content");
            if codec == CodecId::None {
                assert_eq!(&a[..], payload);
            }
        }
    }
    let ra = decompress_block(payload, &mut a);
    let rb = decompress_block(payload, &mut b);
    assert_eq!(ra.is_ok(), rb.is_ok(), "block: accepts depending on dst");
    if ra.is_ok() {
        assert!(a == b, "block: output depends on dst's prior content");
    }
    // Where liblz4 (squeeze) and lz4_flex both accept a block of exactly
    // `len` bytes, they agree on its content. (liblz4 is laxer: it accepts
    // matches with offset 0, which no compressor emits, and decodes them
    // as zeros; lz4_flex rejects them. See tests/lz4_compat.rs.)
    if decompress(CodecId::Lz4, payload, &mut a).is_ok() {
        if let Ok(n) = lz4_flex::block::decompress_into(payload, &mut b) {
            assert_eq!(n, len, "lz4_flex decodes a different length");
            assert!(a == b, "liblz4 and lz4_flex decode differently");
        }
    }

    round_trip(payload);
});

thread_local! {
    /// Compressors live across inputs (a zstd context is costly to build).
    static COMPRESSORS: RefCell<Vec<Box<dyn Compressor>>> = RefCell::new(
        ["lz4", "zstd", "zstd:-5", "snappy", "deflate:1"]
            .into_iter()
            .map(|a| new_compressor(Algorithm::parse(a).expect("algorithm")))
            .collect(),
    );
}

fn round_trip(raw: &[u8]) {
    COMPRESSORS.with_borrow_mut(|cs| {
        for c in cs.iter_mut() {
            round_trip_one(&mut **c, raw);
        }
    });
}

fn round_trip_one(c: &mut dyn Compressor, raw: &[u8]) {
    let mut out = Vec::new();
    let mut back = vec![0u8; raw.len()];
    {
        let alg = c.algorithm();
        let Some(n) = c.compress(raw, &mut out, usize::MAX).expect("compress") else {
            panic!("{alg}: no output without a limit");
        };
        assert_eq!(n, out.len());
        decompress(alg.codec, &out, &mut back).expect("decompress own output");
        assert!(back[..] == raw[..], "{alg}: round trip differs");
        if let BlockOutcome::Body(_) = c.compress_block(raw, &mut out, usize::MAX).expect("block") {
            back.fill(0xa5);
            decompress_block(&out, &mut back).expect("decompress own block");
            assert!(back[..] == raw[..], "{alg}: block round trip differs");
        }
        if alg.codec == CodecId::Lz4 {
            let mut flex = vec![0u8; raw.len()];
            let m = lz4_flex::block::decompress_into(&out, &mut flex).expect("lz4_flex decode");
            assert!(
                m == raw.len() && flex[..] == raw[..],
                "lz4_flex decodes ours differently"
            );
            let theirs = lz4_flex::block::compress(raw);
            decompress(CodecId::Lz4, &theirs, &mut back).expect("decode lz4_flex output");
            assert!(
                back[..] == raw[..],
                "liblz4 decodes lz4_flex's output differently"
            );
        }
        // A limit one below the size: nothing, and dst left empty.
        if n > 0 {
            assert_eq!(c.compress(raw, &mut out, n - 1).expect("compress"), None);
            assert!(out.is_empty());
            assert_eq!(c.compress(raw, &mut out, n).expect("compress"), Some(n));
        }
    }
}
