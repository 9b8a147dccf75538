//! The block device an export serves, and `MemDevice`, a sparse in-memory one.
//!
//! Place in the data path: `server` (protocol only) -> **`BlockDevice`** ->
//! whatever the binary plugs in (the squeeze engine's volume, or `MemDevice`
//! in tests and examples). The NBD layer knows nothing of compression; the
//! device knows nothing of sockets.
//!
//! Contract: every request reaching a device has already been validated by
//! `request.rs`: `offset + len <= size()`, `len > 0`, reads and writes no
//! longer than the advertised maximum block size, no write to a read-only
//! device. Devices may therefore `debug_assert!` these and need not
//! re-check them. Errors are `io::Error`s; their `ErrorKind` decides the
//! errno the client sees (see `request::errno_for`).
//!
//! `MemDevice` invariants: a page is either absent (reads as zeros and is
//! reported as a hole) or present with exactly `MEM_PAGE_BYTES` bytes;
//! trim and hole-allowed zeroing remove every page they cover entirely and
//! zero the covered part of the others.

use std::collections::HashMap;
use std::io;

use parking_lot::RwLock;

/// A block device served over NBD. Implementations must be safe to call
/// from many worker threads at once; requests of one connection may run
/// concurrently and complete out of order.
pub trait BlockDevice: Send + Sync {
    /// Size in bytes; fixed for the life of a connection.
    fn size(&self) -> u64;
    /// Fill `buf` with the bytes at `[offset, offset + buf.len())`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Write `data` at `offset`; if `fua`, it must be durable on return.
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;
    /// [`BlockDevice::write_at`] with a buffer the device may keep (the
    /// server is done with a request's payload once it hands it over), so a
    /// device that needs owned data spares a copy.
    fn write_owned(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        self.write_at(offset, &data, fua)
    }
    /// [`BlockDevice::read_at`], telling whether the whole range is a hole
    /// (then a structured READ is answered with OFFSET_HOLE). The default
    /// asks `block_status` before reading; a device whose read looks the
    /// range up anyway should answer from that one lookup.
    fn read_or_hole(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        if let Ok(ext) = self.block_status(offset, buf.len() as u64) {
            if matches!(ext.first(), Some(&(l, true)) if l >= buf.len() as u64) {
                buf.fill(0);
                return Ok(true);
            }
        }
        self.read_at(offset, buf).map(|()| false)
    }
    /// [`BlockDevice::read_or_hole`] if it can answer without waiting
    /// (no disk, no lock held by a writer): the connection's reader answers
    /// small reads itself this way, sparing two thread switches each.
    /// None when it would have to wait: a worker then reads (`buf` is
    /// unspecified). The default never answers.
    fn try_read_cached(&self, offset: u64, buf: &mut [u8]) -> Option<io::Result<bool>> {
        let _ = (offset, buf);
        None
    }
    /// Make every write completed before this call durable.
    fn flush(&self) -> io::Result<()>;
    /// Discard `[offset, offset + len)`; later reads may return anything
    /// (MemDevice and squeeze return zeros).
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()>;
    /// Make `[offset, offset + len)` read as zeros; `may_trim` is the
    /// negation of NBD_CMD_FLAG_NO_HOLE (the range may become a hole).
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, fua: bool) -> io::Result<()>;
    /// Allocation status of [offset, offset+len): extents (length, is_hole_and_zero) covering at least the first byte; may stop early.
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>>;
    /// A read-only device refuses writes, trims and zeroing with EPERM
    /// before they reach it, and the export advertises NBD_FLAG_READ_ONLY.
    fn is_read_only(&self) -> bool {
        false
    }
    /// Whether `write_zeroes` is faster than writing zeros (NBD_CMD_FLAG_FAST_ZERO).
    fn can_fast_zero(&self) -> bool {
        true
    }
    /// The preferred I/O size advertised in NBD_INFO_BLOCK_SIZE.
    fn preferred_block_size(&self) -> u32 {
        4096
    }
    /// WRITE requests this device wants run at once. A device whose
    /// writes burn CPU (compression) declares about what the cores can
    /// keep busy; the default, `usize::MAX`, means no limit beyond the
    /// server's worker count. The server's write slots are shared by all
    /// its exports: it uses the smallest value they declare, unless
    /// `ServerConfig::write_workers` overrides it.
    fn max_concurrent_writes(&self) -> usize {
        usize::MAX
    }
}

/// Page size of `MemDevice`: the granularity of its allocation and holes.
pub const MEM_PAGE_BYTES: u64 = 4096;

/// A sparse in-memory block device: a map of 4 KiB pages. Absent pages read
/// as zeros and are reported as holes; trim frees pages.
pub struct MemDevice {
    size_bytes: u64,
    read_only: bool,
    pages: RwLock<HashMap<u64, Box<[u8]>>>,
}

