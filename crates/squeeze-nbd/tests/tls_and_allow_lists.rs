//! The front door at the option level, over a MemDevice: NBD_OPT_STARTTLS
//! with a rustls client (require and allow modes, a second STARTTLS,
//! STARTTLS without TLS configured, garbage instead of a ClientHello,
//! client certificates, shutdown with TLS clients connected), the export
//! allow-list (LIST, INFO, GO, EXPORT_NAME, meta contexts, the empty name)
//! and the client address allow-list on a TCP listener.
//!
//! Certificates are made with the openssl CLI: missing, the TLS tests say
//! SKIPPED and pass (they fail under CI=true).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use squeeze_nbd::{
    BlockDevice, IpNet, Listener, MemDevice, Server, ServerConfig, TlsConfig, TlsMode,
};

/// A CA, a server certificate for `localhost` and a client certificate,
/// all signed by the CA, written to `dir` under the names qemu and libnbd
/// expect. False (skipped) if openssl is missing.
fn make_certs(dir: &Path) -> bool {
    if !have_tool("openssl") {
        return false;
    }
    let script = r#"
set -e
cd "$1"
openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=squeeze test CA" \
  -keyout ca-key.pem -out ca-cert.pem \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
for who in server client; do
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout $who-key.pem -out $who.csr
  if [ $who = server ]; then eku=serverAuth; else eku=clientAuth; fi
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n' $eku > $who.ext
  openssl x509 -req -in $who.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
    -days 3650 -extfile $who.ext -out $who-cert.pem
done
"#;
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn new() -> Option<Certs> {
        let dir = tempfile::tempdir().unwrap();
        make_certs(dir.path()).then_some(Certs { dir })
    }
    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }
    fn server_config(&self, mode: TlsMode, client_ca: bool) -> TlsConfig {
        let ca = self.path("ca-cert.pem");
        TlsConfig::from_pem_files(
            &self.path("server-cert.pem"),
            &self.path("server-key.pem"),
            client_ca.then_some(ca.as_path()),
            mode,
        )
        .unwrap()
    }
    fn client_config(&self, with_cert: bool) -> Arc<rustls::ClientConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.path("ca-cert.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let b = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let c = if with_cert {
            let chain = CertificateDer::pem_file_iter(self.path("client-cert.pem"))
                .unwrap()
                .map(|c| c.unwrap())
                .collect();
            let key = PrivateKeyDer::from_pem_file(self.path("client-key.pem")).unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        } else {
            b.with_no_client_auth()
        };
        Arc::new(c)
    }
}

trait Io: Read + Write + Send {}
impl<T: Read + Write + Send> Io for T {}

/// A client over any stream, plain or TLS.
struct C {
    s: Box<dyn Io>,
    /// The raw socket, kept to switch to TLS.
    raw: Option<UnixStream>,
}

impl C {
    fn connect(srv: &TestServer) -> C {
        let s = UnixStream::connect(&srv.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        C {
            s: Box::new(s.try_clone().unwrap()),
            raw: Some(s),
        }
    }

    fn read_n(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b)?;
        Ok(b)
    }

    fn start(&mut self) {
        let g = self.read_n(18).unwrap();
        assert_eq!(be64(&g[0..8]), NBDMAGIC);
        self.s
            .write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
    }

    fn send_option(&mut self, opt: u32, data: &[u8]) {
        self.try_send_option(opt, data).unwrap();
    }

