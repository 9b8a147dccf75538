//! The storage layer under the engine (STYLE habit 6): the backing file, or
//! an in-memory image that can crash and fail on demand, behind one trait,
//! so crash and I/O-error tests run the real engine code.
//!
//! Contract: `write_at` is not durable until a later `sync` returns Ok;
//! reads see every completed write; reading past the end yields zeros;
//! `allocate` reserves room so later writes inside it cannot fail for lack
//! of space; `punch` frees room and the range reads as zeros afterwards.

pub mod aligned;
mod direct;
mod file;
mod holder;
mod sim;
pub mod write_behind;

pub use file::{
    FileOptions, FileStorage, IoMode, WRITE_BEHIND_CHUNK, WRITE_BEHIND_CHUNKS,
    WRITE_BEHIND_CHUNK_MIN,
};
pub use sim::{SimFaults, SimStorage, SimWriteBehind, SimWriteBehindConfig};

use std::io;

/// How a read may reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Through the page cache, waiting for the disk as needed (`read_at`).
    Wait,
    /// As a stream (`read_stream`).
    Stream,
    /// Only from memory (`read_cached`): `WouldBlock` rather than a wait.
    Cached,
}

/// The error of a [`Fetch::Cached`] read that would have waited.
pub fn not_cached() -> io::Error {
    io::ErrorKind::WouldBlock.into()
}

pub trait Storage: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Reads bytes not expected to be read again soon (a large sequential
    /// read): from the page cache if they are all there, else around it, so
    /// a stream does not fill memory with pages nobody reads twice.
    fn read_stream(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_at(buf, offset)
    }
    /// Reads the bytes only if no disk has to be waited for: from memory
    /// and the page cache. Fails with `WouldBlock` ([`not_cached`]) when
    /// some byte is not there, and for every other shortfall too (the end
    /// of the file, an I/O error): the caller then reads with `read_at`,
    /// which reports the real error. The default: never cached.
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let _ = (buf, offset);
        Err(not_cached())
    }
    /// Reads as `fetch` says.
    fn fetch(&self, buf: &mut [u8], offset: u64, fetch: Fetch) -> io::Result<()> {
        match fetch {
            Fetch::Wait => self.read_at(buf, offset),
            Fetch::Stream => self.read_stream(buf, offset),
            Fetch::Cached => self.read_cached(buf, offset),
        }
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Writes `parts` back to back from `offset`: the same as one `write_at`
    /// of their concatenation (which the default builds).
    fn write_parts_at(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        self.write_at(&parts.concat(), offset)
    }
    /// Writes bytes straight to the file, past any staging in memory: they
    /// survive the process's death once this returns, and are durable after
    /// the next `sync` like any write. Only for bytes that nothing else
    /// writes through the staging (the flush marks' own pages).
    fn write_through(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(data, offset)
    }
    /// Makes every completed write durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// The first half of `sync`: hands every completed write that the store
    /// still holds in memory (a write-behind pool) to the file, not yet
    /// durably. Nothing to do for a store that holds none.
    fn write_out(&self) -> io::Result<()> {
        Ok(())
    }
    /// The second half of `sync`: makes durable what `write_out` (or the
    /// store by itself) handed to the file before this call, and nothing
    /// staged in memory since. Flushes pipeline the two halves: one writes
    /// out the next group's bytes while another waits for this one's
    /// fdatasync (`append::flush`).
    fn sync_written(&self) -> io::Result<()> {
        self.sync()
    }
    /// Current length of the backing store in bytes.
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Reserves room for `[offset, offset+len)`, extending the store.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Releases the room of `[offset, offset+len)`; it reads as zeros.
    fn punch(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Bytes the store occupies on its device (what `du` counts).
    fn physical_bytes(&self) -> io::Result<u64>;
    /// Bytes the store could still grow by on its device (the file system's
    /// free space, as `df` shows to an unprivileged writer), if known.
    fn free_bytes(&self) -> io::Result<Option<u64>> {
        Ok(None)
    }
}
