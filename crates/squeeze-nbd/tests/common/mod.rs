//! Shared test harness: a real server on a Unix socket in a temp dir, a
//! hand-written protocol client, a fault-injecting device, and the
//! skip-or-fail rule for missing client tools.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use squeeze_nbd::proto::*;
use squeeze_nbd::{BlockDevice, Export, Listener, MemDevice, Server, ServerConfig, ShutdownHandle};

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// A server running in-process on a Unix socket in a temp dir; shut down
/// (and checked to stop) on drop.
pub struct TestServer {
    pub server: Server,
    pub socket: PathBuf,
    stop: ShutdownHandle,
    thread: Option<JoinHandle<io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub fn start(exports: Vec<Export>) -> TestServer {
        TestServer::start_with(exports, ServerConfig::default())
    }

    pub fn start_with(exports: Vec<Export>, config: ServerConfig) -> TestServer {
        init_tracing();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nbd.sock");
        let listener = Listener::bind_unix(&socket).unwrap();
        let server = Server::with_config(exports, config).unwrap();
        let stop = server.shutdown_handle();
        let s2 = server.clone();
        let thread = std::thread::spawn(move || s2.serve(listener));
        TestServer {
            server,
            socket,
            stop,
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// One MemDevice export named "mem".
    pub fn mem(size_bytes: u64) -> (TestServer, Arc<MemDevice>) {
        let dev = Arc::new(MemDevice::new(size_bytes));
        let s = TestServer::start(vec![export("mem", dev.clone())]);
        (s, dev)
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    pub fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    pub fn client(&self) -> Client {
        Client { s: self.connect() }
    }

    pub fn shutdown(&mut self) {
        self.stop.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub fn export(name: &str, device: Arc<dyn BlockDevice>) -> Export {
    Export {
        name: name.to_string(),
        description: format!("test export {name}"),
        device,
    }
}

/// A protocol client written from the spec, byte by byte, so tests can
/// also send what a polite client never would.
pub struct Client {
    pub s: UnixStream,
}

pub struct OptReply {
    pub opt: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

pub struct Chunk {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub payload: Vec<u8>,
}

pub enum Reply {
    Simple { errno: u32, cookie: u64 },
    Chunk(Chunk),
}

impl Reply {
    pub fn cookie(&self) -> u64 {
        match self {
            Reply::Simple { cookie, .. } => *cookie,
            Reply::Chunk(c) => c.cookie,
        }
    }

    /// The errno carried (0 for success).
    pub fn errno(&self) -> u32 {
        match self {
            Reply::Simple { errno, .. } => *errno,
            Reply::Chunk(c) if c.kind == REPLY_TYPE_ERROR => be32(&c.payload[0..4]),
            Reply::Chunk(_) => 0,
        }
    }
}

pub fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
pub fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

/// Payload of NBD_OPT_GO / NBD_OPT_INFO.
pub fn go_payload(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// Payload of NBD_OPT_{LIST,SET}_META_CONTEXT.
pub fn meta_payload(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

impl Client {
    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).unwrap();
        b
    }

    /// Reads the 18-byte greeting and checks it.
    pub fn greeting(&mut self) -> u16 {
        let g = self.read_n(18);
        assert_eq!(be64(&g[0..8]), NBDMAGIC);
        assert_eq!(be64(&g[8..16]), IHAVEOPT);
        be16(&g[16..18])
    }

    /// Greeting plus client flags (fixed newstyle, no zeroes).
    pub fn start(&mut self) {
        let flags = self.greeting();
        assert_eq!(flags, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        self.s
            .write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
    }

    pub fn send_option(&mut self, opt: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    pub fn opt_reply(&mut self) -> OptReply {
        let h = self.read_n(20);
        assert_eq!(be64(&h[0..8]), OPT_REPLY_MAGIC);
        let len = be32(&h[16..20]) as usize;
        OptReply {
            opt: be32(&h[8..12]),
            kind: be32(&h[12..16]),
            data: self.read_n(len),
        }
    }

    /// Replies to one option, up to and including ACK or an error.
    pub fn opt_replies(&mut self) -> Vec<OptReply> {
        let mut v = Vec::new();
        loop {
            let r = self.opt_reply();
            let last = r.kind == REP_ACK || r.kind & (1 << 31) != 0;
            v.push(r);
            if last {
                return v;
            }
        }
    }

    /// Full handshake to transmission: returns (size, transmission flags).
    pub fn handshake(&mut self, name: &str, structured: bool, base_allocation: bool) -> (u64, u16) {
        self.start();
        if structured {
            self.send_option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(self.opt_replies().last().unwrap().kind, REP_ACK);
        }
        if base_allocation {
            self.send_option(
                OPT_SET_META_CONTEXT,
                &meta_payload(name, &[META_BASE_ALLOCATION]),
            );
            let r = self.opt_replies();
            assert_eq!(r.len(), 2);
            assert_eq!(r[0].kind, REP_META_CONTEXT);
        }
        self.send_option(OPT_GO, &go_payload(name, &[]));
        let mut size_flags = None;
        for r in self.opt_replies() {
            assert!(
                r.kind == REP_INFO || r.kind == REP_ACK,
                "GO refused: {:#x}",
                r.kind
            );
            if r.kind == REP_INFO && be16(&r.data) == INFO_EXPORT {
                size_flags = Some((be64(&r.data[2..10]), be16(&r.data[10..12])));
            }
        }
        size_flags.expect("NBD_INFO_EXPORT")
    }

    pub fn request_bytes(cmd: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&cmd.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    }

    pub fn send_request(
        &mut self,
        cmd: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        data: &[u8],
    ) {
        let mut b = Client::request_bytes(cmd, flags, cookie, offset, len);
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    /// Reads one reply; for a simple reply to a READ, pass `read_len` to
    /// get the data as well (returned in a synthetic OFFSET_DATA chunk
    /// when it succeeded).
    pub fn reply(&mut self, read_len: Option<usize>) -> Reply {
        let m = be32(&self.read_n(4));
        if m == SIMPLE_REPLY_MAGIC {
            let h = self.read_n(12);
            let errno = be32(&h[0..4]);
            let cookie = be64(&h[4..12]);
            if let (0, Some(n)) = (errno, read_len) {
                let data = self.read_n(n);
                let mut payload = 0u64.to_be_bytes().to_vec();
                payload.extend_from_slice(&data);
                return Reply::Chunk(Chunk {
                    flags: REPLY_FLAG_DONE,
                    kind: REPLY_TYPE_OFFSET_DATA,
                    cookie,
                    payload,
                });
            }
            Reply::Simple { errno, cookie }
        } else {
            assert_eq!(m, STRUCTURED_REPLY_MAGIC, "bad reply magic");
            let h = self.read_n(16);
            let len = be32(&h[12..16]) as usize;
            Reply::Chunk(Chunk {
                flags: be16(&h[0..2]),
                kind: be16(&h[2..4]),
                cookie: be64(&h[4..12]),
                payload: self.read_n(len),
            })
        }
    }

    /// READ returning the bytes (simple or structured, data or hole).
    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        self.send_request(CMD_READ, 0, 0xdead, offset, len, &[]);
        match self.reply(Some(len as usize)) {
            Reply::Chunk(c) if c.kind == REPLY_TYPE_OFFSET_DATA => {
                assert_eq!(c.flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
                Ok(c.payload[8..].to_vec())
            }
            Reply::Chunk(c) if c.kind == REPLY_TYPE_OFFSET_HOLE => {
                assert_eq!(be64(&c.payload[0..8]), offset);
                assert_eq!(be32(&c.payload[8..12]), len);
                Ok(vec![0u8; len as usize])
            }
            r => Err(r.errno()),
        }
    }

    /// A command without read data; returns the errno (0 = success).
    pub fn cmd(&mut self, cmd: u16, flags: u16, offset: u64, len: u32, data: &[u8]) -> u32 {
        self.send_request(cmd, flags, 0xbeef, offset, len, data);
        let r = self.reply(None);
        assert_eq!(r.cookie(), 0xbeef);
        r.errno()
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.cmd(CMD_WRITE, 0, offset, data.len() as u32, data)
    }

    pub fn disconnect(mut self) {
        self.send_request(CMD_DISC, 0, 0, 0, 0, &[]);
        let mut rest = Vec::new();
        // The server closes after DISC: end of stream, nothing more.
        let _ = self.s.read_to_end(&mut rest);
        assert!(rest.is_empty());
    }

    /// True once the server has closed the connection.
    pub fn is_closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

/// A device that fails every operation with the configured error while
/// `failing` is set; otherwise a MemDevice.
pub struct FaultyDevice {
    pub inner: MemDevice,
    pub failing: AtomicBool,
    pub kind: parking_lot::Mutex<io::ErrorKind>,
}

impl FaultyDevice {
    pub fn new(size: u64) -> FaultyDevice {
        FaultyDevice {
            inner: MemDevice::new(size),
            failing: AtomicBool::new(false),
            kind: parking_lot::Mutex::new(io::ErrorKind::Other),
        }
    }

    pub fn fail_with(&self, kind: Option<io::ErrorKind>) {
        if let Some(k) = kind {
            *self.kind.lock() = k;
        }
        self.failing.store(kind.is_some(), Ordering::SeqCst);
    }

    fn check(&self) -> io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            Err(io::Error::new(*self.kind.lock(), "injected fault"))
        } else {
            Ok(())
        }
    }
}

impl BlockDevice for FaultyDevice {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check()?;
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.check()?;
        self.inner.write_at(offset, data, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.check()?;
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        self.check()?;
        self.inner.trim(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, fua: bool) -> io::Result<()> {
        self.check()?;
        self.inner.write_zeroes(offset, len, may_trim, fua)
    }
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        self.check()?;
        self.inner.block_status(offset, len)
    }
    fn can_fast_zero(&self) -> bool {
        false
    }
}

/// Whether a client tool is installed. Missing: a loud skip line, or a
/// panic under CI=true.
pub fn have_tool(tool: &str) -> bool {
    let found = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{tool} not installed and CI=true: client tests must run");
        }
        eprintln!("SKIPPED: {tool} not installed");
    }
    found
}

/// Run a command, panic with its output unless it succeeds; returns stdout.
pub fn run(cmd: &mut std::process::Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A command for `tool` that is killed if it runs over five minutes.
pub fn timed(tool: &str) -> std::process::Command {
    let mut c = std::process::Command::new("timeout");
    c.arg("300").arg(tool);
    c
}

/// Deterministic test data mixing compressible text, random bytes and
/// zero runs, `len` bytes long.
pub fn mixed_data(len: usize, seed: u64) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(len);
    let mut block = 0u64;
    while v.len() < len {
        let n = (len - v.len()).min(64 << 10);
        match block % 4 {
            0 => v.extend((0..n).map(|i| b"squeeze nbd test line\n"[i % 22])),
            1 => v.extend((0..n).map(|_| rng.gen::<u8>())),
            2 => v.extend(std::iter::repeat_n(0u8, n)),
            _ => v.extend((0..n).map(|i| (i / 512) as u8)),
        }
        block += 1;
    }
    v
}
