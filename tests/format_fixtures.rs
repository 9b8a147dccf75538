//! Volumes written by older format versions still open, check clean, read
//! back byte for byte, and are upgraded by their first checkpoint:
//!
//! - tests/fixtures/format-v1.sqz (format 1: one dense checkpoint stream):
//!   4 MiB logical, 512 KiB segments, zstd:3, 256 KiB of text, random bytes
//!   and zeros imported, closed cleanly.
//! - tests/fixtures/format-v2.sqz (format 2: a chain of pieces without
//!   segment notes, a base and three deltas): 4 MiB logical, 512 KiB
//!   segments, created with lz4, the first 256 KiB of the format 1 fixture
//!   imported, then `squeeze set --algorithm zstd:3`, closed cleanly
//!   (written by the build at 5b49be3).
//!
//! Any change to the on-disk format must keep these passing (or bump the
//! version and add a migration, with a new fixture).

use std::path::Path;
use std::process::Command;

fn squeeze(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args(args)
        .output()
        .expect("run squeeze")
}

fn info(v: &str) -> serde_json::Value {
    let o = squeeze(&["info", v, "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn check(v: &str) {
    let o = squeeze(&["check", v]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

fn export_256k(v: &str, out: &Path) -> Vec<u8> {
    let o = squeeze(&["export", v, out.to_str().unwrap(), "--length", "262144"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read(out).unwrap()
}

/// Opens a copy of `fixture` (format `version`, policy `algorithm`), checks
/// it, reads its first 256 KiB back (CRC-32C 0x87675028 in both
/// fixtures), writes to it so that a checkpoint upgrades it, and checks and
/// reads it again.
fn opens_checks_reads_back_and_upgrades(fixture: &str, version: u32, algorithm: &str) {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("old.sqz");
    // Work on a copy: opening marks the volume dirty.
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(fixture),
        &vol,
    )
    .unwrap();
    let v = vol.to_str().unwrap();
    let i = info(v);
    assert_eq!(i["format_version"], version);
    assert_eq!(i["logical_size"], 4 << 20);
    assert_eq!(i["policy"]["algorithm"], algorithm);
    assert_eq!(i["clean"], true);
    check(v);
    let data = export_256k(v, &dir.path().join("out.bin"));
    assert_eq!(data.len(), 262144);
    assert_eq!(squeeze_format::checksum::crc32c(&data), 0x8767_5028);
    // It takes new writes; its first checkpoint (a base) upgrades it to
    // this build's format, after which it still checks clean and reads
    // back.
    let o = squeeze(&["import", dir.path().join("out.bin").to_str().unwrap(), v]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let i = info(v);
    assert_eq!(i["format_version"], squeeze_format::FORMAT_VERSION);
    assert_eq!(i["clean"], true);
    check(v);
    assert_eq!(export_256k(v, &dir.path().join("again.bin")), data);
}

#[test]
fn a_version_1_volume_opens_checks_and_reads_back() {
    opens_checks_reads_back_and_upgrades("format-v1.sqz", 1, "zstd:3");
}

#[test]
fn a_version_2_volume_opens_checks_and_reads_back() {
    opens_checks_reads_back_and_upgrades("format-v2.sqz", 2, "zstd:3");
}
