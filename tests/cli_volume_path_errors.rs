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

/// The error of a command that waits for nothing while `flock` reports
/// the volume locked: (success, output), retried until `want` shows or
/// 30 s have passed (the holder takes the lock after it starts).
fn until_locked(args: &[&str], want: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (ok, out) = sq(args);
        if !ok && out.contains(want) {
            return out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "squeeze {args:?} never found the volume in use:\n{out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Waits up to 60 s until process `pid` holds an flock (any file).
fn holds_flock(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
        if locks
            .lines()
            .any(|l| l.contains("FLOCK") && l.split_whitespace().nth(4) == Some(&pid.to_string()))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} never took its lock:\n{locks}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A volume another process holds: the message names that process (pid
/// and command line) whatever it is, a server, another squeeze command or
/// any program, instead of guessing a running `squeeze serve`; nothing is
/// changed.
#[test]
fn a_volume_in_use_names_the_process_that_holds_it() {
    let w = Workdir::new();
    w.create("1G", &[]);
    let v = w.volume();
    let v = v.to_str().unwrap();

    // A server.
    let srv = Serve::start(&w, &[]);
    let e = sq_err(&["compact", v]);
    assert!(
        e.contains(&format!(
            "in use by process {} (squeeze -v serve",
            srv.pid()
        )),
        "{e}"
    );
    let e = sq_err(&["check", v]);
    assert!(
        e.contains(&format!(
            "open for writing in process {} (squeeze",
            srv.pid()
        )),
        "{e}"
    );
    srv.stop();

    // Another squeeze command: a long kv load, stopped once seen.
    run(squeeze().args(["kv", "create", v]));
    let mut load = squeeze()
        .args(["kv", "load", v, "--keys", "100000000", "--threads", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the load holds its lock, by /proc/locks: probing with a
    // squeeze command instead raced the load for the lock on a busy
    // machine (the probe won, the load failed to open, nothing held it).
    holds_flock(load.id());
    let e = until_locked(&["compact", v], "in use by");
    let _ = load.kill();
    let _ = load.wait();
    assert!(
        e.contains(&format!("in use by process {} (squeeze kv load", load.id()))
            && !e.contains("`squeeze serve`"),
        "{e}"
    );

    // Any program: this test, holding the lock itself.
    {
        use std::os::unix::io::AsRawFd;
        let f = std::fs::File::open(v).unwrap();
        // SAFETY: flock on a descriptor this test owns.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        let e = sq_err(&["set", v, "--mode", "force"]);
        let me = std::env::current_exe().unwrap();
        let me = me.file_name().unwrap().to_str().unwrap();
        assert!(
            e.contains(&format!("in use by process {} ({me}", std::process::id())),
            "{e}"
        );
    }
    // Nothing was changed, and the volume opens again.
    let info = run(squeeze().args(["info", v, "--json"]));
    assert!(info.contains("\"mode\": \"aggressive\""), "{info}");
    run(squeeze().args(["check", v]));
}
