//! `squeeze nbd-attach`'s handshake against a real `squeeze serve`, on the
//! host (the netlink part needs the nbd module: tests/guest/nbd_attach.sh).
//! `--probe` negotiates the export as the device would be configured and
//! prints its size and flags; the refusals a user meets (unknown export,
//! no server, no export named) are clear errors with a non-zero exit.

mod common;

use common::*;

#[test]
fn probe_prints_the_exports_size_and_flags() {
    let w = Workdir::new();
    w.create("3G", &[]);
    let srv = Serve::start(&w, &[]);
    let out = squeeze()
        .args(["nbd-attach", "--probe", "-N", "vol", "--socket"])
        .arg(&srv.socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("({} bytes)", 3u64 << 30)), "{text}");
    assert!(text.contains("flush fua trim write-zeroes"), "{text}");
    assert!(text.contains("multi-conn"), "{text}");
    assert!(text.contains("block sizes: minimum 1"), "{text}");
    srv.stop();
}

#[test]
fn an_unknown_export_is_refused_by_name() {
    let w = Workdir::new();
    w.create("1G", &[]);
    let srv = Serve::start(&w, &[]);
    let out = squeeze()
        .args(["nbd-attach", "--probe", "-N", "nope", "--socket"])
        .arg(&srv.socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("refused export \"nope\""), "{err}");
    assert!(err.contains("NBD_REP_ERR_UNKNOWN"), "{err}");
    srv.stop();
}

#[test]
fn no_server_and_no_export_are_named() {
    let w = Workdir::new();
    let out = squeeze()
        .args(["nbd-attach", "--probe", "-N", "vol", "--socket"])
        .arg(w.socket())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot connect to unix:"), "{err}");

    let out = squeeze()
        .args(["nbd-attach", "--probe", "--socket"])
        .arg(w.socket())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("name the export"), "{err}");
}
