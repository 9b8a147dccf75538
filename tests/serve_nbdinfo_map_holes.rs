//! `nbdinfo` sees the export (size, multi-conn, block sizes) and
//! `nbdinfo --map` reports holes where the client trimmed, wrote zeros with
//! unmap allowed, or wrote data that is all zeros (zeros are free), and
//! allocated data where it wrote zeros with NO_HOLE (`qemu-io write -z`
//! without `-u`): that range stays provisioned.

mod common;

use common::*;

/// (offset, length, type) rows of `nbdinfo --map`.
fn map(uri: &str) -> Vec<(u64, u64, u32)> {
    let out = run(timed("nbdinfo").arg("--map").arg(uri));
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn nbdinfo_map_shows_trim_and_zero_holes() {
    if !have_tool("nbdinfo") || !have_tool("qemu-io") {
        return;
    }
    let w = Workdir::new();
    w.create("16M", &[]);
    let srv = Serve::start(&w, &[]);
    let uri = srv.uri();

    let info = run(timed("nbdinfo").arg(&uri));
    assert!(info.contains("export-size: 16777216"), "{info}");
    assert!(info.contains("can_multi_conn: true"), "{info}");
    assert!(info.contains("can_trim: true"), "{info}");
    assert!(info.contains("can_zero: true"), "{info}");
    assert!(info.contains("can_fua: true"), "{info}");
    assert!(info.contains("block_size_preferred: 4096"), "{info}");

    assert_eq!(map(&uri), vec![(0, 16 * MIB, 3)]);
    qemu_io_ok(&uri, &["write -P 0x5c 0 8M"]);
    assert_eq!(map(&uri), vec![(0, 8 * MIB, 0), (8 * MIB, 8 * MIB, 3)]);
    qemu_io_ok(
        &uri,
        &[
            "discard 1M 1M",
            "write -z -u 5M 1M",
            "write -z 7M 512k",
            "write -P 0 12M 1M",
        ],
    );
    assert_eq!(
        map(&uri),
        vec![
            (0, MIB, 0),
            (MIB, MIB, 3),
            (2 * MIB, 3 * MIB, 0),
            (5 * MIB, MIB, 3),
            (6 * MIB, 2 * MIB, 0),
            (8 * MIB, 8 * MIB, 3),
        ]
    );
    qemu_io_ok(
        &uri,
        &[
            "read -P 0x5c 0 1M",
            "read -P 0 1M 1M",
            "read -P 0x5c 2M 3M",
            "read -P 0 5M 1M",
            "read -P 0x5c 6M 1M",
            "read -P 0 7M 512k",
            "read -P 0x5c 7680k 512k",
        ],
    );
    srv.stop();
}