    /// Sends an option; the server may already have closed the connection.
    fn try_send_option(&mut self, opt: u32, data: &[u8]) -> std::io::Result<()> {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b)?;
        self.s.flush()
    }

    /// Replies to one option, up to its ACK or error: (type, data).
    fn replies(&mut self, opt: u32) -> Vec<(u32, Vec<u8>)> {
        let mut v = Vec::new();
        loop {
            let h = self.read_n(20).unwrap();
            assert_eq!(be64(&h[0..8]), OPT_REPLY_MAGIC);
            assert_eq!(be32(&h[8..12]), opt);
            let kind = be32(&h[12..16]);
            let data = self.read_n(be32(&h[16..20]) as usize).unwrap();
            v.push((kind, data));
            if kind == REP_ACK || kind & (1 << 31) != 0 {
                return v;
            }
        }
    }

    fn option(&mut self, opt: u32, data: &[u8]) -> u32 {
        self.send_option(opt, data);
        self.replies(opt).last().unwrap().0
    }

    fn starttls(&mut self, client: Arc<rustls::ClientConfig>) {
        assert_eq!(self.option(OPT_STARTTLS, &[]), REP_ACK);
        let raw = self.raw.take().expect("plain connection");
        let conn = rustls::ClientConnection::new(client, "localhost".try_into().unwrap()).unwrap();
        self.s = Box::new(rustls::StreamOwned::new(conn, raw));
    }

    fn list(&mut self) -> Vec<String> {
        self.send_option(OPT_LIST, &[]);
        let r = self.replies(OPT_LIST);
        assert_eq!(r.last().unwrap().0, REP_ACK);
        r[..r.len() - 1]
            .iter()
            .map(|(k, d)| {
                assert_eq!(*k, REP_SERVER);
                let n = be32(d) as usize;
                String::from_utf8(d[4..4 + n].to_vec()).unwrap()
            })
            .collect()
    }

    /// GO on `name`; the export size on success, else the error reply.
    fn go(&mut self, name: &str) -> Result<u64, u32> {
        self.send_option(OPT_GO, &go_payload(name, &[]));
        let mut size = None;
        for (k, d) in self.replies(OPT_GO) {
            if k & (1 << 31) != 0 {
                return Err(k);
            }
            if k == REP_INFO && be16(&d) == INFO_EXPORT {
                size = Some(be64(&d[2..]));
            }
        }
        Ok(size.unwrap())
    }

    fn request(&mut self, cmd: u16, cookie: u64, off: u64, len: u32, data: &[u8]) {
        let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&cmd.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&off.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
        self.s.flush().unwrap();
    }

    /// A simple reply: (errno, cookie, `read_len` bytes of data).
    fn simple_reply(&mut self, read_len: usize) -> (u32, u64, Vec<u8>) {
        let h = self.read_n(16).unwrap();
        assert_eq!(be32(&h), SIMPLE_REPLY_MAGIC);
        let errno = be32(&h[4..]);
        let data = if errno == 0 {
            self.read_n(read_len).unwrap()
        } else {
            Vec::new()
        };
        (errno, be64(&h[8..]), data)
    }

    fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

fn mem_exports() -> Vec<squeeze_nbd::Export> {
    vec![
        export("alpha", Arc::new(MemDevice::new(4 << 20))),
        export("beta", Arc::new(MemDevice::new(8 << 20))),
        export("gamma", Arc::new(MemDevice::new(16 << 20))),
    ]
}

fn tls_server(certs: &Certs, mode: TlsMode, client_ca: bool) -> TestServer {
    let config = ServerConfig {
        tls: Some(certs.server_config(mode, client_ca)),
        ..ServerConfig::default()
    };
    TestServer::start_with(mem_exports(), config)
}

/// Writes and reads back 3 MiB in 1 MiB requests, several in flight.
fn write_read_back(c: &mut C) {
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    for k in 0..3u64 {
        c.request(CMD_WRITE, 100 + k, k << 20, 1 << 20, &data);
    }
    let mut cookies: Vec<u64> = (0..3)
        .map(|_| c.simple_reply(0))
        .map(|(errno, cookie, _)| {
            assert_eq!(errno, 0);
            cookie
        })
        .collect();
    cookies.sort();
    assert_eq!(cookies, [100, 101, 102]);
    c.request(CMD_FLUSH, 7, 0, 0, &[]);
    assert_eq!(c.simple_reply(0).0, 0);
    for k in 0..3u64 {
        c.request(CMD_READ, 200 + k, k << 20, 1 << 20, &[]);
        let (errno, cookie, got) = c.simple_reply(1 << 20);
        assert_eq!((errno, cookie), (0, 200 + k));
        assert!(got == data, "data read back over TLS differs");
    }
}

