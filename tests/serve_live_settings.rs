//! What a Ceph admin changes live (issue 18): the policy, `--max-physical`
//! and the logical size of a volume, through the running server's control
//! socket (`squeeze set SOCKET ...`, `squeeze resize SOCKET ...`) and on a
//! volume file, with real NBD clients (qemu-io, qemu-img) seeing the
//! effect; and the control socket's bad input answered with errors while
//! the server goes on.

mod common;
use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

fn squeeze_ok(args: &[&str]) -> String {
    run(squeeze().args(args))
}

fn squeeze_err(args: &[&str]) -> String {
    let (ok, out) = run_any(squeeze().args(args));
    assert!(!ok, "squeeze {args:?} should fail:\n{out}");
    out
}

#[test]
fn policy_cap_and_size_change_on_a_running_server() {
    if !have_tool("qemu-io") || !have_tool("qemu-img") {
        return;
    }
    let w = Workdir::new();
    w.create("1G", &["--segment-size", "1M"]);
    let srv = Serve::start(&w, &[]);
    let ctl = srv.control.to_str().unwrap().to_string();
    let uri = srv.qemu_uri();

    // The policy: new writes take the new algorithm.
    let out = squeeze_ok(&["set", &ctl, "--algorithm", "lz4"]);
    assert!(out.contains("algorithm lz4"), "{out}");
    qemu_io_ok(&uri, &["write -P 0x5a 512M 4M"]);
    let st = live_stats(&srv);
    assert!(
        st["bytes_per_algorithm"]["lz4"].as_u64().unwrap() >= 4 << 20,
        "{st}"
    );
    // It is durable: the volume file says so after the server stops.

    // The cap: lowered to what is used plus a little, writes of incompressible
    // data (at offset 0) run out of room with ENOSPC; what was written
    // before (at 512M) stays; raised, the writes go on.
    let used = st["allocated_bytes"].as_u64().unwrap();
    let cap = used + (8 << 20);
    let out = squeeze_ok(&["set", &ctl, "--max-physical", &cap.to_string()]);
    assert!(out.contains("max_physical"), "{out}");
    let rnd = w.path("rnd.bin");
    std::fs::write(&rnd, random_data(32 << 20, 9)).unwrap();
    let (ok, out) = run_any(
        timed("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&rnd)
            .arg(&uri),
    );
    assert!(!ok, "32 MiB of random data fit under an 8 MiB cap:\n{out}");
    qemu_io_ok(&uri, &["read -P 0x5a 512M 4M"]);
    // The operator was warned: in the log (within the watcher's 5 s) and in
    // the stats.
    assert!(live_stats(&srv)["space_warning"].is_string());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !srv.log_text().contains("physical space low") {
        assert!(
            std::time::Instant::now() < deadline,
            "no low-space warning in the log:\n{}",
            srv.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let e = squeeze_err(&["set", &ctl, "--max-physical", "1M"]);
    assert!(
        e.contains("at least 4 segments") || e.contains("in use"),
        "{e}"
    );
    squeeze_ok(&["set", &ctl, "--max-physical", "0"]);
    run(timed("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&rnd)
        .arg(&uri));

    // The size: a new connection sees it; a shrink over mapped data is
    // refused, and goes through once the tail is trimmed.
    let out = squeeze_ok(&["resize", &ctl, "--size", "2G"]);
    assert!(out.contains("2.00 GiB"), "{out}");
    let info = run(timed("qemu-img").args(["info", "--output=json"]).arg(&uri));
    assert!(info.contains("\"virtual-size\": 2147483648"), "{info}");
    qemu_io_ok(&uri, &["write -P 0x77 1536M 1M"]);
    let e = squeeze_err(&["resize", &ctl, "--size", "1G"]);
    assert!(e.contains("cannot shrink"), "{e}");
    qemu_io_ok(&uri, &["discard 1G 1G"]);
    squeeze_ok(&["resize", &ctl, "--size", "1G"]);
    let info = run(timed("qemu-img").args(["info", "--output=json"]).arg(&uri));
    assert!(info.contains("\"virtual-size\": 1073741824"), "{info}");
    qemu_io_ok(&uri, &["read -P 0x5a 512M 4M"]);

    // Bad input: an unknown volume, a size that is not whole sectors,
    // nothing to change.
    let e = squeeze_err(&["set", &ctl, "--volume", "nope", "--mode", "force"]);
    assert!(e.contains("no volume \"nope\""), "{e}");
    let e = squeeze_err(&["resize", &ctl, "--size", "5000"]);
    assert!(e.contains("multiple of 4096"), "{e}");
    let e = squeeze_err(&["set", &ctl]);
    assert!(e.contains("nothing to change"), "{e}");
    let e = squeeze_err(&["set", &ctl, "--algorithm", "brotli"]);
    assert!(e.to_lowercase().contains("brotli"), "{e}");

    // Garbage on the control socket: an error answer, and the server goes on.
    for junk in [
        &b"{\"op\":\"explode\"}\n"[..],
        b"not json at all\n",
        b"{\"op\":\"set\",\"policy\":{\"algorithm\":7}}\n",
        b"{\"op\":\"resize\"}\n",
        &[0xffu8; 300][..],
    ] {
        let mut c = UnixStream::connect(&srv.control).unwrap();
        c.write_all(junk).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert!(v["error"].is_string(), "{:?} -> {answer}", junk);
    }
    assert!(live_stats(&srv)["logical_size"].as_u64().unwrap() == 1 << 30);
    srv.stop();

    // Every change outlived the server.
    let info = squeeze_ok(&["info", w.volume().to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(v["policy"]["algorithm"], "lz4", "{v}");
    assert_eq!(v["logical_size"], 1u64 << 30, "{v}");
}

#[test]
fn set_and_resize_on_a_volume_file() {
    let w = Workdir::new();
    w.create("64M", &["--segment-size", "1M"]);
    let v = w.volume();
    let v = v.to_str().unwrap();
    let out = squeeze_ok(&["set", v, "--max-physical", "32M", "--mode", "force"]);
    assert!(
        out.contains("mode force") && out.contains("32.00 MiB"),
        "{out}"
    );
    squeeze_ok(&["resize", v, "--size", "128M"]);
    let info: serde_json::Value =
        serde_json::from_str(&squeeze_ok(&["info", v, "--json"])).unwrap();
    assert_eq!(info["logical_size"], 128u64 << 20, "{info}");
    assert_eq!(info["policy"]["mode"], "force", "{info}");
    let e = squeeze_err(&["resize", v, "--volume", "x", "--size", "1G"]);
    assert!(e.contains("--volume"), "{e}");
    run(squeeze().arg("check").arg(v));
}

/// `serve --gc-budget` outside 15-60% or not a number is refused before
/// anything is created, with the range named.
#[test]
fn a_garbage_budget_out_of_range_is_refused() {
    let w = Workdir::new();
    let v = w.path("never.sqz");
    let v = v.to_str().unwrap();
    for bad in ["70", "10%", "x"] {
        let e = squeeze_err(&["serve", "--socket", "/nonexistent/s", "--gc-budget", bad, v]);
        assert!(e.contains("--gc-budget"), "{bad}: {e}");
        if bad != "x" {
            assert!(e.contains("15%..=60%"), "{bad}: {e}");
        }
    }
    assert!(!std::path::Path::new(v).exists());
}

/// The settings `info --json` shows of a volume file: (algorithm, mode,
/// required ratio, max_physical).
fn file_settings(v: &str) -> (String, String, f64, u64) {
    let info: serde_json::Value =
        serde_json::from_str(&squeeze_ok(&["info", v, "--json"])).unwrap();
    (
        info["policy"]["algorithm"].as_str().unwrap().to_string(),
        info["policy"]["mode"].as_str().unwrap().to_string(),
        info["policy"]["required_ratio"].as_f64().unwrap(),
        info["max_physical"].as_u64().unwrap(),
    )
}

/// A `set` applies all of its changes or none, on a volume file and through
/// a running server's control socket: a refused cap leaves the policy given
/// with it unapplied, a refused policy the cap.
#[test]
fn a_refused_set_changes_nothing() {
    let w = Workdir::new();
    w.create("64M", &["--segment-size", "1M"]);
    let v = w.volume();
    let v = v.to_str().unwrap();
    let before = file_settings(v);
    assert_eq!(before, ("zstd:3".into(), "aggressive".into(), 0.875, 0));
    let refused: [&[&str]; 3] = [
        &["--algorithm", "zstd:1", "--max-physical", "1M"],
        &[
            "--mode",
            "force",
            "--max-physical",
            "32M",
            "--max-blob",
            "1M",
        ],
        &["--max-physical", "32M", "--algorithm", "brotli"],
    ];
    for args in refused {
        let e = squeeze_err(&[&["set", v][..], args].concat());
        assert!(
            e.contains("at least 4 segments") || e.contains("max_blob") || e.contains("brotli"),
            "{args:?}: {e}"
        );
        assert_eq!(file_settings(v), before, "offline set {args:?}");
    }

    let srv = Serve::start(&w, &[]);
    let ctl = srv.control.to_str().unwrap().to_string();
    let live_before = live_stats(&srv);
    for args in refused {
        let e = squeeze_err(&[&["set", &ctl][..], args].concat());
        assert!(
            e.contains("at least 4 segments") || e.contains("max_blob") || e.contains("brotli"),
            "{args:?}: {e}"
        );
        let live = live_stats(&srv);
        for k in ["write_algorithm", "physical_limit_bytes"] {
            assert_eq!(live[k], live_before[k], "live set {args:?}: {k}");
        }
    }
    // What a refused set would have applied still works on its own.
    let out = squeeze_ok(&["set", &ctl, "--algorithm", "zstd:1"]);
    assert!(out.contains("algorithm zstd:1"), "{out}");
    srv.stop();
    assert_eq!(
        file_settings(v),
        ("zstd:1".into(), "aggressive".into(), 0.875, 0)
    );
}

/// One raw request line on a control socket; its JSON answer.
fn control_raw(ctl: &std::path::Path, line: &str) -> serde_json::Value {
    let mut c = UnixStream::connect(ctl).unwrap();
    c.write_all(line.as_bytes()).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

/// `--required-ratio` takes a number from 0.000001 to 1 (stored in
/// millionths) on every path: NaN and infinities (which the control
/// socket's JSON would turn into null, a silent no-op), values that round
/// to 0 millionths (1e-300) and values out of (0, 1] are refused with the
/// range named, and change nothing; an accepted value prints as stored.
#[test]
fn required_ratio_is_a_number_from_a_millionth_to_1() {
    let w = Workdir::new();
    w.create("64M", &["--segment-size", "1M"]);
    let v = w.volume();
    let v = v.to_str().unwrap();
    let before = file_settings(v);
    let bad = [
        "NaN", "nan", "inf", "-inf", "infinity", "1e-300", "4e-7", "0", "-0.5", "1.5", "x", "",
    ];
    for r in bad {
        let arg = format!("--required-ratio={r}");
        let e = squeeze_err(&["set", v, &arg]);
        assert!(e.contains("0.000001 to 1"), "{r}: {e}");
        let fresh = w.path("fresh.sqz");
        let e = squeeze_err(&["create", fresh.to_str().unwrap(), "--size", "1G", &arg]);
        assert!(e.contains("0.000001 to 1"), "create {r}: {e}");
        assert!(!fresh.exists(), "create {r} left a file");
    }
    assert_eq!(file_settings(v), before);
    // Printed as stored: in millionths, in decimal.
    let out = squeeze_ok(&["set", v, "--required-ratio", "0.8755555"]);
    assert!(out.contains("required_ratio 0.875556 "), "{out}");
    let out = squeeze_ok(&["set", v, "--required-ratio", "1e-6"]);
    assert!(out.contains("required_ratio 0.000001 "), "{out}");
    assert_eq!(file_settings(v).2, 0.000001);
    squeeze_ok(&["set", v, "--required-ratio", "0.875"]);

    let srv = Serve::start(&w, &[]);
    let ctl = srv.control.to_str().unwrap().to_string();
    for r in ["NaN", "inf", "1e-300"] {
        let e = squeeze_err(&["set", &ctl, &format!("--required-ratio={r}")]);
        assert!(e.contains("0.000001 to 1"), "{r}: {e}");
    }
    // A client that sends the JSON itself: numbers out of range are
    // refused by the server (JSON has no NaN).
    for r in ["1e-300", "4e-7", "0", "-1", "5"] {
        let a = control_raw(
            &srv.control,
            &format!("{{\"op\":\"set\",\"policy\":{{\"required_ratio\":{r}}}}}\n"),
        );
        let e = a["error"].as_str().unwrap_or_else(|| panic!("{r}: {a}"));
        assert!(
            e.contains("--required-ratio") && e.contains("0.000001 to 1"),
            "{r}: {e}"
        );
    }
    // null is no value: nothing to change, said so.
    let a = control_raw(
        &srv.control,
        "{\"op\":\"set\",\"policy\":{\"required_ratio\":null}}\n",
    );
    assert!(
        a["error"].as_str().unwrap().contains("nothing to change"),
        "{a}"
    );
    let out = squeeze_ok(&["set", &ctl, "--required-ratio", "0.5000004"]);
    assert!(out.contains("required_ratio 0.5 "), "{out}");
    srv.stop();
    assert_eq!(file_settings(v).2, 0.5);
}

#[test]
fn the_burst_floor_is_set_on_a_running_server_only() {
    let w = Workdir::new();
    w.create("256M", &["--segment-size", "1M"]);
    let srv = Serve::start(&w, &["--burst-floor", "lz4"]);
    let ctl = srv.control.to_str().unwrap().to_string();
    assert_eq!(live_stats(&srv)["burst_floor"], "lz4");
    let out = squeeze_ok(&["set", &ctl, "--burst-floor", "raw"]);
    assert!(out.contains("burst_floor raw"), "{out}");
    assert_eq!(live_stats(&srv)["burst_floor"], "raw");
    // A bad value is refused by the client and by the socket.
    let e = squeeze_err(&["set", &ctl, "--burst-floor", "zstd"]);
    assert!(e.contains("raw or lz4"), "{e}");
    let a = control_raw(&srv.control, r#"{"op":"set","burst_floor":"snappy"}"#);
    assert!(
        a["error"].as_str().unwrap_or("").contains("raw or lz4"),
        "{a}"
    );
    assert_eq!(live_stats(&srv)["burst_floor"], "raw");
    drop(srv);
    // Not stored in the volume: a file is refused, by name.
    let e = squeeze_err(&["set", w.volume().to_str().unwrap(), "--burst-floor", "lz4"]);
    assert!(e.contains("not stored in the volume"), "{e}");
}
