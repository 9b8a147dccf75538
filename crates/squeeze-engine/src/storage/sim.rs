//! A simulated disk for crash and fault tests: it keeps the image a reader
//! sees and the image that would survive a power cut, and on `crash` keeps
//! a random subset of the unsynced writes, torn at 4 KiB page granularity
//! (the page cache may write back any page of any pending write, in any
//! order). Faults (EIO, ENOSPC, failed sync, a capacity limit, any errno
//! from an allocation or a punch) are injected through [`SimFaults`].
//! `allocate` and `punch` refuse the arguments fallocate(2) refuses (an
//! empty range: EINVAL), so an engine bug that asks for one fails here as
//! it fails on a real file.
//!
//! [`SimWriteBehind`] puts the default I/O path over it: the write-behind
//! staging pool and chunk writer `FileStorage` runs (`direct.rs`), with a
//! seeded stand-in for the flusher threads, so crashes and kills also find
//! chunks staged in memory and never written, or written late and in any
//! order.

use super::aligned::BLOCK;
use super::direct::Direct;
use super::write_behind::Disk;
use super::{not_cached, Fetch, Storage};
use parking_lot::Mutex;
use rand::Rng;
use std::io;
use std::sync::Arc;

const PAGE: u64 = 4096;

#[derive(Clone, Debug, Default)]
pub struct SimFaults {
    /// Fail this many upcoming writes with EIO (after `writes_before_fault` succeed).
    pub write_eio: u32,
    /// Writes to let through before `write_eio` starts failing.
    pub writes_before_fault: u32,
    /// Write only the first half of this many upcoming writes, then fail
    /// them with EIO (a short write).
    pub short_writes: u32,
    /// Fail this many upcoming syncs with EIO.
    pub sync_eio: u32,
    /// Fail this many upcoming reads with EIO.
    pub read_eio: u32,
    /// Bytes the device can hold: allocation past it fails with ENOSPC.
    pub capacity: Option<u64>,
    /// Fail `allocate` calls with this errno (EINVAL, EIO, EBADF, ...)
    /// after `allocates_before_fault` succeed.
    pub allocate_errno: Option<i32>,
    /// Allocations to let through before `allocate_errno` starts failing.
    pub allocates_before_fault: u32,
    /// Fail `punch` calls with this errno.
    pub punch_errno: Option<i32>,
    /// Fail writes with this errno instead of EIO (with `write_eio`).
    pub write_errno: Option<i32>,
    /// Power fails at this write (counted from when the faults are set):
    /// that write and every later I/O fail and change nothing, and
    /// [`SimStorage::crash`] then builds the image from what came before.
    pub crash_at_write: Option<u64>,
}

enum Pending {
    Write { offset: u64, data: Vec<u8> },
    Punch { offset: u64, len: u64 },
}

struct Inner {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
    allocated_end: u64,
    faults: SimFaults,
    writes: u64,
    syncs: u64,
    dead: bool,
}

pub struct SimStorage {
    inner: Mutex<Inner>,
}

impl Default for SimStorage {
    fn default() -> Self {
        Self::new()
    }
}

impl SimStorage {
    pub fn new() -> SimStorage {
        SimStorage {
            inner: Mutex::new(Inner {
                live: Vec::new(),
                durable: Vec::new(),
                pending: Vec::new(),
                allocated_end: 0,
                faults: SimFaults::default(),
                writes: 0,
                syncs: 0,
                dead: false,
            }),
        }
    }

    /// True once the simulated power cut has happened.
    pub fn is_dead(&self) -> bool {
        self.inner.lock().dead
    }

    pub fn set_faults(&self, faults: SimFaults) {
        let mut g = self.inner.lock();
        g.faults = faults;
        g.writes = 0;
    }

    /// Number of write_at calls so far (to aim a crash at the n-th I/O).
    pub fn writes(&self) -> u64 {
        self.inner.lock().writes
    }

