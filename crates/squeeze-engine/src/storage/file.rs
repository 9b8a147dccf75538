//! The backing file: positional reads and writes on a regular file (or a
//! block device), fdatasync for durability, fallocate to reserve segments
//! and to punch freed ones out so the file really shrinks on disk.
//!
//! Writes go through a write-behind pool (`write_behind`, tied to the file
//! by `direct`, the same code the simulator runs over a simulated disk) and
//! reach the file as whole aligned chunks written with O_DIRECT, unless the
//! file system refuses O_DIRECT or `SQUEEZE_IO=buffered` is set; then they
//! go through the page cache as plain positional writes.

use super::aligned::{AlignedBuf, BLOCK};
use super::direct::Direct;
use super::write_behind::Disk;
use super::{Fetch, Storage};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes per write-behind chunk: one direct write each.
pub const WRITE_BEHIND_CHUNK: usize = 1 << 20;
/// The smallest write-behind chunk `FileOptions` takes.
pub const WRITE_BEHIND_CHUNK_MIN: usize = 64 << 10;
/// Chunks in the write-behind pool (its memory, allocated as needed).
pub const WRITE_BEHIND_CHUNKS: usize = 32;
/// Threads writing completed chunks out, so writers never wait for the
/// device unless the pool is full.
const FLUSHER_THREADS: usize = 2;

/// How a backing file is opened: its write path and the memory of its
/// write-behind pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOptions {
    pub mode: IoMode,
    /// Chunks of [`WRITE_BEHIND_CHUNK`] bytes the write-behind pool may
    /// hold (at least 2; allocated as needed and kept as a cache of the
    /// newest log). The default, [`WRITE_BEHIND_CHUNKS`], lets a burst of
    /// client writes run ahead of the device; an embedded store that
    /// writes 4 KiB at a time (squeeze-kv) needs far fewer.
    pub write_behind_chunks: usize,
    /// Bytes per chunk of the pool, one direct write each: a power of two
    /// from [`WRITE_BEHIND_CHUNK_MIN`] to [`WRITE_BEHIND_CHUNK`] (the
    /// default; an embedded store's smaller pool takes smaller chunks).
    pub write_behind_chunk: usize,
}

impl FileOptions {
    /// The mode `SQUEEZE_IO` asks for and the default pool.
    pub fn from_env() -> FileOptions {
        FileOptions {
            mode: IoMode::from_env(),
            write_behind_chunks: WRITE_BEHIND_CHUNKS,
            write_behind_chunk: WRITE_BEHIND_CHUNK,
        }
    }

    /// Refuses a chunk size the pool does not take.
    fn check(&self) -> io::Result<()> {
        let chunk = self.write_behind_chunk;
        if chunk.is_power_of_two() && (WRITE_BEHIND_CHUNK_MIN..=WRITE_BEHIND_CHUNK).contains(&chunk)
        {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a write-behind chunk of {chunk} bytes: the pool takes a power of two \
                 from {WRITE_BEHIND_CHUNK_MIN} to {WRITE_BEHIND_CHUNK}"
            ),
        ))
    }
}

/// How writes reach the backing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// Staged in aligned chunks, written with O_DIRECT (the default where
    /// the file system allows it).
    Direct,
    /// Through the page cache.
    Buffered,
}

impl IoMode {
    /// The mode asked for by `SQUEEZE_IO` (`direct` or `buffered`; default
    /// direct).
    pub fn from_env() -> IoMode {
        match std::env::var("SQUEEZE_IO").as_deref() {
            Ok("buffered") => IoMode::Buffered,
            Ok("direct") | Err(_) => IoMode::Direct,
            Ok(other) => {
                tracing::warn!(
                    "SQUEEZE_IO={other:?} is neither `direct` nor `buffered`; using direct"
                );
                IoMode::Direct
            }
        }
    }
}

pub struct FileStorage {
    file: File,
    direct: Option<Direct<FileDisk>>,
    /// Starts the writeback of pages `write_through` wrote, off the
    /// caller's path (spawned at the first such write).
    writeback: std::sync::OnceLock<Writeback>,
}

