//! The volume's shared state, below every stage of the data path: the log
//! (head, allocation, segment table), the sector map with the live bytes
//! of each segment, and `Inner`, which holds them with the storage, the
//! policy, the locks and the counters.
//!
//! Every stage takes `&Inner`: the read path (`read`), the write path
//! (`write`), the log append (`append`), space management (`space`),
//! metadata (`meta`), the maintenance thread (`maintenance`) and the stats
//! assembly (`stats`). Nothing here depends on them or on the public API
//! (`volume`).
//!
//! Invariants:
//! - Log order = map order for every sector: overlapping writers are
//!   serialised by the range locks, and seq is assigned under the log lock.
//! - The head lies in the head segment (`LogState::head_in_segment`).
//! - After any unplanned failure of the backing file, `poisoned` holds the
//!   reason and the volume is read-only until reopened (it cannot know what
//!   reached the medium).

use crate::chain_index::ChainIndex;
use crate::counters::Counters;
use crate::error::{EngineError, Result};
use crate::locks::{RangeLocks, Tickets};
use crate::map::{Paged, SectorMap};
use crate::pipeline::policy::ActivePolicy;
use crate::space::{SegmentId, SegmentTable, Usage};
use crate::storage::Storage;
use parking_lot::{Condvar, Mutex, RwLock};
use squeeze_codec::CompressEngine;
use squeeze_format::{
    MapEntry, RecordHeader, RecordKind, Superblock, DATA_START, MAX_BACKING_BYTES,
    RECORD_HEADER_SIZE,
};
use std::sync::Arc;

pub(crate) struct LogState {
    pub head_offset: u64,
    /// The head segment is allocated (fallocated) up to here; the rest of it
    /// is allocated ALLOC_STEP at a time as the log grows (ahead of the head
    /// by the allocator thread, space::ahead), so a volume does not occupy
    /// whole segments it has not written.
    pub allocated_end: u64,
    pub head_segment: SegmentId,
    pub next_seq: u64,
    pub table: SegmentTable,
    pub bytes_since_checkpoint: u64,
    /// A request to the allocator thread is outstanding (space::ahead).
    pub ahead_pending: bool,
    /// Allocating ahead failed in this segment: writers allocate themselves.
    pub ahead_failed: Option<SegmentId>,
    /// How far the log past the head is pre-written (space::prewrite).
    pub prewritten: crate::space::prewrite::Prewritten,
}

impl LogState {
    /// The sequence number the head segment was opened with (0 when the
    /// head is not in a log segment): segments opened before it are sealed.
    pub fn head_seq(&self) -> u64 {
        match self.table.state(self.head_segment) {
            crate::space::SegState::Log { opened_seq } => opened_seq,
            _ => 0,
        }
    }

    /// The head lies in the head segment: after its header, at most at its
    /// end (a full segment). Everything that allocates or punches around
    /// the head relies on it.
    pub fn head_in_segment(&self, seg_size: u64) -> bool {
        let start = squeeze_format::segment_offset(seg_size, self.head_segment);
        self.head_offset >= start + RECORD_HEADER_SIZE as u64
            && self.head_offset <= start + seg_size
            && self.allocated_end >= start
            && self.allocated_end <= start + seg_size
    }
}

/// What checkpoints have written: the shape of the chain the superblock
/// names, and the checkpoint before the current one, which the other
/// superblock slot names: it is kept intact (its segments, and the log
/// segments its replay would visit) so a damaged newest slot can fall back
/// to it.
pub(crate) struct CheckpointHistory {
    /// Segments only the previous checkpoint uses (freed when the next is
    /// written). A delta shares its chain's segments with the checkpoints
    /// before it, so this is empty unless the current chain is new.
    pub older_segments: Vec<SegmentId>,
    /// Opened seq of the segment holding the previous checkpoint's replay
    /// position: log segments opened at or after it are not freed.
    pub prev_head_seq: u64,
    /// Bytes of the current chain's base piece.
    pub base_bytes: u64,
    /// Bytes of its delta pieces, and how many there are.
    pub delta_bytes: u64,
    pub deltas: u64,
    /// The next checkpoint must be a base: the chain is in format 1, or a
    /// checkpoint failed after taking the map's record of changes.
    pub need_base: bool,
    /// A base is due once the deltas reach `rebase_factor` times the base
    /// and at least `rebase_min_bytes` (`meta::checkpoint::REBASE_*`;
    /// tests lower them to write bases often).
    pub rebase_factor: u64,
    pub rebase_min_bytes: u64,
}

/// How the last open went (for stats and logs).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpenReport {
    /// From reading the superblocks to accepting writes, recovery's own
    /// checkpoint included.
    pub duration: std::time::Duration,
    /// Log records replayed after the checkpoint.
    pub replayed: u64,
    /// Most RAM the map used while it loaded and replayed.
    pub map_peak_bytes: u64,
}

pub(crate) struct MapState {
    pub map: SectorMap,
    pub usage: Usage,
    /// Where the runs of the checkpoint chain lie: the map pages chunks
    /// out to it (`meta::pager`). None until a chain in format 2 or later
    /// is read or written.
    pub chain: Option<ChainIndex>,
}

