//! What independent chunks cost a blob's ratio and give a 4 KiB read (issue
//! 37): the data is cut into 128 KiB blobs (all-zero ones dropped); each blob
//! is compressed as independent frames of CHUNK KiB (128: one frame, as the
//! engine writes today). Reported per chunk size: the ratio, compress CPU a
//! blob, and the CPU of a 4 KiB read at a random sector of each blob: the
//! CRC-32C of the frame that holds it and its decode. Thread CPU time, one
//! thread.
//!
//!   cargo run --release -p squeeze-codec --example chunk_ratio -- [--fio] [FILE] [--codec zstd|lz4] [--level 3] [--mib 512]

use squeeze_codec::{thread_cpu_ns, Algorithm, CodecId};

const BLOB: usize = 128 << 10;
const SECTOR: usize = 4096;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut level = 3;
    let mut mib = 512usize;
    let mut file = None;
    let mut fio = false;
    let mut codec = CodecId::Zstd;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--level" => {
                i += 1;
                level = args[i].parse().expect("--level N");
            }
            "--mib" => {
                i += 1;
                mib = args[i].parse().expect("--mib N");
            }
            "--codec" => {
                i += 1;
                codec = match args[i].as_str() {
                    "lz4" => CodecId::Lz4,
                    _ => CodecId::Zstd,
                };
            }
            "--fio" => fio = true,
            f => file = Some(f.to_string()),
        }
        i += 1;
    }
    let data = if fio {
        squeeze_codec::testdata::fio_like(mib << 20, 60, 4096, 0x5eed)
    } else {
        let mut d = std::fs::read(file.expect("a FILE or --fio")).expect("read FILE");
        d.truncate((mib << 20).min(d.len()) / BLOB * BLOB);
        d
    };
    let blobs: Vec<&[u8]> = data
        .chunks_exact(BLOB)
        .filter(|b| b.iter().any(|&x| x != 0))
        .collect();
    println!("{} blobs of 128 KiB, {codec:?}:{level}", blobs.len());
    let alg = Algorithm::new(codec, level);
    let mut base = 0usize;
    for chunk in [BLOB, 64 << 10, 32 << 10, 16 << 10] {
        let mut c = squeeze_codec::new_compressor(alg);
        let mut buf = Vec::new();
        let t = thread_cpu_ns();
        let frames: Vec<Vec<Vec<u8>>> = blobs
            .iter()
            .map(|b| {
                b.chunks(chunk)
                    .map(
                        |c0| match c.compress(c0, &mut buf, c0.len()).expect("compress") {
                            Some(n) => buf[..n].to_vec(),
                            None => c0.to_vec(),
                        },
                    )
                    .collect()
            })
            .collect();
        let c_ns = thread_cpu_ns() - t;
        let stored: usize = frames.iter().flatten().map(Vec::len).sum();
        if chunk == BLOB {
            base = stored;
        }
        let mut out = vec![0u8; chunk];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let t = thread_cpu_ns();
        let mut crcs = 0u32;
        for (k, f) in frames.iter().enumerate() {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let s = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) % (BLOB / SECTOR) as u64) as usize;
            let ci = s * SECTOR / chunk;
            crcs ^= squeeze_format::checksum::crc32c(&f[ci]);
            if f[ci].len() == chunk {
                out.copy_from_slice(&f[ci]);
            } else {
                squeeze_codec::decompress(codec, &f[ci], &mut out).expect("decode");
            }
            let at = s * SECTOR - ci * chunk;
            assert_eq!(
                &out[at..at + SECTOR],
                &blobs[k][s * SECTOR..(s + 1) * SECTOR]
            );
        }
        let read_ns = thread_cpu_ns() - t;
        let n = frames.len() as f64;
        println!(
            "{:>4} KiB chunks: ratio {:.4} ({:+.2}% bytes), compress {:.1} us a blob, 4 KiB read (crc + decode one chunk) {:.1} us{}",
            chunk >> 10,
            (blobs.len() * BLOB) as f64 / stored as f64,
            (stored as f64 / base as f64 - 1.0) * 100.0,
            c_ns as f64 / n / 1e3,
            read_ns as f64 / n / 1e3,
            if crcs == 1 { " " } else { "" }
        );
    }
}
