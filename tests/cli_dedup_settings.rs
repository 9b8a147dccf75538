//! The dedup settings on the command line (docs/DEDUP.md): `create --dedup
//! MODE --dedup-index MIB`, `set --dedup ...` on a volume file and live
//! over a running server's control socket, shown by `info` and `stats`;
//! bad values (an unknown mode; a zero index)
//! refused with a clear error; and a served volume in mode idle
//! deduplicating what a client wrote once the client is idle.

mod common;
use common::*;

fn squeeze_ok(args: &[&str]) -> String {
    run(squeeze().args(args))
}

fn squeeze_err(args: &[&str]) -> String {
    let (ok, out) = run_any(squeeze().args(args));
    assert!(!ok, "squeeze {args:?} should fail:\n{out}");
    out
}

fn info_json(w: &Workdir) -> serde_json::Value {
    let out = squeeze_ok(&["info", "--json", w.volume().to_str().unwrap()]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn create_set_and_info_with_dedup() {
    let w = Workdir::new();
    let vol = w.volume().to_str().unwrap().to_string();
    // Refused at create: nothing is made.
    let out = squeeze_err(&["create", &vol, "--size", "64M", "--dedup", "often"]);
    assert!(out.contains("unknown dedup mode"), "{out}");
    assert!(!w.volume().exists());
    let out = squeeze_err(&["create", &vol, "--size", "64M", "--dedup-index", "0"]);
    assert!(out.contains("--dedup-index"), "{out}");
    assert!(!w.volume().exists());

    // Off by default.
    w.create("64M", &[]);
    let out = squeeze_ok(&["info", &vol]);
    assert!(out.contains("dedup           off, index 256 MiB"), "{out}");
    std::fs::remove_file(w.volume()).unwrap();

    let out = squeeze_ok(&[
        "create",
        &vol,
        "--size",
        "64M",
        "--dedup",
        "idle",
        "--dedup-index",
        "32",
    ]);
    assert!(out.contains("dedup idle, index 32 MiB"), "{out}");
    let i = info_json(&w);
    assert_eq!(i["dedup"]["mode"], "idle", "{i}");
    assert_eq!(i["dedup"]["index_bytes"], 32 << 20, "{i}");
    let out = squeeze_ok(&["stats", &vol]);
    assert!(
        out.contains("dedup mode             idle, index 32 MiB"),
        "{out}"
    );

    // Set on the file: the mode alone keeps the budget.
    let out = squeeze_ok(&["set", &vol, "--dedup", "off"]);
    assert!(out.contains("dedup off, index 32 MiB"), "{out}");
    assert_eq!(info_json(&w)["dedup"]["mode"], "off");
    let out = squeeze_err(&["set", &vol, "--dedup", "sometimes"]);
    assert!(out.contains("unknown dedup mode"), "{out}");
    let out = squeeze_ok(&["set", &vol, "--dedup", "inline"]);
    assert!(out.contains("dedup inline, index 32 MiB"), "{out}");
    assert_eq!(info_json(&w)["dedup"]["mode"], "inline");
    let out = squeeze_err(&["set", &vol, "--dedup-index", "0"]);
    assert!(out.contains("--dedup-index"), "{out}");
    let out = squeeze_ok(&["set", &vol, "--dedup", "idle", "--dedup-index", "8"]);
    assert!(out.contains("dedup idle, index 8 MiB"), "{out}");
    let i = info_json(&w);
    assert_eq!(i["dedup"]["mode"], "idle", "{i}");
    assert_eq!(i["dedup"]["index_bytes"], 8 << 20, "{i}");
    squeeze_ok(&["check", &vol]);
}

#[test]
fn set_dedup_live_and_the_server_deduplicates_when_idle() {
    let w = Workdir::new();
    w.create("256M", &["--segment-size", "1M"]);
    let srv = Serve::start(&w, &[]);
    let ctl = srv.control.to_str().unwrap().to_string();
    assert_eq!(live_stats(&srv)["dedup_mode"], "off");

    let out = squeeze_err(&["set", &ctl, "--dedup", "sometimes"]);
    assert!(out.contains("unknown dedup mode"), "{out}");
    // A request that bypasses the CLI's check is refused by the server.
    let answer = {
        use std::io::{Read, Write};
        let mut c = std::os::unix::net::UnixStream::connect(&srv.control).unwrap();
        c.write_all(b"{\"op\":\"set\",\"dedup\":{\"dedup\":\"sometimes\"}}\n")
            .unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        s
    };
    assert!(answer.contains("unknown dedup mode"), "{answer}");
    assert_eq!(live_stats(&srv)["dedup_mode"], "off");

    let out = squeeze_ok(&["set", &ctl, "--dedup", "idle", "--dedup-index", "16"]);
    assert!(out.contains("dedup idle, index 16 MiB"), "{out}");
    let st = live_stats(&srv);
    assert_eq!(st["dedup_mode"], "idle", "{st}");
    assert_eq!(st["dedup_index_bytes"], 16 << 20, "{st}");

    // A client writes the same 4 KiB content over 4 MiB; once it is idle
    // the server shares it.
    if have_tool("qemu-io") {
        qemu_io_ok(&srv.qemu_uri(), &["write -P 0x5a 0 4M", "flush"]);
        let t0 = std::time::Instant::now();
        loop {
            let st = live_stats(&srv);
            if st["dedup_idle_passes"].as_u64().unwrap() > 0 {
                assert!(
                    st["dedup_idle_linked_sectors"].as_u64().unwrap() >= 1000,
                    "{st}"
                );
                assert!(
                    st["dedup_saved_bytes"].as_u64().unwrap() >= (4 << 20) - 8192,
                    "{st}"
                );
                break;
            }
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "no idle pass in 60 s: {st}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let out = qemu_io_ok(&srv.qemu_uri(), &["read -P 0x5a 0 4M"]);
        assert!(!out.contains("Pattern verification failed"), "{out}");
    }
    srv.stop();
    // Durable: the file says so after the server stopped.
    let i = info_json(&w);
    assert_eq!(i["dedup"]["mode"], "idle", "{i}");
    assert_eq!(i["dedup"]["index_bytes"], 16 << 20, "{i}");
    squeeze_ok(&["check", w.volume().to_str().unwrap()]);
}
