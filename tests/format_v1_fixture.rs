//! A volume written by format version 1 (tests/fixtures/format-v1.sqz: 4 MiB
//! logical, 512 KiB segments, zstd:3, 256 KiB of text, random bytes and
//! zeros imported, closed cleanly) still opens, checks clean and reads back
//! byte for byte. Any change to the on-disk format must keep this passing
//! (or bump the version and add a migration, with a new fixture).

use std::process::Command;

fn squeeze(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_squeeze"))
        .args(args)
        .output()
        .expect("run squeeze")
}

#[test]
fn a_version_1_volume_opens_checks_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("v1.sqz");
    // Work on a copy: opening marks the volume dirty.
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/format-v1.sqz"),
        &vol,
    )
    .unwrap();
    let v = vol.to_str().unwrap();
    let o = squeeze(&["info", v, "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(info["format_version"], 1);
    assert_eq!(info["logical_size"], 4 << 20);
    assert_eq!(info["policy"]["algorithm"], "zstd:3");
    assert_eq!(info["clean"], true);
    let o = squeeze(&["check", v]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let out = dir.path().join("out.bin");
    let o = squeeze(&["export", v, out.to_str().unwrap(), "--length", "262144"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let data = std::fs::read(&out).unwrap();
    assert_eq!(data.len(), 262144);
    assert_eq!(squeeze_format::checksum::crc32c(&data), 0x8767_5028);
    // It takes new writes; its first checkpoint upgrades it to format 2
    // (a chain of pieces), after which it still checks clean and reads back.
    let o = squeeze(&["import", out.to_str().unwrap(), v]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = squeeze(&["info", v, "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(info["format_version"], squeeze_format::FORMAT_VERSION);
    assert_eq!(info["clean"], true);
    let o = squeeze(&["check", v]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let again = dir.path().join("again.bin");
    let o = squeeze(&["export", v, again.to_str().unwrap(), "--length", "262144"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(&again).unwrap(), data);
}