#[test]
fn require_mode_refuses_everything_but_starttls_then_serves_over_tls() {
    let Some(certs) = Certs::new() else { return };
    let srv = tls_server(&certs, TlsMode::Require, false);
    let mut c = C::connect(&srv);
    c.start();
    for (opt, data) in [
        (OPT_LIST, vec![]),
        (OPT_STRUCTURED_REPLY, vec![]),
        (OPT_INFO, go_payload("alpha", &[])),
        (OPT_GO, go_payload("alpha", &[])),
        (OPT_LIST_META_CONTEXT, meta_payload("alpha", &[])),
        (999, vec![1, 2, 3]),
    ] {
        assert_eq!(c.option(opt, &data), REP_ERR_TLS_REQD, "option {opt}");
    }
    assert_eq!(c.option(OPT_STARTTLS, b"x"), REP_ERR_INVALID);
    c.starttls(certs.client_config(false));
    // No second greeting: the haggling goes on, over TLS.
    assert_eq!(c.list(), ["alpha", "beta", "gamma"]);
    assert_eq!(c.option(OPT_STARTTLS, &[]), REP_ERR_INVALID);
    assert_eq!(c.go("beta"), Ok(8 << 20));
    write_read_back(&mut c);
    c.request(CMD_DISC, 0, 0, 0, &[]);
    assert!(c.closed_by_server());

    // NBD_OPT_EXPORT_NAME before TLS: no error reply exists, so close.
    let mut c = C::connect(&srv);
    c.start();
    c.send_option(OPT_EXPORT_NAME, b"alpha");
    assert!(c.closed_by_server());

    // ABORT before TLS is answered.
    let mut c = C::connect(&srv);
    c.start();
    assert_eq!(c.option(OPT_ABORT, &[]), REP_ACK);
    assert!(c.closed_by_server());
}

#[test]
fn allow_mode_serves_plaintext_and_tls_clients() {
    let Some(certs) = Certs::new() else { return };
    let srv = tls_server(&certs, TlsMode::Allow, false);
    let mut plain = C::connect(&srv);
    plain.start();
    assert_eq!(plain.go(""), Ok(4 << 20));
    write_read_back(&mut plain);

    let mut t = C::connect(&srv);
    t.start();
    // State from before TLS does not carry over: a fresh haggle.
    assert_eq!(t.option(OPT_STRUCTURED_REPLY, &[]), REP_ACK);
    t.starttls(certs.client_config(false));
    assert_eq!(t.go("gamma"), Ok(16 << 20));
    // Simple replies: structured replies were negotiated before TLS only.
    t.request(CMD_READ, 5, 0, 4096, &[]);
    let (errno, cookie, data) = t.simple_reply(4096);
    assert_eq!((errno, cookie), (0, 5));
    assert!(data.iter().all(|b| *b == 0));
    t.request(CMD_DISC, 0, 0, 0, &[]);
    assert!(t.closed_by_server());
}

#[test]
fn starttls_without_tls_configured_is_unsupported() {
    let srv = TestServer::start(mem_exports());
    let mut c = C::connect(&srv);
    c.start();
    assert_eq!(c.option(OPT_STARTTLS, &[]), REP_ERR_UNSUP);
    assert_eq!(c.go("alpha"), Ok(4 << 20));
}

#[test]
fn garbage_instead_of_a_client_hello_closes_only_that_connection() {
    let Some(certs) = Certs::new() else { return };
    let srv = tls_server(&certs, TlsMode::Require, false);
    let mut c = C::connect(&srv);
    c.start();
    assert_eq!(c.option(OPT_STARTTLS, &[]), REP_ACK);
    // The server may reject the bytes (and close) before all are sent: a
    // broken pipe here is the behaviour under test, not a failure.
    let _ = c.s.write_all(&IHAVEOPT.to_be_bytes());
    let _ = c.s.write_all(&[0u8; 64]);
    // At most a TLS alert comes back, then the end of the stream.
    let mut rest = Vec::new();
    let _ = c.s.read_to_end(&mut rest);
    assert!(rest.len() < 64, "{rest:?}");
    // A client that hangs up mid-handshake too.
    let mut c = C::connect(&srv);
    c.start();
    assert_eq!(c.option(OPT_STARTTLS, &[]), REP_ACK);
    drop(c);
    // The server still serves.
    let mut c = C::connect(&srv);
    c.start();
    c.starttls(certs.client_config(false));
    assert_eq!(c.go("alpha"), Ok(4 << 20));
    assert!(srv.server.stats().protocol_errors >= 1);
}

#[test]
fn client_certificates_when_a_client_ca_is_given() {
    let Some(certs) = Certs::new() else { return };
    let srv = tls_server(&certs, TlsMode::Require, true);
    let mut c = C::connect(&srv);
    c.start();
    c.starttls(certs.client_config(true));
    assert_eq!(c.go("alpha"), Ok(4 << 20));

    // No client certificate: the TLS handshake fails, nothing is served.
    let mut c = C::connect(&srv);
    c.start();
    c.starttls(certs.client_config(false));
    // The server refuses the handshake and closes: the write may already
    // fail (broken pipe), and nothing is ever answered.
    let sent = c.try_send_option(OPT_LIST, &[]);
    assert!(
        sent.is_err() || c.read_n(20).is_err(),
        "served a client without a certificate"
    );
}

