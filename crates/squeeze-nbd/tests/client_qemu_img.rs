//! `qemu-img convert` of a real file into an export, `qemu-img compare`
//! against the source, `qemu-img map` seeing the zero ranges, and a
//! convert back out to a file that matches byte for byte.

mod common;

use std::process::Command;

use common::*;

#[test]
fn qemu_img_convert_and_compare() {
    if !have_tool("qemu-img") {
        return;
    }
    let size = 16usize << 20;
    let (srv, _dev) = TestServer::mem(size as u64);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    let data = mixed_data(size, 7);
    std::fs::write(&src, &data).unwrap();

    run(timed("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(srv.uri()));
    run(timed("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(srv.uri()));

    // The zero quarter of the source is known to be zero on the export.
    let map = run(timed("qemu-img")
        .args(["map", "--output=json", "-f", "raw"])
        .arg(srv.uri()));
    assert!(map.contains("\"zero\": true"), "{map}");

    run(timed("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(srv.uri())
        .arg(&back));
    assert!(std::fs::read(&back).unwrap() == data, "round trip differs");

    // A differing byte is noticed.
    let mut c = srv.client();
    c.handshake("mem", false, false);
    assert_eq!(c.write(5 << 20, b"X"), 0);
    c.disconnect();
    let out = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(srv.uri())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}
