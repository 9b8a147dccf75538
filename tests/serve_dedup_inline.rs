//! Dedup mode inline through a real server (docs/DEDUP.md): a volume
//! created with `--dedup inline`, served, and written by qemu-io with the
//! same 1 MiB of data at three offsets and a different 1 MiB beside them:
//! the second and third copies are linked as they are written (the live
//! stats and /metrics say so), every byte reads back through NBD, and
//! the volume checks clean after the server stopped; the inline index
//! keeps 1 fingerprint in 8 unless `--dedup-sample` says otherwise (1:
//! dense; not a power of two up to 32: refused).

mod common;
use common::*;

#[test]
fn copies_written_through_nbd_are_linked_as_written() {
    if !have_tool("qemu-io") {
        return;
    }
    let w = Workdir::new();
    w.create("64M", &["--dedup", "inline", "--dedup-index", "16"]);
    let srv = Serve::start(&w, &[]);
    assert_eq!(live_stats(&srv)["dedup_mode"], "inline");
    // The inline index keeps 1 fingerprint in 8 by default.
    assert_eq!(live_stats(&srv)["dedup_inline_index_sample"], 8);
    let a = random_data(1 << 20, 38);
    let b = mixed_data(1 << 20, 39);
    let fa = w.path("a.bin");
    let fb = w.path("b.bin");
    std::fs::write(&fa, &a).unwrap();
    std::fs::write(&fb, &b).unwrap();
    let (fa, fb) = (fa.to_str().unwrap(), fb.to_str().unwrap());
    qemu_io_ok(
        &srv.qemu_uri(),
        &[
            &format!("write -s {fa} 0 1M"),
            &format!("write -s {fb} 4M 1M"),
            &format!("write -s {fa} 8M 1M"),
            &format!("write -s {fa} 16M 1M"),
            "flush",
        ],
    );
    let st = live_stats(&srv);
    // qemu-io may cut a write into several requests: at least the whole
    // of two copies, less what a cut at an odd place leaves to the idle
    // pass.
    let linked = st["dedup_inline_linked_sectors"].as_u64().unwrap();
    assert!(linked >= 2 * 256 - 8, "{st}");
    assert_eq!(st["dedup_inline_mismatched_sectors"], 0, "{st}");
    assert!(
        st["dedup_saved_bytes"].as_u64().unwrap() >= (2 << 20) - (32 << 10),
        "{st}"
    );
    // Hooks only: about 1 in 8 of the 512 distinct sectors written.
    let hooks = st["dedup_inline_index_entries"].as_u64().unwrap();
    assert!(hooks > 0 && hooks < 512 / 4, "{st}");
    let mut c = srv.client(false);
    for (at, want) in [(0u64, &a), (4 << 20, &b), (8 << 20, &a), (16 << 20, &a)] {
        let mut got = Vec::new();
        for k in 0..4u64 {
            got.extend(c.read(at + (k << 18), 1 << 18).expect("read"));
        }
        assert!(got == *want, "bytes at {at} differ from what was written");
    }
    drop(c);
    srv.stop();
    squeeze_ok_check(&w);
}

#[test]
fn dedup_sample_chooses_the_inline_index_sampling() {
    let w = Workdir::new();
    w.create("64M", &["--dedup", "inline", "--dedup-index", "16"]);
    for bad in ["3", "64", "0"] {
        let (ok, out) = run_any(squeeze().args([
            "serve",
            "--socket",
            w.socket().to_str().unwrap(),
            "--dedup-sample",
            bad,
            w.volume().to_str().unwrap(),
        ]));
        assert!(!ok && out.contains("power of two"), "{bad}: {out}");
    }
    let srv = Serve::start(&w, &["--dedup-sample", "1"]);
    assert_eq!(live_stats(&srv)["dedup_inline_index_sample"], 1);
    let mut c = srv.client(false);
    assert_eq!(c.write(0, &random_data(64 << 10, 7)), 0, "write");
    c.disconnect();
    // Dense: every sector written is an entry.
    assert_eq!(live_stats(&srv)["dedup_inline_index_entries"], 16);
    srv.stop();
}

fn squeeze_ok_check(w: &Workdir) {
    let out = run(squeeze().args(["check", w.volume().to_str().unwrap()]));
    assert!(!out.contains("damaged"), "{out}");
}
