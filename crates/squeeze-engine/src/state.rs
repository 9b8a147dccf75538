//! The volume's shared state, below every stage of the data path: `Inner`,
//! which holds the storage, the policy, the locks, the counters and its
//! parts, each in a module of its own below this one (`state::log_state`:
//! the log's head, allocation and segment table; `state::map_state`: the
//! sector map with the live bytes of each segment; `state::history`: what
//! checkpoints and the last open left; `state::ahead_mailbox`: the mailbox
//! of the allocator thread). `space::gc_policy` (when the cleaner works) is
//! below it too.
//!
//! Every stage takes `&Inner`: the read path (`read`), the write path
//! (`write`), the log append (`append`), space management (`space`),
//! metadata (`meta`), the maintenance thread (`maintenance`) and the stats
//! assembly (`stats`). Nothing here depends on them or on the public API
//! (`volume`): this file imports only the floor below it (its parts, the
//! locks, the counters, the storage, the segment table, the policy).
//!
//! Invariants:
//! - Log order = map order for every sector: overlapping writers are
//!   serialised by the range locks, and seq is assigned under the log lock.
//! - The head lies in the head segment (`LogState::head_in_segment`).
//! - After any unplanned failure of the backing file, `poisoned` holds the
//!   reason and the volume is read-only until reopened (it cannot know what
//!   reached the medium).

pub(crate) mod ahead_mailbox;
pub(crate) mod history;
pub(crate) mod log_state;
pub(crate) mod map_state;

use crate::counters::Counters;
use crate::error::{EngineError, Internal, ReadOnly, Result};
use crate::locks::{RangeLocks, Tickets};
use crate::pipeline::policy::ActivePolicy;
use crate::space::gc_policy::GcPolicy;
use crate::space::SegmentId;
use crate::storage::Storage;
use ahead_mailbox::Ahead;
use history::{CheckpointHistory, OpenReport};
use log_state::LogState;
use map_state::MapState;
use parking_lot::{Condvar, Mutex, RwLock};
use squeeze_codec::CompressEngine;
use squeeze_format::Superblock;
use std::sync::Arc;

