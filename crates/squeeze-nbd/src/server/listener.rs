//! The listener: binding (TCP, Unix), the accept loop, the client address
//! allow-list, the connection limit, one thread per connection, the worker
//! pool's start and the server's shutdown. The top of the server: it
//! builds on `connection.rs` and `transmission.rs`.
//!
//! Threads. Each `serve` call runs one accept loop (TCP or Unix socket);
//! each accepted connection gets one thread, which negotiates
//! (`connection::negotiate`) and then reads requests
//! (`transmission::serve`). `Server::with_config` starts the workers,
//! shared by every connection, and sizes their write slots
//! (`ServerConfig::write_slots`).
//!
//! Limits: at most `connections_max` connections; more are closed on
//! accept.
//!
//! Shutdown: `ShutdownHandle::shutdown` stops every accept loop, shuts the
//! read side of every connection (readers see end of stream), lets
//! dispatched requests finish and their replies go out, and returns when
//! every connection is closed. `serve` returns at the same point, so the
//! caller may flush the devices right after either returns.
//!
//! The front door, here: `Listener::bind_unix` makes the socket 0600; a
//! TCP client whose address is not on `allowed_peers` is closed on accept.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{IpAddr, Shutdown, TcpListener, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::config::{Export, ServerConfig};
use super::connection::{self, Shared};
use super::queue::JobQueue;
use super::stream::Stream;
use super::transmission::{self, Job};
use crate::proto::*;
use crate::stats::{Counters, ServerStats};

/// A bound listening socket, ready for `Server::serve`.
pub enum Listener {
    Tcp(TcpListener),
    /// A Unix socket; the path is removed when the listener is dropped.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Bind a TCP listener (use a loopback address unless told otherwise).
    pub fn bind_tcp<A: ToSocketAddrs>(addr: A) -> io::Result<Listener> {
        Ok(Listener::Tcp(TcpListener::bind(addr)?))
    }

