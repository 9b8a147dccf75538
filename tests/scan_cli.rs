//! `squeeze scan` end to end: its figures against the codecs run directly
//! on the same blobs, type detection on real files, sampling, sparse files,
//! and bad input (missing paths, FIFOs, symlinks) that is reported while the
//! scan goes on.

use serde_json::Value;
use squeeze_codec::testdata::{random, text};
use squeeze_codec::{new_compressor, Algorithm};
use std::path::{Path, PathBuf};
use std::process::Command;

const BLOBS: [u64; 4] = [4096, 16384, 65536, 131072];
const PIECE: usize = 128 << 10;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Runs `squeeze scan ARGS --json`; returns (success, JSON, stderr).
fn scan(args: &[&Path], extra: &[&str]) -> (bool, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .arg("scan")
        .args(args)
        .args(extra)
        .arg("--json")
        .output()
        .expect("run squeeze scan");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "scan output is not JSON ({e}): {}\nstderr: {stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.success(), json, stderr)
}

fn group<'a>(r: &'a Value, kind: &str) -> &'a Value {
    r["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["type"] == kind)
        .unwrap_or_else(|| panic!("no group {kind:?} in {:#}", r["groups"]))
}

/// Stored bytes of `data` cut into 128 KiB pieces, then blobs, each blob
/// kept compressed only if it fits in its own length: the rule scan states.
fn stored_directly(alg: Algorithm, isal: bool, data: &[u8], blob: usize) -> u64 {
    let mut c = if isal {
        squeeze_codec::isal::try_new_compressor(alg).unwrap()
    } else {
        new_compressor(alg)
    };
    let mut dst = Vec::new();
    let mut stored = 0u64;
    for piece in data.chunks(PIECE) {
        for b in piece.chunks(blob) {
            stored += match c.compress(b, &mut dst, b.len()).unwrap() {
                Some(n) => n as u64,
                None => b.len() as u64,
            };
        }
    }
    stored
}

/// Every codec row scan reports for a single-type file equals the codec
/// run directly: same raw bytes, same stored bytes, same ratio.
fn check_against_codecs(path: &Path, data: &[u8], kind: &str) -> Value {
    let (ok, r, stderr) = scan(&[path], &["--full"]);
    assert!(ok, "{stderr}");
    assert_eq!(r["bytes_scanned"], data.len() as u64);
    let g = group(&r, kind);
    assert_eq!(r["groups"].as_array().unwrap().len(), 1, "{kind}");
    let rows = g["codecs"].as_array().unwrap();
    // deflate:1 and 3 on ISA-L too, when the build has it.
    let isal_rows = if squeeze_codec::isal::available() {
        2
    } else {
        0
    };
    assert_eq!(rows.len(), (7 + isal_rows) * BLOBS.len());
    let mut algs = Vec::new();
    for row in rows {
        let label = row["algorithm"].as_str().unwrap();
        let (name, isal) = match label.strip_suffix(" (isa-l)") {
            Some(n) => (n, true),
            None => (label, false),
        };
        let alg = Algorithm::parse(name).unwrap();
        let blob = row["blob_size"].as_u64().unwrap();
        assert!(BLOBS.contains(&blob));
        algs.push(label.to_string());
        let direct = stored_directly(alg, isal, data, blob as usize);
        assert_eq!(row["raw_bytes"], data.len() as u64, "{alg} {blob}");
        let stored = row["stored_bytes"].as_u64().unwrap();
        if isal {
            // ISA-L's output is not the same from one process to the next:
            // a blob in a few thousand comes out a byte or two longer or
            // shorter (it follows the address-space layout: with ASLR off,
            // 80 runs of scan out of 80 agreed; with it on, 3 of 100
            // differed; intel/isa-l#140 leaves determinism open). Every
            // other library must match to the byte.
            assert!(
                stored.abs_diff(direct) <= 8 * (data.len() as u64 >> 20).max(1),
                "{kind}: {label} at {blob}: {stored} vs {direct} run directly"
            );
        } else {
            assert_eq!(stored, direct, "{kind}: {alg} at {blob}");
        }
        let want = data.len() as f64 / stored as f64;
        let got = row["ratio"].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-9,
            "{kind} {alg} {blob}: {got} vs {want}"
        );
        let saving = row["saving"].as_f64().unwrap();
        assert!((saving - (1.0 - stored as f64 / data.len() as f64)).abs() < 1e-9);
        // Measured, single-core figures are present and sane.
        assert!(row["compress_mbps"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["cpu_seconds_per_gib"]["compress"].as_f64().unwrap() > 0.0);
        assert!(row["cpu_seconds_per_gib"]["decompress"].as_f64().unwrap() >= 0.0);
    }
    algs.dedup();
    let mut want = vec![
        "lz4",
        "zstd:1",
        "zstd:3",
        "zstd:9",
        "snappy",
        "deflate:1",
        "deflate:6",
    ];
    if isal_rows > 0 {
        want.extend(["deflate:1 (isa-l)", "deflate:3 (isa-l)"]);
    }
    assert_eq!(algs, want);
    // "all" is the sum of the groups: here the same figures.
    assert_eq!(
        r["all"]["codecs"][5]["stored_bytes"],
        g["codecs"][5]["stored_bytes"]
    );
    r
}