#[test]
fn shutdown_with_tls_clients_connected_finishes() {
    let Some(certs) = Certs::new() else { return };
    let mut srv = tls_server(&certs, TlsMode::Require, false);
    let mut idle = C::connect(&srv);
    idle.start();
    idle.starttls(certs.client_config(false));
    assert_eq!(idle.go("alpha"), Ok(4 << 20));
    let mut haggling = C::connect(&srv);
    haggling.start();
    haggling.starttls(certs.client_config(false));
    assert_eq!(haggling.list().len(), 3);
    let t = std::time::Instant::now();
    srv.shutdown();
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(idle.closed_by_server());
    assert!(haggling.closed_by_server());
    assert_eq!(srv.server.stats().connections_open, 0);
}

#[test]
fn export_allow_list_hides_and_refuses_other_exports() {
    let config = ServerConfig {
        allowed_exports: Some(vec!["gamma".into(), "beta".into()]),
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(mem_exports(), config);
    let mut c = C::connect(&srv);
    c.start();
    // Listed in export order, alpha hidden.
    assert_eq!(c.list(), ["beta", "gamma"]);
    assert_eq!(
        c.option(OPT_INFO, &go_payload("alpha", &[])),
        REP_ERR_UNKNOWN
    );
    assert_eq!(c.go("alpha"), Err(REP_ERR_UNKNOWN));
    c.send_option(OPT_LIST_META_CONTEXT, &meta_payload("alpha", &[]));
    assert_eq!(c.replies(OPT_LIST_META_CONTEXT)[0].0, REP_ERR_UNKNOWN);
    assert_eq!(c.option(OPT_INFO, &go_payload("gamma", &[])), REP_ACK);
    // The empty name selects the first visible export.
    assert_eq!(c.go(""), Ok(8 << 20));

    let mut c = C::connect(&srv);
    c.start();
    c.send_option(OPT_EXPORT_NAME, b"alpha");
    assert!(c.closed_by_server());
    let mut c = C::connect(&srv);
    c.start();
    c.send_option(OPT_EXPORT_NAME, b"gamma");
    let r = c.read_n(10).unwrap();
    assert_eq!(be64(&r), 16 << 20);

    // A name not among the exports, or an empty list, is a config error.
    for allowed in [vec!["delta".to_string()], vec![]] {
        let config = ServerConfig {
            allowed_exports: Some(allowed),
            ..ServerConfig::default()
        };
        assert!(Server::with_config(mem_exports(), config).is_err());
    }
}

fn tcp_server(allowed: &[&str]) -> (Server, std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let config = ServerConfig {
        allowed_peers: Some(
            allowed
                .iter()
                .map(|s| s.parse::<IpNet>().unwrap())
                .collect(),
        ),
        ..ServerConfig::default()
    };
    let dev = Arc::new(MemDevice::new(1 << 20));
    dev.write_at(0, b"hello", false).unwrap();
    let server = Server::with_config(vec![export("mem", dev)], config).unwrap();
    let l = Listener::bind_tcp("127.0.0.1:0").unwrap();
    let Listener::Tcp(t) = &l else { unreachable!() };
    let addr = t.local_addr().unwrap();
    let s2 = server.clone();
    let th = std::thread::spawn(move || s2.serve(l).unwrap());
    (server, addr, th)
}

#[test]
fn address_allow_list_closes_other_tcp_clients_on_accept() {
    let (server, addr, th) = tcp_server(&["10.0.0.0/8", "::1"]);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 18];
    assert!(
        matches!(s.read(&mut b), Ok(0) | Err(_)),
        "127.0.0.1 is not on the list but got a greeting"
    );
    server.shutdown_handle().shutdown();
    th.join().unwrap();
    assert_eq!(server.stats().connections_total, 0);

    let (server, addr, th) = tcp_server(&["10.0.0.0/8", "127.0.0.0/8"]);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.read_exact(&mut b).unwrap();
    assert_eq!(be64(&b), NBDMAGIC);
    drop(s);
    server.shutdown_handle().shutdown();
    th.join().unwrap();
    assert_eq!(server.stats().connections_total, 1);
}
