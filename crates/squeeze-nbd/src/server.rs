//! The server: listeners, connections, the shared worker pool, shutdown.
//!
//! Threads. Each `serve` call runs one accept loop (TCP or Unix socket).
//! Each connection gets one reader thread: it runs the handshake, then
//! reads requests, validates them (`request.rs`) and answers rejections
//! itself; valid requests go to a worker pool shared by the whole server.
//! Workers call the `BlockDevice` and write the reply under the
//! connection's write mutex, so replies leave in completion order, not
//! request order (the protocol matches them by cookie). A worker that
//! finds the mutex taken queues its reply for the holder to write, so a
//! client that reads slowly ties up at most one worker.
//!
//! Limits (STYLE habit 10): per connection, at most
//! `in_flight_bytes_max` bytes of READ/WRITE payload and
//! `in_flight_requests_max` requests are dispatched and not yet written
//! back; the reader blocks until a written reply frees room (a single
//! request larger than the byte budget is admitted alone). At most
//! `connections_max` connections; handshakes time out after
//! `handshake_timeout`, a client that stops reading replies after
//! `send_timeout`.
//!
//! Shutdown: `ShutdownHandle::shutdown` stops every accept loop, shuts the
//! read side of every connection (readers see end of stream), lets
//! dispatched requests finish and their replies go out, and returns when
//! every connection is closed. `serve` returns at the same point, so the
//! caller may flush the devices right after either returns.
//!
//! A protocol violation (bad magic, truncated stream, an unskippable
//! payload, a bad handshake) closes that connection only, logged at warn.
//!
//! The front door: `Listener::bind_unix` makes the socket 0600; a TCP
//! client whose address is not on `allowed_peers` is closed on accept;
//! `allowed_exports` hides the other exports in the handshake; with `tls`,
//! a client's NBD_OPT_STARTTLS moves the rest of its connection onto a TLS
//! pump (`tls.rs`): the code below then runs on the pump's plaintext end
//! exactly as on a socket, and joins the pump before the connection counts
//! as closed.

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::access::IpNet;
use crate::device::BlockDevice;
use crate::handshake::{self, HandshakeError, Negotiated, Outcome, Policy};
use crate::proto::*;
use crate::reply;
use crate::request::{self, Command, Payload, RequestContext};
use crate::stats::{Counters, ServerStats};
use crate::tls::{self, TlsConfig};

/// The workers' job queue: unbounded (each connection bounds what it
/// dispatches), and idle workers sleep on a condition variable at once
/// rather than spinning, which on a small machine would take CPU from the
/// engine's compression. At most `write_slots` WRITE requests run at once
/// (they are CPU-bound); a worker skips queued writes while they are all
/// taken and runs the first other request, so reads keep the device busy.
struct JobQueue<J = Job> {
    state: Mutex<QueueState<J>>,
    ready: Condvar,
    write_slots: usize,
}

struct QueueState<J> {
    jobs: std::collections::VecDeque<J>,
    closed: bool,
    writes_running: usize,
}

/// What the queue needs to know of a job.
trait Queued {
    fn is_write(&self) -> bool;
}

impl<J: Queued> JobQueue<J> {
    fn new(write_slots: usize) -> JobQueue<J> {
        JobQueue {
            state: Mutex::new(QueueState {
                jobs: std::collections::VecDeque::new(),
                closed: false,
                writes_running: 0,
            }),
            ready: Condvar::new(),
            write_slots: write_slots.max(1),
        }
    }

