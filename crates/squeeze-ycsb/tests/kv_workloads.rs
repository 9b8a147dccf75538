//! The driver against squeeze-kv, end to end at a small size: the load,
//! every core workload, a compaction; every read finds its record (a
//! missing one fails the run), D's inserts are all readable afterwards, and
//! the reports carry what the benchmark tables print.

use squeeze_ycsb::db::{Db, KvDb};
use squeeze_ycsb::generator::key_name;
use squeeze_ycsb::runner::{self, Config, Inserts};
use squeeze_ycsb::workload::Workload;

#[test]
fn load_then_every_workload_on_squeeze_kv() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        records: 3000,
        ops: 4000,
        threads: 2,
        value_size: 400,
        sync_every: 500,
        seed: 7,
    };
    let db = KvDb::create(
        dir.path(),
        4000,
        "squeeze-kv",
        squeeze_kv::VolumeOptions::default(),
    )
    .unwrap();
    let load = runner::load(&db, &cfg).unwrap();
    assert_eq!((load.phase.as_str(), load.writes), ("load", 3000));
    assert!(load.syncs >= 6, "{load:?}");
    let inserts = Inserts::new(cfg.records);
    for w in ['a', 'b', 'c', 'f', 'd'] {
        let w = Workload::get(w).unwrap();
        let r = runner::run(&db, &w, &cfg, &inserts).unwrap();
        assert_eq!(r.ops, 4000);
        let expect_reads = 4000 * u64::from(w.read + w.rmw) / 100;
        assert!(
            r.reads.abs_diff(expect_reads) < 400,
            "{}: {} reads",
            w.name,
            r.reads
        );
        assert!(r.ops_per_second > 0.0 && r.peak_rss_bytes > 0 && r.physical_bytes > 0);
        if w.read > 0 {
            assert!(r.read_us_p50 > 0.0 && r.read_us_p999 >= r.read_us_p99);
        }
    }
    // D inserted about 5% of its operations, every one acknowledged.
    let present = inserts.present();
    assert!((3150..3250).contains(&present), "{present}");
    for n in 0..present {
        assert!(
            db.get(key_name(n).as_bytes()).unwrap().is_some(),
            "record {n}"
        );
    }
    let c = runner::compact(&db, &cfg).unwrap();
    assert_eq!(c.phase, "compact");
    assert!(c.physical_bytes > 0);
}

/// Bad input to the binary: clear errors, nothing created. RocksDB asked
/// of a driver built without it says how to build it.
#[test]
fn bad_arguments_are_refused_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("store");
    let d = d.to_str().unwrap();
    let run = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_squeeze-ycsb"))
            .args(args)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = run(&["run", "--db", "kv", "--dir", d, "--workloads", "a,e"]);
    assert!(e.contains("range scans"), "{e}");
    let e = run(&["run", "--db", "kv", "--dir", d, "--workloads", "ab"]);
    assert!(e.contains("one letter"), "{e}");
    let e = run(&["run", "--db", "leveldb", "--dir", d]);
    assert!(e.contains("unknown --db"), "{e}");
    let e = run(&["run", "--db", "kv", "--dir", d, "--records", "0"]);
    assert!(e.contains("--records"), "{e}");
    let e = run(&[
        "run",
        "--db",
        "rocksdb",
        "--compression",
        "brotli",
        "--dir",
        d,
    ]);
    assert!(e.contains("unknown RocksDB compression"), "{e}");
    if !cfg!(feature = "rocksdb") {
        let e = run(&["run", "--db", "rocksdb", "--dir", d]);
        assert!(e.contains("--features rocksdb"), "{e}");
    }
    // A directory that holds something is refused, not overwritten.
    std::fs::create_dir_all(format!("{d}/x")).unwrap();
    let e = run(&["run", "--db", "kv", "--dir", d]);
    assert!(e.contains("not empty"), "{e}");
    assert!(Workload::get('z').is_err());
}