    pub fn syncs(&self) -> u64 {
        self.inner.lock().syncs
    }

    /// Simulates a power cut: returns a new disk holding the durable image
    /// plus a random selection of pages from unsynced writes, in issue order.
    pub fn crash(&self, rng: &mut impl Rng) -> SimStorage {
        let g = self.inner.lock();
        let mut image = g.durable.clone();
        for p in &g.pending {
            match p {
                Pending::Write { offset, data } => {
                    let mut at = 0u64;
                    while at < data.len() as u64 {
                        let page_end = ((offset + at) / PAGE + 1) * PAGE - offset;
                        let end = page_end.min(data.len() as u64);
                        if rng.gen_bool(0.5) {
                            put(&mut image, offset + at, &data[at as usize..end as usize]);
                        }
                        at = end;
                    }
                }
                Pending::Punch { offset, len } => {
                    if rng.gen_bool(0.5) {
                        zero(&mut image, *offset, *len);
                    }
                }
            }
        }
        let len = image.len() as u64;
        SimStorage {
            inner: Mutex::new(Inner {
                live: image.clone(),
                durable: image,
                pending: Vec::new(),
                allocated_end: len.max(g.allocated_end),
                faults: SimFaults::default(),
                writes: 0,
                syncs: 0,
                dead: false,
            }),
        }
    }

    /// Simulates a process kill (the page cache survives): a new disk whose
    /// durable image is everything written so far, synced or not.
    pub fn kill(&self) -> SimStorage {
        let g = self.inner.lock();
        SimStorage {
            inner: Mutex::new(Inner {
                live: g.live.clone(),
                durable: g.live.clone(),
                pending: Vec::new(),
                allocated_end: g.allocated_end,
                faults: SimFaults::default(),
                writes: 0,
                syncs: 0,
                dead: false,
            }),
        }
    }

    /// Flips one bit in both images (bit rot on the medium).
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        let mut g = self.inner.lock();
        let g = &mut *g;
        for img in [&mut g.live, &mut g.durable] {
            if (offset as usize) < img.len() {
                img[offset as usize] ^= 1 << bit;
            }
        }
    }
}

impl SimStorage {
    /// Overwrites bytes in both images (damage on the medium: a stray
    /// `dd`, a bad copy); past the end the image grows.
    pub fn overwrite(&self, offset: u64, data: &[u8]) {
        let mut g = self.inner.lock();
        let g = &mut *g;
        for img in [&mut g.live, &mut g.durable] {
            put(img, offset, data);
        }
    }

    /// Cuts both images to `len` bytes (`truncate -s`).
    pub fn truncate(&self, len: u64) {
        let mut g = self.inner.lock();
        let g = &mut *g;
        for img in [&mut g.live, &mut g.durable] {
            img.truncate(len as usize);
        }
        g.allocated_end = g.allocated_end.min(len);
    }
}

fn put(img: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if img.len() < end {
        img.resize(end, 0);
    }
    img[offset as usize..end].copy_from_slice(data);
}

fn zero(img: &mut [u8], offset: u64, len: u64) {
    let start = (offset as usize).min(img.len());
    let end = ((offset + len) as usize).min(img.len());
    img[start..end].fill(0);
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected EIO on {what}"))
}

fn dead() -> io::Error {
    io::Error::other("simulated power cut")
}

/// What fallocate(2) answers for arguments it refuses: EINVAL for an empty
/// range or a negative offset, EFBIG past the largest file.
fn check_fallocate(offset: u64, len: u64) -> io::Result<()> {
    if len == 0 || offset > i64::MAX as u64 || len > i64::MAX as u64 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    if offset.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    Ok(())
}