    /// Queues a job; gives it back if the queue is closed.
    fn push(&self, job: J) -> Result<(), J> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(job);
        }
        // A write that must wait for a slot wakes nobody: `write_done` will.
        let runnable = !job.is_write() || s.writes_running < self.write_slots;
        s.jobs.push_back(job);
        drop(s);
        if runnable {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// The next job that may run; None once closed and drained. A write
    /// taken here holds a slot until `write_done`.
    fn pop(&self) -> Option<J> {
        let mut s = self.state.lock();
        loop {
            let writes_full = s.writes_running >= self.write_slots;
            let next = if writes_full {
                s.jobs.iter().position(|j| !j.is_write())
            } else if s.jobs.is_empty() {
                None
            } else {
                Some(0)
            };
            if let Some(i) = next {
                let j = s.jobs.remove(i).expect("index in range");
                if j.is_write() {
                    s.writes_running += 1;
                }
                if s.closed && s.jobs.is_empty() {
                    // Drained: workers asleep behind a full write slot
                    // must wake to see that and exit.
                    self.ready.notify_all();
                }
                return Some(j);
            }
            if s.closed && s.jobs.is_empty() {
                return None;
            }
            self.ready.wait(&mut s);
        }
    }

    /// A write taken by `pop` has finished: its slot is free.
    fn write_done(&self) {
        let mut s = self.state.lock();
        s.writes_running -= 1;
        let waiting = !s.jobs.is_empty();
        drop(s);
        // Idle workers are alike: one of them takes the queued write now
        // allowed (waking all of them for each write costs CPU).
        if waiting {
            self.ready.notify_one();
        }
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.ready.notify_all();
    }
}

/// One export: a named device.
pub struct Export {
    pub name: String,
    pub description: String,
    pub device: Arc<dyn BlockDevice>,
}

/// Tunables, each a limit on something in flight.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Worker threads shared by all connections: requests executed at
    /// once. Default 8 per core, at least 16: reads mostly wait for the
    /// device, and on 2 cores 4 of them read fio's W1 from the device at
    /// 788 MB/s where 8 reached 900-1026.
    pub workers: usize,
    /// Of those, WRITE requests executed at once. Default two per core, at
    /// least 4: writes are CPU-bound, and on 2 cores 4 wrote fio's W1 at
    /// 1168-1298 MB/s where 8 managed 920-1211.
    pub write_workers: usize,
    /// Per connection: READ/WRITE payload bytes dispatched and unanswered.
    pub in_flight_bytes_max: u64,
    /// Per connection: requests dispatched and unanswered.
    pub in_flight_requests_max: u32,
    /// Connections served at once; more are closed on accept.
    pub connections_max: usize,
    /// Time a client has for each read during the handshake.
    pub handshake_timeout: Option<Duration>,
    /// Time a reply write may block on a client that does not read;
    /// after it the connection is closed.
    pub send_timeout: Option<Duration>,
    /// With structured replies, answer a READ of an all-hole range with
    /// OFFSET_HOLE (costs one `block_status` call per READ).
    pub read_holes: bool,
    /// TLS (NBD_OPT_STARTTLS) offered or required; `None`: plaintext only.
    pub tls: Option<TlsConfig>,
    /// Export allow-list: only these exports are listed and selectable
    /// (the empty name selects the first of them); `None`: all.
    pub allowed_exports: Option<Vec<String>>,
    /// Client address allow-list for TCP listeners, checked on accept;
    /// `None`: any address. Unix socket clients are always allowed.
    pub allowed_peers: Option<Vec<IpNet>>,
}

/// Default per-connection in-flight payload budget.
pub const IN_FLIGHT_BYTES_MAX_DEFAULT: u64 = 64 << 20;
const _: () = assert!(IN_FLIGHT_BYTES_MAX_DEFAULT >= BLOCK_SIZE_MAX as u64);

impl Default for ServerConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        ServerConfig {
            workers: (cores * 8).clamp(16, 256),
            write_workers: (cores * 2).clamp(4, 64),
            in_flight_bytes_max: IN_FLIGHT_BYTES_MAX_DEFAULT,
            in_flight_requests_max: 512,
            connections_max: 256,
            handshake_timeout: Some(Duration::from_secs(60)),
            send_timeout: Some(Duration::from_secs(60)),
            read_holes: true,
            tls: None,
            allowed_exports: None,
            allowed_peers: None,
        }
    }
}

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

