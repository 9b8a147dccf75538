//! Many connections and the server's life cycle: writes on one connection
//! and a flush on another are visible to both (CAN_MULTI_CONN); the
//! in-flight byte budget bounds concurrent device calls; shutdown lets
//! dispatched requests finish and reply, then closes everything and
//! returns; TCP works like Unix; the Unix socket is mode 0600.

mod common;

use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use squeeze_nbd::{BlockDevice, Listener, MemDevice, Server, ServerConfig};

#[test]
fn writes_on_one_connection_flush_on_another() {
    let (srv, _dev) = TestServer::mem(1 << 20);
    let mut a = srv.client();
    let mut b = srv.client();
    let (_, flags) = a.handshake("mem", false, false);
    assert_eq!(flags & FLAG_CAN_MULTI_CONN, FLAG_CAN_MULTI_CONN);
    b.handshake("", true, true);
    assert_eq!(a.write(4096, b"from a"), 0);
    assert_eq!(b.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0);
    assert_eq!(b.read(4096, 6).unwrap(), b"from a");
    assert_eq!(a.read(4096, 6).unwrap(), b"from a");
    assert_eq!(srv.server.stats().connections_open, 2);
    a.disconnect();
    b.disconnect();
    let st = srv.server.stats();
    assert_eq!(st.connections_total, 2);
    assert_eq!(st.requests.disc, 2);
}

/// A MemDevice whose writes take a while and which records how many
/// bytes were inside `write_at` at once.
struct SlowDevice {
    mem: MemDevice,
    delay: Duration,
    inside_bytes: AtomicU64,
    inside_bytes_max: AtomicU64,
    writes_done: AtomicU64,
}

impl SlowDevice {
    fn new(delay: Duration) -> SlowDevice {
        SlowDevice {
            mem: MemDevice::new(1 << 30),
            delay,
            inside_bytes: AtomicU64::new(0),
            inside_bytes_max: AtomicU64::new(0),
            writes_done: AtomicU64::new(0),
        }
    }
}

impl BlockDevice for SlowDevice {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.mem.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let n = data.len() as u64;
        let now = self.inside_bytes.fetch_add(n, Ordering::SeqCst) + n;
        self.inside_bytes_max.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        let r = self.mem.write_at(offset, data, fua);
        self.inside_bytes.fetch_sub(n, Ordering::SeqCst);
        self.writes_done.fetch_add(1, Ordering::SeqCst);
        r
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        self.mem.trim(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, fua: bool) -> io::Result<()> {
        self.mem.write_zeroes(offset, len, may_trim, fua)
    }
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        self.mem.block_status(offset, len)
    }
}

#[test]
fn in_flight_bytes_are_bounded() {
    let dev = Arc::new(SlowDevice::new(Duration::from_millis(30)));
    let config = ServerConfig {
        workers: 16,
        in_flight_bytes_max: 32 << 20,
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(vec![export("mem", dev.clone())], config);
    let mut c = srv.client();
    c.handshake("mem", false, false);
    let mut w = c.s.try_clone().unwrap();
    let chunk = vec![0x42u8; 8 << 20];
    let sender = std::thread::spawn(move || {
        for i in 0..16u64 {
            let mut b = Client::request_bytes(CMD_WRITE, 0, i, i * (8 << 20), 8 << 20);
            b.extend_from_slice(&chunk);
            w.write_all(&b).unwrap();
        }
    });
    for _ in 0..16 {
        assert_eq!(c.reply(None).errno(), 0);
    }
    sender.join().unwrap();
    let max = dev.inside_bytes_max.load(Ordering::SeqCst);
    assert!(max <= 32 << 20, "{max} bytes in flight, budget 32 MiB");
    assert!(max >= 16 << 20, "requests should overlap ({max})");
    c.disconnect();
}

#[test]
fn shutdown_finishes_in_flight_requests() {
    let dev = Arc::new(SlowDevice::new(Duration::from_millis(100)));
    let mut srv = TestServer::start(vec![export("mem", dev.clone())]);
    let mut c = srv.client();
    c.handshake("mem", true, false);
    for i in 0..8u64 {
        c.send_request(CMD_WRITE, 0, i, i * 4096, 4096, &[i as u8; 4096]);
    }
    // Once the reader has dispatched all eight, stop the server.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while srv.server.stats().requests_in_flight + dev.writes_done.load(Ordering::SeqCst) < 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "requests not dispatched"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    srv.shutdown();
    assert_eq!(dev.writes_done.load(Ordering::SeqCst), 8);
    let mut seen = 0;
    for _ in 0..8 {
        assert_eq!(c.reply(None).errno(), 0);
        seen += 1;
    }
    assert_eq!(seen, 8);
    assert!(c.is_closed_by_server());
    assert_eq!(srv.server.stats().connections_open, 0);
    // Nobody listens any more, and the socket file is gone.
    assert!(!srv.socket.exists());
}

#[test]
fn tcp_listener_and_socket_mode() {
    let dev = Arc::new(MemDevice::new(1 << 20));
    let server = Server::new(vec![export("mem", dev)]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let unix = Listener::bind_unix(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // A live socket is not stolen.
    assert!(Listener::bind_unix(&path).is_err());
    let tcp = Listener::bind_tcp("127.0.0.1:0").unwrap();
    let addr = tcp.describe();
    let (s1, s2) = (server.clone(), server.clone());
    let t1 = std::thread::spawn(move || s1.serve(unix));
    let t2 = std::thread::spawn(move || s2.serve(tcp));

    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(be64(&g), NBDMAGIC);
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    let mut opt = IHAVEOPT.to_be_bytes().to_vec();
    opt.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    opt.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&opt).unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(be64(&r), 1 << 20);
    let mut req = Client::request_bytes(CMD_WRITE, CMD_FLAG_FUA, 9, 0, 3);
    req.extend_from_slice(b"tcp");
    s.write_all(&req).unwrap();
    let mut rep = [0u8; 16];
    s.read_exact(&mut rep).unwrap();
    assert_eq!(
        (be32(&rep), be32(&rep[4..]), be64(&rep[8..])),
        (SIMPLE_REPLY_MAGIC, 0, 9)
    );

    // Shutdown with a connection open: both accept loops return.
    server.shutdown_handle().shutdown();
    t1.join().unwrap().unwrap();
    t2.join().unwrap().unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty());
    assert!(!path.exists());
}
