//! The write-behind path with its real flusher threads (not the seeded
//! stand-in crash_sim uses) over a simulated disk: concurrent writers fill
//! chunks that the threads write out while a flush writes out the rest;
//! after a power cut every flushed write is there, and every other sector
//! holds its previous or its latest content, nothing else.

mod common;
use common::*;
use rand::Rng;
use squeeze_engine::storage::{SimWriteBehind, SimWriteBehindConfig};
use squeeze_engine::{OpenOptions, SimStorage, Volume};
use std::sync::Arc;

const WRITERS: usize = 4;
const REGION: usize = 256 << 10;
const SIZE: u64 = 4 << 20;

fn over(disk: Arc<SimStorage>, r: &mut impl Rng) -> Arc<SimWriteBehind> {
    Arc::new(SimWriteBehind::new(
        disk,
        SimWriteBehindConfig {
            chunk: 4096 << r.gen_range(0..5),
            chunks: r.gen_range(1..=4),
            seed: 0,
            write_out_chance: 0.0,
            flusher_threads: 2,
        },
    ))
}

#[test]
fn flushed_writes_survive_a_power_cut_with_real_flusher_threads() {
    let mut r = rng(42);
    let disk = Arc::new(SimStorage::new());
    let mut vol = Volume::create(over(disk.clone(), &mut r), &small_opts(SIZE)).unwrap();
    let mut disk = disk;
    let mut before = vec![0u8; WRITERS * REGION];
    for round in 0..30 {
        let new: Vec<Vec<u8>> = (0..WRITERS)
            .map(|_| {
                let kind = r.gen_range(1..4);
                data(&mut r, kind, REGION)
            })
            .collect();
        let piece = 4096 * r.gen_range(1..=16);
        let flush = r.gen_bool(0.6);
        let vref = &vol;
        std::thread::scope(|s| {
            for (w, d) in new.iter().enumerate() {
                s.spawn(move || {
                    for (i, p) in d.chunks(piece).enumerate() {
                        let at = (w * REGION + i * piece) as u64;
                        vref.write(at, p, false).unwrap();
                        if i % 7 == 3 {
                            vref.flush().unwrap(); // flushes racing the writers
                        }
                    }
                });
            }
        });
        let latest: Vec<u8> = new.concat();
        if flush {
            vol.flush().unwrap();
        }
        let img = Arc::new(disk.crash(&mut r));
        drop(vol);
        disk = img;
        vol = Volume::open(over(disk.clone(), &mut r), OpenOptions::default())
            .unwrap_or_else(|e| panic!("round {round}: recovery: {e}"));
        let mut got = vec![0u8; WRITERS * REGION];
        vol.read(0, &mut got).unwrap();
        for (s, g) in got.chunks(4096).enumerate() {
            let (old, now) = (&before[s * 4096..][..4096], &latest[s * 4096..][..4096]);
            if flush {
                assert!(g == now, "round {round}: flushed sector {s} lost");
            } else {
                assert!(g == now || g == old, "round {round}: sector {s} invented");
            }
        }
        before = got;
    }
}