/// A thread that starts the writeback of page-cache ranges
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which submits the I/O before
/// it returns: 18 us a call here, too long for a flush to wait on).
struct Writeback {
    tx: Option<std::sync::mpsc::Sender<(u64, u64)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writeback {
    fn start(file: &File) -> io::Result<Writeback> {
        let file = file.try_clone()?;
        let (tx, rx) = std::sync::mpsc::channel::<(u64, u64)>();
        let thread = std::thread::Builder::new()
            .name("sqz-writeback".into())
            .spawn(move || {
                while let Ok((offset, len)) = rx.recv() {
                    // SAFETY: sync_file_range on an fd we own, with integer
                    // arguments.
                    let rc = unsafe {
                        libc::sync_file_range(
                            file.as_raw_fd(),
                            offset as libc::off64_t,
                            len as libc::off64_t,
                            libc::SYNC_FILE_RANGE_WRITE,
                        )
                    };
                    // Only a head start: the next fdatasync writes the page
                    // back either way.
                    if rc != 0 {
                        tracing::debug!("sync_file_range: {}", io::Error::last_os_error());
                    }
                }
            })?;
        Ok(Writeback {
            tx: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The file as the write-behind pool sees it: reads through the page
/// cache, whole-block writes with O_DIRECT.
struct FileDisk {
    /// The file opened as usual (reads go through the page cache).
    file: File,
    /// The same file opened O_DIRECT.
    direct: File,
    /// Set when a direct write was refused (EINVAL): from then on the same
    /// bytes go through the page cache.
    refused: AtomicBool,
}

thread_local! {
    /// Aligned bounce buffer for O_DIRECT reads.
    static BOUNCE: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

impl Disk for FileDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        read_full(&self.file, buf, offset)
    }

    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        read_nowait(&self.file, buf, offset)
    }

    /// From the page cache if every byte is there, else with O_DIRECT:
    /// straight into `buf` when it and the range are `BLOCK`-aligned (the
    /// read path's stream buffer, `read::with_stream`), else through an
    /// aligned bounce buffer and a copy.
    fn read_stream(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if buf.len() < BLOCK || self.refused.load(Ordering::Relaxed) {
            return read_full(&self.file, buf, offset);
        }
        if read_cached(&self.file, buf, offset) {
            return Ok(());
        }
        let aligned = offset.is_multiple_of(BLOCK as u64)
            && buf.len().is_multiple_of(BLOCK)
            && (buf.as_ptr() as usize).is_multiple_of(BLOCK);
        let r = if aligned {
            read_direct(&self.direct, buf, offset)
        } else {
            let start = offset / BLOCK as u64 * BLOCK as u64;
            let end = (offset + buf.len() as u64).div_ceil(BLOCK as u64) * BLOCK as u64;
            let n = (end - start) as usize;
            let at = (offset - start) as usize;
            BOUNCE.with_borrow_mut(|bounce| -> io::Result<()> {
                if bounce.as_ref().is_none_or(|b| b.len() < n) {
                    *bounce = Some(AlignedBuf::new(n.next_power_of_two().max(128 << 10)));
                }
                let b = &mut bounce.as_mut().expect("bounce buffer")[..n];
                read_direct(&self.direct, b, start)?;
                buf.copy_from_slice(&b[at..at + buf.len()]);
                Ok(())
            })
        };
        match r {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!("O_DIRECT read refused ({e}); using the page cache");
                self.refused.store(true, Ordering::Relaxed);
                read_full(&self.file, buf, offset)
            }
            r => r,
        }
    }

    fn write_direct(&self, data: &[u8], offset: u64) -> io::Result<()> {
        debug_assert!(offset.is_multiple_of(BLOCK as u64) && data.len().is_multiple_of(BLOCK));
        if !self.refused.load(Ordering::Relaxed) {
            match self.direct.write_all_at(data, offset) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::warn!("O_DIRECT write refused ({e}); writing through the page cache");
                    self.refused.store(true, Ordering::Relaxed);
                }
                r => return r,
            }
        }
        self.file.write_all_at(data, offset)
    }
}

/// Reads the range from the page cache if every page of it is there (asked
/// with cachestat(2), which, unlike a RWF_NOWAIT read, starts no readahead
/// that would fill the cache anyway); false when it is not, or when the
/// kernel has no cachestat (before 6.5).
fn read_cached(file: &File, buf: &mut [u8], offset: u64) -> bool {
    static NO_CACHESTAT: AtomicBool = AtomicBool::new(false);
    if NO_CACHESTAT.load(Ordering::Relaxed) {
        return false;
    }
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Cachestat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451; // the same on every architecture
    let page = 4096u64;
    let first = offset / page * page;
    let range = Range {
        off: first,
        len: (offset + buf.len() as u64).div_ceil(page) * page - first,
    };
    let mut cs = Cachestat::default();
    // SAFETY: cachestat reads `range` and writes `cs`, both live locals.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    if rc != 0 {
        if io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            NO_CACHESTAT.store(true, Ordering::Relaxed);
        }
        return false;
    }
    if cs.nr_cache * page < range.len {
        return false;
    }
    // Every page is cached: an ordinary read copies them (a page evicted
    // meanwhile is read from the device, correctly).
    read_full(file, buf, offset).is_ok()
}

