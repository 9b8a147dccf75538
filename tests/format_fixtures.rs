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
//! - tests/fixtures/format-v3.sqz (format 3: full record headers only, a
//!   chain whose pieces carry segment notes): 4 MiB logical, 512 KiB
//!   segments, created with lz4, the same 256 KiB imported, then `squeeze
//!   set --algorithm zstd:3`, closed cleanly (written by the build at
//!   7f23e56).
//! - tests/fixtures/format-v4.sqz (format 4: short headers, no chunked
//!   payloads): the same recipe, written by the build at d0b39d3.
//! - tests/fixtures/format-v5.sqz (format 5: chunked payloads, 32 KiB
//!   chunks, no block payloads): the same recipe, written by the build at
//!   0a2e4d9.
//! - tests/fixtures/format-v6.sqz (format 6: block payloads possible, no
//!   Link records or indirect map entries): the same recipe, written by
//!   the build at 54bac49.
//! - tests/fixtures/format-v7.sqz (format 7: hidden addresses, Link
//!   records and indirect map entries, dedup settings in the superblock):
//!   the format 6 fixture with its first 256 KiB imported again 2 MiB on,
//!   `squeeze compact --dedup` (63 sectors promoted, both copies linked),
//!   then `squeeze set --dedup idle --dedup-index 16`, closed cleanly
//!   (written by the release build of ecf5375, session 24).
//!
//! Any change to the on-disk format must keep these passing (or bump the
//! version and add a migration, with a new fixture). The map pages out to
//! the checkpoint chain and reads parts of its pieces back: a format 2
//! chain, written before paging existed, is read that way too.

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

/// A copy of `fixture` in `dir` to work on (opening marks a volume dirty).
fn copy_fixture(fixture: &str, dir: &Path) -> std::path::PathBuf {
    let vol = dir.join("old.sqz");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(fixture),
        &vol,
    )
    .unwrap();
    vol
}

