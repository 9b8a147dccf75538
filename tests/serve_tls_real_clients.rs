//! `squeeze serve --tls-cert --tls-key` against real TLS clients: nbdinfo
//! (`nbds+unix://`), qemu-io and qemu-img (`tls-creds-x509`) and nbdcopy
//! write and read back over TLS; plaintext clients, clients trusting
//! another CA and clients without a certificate (with `--tls-client-ca`)
//! are refused; `--tls-mode allow` serves both kinds; bad TLS flags fail
//! before any volume is touched.

mod common;

use common::*;

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn nbdinfo_qemu_and_nbdcopy_over_tls() {
    if !have_tool("nbdinfo") || !have_tool("qemu-io") || !have_tool("nbdcopy") {
        return;
    }
    let w = Workdir::new();
    let certs = w.path("pki");
    if !tls_certs(&certs) {
        return;
    }
    let args = tls_args(&certs);
    let srv = Serve::start(&w, &strs(&args));
    let sock = &srv.socket;

    let info = run(timed("nbdinfo").arg(nbds_uri(sock, "vol", &certs)));
    assert!(info.contains("with TLS"), "{info}");
    assert!(info.contains("export-size: 1073741824"), "{info}");

    let (ok, out) = qemu_io_tls(
        &certs,
        sock,
        "vol",
        &[
            "write -P 0xab 100M 4M",
            "read -P 0xab 100M 4M",
            "write -P 0x11 104869945 77777",
            "aio_write -P 0x22 108M 1M",
            "aio_write -P 0x33 109M 1M",
            "aio_flush",
            "write -z 102M 1M",
            "discard 103M 512k",
            "flush",
        ],
    );
    assert!(
        ok && !out.contains("failed") && !out.contains("rror"),
        "{out}"
    );

    // nbdcopy writes 8 MiB of incompressible data at 0 over TLS ...
    let src = w.path("src.bin");
    let data = random_data(8 << 20, 7);
    std::fs::write(&src, &data).unwrap();
    run(timed("nbdcopy")
        .arg(&src)
        .arg(nbds_uri(sock, "vol", &certs)));
    srv.stop();

    // ... and a restarted server serves all of it back, over TLS.
    let srv = Serve::start(&w, &strs(&args));
    let (ok, out) = qemu_io_tls(
        &certs,
        &srv.socket,
        "vol",
        &[
            "read -P 0xab 100M 12345",
            "read -P 0x11 104869945 77777",
            "read -P 0xab 104947722 2006774",
            "read -P 0 102M 1M",
            "read -P 0 103M 512k",
            "read -P 0xab 105984k 512k",
            "read -P 0x22 108M 1M",
            "read -P 0x33 109M 1M",
        ],
    );
    assert!(
        ok && !out.contains("failed") && !out.contains("rror"),
        "{out}"
    );
    let back = w.path("back.bin");
    let mut cmd = timed("qemu-img");
    cmd.arg("dd")
        .arg("--object")
        .arg(qemu_tls_object(&certs))
        .arg("--image-opts")
        .arg(format!("if={}", qemu_tls_image(&srv.socket, "vol")))
        .arg("-O")
        .arg("raw")
        .arg(format!("of={}", back.display()))
        .arg("bs=1M")
        .arg("count=8");
    run(&mut cmd);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "nbdcopy data differs"
    );
    srv.stop();
}

