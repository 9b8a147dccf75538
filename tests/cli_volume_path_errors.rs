//! A command given a path that is no volume file says what the path is
//! and what to do, instead of the open's errno (a control socket's
//! "No such device or address") or a hang (a FIFO): `compact` on a
//! running server's control socket points at what the server does by
//! itself and at `stats`.

mod common;
use common::*;

/// `squeeze ARGS...` under a timeout (a FIFO opened for reading would
/// block); (success, stdout + stderr).
fn sq(args: &[&str]) -> (bool, String) {
    run_any(timed(env!("CARGO_BIN_EXE_squeeze")).args(args))
}

fn sq_err(args: &[&str]) -> String {
    let (ok, out) = sq(args);
    assert!(!ok, "squeeze {args:?} should fail:\n{out}");
    out
}

#[test]
fn a_control_socket_directory_or_fifo_is_no_volume_file() {
    let w = Workdir::new();
    let srv = Serve::start(&w, &[]);
    let ctl = srv.control.to_str().unwrap().to_string();

    let e = sq_err(&["compact", &ctl]);
    assert!(
        e.contains("control socket")
            && e.contains("no server has open")
            && e.contains(&format!("squeeze stats {ctl}"))
            && !e.contains("os error"),
        "{e}"
    );
    let src = w.path("src.bin");
    std::fs::write(&src, vec![7u8; 8192]).unwrap();
    let src = src.to_str().unwrap();
    let out = w.path("out.bin");
    let out = out.to_str().unwrap();
    for args in [
        &["info", &ctl][..],
        &["check", &ctl],
        &["export", &ctl, out],
        &["import", src, &ctl],
        &["kv", "get", &ctl, "k"],
        &["wal", "dump", &ctl],
    ] {
        let e = sq_err(args);
        assert!(
            e.contains(&format!("{ctl} is a Unix socket, not a volume file"))
                && e.contains("stats, set and resize take one")
                && !e.contains("os error"),
            "{args:?}: {e}"
        );
    }
    assert!(!std::path::Path::new(out).exists());
    // The server never noticed.
    assert_eq!(srv.client(false).size, 1 << 30);
    srv.stop();

    let dir = w.path("a-dir");
    std::fs::create_dir(&dir).unwrap();
    let fifo = w.path("a-fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (p, what) in [(&dir, "a directory"), (&fifo, "a FIFO")] {
        let p = p.to_str().unwrap();
        for cmd in ["info", "stats", "check", "compact"] {
            let e = sq_err(&[cmd, p]);
            assert!(
                e.contains(&format!("{p} is {what}, not a volume file")),
                "{cmd} {p}: {e}"
            );
        }
        let e = sq_err(&["set", p, "--mode", "force"]);
        assert!(e.contains(&format!("{p} is {what}")), "set {p}: {e}");
    }
}