/// An O_DIRECT read of whole blocks; past the end of the file is zeros.
fn read_direct(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                if done % BLOCK != 0 {
                    break; // the end of the file, inside a block
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf[done..].fill(0);
    Ok(())
}

fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads the range from the page cache only: preadv2 with RWF_NOWAIT,
/// which answers EAGAIN rather than wait for the disk (the kernel may then
/// start reading the pages ahead, which the caller's blocking read wants
/// anyway). Every shortfall is `WouldBlock` (`Storage::read_cached`): a
/// page not cached, the end of the file, an error, a kernel or file system
/// without RWF_NOWAIT.
fn read_nowait(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        let iov = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        // SAFETY: `iov` describes `rest`, a live buffer the kernel may fill.
        let n = unsafe {
            libc::preadv2(
                file.as_raw_fd(),
                &iov,
                1,
                (offset + done as u64) as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        if n > 0 {
            done += n as usize;
        } else if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        } else {
            return Err(super::not_cached());
        }
    }
    Ok(())
}

/// Writes `parts` back to back from `offset` with pwritev (no copy into
/// one buffer first), retrying short writes.
fn write_parts_full(file: &File, parts: &[&[u8]], offset: u64) -> io::Result<()> {
    // The kernel takes at most IOV_MAX (1024) vectors a call.
    const MAX_IOV: usize = 1024;
    let mut iov: Vec<io::IoSlice> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| io::IoSlice::new(p))
        .collect();
    let mut slices = &mut iov[..];
    let mut at = offset;
    while !slices.is_empty() {
        let n = slices.len().min(MAX_IOV);
        // SAFETY: IoSlice is ABI-compatible with iovec; `n` live slices.
        let rc = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                slices.as_ptr().cast::<libc::iovec>(),
                n as libc::c_int,
                at as libc::off_t,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if rc == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        at += rc as u64;
        io::IoSlice::advance_slices(&mut slices, rc as usize);
    }
    Ok(())
}

impl FileStorage {
    /// Opens an existing file for reading and writing, locked against any
    /// other process opening it (two writers would corrupt the log).
    pub fn open(path: &Path) -> io::Result<FileStorage> {
        Self::open_with(path, IoMode::from_env())
    }

    /// `open` with the write path chosen by the caller.
    pub fn open_with(path: &Path, mode: IoMode) -> io::Result<FileStorage> {
        Self::open_opts(
            path,
            FileOptions {
                mode,
                ..FileOptions::from_env()
            },
        )
    }

    /// `open` with the write path and the pool chosen by the caller.
    pub fn open_opts(path: &Path, o: FileOptions) -> io::Result<FileStorage> {
        o.check()?;
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let direct = Self::open_direct(path, &file, o)?;
        let s = FileStorage {
            file,
            direct,
            writeback: Default::default(),
        };
        s.lock(libc::LOCK_EX)?;
        Ok(s)
    }

