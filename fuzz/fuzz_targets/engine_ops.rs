//! Operation sequences against squeeze_engine::Volume on SimStorage (a
//! 1 MiB volume, 512 KiB segments), checked against an in-memory model:
//! every read, and the whole volume after the last operation and after each
//! clean reopen, must equal the model; block status must report holes only
//! where the model holds zeros; the accounting invariants must hold.
//!
//! Input (easy to write by hand, see README.md): byte 0 picks the initial
//! policy (codec = b % 5, mode = b / 5 % 4); then 8-byte operations
//! `[op, off0, off1, off2, len0, len1, len2, arg]`, offset and length
//! little-endian 24-bit, offset taken modulo the volume size, length modulo
//! 256 KiB + 1 and clipped to the volume's end. At most 64 operations.
//!
//! op % 10: 0 write (arg: bits 0-2 data kind, bit 3 FUA, bits 4-5 hint,
//! bits 6-7 seed), 1 read, 2 trim (arg bit 3 FUA), 3 write-zeroes (bit 3
//! FUA), 4 flush, 5 checkpoint, 6 close + reopen, 7 cleaner pass (arg
//! bit 0: merge every fragmented window first; bit 1: a deduplication
//! pass first, which shares what writes of the same kind, seed and
//! length repeated), 8 set policy (arg), 9 block status.

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use squeeze_codec::testdata::{fio_like, random, text};
use squeeze_engine::{
    default_policy, CodecId, CompressEngine, CompressionMode, CpuPool, CreateOptions, Hint,
    OpenOptions, Policy, SimStorage, Volume, SECTOR_SIZE,
};

const SIZE: u64 = 1 << 20;
const MAX_LEN: u64 = 256 << 10;
const MAX_OPS: usize = 64;

fn open_options() -> OpenOptions {
    // One compression pool for the whole process (a pool per volume would
    // spawn threads for every input).
    static POOL: OnceLock<Arc<dyn CompressEngine>> = OnceLock::new();
    let engine = POOL.get_or_init(|| Arc::new(CpuPool::new(1))).clone();
    OpenOptions {
        read_only: false,
        engine: Some(engine),
        background: false,
        ..Default::default()
    }
}

fn policy(b: u8) -> Policy {
    let mut p = default_policy();
    p.codec = CodecId::ALL[usize::from(b % 5)];
    p.mode = CompressionMode::ALL[usize::from(b / 5 % 4)];
    p
}

/// A policy from one byte: codec, mode, blob sizes, recompression.
fn policy_from_arg(b: u8, rotate: u8) -> Policy {
    let mut p = policy(b);
    let sector = SECTOR_SIZE as u32;
    p.min_blob = sector * (1 + u32::from(rotate % 4));
    p.max_blob = p.min_blob.max(sector * (1 + u32::from(rotate / 4 % 32)));
    p.recompress_codec = CodecId::ALL[usize::from(rotate / 64)];
    p.level = 0;
    // One frame a blob, or chunks of 4 to 64 KiB (format 5).
    p.read_chunk = [0, 4096, 8192, 16384, 32768, 65536][usize::from(b / 20 % 6)];
    p
}

fn data(kind: u8, seed: u64, len: usize) -> Vec<u8> {
    match kind {
        0 => vec![0; len],
        1 => vec![seed as u8 | 1; len],
        2 => random(len, seed),
        3 => text(len, seed),
        4 => fio_like(len, 60, 512, seed),
        5 => fio_like(len, 90, 4096, seed),
        // Zero sectors between random ones.
        6 => {
            let mut d = random(len, seed);
            for (i, s) in d.chunks_mut(SECTOR_SIZE).enumerate() {
                if i % 2 == 0 {
                    s.fill(0);
                }
            }
            d
        }
        // Every 8 bytes: its position in the volume-to-be (a misplaced
        // sector shows).
        _ => (0..len).map(|i| (i / 8) as u8 ^ (i / 2048) as u8).collect(),
    }
}

struct Fuzz {
    storage: Arc<SimStorage>,
    vol: Option<Volume>,
    model: Vec<u8>,
}

impl Fuzz {
    fn vol(&self) -> &Volume {
        self.vol.as_ref().expect("open volume")
    }

    fn check_range(&self, off: u64, len: u64, what: &str) {
        let mut back = vec![0u8; len as usize];
        self.vol()
            .read(off, &mut back)
            .unwrap_or_else(|e| panic!("{what}: read {off}+{len}: {e}"));
        let want = &self.model[off as usize..(off + len) as usize];
        if back[..] != want[..] {
            let at = back
                .iter()
                .zip(want)
                .position(|(a, b)| a != b)
                .expect("a difference");
            panic!(
                "{what}: read {off}+{len} differs from the model at byte {} (sector {})",
                off + at as u64,
                (off + at as u64) / SECTOR_SIZE as u64
            );
        }
    }

