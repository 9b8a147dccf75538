//! SIGTERM while clients are connected (one idle, one with unflushed
//! writes, one qemu-io mid-stream): the server exits 0, and the data
//! written and flushed before is there after a restart, read back both
//! with `squeeze export` and by serving the volume again; the volume was
//! closed cleanly (final checkpoint).

mod common;

use common::*;
use std::time::Duration;

#[test]
fn sigterm_exits_zero_and_keeps_flushed_data() {
    let w = Workdir::new();
    let mut srv = Serve::start(&w, &[]);
    let flushed = mixed_data(4 << 20, 7);
    let mut a = srv.client(true);
    assert_eq!(a.write(0, &flushed), 0);
    assert_eq!(a.flush(), 0);
    // Connected, idle.
    let idle = srv.client(false);
    // Connected, wrote without a flush (the shutdown flushes it too).
    let mut b = srv.client(false);
    let unflushed = vec![0x3cu8; 1 << 20];
    assert_eq!(b.write(8 * MIB, &unflushed), 0);
    // A real client in a loop of writes while the signal arrives.
    let busy = if have_tool("qemu-io") {
        let mut cmd = timed("qemu-io");
        cmd.args(["-f", "raw"]);
        for i in 0..400 {
            cmd.arg("-c")
                .arg(format!("write -P 0x61 {}M 1M", 16 + i % 64));
        }
        Some(
            cmd.arg(srv.uri())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    } else {
        None
    };
    std::thread::sleep(Duration::from_millis(300));

    let st = srv
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no exit 30 s after SIGTERM:\n{}", srv.log_text()));
    assert!(st.success(), "exit status {st}:\n{}", srv.log_text());
    let log = srv.log_text();
    assert!(log.contains("flushed and checkpointed"), "{log}");
    if let Some(mut q) = busy {
        let _ = q.wait();
    }
    assert!(a.is_closed_by_server());
    drop((a, b, idle));

    // The shutdown closed the volume: final checkpoint, clean mark.
    let info = run(squeeze().arg("info").arg(w.volume()));
    assert!(info.contains(", clean)"), "{info}");

    // Offline: squeeze export of the first 16 MiB.
    let out = w.path("out.bin");
    run(squeeze()
        .arg("export")
        .arg(w.volume())
        .arg(&out)
        .arg("--length")
        .arg("16M"));
    let got = std::fs::read(&out).unwrap();
    assert!(got[..flushed.len()] == flushed[..], "flushed data lost");
    assert!(
        got[8 << 20..9 << 20] == unflushed[..],
        "shutdown did not flush"
    );

    // Online again.
    let srv = Serve::start(&w, &[]);
    let mut c = srv.client(true);
    assert_eq!(c.read(0, flushed.len() as u32).unwrap(), flushed);
    assert_eq!(c.read(8 * MIB, 1 << 20).unwrap(), unflushed);
    c.disconnect();
    srv.stop();
}
