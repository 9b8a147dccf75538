//! The backing file: positional reads and writes on a regular file (or a
//! block device), fdatasync for durability, fallocate to reserve segments
//! and to punch freed ones out so the file really shrinks on disk.

use super::Storage;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

pub struct FileStorage {
    file: File,
}

impl FileStorage {
    /// Opens an existing file for reading and writing, locked against any
    /// other process opening it (two writers would corrupt the log).
    pub fn open(path: &Path) -> io::Result<FileStorage> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let s = FileStorage { file };
        s.lock(libc::LOCK_EX)?;
        Ok(s)
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
                "the volume is in use by another process (a running `squeeze serve`?)",
            ));
        }
        Err(e)
    }

    /// Opens an existing file read-only (for `check`, `info`, `stats`).
    pub fn open_read_only(path: &Path) -> io::Result<FileStorage> {
        let file = OpenOptions::new().read(true).open(path)?;
        Ok(FileStorage { file })
    }

    /// Creates a new file; fails if it exists.
    pub fn create(path: &Path) -> io::Result<FileStorage> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        let s = FileStorage { file };
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
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
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

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
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
                    self.file.write_all_at(&zeros[..n], at)?;
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
}
