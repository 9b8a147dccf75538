//! `squeeze serve --fuse-dir DIR`: the served volumes as regular files in a
//! FUSE file system, one file per volume named after its export, so that a
//! loop device (`losetup -f --show DIR/NAME`) gives the host a block device
//! one hop from the engine. It is the way to a kernel block device where
//! the kernel's nbd module is missing (containers, this project's CI): the
//! other way, nbdfuse, puts a second process and an NBD round trip between
//! the loop device and the engine.
//!
//! What the kernel sends and what it becomes:
//!
//! | FUSE request | engine |
//! |---|---|
//! | read | `Volume::read` (short at the end of the file) |
//! | write | `Volume::write` |
//! | fsync, and flush (each close) | `Volume::flush`: what was written is durable |
//! | fallocate PUNCH_HOLE (loop discard) | `Volume::trim` |
//! | fallocate ZERO_RANGE (loop write-zeroes) | `Volume::write_zeroes` |
//! | fallocate that allocates | EOPNOTSUPP: a thin compressing volume cannot promise space |
//! | setattr of the size | EPERM unless unchanged (`squeeze` sets the size) |
//!
//! Files are opened with FOPEN_DIRECT_IO: the file's data never sits in the
//! host's page cache (the loop device has its own above it), so a write the
//! loop device issues reaches the engine at once, whole (up to `MAX_WRITE`),
//! and its flush reaches `Volume::flush`.
//!
//! Shutdown: [`FuseExport::stop`] makes every later request fail with EIO
//! (the volumes are about to close), then unmounts lazily, so a loop device
//! still attached gets errors instead of hanging the server's exit, as an
//! NBD client whose server went away does. A server killed with SIGKILL
//! leaves the mount behind with no server ("Transport endpoint is not
//! connected"); the next `serve --fuse-dir` on the same directory detaches
//! it first (see [`prepare_mount_point`]).