pub(crate) struct Inner {
    pub storage: Arc<dyn Storage>,
    pub uuid: [u8; 16],
    /// Bytes; changed only by `Volume::resize` (under the range lock of
    /// the tail it gives up or adds).
    pub logical_size: std::sync::atomic::AtomicU64,
    pub seg_size: u64,
    pub sb: Mutex<Superblock>,
    pub policy: RwLock<ActivePolicy>,
    pub engine: Arc<dyn CompressEngine>,
    pub log: Mutex<LogState>,
    pub state: RwLock<MapState>,
    pub ranges: RangeLocks,
    /// Held exclusively by a deduplication pass and by the zeroing of
    /// orphans (one of them at a time), shared by writes in dedup mode
    /// inline while they share (`dedup`): nothing zeroes a hidden address
    /// between a writer's comparison of its bytes and its Link.
    pub dedup_lock: RwLock<()>,
    /// Dedup mode inline: whether it is on, and its index of recent
    /// content (`dedup::inline`).
    pub inline: crate::dedup::inline_state::InlineDedup,
    pub tickets: Tickets,
    /// Readers hold it shared from map lookup to the end of their read;
    /// freeing segments takes it exclusively, so no reader ever reads a
    /// segment after it was handed out again.
    pub gate: RwLock<()>,
    /// A flush's first stage (the write-out of staged log bytes), one at a
    /// time; `written` is the ticket count every byte below which it has
    /// handed to the file.
    pub write_out_lock: Mutex<()>,
    pub written: std::sync::atomic::AtomicU64,
    /// The log's next seq and head when `written` was last taken: every
    /// record below that seq has been handed to the file.
    pub written_seq: Mutex<(u64, u64)>,
    /// A flush's second stage (fdatasync and flush mark), one at a time:
    /// what is durable, and the marks written.
    pub sync_lock: Mutex<crate::meta::flush_marks::Synced>,
    /// Marks being written: counted up before the flush writing one lets
    /// `sync_lock` go, down once it is written. A flush whose records an
    /// earlier fdatasync made durable waits until none is in flight, so it
    /// never returns before a mark covers it (the next group's fdatasync
    /// and mark do not wait).
    pub marks_in_flight: (Mutex<u32>, Condvar),
    /// One checkpoint at a time; every other superblock write (policy,
    /// size, cap, the in-use mark) takes it too, so that the superblock
    /// naming a new piece is the generation the piece was written with.
    pub ckpt_lock: Mutex<()>,
    /// One resize or cap change at a time.
    pub resize_lock: Mutex<()>,
    pub ckpt_history: Mutex<CheckpointHistory>,
    pub opened: Mutex<OpenReport>,
    /// One cleaner at a time (background, foreground or compact).
    pub cleaner_lock: Mutex<()>,
    /// The segment the cleaner is working on: a checkpoint does not free it
    /// (its offsets must not be reused while relocations of it are being
    /// installed); the next checkpoint does.
    pub cleaning: Mutex<Option<SegmentId>>,
    pub counters: Counters,
    /// Records get short headers where they fit (`squeeze_format::record`):
    /// set once the superblock says format 4 on disk (at open, or by the
    /// checkpoint that upgrades an older volume), never cleared.
    pub short_records: std::sync::atomic::AtomicBool,
    /// Small zstd frames may become block payloads
    /// (`squeeze_format::zstd_block`): set once the superblock says format
    /// 6 on disk, as `short_records` is for format 4, never cleared.
    pub block_payloads: std::sync::atomic::AtomicBool,
    /// Bytes of RAM the sector map may use before chunks page out to the
    /// checkpoint chain (`OpenOptions::map_cache`, `meta::pager`).
    pub map_cache: std::sync::atomic::AtomicU64,
    /// The failure that turned the volume read-only (the first one).
    pub poisoned: Mutex<Option<Arc<EngineError>>>,
    pub read_only: bool,
    /// The maintenance thread merges fragmented windows when clients idle.
    pub idle_merge: bool,
    /// Pre-write the log past the head before small client flushes
    /// (`OpenOptions::prewrite`, space::prewrite).
    pub prewrite: bool,
    /// When the cleaner works (space for write amplification).
    pub gc: GcPolicy,
    pub stop: (Mutex<bool>, Condvar),
    /// The allocator thread runs (background threads): `reserve` asks it to
    /// allocate ahead of the head (space::ahead).
    pub allocate_ahead: bool,
    pub ahead: Ahead,
}

impl Inner {
    /// Byte offset of segment `s` in the backing file.
    pub(crate) fn segment_offset(&self, s: SegmentId) -> u64 {
        squeeze_format::segment_offset(self.seg_size, s)
    }

    /// Byte offset just past segment `s`.
    pub(crate) fn segment_end(&self, s: SegmentId) -> u64 {
        self.segment_offset(s) + self.seg_size
    }

    pub(crate) fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(EngineError::ReadOnly(ReadOnly::Opened));
        }
        self.check_not_poisoned()
    }

    /// `ReadOnly` with the failure that turned the volume read-only, if
    /// one did.
    pub(crate) fn check_not_poisoned(&self) -> Result<()> {
        match self.poisoned.lock().as_ref() {
            Some(first) => Err(EngineError::ReadOnly(ReadOnly::Failed(Arc::clone(first)))),
            None => Ok(()),
        }
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        let size = self.size();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(EngineError::OutOfRange { offset, len, size });
        }
        Ok(())
    }

    /// The logical size in force.
    pub(crate) fn size(&self) -> u64 {
        self.logical_size.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A backing-store error met while changing the log or the space:
    /// ENOSPC comes back as `NoSpace` (nothing was changed; the caller may
    /// make room); anything else (EINVAL, EIO, EBADF, a short write, ...)
    /// was not planned for, so the volume turns read-only first.
    pub(crate) fn storage_failed(&self, e: std::io::Error) -> EngineError {
        let e = EngineError::from_storage(e);
        if !matches!(e, EngineError::NoSpace(_)) {
            self.poison(&e);
        }
        e
    }

    /// Turns the volume read-only for a broken invariant of its own state.
    pub(crate) fn internal(&self, why: Internal) -> EngineError {
        let e = EngineError::Internal(why);
        self.poison(&e);
        e
    }

    pub(crate) fn poison(&self, e: &EngineError) {
        let mut p = self.poisoned.lock();
        if p.is_none() {
            tracing::error!("volume turns read-only: {e}");
            *p = Some(Arc::new(e.duplicate()));
        }
    }
}
