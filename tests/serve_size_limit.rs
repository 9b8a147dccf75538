//! The largest logical size is the largest every NBD client takes,
//! 2^63 - 2^30 bytes (`squeeze_engine::MAX_LOGICAL_SIZE`): NBD sends the
//! export size as u64, but qemu, the kernel and libnbd read it as a signed
//! number (2^63 showed qemu a 0-byte disk, nbdinfo -9223372036854775808)
//! and qemu opens nothing longer than 2^63 aligned down to 1 GiB. `create`,
//! `resize` (on a file and live) refuse more, naming the maximum, and
//! leave everything as it was; a volume of exactly the maximum is served
//! and its last sector written and read; `serve` refuses a volume made
//! larger by an older build instead of showing clients a negative size.

mod common;
use common::*;

const MAX: u64 = (1 << 63) - (1 << 30);

fn squeeze_err(args: &[&str]) -> String {
    let (ok, out) = run_any(squeeze().args(args));
    assert!(!ok, "squeeze {args:?} should fail:\n{out}");
    out
}

fn logical_size(v: &str) -> u64 {
    let info: serde_json::Value =
        serde_json::from_str(&run(squeeze().args(["info", v, "--json"]))).unwrap();
    info["logical_size"].as_u64().unwrap()
}

#[test]
fn sizes_clients_cannot_take_are_refused_with_the_maximum_named() {
    assert_eq!(MAX, squeeze_engine::MAX_LOGICAL_SIZE);
    let w = Workdir::new();
    let v = w.volume();
    let v = v.to_str().unwrap();
    let over = [
        (MAX + 4096).to_string(),
        (MAX + (1 << 30)).to_string(), // 2^63
        "8192P".to_string(),
        "16383P".to_string(),
        (u64::MAX - 4095).to_string(),
    ];
    for size in &over {
        let e = squeeze_err(&["create", v, "--size", size]);
        assert!(
            e.contains(&format!("largest logical size is {MAX} bytes")),
            "{size}: {e}"
        );
        assert!(!w.volume().exists(), "a refused create left {v}");
    }
    // 2^64 is no size at all.
    let e = squeeze_err(&["create", v, "--size", "16384P"]);
    assert!(e.contains("too large"), "{e}");

    // The maximum itself: created, served, its last sector written and read.
    run(squeeze().args(["create", v, "--size", &MAX.to_string()]));
    assert_eq!(logical_size(v), MAX);
    for size in &over {
        let e = squeeze_err(&["resize", v, "--size", size]);
        assert!(
            e.contains(&format!("largest logical size is {MAX} bytes")),
            "{size}: {e}"
        );
    }
    assert_eq!(logical_size(v), MAX);
    let srv = Serve::start(&w, &[]);
    assert_eq!(srv.client(false).size, MAX);
    let ctl = srv.control.to_str().unwrap().to_string();
    for size in &over {
        let e = squeeze_err(&["resize", &ctl, "--size", size]);
        assert!(
            e.contains(&format!("largest logical size is {MAX} bytes")),
            "{size}: {e}"
        );
    }
    assert_eq!(live_stats(&srv)["logical_size"].as_u64().unwrap(), MAX);
    if have_tool("qemu-img") && have_tool("qemu-io") {
        let info = run(timed("qemu-img")
            .args(["info", "--output=json"])
            .arg(srv.uri()));
        assert!(info.contains(&format!("\"virtual-size\": {MAX}")), "{info}");
        let last = MAX - 4096;
        qemu_io_ok(
            &srv.uri(),
            &[
                &format!("write -P 0x5c {last} 4096"),
                &format!("read -P 0x5c {last} 4096"),
            ],
        );
    }
    srv.stop();
    assert_eq!(logical_size(v), MAX);
    run(squeeze().args(["check", v]));
}

/// A volume whose superblocks say 2^63 bytes (as a build before the cap
/// could create): `serve` refuses it with the way out named, and after
/// `squeeze resize` to a size clients take, serves it.
#[test]
fn serve_refuses_a_volume_over_the_maximum() {
    let w = Workdir::new();
    w.create("1G", &[]);
    let v = w.volume();
    let mut b = std::fs::read(&v).unwrap();
    let mut patched = 0;
    for slot in 0..2 {
        let at = slot * squeeze_format::SUPERBLOCK_SIZE;
        let raw = &b[at..at + squeeze_format::SUPERBLOCK_SIZE];
        if let Ok(mut sb) = squeeze_format::Superblock::decode(raw) {
            sb.logical_size = 1 << 63;
            b[at..at + squeeze_format::SUPERBLOCK_SIZE].copy_from_slice(&sb.encode());
            patched += 1;
        }
    }
    assert!(patched > 0);
    std::fs::write(&v, &b).unwrap();
    let v = v.to_str().unwrap();
    assert_eq!(logical_size(v), 1 << 63);

    let (ok, out) = run_any(squeeze().args(["serve", "--socket"]).arg(w.socket()).arg(v));
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("at most {MAX} bytes")) && out.contains("squeeze resize"),
        "{out}"
    );
    run(squeeze().args(["resize", v, "--size", "2G"]));
    let srv = Serve::start(&w, &[]);
    assert_eq!(srv.client(false).size, 2 << 30);
    srv.stop();
}