use super::device::VolumeDevice;
use anyhow::{bail, Context, Result};
use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, WriteFlags,
};
use parking_lot::RwLock;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Largest write the kernel may send in one request (and the loop device's
/// I/O reaches the engine whole up to this).
const MAX_WRITE: u32 = 1 << 20;
/// Requests the kernel keeps in flight to the server (FUSE's
/// max_background).
const MAX_BACKGROUND: u16 = 64;
/// How long the kernel may cache names and attributes: the sizes only
/// change through `squeeze` itself.
const TTL: Duration = Duration::from_secs(1);
/// fallocate modes (linux/falloc.h).
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// The volumes as the file system sees them; None once the server stops.
type Volumes = Arc<RwLock<Option<Vec<(String, Arc<VolumeDevice>)>>>>;

struct VolumeFs {
    volumes: Volumes,
    uid: u32,
    gid: u32,
    started: SystemTime,
}

/// A mounted export; [`FuseExport::stop`] it before closing the volumes.
pub struct FuseExport {
    volumes: Volumes,
    session: Option<BackgroundSession>,
    dir: PathBuf,
}

/// Inode of volume `i` (the root directory is 1).
fn ino_of(i: usize) -> INodeNo {
    INodeNo(i as u64 + 2)
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

impl VolumeFs {
    /// Runs `f` on the volume behind `ino`, or answers the error.
    fn with_volume<T>(
        &self,
        ino: INodeNo,
        f: impl FnOnce(&VolumeDevice) -> std::result::Result<T, Errno>,
    ) -> std::result::Result<T, Errno> {
        let g = self.volumes.read();
        let Some(vols) = g.as_ref() else {
            return Err(Errno::EIO);
        };
        let i = ino.0.checked_sub(2).ok_or(Errno::EISDIR)? as usize;
        let (_, dev) = vols.get(i).ok_or(Errno::ENOENT)?;
        f(dev)
    }

    fn file_attr(&self, i: usize, dev: &VolumeDevice) -> FileAttr {
        let size = dev.vol.size();
        FileAttr {
            ino: ino_of(i),
            size,
            // What the volume stores is not what a file system would
            // allocate for it; report the logical size, as for a sparse
            // image that is fully written.
            blocks: size / 512,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind: FileType::RegularFile,
            perm: 0o600,
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Makes everything written to `ino`'s volume durable, then answers.
    fn flush_volume(&self, ino: INodeNo, reply: ReplyEmpty) {
        match self.with_volume(ino, |dev| dev.vol.flush().map_err(|e| errno(&e.into_io()))) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn root_attr(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo::ROOT,
            size: 0,
            blocks: 0,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind: FileType::Directory,
            perm: 0o700,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn attr_of(&self, ino: INodeNo) -> std::result::Result<FileAttr, Errno> {
        if ino == INodeNo::ROOT {
            return Ok(self.root_attr());
        }
        let i = ino.0.checked_sub(2).ok_or(Errno::ENOENT)? as usize;
        self.with_volume(ino, |dev| Ok(self.file_attr(i, dev)))
    }
}

impl Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The kernel may lower these; what it grants is what it uses.
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        // A loop device with direct I/O submits its queue asynchronously:
        // FUSE_ASYNC_DIO lets those requests reach the server in parallel
        // (as libfuse asks by default), and max_background bounds how many
        // the kernel keeps in flight (FUSE's default of 12 would hold a
        // queue depth of 32 back).
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(MAX_BACKGROUND);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let g = self.volumes.read();
        let Some(vols) = g.as_ref() else {
            return reply.error(Errno::EIO);
        };
        match vols.iter().position(|(n, _)| OsStr::new(n) == name) {
            Some(i) => reply.entry(&TTL, &self.file_attr(i, &vols[i].1), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Times, owners and modes are not kept (they would not outlive the
        // mount); the size is the volume's.
        match self.attr_of(ino) {
            Ok(a) if size.is_none_or(|s| s == a.size) => reply.attr(&TTL, &a),
            Ok(_) => reply.error(Errno::EPERM),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.attr_of(ino) {
            Ok(a) if a.kind == FileType::RegularFile => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
            ),
            Ok(_) => reply.error(Errno::EISDIR),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let r = self.with_volume(ino, |dev| {
            let end = dev.vol.size();
            let n = (size as u64).min(end.saturating_sub(offset)) as usize;
            let mut buf = vec![0u8; n];
            if n > 0 {
                dev.vol
                    .read(offset, &mut buf)
                    .map_err(|e| errno(&e.into_io()))?;
            }
            Ok(buf)
        });
        match r {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // O_SYNC / O_DSYNC writes are durable when answered (FUA).
        let fua = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        let r = self.with_volume(ino, |dev| {
            if offset.saturating_add(data.len() as u64) > dev.vol.size() {
                return Err(Errno::EFBIG);
            }
            dev.vol
                .write(offset, data, fua)
                .map_err(|e| errno(&e.into_io()))
        });
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Each close(): what the closer wrote is durable after it, as for
        // a file on a local file system after fsync.
        self.flush_volume(ino, reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.flush_volume(ino, reply);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = self.with_volume(ino, |dev| {
            if offset.saturating_add(length) > dev.vol.size() {
                return Err(Errno::EINVAL);
            }
            let io = |r: squeeze_engine::Result<()>| r.map_err(|e| errno(&e.into_io()));
            if mode & FALLOC_FL_PUNCH_HOLE != 0 {
                // PUNCH_HOLE comes with KEEP_SIZE (the kernel checks).
                io(dev.vol.trim(offset, length, false))
            } else if mode & FALLOC_FL_ZERO_RANGE != 0 {
                io(dev.vol.write_zeroes(offset, length, false))
            } else {
                // Allocation (mode 0 or KEEP_SIZE), and modes this export
                // does not know: a thin compressing volume has no blocks
                // to reserve (what a range will take is not known until it
                // is written).
                Err(Errno::EOPNOTSUPP)
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let g = self.volumes.read();
        let Some(vols) = g.as_ref() else {
            return reply.error(Errno::EIO);
        };
        let mut entries = vec![
            (INodeNo::ROOT, FileType::Directory, ".".to_string()),
            (INodeNo::ROOT, FileType::Directory, "..".to_string()),
        ];
        for (i, (name, _)) in vols.iter().enumerate() {
            entries.push((ino_of(i), FileType::RegularFile, name.clone()));
        }
        for (k, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, k as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        // No extended attributes (the kernel asks for security labels).
        reply.error(Errno::NO_XATTR);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // DefaultPermissions: the kernel checks modes itself.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let g = self.volumes.read();
        let Some(vols) = g.as_ref() else {
            return reply.error(Errno::EIO);
        };
        // Logical blocks and the physical room left, in 4 KiB blocks.
        let blocks: u64 = vols.iter().map(|(_, d)| d.vol.size() / 4096).sum();
        let free: u64 = vols
            .iter()
            .map(|(_, d)| d.vol.stats().free_physical_bytes / 4096)
            .sum::<u64>()
            .min(blocks);
        reply.statfs(blocks, free, free, vols.len() as u64, 0, 4096, 255, 4096);
    }
}

/// Makes `dir` ready to mount on: a FUSE mount left by a killed server
/// ("Transport endpoint is not connected") is detached first, a live mount
/// is refused, a missing directory is created.
pub fn prepare_mount_point(dir: &Path) -> Result<()> {
    if is_mount_point(dir)? {
        // Attributes may still be cached for a second after the server
        // died; listing the directory always asks the server.
        match std::fs::read_dir(dir) {
            Ok(_) => bail!(
                "--fuse-dir {}: something is mounted there already (another squeeze serve?); \
                 unmount it first (fusermount3 -u {})",
                dir.display(),
                dir.display()
            ),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)) => {
                detach(dir).with_context(|| {
                    format!(
                        "--fuse-dir {}: a mount with no server behind it is there \
                         and could not be detached",
                        dir.display()
                    )
                })?;
                noteln!(
                    "squeeze serve: detached the stale FUSE mount at {} (its server was killed); \
                     loop devices on its files must be detached and attached again",
                    dir.display()
                );
            }
            Err(e) => return Err(e).with_context(|| format!("--fuse-dir {}", dir.display())),
        }
    }
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("--fuse-dir {}: not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
        }
        Err(e) => Err(e).with_context(|| format!("--fuse-dir {}", dir.display())),
    }
}

/// Whether `dir` is a mount point (listed in /proc/self/mountinfo). The
/// path is made absolute without touching the file system (a dead mount
/// answers ENOTCONN to any lookup).
fn is_mount_point(dir: &Path) -> Result<bool> {
    let dir = std::path::absolute(dir).with_context(|| format!("--fuse-dir {}", dir.display()))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("/proc/self/mountinfo")?;
    Ok(info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|p| Path::new(&unescape_mount_path(p)) == dir)
    }))
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape_mount_path(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn detach(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl FuseExport {
    /// Mounts the volumes at `dir` and serves them with `threads` threads.
    pub fn mount(
        dir: &Path,
        volumes: Vec<(String, Arc<VolumeDevice>)>,
        threads: usize,
    ) -> Result<FuseExport> {
        prepare_mount_point(dir)?;
        let volumes: Volumes = Arc::new(RwLock::new(Some(volumes)));
        let fs = VolumeFs {
            volumes: volumes.clone(),
            // SAFETY: getuid/getgid cannot fail.
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
            started: SystemTime::now(),
        };
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("squeeze".into()),
            MountOption::Subtype("squeeze".into()),
            MountOption::DefaultPermissions,
            MountOption::NoExec,
            MountOption::NoSuid,
            MountOption::NoDev,
        ];
        config.n_threads = Some(threads.max(1));
        config.clone_fd = true;
        let session = fuser::spawn_mount(fs, dir, &config)
            .with_context(|| format!("mounting the FUSE export at {}", dir.display()))?;
        Ok(FuseExport {
            volumes,
            session: Some(session),
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Fails every later request, unmounts (lazily: a loop device still on
    /// a file keeps the connection, and gets errors) and lets go of the
    /// volumes, so that they can close.
    pub fn stop(mut self) {
        // Waits for the requests running now: they hold the read lock.
        drop(self.volumes.write().take());
        if let Some(s) = self.session.take() {
            // Dropping the session unmounts (MNT_DETACH) and leaves its
            // threads to end with the connection.
            drop(s);
        }
    }
}
