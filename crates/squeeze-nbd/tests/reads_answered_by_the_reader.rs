//! Small READs are answered by the connection's reader itself when the
//! device can without waiting (`BlockDevice::try_read_cached`), and by a
//! worker when it cannot: the client sees the same bytes, holes and errors
//! either way, and `reads_inline` counts the ones the reader answered.

mod common;

use common::*;
use squeeze_nbd::device::{BlockDevice, MemDevice};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const SIZE: u64 = 4 << 20;
/// A sector whose reads fail (inline or not).
const BAD: u64 = 1 << 20;

/// A MemDevice that answers every other `try_read_cached` and declines the
/// rest, fails any read of `BAD`, and counts what the server asked.
struct Picky {
    mem: MemDevice,
    tries: AtomicU64,
    answered: AtomicU64,
    blocking: AtomicU64,
}

fn fails(offset: u64, len: usize) -> bool {
    offset <= BAD && BAD < offset + len as u64
}

impl BlockDevice for Picky {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_or_hole(offset, buf).map(|_| ())
    }
    fn read_or_hole(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        self.blocking.fetch_add(1, Ordering::Relaxed);
        if fails(offset, buf.len()) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.mem.read_or_hole(offset, buf)
    }
    fn try_read_cached(&self, offset: u64, buf: &mut [u8]) -> Option<io::Result<bool>> {
        if self.tries.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
            return None;
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
        if fails(offset, buf.len()) {
            return Some(Err(io::Error::from_raw_os_error(libc::EIO)));
        }
        self.mem.try_read_cached(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.mem.write_at(offset, data, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.mem.flush()
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

fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((offset + i) * 7 % 251) as u8)
        .collect()
}

#[test]
fn reads_answered_inline_or_by_a_worker_are_the_same() {
    for structured in [false, true] {
        let dev = Arc::new(Picky {
            mem: MemDevice::new(SIZE),
            tries: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            blocking: AtomicU64::new(0),
        });
        let srv = TestServer::start(vec![export("p", dev.clone())]);
        let mut c = srv.client();
        c.handshake("p", structured, false);
        // Data in the first 512 KiB, a hole after it.
        assert_eq!(c.write(0, &pattern(0, 512 << 10)), 0);
        let before = srv.server.stats().reads_inline;
        let mut small = 0;
        for (offset, len) in [
            (0u64, 4096u32),
            (4096, 4096),
            (12_288, 8192),
            (100_000, 1000),
            (500 << 10, 24 << 10), // data, then the hole
            (2 << 20, 4096),       // all hole
            (3 << 20, 32 << 10),
            (0, 64 << 10), // above the inline limit: a worker's
            (7, 5),
        ] {
            let got = c.read(offset, len).expect("read");
            let mut want = if offset < 512 << 10 {
                pattern(offset, len as usize)
            } else {
                vec![0; len as usize]
            };
            let data_end = (512u64 << 10).saturating_sub(offset).min(u64::from(len)) as usize;
            want[data_end..].fill(0);
            assert_eq!(
                got, want,
                "read of {len} at {offset} (structured {structured})"
            );
            if len <= 32 << 10 {
                small += 1;
            }
        }
        // A failed read is an error, tried inline (the first, answered) and
        // by a worker (the second, declined).
        assert_eq!(c.read(BAD, 4096), Err(libc::EIO as u32));
        assert_eq!(c.read(BAD - 4096, 8192), Err(libc::EIO as u32));
        small += 2;
        c.disconnect();
        let tries = dev.tries.load(Ordering::Relaxed);
        let answered = dev.answered.load(Ordering::Relaxed);
        assert_eq!(tries, small, "only reads up to 32 KiB are tried inline");
        assert_eq!(answered, small.div_ceil(2));
        assert_eq!(
            srv.server.stats().reads_inline - before,
            answered,
            "every answer the device gave was sent"
        );
        // The declined ones and the large one went to a worker.
        assert_eq!(dev.blocking.load(Ordering::Relaxed), tries - answered + 1);
    }
}

/// `inline_reads: false` (`serve --no-inline-reads`): every READ goes to a
/// worker; the device is never asked to answer one on the spot.
#[test]
fn without_inline_reads_the_workers_read() {
    let dev = Arc::new(Picky {
        mem: MemDevice::new(SIZE),
        tries: AtomicU64::new(0),
        answered: AtomicU64::new(0),
        blocking: AtomicU64::new(0),
    });
    let config = squeeze_nbd::ServerConfig {
        inline_reads: false,
        ..Default::default()
    };
    let srv = TestServer::start_with(vec![export("p", dev.clone())], config);
    let mut c = srv.client();
    c.handshake("p", true, false);
    assert_eq!(c.write(0, &pattern(0, 8192)), 0);
    for k in 0..4u64 {
        assert_eq!(c.read(k * 1024, 4096).unwrap(), pattern(k * 1024, 4096));
    }
    c.disconnect();
    assert_eq!(dev.tries.load(Ordering::Relaxed), 0);
    assert_eq!(dev.blocking.load(Ordering::Relaxed), 4);
    assert_eq!(srv.server.stats().reads_inline, 0);
}
