//! TLS for NBD (the NBD_OPT_STARTTLS option), with rustls.
//!
//! Place in the data path: in front of the connection code. When a client
//! sends NBD_OPT_STARTTLS and the server has answered NBD_REP_ACK, the
//! connection's reader thread runs the TLS handshake on the socket
//! (`accept`), then hands the rest of the connection a plaintext stream:
//! one end of a `UnixStream::pair()`. A per-connection pump thread
//! (`Pump`) shuttles bytes between the real socket (encrypted) and the
//! other end of the pair (plaintext), so the reader, the workers and the
//! reply writer run unchanged on what looks like a client socket. The
//! option haggling then starts again over TLS (no second greeting).
//!
//! Invariants: the pump buffers at most `APP_PENDING_MAX` bytes of
//! decrypted client data not yet taken by the reader, and reads replies
//! only when every encrypted byte before them has left, so a client that
//! stops reading still fills the pair and trips the server's
//! `send_timeout` as it would on a plain socket. End of stream travels in
//! both directions: the client closing (or the server's shutdown shutting
//! the socket's read side) ends the reader's stream; the connection
//! closing its plaintext end makes the pump send close_notify, flush (for
//! at most `send_timeout`) and exit. The reader thread joins the pump
//! before the connection is counted closed, so no reply is lost.
//!
//! Keys: the crypto provider is aws-lc-rs, which signs with RSA keys of
//! any size from 2048 to 8192 bits, ECDSA keys on P-256, P-384 and P-521,
//! and Ed25519 keys. (ring, the other rustls provider, also wants each RSA
//! prime to be a multiple of 512 bits, so it refused valid keys such as
//! the NBD project's 2432-bit test key.) A key the provider refuses is
//! named by type and size in the error (`key.rs` reads just enough DER).

use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConnection;

use crate::server::Stream;

mod key;

/// Whether clients must use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// STARTTLS is offered; plaintext clients are served too.
    Allow,
    /// Every option but NBD_OPT_STARTTLS and NBD_OPT_ABORT is refused with
    /// NBD_REP_ERR_TLS_REQD until TLS is up; NBD_OPT_EXPORT_NAME before
    /// TLS closes the connection (the protocol has no error reply there).
    Require,
}

/// TLS settings of a server: the rustls configuration and the mode.
#[derive(Clone)]
pub struct TlsConfig {
    server: Arc<rustls::ServerConfig>,
    mode: TlsMode,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// Why TLS settings could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("{path}: {what}")]
    File { path: String, what: String },
    /// The private key is of a type or size the TLS library cannot sign
    /// with (`kind`: "RSA key of 1024 bits").
    #[error("{path}: {kind} cannot be used: {why} (the TLS library signs with {usable})", usable = key::USABLE_KEYS)]
    UnusableKey {
        path: String,
        kind: String,
        why: String,
    },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

fn file_error(path: &Path, what: impl fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        what: what.to_string(),
    }
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate found"));
    }
    Ok(certs)
}

/// The private key from a PEM file, checked against what `provider` can
/// sign with: a key it refuses is named by type and size in the error.
fn load_key(
    path: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<PrivateKeyDer<'static>, TlsError> {
    let key = PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, e))?;
    if let Err(e) = provider.key_provider.load_private_key(key.clone_key()) {
        let kind = key::KeyKind::of(&key);
        return Err(TlsError::UnusableKey {
            path: path.display().to_string(),
            kind: kind.to_string(),
            why: kind
                .why_unusable()
                .unwrap_or_else(|| format!("the TLS library refused it: {e}")),
        });
    }
    Ok(key)
}

