//! The workers' write slots are what the exported devices declare in
//! `BlockDevice::max_concurrent_writes` (the smallest of them), unless
//! `ServerConfig::write_workers` overrides it; and no more WRITEs than
//! that run on a device at once, however many a client pipelines.

mod common;

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use squeeze_nbd::{BlockDevice, MemDevice, Server, ServerConfig};

/// A MemDevice that declares `slots` concurrent writes and records how
/// many of its writes ever ran at once (each write lingers a little so
/// that pipelined ones overlap).
struct SlotDevice {
    inner: MemDevice,
    slots: usize,
    running: AtomicUsize,
    peak: AtomicUsize,
}

impl SlotDevice {
    fn new(slots: usize) -> SlotDevice {
        SlotDevice {
            inner: MemDevice::new(1 << 20),
            slots,
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }
}

impl BlockDevice for SlotDevice {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(150));
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.inner.write_at(offset, data, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        self.inner.trim(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, fua: bool) -> io::Result<()> {
        self.inner.write_zeroes(offset, len, may_trim, fua)
    }
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        self.inner.block_status(offset, len)
    }
    fn max_concurrent_writes(&self) -> usize {
        self.slots
    }
}

/// Pipelines `n` WRITEs on one connection and waits for every reply.
fn pipelined_writes(srv: &TestServer, name: &str, n: u64) {
    let mut c = srv.client();
    c.handshake(name, false, false);
    for i in 0..n {
        c.send_request(CMD_WRITE, 0, i, i * 4096, 4096, &[i as u8; 4096]);
    }
    for _ in 0..n {
        assert_eq!(c.reply(None).errno(), 0);
    }
    c.disconnect();
}

fn config(workers: usize, write_workers: Option<usize>) -> ServerConfig {
    ServerConfig {
        workers,
        write_workers,
        ..ServerConfig::default()
    }
}

#[test]
fn the_queue_uses_what_the_device_declares() {
    let dev = Arc::new(SlotDevice::new(2));
    let srv = TestServer::start_with(vec![export("d", dev.clone())], config(16, None));
    assert_eq!(srv.server.write_slots(), 2);
    pipelined_writes(&srv, "d", 8);
    assert_eq!(dev.peak.load(Ordering::SeqCst), 2, "writes at once");
}

#[test]
fn write_workers_overrides_the_declaration() {
    let dev = Arc::new(SlotDevice::new(2));
    let srv = TestServer::start_with(vec![export("d", dev.clone())], config(16, Some(3)));
    assert_eq!(srv.server.write_slots(), 3);
    pipelined_writes(&srv, "d", 9);
    assert_eq!(dev.peak.load(Ordering::SeqCst), 3, "writes at once");
}

#[test]
fn slots_are_the_smallest_declaration_at_most_the_workers() {
    let mem = || Arc::new(MemDevice::new(4096)) as Arc<dyn BlockDevice>;
    // A plain device declares nothing: every worker may write.
    let s = Server::with_config(vec![export("m", mem())], config(16, None)).unwrap();
    assert_eq!(s.write_slots(), 16);
    // The slots are shared by the server: the smallest declaration wins.
    let exports = vec![
        export("m", mem()),
        export("a", Arc::new(SlotDevice::new(6))),
        export("b", Arc::new(SlotDevice::new(4))),
    ];
    let s = Server::with_config(exports, config(16, None)).unwrap();
    assert_eq!(s.write_slots(), 4);
    // Never more than the workers, never fewer than one.
    let s = Server::with_config(
        vec![export("a", Arc::new(SlotDevice::new(64)))],
        config(8, None),
    )
    .unwrap();
    assert_eq!(s.write_slots(), 8);
    let s = Server::with_config(
        vec![export("a", Arc::new(SlotDevice::new(0)))],
        config(8, None),
    )
    .unwrap();
    assert_eq!(s.write_slots(), 1);
    // An override of zero is a configuration error, as it always was.
    assert!(Server::with_config(vec![export("m", mem())], config(8, Some(0))).is_err());
}
