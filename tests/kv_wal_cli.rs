//! `squeeze kv` and `squeeze wal` end to end through the real binary: a
//! store and a log created on volumes, used, reopened by later commands;
//! a store refused on a log's volume and the reverse; the benches' JSON.

use std::path::Path;
use std::process::Command;

fn sq(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args(args)
        .output()
        .expect("run squeeze");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(args: &[&str]) -> String {
    let (ok, out, err) = sq(args);
    assert!(ok, "squeeze {args:?}: {err}");
    out
}

fn volume(dir: &Path, name: &str) -> String {
    let p = dir.join(name).to_str().unwrap().to_string();
    ok(&["create", "--size", "1G", &p]);
    p
}

#[test]
fn kv_commands_store_and_refuse() {
    let d = tempfile::tempdir().unwrap();
    let v = volume(d.path(), "kv.sqz");
    ok(&["kv", "create", &v, "--buckets", "5000", "--seed", "3"]);
    ok(&["kv", "put", &v, "alpha", "one"]);
    ok(&["kv", "put", &v, "beta", "two"]);
    assert_eq!(ok(&["kv", "get", &v, "alpha"]), "one\n");
    ok(&["kv", "put", &v, "alpha", "uno"]);
    assert_eq!(ok(&["kv", "get", &v, "alpha"]), "uno\n");
    ok(&["kv", "delete", &v, "beta"]);
    let (found, _, err) = sq(&["kv", "get", &v, "beta"]);
    assert!(!found && err.contains("no key"), "{err}");
    let out = ok(&["kv", "load", &v, "--keys", "2000", "--value-size", "100"]);
    assert!(out.contains("loaded 2000 keys"), "{out}");
    // Bad input: a second create, a log on the store's volume, a key over
    // the limit.
    let (created, _, err) = sq(&["kv", "create", &v]);
    assert!(!created && err.contains("not empty"), "{err}");
    let (created, _, err) = sq(&["wal", "create", &v, "--layout", "sparse"]);
    assert!(!created && err.contains("not empty"), "{err}");
    let long = "k".repeat(2000);
    let (put, _, err) = sq(&["kv", "put", &v, &long, "v"]);
    assert!(!put && err.contains("over the limit"), "{err}");
    assert_eq!(ok(&["kv", "get", &v, "alpha"]), "uno\n");
}

#[test]
fn wal_commands_append_dump_truncate() {
    let d = tempfile::tempdir().unwrap();
    let v = volume(d.path(), "wal.sqz");
    let (bad, _, err) = sq(&["wal", "create", &v, "--layout", "diagonal"]);
    assert!(!bad && err.contains("unknown layout"), "{err}");
    ok(&["wal", "create", &v, "--layout", "sparse"]);
    let out = ok(&["wal", "append", &v, "first", "second", "third"]);
    assert_eq!(out, "seq 0 at 0\nseq 1 at 4096\nseq 2 at 8192\n");
    let out = ok(&["wal", "dump", &v]);
    assert_eq!(out.lines().count(), 3);
    assert!(out.contains("second"));
    ok(&["wal", "truncate", &v, "--seq", "2"]);
    let out = ok(&["wal", "dump", &v]);
    assert_eq!(out.lines().count(), 1);
    assert!(out.contains("third"));
    let (t, _, err) = sq(&["wal", "truncate", &v, "--seq", "0"]);
    assert!(!t && err.contains("no record 0"), "{err}");
    let (opened, _, err) = sq(&["kv", "get", &v, "x"]);
    assert!(!opened && err.contains("not a squeeze-kv store"), "{err}");
}

#[test]
fn wal_create_makes_either_record_version() {
    let d = tempfile::tempdir().unwrap();
    let v = volume(d.path(), "wal1.sqz");
    let (bad, _, err) = sq(&[
        "wal",
        "create",
        &v,
        "--layout",
        "dense",
        "--record-version",
        "3",
    ]);
    assert!(!bad && err.contains("no record version 3"), "{err}");
    // A version 1 log (the 40-byte record headers of earlier releases).
    ok(&[
        "wal",
        "create",
        &v,
        "--layout",
        "dense",
        "--record-version",
        "1",
    ]);
    let out = ok(&["wal", "append", &v, "first", "second"]);
    assert_eq!(out, "seq 0 at 0\nseq 1 at 45\n");
    // Version 2 (the default): 11 bytes of header for the open's first
    // record (the epoch stored), 7 for the next.
    let v = volume(d.path(), "wal2.sqz");
    ok(&["wal", "create", &v, "--layout", "dense"]);
    let out = ok(&["wal", "append", &v, "first", "second"]);
    assert_eq!(out, "seq 0 at 0\nseq 1 at 16\n");
    let out = ok(&["wal", "dump", &v]);
    assert!(out.contains("first") && out.contains("second"), "{out}");
}

#[test]
fn benches_report_json() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    let out = ok(&[
        "wal",
        "bench",
        "--dir",
        dir,
        "--sizes",
        "128",
        "--threads",
        "1,2",
        "--commits",
        "40",
        "--json",
    ]);
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert!(r["backing_bytes_per_commit"].as_f64().unwrap() > 0.0, "{r}");
    }
    let out = ok(&[
        "kv", "bench", "--dir", dir, "--keys", "3000", "--ops", "3000", "--json",
    ]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(r["ops_per_second"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["peak_rss_bytes"].as_u64().unwrap() > 0, "{r}");
}

/// The benches' bad input, refused before any work with the option named:
/// a `--dir` that does not exist (created by none of them) or is a file,
/// and a `--buckets-per-key` that is not a positive number or asks for more
/// buckets than a volume holds.
#[test]
fn benches_refuse_a_missing_dir_and_bad_bucket_densities() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("no/such/dir");
    let missing = missing.to_str().unwrap();
    let file = d.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let file = file.to_str().unwrap();
    let benches: [&[&str]; 4] = [
        &["kv", "bench", "--keys", "100", "--ops", "100"],
        &["wal", "bench", "--sizes", "128", "--commits", "10"],
        &["bench", "--size", "4M"],
        &["bench", "--overwrite", "--size", "4M"],
    ];
    for bench in benches {
        let (good, _, err) = sq(&[bench, &["--dir", missing]].concat());
        assert!(!good, "{bench:?}");
        assert!(
            err.contains(&format!("--dir {missing}")) && err.contains("No such file"),
            "{bench:?}: {err}"
        );
        assert!(!d.path().join("no").exists(), "{bench:?} created --dir");
        let (good, _, err) = sq(&[bench, &["--dir", file]].concat());
        assert!(!good, "{bench:?}");
        assert!(err.contains("not a directory"), "{bench:?}: {err}");
    }
    let dir = d.path().to_str().unwrap();
    for bad in ["NaN", "inf", "0", "-1", "x", ""] {
        let (good, _, err) = sq(&[
            "kv",
            "bench",
            "--dir",
            dir,
            &format!("--buckets-per-key={bad}"),
        ]);
        assert!(!good, "{bad}");
        assert!(
            err.contains("--buckets-per-key") && err.contains("above 0"),
            "{bad}: {err}"
        );
    }
    let (good, _, err) = sq(&["kv", "bench", "--dir", dir, "--buckets-per-key", "1e300"]);
    assert!(!good);
    assert!(err.contains("more buckets than a volume holds"), "{err}");
    // Nothing left behind.
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
}

/// A store whose volume runs out of room: `kv load` fails with ENOSPC said
/// once (the store's error used to repeat the engine's), and what was
/// durable before is still there.
#[test]
fn kv_out_of_room_says_so_once_and_keeps_what_it_had() {
    let d = tempfile::tempdir().unwrap();
    let v = d.path().join("small.sqz");
    let v = v.to_str().unwrap();
    ok(&[
        "create",
        v,
        "--size",
        "64M",
        "--segment-size",
        "512K",
        "--max-physical",
        "3M",
    ]);
    ok(&["kv", "create", v]);
    ok(&["kv", "put", v, "first", "one"]);
    let (good, _, err) = sq(&["kv", "load", v, "--keys", "20000"]);
    assert!(!good, "20000 keys fit in 3 MiB: {err}");
    assert_eq!(err.matches("no space left").count(), 1, "{err}");
    assert!(err.contains("backing store full"), "{err}");
    assert_eq!(ok(&["kv", "get", v, "first"]), "one\n");
}