impl TlsConfig {
    /// From PEM files: the server's certificate chain (leaf first) and its
    /// private key (PKCS#8, PKCS#1 or SEC1; RSA of 2048 to 8192 bits, EC on
    /// P-256, P-384 or P-521, or Ed25519). With `client_ca`, clients must
    /// present a certificate signed by one of the CA certificates in that
    /// file (the only authentication NBD has).
    pub fn from_pem_files(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
        mode: TlsMode,
    ) -> Result<TlsConfig, TlsError> {
        let chain = load_certs(cert)?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let key = load_key(key, &provider)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in load_certs(ca)? {
                    roots.add(c).map_err(|e| file_error(ca, e))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| file_error(ca, e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(chain, key)?;
        Ok(TlsConfig::new(Arc::new(config), mode))
    }

    /// From a ready rustls configuration.
    pub fn new(server: Arc<rustls::ServerConfig>, mode: TlsMode) -> TlsConfig {
        TlsConfig { server, mode }
    }

    pub fn mode(&self) -> TlsMode {
        self.mode
    }
}

/// Decrypted client bytes the pump holds for a reader that is not reading.
const APP_PENDING_MAX: usize = 1 << 20;
/// Bytes moved per read from either side.
const CHUNK_BYTES: usize = 256 << 10;

/// A reader that serves `pre` before reading the socket: bytes the option
/// phase buffered past NBD_OPT_STARTTLS belong to the TLS stream.
struct Prefixed<'a> {
    pre: &'a [u8],
    s: &'a mut Stream,
}

impl Read for Prefixed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.len());
            buf[..n].copy_from_slice(&self.pre[..n]);
            self.pre = &self.pre[n..];
            return Ok(n);
        }
        self.s.read(buf)
    }
}

impl Write for Prefixed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.s.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A running pump: join it once the plaintext end is closed.
pub(crate) struct PumpHandle {
    thread: Option<JoinHandle<()>>,
}

