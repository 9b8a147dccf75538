//! `qemu-img convert` of a real file (binaries from /usr/bin) into the
//! export, `qemu-img compare` against the source, and the compression the
//! server reports for it; `qemu-img map` sees the unwritten rest as a hole.

mod common;

use common::*;

#[test]
fn qemu_img_convert_then_compare() {
    if !have_tool("qemu-img") {
        return;
    }
    let w = Workdir::new();
    let src = w.path("src.bin");
    let len = real_file(&src, 12 << 20);
    let srv = Serve::start(&w, &[]);
    let uri = srv.uri();
    run(timed("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(&uri));
    let out = run(timed("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(&uri));
    assert!(out.contains("Images are identical"), "{out}");

    // Holes past the data: qemu-img map lists data only up to the file's end.
    let map = run(timed("qemu-img")
        .args(["map", "-f", "raw", "--output=json"])
        .arg(&uri));
    let v: serde_json::Value = serde_json::from_str(&map).unwrap();
    let tail = v
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["start"].as_u64().unwrap() >= len.div_ceil(4096) as u64 * 4096)
        .unwrap_or_else(|| panic!("no extent past the data: {map}"));
    assert_eq!(tail["data"], false, "{map}");
    assert_eq!(tail["zero"], true, "{map}");

    let st = live_stats(&srv);
    let ratio = st["compression_ratio"].as_f64().unwrap();
    assert!(ratio > 1.2, "binaries should compress: {st}");
    srv.stop();
}
