//! A structured READ asks the device once: `read_or_hole` reads and tells
//! whether the range is all hole, so a device that looks the range up for
//! its read anyway (squeeze's map) does not walk it twice (issue 14). A
//! device without its own `read_or_hole` gets the default, which asks
//! `block_status` first, as the server did before.

mod common;

use common::*;
use squeeze_nbd::device::{BlockDevice, MemDevice};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const SIZE: u64 = 1 << 20;

/// A MemDevice that counts the lookups the server makes, and answers
/// `read_or_hole` itself when `own` is set.
struct Counting {
    mem: MemDevice,
    own: bool,
    block_status: AtomicU64,
    read_or_hole: AtomicU64,
}

impl BlockDevice for Counting {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.mem.read_at(offset, buf)
    }
    fn read_or_hole(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        self.read_or_hole.fetch_add(1, Ordering::Relaxed);
        if !self.own {
            // What the trait's default does.
            let ext = self.block_status(offset, buf.len() as u64)?;
            if matches!(ext.first(), Some(&(l, true)) if l >= buf.len() as u64) {
                buf.fill(0);
                return Ok(true);
            }
            return self.mem.read_at(offset, buf).map(|()| false);
        }
        self.mem.read_at(offset, buf)?;
        Ok(buf.iter().all(|&b| b == 0))
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
        self.block_status.fetch_add(1, Ordering::Relaxed);
        self.mem.block_status(offset, len)
    }
}

fn reads(own: bool) -> Arc<Counting> {
    let dev = Arc::new(Counting {
        mem: MemDevice::new(SIZE),
        own,
        block_status: AtomicU64::new(0),
        read_or_hole: AtomicU64::new(0),
    });
    let srv = TestServer::start(vec![export("c", dev.clone())]);
    let mut c = srv.client();
    c.handshake("c", true, true);
    assert_eq!(c.write(8192, &[7u8; 4096]), 0);
    // A hole: one OFFSET_HOLE chunk.
    c.send_request(CMD_READ, 0, 1, 0, 4096, &[]);
    let Reply::Chunk(ch) = c.reply(None) else {
        panic!("chunk expected")
    };
    assert_eq!(ch.kind, REPLY_TYPE_OFFSET_HOLE);
    // Data.
    assert_eq!(c.read(8192, 4096).unwrap(), vec![7u8; 4096]);
    assert_eq!(c.read(4096, 3 * 4096).unwrap()[4096..8192], [7u8; 4096]);
    c.disconnect();
    dev
}

#[test]
fn a_structured_read_is_one_device_lookup() {
    let dev = reads(true);
    assert_eq!(dev.read_or_hole.load(Ordering::Relaxed), 3);
    assert_eq!(
        dev.block_status.load(Ordering::Relaxed),
        0,
        "no block_status walk before the reads"
    );
}

#[test]
fn a_device_without_its_own_lookup_still_answers_holes() {
    let dev = reads(false);
    assert_eq!(dev.read_or_hole.load(Ordering::Relaxed), 3);
    assert_eq!(dev.block_status.load(Ordering::Relaxed), 3);
}