impl PumpHandle {
    /// Waits for the pump to flush and exit. The caller must have closed
    /// (or shut down) every handle of the plaintext stream first.
    pub(crate) fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs the TLS handshake on `net` (blocking, under the socket's current
/// timeouts), then starts the pump. Returns the plaintext stream the rest
/// of the connection uses in place of `net`.
pub(crate) fn accept(
    mut net: Stream,
    buffered: &[u8],
    config: &TlsConfig,
    send_timeout: Option<Duration>,
    conn_id: u64,
) -> io::Result<(Stream, PumpHandle)> {
    let mut tls = ServerConnection::new(Arc::clone(&config.server)).map_err(io::Error::other)?;
    // The pump bounds what it hands rustls itself (one chunk, only once
    // earlier output has left), so rustls need not refuse plaintext.
    tls.set_buffer_limit(None);
    {
        let mut io = Prefixed {
            pre: buffered,
            s: &mut net,
        };
        while tls.is_handshaking() {
            tls.complete_io(&mut io)?;
        }
        // Records that came with the handshake's last flight (in the
        // prefix) are decrypted now; the pump delivers the plaintext.
        while !io.pre.is_empty() {
            tls.read_tls(&mut io.pre)?;
            tls.process_new_packets().map_err(io::Error::other)?;
        }
    }
    tracing::debug!(
        conn = conn_id,
        version = ?tls.protocol_version(),
        suite = ?tls.negotiated_cipher_suite().map(|s| s.suite()),
        "TLS established"
    );
    net.set_read_timeout(None)?;
    net.set_nonblocking(true)?;
    let (app, plain) = UnixStream::pair()?;
    app.set_nonblocking(true)?;
    let pump = Pump {
        tls,
        net,
        app,
        send_timeout,
        conn_id,
    };
    let thread = std::thread::Builder::new()
        .name(format!("nbd-tls-{conn_id}"))
        .spawn(move || pump.run())?;
    Ok((
        Stream::Unix(plain),
        PumpHandle {
            thread: Some(thread),
        },
    ))
}

struct Pump {
    tls: ServerConnection,
    net: Stream,
    app: UnixStream,
    send_timeout: Option<Duration>,
    conn_id: u64,
}

fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

impl Pump {
    fn run(mut self) {
        let why = self.shuttle();
        tracing::debug!(conn = self.conn_id, why, "TLS pump done");
        // Whatever ended the pump, the plaintext side must see it.
        let _ = self.app.shutdown(std::net::Shutdown::Both);
        self.net.shutdown(std::net::Shutdown::Both);
    }

    /// Moves bytes until both directions are finished or one side fails;
    /// returns why it stopped, for the log.
    fn shuttle(&mut self) -> &'static str {
        let mut buf = vec![0u8; CHUNK_BYTES];
        // Decrypted bytes for the app, from `to_app_pos` on.
        let mut to_app: Vec<u8> = Vec::new();
        let mut to_app_pos = 0usize;
        // The client sent close_notify or closed: no more input.
        let mut net_eof = false;
        // The app's read side has been told (shutdown of its peer's write).
        let mut app_told_eof = false;
        // The app closed its end: send close_notify, flush, stop.
        let mut app_eof = false;
        let mut closing_since: Option<Instant> = None;
        // The socket reported hangup while we did not want to read.
        let mut net_hup = false;
        loop {
            // 1. Decrypted bytes into `to_app`.
            if to_app_pos == to_app.len() {
                to_app.clear();
                to_app_pos = 0;
            }
            while to_app.len() - to_app_pos < APP_PENDING_MAX {
                match self.tls.reader().read(&mut buf) {
                    Ok(0) => {
                        net_eof = true;
                        break;
                    }
                    Ok(n) => to_app.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        // Closed without close_notify: still the end.
                        net_eof = true;
                        break;
                    }
                }
            }
            // 2. Plaintext to the app.
            while to_app_pos < to_app.len() {
                match (&self.app).write(&to_app[to_app_pos..]) {
                    Ok(n) => to_app_pos += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        // The app stopped reading for good: drop input.
                        to_app_pos = to_app.len();
                    }
                }
            }
            if net_eof && to_app_pos == to_app.len() && !app_told_eof {
                let _ = self.app.shutdown(std::net::Shutdown::Write);
                app_told_eof = true;
            }
            // 3. Replies from the app, once earlier output has left.
            if !app_eof && !self.tls.wants_write() {
                match (&self.app).read(&mut buf) {
                    Ok(0) => app_eof = true,
                    Ok(n) => {
                        if self.tls.writer().write_all(&buf[..n]).is_err() {
                            return "cannot encrypt";
                        }
                    }
                    Err(e) if is_retry(&e) => {}
                    Err(_) => app_eof = true,
                }
                if app_eof {
                    self.tls.send_close_notify();
                    closing_since = Some(Instant::now());
                }
            }
            // 4. Encrypted bytes to the client.
            while self.tls.wants_write() {
                match self.tls.write_tls(&mut self.net) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => return "socket write failed",
                }
            }
            if app_eof && !self.tls.wants_write() {
                return "closed";
            }
            // 5. Encrypted bytes from the client.
            let want_net_read = !net_eof && !net_hup && to_app.len() - to_app_pos < APP_PENDING_MAX;
            if want_net_read {
                match self.tls.read_tls(&mut self.net) {
                    Ok(0) => net_eof = true,
                    Ok(_) => {
                        if let Err(e) = self.tls.process_new_packets() {
                            tracing::info!(conn = self.conn_id, error = %e, "TLS error; closing connection");
                            // Best effort: send the alert rustls queued.
                            let _ = self.tls.write_tls(&mut self.net);
                            return "TLS error";
                        }
                        continue;
                    }
                    Err(e) if is_retry(&e) => {}
                    Err(_) => net_eof = true,
                }
                if net_eof {
                    continue;
                }
            }
            // 6. Wait for either side.
            let want_net_read = !net_eof && !net_hup && to_app.len() - to_app_pos < APP_PENDING_MAX;
            let mut net_events = 0;
            if want_net_read {
                net_events |= libc::POLLIN;
            }
            if self.tls.wants_write() {
                net_events |= libc::POLLOUT;
            }
            let mut app_events = 0;
            if !app_eof && !self.tls.wants_write() {
                app_events |= libc::POLLIN;
            }
            if to_app_pos < to_app.len() {
                app_events |= libc::POLLOUT;
            }
            let mut fds = [
                libc::pollfd {
                    fd: if net_events != 0 {
                        self.net.as_raw_fd()
                    } else {
                        -1
                    },
                    events: net_events,
                    revents: 0,
                },
                libc::pollfd {
                    fd: if app_events != 0 {
                        self.app.as_raw_fd()
                    } else {
                        -1
                    },
                    events: app_events,
                    revents: 0,
                },
            ];
            if net_events == 0 && app_events == 0 {
                // Nothing can move (e.g. the app stopped reading and the
                // client hung up): the connection is over.
                return "stalled";
            }
            let timeout_ms = match (closing_since, self.send_timeout) {
                (Some(t0), Some(limit)) => {
                    let left = limit.saturating_sub(t0.elapsed());
                    if left.is_zero() {
                        return "close_notify not flushed in time";
                    }
                    left.as_millis().min(i32::MAX as u128) as i32
                }
                _ => -1,
            };
            // SAFETY: `fds` is a valid array of two pollfd for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return "poll failed";
            }
            let hup = libc::POLLHUP | libc::POLLERR;
            if fds[0].revents & hup != 0 && net_events & libc::POLLIN == 0 {
                // Hangup reported while we only wanted to write: the write
                // will fail; while we wanted neither, stop polling it.
                net_hup = true;
            }
        }
    }
}
