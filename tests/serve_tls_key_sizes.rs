//! `squeeze serve --tls-key` takes every key the TLS library can sign
//! with, whatever its encoding: RSA of 2048, 2432 (the size of the NBD
//! project's own test key, which ring refused: its RSA primes must be a
//! multiple of 512 bits), 3072 and 4096 bits, EC P-256 (SEC1 and PKCS#8),
//! P-384 and Ed25519, each made by `openssl` at test time and each serving
//! a real TLS client (qemu-img). A key that truly cannot be used (RSA of
//! 1024 bits, an Ed448 key, an EC key on secp256k1) stops the server before
//! any volume is touched, with an error naming the key's type and size.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// A CA and a server certificate for `localhost` whose key is made by the
/// shell command `keygen` (writing server-key.pem), laid out as
/// `tls_certs` does. False (a loud skip, a failure under CI=true) if
/// openssl is missing.
fn certs_with_server_key(dir: &Path, keygen: &str) -> bool {
    if !have_tool("openssl") {
        return false;
    }
    std::fs::create_dir_all(dir).unwrap();
    let script = format!(
        r#"
set -e
cd "$1"
openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=squeeze test CA" \
  -keyout ca-key.pem -out ca-cert.pem \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
{keygen}
openssl req -new -key server-key.pem -subj "/CN=localhost" -out server.csr
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
  -days 3650 -extfile server.ext -out server-cert.pem
"#
    );
    run(Command::new("sh").arg("-c").arg(script).arg("sh").arg(dir));
    true
}

/// Keys the server must take: (name, openssl command writing server-key.pem).
const USABLE: &[(&str, &str)] = &[
    (
        "RSA 2048 PKCS#1",
        "openssl genrsa -traditional -out server-key.pem 2048",
    ),
    ("RSA 2432 PKCS#8", "openssl genrsa -out server-key.pem 2432"),
    ("RSA 3072 PKCS#8", "openssl genrsa -out server-key.pem 3072"),
    ("RSA 4096 PKCS#8", "openssl genrsa -out server-key.pem 4096"),
    (
        "EC P-256 SEC1",
        "openssl ecparam -name prime256v1 -genkey -noout -out server-key.pem",
    ),
    (
        "EC P-256 PKCS#8",
        "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out server-key.pem",
    ),
    (
        "EC P-384 PKCS#8",
        "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out server-key.pem",
    ),
    (
        "Ed25519",
        "openssl genpkey -algorithm ed25519 -out server-key.pem",
    ),
];

#[test]
fn every_usable_key_serves_a_tls_client() {
    if !have_tool("qemu-img") {
        return;
    }
    let mut failures = Vec::new();
    for (name, keygen) in USABLE {
        let w = Workdir::new();
        let certs = w.path("pki");
        if !certs_with_server_key(&certs, keygen) {
            return;
        }
        let srv = match start(&w, &tls_args(&certs)) {
            Ok(srv) => srv,
            Err(out) => {
                failures.push(format!("{name}: the server did not start:\n{out}"));
                continue;
            }
        };
        let (ok, out) = qemu_img_info_tls(&certs, &srv.socket, "vol");
        if !ok || !out.contains("1 GiB") {
            failures.push(format!("{name}: qemu-img over TLS failed:\n{out}"));
        }
        srv.stop();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `squeeze serve --socket s.sock vol.sqz --size 1G ARGS...` once it is
/// listening, or its log if it exits first (a refused key is a failure to
/// report with the others, not a panic as in `Serve::start`).
fn start(w: &Workdir, args: &[String]) -> Result<Serve, String> {
    let log = std::fs::File::create(w.log()).unwrap();
    let child = squeeze()
        .arg("serve")
        .arg("--socket")
        .arg(w.socket())
        .arg(w.volume())
        .args(["--size", "1G"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut srv = Serve {
        child: Some(child),
        socket: w.socket(),
        control: w.control(),
        log: w.log(),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = srv.log_text();
        if text.contains("listening on") && srv.socket.exists() {
            return Ok(srv);
        }
        if !srv.is_running() {
            return Err(srv.log_text());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("not listening in 30 s:\n{text}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn an_unusable_key_is_refused_naming_its_type_and_size() {
    for (keygen, want) in [
        (
            "openssl genrsa -out server-key.pem 1024",
            "RSA key of 1024 bits",
        ),
        (
            "openssl genpkey -algorithm ed448 -out server-key.pem",
            "Ed448 key",
        ),
        (
            "openssl ecparam -name secp256k1 -genkey -noout -out server-key.pem",
            "EC key on curve secp256k1",
        ),
    ] {
        let w = Workdir::new();
        let certs = w.path("pki");
        if !certs_with_server_key(&certs, keygen) {
            return;
        }
        let vol = w.volume();
        let (ok, out) = run_any(
            squeeze()
                .arg("serve")
                .arg("--socket")
                .arg(w.socket())
                .arg(&vol)
                .args(["--size", "1G"])
                .args(tls_args(&certs)),
        );
        assert!(!ok, "{keygen}: the server started:\n{out}");
        assert!(out.contains(want), "{keygen}: no {want:?} in:\n{out}");
        assert!(out.contains("server-key.pem"), "{keygen}: {out}");
        assert!(!vol.exists(), "{keygen}: the volume was created");
    }
}