#[test]
fn ratios_equal_the_codecs_run_directly() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("zeros.bin", vec![0u8; 1 << 20], "zeros"),
        ("random.bin", random((1 << 20) + 1000, 7), "binary"),
        ("repeated.txt", text(1 << 20, 3), "text"),
        (
            "photo.jpeg",
            std::fs::read(fixture("photo.jpeg")).unwrap(),
            "jpeg",
        ),
    ];
    for (name, data, kind) in &cases {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        let r = check_against_codecs(&p, data, kind);
        let g = group(&r, kind);
        let best = g["best_ratio"].as_f64().unwrap();
        match *kind {
            "zeros" => assert!(best > 100.0, "{best}"),
            "text" => {
                assert!(best > 2.0, "{best}");
                assert_eq!(g["worth_compressing"], true);
                assert_ne!(r["recommendation"]["mode"], "none");
            }
            _ => {
                // Random bytes and a JPEG are not worth compressing.
                assert!(best < 1.1, "{kind}: {best}");
                assert_eq!(g["worth_compressing"], false);
                let advice = g["advice"].as_str().unwrap();
                assert!(
                    advice.starts_with("store raw; mode aggressive's heuristic will skip it"),
                    "{advice}"
                );
                assert_eq!(r["recommendation"]["mode"], "none");
                assert_eq!(
                    r["recommendation"]["not_worth_compressing"][0]["type"],
                    *kind
                );
            }
        }
    }
    // Random data: the heuristic flags every 128 KiB blob.
    let (_, r, _) = scan(&[&dir.path().join("random.bin")], &["--full"]);
    let skip = group(&r, "binary")["heuristic_skip_fraction"]["131072"]
        .as_f64()
        .unwrap();
    assert!(skip > 0.99, "{skip}");
}

/// The recommendation rule's documented constants (README, `squeeze
/// scan`): a fraction of the fastest candidate row's speed in the same
/// run, and a tie in saving (one percentage point). Neither is a speed.
const INLINE_SPEED_FRACTION: f64 = 0.25;
const SAVING_TIE: f64 = 0.01;

