//! Bad payloads give `Err`, never a panic: truncation, bit flips, garbage,
//! and a valid payload decoded to the wrong length, for every codec.

use squeeze_codec::testdata::{fio_like, random, text, SplitMix64};
use squeeze_codec::{decompress, new_compressor, Algorithm, CodecError, CodecId};

const CODECS: [CodecId; 4] = [
    CodecId::Lz4,
    CodecId::Zstd,
    CodecId::Snappy,
    CodecId::Deflate,
];

fn compressed(codec: CodecId, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    new_compressor(Algorithm::new(codec, 0))
        .compress(data, &mut out, usize::MAX)
        .unwrap()
        .unwrap();
    out
}

#[test]
fn truncated_input_is_an_error() {
    for codec in CODECS {
        let data = text(4096, 1);
        let c = compressed(codec, &data);
        let mut dst = vec![0u8; data.len()];
        for cut in [0, 1, c.len() / 2, c.len() - 1] {
            assert!(
                decompress(codec, &c[..cut], &mut dst).is_err(),
                "{codec:?}: truncated to {cut} of {} bytes decoded",
                c.len()
            );
        }
    }
}

#[test]
fn wrong_expected_length_is_an_error() {
    for codec in CODECS.into_iter().chain([CodecId::None]) {
        let data = fio_like(4096, 60, 512, 2);
        let c = if codec == CodecId::None {
            data.clone()
        } else {
            compressed(codec, &data)
        };
        for len in [0, 1, 4095, 4097, 8192] {
            let mut dst = vec![0u8; len];
            let err = decompress(codec, &c, &mut dst).unwrap_err();
            assert!(
                matches!(
                    err,
                    CodecError::WrongLength { .. }
                        | CodecError::TooLong { .. }
                        | CodecError::Corrupt { .. }
                ),
                "{codec:?} len {len}: {err}"
            );
        }
    }
}

#[test]
fn garbage_and_bit_flips_never_panic() {
    let mut rng = SplitMix64::new(42);
    for codec in CODECS {
        let data = text(8192, 3);
        let c = compressed(codec, &data);
        let mut dst = vec![0u8; data.len()];
        for _ in 0..2000 {
            let mut bad = c.clone();
            let flips = 1 + rng.next_u64() % 4;
            for _ in 0..flips {
                let at = (rng.next_u64() % bad.len() as u64) as usize;
                bad[at] ^= 1 << (rng.next_u64() % 8);
            }
            // Either an error or (when a flip hits a literal) wrong bytes of
            // the right length; never a panic. The record checksum catches
            // the latter.
            let _ = decompress(codec, &bad, &mut dst);
        }
        for len in [0usize, 1, 7, 100, 5000] {
            let junk = random(len, len as u64);
            let _ = decompress(codec, &junk, &mut dst);
        }
        // Pure random input must not decode to exactly 8 KiB.
        assert!(
            decompress(codec, &random(300, 5), &mut dst).is_err(),
            "{codec:?}"
        );
    }
}
