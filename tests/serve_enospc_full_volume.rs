//! ENOSPC end to end: a volume capped at 16 MiB physical fills up with
//! incompressible writes from qemu-io, which reports "No space left on
//! device"; what was written still reads back; after a trim, writing works
//! again; the server never stops serving.

mod common;

use common::*;
use std::time::{Duration, Instant};

#[test]
fn full_volume_gives_enospc_then_trim_frees() {
    if !have_tool("qemu-io") {
        return;
    }
    let w = Workdir::new();
    w.create("256M", &["--max-physical", "16M", "--segment-size", "1M"]);
    let srv = Serve::start(&w, &[]);
    let uri = srv.uri();
    let chunk = w.path("chunk.bin");
    std::fs::write(&chunk, random_data(1 << 20, 9)).unwrap();
    let chunk = chunk.to_str().unwrap().to_string();

    // Fill, 1 MiB at a time, until the server answers ENOSPC.
    let mut written = 0u64;
    let mut enospc = String::new();
    for i in 0..64u64 {
        let (_, out) = qemu_io(&uri, &[&format!("write -s {chunk} {i}M 1M")]);
        if out.contains("No space left on device") {
            enospc = out;
            break;
        }
        assert!(!out.contains("failed"), "write {i}: {out}");
        written += 1;
    }
    assert!(!enospc.is_empty(), "64 MiB of random data fit in 16 MiB");
    eprintln!("ENOSPC after {written} MiB:\n{enospc}");
    assert!(
        (4..16).contains(&written),
        "{written} MiB fit before ENOSPC"
    );

    // Reads still work and return what was written.
    let reads: Vec<String> = (0..written).map(|i| format!("read -v {i}M 16")).collect();
    let reads: Vec<&str> = reads.iter().map(String::as_str).collect();
    let (_, out) = qemu_io(&uri, &reads);
    assert!(!out.contains("failed"), "{out}");
    let (_, out) = qemu_io(&uri, &[&format!("read -P 0 {written}M 1M")]);
    assert!(!out.contains("failed"), "{out}");
    let st = live_stats(&srv);
    assert!(
        st["read_only_reason"].is_null(),
        "volume went read-only: {st}"
    );

    // Trim everything, then writing works again (the cleaner may need a
    // moment to reclaim the emptied segments).
    qemu_io_ok(&uri, &["discard 0 64M", "flush"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, out) = qemu_io(
            &uri,
            &[
                &format!("write -s {chunk} 100M 1M"),
                &format!("write -s {chunk} 101M 1M"),
                &format!("write -s {chunk} 102M 1M"),
                "flush",
            ],
        );
        if !out.contains("failed") {
            break;
        }
        assert!(
            out.contains("No space left on device") && Instant::now() < deadline,
            "still failing 30 s after the trim: {out}\n{}",
            live_stats(&srv)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let (_, a) = qemu_io(&uri, &["read -v 100M 32"]);
    let (_, b) = qemu_io(&uri, &["read -v 0M 32"]);
    assert!(!a.contains("failed") && !b.contains("failed"), "{a}{b}");
    qemu_io_ok(&uri, &["read -P 0 0 64M"]);
    srv.stop();
}
