//! The front door of `squeeze serve` without TLS: `--allow-export` hides
//! and refuses the other volumes (nbdinfo --list, nbdinfo, qemu-img, a
//! hand-written client), an unknown name fails at start; the Unix socket
//! is mode 0600; `--allow ADDR/LEN` closes TCP clients from elsewhere
//! while Unix socket clients are always served.

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;

#[test]
fn allow_export_hides_and_refuses_other_volumes() {
    if !have_tool("nbdinfo") || !have_tool("qemu-img") {
        return;
    }
    let w = Workdir::new();
    w.create("1G", &[]);
    let other = w.path("other.sqz");
    run(squeeze().arg("create").arg(&other).arg("--size").arg("2G"));
    let other_arg = other.display().to_string();
    let srv = Serve::start(&w, &[&other_arg, "--allow-export", "other"]);
    let sock = srv.socket.display().to_string();

    let list = run(timed("nbdinfo").arg("--list").arg(srv.uri()));
    assert!(list.contains("export=\"other\""), "{list}");
    assert!(!list.contains("export=\"vol\""), "{list}");

    let (ok, out) = run_any(timed("nbdinfo").arg(format!("nbd+unix:///vol?socket={sock}")));
    assert!(!ok, "hidden export served to nbdinfo:\n{out}");
    let (ok, out) = run_any(
        timed("qemu-img")
            .arg("info")
            .arg(format!("nbd+unix:///vol?socket={sock}")),
    );
    assert!(!ok, "hidden export served to qemu-img:\n{out}");
    let out = run(timed("qemu-img")
        .arg("info")
        .arg(format!("nbd+unix:///other?socket={sock}")));
    assert!(out.contains("2 GiB"), "{out}");
    // The empty name selects the first visible export.
    let info = run(timed("nbdinfo").arg(srv.uri()));
    assert!(info.contains("export-size: 2147483648"), "{info}");

    // Byte by byte: GO on the hidden export is an unknown export.
    let mut c = Client::connect(&srv.socket);
    let _ = c.read_n(18);
    use std::io::Write;
    c.s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    c.send_option(OPT_GO, &[0, 0, 0, 3, b'v', b'o', b'l', 0, 0]);
    assert_eq!(c.opt_replies().last().unwrap().0, REP_ERR_UNKNOWN);
    c.send_option(OPT_EXPORT_NAME, b"vol");
    assert!(c.is_closed_by_server());
    assert!(srv.log_text().contains("unknown export"));
    srv.stop();

    // A name that is not an export: refused at start.
    let (ok, out) = run_any(
        squeeze()
            .arg("serve")
            .arg("--socket")
            .arg(w.socket())
            .arg(w.volume())
            .arg("--allow-export")
            .arg("nope"),
    );
    assert!(!ok && out.contains("no such export"), "{out}");
}

/// The TCP address the server printed in its banner.
fn tcp_addr(srv: &Serve) -> String {
    let log = srv.log_text();
    log.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("squeeze serve: listening on "))
        .find(|a| a.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no TCP banner:\n{log}"))
        .to_string()
}

#[test]
fn unix_socket_is_private_and_tcp_clients_are_filtered_by_address() {
    if !have_tool("nbdinfo") {
        return;
    }
    let w = Workdir::new();
    let srv = Serve::start(
        &w,
        &[
            "--listen",
            "127.0.0.1:0",
            "--allow",
            "10.0.0.0/8",
            "--allow",
            "::1",
        ],
    );
    let mode = std::fs::metadata(&srv.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let addr = tcp_addr(&srv);
    let (ok, out) = run_any(timed("nbdinfo").arg(format!("nbd://{addr}/vol")));
    assert!(!ok, "127.0.0.1 is not allowed but was served:\n{out}");
    assert!(srv.log_text().contains("not on the allow-list"));
    // Unix socket clients are always allowed.
    run(timed("nbdinfo").arg(srv.uri()));
    srv.stop();

    let srv = Serve::start(&w, &["--listen", "127.0.0.1:0", "--allow", "127.0.0.1"]);
    let addr = tcp_addr(&srv);
    let info = run(timed("nbdinfo").arg(format!("nbd://{addr}/vol")));
    assert!(info.contains("export-size: 1073741824"), "{info}");
    srv.stop();

    let (ok, out) = run_any(
        squeeze()
            .arg("serve")
            .arg("--socket")
            .arg(w.socket())
            .arg(w.volume())
            .arg("--allow")
            .arg("10.0.0.0/40"),
    );
    assert!(!ok && out.contains("prefix length"), "{out}");
}
