//! Every codec and several levels round-trip zeros, random, text and
//! fio-like data of 1, 4096 and 131072 bytes, and honour `limit`.

use squeeze_codec::testdata::{fio_like, random, text};
use squeeze_codec::{decompress, new_compressor, new_decompressor, Algorithm, CodecId};

fn algorithms() -> Vec<Algorithm> {
    [
        "lz4",
        "zstd",
        "zstd:-7",
        "zstd:3",
        "zstd:19",
        "snappy",
        "deflate",
        "deflate:1",
        "deflate:12",
    ]
    .iter()
    .map(|s| Algorithm::parse(s).unwrap())
    .collect()
}

fn inputs() -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    for len in [1usize, 4096, 131072] {
        v.push((format!("zeros/{len}"), vec![0u8; len]));
        v.push((format!("random/{len}"), random(len, 7)));
        v.push((format!("text/{len}"), text(len, 8)));
        v.push((format!("fio60/{len}"), fio_like(len, 60, 4096, 9)));
    }
    v
}

#[test]
fn every_codec_round_trips() {
    let mut dec = new_decompressor();
    for alg in algorithms() {
        let mut c = new_compressor(alg);
        assert_eq!(c.algorithm(), alg);
        let mut out = Vec::new();
        for (name, data) in inputs() {
            // Unlimited: every codec must produce something.
            let n = c
                .compress(&data, &mut out, usize::MAX)
                .unwrap()
                .unwrap_or_else(|| panic!("{alg} {name}: no output with no limit"));
            assert_eq!(n, out.len(), "{alg} {name}");
            let mut back = vec![0xAAu8; data.len()];
            dec.decompress(alg.codec, &out, &mut back).unwrap();
            assert!(back == data, "{alg} {name}: round trip differs");
            // The thread-local path too.
            let mut back2 = vec![0x55u8; data.len()];
            decompress(alg.codec, &out, &mut back2).unwrap();
            assert!(
                back2 == data,
                "{alg} {name}: thread-local round trip differs"
            );
        }
    }
}

#[test]
fn compressible_data_shrinks() {
    for alg in algorithms() {
        let mut c = new_compressor(alg);
        let mut out = Vec::new();
        let data = fio_like(131072, 60, 4096, 1);
        let n = c.compress(&data, &mut out, data.len()).unwrap().unwrap();
        assert!(n < data.len() / 2, "{alg}: fio60 compressed to {n}");
        let zeros = vec![0u8; 4096];
        let n = c.compress(&zeros, &mut out, zeros.len()).unwrap().unwrap();
        // snappy copies at most 64 bytes per 3-byte tag: ~200 bytes.
        assert!(n < 256, "{alg}: 4 KiB of zeros compressed to {n}");
    }
}

#[test]
fn limit_is_honoured() {
    for alg in algorithms() {
        let mut c = new_compressor(alg);
        let mut out = vec![1u8; 10];
        for len in [4096usize, 131072] {
            let data = random(len, 3);
            for limit in [0, 1, len / 2, len - 1] {
                assert_eq!(
                    c.compress(&data, &mut out, limit).unwrap(),
                    None,
                    "{alg} {len} {limit}"
                );
                assert!(out.is_empty(), "{alg}: dst not cleared on None");
            }
            // Compressible data under a limit just above its compressed size.
            let data = text(len, 4);
            let n = c.compress(&data, &mut out, usize::MAX).unwrap().unwrap();
            assert_eq!(
                c.compress(&data, &mut out, n).unwrap(),
                Some(n),
                "{alg} exact limit"
            );
            assert_eq!(
                c.compress(&data, &mut out, n - 1).unwrap(),
                None,
                "{alg} limit - 1"
            );
            // A Vec with spare capacity from an earlier call must not let
            // output past the limit.
            let mut big = Vec::with_capacity(4 * len);
            assert_eq!(
                c.compress(&data, &mut big, n - 1).unwrap(),
                None,
                "{alg} big dst"
            );
        }
    }
}

#[test]
fn none_never_compresses_and_copies_on_decode() {
    let mut c = new_compressor(Algorithm::new(CodecId::None, 0));
    let mut out = Vec::new();
    assert_eq!(c.compress(&[0u8; 4096], &mut out, 4096).unwrap(), None);
    let data = text(100, 1);
    let mut back = vec![0u8; 100];
    decompress(CodecId::None, &data, &mut back).unwrap();
    assert_eq!(back, data);
    assert!(decompress(CodecId::None, &data, &mut [0u8; 99]).is_err());
}

#[test]
fn empty_input_round_trips() {
    for alg in algorithms() {
        let mut out = Vec::new();
        let n = new_compressor(alg)
            .compress(&[], &mut out, usize::MAX)
            .unwrap()
            .unwrap();
        assert_eq!(n, out.len());
        decompress(alg.codec, &out, &mut []).unwrap();
    }
}