    /// The O_DIRECT descriptor, or None where the mode or the file system
    /// says no.
    fn open_direct(
        path: &Path,
        file: &File,
        o: FileOptions,
    ) -> io::Result<Option<Direct<FileDisk>>> {
        if o.mode == IoMode::Buffered {
            return Ok(None);
        }
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(direct) => {
                let disk = FileDisk {
                    file: file.try_clone()?,
                    direct,
                    refused: AtomicBool::new(false),
                };
                Ok(Some(Direct::with_threads(
                    disk,
                    o.write_behind_chunk,
                    o.write_behind_chunks.max(2),
                    FLUSHER_THREADS,
                )?))
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(
                    "{}: the file system refuses O_DIRECT; writing through the page cache",
                    path.display()
                );
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// How writes reach the file.
    pub fn io_mode(&self) -> IoMode {
        match &self.direct {
            Some(d) if !d.disk().refused.load(Ordering::Relaxed) => IoMode::Direct,
            _ => IoMode::Buffered,
        }
    }

    /// Takes a shared lock: fails while a process has the volume open for
    /// writing (for `check`, which must not race a live server).
    pub fn lock_shared(&self) -> io::Result<()> {
        self.lock(libc::LOCK_SH)
    }

    fn lock(&self, how: i32) -> io::Result<()> {
        // SAFETY: flock on an fd we own.
        let rc = unsafe { libc::flock(self.file.as_raw_fd(), how | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                if how == libc::LOCK_SH {
                    format!(
                        "the volume is open for writing in {}",
                        super::holder::describe(&self.file)
                    )
                } else {
                    format!(
                        "the volume is in use by {}; one process at a time may open a \
                         volume for writing",
                        super::holder::describe(&self.file)
                    )
                },
            ));
        }
        Err(e)
    }

    /// Opens an existing file read-only (for `check`, `info`, `stats`).
    pub fn open_read_only(path: &Path) -> io::Result<FileStorage> {
        let file = OpenOptions::new().read(true).open(path)?;
        Ok(FileStorage {
            file,
            direct: None,
            writeback: Default::default(),
        })
    }

    /// Creates a new file; fails if it exists.
    pub fn create(path: &Path) -> io::Result<FileStorage> {
        Self::create_with(path, IoMode::from_env())
    }

    /// `create` with the write path chosen by the caller.
    pub fn create_with(path: &Path, mode: IoMode) -> io::Result<FileStorage> {
        Self::create_opts(
            path,
            FileOptions {
                mode,
                ..FileOptions::from_env()
            },
        )
    }

    /// `create` with the write path and the pool chosen by the caller.
    pub fn create_opts(path: &Path, o: FileOptions) -> io::Result<FileStorage> {
        o.check()?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        let direct = Self::open_direct(path, &file, o)?;
        let s = FileStorage {
            file,
            direct,
            writeback: Default::default(),
        };
        s.lock(libc::LOCK_EX)?;
        Ok(s)
    }

    fn fallocate(&self, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate on an fd we own, with plain integer arguments.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Storage for FileStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match &self.direct {
            Some(d) => d.read(buf, offset, Fetch::Wait),
            None => read_full(&self.file, buf, offset),
        }
    }

    fn read_stream(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match &self.direct {
            Some(d) => d.read(buf, offset, Fetch::Stream),
            None => read_full(&self.file, buf, offset),
        }
    }

    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match &self.direct {
            Some(d) => d.read(buf, offset, Fetch::Cached),
            None => read_nowait(&self.file, buf, offset),
        }
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        match &self.direct {
            Some(d) => d.write(&[data], offset),
            None => self.file.write_all_at(data, offset),
        }
    }

    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        match &self.direct {
            Some(d) => d.write(parts, offset),
            None => write_parts_full(&self.file, parts, offset),
        }
    }

    /// Through the page cache whatever the mode (the write-behind pool
    /// never stages these pages, so no staged chunk writes older bytes over
    /// them); then a thread starts the page's writeback at once
    /// (`Writeback`), so that by the next fdatasync the page is usually
    /// clean and that fdatasync does not wait for a second device write (a
    /// flush mark after each flush cost pg_test_fsync through the FUSE
    /// export 186 -> 225 us without it), while the writer does not wait
    /// for the submission either.
    fn write_through(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(data, offset)?;
        let wb = match self.writeback.get() {
            Some(wb) => wb,
            None => {
                let wb = Writeback::start(&self.file)?;
                let _ = self.writeback.set(wb);
                self.writeback.get().expect("set above")
            }
        };
        if let Some(tx) = &wb.tx {
            // A thread that is gone only loses the head start.
            let _ = tx.send((offset, data.len() as u64));
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.write_out()?;
        self.file.sync_data()
    }

    fn write_out(&self) -> io::Result<()> {
        match &self.direct {
            Some(d) => d.write_out(),
            None => Ok(()),
        }
    }

    fn sync_written(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        let on_disk = self.file.metadata()?.len();
        Ok(match &self.direct {
            Some(d) => on_disk.max(d.staged_end()),
            None => on_disk,
        })
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.fallocate(0, offset, len) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                // File systems without fallocate: extend, and hope.
                if self.len()? < offset + len {
                    self.file.set_len(offset + len)?;
                }
                Ok(())
            }
            r => r,
        }
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        if let Some(d) = &self.direct {
            d.discard(offset, len)?;
        }
        match self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                // Without hole punching, zero the range so stale records die.
                let zeros = vec![0u8; 1 << 20];
                let mut at = offset;
                while at < offset + len {
                    let n = (offset + len - at).min(zeros.len() as u64) as usize;
                    self.write_at(&zeros[..n], at)?;
                    at += n as u64;
                }
                Ok(())
            }
            r => r,
        }
    }

    fn physical_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.blocks() * 512)
    }

    fn free_bytes(&self) -> io::Result<Option<u64>> {
        // SAFETY: fstatvfs fills the struct for an fd we own.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::fstatvfs(self.file.as_raw_fd(), &mut st) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(st.f_bavail as u64 * st.f_frsize as u64))
    }
}
