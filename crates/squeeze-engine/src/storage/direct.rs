//! The write-behind path over any [`Disk`]: the staging pool
//! (`write_behind`), the disk under it, and whoever writes completed chunks
//! out. `FileStorage` runs it over the backing file with flusher threads;
//! the simulator (`sim::SimWriteBehind`) runs the same code over a
//! simulated disk with a seeded stand-in for the threads, so a power cut or
//! a process kill can find chunks staged and never written, written out of
//! order, or torn.
//!
//! Invariants:
//! - a completed chunk is written out at some later moment, by a flusher,
//!   by eviction or by `write_out`, whichever comes first; until then its
//!   bytes live only in this process's memory (a process kill loses them,
//!   at most `chunk * chunks` bytes of log);
//! - `write_out` returns Ok only once every byte staged before it was
//!   called has been handed to the disk, and it reports the first error a
//!   flusher met since the last call (the caller then must not sync and
//!   call the flush a success).

use super::write_behind::{Completed, Disk, WriteBehind};
use super::Fetch;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::io;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// The staging pool, the disk, and the first error of a chunk write that
/// nobody has been told about yet.
pub(crate) struct Shared<D> {
    pub(crate) disk: D,
    staging: WriteBehind,
    /// The first error a background chunk write met; the next `write_out`
    /// reports it.
    flush_error: Mutex<Option<io::Error>>,
}

impl<D: Disk> Shared<D> {
    /// What a flusher does with a completed chunk.
    fn flush_one(&self, c: Completed) {
        if let Err(e) = self.staging.write_completed(&self.disk, c) {
            tracing::error!("writing a log chunk: {e}");
            self.flush_error.lock().get_or_insert(e);
        }
    }
}

/// Who writes completed chunks out.
enum Flushers {
    /// Threads fed through a channel (the real path).
    Threads {
        to_flushers: Option<mpsc::Sender<Completed>>,
        threads: Vec<JoinHandle<()>>,
    },
    /// A deterministic stand-in for the threads (the simulator): completed
    /// chunks wait in a queue, and after each write every waiting chunk is
    /// written out with probability `chance`, in a seeded random order.
    Seeded(Box<Mutex<Held>>),
}

struct Held {
    queue: Vec<Completed>,
    rng: StdRng,
    chance: f64,
}

/// The write-behind path over the disk `D`.
pub(crate) struct Direct<D: Disk + Send + Sync + 'static> {
    shared: Arc<Shared<D>>,
    flushers: Flushers,
}

impl<D: Disk + Send + Sync + 'static> Direct<D> {
    fn shared(disk: D, chunk: usize, chunks: usize) -> Arc<Shared<D>> {
        Arc::new(Shared {
            disk,
            staging: WriteBehind::new(chunk, chunks),
            flush_error: Mutex::new(None),
        })
    }

    /// `chunks` buffers of `chunk` bytes, completed chunks written out by
    /// `threads` flusher threads.
    pub(crate) fn with_threads(
        disk: D,
        chunk: usize,
        chunks: usize,
        threads: usize,
    ) -> io::Result<Direct<D>> {
        let shared = Self::shared(disk, chunk, chunks);
        let (tx, rx) = mpsc::channel::<Completed>();
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = Vec::new();
        for i in 0..threads {
            let (shared, rx) = (shared.clone(), rx.clone());
            let t = std::thread::Builder::new()
                .name(format!("squeeze-flush-{i}"))
                .spawn(move || loop {
                    let next = rx.lock().recv();
                    let Ok(c) = next else { return };
                    shared.flush_one(c);
                })?;
            handles.push(t);
        }
        Ok(Direct {
            shared,
            flushers: Flushers::Threads {
                to_flushers: Some(tx),
                threads: handles,
            },
        })
    }

    /// As `with_threads`, with the seeded stand-in for the flusher threads:
    /// after each write, each completed chunk still waiting is written out
    /// with probability `chance` (0 leaves them to eviction and sync).
    pub(crate) fn seeded(
        disk: D,
        chunk: usize,
        chunks: usize,
        seed: u64,
        chance: f64,
    ) -> Direct<D> {
        assert!((0.0..=1.0).contains(&chance));
        Direct {
            shared: Self::shared(disk, chunk, chunks),
            flushers: Flushers::Seeded(Box::new(Mutex::new(Held {
                queue: Vec::new(),
                rng: StdRng::seed_from_u64(seed),
                chance,
            }))),
        }
    }

    pub(crate) fn disk(&self) -> &D {
        &self.shared.disk
    }

    /// Stages `parts` at `offset` and hands the chunks it completed to the
    /// flushers.
    pub(crate) fn write(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        let s = &*self.shared;
        let completed = s.staging.write(&s.disk, parts, offset)?;
        match &self.flushers {
            Flushers::Threads { to_flushers, .. } => {
                for c in completed {
                    let unsent = match to_flushers {
                        Some(tx) => tx.send(c).err().map(|e| e.0),
                        None => Some(c),
                    };
                    if let Some(c) = unsent {
                        s.staging.write_completed(&s.disk, c)?;
                    }
                }
            }
            Flushers::Seeded(held) => {
                let due = {
                    let mut h = held.lock();
                    h.queue.extend(completed);
                    let h = &mut *h;
                    let (mut due, mut keep) = (Vec::new(), Vec::new());
                    for c in h.queue.drain(..) {
                        if h.rng.gen_bool(h.chance) {
                            due.push(c);
                        } else {
                            keep.push(c);
                        }
                    }
                    h.queue = keep;
                    due.shuffle(&mut h.rng);
                    due
                };
                // As a flusher thread would: the writer is not told.
                for c in due {
                    s.flush_one(c);
                }
            }
        }
        Ok(())
    }

    /// Hands every staged byte not yet written to the disk (the first half
    /// of a sync; the caller then makes the disk durable).
    pub(crate) fn write_out(&self) -> io::Result<()> {
        if let Some(e) = self.shared.flush_error.lock().take() {
            return Err(e);
        }
        self.shared.staging.write_out(&self.shared.disk)
    }

    /// Reads through the pool: the disk's bytes (fetched as `fetch` says)
    /// with staged ones on top.
    pub(crate) fn read(&self, buf: &mut [u8], offset: u64, fetch: Fetch) -> io::Result<()> {
        self.shared
            .staging
            .read(&self.shared.disk, buf, offset, fetch)
    }

    /// Drops staged bytes of a range about to be punched out of the disk.
    pub(crate) fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.shared.staging.discard(&self.shared.disk, offset, len)
    }

    /// End of the highest staged byte.
    pub(crate) fn staged_end(&self) -> u64 {
        self.shared.staging.staged_end()
    }

    /// Staged bytes not yet handed to the disk: what a process kill loses.
    pub(crate) fn unwritten_bytes(&self) -> u64 {
        self.shared.staging.unwritten_bytes()
    }
}

impl<D: Disk + Send + Sync + 'static> Drop for Direct<D> {
    /// Staged bytes reach the disk (not durably: that takes a sync), as
    /// page-cache writes would have.
    fn drop(&mut self) {
        match &mut self.flushers {
            Flushers::Threads {
                to_flushers,
                threads,
            } => {
                *to_flushers = None;
                for t in threads.drain(..) {
                    let _ = t.join();
                }
            }
            Flushers::Seeded(held) => held.get_mut().queue.clear(),
        }
        if let Err(e) = self.write_out() {
            tracing::error!("writing staged log bytes on close: {e}");
        }
    }
}
