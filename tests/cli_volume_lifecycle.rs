//! The CLI end to end on a real file: create, info, import a real file
//! (holes stay holes), stats, export and compare, set, check (clean, then
//! after a flipped byte it names the damaged LBAs and exits 1), and clear
//! errors for files that are not volumes.

use std::path::Path;
use std::process::{Command, Output};

fn squeeze(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args(args)
        .output()
        .expect("run squeeze")
}

fn ok(args: &[&str]) -> String {
    let o = squeeze(args);
    assert!(
        o.status.success(),
        "squeeze {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// A few MiB of real files (binaries and text) with a hole in the middle.
fn real_source(path: &Path) {
    let mut data = Vec::new();
    for f in [
        "/usr/bin/ls",
        "/usr/bin/cat",
        "/usr/bin/env",
        "/etc/services",
        "/usr/bin/tar",
    ] {
        if let Ok(b) = std::fs::read(f) {
            data.extend_from_slice(&b);
        }
    }
    assert!(data.len() > 100_000, "no real files to import");
    let f = std::fs::File::create(path).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&data, 0).unwrap();
    // a 4 MiB hole, then the data again
    f.write_all_at(&data, data.len() as u64 + (4 << 20))
        .unwrap();
}

#[test]
fn create_import_export_check() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let vol = d.join("v.sqz");
    let v = vol.to_str().unwrap();
    let out = ok(&[
        "create",
        v,
        "--size",
        "64M",
        "--algorithm",
        "zstd:3",
        "--mode",
        "force",
    ]);
    assert!(out.contains("created"), "{out}");
    let info = ok(&["info", v, "--json"]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["policy"]["algorithm"], "zstd:3");
    assert_eq!(info["policy"]["mode"], "force");
    assert_eq!(info["logical_size"], 64 << 20);
    assert_eq!(info["format_version"], squeeze_format::FORMAT_VERSION);

    let src = d.join("src.img");
    real_source(&src);
    let out = ok(&["import", src.to_str().unwrap(), v]);
    assert!(out.contains("MB/s") && out.contains("ratio"), "{out}");

    let st: serde_json::Value = serde_json::from_str(&ok(&["stats", v, "--json"])).unwrap();
    for k in [
        "logical_size",
        "bytes_written",
        "mapped_bytes",
        "stored_bytes",
        "physical_bytes",
        "compression_ratio",
        "map_memory_bytes",
    ] {
        assert!(st.get(k).is_some(), "stats lacks {k}");
    }
    assert!(st["compression_ratio"].as_f64().unwrap() > 1.5, "{st}");
    let src_len = std::fs::metadata(&src).unwrap().len();
    assert!(
        st["mapped_bytes"].as_u64().unwrap() < src_len - (3 << 20),
        "hole was stored: {st}"
    );
    let text = ok(&["stats", v]);
    assert!(text.contains("compression ratio"), "{text}");

    let back = d.join("back.img");
    ok(&[
        "export",
        v,
        back.to_str().unwrap(),
        "--length",
        &src_len.to_string(),
    ]);
    assert!(std::fs::read(&src).unwrap() == std::fs::read(&back).unwrap());

    let out = ok(&["set", v, "--algorithm", "lz4", "--mode", "aggressive"]);
    assert!(out.contains("lz4"), "{out}");
    let info: serde_json::Value = serde_json::from_str(&ok(&["info", v, "--json"])).unwrap();
    assert_eq!(info["policy"]["algorithm"], "lz4");

    let out = ok(&["check", v]);
    assert!(out.contains("ok: no damage"), "{out}");

    // Flip a byte in the middle of the first live record's payload.
    let hex = info["uuid"].as_str().unwrap().replace('-', "");
    let uuid: [u8; 16] = std::array::from_fn(|i| {
        u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("uuid in hex")
    });
    let bytes = std::fs::read(&vol).unwrap();
    let mut off = 1 << 20;
    let mut target = None;
    while off + 64 < bytes.len() {
        if let Ok(h) = squeeze_format::RecordHeader::decode(&bytes[off..off + 64], &uuid) {
            if h.kind == squeeze_format::RecordKind::Extent && h.lba == 0 {
                // A byte of the first chunk (format 5: the payload starts
                // with the chunk table), so LBA 0 is among the damaged.
                target = Some(off + h.header_len() + h.table_len() + 10);
                break;
            }
        }
        off += 16;
    }
    let target = target.expect("record of LBA 0");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&vol).unwrap();
        f.write_all_at(&[bytes[target] ^ 0x40], target as u64)
            .unwrap();
    }
    let o = squeeze(&["check", v]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("DAMAGED LBA 0..="), "{out}");
    let o = squeeze(&["check", v, "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], false);
    assert_eq!(j["damaged"][0]["first_lba"], 0);
    // Export refuses to hand out corrupt data.
    let o = squeeze(&["export", v, back.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("checksum"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn clear_errors_for_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, vec![b'x'; 100_000]).unwrap();
    for cmd in ["info", "stats", "check"] {
        let o = squeeze(&[cmd, text.to_str().unwrap()]);
        assert!(!o.status.success(), "{cmd}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("not a squeeze volume"), "{cmd}: {err}");
    }
    let o = squeeze(&["info", dir.path().join("missing.sqz").to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("No such file"));
    let o = squeeze(&["create", text.to_str().unwrap(), "--size", "1G"]);
    assert!(!o.status.success(), "create must not overwrite a file");
    assert_eq!(std::fs::metadata(&text).unwrap().len(), 100_000);
    let v = dir.path().join("v.sqz");
    let o = squeeze(&[
        "create",
        v.to_str().unwrap(),
        "--size",
        "1G",
        "--max-blob",
        "1M",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("max_blob"));
    assert!(!v.exists(), "a failed create leaves no file");
    let o = squeeze(&[
        "create",
        v.to_str().unwrap(),
        "--size",
        "1G",
        "--algorithm",
        "brotli",
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("brotli"));
    let o = squeeze(&["create", v.to_str().unwrap(), "--size", "12Q"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("unit"));
}

#[test]
fn bench_reports_the_documented_keys() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(&[
        "bench",
        "--json",
        "--size",
        "16M",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    for k in [
        "write_mbps",
        "read_mbps",
        "raw_compress_mbps",
        "raw_decompress_mbps",
        "ratio",
        "random_read_iops",
        "raw_file_random_read_iops",
        "random_read_vs_raw_file",
        "cpu_us_per_random_read",
    ] {
        assert!(j[k].as_f64().unwrap() > 0.0, "{k}: {j}");
    }
    assert!((j["ratio"].as_f64().unwrap() - 2.4).abs() < 0.5, "{j}");
}