    /// Bind a Unix socket with mode 0600. A stale socket file nobody
    /// listens on is replaced; a live one is `AddrInUse`.
    pub fn bind_unix<P: AsRef<Path>>(path: P) -> io::Result<Listener> {
        let path = path.as_ref();
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if meta.file_type().is_socket() && UnixStream::connect(path).is_err() {
                std::fs::remove_file(path)?;
            } else {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} exists", path.display()),
                ));
            }
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Listener::Unix(listener, path.to_path_buf()))
    }

    /// Where clients connect, for logs: `127.0.0.1:10809` or the path.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map_or_else(|_| "tcp:?".to_string(), |a| a.to_string()),
            Listener::Unix(_, p) => p.display().to_string(),
        }
    }

    fn raw_fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, _) => l.as_raw_fd(),
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(true),
            Listener::Unix(l, _) => l.set_nonblocking(true),
        }
    }

    /// A new connection, its description for logs and, for TCP, the
    /// client's address.
    fn accept(&self) -> io::Result<(Stream, String, Option<IpAddr>)> {
        match self {
            Listener::Tcp(l) => {
                let (s, peer) = l.accept()?;
                s.set_nonblocking(false)?;
                // Small replies must not wait for Nagle.
                s.set_nodelay(true)?;
                Ok((Stream::Tcp(s), peer.to_string(), Some(peer.ip())))
            }
            Listener::Unix(l, p) => {
                let (s, _) = l.accept()?;
                s.set_nonblocking(false)?;
                Ok((Stream::Unix(s), format!("unix:{}", p.display()), None))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Errors building a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("a server needs at least one export")]
    NoExports,
    #[error("duplicate export name {0:?}")]
    DuplicateExport(String),
    #[error("export name {0:?} is longer than 4096 bytes")]
    NameTooLong(String),
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    #[error("export allow-list names {0:?}, which is not an export")]
    UnknownAllowedExport(String),
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
}

/// An NBD server over a fixed set of exports. Cheap to clone (shared
/// state); `serve` may run on several threads at once, one per listener.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

/// Stops a server: see the module docs.
#[derive(Clone)]
pub struct ShutdownHandle {
    inner: Arc<Inner>,
}

impl Drop for Inner {
    /// The last reference to the server is gone: let the workers finish
    /// what is queued and exit.
    fn drop(&mut self) {
        self.jobs.close();
    }
}

struct Inner {
    /// What the connections see: exports, configuration, counters, the
    /// shutdown flag.
    shared: Shared,
    jobs: Arc<JobQueue<Job>>,
    /// Written once on shutdown; every accept loop polls the other end.
    wake_tx: UnixStream,
    wake_rx: UnixStream,
    registry: Mutex<Registry>,
    /// Signalled when a connection or an accept loop ends.
    changed: Condvar,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    /// A clone of every open connection's socket, to shut it down.
    connections: HashMap<u64, Stream>,
    accept_loops: usize,
}

impl Server {
    /// A server with the default configuration.
    pub fn new(exports: Vec<Export>) -> Result<Server, ServerError> {
        Server::with_config(exports, ServerConfig::default())
    }

    /// A server with `config`; starts the worker pool.
    pub fn with_config(exports: Vec<Export>, config: ServerConfig) -> Result<Server, ServerError> {
        if exports.is_empty() {
            return Err(ServerError::NoExports);
        }
        for (i, e) in exports.iter().enumerate() {
            if e.name.len() > STRING_BYTES_MAX as usize {
                return Err(ServerError::NameTooLong(e.name.clone()));
            }
            if exports[..i].iter().any(|o| o.name == e.name) {
                return Err(ServerError::DuplicateExport(e.name.clone()));
            }
        }
        if config.workers == 0
            || config.write_workers == Some(0)
            || config.in_flight_requests_max == 0
            || config.connections_max == 0
        {
            return Err(ServerError::Config(
                "workers, requests and connections must be > 0",
            ));
        }
        if config.in_flight_bytes_max < u64::from(BLOCK_SIZE_MAX) {
            return Err(ServerError::Config(
                "in_flight_bytes_max below the maximum block size",
            ));
        }
        let visible: Vec<bool> = match &config.allowed_exports {
            None => vec![true; exports.len()],
            Some(allowed) => {
                if let Some(bad) = allowed
                    .iter()
                    .find(|a| !exports.iter().any(|e| e.name == **a))
                {
                    return Err(ServerError::UnknownAllowedExport(bad.clone()));
                }
                exports.iter().map(|e| allowed.contains(&e.name)).collect()
            }
        };
        if !visible.contains(&true) {
            return Err(ServerError::Config("the export allow-list is empty"));
        }
        let jobs = Arc::new(JobQueue::<Job>::new(config.write_slots(&exports)));
        transmission::spawn_workers(&jobs, config.workers)?;
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_rx.set_nonblocking(true)?;
        Ok(Server {
            inner: Arc::new(Inner {
                shared: Shared {
                    exports,
                    visible,
                    config,
                    counters: Arc::new(Counters::default()),
                    shutting_down: AtomicBool::new(false),
                },
                jobs,
                wake_tx,
                wake_rx,
                registry: Mutex::new(Registry::default()),
                changed: Condvar::new(),
            }),
        })
    }

    /// The exports, in the order given.
    pub fn exports(&self) -> &[Export] {
        &self.inner.shared.exports
    }

    /// WRITE requests run at once over all connections: the queue's
    /// write slots (`ServerConfig::write_workers`, else what the exports'
    /// devices declare in `BlockDevice::max_concurrent_writes`).
    pub fn write_slots(&self) -> usize {
        self.inner.jobs.write_slots()
    }

    /// A snapshot of the counters; callable while serving.
    pub fn stats(&self) -> ServerStats {
        self.inner.shared.counters.snapshot()
    }

    /// A handle that stops this server (see the module docs).
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Bind `addr` and serve until shutdown.
    pub fn serve_tcp<A: ToSocketAddrs>(&self, addr: A) -> io::Result<()> {
        self.serve(Listener::bind_tcp(addr)?)
    }

    /// Bind a Unix socket (mode 0600) at `path` and serve until shutdown;
    /// the socket file is removed on return.
    pub fn serve_unix<P: AsRef<Path>>(&self, path: P) -> io::Result<()> {
        self.serve(Listener::bind_unix(path)?)
    }

    /// Serve on a bound listener until shutdown; returns once the accept
    /// loop stopped and every connection has closed.
    pub fn serve(&self, listener: Listener) -> io::Result<()> {
        let inner = &self.inner;
        {
            let mut reg = inner.registry.lock();
            if inner.shared.shutting_down.load(Ordering::SeqCst) {
                return Ok(());
            }
            reg.accept_loops += 1;
        }
        tracing::info!(listen = %listener.describe(), exports = inner.shared.exports.len(), "nbd server listening");
        let result = self.accept_loop(&listener);
        let mut reg = inner.registry.lock();
        reg.accept_loops -= 1;
        inner.changed.notify_all();
        while inner.shared.shutting_down.load(Ordering::SeqCst) && !reg.connections.is_empty() {
            inner.changed.wait(&mut reg);
        }
        result
    }

    fn accept_loop(&self, listener: &Listener) -> io::Result<()> {
        let inner = &self.inner;
        listener.set_nonblocking()?;
        let mut fds = [
            libc::pollfd {
                fd: listener.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: inner.wake_rx.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            if inner.shared.shutting_down.load(Ordering::SeqCst) {
                return Ok(());
            }
            // SAFETY: `fds` is a valid array of two pollfd for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if fds[1].revents != 0 || inner.shared.shutting_down.load(Ordering::SeqCst) {
                return Ok(());
            }
            match listener.accept() {
                Ok((stream, peer, ip)) => {
                    if self.peer_allowed(ip) {
                        self.start_connection(stream, peer);
                    } else {
                        Counters::add(&inner.shared.counters.protocol_errors, 1);
                        tracing::warn!(%peer, "client address not on the allow-list; closing");
                        stream.shutdown(Shutdown::Both);
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    // EMFILE and friends: back off rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn peer_allowed(&self, ip: Option<IpAddr>) -> bool {
        match (&self.inner.shared.config.allowed_peers, ip) {
            (Some(nets), Some(ip)) => nets.iter().any(|n| n.contains(ip)),
            _ => true,
        }
    }

    fn start_connection(&self, stream: Stream, peer: String) {
        let inner = &self.inner;
        let id = {
            let mut reg = inner.registry.lock();
            if inner.shared.shutting_down.load(Ordering::SeqCst) {
                return;
            }
            if reg.connections.len() >= inner.shared.config.connections_max {
                tracing::warn!(%peer, max = inner.shared.config.connections_max, "too many connections; closing new one");
                return;
            }
            let clone = match stream.try_clone() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot clone socket; closing");
                    return;
                }
            };
            reg.next_id += 1;
            let id = reg.next_id;
            reg.connections.insert(id, clone);
            id
        };
        Counters::add(&inner.shared.counters.connections_open, 1);
        Counters::add(&inner.shared.counters.connections_total, 1);
        let inner2 = Arc::clone(inner);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                tracing::info!(conn = id, %peer, "connection opened");
                connection_thread(&inner2, id, stream, &peer);
                tracing::info!(conn = id, %peer, "connection closed");
                inner2.end_connection(id);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot spawn connection thread");
            inner.end_connection(id);
        }
    }
}

impl Inner {
    fn end_connection(&self, id: u64) {
        let mut reg = self.registry.lock();
        if let Some(s) = reg.connections.remove(&id) {
            s.shutdown(Shutdown::Both);
        }
        Counters::sub(&self.shared.counters.connections_open, 1);
        self.changed.notify_all();
    }
}

impl ShutdownHandle {
    /// Stop accepting, finish dispatched requests, close every connection;
    /// returns when all of that is done. Idempotent.
    pub fn shutdown(&self) {
        let inner = &self.inner;
        let mut reg = inner.registry.lock();
        if !inner.shared.shutting_down.swap(true, Ordering::SeqCst) {
            tracing::info!(
                connections = reg.connections.len(),
                "nbd server shutting down"
            );
            let _ = (&inner.wake_tx).write_all(&[1]);
        }
        for s in reg.connections.values() {
            s.shutdown(Shutdown::Read);
        }
        while reg.accept_loops > 0 || !reg.connections.is_empty() {
            inner.changed.wait(&mut reg);
        }
    }

    /// Whether shutdown has been requested.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shared.shutting_down.load(Ordering::SeqCst)
    }
}

/// The thread of one connection: handshake (with STARTTLS, the rest of
/// the connection runs over the TLS pump's plaintext stream), then
/// requests, then the pump's end.
fn connection_thread(inner: &Inner, id: u64, stream: Stream, peer: &str) {
    let shared = &inner.shared;
    let mut pump = None;
    if let Some((reader, writer, negotiated)) =
        connection::negotiate(shared, id, stream, peer, &mut pump)
    {
        transmission::serve(shared, &inner.jobs, id, reader, writer, negotiated, peer);
    }
    // Every handle of the plaintext end is closed by now: the pump sends
    // close_notify, flushes what the workers wrote, and ends.
    if let Some(p) = pump {
        p.join();
    }
}
