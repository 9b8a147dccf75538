//! A served volume gets its ratio back by itself: after scattered 4 KiB
//! overwrites, once the client goes quiet the server merges the fragmented
//! windows into whole blobs (`merged_bytes` in live stats) without changing
//! a byte the client reads; afterwards `squeeze compact` finds nothing left
//! to merge and `squeeze check` finds the volume clean. With
//! `--no-idle-merge` the server leaves them to `squeeze compact`.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Writes 8 MiB in 128 KiB requests, then overwrites every third data
/// sector of every other window (over the quarter that makes a window worth
/// merging; mixed_data's zero runs stay holes and are not merged). Returns
/// the model and the bytes a merge of every such window rewrites.
fn fragment(c: &mut Client) -> (Vec<u8>, u64) {
    let len = 8usize << 20;
    let mut model = mixed_data(len, 1);
    for (k, chunk) in model.chunks(128 << 10).enumerate() {
        assert_eq!(c.write((k as u64) << 17, chunk), 0);
    }
    let nonzero = |s: &[u8]| s.iter().any(|&b| b != 0);
    let mut touched = BTreeSet::new();
    let mut want = 0u64;
    for (k, win) in model.clone().chunks(128 << 10).enumerate() {
        let data_sectors: Vec<usize> = win
            .chunks(4096)
            .enumerate()
            .filter(|(_, s)| nonzero(s))
            .map(|(i, _)| i)
            .collect();
        if k % 2 == 1 || data_sectors.is_empty() {
            continue;
        }
        for &i in data_sectors.iter().step_by(3) {
            let off = ((k as u64) << 17) + 4096 * i as u64;
            let d: Vec<u8> = mixed_data(4096, 100 + off)
                .iter()
                .map(|b| b ^ 0x5a)
                .collect();
            assert_eq!(c.write(off, &d), 0);
            model[off as usize..off as usize + 4096].copy_from_slice(&d);
        }
        touched.insert(k);
        want += 4096 * data_sectors.len() as u64;
    }
    assert!(touched.len() >= 16);
    assert_eq!(c.flush(), 0);
    (model, want)
}

#[test]
fn idle_server_merges_small_overwrites() {
    let w = Workdir::new();
    let srv = Serve::start(&w, &[]);
    let mut c = srv.client(true);
    let (model, want) = fragment(&mut c);
    assert_eq!(c.flush(), 0);
    let before = live_stats(&srv);
    assert_eq!(before["merged_bytes"].as_u64(), Some(0), "{before}");
    // The client stays connected and quiet.
    let t0 = Instant::now();
    let merged = loop {
        let s = live_stats(&srv);
        let m = s["merged_bytes"].as_u64().unwrap();
        if m >= want {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{m} of {want} bytes merged after a minute idle: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(merged["merge_bytes_written"].as_u64() > Some(0), "{merged}");
    assert_eq!(merged["bytes_written"], before["bytes_written"], "{merged}");
    for (k, chunk) in model.chunks(1 << 20).enumerate() {
        let got = c.read((k as u64) << 20, 1 << 20).expect("read");
        assert!(got == chunk, "MiB {k} differs after the merge");
    }
    drop(c);
    srv.stop();
    let out = run(squeeze().arg("compact").arg("--json").arg(w.volume()));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["merge"]["windows"].as_u64(), Some(0), "{out}");
    run(squeeze().arg("check").arg(w.volume()));
}

#[test]
fn no_idle_merge_leaves_the_windows_to_compact() {
    let w = Workdir::new();
    let srv = Serve::start(&w, &["--no-idle-merge"]);
    let mut c = srv.client(true);
    let (model, _) = fragment(&mut c);
    // Quiet for three seconds: the idle server would have merged by now
    // (the test above merges within about one).
    std::thread::sleep(Duration::from_secs(3));
    let s = live_stats(&srv);
    assert_eq!(s["merged_bytes"].as_u64(), Some(0), "{s}");
    for (k, chunk) in model.chunks(1 << 20).enumerate() {
        assert!(c.read((k as u64) << 20, 1 << 20).expect("read") == chunk);
    }
    drop(c);
    srv.stop();
    let out = run(squeeze().arg("compact").arg("--json").arg(w.volume()));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(v["merge"]["windows"].as_u64() >= Some(16), "{out}");
}