    fn check_all(&self, what: &str) {
        self.check_range(0, SIZE, what);
        self.vol()
            .verify_accounting()
            .unwrap_or_else(|e| panic!("{what}: accounting: {e}"));
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&p, ops)) = input.split_first() else {
        return;
    };
    let storage = Arc::new(SimStorage::new());
    let mut opts = CreateOptions::new(SIZE);
    opts.segment_size = 512 << 10;
    opts.policy = policy(p);
    let vol = Volume::create_with(storage.clone(), &opts, open_options()).expect("create");
    let mut f = Fuzz {
        storage,
        vol: Some(vol),
        model: vec![0; SIZE as usize],
    };

    for (step, op) in ops.chunks_exact(8).take(MAX_OPS).enumerate() {
        let off = u64::from(u32::from_le_bytes([op[1], op[2], op[3], 0])) % SIZE;
        let len = (u64::from(u32::from_le_bytes([op[4], op[5], op[6], 0])) % (MAX_LEN + 1))
            .min(SIZE - off);
        let arg = op[7];
        let fua = arg & 8 != 0;
        let what = format!("step {step} op {op:?}");
        match op[0] % 10 {
            0 => {
                let d = data(arg & 7, u64::from(arg >> 6) + off, len as usize);
                let hint = [
                    Hint::None,
                    Hint::Compressible,
                    Hint::Incompressible,
                    Hint::None,
                ][usize::from(arg >> 4 & 3)];
                f.vol()
                    .write_hinted(off, &d, fua, hint)
                    .unwrap_or_else(|e| panic!("{what}: write: {e}"));
                f.model[off as usize..(off + len) as usize].copy_from_slice(&d);
            }
            1 => f.check_range(off, len, &what),
            2 | 3 => {
                let r = if op[0] % 10 == 2 {
                    f.vol().trim(off, len, fua)
                } else {
                    f.vol().write_zeroes(off, len, fua)
                };
                r.unwrap_or_else(|e| panic!("{what}: trim/zero: {e}"));
                f.model[off as usize..(off + len) as usize].fill(0);
            }
            4 => f
                .vol()
                .flush()
                .unwrap_or_else(|e| panic!("{what}: flush: {e}")),
            5 => f
                .vol()
                .checkpoint()
                .unwrap_or_else(|e| panic!("{what}: checkpoint: {e}")),
            6 => {
                f.vol
                    .take()
                    .expect("open volume")
                    .close()
                    .unwrap_or_else(|e| panic!("{what}: close: {e}"));
                let v = Volume::open(f.storage.clone(), open_options())
                    .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
                f.vol = Some(v);
                f.check_all(&format!("{what}: after reopen"));
            }
            7 => {
                if arg & 2 != 0 {
                    f.vol()
                        .dedup(1 << 20, |_, _| {})
                        .unwrap_or_else(|e| panic!("{what}: dedup: {e}"));
                }
                if arg & 1 != 0 {
                    f.vol()
                        .merge(|_, _| {})
                        .unwrap_or_else(|e| panic!("{what}: merge: {e}"));
                }
                f.vol()
                    .clean_pass()
                    .unwrap_or_else(|e| panic!("{what}: clean pass: {e}"));
            }
            8 => f
                .vol()
                .set_policy(policy_from_arg(arg, op[1]))
                .unwrap_or_else(|e| panic!("{what}: set policy: {e}")),
            _ => {
                let max_runs = 1 + usize::from(arg);
                let runs = f
                    .vol()
                    .block_status(off, len, max_runs)
                    .unwrap_or_else(|e| panic!("{what}: block status: {e}"));
                let count = runs.len();
                assert!(count <= max_runs, "{what}: {count} runs");
                let mut at = off;
                for (n, hole) in runs {
                    assert!(n > 0, "{what}: empty run");
                    if hole {
                        let z = &f.model[at as usize..(at + n) as usize];
                        assert!(
                            z.iter().all(|&b| b == 0),
                            "{what}: hole at {at}+{n} over data"
                        );
                    }
                    at += n;
                }
                assert!(at <= off + len, "{what}: runs past the range");
                if count < max_runs {
                    assert_eq!(at, off + len, "{what}: runs stop short of the range");
                }
            }
        }
    }
    f.check_all("final");
    f.vol
        .take()
        .expect("open volume")
        .close()
        .expect("final close");
});
