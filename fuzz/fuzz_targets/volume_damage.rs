//! Damage anywhere in a volume file (issue 34): a fixed 4 MiB volume on
//! SimStorage (512 KiB segments; 96 writes, a checkpoint, 128 more writes,
//! a flush), left cleanly closed or as a killed process leaves it, gets the
//! input's damage (bytes overwritten, bits flipped, the file cut short),
//! then is opened read-only. The rule (docs/RELIABILITY.md, "Damage to the
//! volume file"): either the open succeeds and every sector reads back as
//! written or fails its read and `check` names it, or the open is refused
//! and `check` (accepting the loss) does not call the volume clean. Never
//! wrong data without an error, and no panic.
//!
//! Input: byte 0 bit 0 picks the crashed image (else the clean one); then
//! 8-byte operations `[op, off0, off1, off2, len0, len1, val, _]`, at most
//! 8, offset little-endian 24-bit modulo the image's length, length 16-bit:
//! op % 3 = 0 overwrite `len` bytes at `off` with `val` (op bit 4 set: a
//! byte stream seeded by `val` instead), 1 flip bit `val % 8` of the byte at
//! `off`, 2 cut the file short by `off` bytes from its end.

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use squeeze_codec::testdata::{fio_like, text};
use squeeze_engine::check::check;
use squeeze_engine::{
    CompressEngine, CpuPool, CreateOptions, EngineError, OpenOptions, SimStorage, Storage, Volume,
    SECTOR_SIZE,
};

const SIZE: u64 = 4 << 20;
const SEG: u64 = 512 << 10;
const MAX_OPS: usize = 8;

fn engine() -> Arc<dyn CompressEngine> {
    static POOL: OnceLock<Arc<dyn CompressEngine>> = OnceLock::new();
    POOL.get_or_init(|| Arc::new(CpuPool::new(1))).clone()
}

struct Image {
    disk: SimStorage,
    model: Vec<u8>,
}

/// The two images (clean, crashed), built once per process.
fn images() -> &'static [Image; 2] {
    static IMAGES: OnceLock<[Image; 2]> = OnceLock::new();
    IMAGES.get_or_init(|| [build(true), build(false)])
}

fn build(clean: bool) -> Image {
    let s = Arc::new(SimStorage::new());
    let mut o = CreateOptions::new(SIZE);
    o.segment_size = SEG;
    let v = Volume::create_with(
        s.clone(),
        &o,
        OpenOptions {
            engine: Some(engine()),
            ..Default::default()
        },
    )
    .expect("create");
    let mut model = vec![0u8; SIZE as usize];
    let sectors_total = SIZE as usize / SECTOR_SIZE;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut write = |v: &Volume, n: usize| {
        for i in 0..n {
            let sectors = 1 + (next() % 32) as usize;
            let lba = (next() as usize) % (sectors_total - sectors);
            let len = sectors * SECTOR_SIZE;
            let d = if i % 2 == 0 {
                text(len, next())
            } else {
                fio_like(len, 60, 4096, next())
            };
            v.write((lba * SECTOR_SIZE) as u64, &d, false)
                .expect("write");
            model[lba * SECTOR_SIZE..lba * SECTOR_SIZE + len].copy_from_slice(&d);
        }
    };
    write(&v, 96);
    v.flush().expect("flush");
    v.checkpoint().expect("checkpoint");
    write(&v, 128);
    v.flush().expect("flush");
    let disk = if clean {
        v.close().expect("close");
        s.kill()
    } else {
        let d = s.kill();
        drop(v);
        d
    };
    Image { disk, model }
}

fn damage(img: &SimStorage, ops: &[u8]) {
    for op in ops.chunks_exact(8).take(MAX_OPS) {
        let len_now = img.len().unwrap_or(0).max(1);
        let off = u64::from(u32::from_le_bytes([op[1], op[2], op[3], 0]));
        let len = usize::from(u16::from_le_bytes([op[4], op[5]]));
        let val = op[6];
        match op[0] % 3 {
            0 => {
                let at = off % len_now;
                let bytes: Vec<u8> = if op[0] & 0x10 != 0 {
                    let mut x = u32::from(val) | 0x100;
                    (0..len)
                        .map(|_| {
                            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                            (x >> 16) as u8
                        })
                        .collect()
                } else {
                    vec![val; len]
                };
                img.overwrite(at, &bytes);
            }
            1 => {
                let at = off % len_now;
                let mut b = [0u8; 1];
                if img.read_at(&mut b, at).is_ok() {
                    img.overwrite(at, &[b[0] ^ (1 << (val % 8))]);
                }
            }
            _ => img.truncate(len_now.saturating_sub(off)),
        }
    }
}

fn read_only(accept_loss: bool) -> OpenOptions {
    OpenOptions {
        read_only: true,
        accept_loss,
        engine: Some(engine()),
        ..Default::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, ops)) = data.split_first() else {
        return;
    };
    let base = &images()[usize::from(first & 1)];
    let img = Arc::new(base.disk.kill());
    damage(&img, ops);
    match Volume::open(img.clone(), read_only(false)) {
        Ok(v) => {
            assert!(!v.damage().is_loss(), "opened with loss: {}", v.damage());
            let report = check(&v, |_, _| {});
            let mut buf = vec![0u8; SECTOR_SIZE];
            for lba in 0..SIZE / SECTOR_SIZE as u64 {
                let at = lba as usize * SECTOR_SIZE;
                match v.read(lba * SECTOR_SIZE as u64, &mut buf) {
                    Ok(()) => assert!(
                        buf[..] == base.model[at..at + SECTOR_SIZE],
                        "LBA {lba} read back wrong without an error"
                    ),
                    Err(e) => assert!(
                        report
                            .damaged
                            .iter()
                            .any(|d| (d.first_lba..d.first_lba + d.sectors).contains(&lba)),
                        "LBA {lba} failed ({e}) and check does not name it"
                    ),
                }
            }
        }
        Err(e) => match Volume::open(img, read_only(true)) {
            Ok(v) => assert!(
                !check(&v, |_, _| {}).is_clean(),
                "open refused ({e}) but check finds the volume clean"
            ),
            Err(e2) => assert!(
                !matches!(e2, EngineError::Damaged(_)),
                "accepting the loss still refused: {e2}"
            ),
        },
    }
});