/// A connected socket of either kind (or the plaintext end of a TLS pump).
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        };
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
        }
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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
    exports: Vec<Export>,
    /// Per export: on the allow-list (all true without one).
    visible: Vec<bool>,
    config: ServerConfig,
    counters: Arc<Counters>,
    jobs: Arc<JobQueue>,
    shutting_down: AtomicBool,
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
            || config.write_workers == 0
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
        let jobs = Arc::new(JobQueue::<Job>::new(config.write_workers));
        for i in 0..config.workers {
            let q = Arc::clone(&jobs);
            std::thread::Builder::new()
                .name(format!("nbd-worker-{i}"))
                .spawn(move || {
                    while let Some(job) = q.pop() {
                        let write = job.is_write();
                        run_job(job);
                        if write {
                            q.write_done();
                        }
                    }
                })?;
        }
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_rx.set_nonblocking(true)?;
        Ok(Server {
            inner: Arc::new(Inner {
                exports,
                visible,
                config,
                counters: Arc::new(Counters::default()),
                jobs,
                shutting_down: AtomicBool::new(false),
                wake_tx,
                wake_rx,
                registry: Mutex::new(Registry::default()),
                changed: Condvar::new(),
            }),
        })
    }

    /// The exports, in the order given.
    pub fn exports(&self) -> &[Export] {
        &self.inner.exports
    }

    /// A snapshot of the counters; callable while serving.
    pub fn stats(&self) -> ServerStats {
        self.inner.counters.snapshot()
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
            if inner.shutting_down.load(Ordering::SeqCst) {
                return Ok(());
            }
            reg.accept_loops += 1;
        }
        tracing::info!(listen = %listener.describe(), exports = inner.exports.len(), "nbd server listening");
        let result = self.accept_loop(&listener);
        let mut reg = inner.registry.lock();
        reg.accept_loops -= 1;
        inner.changed.notify_all();
        while inner.shutting_down.load(Ordering::SeqCst) && !reg.connections.is_empty() {
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
            if inner.shutting_down.load(Ordering::SeqCst) {
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
            if fds[1].revents != 0 || inner.shutting_down.load(Ordering::SeqCst) {
                return Ok(());
            }
            match listener.accept() {
                Ok((stream, peer, ip)) => {
                    if self.peer_allowed(ip) {
                        self.start_connection(stream, peer);
                    } else {
                        Counters::add(&inner.counters.protocol_errors, 1);
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
        match (&self.inner.config.allowed_peers, ip) {
            (Some(nets), Some(ip)) => nets.iter().any(|n| n.contains(ip)),
            _ => true,
        }
    }

    fn start_connection(&self, stream: Stream, peer: String) {
        let inner = &self.inner;
        let id = {
            let mut reg = inner.registry.lock();
            if inner.shutting_down.load(Ordering::SeqCst) {
                return;
            }
            if reg.connections.len() >= inner.config.connections_max {
                tracing::warn!(%peer, max = inner.config.connections_max, "too many connections; closing new one");
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
        Counters::add(&inner.counters.connections_open, 1);
        Counters::add(&inner.counters.connections_total, 1);
        let inner2 = Arc::clone(inner);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                tracing::info!(conn = id, %peer, "connection opened");
                connection(&inner2, id, stream, &peer);
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
        Counters::sub(&self.counters.connections_open, 1);
        self.changed.notify_all();
    }
}

impl ShutdownHandle {
    /// Stop accepting, finish dispatched requests, close every connection;
    /// returns when all of that is done. Idempotent.
    pub fn shutdown(&self) {
        let inner = &self.inner;
        let mut reg = inner.registry.lock();
        if !inner.shutting_down.swap(true, Ordering::SeqCst) {
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
        self.inner.shutting_down.load(Ordering::SeqCst)
    }
}

/// State of one connection shared between its reader and the workers.
struct Conn {
    id: u64,
    device: Arc<dyn BlockDevice>,
    structured: bool,
    read_holes: bool,
    writer: Mutex<Stream>,
    /// Replies waiting for the writer, with the in-flight cost each frees.
    pending: Mutex<VecDeque<(Vec<u8>, Option<u64>)>>,
    broken: AtomicBool,
    in_flight: Mutex<InFlight>,
    room: Condvar,
    counters: Arc<Counters>,
}

#[derive(Default)]
struct InFlight {
    bytes: u64,
    requests: u32,
}

impl Conn {
    /// Queue one whole reply and, unless another thread is already
    /// writing to this socket, write out everything queued. At most one
    /// thread per connection blocks on the socket; the others return at
    /// once. `cost_bytes` (for dispatched requests) is released when the
    /// reply has been written or dropped, so queued replies count against
    /// the in-flight budget. After a write error (or a client that stops
    /// reading for `send_timeout`) the connection is dead: later replies
    /// are dropped and the reader is woken by the shutdown.
    fn send(&self, bytes: Vec<u8>, cost_bytes: Option<u64>) {
        self.pending.lock().push_back((bytes, cost_bytes));
        loop {
            let Some(mut w) = self.writer.try_lock() else {
                return; // the holder drains our reply too
            };
            loop {
                let Some((b, cost)) = self.pending.lock().pop_front() else {
                    break;
                };
                if !self.broken.load(Ordering::Relaxed) {
                    if let Err(e) = w.write_all(&b) {
                        self.broken.store(true, Ordering::Relaxed);
                        tracing::info!(conn = self.id, error = %e, "cannot send reply; closing connection");
                        w.shutdown(Shutdown::Both);
                    }
                }
                if let Some(c) = cost {
                    self.release(c);
                }
            }
            drop(w);
            // A reply queued after our last pop but before the unlock
            // found the lock taken: go round again for it.
            if self.pending.lock().is_empty() {
                return;
            }
        }
    }

    fn admit(&self, cost_bytes: u64, bytes_max: u64, requests_max: u32) {
        let mut f = self.in_flight.lock();
        while f.requests > 0 && (f.requests >= requests_max || f.bytes + cost_bytes > bytes_max) {
            self.room.wait(&mut f);
        }
        f.bytes += cost_bytes;
        f.requests += 1;
        Counters::add(&self.counters.requests_in_flight, 1);
    }

    fn release(&self, cost_bytes: u64) {
        let mut f = self.in_flight.lock();
        assert!(
            f.requests > 0 && f.bytes >= cost_bytes,
            "in-flight accounting underflow"
        );
        f.bytes -= cost_bytes;
        f.requests -= 1;
        Counters::sub(&self.counters.requests_in_flight, 1);
        self.room.notify_all();
    }

    fn wait_idle(&self) {
        let mut f = self.in_flight.lock();
        while f.requests > 0 {
            self.room.wait(&mut f);
        }
    }
}

/// A validated request on its way to a worker.
struct Job {
    conn: Arc<Conn>,
    cookie: u64,
    command: Command,
    payload: Vec<u8>,
    cost_bytes: u64,
}

impl Queued for Job {
    /// A WRITE: CPU-bound in a compressing device, limited by
    /// `ServerConfig::write_workers`.
    fn is_write(&self) -> bool {
        matches!(self.command, Command::Write { .. })
    }
}

fn protocol_violation(inner: &Inner, id: u64, peer: &str, what: &str) {
    Counters::add(&inner.counters.protocol_errors, 1);
    tracing::warn!(conn = id, %peer, "protocol violation: {what}; closing connection");
}

/// Read exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream
/// before the first byte.
fn read_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The reader thread of one connection: handshake (with STARTTLS, the
/// rest of the connection runs over the TLS pump's plaintext stream),
/// then requests.
fn connection(inner: &Arc<Inner>, id: u64, stream: Stream, peer: &str) {
    let mut pump = None;
    if let Some((reader, writer, negotiated)) = negotiate(inner, id, stream, peer, &mut pump) {
        serve_connection(inner, id, reader, writer, negotiated, peer);
    }
    // Every handle of the plaintext end is closed by now: the pump sends
    // close_notify, flushes what the workers wrote, and ends.
    if let Some(p) = pump {
        p.join();
    }
}

fn handshake_failed(inner: &Inner, id: u64, peer: &str, e: HandshakeError) {
    match e {
        HandshakeError::Protocol(what) => protocol_violation(inner, id, peer, &what),
        HandshakeError::Io(e) => {
            if !inner.shutting_down.load(Ordering::SeqCst) {
                protocol_violation(inner, id, peer, &format!("handshake cut short: {e}"));
            }
        }
    }
}

/// Runs the option phase (and TLS, if the client asks for it) on `stream`;
/// on success returns the streams to use in transmission.
fn negotiate(
    inner: &Arc<Inner>,
    id: u64,
    stream: Stream,
    peer: &str,
    pump: &mut Option<tls::PumpHandle>,
) -> Option<(BufReader<Stream>, Stream, Negotiated)> {
    let policy = Policy {
        exports: &inner.exports,
        visible: &inner.visible,
        tls: inner.config.tls.as_ref().map(|t| t.mode()),
    };
    let mut stream = stream;
    let mut session = None;
    loop {
        let writer = match stream.try_clone() {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(conn = id, error = %e, "cannot clone socket");
                return None;
            }
        };
        if stream
            .set_read_timeout(inner.config.handshake_timeout)
            .is_err()
            || stream.set_write_timeout(inner.config.send_timeout).is_err()
        {
            return None;
        }
        let mut reader = BufReader::with_capacity(128 << 10, stream);
        let mut bw = BufWriter::new(writer);
        let s = match session {
            Some(s) => s,
            None => match handshake::greet(&mut reader, &mut bw) {
                Ok(s) => s,
                Err(e) => {
                    handshake_failed(inner, id, peer, e);
                    return None;
                }
            },
        };
        let negotiated = match handshake::options(&mut reader, &mut bw, &policy, s) {
            Ok(Outcome::Transmission(n)) => n,
            Ok(Outcome::Aborted) => {
                tracing::debug!(conn = id, "client ended the handshake");
                return None;
            }
            Ok(Outcome::StartTls) => {
                let Some(config) = inner.config.tls.as_ref() else {
                    unreachable!("STARTTLS acknowledged without TLS configured");
                };
                // The ACK is flushed; bytes read past it are TLS records.
                let buffered = reader.buffer().to_vec();
                drop(bw);
                let raw = reader.into_inner();
                match tls::accept(raw, &buffered, config, inner.config.send_timeout, id) {
                    Ok((plain, p)) => {
                        *pump = Some(p);
                        stream = plain;
                        session = Some(handshake::Session {
                            tls_active: true,
                            ..s
                        });
                        continue;
                    }
                    Err(e) => {
                        if !inner.shutting_down.load(Ordering::SeqCst) {
                            protocol_violation(
                                inner,
                                id,
                                peer,
                                &format!("TLS handshake failed: {e}"),
                            );
                        }
                        return None;
                    }
                }
            }
            Err(e) => {
                handshake_failed(inner, id, peer, e);
                return None;
            }
        };
        let writer = match bw.into_inner() {
            Ok(w) => w,
            Err(e) => {
                tracing::info!(conn = id, error = %e.error(), "cannot finish handshake");
                return None;
            }
        };
        if reader.get_ref().set_read_timeout(None).is_err() {
            return None;
        }
        let export = &inner.exports[negotiated.export_index];
        tracing::info!(
            conn = id,
            export = %export.name,
            structured = negotiated.structured,
            base_allocation = negotiated.base_allocation,
            tls = s.tls_active,
            "transmission started"
        );
        return Some((reader, writer, negotiated));
    }
}

/// Transmission on a negotiated connection, until it ends.
fn serve_connection(
    inner: &Arc<Inner>,
    id: u64,
    mut reader: BufReader<Stream>,
    writer: Stream,
    negotiated: Negotiated,
    peer: &str,
) {
    let export = &inner.exports[negotiated.export_index];
    let conn = Arc::new(Conn {
        id,
        device: Arc::clone(&export.device),
        structured: negotiated.structured,
        read_holes: inner.config.read_holes,
        writer: Mutex::new(writer),
        pending: Mutex::new(VecDeque::new()),
        broken: AtomicBool::new(false),
        in_flight: Mutex::new(InFlight::default()),
        room: Condvar::new(),
        counters: Arc::clone(&inner.counters),
    });
    transmission(inner, &conn, &mut reader, negotiated, peer);
    // DISC, end of stream, violation or shutdown: finish what was
    // dispatched, then close.
    conn.wait_idle();
    conn.writer.lock().shutdown(Shutdown::Both);
}

fn transmission<R: Read>(
    inner: &Inner,
    conn: &Arc<Conn>,
    r: &mut R,
    negotiated: Negotiated,
    peer: &str,
) {
    let id = conn.id;
    let ctx = RequestContext {
        size: conn.device.size(),
        read_only: conn.device.is_read_only(),
        structured: negotiated.structured,
        base_allocation: negotiated.base_allocation,
        can_fast_zero: conn.device.can_fast_zero(),
    };
    loop {
        if inner.shutting_down.load(Ordering::SeqCst) || conn.broken.load(Ordering::Relaxed) {
            return;
        }
        let mut hb = [0u8; REQUEST_HEADER_BYTES];
        match read_or_eof(r, &mut hb) {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(conn = id, "client closed without NBD_CMD_DISC");
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                if !inner.shutting_down.load(Ordering::SeqCst) {
                    protocol_violation(inner, id, peer, "truncated request header");
                }
                return;
            }
            Err(e) => {
                tracing::info!(conn = id, error = %e, "connection lost");
                return;
            }
        }
        let Some(h) = request::parse_header(&hb) else {
            protocol_violation(inner, id, peer, "bad request magic");
            return;
        };
        inner.counters.count_request(h.cmd);
        tracing::trace!(
            conn = id,
            cmd = command_name(h.cmd),
            offset = h.offset,
            len = h.length,
            "request"
        );
        let mut payload = Vec::new();
        match request::payload_of(&h) {
            Payload::None => {}
            Payload::Read(n) => {
                // Read into spare capacity: no zero-fill of up to 32 MiB.
                payload.reserve_exact(n);
                match r.take(n as u64).read_to_end(&mut payload) {
                    Ok(got) if got == n => {}
                    Ok(_) => {
                        protocol_violation(inner, id, peer, "truncated write payload");
                        return;
                    }
                    Err(e) => {
                        tracing::info!(conn = id, error = %e, "connection lost");
                        return;
                    }
                }
            }
            Payload::Discard(n) => match io::copy(&mut r.take(n), &mut io::sink()) {
                Ok(got) if got == n => {}
                _ => {
                    protocol_violation(inner, id, peer, "truncated oversized write payload");
                    return;
                }
            },
            Payload::Unskippable => {
                protocol_violation(
                    inner,
                    id,
                    peer,
                    &format!("write of {} bytes, too long to skip", h.length),
                );
                return;
            }
        }
        let command = match request::validate(&h, &ctx) {
            Ok(c) => c,
            Err(rej) => {
                Counters::add(&inner.counters.errors, 1);
                tracing::debug!(
                    conn = id,
                    cmd = command_name(h.cmd),
                    offset = h.offset,
                    len = h.length,
                    errno = rej.errno,
                    why = rej.why,
                    "request rejected"
                );
                conn.send(
                    reply::error(conn.structured, h.cookie, rej.errno, rej.why),
                    None,
                );
                continue;
            }
        };
        if command == Command::Disc {
            return;
        }
        let cost_bytes = match command {
            Command::Read { len, .. } | Command::Write { len, .. } => u64::from(len),
            _ => 0,
        };
        conn.admit(
            cost_bytes,
            inner.config.in_flight_bytes_max,
            inner.config.in_flight_requests_max,
        );
        let job = Job {
            conn: Arc::clone(conn),
            cookie: h.cookie,
            command,
            payload,
            cost_bytes,
        };
        if let Err(job) = inner.jobs.push(job) {
            // Workers gone: cannot happen while `inner` lives; answer anyway.
            conn.send(
                reply::error(conn.structured, job.cookie, ESHUTDOWN, "server stopping"),
                Some(job.cost_bytes),
            );
        }
    }
}

/// Run one request on the device and send its reply (worker side).
fn run_job(mut job: Job) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| execute(&mut job)));
    let conn = &job.conn;
    let bytes = match result {
        Ok(bytes) => bytes,
        Err(_) => {
            tracing::error!(conn = conn.id, "device panicked; answering EIO");
            Counters::add(&conn.counters.errors, 1);
            reply::error(conn.structured, job.cookie, EIO, "internal error")
        }
    };
    conn.send(bytes, Some(job.cost_bytes));
}

fn execute(job: &mut Job) -> Vec<u8> {
    let conn = &job.conn;
    let dev = &*conn.device;
    let cookie = job.cookie;
    let fail = |what: &str, e: io::Error| {
        let errno = request::errno_for(&e);
        Counters::add(&conn.counters.errors, 1);
        tracing::warn!(conn = conn.id, error = %e, errno, "{what} failed");
        reply::error(conn.structured, cookie, errno, what)
    };
    let done = |r: io::Result<()>, what: &str| match r {
        Ok(()) => reply::simple(cookie, 0),
        Err(e) => fail(what, e),
    };
    match job.command {
        Command::Read { offset, len } => {
            if conn.structured && conn.read_holes {
                if let Ok(ext) = dev.block_status(offset, u64::from(len)) {
                    if matches!(ext.first(), Some(&(l, true)) if l >= u64::from(len)) {
                        Counters::add(&conn.counters.bytes_read, u64::from(len));
                        return reply::offset_hole(cookie, offset, len);
                    }
                }
            }
            let mut r = reply::ReadReply::new(conn.structured, cookie, offset, len);
            match dev.read_at(offset, r.data_mut()) {
                Ok(()) => {
                    Counters::add(&conn.counters.bytes_read, u64::from(len));
                    r.into_bytes()
                }
                Err(e) => fail("read", e),
            }
        }
        Command::Write { offset, len, fua } => {
            debug_assert_eq!(job.payload.len(), len as usize);
            let r = dev.write_owned(offset, std::mem::take(&mut job.payload), fua);
            if r.is_ok() {
                Counters::add(&conn.counters.bytes_written, u64::from(len));
            }
            done(r, "write")
        }
        Command::Flush => done(dev.flush(), "flush"),
        Command::Trim { offset, len, fua } => done(dev.trim(offset, len, fua), "trim"),
        Command::WriteZeroes {
            offset,
            len,
            may_trim,
            fua,
        } => done(dev.write_zeroes(offset, len, may_trim, fua), "write_zeroes"),
        Command::BlockStatus {
            offset,
            len,
            req_one,
        } => match dev.block_status(offset, len) {
            Ok(ext) => reply::block_status(
                cookie,
                META_BASE_ALLOCATION_ID,
                &reply::block_status_extents(&ext, len, req_one),
            ),
            Err(e) => fail("block_status", e),
        },
        Command::Disc => unreachable!("DISC is handled by the reader"),
    }
}

#[cfg(test)]
mod tests {
    use super::{JobQueue, Queued};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[derive(Debug, PartialEq)]
    struct T(&'static str, bool);
    impl Queued for T {
        fn is_write(&self) -> bool {
            self.1
        }
    }

    #[test]
    fn reads_pass_writes_waiting_for_a_slot() {
        let q = JobQueue::new(1);
        for j in [T("w1", true), T("w2", true), T("r1", false), T("w3", true)] {
            q.push(j).unwrap();
        }
        assert_eq!(q.pop(), Some(T("w1", true)));
        // The one write slot is taken: the read behind w2 goes first.
        assert_eq!(q.pop(), Some(T("r1", false)));
        q.write_done();
        assert_eq!(q.pop(), Some(T("w2", true)));
        q.write_done();
        q.close();
        assert_eq!(q.pop(), Some(T("w3", true)), "closing drains the queue");
        q.write_done();
        assert_eq!(q.pop(), None);
        assert!(q.push(T("late", false)).is_err());
    }

    /// Many workers, many writes and reads: every job runs once, never more
    /// than the slots' worth of writes at a time, and nobody sleeps through
    /// a freed slot (the test would hang).
    #[test]
    fn workers_never_exceed_the_write_slots_nor_stall() {
        let q = Arc::new(JobQueue::<T>::new(2));
        let running = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (q, running, ran) = (q.clone(), running.clone(), ran.clone());
                std::thread::spawn(move || {
                    while let Some(j) = q.pop() {
                        if j.is_write() {
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= 2, "{now} writes at once");
                            std::thread::yield_now();
                            running.fetch_sub(1, Ordering::SeqCst);
                            q.write_done();
                        }
                        ran.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for i in 0..20_000 {
            q.push(T("j", i % 3 != 0)).unwrap();
        }
        q.close();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 20_000);
    }
}