impl Storage for SimStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut g = self.inner.lock();
        if g.dead {
            return Err(dead());
        }
        if g.faults.read_eio > 0 {
            g.faults.read_eio -= 1;
            return Err(eio("read"));
        }
        buf.fill(0);
        let start = (offset as usize).min(g.live.len());
        let end = (offset as usize + buf.len()).min(g.live.len());
        buf[..end - start].copy_from_slice(&g.live[start..end]);
        Ok(())
    }

    /// Memory is always cached; a dead disk or a read fault due is a
    /// shortfall (left for the blocking read to meet).
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        {
            let g = self.inner.lock();
            if g.dead || g.faults.read_eio > 0 {
                return Err(not_cached());
            }
        }
        self.read_at(buf, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut g = self.inner.lock();
        if g.dead {
            return Err(dead());
        }
        g.writes += 1;
        if g.faults.crash_at_write == Some(g.writes) {
            g.dead = true;
            return Err(dead());
        }
        if g.faults.writes_before_fault > 0 {
            g.faults.writes_before_fault -= 1;
        } else if g.faults.write_eio > 0 {
            g.faults.write_eio -= 1;
            return Err(match g.faults.write_errno {
                Some(errno) => io::Error::from_raw_os_error(errno),
                None => eio("write"),
            });
        }
        if let Some(cap) = g.faults.capacity {
            if offset + data.len() as u64 > cap.max(g.allocated_end) {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        if g.faults.short_writes > 0 {
            g.faults.short_writes -= 1;
            let half = &data[..data.len() / 2];
            put(&mut g.live, offset, half);
            g.pending.push(Pending::Write {
                offset,
                data: half.to_vec(),
            });
            return Err(eio("write (short)"));
        }
        put(&mut g.live, offset, data);
        g.pending.push(Pending::Write {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut g = self.inner.lock();
        if g.dead {
            return Err(dead());
        }
        g.syncs += 1;
        if g.faults.sync_eio > 0 {
            g.faults.sync_eio -= 1;
            // Like Linux after a failed fsync: the dirty pages may be gone.
            g.pending.clear();
            return Err(eio("sync"));
        }
        let g = &mut *g;
        for p in g.pending.drain(..) {
            match p {
                Pending::Write { offset, data } => put(&mut g.durable, offset, &data),
                Pending::Punch { offset, len } => zero(&mut g.durable, offset, len),
            }
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.inner.lock().live.len() as u64)
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut g = self.inner.lock();
        if g.dead {
            return Err(dead());
        }
        check_fallocate(offset, len)?;
        if let Some(errno) = g.faults.allocate_errno {
            if g.faults.allocates_before_fault > 0 {
                g.faults.allocates_before_fault -= 1;
            } else {
                return Err(io::Error::from_raw_os_error(errno));
            }
        }
        if let Some(cap) = g.faults.capacity {
            if offset + len > cap {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        g.allocated_end = g.allocated_end.max(offset + len);
        if (g.live.len() as u64) < offset + len {
            let n = (offset + len) as usize;
            g.live.resize(n, 0);
        }
        Ok(())
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut g = self.inner.lock();
        if g.dead {
            return Err(dead());
        }
        check_fallocate(offset, len)?;
        if let Some(errno) = g.faults.punch_errno {
            return Err(io::Error::from_raw_os_error(errno));
        }
        zero(&mut g.live, offset, len);
        g.pending.push(Pending::Punch { offset, len });
        Ok(())
    }

    fn physical_bytes(&self) -> io::Result<u64> {
        let g = self.inner.lock();
        Ok(g.live
            .chunks(PAGE as usize)
            .filter(|p| p.iter().any(|&b| b != 0))
            .count() as u64
            * PAGE)
    }

    /// The room left under `capacity`, when the disk has one.
    fn free_bytes(&self) -> io::Result<Option<u64>> {
        let g = self.inner.lock();
        Ok(g.faults.capacity.map(|c| c.saturating_sub(g.allocated_end)))
    }
}

/// A [`SimStorage`] as the write-behind pool sees it; it refuses what
/// O_DIRECT refuses (unaligned offsets, lengths and buffers) by panicking:
/// the pool must never ask for one.
struct SimDisk(Arc<SimStorage>);

impl Disk for SimDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        Storage::read_at(&*self.0, buf, offset)
    }

    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        Storage::read_cached(&*self.0, buf, offset)
    }

    fn write_direct(&self, data: &[u8], offset: u64) -> io::Result<()> {
        assert!(
            offset.is_multiple_of(BLOCK as u64)
                && data.len().is_multiple_of(BLOCK)
                && (data.as_ptr() as usize).is_multiple_of(BLOCK),
            "a direct write must be block-aligned: {} bytes at {offset}",
            data.len()
        );
        Storage::write_at(&*self.0, data, offset)
    }
}

/// How [`SimWriteBehind`] stages: a tiny pool reaches eviction, partly
/// written chunks and full queues in a few writes.
#[derive(Clone, Copy, Debug)]
pub struct SimWriteBehindConfig {
    /// Bytes per chunk (a multiple of 4096).
    pub chunk: usize,
    /// Chunks in the pool (at least 1).
    pub chunks: usize,
    /// Seeds the stand-in for the flusher threads.
    pub seed: u64,
    /// After each write, the chance that each completed chunk still
    /// waiting is written out (0: only eviction and sync write them).
    pub write_out_chance: f64,
    /// Real flusher threads, as `FileStorage` runs, instead of the seeded
    /// stand-in (0): the races are real, and a seed no longer replays.
    pub flusher_threads: usize,
}

/// The default I/O path under the simulator: the same write-behind code
/// `FileStorage` runs (the staging pool and the `Direct` path that ties it
/// to the disk), over a [`SimStorage`] instead of an O_DIRECT file, with a
/// seeded stand-in for the flusher threads that writes completed chunks out
/// late and in any order.
///
/// A power cut is the disk's [`SimStorage::crash`]: staged chunks never
/// written out are lost, chunks written out but not synced are kept in any
/// page-granular subset. A process kill is the disk's
/// [`SimStorage::kill`]: what reached the disk survives (the page cache and
/// the device outlive the process), staged chunks do not.
pub struct SimWriteBehind {
    direct: Direct<SimDisk>,
}

impl SimWriteBehind {
    pub fn new(disk: Arc<SimStorage>, config: SimWriteBehindConfig) -> SimWriteBehind {
        let direct = match config.flusher_threads {
            0 => Direct::seeded(
                SimDisk(disk),
                config.chunk,
                config.chunks,
                config.seed,
                config.write_out_chance,
            ),
            n => Direct::with_threads(SimDisk(disk), config.chunk, config.chunks, n)
                .expect("spawning flusher threads"),
        };
        SimWriteBehind { direct }
    }

    /// The simulated disk under the pool (faults, crash, kill).
    pub fn disk(&self) -> &Arc<SimStorage> {
        &self.direct.disk().0
    }

    /// Staged bytes not yet written to the disk: what a kill now loses.
    pub fn unwritten_bytes(&self) -> u64 {
        self.direct.unwritten_bytes()
    }
}

impl Storage for SimWriteBehind {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.direct.read(buf, offset, Fetch::Wait)
    }

    fn read_stream(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.direct.read(buf, offset, Fetch::Stream)
    }

    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.direct.read(buf, offset, Fetch::Cached)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.direct.write(&[data], offset)
    }

    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        self.direct.write(parts, offset)
    }

    fn write_through(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.disk().write_at(data, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.direct.write_out()?;
        self.disk().sync()
    }

    fn write_out(&self) -> io::Result<()> {
        self.direct.write_out()
    }

    fn sync_written(&self) -> io::Result<()> {
        self.disk().sync()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.disk().len()?.max(self.direct.staged_end()))
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.disk().allocate(offset, len)
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.direct.discard(offset, len)?;
        self.disk().punch(offset, len)
    }

    fn physical_bytes(&self) -> io::Result<u64> {
        self.disk().physical_bytes()
    }
}