impl MapState {
    /// RAM of the map and of the chain index it pages out to.
    pub fn map_memory_bytes(&self) -> u64 {
        self.map.memory_bytes() + self.chain.as_ref().map_or(0, |c| c.memory_bytes())
    }

    /// Points `lba` at `new`, keeping segment usage in step.
    pub fn replace(&mut self, lba: u64, new: MapEntry, seg_size: u64) -> Result<MapEntry, Paged> {
        let old = self.map.set(lba, new)?;
        if old.is_mapped() {
            self.usage
                .remove(segment_of(old.record_offset(), seg_size), old);
        }
        if new.is_mapped() {
            self.usage
                .add(segment_of(new.record_offset(), seg_size), new);
        }
        Ok(old)
    }

    /// Unmaps `[lba, lba+n)`, visiting mapped sectors only. Stopped by a
    /// paged-out chunk, it has unmapped what lies before it: calling it
    /// again once the chunk is in finishes the job.
    pub fn unmap(&mut self, lba: u64, n: u64, seg_size: u64) -> Result<(), Paged> {
        let end = lba + n;
        let mut at = lba;
        while let Some(l) = self.map.next_mapped(at, end)? {
            self.replace(l, MapEntry::UNMAPPED, seg_size)?;
            at = l + 1;
        }
        Ok(())
    }

    /// Applies a record at `offset` (runtime install and replay alike).
    /// Refused for a paged-out chunk before anything changes, except for a
    /// zero record, whose application may be repeated.
    pub fn apply(&mut self, h: &RecordHeader, offset: u64, seg_size: u64) -> Result<(), Paged> {
        match h.kind {
            RecordKind::Extent => {
                self.map.need(h.lba, u64::from(h.sectors))?;
                for i in 0..h.sectors {
                    let e = MapEntry::new(offset, i, h.sectors, h.record_len());
                    self.replace(h.lba + u64::from(i), e, seg_size)?;
                }
            }
            RecordKind::Relocate => {
                self.map.need(h.lba, u64::from(h.sectors))?;
                for i in 0..h.sectors {
                    let lba = h.lba + u64::from(i);
                    let cur = self.map.get(lba)?;
                    // The old record's offset identifies it; a sector's
                    // index in it is fixed by its LBA, so the offset is
                    // all a relocation has to match.
                    if cur.is_mapped() && cur.record_offset() == h.aux {
                        let e = MapEntry::new(offset, i, h.sectors, h.record_len());
                        self.replace(lba, e, seg_size)?;
                    }
                }
            }
            RecordKind::Zero => self.unmap(h.lba, u64::from(h.sectors), seg_size)?,
            RecordKind::SegmentHeader => {}
        }
        Ok(())
    }
}

pub(crate) fn segment_of(offset: u64, seg_size: u64) -> SegmentId {
    assert!(offset >= DATA_START);
    ((offset - DATA_START) / seg_size) as SegmentId
}

/// The segment a log head at `offset` is in. The head is never at a
/// segment's first byte (a segment header is there), so a head on a
/// boundary is the end of the full segment before it.
pub(crate) fn head_segment_of(offset: u64, seg_size: u64) -> SegmentId {
    assert!(offset > DATA_START);
    segment_of(offset - 1, seg_size)
}

pub(crate) fn max_segments(sb: &Superblock) -> u32 {
    let cap = if sb.max_physical == 0 {
        MAX_BACKING_BYTES
    } else {
        sb.max_physical
    };
    (cap.saturating_sub(DATA_START) / u64::from(sb.segment_size)).min(u64::from(u32::MAX)) as u32
}

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
    /// Bytes of RAM the sector map may use before chunks page out to the
    /// checkpoint chain (`OpenOptions::map_cache`, `meta::pager`).
    pub map_cache: std::sync::atomic::AtomicU64,
    pub poisoned: Mutex<Option<String>>,
    pub read_only: bool,
    /// The maintenance thread merges fragmented windows when clients idle.
    pub idle_merge: bool,
    /// Pre-write the log past the head before small client flushes
    /// (`OpenOptions::prewrite`, space::prewrite).
    pub prewrite: bool,
    /// When the cleaner works (space for write amplification).
    pub gc: crate::space::cleaner::GcPolicy,
    pub stop: (Mutex<bool>, Condvar),
    /// The allocator thread runs (background threads): `reserve` asks it to
    /// allocate ahead of the head (space::ahead).
    pub allocate_ahead: bool,
    pub ahead: crate::space::ahead::Ahead,
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
            return Err(EngineError::ReadOnly("opened read-only".into()));
        }
        if let Some(why) = self.poisoned.lock().clone() {
            return Err(EngineError::ReadOnly(why));
        }
        Ok(())
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
    pub(crate) fn internal(&self, why: String) -> EngineError {
        let e = EngineError::Internal(why);
        self.poison(&e);
        e
    }

    pub(crate) fn poison(&self, e: &EngineError) {
        let mut p = self.poisoned.lock();
        if p.is_none() {
            tracing::error!("volume turns read-only: {e}");
            *p = Some(e.to_string());
        }
    }
}