impl MemDevice {
    /// An empty (all-hole) device of `size_bytes` bytes.
    pub fn new(size_bytes: u64) -> MemDevice {
        MemDevice {
            size_bytes,
            read_only: false,
            pages: RwLock::new(HashMap::new()),
        }
    }

    /// The same device, refusing writes.
    pub fn with_read_only(mut self, read_only: bool) -> MemDevice {
        self.read_only = read_only;
        self
    }

    /// Bytes held in allocated pages.
    pub fn allocated_bytes(&self) -> u64 {
        self.pages.read().len() as u64 * MEM_PAGE_BYTES
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "range beyond the end of the device",
            )),
        }
    }

    /// Zero `[offset, offset+len)`; pages covered entirely are removed when
    /// `free_whole_pages`, else allocated as zeros.
    fn zero_range(&self, offset: u64, len: u64, free_whole_pages: bool) -> io::Result<()> {
        self.check_range(offset, len)?;
        let mut pages = self.pages.write();
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let page = pos / MEM_PAGE_BYTES;
            let in_page = (pos % MEM_PAGE_BYTES) as usize;
            let n = ((MEM_PAGE_BYTES - in_page as u64).min(end - pos)) as usize;
            if n as u64 == MEM_PAGE_BYTES && free_whole_pages {
                pages.remove(&page);
            } else if let Some(p) = pages.get_mut(&page) {
                p[in_page..in_page + n].fill(0);
            } else if !free_whole_pages {
                pages.insert(page, vec![0u8; MEM_PAGE_BYTES as usize].into_boxed_slice());
            }
            pos += n as u64;
        }
        Ok(())
    }
}

impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let pages = self.pages.read();
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let page = pos / MEM_PAGE_BYTES;
            let in_page = (pos % MEM_PAGE_BYTES) as usize;
            let n = (MEM_PAGE_BYTES as usize - in_page).min(buf.len() - done);
            match pages.get(&page) {
                Some(p) => buf[done..done + n].copy_from_slice(&p[in_page..in_page + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Memory never waits for a disk; only for a writer holding the pages.
    fn try_read_cached(&self, offset: u64, buf: &mut [u8]) -> Option<io::Result<bool>> {
        let pages = self.pages.try_read()?;
        drop(pages);
        Some(self.read_or_hole(offset, buf))
    }

    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        self.check_range(offset, data.len() as u64)?;
        let mut pages = self.pages.write();
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            let page = pos / MEM_PAGE_BYTES;
            let in_page = (pos % MEM_PAGE_BYTES) as usize;
            let n = (MEM_PAGE_BYTES as usize - in_page).min(data.len() - done);
            let p = pages
                .entry(page)
                .or_insert_with(|| vec![0u8; MEM_PAGE_BYTES as usize].into_boxed_slice());
            p[in_page..in_page + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, _fua: bool) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        self.zero_range(offset, len, true)
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, _fua: bool) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        self.zero_range(offset, len, may_trim)
    }

    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        self.check_range(offset, len)?;
        let pages = self.pages.read();
        let end = offset + len;
        let mut extents: Vec<(u64, bool)> = Vec::new();
        let mut pos = offset;
        // Bound the reply: a caller asking about a huge range gets the first
        // extents and asks again from where they stop.
        const EXTENTS_MAX: usize = 4096;
        while pos < end {
            let page = pos / MEM_PAGE_BYTES;
            let n = (MEM_PAGE_BYTES - pos % MEM_PAGE_BYTES).min(end - pos);
            let hole = !pages.contains_key(&page);
            match extents.last_mut() {
                Some((l, h)) if *h == hole => *l += n,
                _ => {
                    if extents.len() == EXTENTS_MAX {
                        break;
                    }
                    extents.push((n, hole));
                }
            }
            pos += n;
        }
        Ok(extents)
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_pages_read_zero_and_report_holes() {
        let d = MemDevice::new(1 << 20);
        d.write_at(5000, b"hello", false).unwrap();
        let mut buf = [1u8; 10];
        d.read_at(4998, &mut buf).unwrap();
        assert_eq!(&buf, b"\0\0hello\0\0\0");
        let st = d.block_status(0, 3 * 4096).unwrap();
        assert_eq!(st, vec![(4096, true), (4096, false), (4096, true)]);
        d.trim(4096, 4096, false).unwrap();
        assert_eq!(d.allocated_bytes(), 0);
        d.write_zeroes(0, 8192, false, false).unwrap();
        assert_eq!(d.allocated_bytes(), 8192);
        assert!(d.read_at(1 << 20, &mut buf).is_err());
    }
}
