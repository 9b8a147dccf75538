//! What a trained zstd dictionary would gain on 4 KiB blobs (issue 16's
//! "small blobs" item): the data is cut into 4 KiB blobs (all-zero ones
//! dropped: squeeze stores none), a dictionary is trained with zstd's own
//! trainer (ZDICT, through the zstd crate) on blobs spread evenly over the
//! data, as a volume would train on its own data, and the other blobs are
//! compressed with and without it at the same level. Reported: the codec's
//! ratio, and the ratio as squeeze would store the blobs (a 64-byte record
//! header each, packed at 16 bytes, a blob kept raw when it does not fit in
//! 87.5% of 4 KiB: the default policy's required ratio).
//!
//!   cargo run --release -p squeeze-codec --example dict_4k -- FILE...
//!   cargo run --release -p squeeze-codec --example dict_4k -- --fio --kv
//!
//! `--fio`: 256 MiB of fio's data (buffer_compress_percentage=60, 4 KiB
//! chunks, refilled); `--kv`: 256 MiB of squeeze-kv buckets as the YCSB load
//! leaves them (about 2.3 records of `user` + 12 digits and a 400-byte
//! db_bench-like value per bucket, half random; a 12-byte bucket header,
//! zeros after the records). Options: `--level N` (3), `--dict-kib N` (64).

use squeeze_codec::testdata;
use std::time::Instant;

const BLOB: usize = 4096;
const HEADER: usize = 64;

fn stored(len: usize) -> usize {
    if len * 8 > BLOB * 7 {
        HEADER + BLOB
    } else {
        HEADER + len.div_ceil(16) * 16
    }
}

/// Buckets like squeeze-kv's after a YCSB load at half a bucket per record.
fn kv_buckets(total: usize) -> Vec<u8> {
    let mut out = vec![0u8; total];
    let mut i = 0u64;
    for (b, bucket) in out.chunks_mut(BLOB).enumerate() {
        // 0-4 records, 2.3 on average (an uneven hash fill).
        let n = [2, 3, 1, 2, 4, 3, 2, 1, 3, 2][b % 10] as usize;
        let mut at = 12;
        bucket[0..4].copy_from_slice(b"SQKB");
        bucket[4..6].copy_from_slice(&(n as u16).to_le_bytes());
        for _ in 0..n {
            let key = format!(
                "user{:012}",
                i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 1_000_000_000_000
            );
            let half = testdata::random(200, i);
            let mut value = half.clone();
            value.extend_from_slice(&half);
            i += 1;
            if at + 4 + key.len() + value.len() > BLOB {
                break;
            }
            bucket[at..at + 2].copy_from_slice(&(key.len() as u16).to_le_bytes());
            bucket[at + 2..at + 4].copy_from_slice(&(value.len() as u16).to_le_bytes());
            at += 4;
            bucket[at..at + key.len()].copy_from_slice(key.as_bytes());
            at += key.len();
            bucket[at..at + value.len()].copy_from_slice(&value);
            at += value.len();
        }
        bucket[6..8].copy_from_slice(&(at as u16).to_le_bytes());
        let crc = at as u32 ^ 0x5bd1_e995u32.wrapping_mul(b as u32);
        bucket[8..12].copy_from_slice(&crc.to_le_bytes());
    }
    out
}

fn measure(name: &str, data: &[u8], level: i32, dict_kib: usize) {
    let blobs: Vec<&[u8]> = data
        .chunks_exact(BLOB)
        .filter(|b| b.iter().any(|&x| x != 0))
        .collect();
    if blobs.len() < 1000 {
        eprintln!("{name}: only {} non-zero 4 KiB blobs; skipped", blobs.len());
        return;
    }
    // Train on every k-th blob, about 100 times the dictionary's size.
    let want = (dict_kib << 10) * 100 / BLOB;
    let step = (blobs.len() / want).max(2);
    let samples: Vec<&[u8]> = blobs.iter().step_by(step).copied().collect();
    let t = Instant::now();
    let dict = zstd::dict::from_samples(&samples, dict_kib << 10).expect("train");
    let train_s = t.elapsed().as_secs_f64();
    let mut plain = zstd::bulk::Compressor::new(level).expect("cctx");
    let mut with = zstd::bulk::Compressor::with_dictionary(level, &dict).expect("cctx dict");
    let (mut raw, mut c0, mut c1, mut s0, mut s1) = (0usize, 0usize, 0usize, 0usize, 0usize);
    let (mut t0, mut t1) = (0f64, 0f64);
    for (k, b) in blobs.iter().enumerate() {
        if k % step == 0 {
            continue; // a training blob
        }
        raw += b.len();
        let t = Instant::now();
        let a = plain.compress(b).expect("compress").len();
        t0 += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let d = with.compress(b).expect("compress").len();
        t1 += t.elapsed().as_secs_f64();
        c0 += a;
        c1 += d;
        s0 += stored(a);
        s1 += stored(d);
    }
    let mb = raw as f64 / 1e6;
    println!(
        "| {name} | {} | {:.2} | {:.2} | **{:+.1}%** | {:.2} | {:.2} | **{:+.1}%** | {:.0} / {:.0} | {:.1} |",
        blobs.len(),
        raw as f64 / c0 as f64,
        raw as f64 / c1 as f64,
        (c0 as f64 / c1 as f64 - 1.0) * 100.0,
        raw as f64 / s0 as f64,
        raw as f64 / s1 as f64,
        (s0 as f64 / s1 as f64 - 1.0) * 100.0,
        mb / t0,
        mb / t1,
        train_s,
    );
}

fn main() {
    let mut level = 3;
    let mut dict_kib = 64;
    let mut sets: Vec<(String, Vec<u8>)> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--level" => level = args.next().and_then(|v| v.parse().ok()).expect("--level N"),
            "--dict-kib" => {
                dict_kib = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--dict-kib N")
            }
            "--fio" => sets.push((
                "fio data (60%, 4 KiB chunks)".into(),
                testdata::fio_like(256 << 20, 60, 4096, 7),
            )),
            "--kv" => sets.push((
                "squeeze-kv buckets (YCSB load)".into(),
                kv_buckets(256 << 20),
            )),
            path => {
                let data = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
                sets.push((path.to_string(), data));
            }
        }
    }
    if sets.is_empty() {
        eprintln!("usage: dict_4k [--level N] [--dict-kib N] [--fio] [--kv] [FILE...]");
        std::process::exit(2);
    }
    println!(
        "zstd level {level}, a {dict_kib} KiB dictionary; ratios over the blobs not trained on"
    );
    println!();
    println!("| data | 4 KiB blobs | codec ratio | with dictionary | gain | stored ratio | with dictionary | gain | MB/s per core, without / with | training s |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, data) in &sets {
        measure(name, data, level, dict_kib);
    }
}