#[test]
fn plaintext_and_untrusting_clients_are_refused() {
    if !have_tool("nbdinfo") || !have_tool("qemu-img") {
        return;
    }
    let w = Workdir::new();
    let certs = w.path("pki");
    let other = w.path("other-pki");
    if !tls_certs(&certs) || !tls_certs(&other) {
        return;
    }
    let srv = Serve::start(&w, &strs(&tls_args(&certs)));

    let (ok, out) = run_any(timed("nbdinfo").arg(srv.uri()));
    assert!(!ok, "plaintext nbdinfo was served:\n{out}");
    let (ok, out) = run_any(timed("qemu-img").arg("info").arg(srv.uri()));
    assert!(!ok, "plaintext qemu-img was served:\n{out}");
    assert!(out.contains("TLS"), "{out}");
    // A client trusting another CA gives up in the TLS handshake (qemu:
    // libnbd 1.14 does not check the server's certificate on Unix sockets).
    let (ok, out) = qemu_img_info_tls(&other, &srv.socket, "vol");
    assert!(!ok, "a client trusting another CA was served:\n{out}");
    assert!(out.contains("issuer"), "{out}");

    // Byte by byte: NBD_REP_ERR_TLS_REQD, and EXPORT_NAME closes.
    let mut c = Client::connect(&srv.socket);
    let _ = c.read_n(18);
    use std::io::Write;
    c.s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    c.send_option(OPT_LIST, &[]);
    assert_eq!(c.opt_replies().last().unwrap().0, REP_ERR_TLS_REQD);
    c.send_option(OPT_GO, &[0, 0, 0, 0, 0, 0]);
    assert_eq!(c.opt_replies().last().unwrap().0, REP_ERR_TLS_REQD);
    c.send_option(OPT_EXPORT_NAME, b"vol");
    assert!(c.is_closed_by_server());

    // The server is unharmed.
    let info = run(timed("nbdinfo").arg(nbds_uri(&srv.socket, "vol", &certs)));
    assert!(info.contains("with TLS"), "{info}");
    srv.stop();
}

#[test]
fn allow_mode_serves_plaintext_and_tls_clients() {
    if !have_tool("nbdinfo") {
        return;
    }
    let w = Workdir::new();
    let certs = w.path("pki");
    if !tls_certs(&certs) {
        return;
    }
    let mut args = tls_args(&certs);
    args.extend(["--tls-mode".into(), "allow".into()]);
    let srv = Serve::start(&w, &strs(&args));
    let info = run(timed("nbdinfo").arg(srv.uri()));
    assert!(info.contains("without TLS"), "{info}");
    let info = run(timed("nbdinfo").arg(nbds_uri(&srv.socket, "vol", &certs)));
    assert!(info.contains("with TLS"), "{info}");
    srv.stop();
}

#[test]
fn client_certificates_are_required_with_a_client_ca() {
    if !have_tool("nbdinfo") || !have_tool("qemu-img") {
        return;
    }
    let w = Workdir::new();
    let certs = w.path("pki");
    if !tls_certs(&certs) {
        return;
    }
    // A directory that trusts the server but holds no client certificate.
    let anon = w.path("anon");
    std::fs::create_dir_all(&anon).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), anon.join("ca-cert.pem")).unwrap();
    let mut args = tls_args(&certs);
    args.extend([
        "--tls-client-ca".into(),
        certs.join("ca-cert.pem").display().to_string(),
    ]);
    let srv = Serve::start(&w, &strs(&args));
    let info = run(timed("nbdinfo").arg(nbds_uri(&srv.socket, "vol", &certs)));
    assert!(info.contains("with TLS"), "{info}");
    let (ok, out) = qemu_img_info_tls(&certs, &srv.socket, "vol");
    assert!(ok && out.contains("1 GiB"), "{out}");
    let (ok, out) = run_any(timed("nbdinfo").arg(nbds_uri(&srv.socket, "vol", &anon)));
    assert!(!ok, "a client without a certificate was served:\n{out}");
    srv.stop();
}

#[test]
fn bad_tls_flags_fail_before_touching_a_volume() {
    let w = Workdir::new();
    let vol = w.volume();
    for (args, want) in [
        (vec!["--tls-mode", "require"], "needs --tls-cert"),
        (
            vec![
                "--tls-cert",
                "/nonexistent/c.pem",
                "--tls-key",
                "/nonexistent/k.pem",
            ],
            "/nonexistent/c.pem",
        ),
    ] {
        let (ok, out) = run_any(
            squeeze()
                .arg("serve")
                .arg("--socket")
                .arg(w.socket())
                .arg(&vol)
                .args(&args),
        );
        assert!(!ok, "{args:?} started:\n{out}");
        assert!(out.contains(want), "{args:?}: {out}");
        assert!(!vol.exists(), "{args:?} created the volume");
    }
    // --tls-key alone is a usage error (clap).
    let (ok, _) = run_any(
        squeeze()
            .arg("serve")
            .arg("--tls-key")
            .arg("k.pem")
            .arg(&vol),
    );
    assert!(!ok);
}