/// The recommendation is one of the rows and obeys the rule, checked from
/// the rows' own figures of the same run: whichever speeds this host and
/// build measure, the same assertions hold or fail.
#[test]
fn recommendation_comes_from_the_rows_and_carries_cpu_cost() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.txt");
    std::fs::write(&p, text(2 << 20, 11)).unwrap();
    let (ok, r, stderr) = scan(&[&p], &[]);
    assert!(ok, "{stderr}");
    let rec = &r["recommendation"];
    let rows = r["all"]["codecs"].as_array().unwrap();
    let label = |c: &Value| c["algorithm"].as_str().unwrap().to_string();
    let name = |c: &Value| format!("{} {}K", label(c), c["blob_size"].as_u64().unwrap() >> 10);
    let table: String = rows
        .iter()
        .map(|c| {
            format!(
                "\n  {:<24} saving {:.4} at {:.1} MB/s",
                name(c),
                saving(c),
                speed(c)
            )
        })
        .collect();
    let ctx = format!("recommendation {rec:#}\nrows:{table}");
    let row = rows
        .iter()
        .find(|c| c["algorithm"] == rec["row"] && c["blob_size"] == rec["max_blob_size"])
        .unwrap_or_else(|| panic!("the recommendation is one of the measured rows: {ctx}"));
    // What it names and carries is the row's.
    let configured = label(row).trim_end_matches(" (isa-l)").to_string();
    assert_eq!(rec["algorithm"], configured.as_str());
    assert_eq!(row["ratio"], rec["ratio"]);
    assert_eq!(row["saving"], rec["saving"]);
    assert_eq!(row["compress_mbps"], rec["compress_mbps"]);
    assert_eq!(row["cpu_seconds_per_gib"], rec["cpu_seconds_per_gib"]);
    assert_eq!(rec["mode"], "aggressive");
    assert!(rec["saving"].as_f64().unwrap() > 0.3, "{ctx}");

    // The rule, recomputed from the rows. Candidates: every row but a
    // library row of an algorithm the rows also measure on ISA-L.
    let on_isal: Vec<String> = rows
        .iter()
        .filter_map(|c| label(c).strip_suffix(" (isa-l)").map(str::to_string))
        .collect();
    let candidates: Vec<&Value> = rows
        .iter()
        .filter(|c| !on_isal.contains(&label(c)))
        .collect();
    assert!(candidates.contains(&row), "{ctx}");
    // Fast enough: a fraction of the fastest candidate of this run.
    let fastest = candidates.iter().map(|c| speed(c)).fold(0.0, f64::max);
    let min_speed = INLINE_SPEED_FRACTION * fastest;
    assert!(speed(row) >= min_speed, "{ctx}");
    // The best saving among those, within the tie.
    let inline: Vec<&Value> = candidates
        .iter()
        .copied()
        .filter(|c| speed(c) >= min_speed)
        .collect();
    let best = inline.iter().map(|c| saving(c)).fold(f64::MIN, f64::max);
    assert!(saving(row) >= best - SAVING_TIE, "{ctx}");
    // No candidate at least as fast that saves at least as much.
    let dominates = |o: &Value, c: &Value| {
        speed(o) >= speed(c)
            && saving(o) >= saving(c)
            && (speed(o) > speed(c) || saving(o) > saving(c))
    };
    for o in &candidates {
        assert!(!dominates(o, row), "{} dominates it: {ctx}", name(o));
    }
    // The tie-break: smallest blob, then fastest, then the larger saving.
    let mut tied: Vec<&Value> = inline
        .iter()
        .copied()
        .filter(|c| saving(c) >= best - SAVING_TIE)
        .filter(|c| !candidates.iter().any(|o| dominates(o, c)))
        .collect();
    tied.sort_by(|a, b| {
        let blob = |c: &Value| c["blob_size"].as_u64().unwrap();
        blob(a)
            .cmp(&blob(b))
            .then(speed(b).total_cmp(&speed(a)))
            .then(saving(b).total_cmp(&saving(a)))
    });
    assert_eq!(tied.first(), Some(&row), "{ctx}");
    // `why` states the same figures.
    let why = &rec["why"];
    assert_eq!(why["inline_speed_fraction"], INLINE_SPEED_FRACTION);
    assert_eq!(why["saving_tie"], SAVING_TIE);
    assert_eq!(why["fastest_compress_mbps"], fastest);
    assert_eq!(why["inline_min_compress_mbps"], min_speed);
    assert_eq!(why["inline_rows"], inline.len());
    assert_eq!(why["best_inline_saving"], best);
    let tied_names: Vec<String> = tied.iter().map(|c| name(c)).collect();
    assert_eq!(why["tied"], serde_json::json!(tied_names));
    let mut superseded = on_isal.clone();
    superseded.retain(|a| rows.iter().any(|c| label(c) == *a));
    superseded.dedup();
    assert_eq!(why["superseded"], serde_json::json!(superseded));
    assert!(
        why["text"].as_str().unwrap().starts_with(&name(row)),
        "{ctx}"
    );
}

/// A row's compress MB/s per core (none measured: 0, as the rule counts it).
fn speed(c: &Value) -> f64 {
    c["compress_mbps"].as_f64().unwrap_or(0.0)
}

fn saving(c: &Value) -> f64 {
    c["saving"].as_f64().unwrap()
}

