//! The ISA-L deflate engine: its records are raw DEFLATE that libdeflate
//! (squeeze's read path) decodes, it honours the output limit, the pool
//! with ISA-L behind it answers batches like the CPU pool, and levels ISA-L
//! does not have stay on libdeflate. Needs Debian's libisal-dev at build
//! time: without it these tests print SKIPPED, and fail under CI=true.

use squeeze_codec::isal;
use squeeze_codec::testdata::{fio_like, random, text};
use squeeze_codec::{decompress, Algorithm, CodecId, CompressEngine, Job, JobOutput};
use std::sync::Arc;

fn present() -> bool {
    if isal::available() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "ISA-L missing under CI=true: .ci/run installs libisal-dev"
    );
    eprintln!("SKIPPED: squeeze-codec built without ISA-L (apt-get install libisal-dev)");
    false
}

#[test]
fn isal_records_decode_with_libdeflate() {
    if !present() {
        return;
    }
    for level in 1..=3 {
        let alg = Algorithm::new(CodecId::Deflate, level);
        assert!(isal::runs(alg));
        let mut c = isal::try_new_compressor(alg).unwrap();
        for (what, src) in [
            ("fio 60%", fio_like(128 << 10, 60, 4096, level as u64)),
            ("text", text(64 << 10, 3)),
            ("4 KiB", fio_like(4096, 60, 4096, 9)),
        ] {
            let mut dst = Vec::new();
            let n = c
                .compress(&src, &mut dst, src.len())
                .unwrap()
                .unwrap_or_else(|| panic!("level {level} {what}: did not fit"));
            assert_eq!(n, dst.len());
            assert!(n < src.len() * 3 / 4, "level {level} {what}: {n} bytes");
            let mut back = vec![0u8; src.len()];
            decompress(CodecId::Deflate, &dst, &mut back).unwrap();
            assert!(back == src, "level {level} {what}: round trip differs");
        }
    }
}

#[test]
fn isal_honours_the_limit() {
    if !present() {
        return;
    }
    let mut c = isal::try_new_compressor(Algorithm::new(CodecId::Deflate, 1)).unwrap();
    let src = random(64 << 10, 1);
    let mut dst = vec![1u8; 10];
    assert_eq!(c.compress(&src, &mut dst, src.len() / 2).unwrap(), None);
    assert!(dst.is_empty());
    // ISA-L wants a little slack beyond its output (it writes in words):
    // with some room it fits; with less than the output it never does.
    let src = fio_like(64 << 10, 60, 4096, 2);
    let n = c.compress(&src, &mut dst, src.len()).unwrap().unwrap();
    assert_eq!(c.compress(&src, &mut dst, n + 256).unwrap(), Some(n));
    assert_eq!(dst.len(), n);
    for short in [n - 1, n / 2, 1] {
        assert_eq!(c.compress(&src, &mut dst, short).unwrap(), None);
        assert!(dst.is_empty());
    }
}

#[test]
fn levels_isal_lacks_stay_on_libdeflate() {
    for level in [0, 4, 6, 12] {
        assert!(!isal::runs(Algorithm::new(CodecId::Deflate, level)) || level == 0);
    }
    assert!(!isal::runs(Algorithm::new(CodecId::Zstd, 1)));
    // deflate:0 is libdeflate's default (6): not ISA-L's.
    assert!(!isal::runs(Algorithm::new(CodecId::Deflate, 0)));
}

#[test]
fn the_isal_pool_answers_batches() {
    if !present() {
        return;
    }
    let pool = isal::isal_pool(2);
    assert_eq!(pool.name(), "isal-pool");
    let input = Arc::new(fio_like(1 << 20, 60, 4096, 5));
    let jobs: Vec<Job> = (0..8)
        .map(|k| Job {
            input: Arc::clone(&input),
            range: k << 17..(k + 1) << 17,
            limit: 1 << 17,
            skip_if_incompressible: false,
            checksum: true,
            chunk_bytes: 0,
            block: false,
        })
        .collect();
    for alg in ["deflate:1", "deflate:6", "zstd:3"] {
        let alg = Algorithm::parse(alg).unwrap();
        let results = pool.compress_batch(alg, jobs.clone());
        assert_eq!(results.len(), 8);
        for (k, r) in results.iter().enumerate() {
            let JobOutput::Compressed(out) = &r.output else {
                panic!("{alg} job {k}: {:?}", r.output);
            };
            assert_eq!(r.output_crc32c, Some(squeeze_format::checksum::crc32c(out)));
            let mut back = vec![0u8; 1 << 17];
            decompress(alg.codec, out, &mut back).unwrap();
            assert!(back[..] == input[k << 17..(k + 1) << 17]);
        }
    }
    assert_eq!(pool.failed_jobs(), 0);
}