/// Opens a copy of `fixture` (format `version`, policy `algorithm`), checks
/// it, reads its first 256 KiB back (CRC-32C 0x87675028 in both
/// fixtures), writes to it so that a checkpoint upgrades it, and checks and
/// reads it again.
fn opens_checks_reads_back_and_upgrades(fixture: &str, version: u32, algorithm: &str) {
    let dir = tempfile::tempdir().unwrap();
    let vol = copy_fixture(fixture, dir.path());
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

#[test]
fn a_version_3_volume_opens_checks_and_reads_back() {
    opens_checks_reads_back_and_upgrades("format-v3.sqz", 3, "zstd:3");
}

#[test]
fn a_version_4_volume_opens_checks_and_reads_back() {
    opens_checks_reads_back_and_upgrades("format-v4.sqz", 4, "zstd:3");
}

#[test]
fn a_version_5_volume_opens_checks_and_reads_back() {
    opens_checks_reads_back_and_upgrades("format-v5.sqz", 5, "zstd:3");
}

#[test]
fn a_version_6_volume_opens_checks_and_reads_back() {
    opens_checks_reads_back_and_upgrades("format-v6.sqz", 6, "zstd:3");
}

/// A version 7 volume (the format of this build, for the changes after
/// it): its shared sectors read back through their hidden addresses, its
/// dedup settings and references are as written, and it takes new writes.
#[test]
fn a_version_7_volume_opens_checks_and_reads_back() {
    opens_checks_reads_back_and_upgrades("format-v7.sqz", 7, "zstd:3");
    let dir = tempfile::tempdir().unwrap();
    let vol = copy_fixture("format-v7.sqz", dir.path());
    let v = vol.to_str().unwrap();
    let i = info(v);
    assert_eq!(i["dedup"]["mode"], "idle", "{i:#}");
    assert_eq!(i["dedup"]["index_bytes"], 16 << 20, "{i:#}");
    let o = squeeze(&["stats", v, "--json"]);
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(st["dedup_shared_sectors"], 63, "{st:#}");
    assert_eq!(st["dedup_references"], 2 * 63, "{st:#}");
    // The second copy, through the hidden addresses both copies share.
    let o = squeeze(&[
        "export",
        v,
        dir.path().join("both.bin").to_str().unwrap(),
        "--length",
        &((2 << 20) + 262144).to_string(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let both = std::fs::read(dir.path().join("both.bin")).unwrap();
    assert_eq!(
        squeeze_format::checksum::crc32c(&both[2 << 20..]),
        0x8767_5028
    );
}

/// A version 5 volume deduplicates once its superblock says version 7:
/// `compact --dedup` checkpoints first, then links, and it reads back
/// and checks clean, with the copies shared.
#[test]
fn a_version_5_volume_deduplicates_after_its_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let vol = copy_fixture("format-v5.sqz", dir.path());
    let v = vol.to_str().unwrap();
    let data = export_256k(v, &dir.path().join("out.bin"));
    // A second copy of the first 256 KiB, 2 MiB further on.
    let copy = dir.path().join("copy.bin");
    let mut twice = vec![0u8; 2 << 20];
    twice.extend_from_slice(&data);
    std::fs::write(&copy, &twice).unwrap();
    let o = squeeze(&["import", copy.to_str().unwrap(), v]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // import wrote 2 MiB of zeros over the first copy: put it back.
    let first = dir.path().join("first.bin");
    std::fs::write(&first, &data).unwrap();
    let o = squeeze(&["import", first.to_str().unwrap(), v]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = squeeze(&["compact", v, "--dedup", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // 63 of the 64 sectors hold data (the fixture's last 4 KiB are zeros).
    assert_eq!(rep["dedup"]["sectors_promoted"], 63, "{rep:#}");
    let i = info(v);
    assert_eq!(i["format_version"], squeeze_format::DEDUP_VERSION);
    check(v);
    assert_eq!(export_256k(v, &dir.path().join("again.bin")), data);
    let o = squeeze(&["stats", v, "--json"]);
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(st["dedup_references"], 2 * 63, "{st:#}");
}

/// A version 6 volume reads with dedup off (its superblock has no dedup
/// settings: bytes 4080..4092 may be checkpoint segment ids before version
/// 7); `set --dedup idle` checkpoints it to version 7 first, then keeps the
/// mode, and it still checks clean and reads back.
#[test]
fn a_version_6_volume_takes_a_dedup_mode_after_its_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let vol = copy_fixture("format-v6.sqz", dir.path());
    let v = vol.to_str().unwrap();
    let data = export_256k(v, &dir.path().join("out.bin"));
    assert_eq!(info(v)["dedup"]["mode"], "off");
    let o = squeeze(&["set", v, "--dedup", "idle", "--dedup-index", "16"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let i = info(v);
    assert_eq!(i["format_version"], squeeze_format::DEDUP_VERSION);
    assert_eq!(i["dedup"]["mode"], "idle", "{i:#}");
    assert_eq!(i["dedup"]["index_bytes"], 16 << 20, "{i:#}");
    check(v);
    assert_eq!(export_256k(v, &dir.path().join("again.bin")), data);
}

/// Sectors like a sparse write-ahead log's commits: 128 bytes (half random,
/// half a repeat of them), then zeros.
fn commit_sectors(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 4096);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..n {
        let half: Vec<u8> = (0..64)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        out.extend_from_slice(&half);
        out.extend_from_slice(&half);
        out.resize(out.len() + 4096 - 128, 0);
    }
    out
}

/// A version 5 log has no block payloads; once a checkpoint has made the
/// superblock say 6, small zstd frames become block payloads, and the two
/// read back side by side (and after a compaction, which moves them).
#[test]
fn a_version_5_volume_writes_block_payloads_only_after_its_upgrade() {
    use squeeze_engine::{FileStorage, Volume};
    let dir = tempfile::tempdir().unwrap();
    let vol = copy_fixture("format-v5.sqz", dir.path());
    let blocks = |vol: &Path| data_records(vol).iter().filter(|h| h.block).count();
    assert_eq!(blocks(&vol), 0);
    let data = export_256k(vol.to_str().unwrap(), &dir.path().join("out.bin"));
    let commits = commit_sectors(16);
    let storage = std::sync::Arc::new(FileStorage::open(&vol).unwrap());
    let v = Volume::open(storage, Default::default()).unwrap();
    // Before the upgrade: frames, one sector a write as a log's commits.
    for (k, s) in commits[..8 * 4096].chunks(4096).enumerate() {
        v.write((2 << 20) + k as u64 * 4096, s, false).unwrap();
        v.flush().unwrap();
    }
    assert_eq!(v.superblock().version, 5);
    assert_eq!(blocks(&vol), 0, "a block payload in a version 5 log");
    // The checkpoint makes it this build's version; then block payloads.
    v.checkpoint().unwrap();
    assert_eq!(v.superblock().version, squeeze_format::FORMAT_VERSION);
    for (k, s) in commits[8 * 4096..].chunks(4096).enumerate() {
        v.write((3 << 20) + k as u64 * 4096, s, false).unwrap();
        v.flush().unwrap();
    }
    v.close().unwrap();
    let recs = data_records(&vol);
    let new: Vec<_> = recs.iter().filter(|h| h.lba >= 768).collect();
    let old: Vec<_> = recs
        .iter()
        .filter(|h| (512..768).contains(&h.lba))
        .collect();
    assert_eq!((new.len(), old.len()), (8, 8));
    assert!(new.iter().all(|h| h.block), "{new:?}");
    assert!(old.iter().all(|h| !h.block), "{old:?}");
    // The frame's headers and its zero tail: 13 bytes or more a record.
    let most_new = new.iter().map(|h| h.stored_len).max().unwrap();
    let least_old = old.iter().map(|h| h.stored_len).min().unwrap();
    assert!(most_new + 13 <= least_old, "{most_new} {least_old}");
    let v = vol.to_str().unwrap();
    check(v);
    let all = |name: &str| {
        let out = dir.path().join(name);
        let o = squeeze(&["export", v, out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(out).unwrap()
    };
    let before = all("before.bin");
    assert_eq!(before[..262144], data[..]);
    assert!(before[2 << 20..(2 << 20) + 8 * 4096] == commits[..8 * 4096]);
    assert!(before[3 << 20..(3 << 20) + 8 * 4096] == commits[8 * 4096..]);
    let o = squeeze(&["compact", v]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check(v);
    assert!(all("after.bin") == before);
    // The moved block payloads are still block payloads.
    assert!(blocks(&vol) >= 8);
}

/// The extent and relocation records of the log. Walks the segments'
/// records as the cleaner does.
fn data_records(vol: &Path) -> Vec<squeeze_format::RecordHeader> {
    let i = info(vol.to_str().unwrap());
    let hex = i["uuid"].as_str().unwrap().replace('-', "");
    let uuid: [u8; 16] =
        std::array::from_fn(|k| u8::from_str_radix(&hex[2 * k..2 * k + 2], 16).unwrap());
    let seg = i["segment_size"].as_u64().unwrap() as usize;
    let bytes = std::fs::read(vol).unwrap();
    let mut out = Vec::new();
    for s in bytes[squeeze_format::DATA_START as usize..].chunks(seg) {
        use squeeze_format::{RecordScan, Stride};
        for r in RecordScan::new(s, uuid, Stride::Record) {
            if r.header.kind.has_payload() {
                out.push(r.header);
            }
        }
    }
    out
}

/// A version 4 volume keeps one frame a blob (its policy's read chunk is
/// 0, also after its upgrade) until `set --read-chunk` asks for chunks,
/// which makes it version 5 at once; then its new blobs are chunked, the
/// old and the new read back side by side, and a compaction moves both.
#[test]
fn a_version_4_volume_chunks_new_blobs_once_asked() {
    let dir = tempfile::tempdir().unwrap();
    let vol = copy_fixture("format-v4.sqz", dir.path());
    let v = vol.to_str().unwrap();
    assert!(data_records(&vol).iter().all(|h| !h.is_chunked()));
    let data = export_256k(v, &dir.path().join("out.bin"));
    let write_at = |at: u64| {
        use squeeze_engine::{FileStorage, Volume};
        let storage = std::sync::Arc::new(FileStorage::open(&vol).unwrap());
        let vv = Volume::open(storage, Default::default()).unwrap();
        vv.write(at, &data, false).unwrap();
        vv.close().unwrap();
    };
    write_at(1 << 20);
    let i = info(v);
    // Its checkpoint made it this build's version (5 or later).
    assert_eq!(i["format_version"], squeeze_format::FORMAT_VERSION);
    assert_eq!(i["policy"]["read_chunk"], 0);
    assert!(data_records(&vol).iter().all(|h| !h.is_chunked()));
    let o = squeeze(&["set", v, "--read-chunk", "16K"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(info(v)["policy"]["read_chunk"], 16384);
    write_at(2 << 20);
    let chunked: Vec<_> = data_records(&vol)
        .into_iter()
        .filter(|h| h.is_chunked())
        .collect();
    assert!(!chunked.is_empty());
    assert!(chunked.iter().all(|h| h.chunk_sectors == 4 && h.lba >= 512));
    check(v);
    let all = |name: &str| {
        let out = dir.path().join(name);
        let o = squeeze(&["export", v, out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(out).unwrap()
    };
    let before = all("before.bin");
    for at in [0usize, 1 << 20, 2 << 20] {
        assert_eq!(before[at..at + 262144], data[..], "at {at}");
    }
    let o = squeeze(&["compact", v]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check(v);
    assert!(all("after.bin") == before);
}

/// The records of the log, by header form: (full, short).
fn records_by_form(vol: &Path) -> (usize, usize) {
    let short = data_records(vol)
        .iter()
        .filter(|h| h.form == squeeze_format::HeaderForm::Short)
        .count();
    (data_records(vol).len() - short, short)
}

/// A version 3 log has full headers only; once a checkpoint has made the
/// superblock say 4, new records get short ones, and the two kinds of
/// record read back side by side (and after a compaction, which moves the
/// old ones).
#[test]
fn a_version_3_volume_writes_short_headers_only_after_its_upgrade() {
    use squeeze_engine::{FileStorage, Volume};
    let dir = tempfile::tempdir().unwrap();
    let vol = copy_fixture("format-v3.sqz", dir.path());
    let (full, short) = records_by_form(&vol);
    assert!(full > 0 && short == 0, "{full} full, {short} short");
    let data = export_256k(vol.to_str().unwrap(), &dir.path().join("out.bin"));
    let storage = std::sync::Arc::new(FileStorage::open(&vol).unwrap());
    let v = Volume::open(storage, Default::default()).unwrap();
    // Before the upgrade: full headers.
    v.write(2 << 20, &data[..131072], false).unwrap();
    v.flush().unwrap();
    assert_eq!(v.superblock().version, 3);
    assert_eq!(
        records_by_form(&vol).1,
        0,
        "a short header in a version 3 log"
    );
    // The checkpoint makes it this build's version; then short headers.
    v.checkpoint().unwrap();
    assert_eq!(v.superblock().version, squeeze_format::FORMAT_VERSION);
    v.write(3 << 20, &data[131072..], false).unwrap();
    v.close().unwrap();
    let (full, short) = records_by_form(&vol);
    assert!(full > 0 && short > 0, "{full} full, {short} short");
    let v = vol.to_str().unwrap();
    check(v);
    let all = |name: &str| {
        let out = dir.path().join(name);
        let o = squeeze(&["export", v, out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(out).unwrap()
    };
    let before = all("before.bin");
    assert_eq!(before[..262144], data[..]);
    assert_eq!(before[2 << 20..(2 << 20) + 131072], data[..131072]);
    assert_eq!(before[3 << 20..(3 << 20) + 131072], data[131072..]);
    let o = squeeze(&["compact", v]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check(v);
    assert!(all("after.bin") == before);
    // Everything the compaction moved got a short header.
    let (full, short) = records_by_form(&vol);
    assert!(short > 0, "{full} full, {short} short");
}

/// Opens a copy of `fixture` read-only with no map cache: the chain the old
/// build wrote is streamed piece by piece and every chunk that can page out
/// does as it loads, and the reads page it back in from that chain (a
/// format 2 chain), or nothing pages (a format 1 stream, which the map
/// cannot read in part). Returns the chunks paged in.
fn reads_back_with_the_map_paged_out(fixture: &str) -> u64 {
    use squeeze_engine::{FileStorage, OpenOptions, Volume};
    let dir = tempfile::tempdir().unwrap();
    let vol = copy_fixture(fixture, dir.path());
    let storage = std::sync::Arc::new(FileStorage::open(&vol).unwrap());
    let v = Volume::open(
        storage,
        OpenOptions {
            read_only: true,
            map_cache: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    let paged = v.stats().map_paged_chunks;
    let mut data = vec![0u8; 262144];
    v.read(0, &mut data).unwrap();
    assert_eq!(squeeze_format::checksum::crc32c(&data), 0x8767_5028);
    let st = v.stats();
    assert_eq!(st.map_faults, paged, "{st:?}");
    st.map_faults
}

#[test]
fn a_version_2_chain_is_read_in_part_when_the_map_pages() {
    assert!(reads_back_with_the_map_paged_out("format-v2.sqz") > 0);
}

#[test]
fn a_version_1_stream_keeps_the_map_in_memory() {
    assert_eq!(reads_back_with_the_map_paged_out("format-v1.sqz"), 0);
}
