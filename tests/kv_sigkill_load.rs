//! SIGKILL of `squeeze kv load` in the middle of a load: every key the
//! process had reported durable ("durable through key N": a flush returned
//! after every key below N was put) reads back with its value, and every
//! other key holds its value or nothing (never other bytes). Three kills
//! at different points, each followed by a reopen in this process.

use squeeze_engine::{FileStorage, OpenOptions, Volume};
use squeeze_kv::{Expect, Store};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

/// The value `squeeze kv load` puts under key `i` (src/cmd/kv.rs `load_value`).
fn load_value(i: u64, len: usize) -> Vec<u8> {
    let half = squeeze_codec::testdata::random(len.div_ceil(2), i);
    let mut v = half.clone();
    v.extend_from_slice(&half);
    v.truncate(len);
    v
}

const KEYS: u64 = 400_000;

#[test]
fn a_killed_load_keeps_every_key_it_reported_durable() {
    let d = tempfile::tempdir().unwrap();
    let vol = d.path().join("kv.sqz");
    let v = vol.to_str().unwrap();
    let sq = env!("CARGO_BIN_EXE_squeeze");
    let ok = |args: &[&str]| {
        let out = Command::new(sq).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(&["create", "--size", "4G", v]);
    ok(&["kv", "create", v, "--buckets", "200000"]);
    for (cycle, lines_before_kill) in [2usize, 5, 9].into_iter().enumerate() {
        let mut child = Command::new(sq)
            .args([
                "kv",
                "load",
                v,
                "--keys",
                &KEYS.to_string(),
                "--threads",
                "2",
            ])
            .args(["--sync-every", "300"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut durable = 0u64;
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        for _ in 0..lines_before_kill {
            let Some(Ok(l)) = lines.next() else { break };
            if let Some(n) = l.strip_prefix("durable through key ") {
                durable = n.parse().unwrap();
            }
        }
        child.kill().unwrap();
        // Lines printed before the kill landed may still be in the pipe.
        for l in lines.map_while(Result::ok) {
            if let Some(n) = l.strip_prefix("durable through key ") {
                durable = n.parse().unwrap();
            }
        }
        child.wait().unwrap();
        assert!(
            durable > 0,
            "cycle {cycle}: nothing reported durable before the kill"
        );
        assert!(
            durable < KEYS,
            "cycle {cycle}: the load finished before the kill"
        );
        let volume = Volume::open(
            Arc::new(FileStorage::open(&vol).unwrap()),
            OpenOptions::default(),
        )
        .unwrap();
        let s = Store::open(Arc::new(volume), Expect::default()).unwrap();
        let mut present = 0;
        for i in 0..(durable + 20_000).min(KEYS) {
            let k = format!("user{i:012}").into_bytes();
            match s.get(&k).unwrap() {
                Some(got) => {
                    assert_eq!(
                        got,
                        load_value(i, 400),
                        "cycle {cycle}: key {i} holds other bytes"
                    );
                    present += 1;
                }
                None => assert!(
                    i >= durable,
                    "cycle {cycle}: key {i} was reported durable (through {durable}) and is gone"
                ),
            }
        }
        println!("cycle {cycle}: killed after durable through {durable}; {present} keys present");
    }
}
