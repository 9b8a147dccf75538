//! Concurrent small writes each followed by a flush, straight on the engine
//! (no FUSE, no loop device): what a database's commits cost squeeze itself.
//!
//!     cargo run --release -p squeeze-engine --example flush_group -- DIR [THREADS] [SECS] [prewrite]
//!
//! Prints writes per second and the mean write and flush latency.
use squeeze_engine::{CreateOptions, FileOptions, FileStorage, OpenOptions, Volume};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).expect("DIR"));
    let threads: usize = args.get(2).map_or(8, |s| s.parse().expect("THREADS"));
    let secs: u64 = args.get(3).map_or(10, |s| s.parse().expect("SECS"));
    let prewrite = args.get(4).is_some_and(|s| s == "prewrite");
    let path = dir.join("flush_group.sqz");
    let _ = std::fs::remove_file(&path);
    let storage = FileStorage::create_opts(&path, FileOptions::from_env()).expect("create");
    let vol = Arc::new(
        Volume::create_with(
            Arc::new(storage),
            &CreateOptions::new(1 << 30),
            OpenOptions {
                background: true,
                prewrite,
                ..Default::default()
            },
        )
        .expect("volume"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (ops, wns, fns) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut hs = Vec::new();
    for t in 0..threads {
        let (vol, stop, ops, wns, fns) = (
            vol.clone(),
            stop.clone(),
            ops.clone(),
            wns.clone(),
            fns.clone(),
        );
        hs.push(std::thread::spawn(move || {
            let mut x = 0x9e3779b97f4a7c15u64 ^ t as u64;
            let mut buf = vec![0u8; 8192];
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                for (i, b) in buf.iter_mut().enumerate().take(4096) {
                    *b = (x >> (i % 8 * 8)) as u8 ^ i as u8;
                }
                let off = (x % ((1 << 30) / 8192)) * 8192;
                let t0 = Instant::now();
                vol.write(off, &buf, false).expect("write");
                let t1 = Instant::now();
                vol.flush().expect("flush");
                let t2 = Instant::now();
                wns.fetch_add((t1 - t0).as_nanos() as u64, Ordering::Relaxed);
                fns.fetch_add((t2 - t1).as_nanos() as u64, Ordering::Relaxed);
                ops.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let n = ops.load(Ordering::Relaxed).max(1);
    println!(
        "threads {threads}{}: {:.0} writes/s, write {:.0} us, flush {:.0} us",
        if prewrite { " (prewrite)" } else { "" },
        n as f64 / secs as f64,
        wns.load(Ordering::Relaxed) as f64 / n as f64 / 1e3,
        fns.load(Ordering::Relaxed) as f64 / n as f64 / 1e3,
    );
    drop(vol);
    let _ = std::fs::remove_file(&path);
}