fn sh(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn detects_types_of_real_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::copy(fixture("photo.jpeg"), d.join("photo.jpeg")).unwrap();
    std::fs::copy(fixture("diagram.png"), d.join("diagram.png")).unwrap();
    let elf = ["/usr/bin/ls", "/bin/ls", "/usr/bin/env"]
        .iter()
        .find(|p| Path::new(p).exists())
        .expect("an ELF binary");
    std::fs::copy(elf, d.join("prog")).unwrap();
    std::fs::write(d.join("notes.txt"), text(40_000, 1)).unwrap();
    std::fs::write(d.join("log.txt"), text(40_000, 2)).unwrap();
    assert!(sh("gzip", &[d.join("log.txt").to_str().unwrap()]), "gzip");
    let mut json = String::from("[\n");
    for i in 0..500 {
        json += &format!("  {{\"id\": {i}, \"name\": \"item{i}\", \"tags\": [\"a\", \"b\"]}},\n");
    }
    json += "  {}\n]\n";
    std::fs::write(d.join("data.json"), json).unwrap();
    let mut csv = String::from("id,name,price,qty\n");
    for i in 0..800 {
        csv += &format!("{i},widget {i},{}.{:02},{}\n", i % 97, i % 100, i % 13);
    }
    std::fs::write(d.join("table.csv"), csv).unwrap();
    let db = d.join("app.sqlite");
    let have_sqlite = sh(
        "python3",
        &[
            "-c",
            "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\nc.execute('create table t(a integer, b text)')\nc.executemany('insert into t values(?,?)', [(i, 'row %d' % i) for i in range(2000)])\nc.commit()",
            db.to_str().unwrap(),
        ],
    );
    let (ok, r, stderr) = scan(&[d], &["--full"]);
    assert!(ok, "{stderr}");
    let formats = |kind: &str| group(&r, kind)["formats"].clone();
    assert!(formats("jpeg")["jpeg"].as_u64().unwrap() >= 1);
    assert!(formats("png")["png"].as_u64().unwrap() >= 1);
    assert!(formats("elf")["elf"].as_u64().unwrap() >= 1);
    assert!(formats("compressed")["gzip"].as_u64().unwrap() >= 1);
    assert!(formats("text")["text"].as_u64().unwrap() >= 1);
    assert!(formats("json")["json"].as_u64().unwrap() >= 1);
    assert!(formats("csv")["csv"].as_u64().unwrap() >= 1);
    if have_sqlite {
        assert!(formats("database")["sqlite"].as_u64().unwrap() >= 1);
    } else {
        eprintln!("python3 sqlite3 unavailable: database detection not checked");
    }
    // The gzip file is not worth compressing; text is.
    assert_eq!(group(&r, "compressed")["worth_compressing"], false);
    assert_eq!(group(&r, "text")["worth_compressing"], true);
    assert_eq!(r["files"], if have_sqlite { 8 } else { 7 });
    let shares: f64 = r["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["share"].as_f64().unwrap())
        .sum();
    assert!((shares - 1.0).abs() < 1e-9);
}

#[test]
fn bad_input_is_reported_and_the_scan_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = d.join("tree/good.txt");
    std::fs::create_dir_all(good.parent().unwrap()).unwrap();
    std::fs::write(&good, text(100_000, 5)).unwrap();
    let fifo = d.join("tree/pipe");
    assert!(sh("mkfifo", &[fifo.to_str().unwrap()]), "mkfifo");
    std::os::unix::fs::symlink("/usr/bin", d.join("tree/link")).unwrap();
    let missing = d.join("does-not-exist");
    let (ok, r, stderr) = scan(&[&missing, &d.join("tree")], &[]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(&format!("cannot read {}", missing.display()))
            && stderr.contains("No such file"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("skipping FIFO {}", fifo.display())),
        "{stderr}"
    );
    assert_eq!(r["unreadable"], 1);
    assert_eq!(r["special_skipped"], 1);
    assert_eq!(r["symlinks_skipped"], 1);
    assert_eq!(r["files"], 1);
    assert_eq!(r["bytes_scanned"], 100_000);
    assert_eq!(r["errors"].as_array().unwrap().len(), 2);
    assert_eq!(group(&r, "text")["bytes_scanned"], 100_000);
    // A FIFO named on the command line is skipped too (never opened).
    let (ok, r, stderr) = scan(&[&fifo, &good], &[]);
    assert!(ok && stderr.contains("skipping FIFO"), "{stderr}");
    assert_eq!(r["files"], 1);
    // Nothing readable at all: still a report, recommending nothing.
    let (ok, r, stderr) = scan(&[&missing], &[]);
    assert!(ok, "{stderr}");
    assert_eq!(r["bytes_scanned"], 0);
    assert_eq!(r["recommendation"]["mode"], "none");
    // Text output also carries the counts.
    let out = Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args([
            "scan",
            missing.to_str().unwrap(),
            d.join("tree").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("skipped: 1 unreadable, 1 special files, 1 symlinks"),
        "{stdout}"
    );
}

#[test]
fn samples_by_default_and_skips_holes() {
    let dir = tempfile::tempdir().unwrap();
    // 16 MiB of text, sampled with a 1 MiB budget: 8 pieces of 128 KiB.
    let big = dir.path().join("big.txt");
    std::fs::write(&big, text(16 << 20, 9)).unwrap();
    let (ok, r, _) = scan(&[&big], &["--sample-mib", "1"]);
    assert!(ok);
    assert_eq!(r["sampled"], true);
    assert_eq!(r["bytes_data"], 16u64 << 20);
    assert_eq!(r["bytes_scanned"], 1u64 << 20);
    let (_, r, _) = scan(&[&big], &["--sample-mib", "1", "--full"]);
    assert_eq!(r["sampled"], false);
    assert_eq!(r["bytes_scanned"], 16u64 << 20);

    // A sparse file: 64 MiB logical, 128 KiB of data in the middle.
    let sparse = dir.path().join("sparse.img");
    let f = std::fs::File::create(&sparse).unwrap();
    f.set_len(64 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &text(128 << 10, 4), 32 << 20).unwrap();
    drop(f);
    let (_, r, _) = scan(&[&sparse], &["--full"]);
    assert_eq!(r["bytes_logical"], 64u64 << 20);
    let data = r["bytes_data"].as_u64().unwrap();
    if data < 64 << 20 {
        // The file system reports holes: only the data is read.
        assert!(data >= 128 << 10, "{data}");
        assert_eq!(r["bytes_scanned"], data);
        assert!(r["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["type"] == "text"));
    } else {
        eprintln!("file system without SEEK_HOLE: holes read as zeros");
    }
}

#[test]
fn writes_a_chart_and_prints_text() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.txt");
    std::fs::write(&p, text(300_000, 2)).unwrap();
    let chart = dir.path().join("c.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args([
            "scan",
            p.to_str().unwrap(),
            "--chart",
            chart.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("recommendation:"), "{stdout}");
    assert!(stdout.contains("\nwhy: "), "{stdout}");
    assert!(stdout.contains("zstd:9"), "{stdout}");
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for name in ["lz4", "zstd:1", "snappy", "deflate:6"] {
        assert!(svg.contains(&format!(">{name}</text>")), "{name}");
    }
}

/// `--dedup` counts every 4 KiB block exactly: copies of one file, a
/// file's tail padded as a volume stores it, zero blocks apart, and a
/// sparse file's hole not read.
#[test]
fn dedup_counts_repeated_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let a = random(40 * 4096 + 100, 7);
    std::fs::write(dir.path().join("a"), &a).unwrap();
    std::fs::write(dir.path().join("a-copy"), &a).unwrap();
    // The same blocks at another alignment inside a file are different
    // sectors: only whole blocks at a file's 4 KiB boundaries repeat.
    let mut shifted = vec![1u8; 2048];
    shifted.extend_from_slice(&a[..8 * 4096]);
    std::fs::write(dir.path().join("shifted"), &shifted).unwrap();
    // Zeros, then a copy of a's first block behind a hole.
    let f = std::fs::File::create(dir.path().join("sparse")).unwrap();
    f.set_len(64 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&[0u8; 4096], 0).unwrap();
    f.write_all_at(&a[..4096], 32 << 20).unwrap();
    f.sync_all().unwrap();
    drop(f);

    let (ok, r, err) = scan(&[dir.path()], &["--dedup", "--sample-mib", "1"]);
    assert!(ok, "{err}");
    let d = &r["dedup"];
    assert_eq!(d["block_size"], 4096);
    assert_eq!(d["sample_rate"], 1.0);
    // a: 41 blocks; its copy: 41; shifted: 9 (2048 + 32 KiB); sparse: the
    // zero block and the copy of a's first block (the hole is not read,
    // though a file system may allocate blocks around the written ones:
    // count those from the report's zero blocks).
    let zero = d["zero_blocks"].as_u64().unwrap();
    assert!(zero >= 1, "{d:#}");
    assert_eq!(d["blocks"].as_u64().unwrap(), 41 + 41 + 9 + 1 + zero);
    assert_eq!(d["sampled_blocks"], 41 + 41 + 9 + 1);
    assert_eq!(d["sampled_distinct"], 41 + 9);
    assert_eq!(d["bytes_saved_estimate"], 42 * 4096);

    // Without --dedup there is no such section; a zero budget is refused.
    let (ok, r, _) = scan(&[dir.path()], &["--sample-mib", "1"]);
    assert!(ok && r.get("dedup").is_none());
    let out = Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args(["scan", "--dedup", "--dedup-mem", "0"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dedup-mem must be at least 1"));
}
