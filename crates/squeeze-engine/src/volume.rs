//! The volume: the public API and its lifecycle. A thin-provisioned LBA
//! space of 4 KiB sectors over one backing store: create, open (recovery),
//! close (final checkpoint), the policy, and the client operations, each
//! handed to its stage of the data path:
//!
//! - `read`: map lookup -> record read -> checksums -> decompress
//! - `write`: range lock -> read-modify-write -> pipeline -> `append`
//! - `append`: reservation -> record write -> map install; flush
//! - `space`: cleaner, merger, allocation ahead; `meta`: checkpoints,
//!   recovery; `maintenance`: the background thread
//!
//! Every stage works on the shared state in `state` (`Inner`); none of them
//! depends on this module.
//!
//! Guarantees:
//! - A write is durable once a flush that started after it returned:
//!   flush waits for every ticket issued before it, then syncs.
//! - After any failed write or sync, the volume turns read-only until
//!   reopened (it cannot know what reached the medium).
//!
//! Its maintenance passes on demand live in `volume_passes.rs`, its
//! settings (policy, cap, deduplication) in `volume_settings.rs`, the check
//! of its accounting against the map in `volume_accounting.rs` (more
//! `impl Volume` blocks); how a volume is created and opened lives in
//! `options`.

use crate::append::segment_header;
use crate::counters::Counter;
use crate::counters::Counters;
use crate::damage::{DamagedMarks, RecoveryDamage};
use crate::error::{EngineError, Invalid, Result};
use crate::locks::{RangeLocks, Tickets};
use crate::map::SectorMap;
use crate::meta::flush_marks::{self, Synced};
use crate::meta::{checkpoint, pager, recovery, superblock as sbio};
use crate::pipeline::policy::{ActivePolicy, Hint};
use crate::pipeline::split::Zeros;
use crate::space::ahead::ALLOC_STEP;
use crate::space::{SegState, SegmentId, SegmentTable, Usage};
use crate::state::history::{CheckpointHistory, OpenReport};
use crate::state::log_state::{max_segments, LogState};
use crate::state::map_state::MapState;
use crate::state::Inner;
use crate::stats::{Space, VolumeStats};
use crate::storage::Storage;
use crate::{read, write};
use parking_lot::{Condvar, Mutex, RwLock};
use squeeze_codec::CompressEngine;
use squeeze_format::{
    CheckpointRef, FlushMark, Superblock, BLOCK_VERSION, DATA_START, FORMAT_VERSION,
    RECORD_HEADER_SIZE, SECTOR_SIZE, SHORT_HEADER_VERSION, SUPERBLOCK_SIZE, SUPERBLOCK_SLOTS,
};
use std::sync::Arc;

use crate::options::map_cache_of;
pub use crate::options::{
    default_policy, CreateOptions, OpenOptions, MAP_CACHE_DEFAULT, MAP_CACHE_MIN,
};

const SECTOR: u64 = SECTOR_SIZE as u64;
/// The sequence-number gap left after a recovery, so that records written
/// before a crash but never replayed can never be mistaken for new ones.
pub const SEQ_JUMP_AFTER_RECOVERY: u64 = 1 << 32;

/// A squeeze volume. Safe for many concurrent callers.
pub struct Volume {
    pub(crate) inner: Arc<Inner>,
    maintenance: Option<std::thread::JoinHandle<()>>,
    allocator: Option<std::thread::JoinHandle<()>>,
    closed: bool,
    /// What opening it found damaged.
    damage: RecoveryDamage,
}

impl Volume {
    /// Creates a new volume on an empty store.
    pub fn create(storage: Arc<dyn Storage>, opts: &CreateOptions) -> Result<Volume> {
        Self::create_with(storage, opts, OpenOptions::default())
    }

    pub fn create_with(
        storage: Arc<dyn Storage>,
        opts: &CreateOptions,
        open: OpenOptions,
    ) -> Result<Volume> {
        check_logical_size(opts.logical_size)?;
        if opts.max_physical != 0 && opts.max_physical < DATA_START + 4 * opts.segment_size {
            return Err(EngineError::Invalid(Invalid::MaxPhysicalTooSmall {
                bytes: opts.max_physical,
                min: DATA_START + 4 * opts.segment_size,
            }));
        }
        let uuid: [u8; 16] = rand::random();
        let sb = Superblock {
            version: FORMAT_VERSION,
            uuid,
            generation: 0,
            logical_size: opts.logical_size,
            segment_size: u32::try_from(opts.segment_size).map_err(|_| {
                EngineError::Invalid(Invalid::SegmentSizeTooLarge {
                    bytes: opts.segment_size,
                })
            })?,
            max_physical: opts.max_physical,
            policy: opts.policy,
            dedup: opts.dedup,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            clean: false,
            checkpoint: CheckpointRef::default(),
        };
        sb.validate()
            .map_err(|e| EngineError::Invalid(Invalid::Format(e)))?;
        if !storage.is_empty()? {
            return Err(EngineError::Invalid(Invalid::StoreNotEmpty));
        }
        // Only the superblock slots: the rest of the first MiB stays a hole
        // (du would count 1 MiB of unwritten blocks otherwise).
        storage.allocate(0, SUPERBLOCK_SIZE as u64 * SUPERBLOCK_SLOTS)?;
        // Every flush mark slot holds a placeholder, so that a zeroed one
        // is damage (64 KiB).
        let all: Vec<u64> = (0..squeeze_format::FLUSH_MARK_SLOTS).collect();
        flush_marks::write_placeholders(&*storage, &uuid, &all)?;
        let mut table = SegmentTable::new(max_segments(&sb));
        // Segment 0 opens the log.
        table.set(0, SegState::Log { opened_seq: 1 });
        let seg0 = sb.segment_offset(0);
        storage.allocate(seg0, ALLOC_STEP.min(opts.segment_size))?;
        let mut hdr = [0u8; RECORD_HEADER_SIZE];
        segment_header(&uuid, 1, 0).encode(&mut hdr);
        storage.write_at(&hdr, seg0)?;
        let log = LogState {
            head_offset: seg0 + RECORD_HEADER_SIZE as u64,
            allocated_end: seg0 + ALLOC_STEP.min(opts.segment_size),
            head_segment: 0,
            next_seq: 2,
            table,
            bytes_since_checkpoint: 0,
            ahead_pending: false,
            ahead_failed: None,
            prewritten: Default::default(),
        };
        let state = MapState {
            map: SectorMap::new(),
            usage: Usage::default(),
            shared: Default::default(),
            chain: None,
        };
        let vol = Self::assemble(
            storage,
            sb,
            log,
            state,
            &[],
            open,
            None,
            RecoveryDamage::default(),
        )?;
        checkpoint::write(&vol.inner, false)?;
        // Both slots written from the start: a zero slot is then always
        // damage, never a volume that has written one slot so far
        // (`meta::superblock::read_slots`).
        {
            let _one = vol.inner.ckpt_lock.lock();
            let mut sb = vol.inner.sb.lock();
            sbio::write(&*vol.inner.storage, &mut sb)?;
        }
        Ok(vol)
    }

    /// Opens an existing volume: newest valid superblock, its checkpoint,
    /// then replay of the log after it. A newest superblock whose
    /// checkpoint cannot be read gives way to the other slot's. Damage is
    /// reported (`Volume::damage`); flushed data that is gone fails the
    /// open with `EngineError::Damaged` unless `open.accept_loss`.
    pub fn open(storage: Arc<dyn Storage>, open: OpenOptions) -> Result<Volume> {
        let started = std::time::Instant::now();
        let slots = sbio::read_slots(&*storage)?;
        let mut damage = RecoveryDamage {
            superblock: slots.damage.clone(),
            ..RecoveryDamage::default()
        };
        let mut sb = slots.sb.clone();
        if slots.damage.is_some() {
            // The newest superblock may be the one lost: replay from the
            // checkpoint this one names, whatever its clean flag says.
            sb.clean = false;
        }
        // Segments only the other slot's checkpoint uses (a delta shares
        // its chain's segments with the checkpoints before it).
        let only_in = |a: &Superblock, b: &Superblock| -> Vec<SegmentId> {
            a.checkpoint
                .segments
                .iter()
                .copied()
                .filter(|s| !b.checkpoint.segments.contains(s))
                .collect()
        };
        let mut older: Vec<SegmentId> = slots
            .other
            .as_ref()
            .map(|o| only_in(o, &sb))
            .unwrap_or_default();
        let cache = map_cache_of(&open);
        let mut marks = flush_marks::read(&*storage, &sb.uuid)?;
        let rec = match recovery::recover(&*storage, &sb, &older, cache, marks.newest) {
            Ok(rec) => rec,
            Err(e @ EngineError::Metadata(_)) if slots.other.is_some() => {
                let other = slots.other.clone().expect("checked");
                let why = format!(
                    "the newest superblock (slot {}, generation {}) names a checkpoint that \
                     cannot be read ({e}); opened from slot {} (generation {}) and replayed the \
                     log after its checkpoint",
                    sb.slot(),
                    sb.generation,
                    other.slot(),
                    other.generation
                );
                tracing::warn!("{why}");
                damage.superblock = Some(why);
                // The newer checkpoint's own segments stay as they are
                // (not free) until a later checkpoint lets them go.
                older = only_in(&sb, &other);
                sb = other;
                sb.clean = false;
                marks = flush_marks::read(&*storage, &sb.uuid)?;
                recovery::recover(&*storage, &sb, &older, cache, marks.newest)?
            }
            Err(e) => return Err(e),
        };
        damage.lost = rec.lost.clone();
        damage.truncated = rec.truncated;
        let mark = marks.newest;
        damage.flushed_seq = mark.map(|m| m.flushed_seq);
        if !marks.damaged.is_empty() {
            damage.damaged_marks = Some(DamagedMarks {
                slots: marks.damaged.clone(),
                after_crash: !sb.clean,
            });
        }
        if damage.is_loss() {
            if !open.accept_loss {
                return Err(EngineError::Damaged(Box::new(damage)));
            }
            tracing::warn!("opening a damaged volume, its loss accepted: {damage}");
        }
        let needs_checkpoint = !sb.clean;
        let mut log = rec.log;
        if needs_checkpoint {
            // Past every seq a flush mark has claimed, too: records lost
            // below it must never be matched by new ones.
            log.next_seq =
                log.next_seq.max(mark.map_or(0, |m| m.flushed_seq)) + SEQ_JUMP_AFTER_RECOVERY;
        }
        let mut counters = rec.counters.clone();
        if !damage.is_empty() {
            counters[Counter::DamagedOpens as usize] += 1;
            counters[Counter::LostFlushedRecords as usize] += damage.lost_records();
        }
        let vol = Self::assemble(storage, sb, log, rec.state, &counters, open, mark, damage)?;
        *vol.inner.ckpt_history.lock() = CheckpointHistory {
            older_segments: older,
            prev_head_seq: rec.checkpoint_head_seq,
            base_bytes: rec.chain.base_bytes,
            delta_bytes: rec.chain.delta_bytes,
            deltas: rec.chain.deltas,
            need_base: !rec.chain.takes_deltas,
            rebase_factor: checkpoint::REBASE_FACTOR,
            rebase_min_bytes: checkpoint::REBASE_MIN_BYTES,
        };
        if !vol.inner.read_only {
            Self::settle_after_open(&vol, needs_checkpoint, rec.replayed, rec.replay_end)?;
            // After the checkpoint above (a crash) they claim nothing the
            // volume needs.
            flush_marks::write_placeholders(&*vol.inner.storage, &vol.inner.uuid, &marks.damaged)?;
        }
        // Recovery read the whole map: down to its cache.
        pager::trim_map(&vol.inner);
        let report = OpenReport {
            duration: started.elapsed(),
            replayed: rec.replayed,
            map_peak_bytes: rec.map_peak_bytes,
        };
        *vol.inner.opened.lock() = report;
        tracing::info!(
            ms = report.duration.as_millis() as u64,
            replayed = rec.replayed,
            map_peak_bytes = rec.map_peak_bytes,
            mapped_sectors = vol.inner.state.read().map.mapped(),
            checkpoint_base_bytes = rec.chain.base_bytes,
            checkpoint_deltas = rec.chain.deltas,
            checkpoint_delta_bytes = rec.chain.delta_bytes,
            "volume opened"
        );
        Ok(vol)
    }

    /// What opening the volume found damaged (empty for a volume created
    /// by this process, or opened undamaged).
    pub fn damage(&self) -> &RecoveryDamage {
        &self.damage
    }

    /// After recovery, before accepting writes: free what a crash left
    /// allocated, then checkpoint the replayed state (after a crash) or
    /// mark the volume in use.
    fn settle_after_open(
        vol: &Volume,
        needs_checkpoint: bool,
        replayed: u64,
        replay_end: u64,
    ) -> Result<()> {
        recovery::punch_free(&vol.inner)?;
        // A replayed record may end past the file (its last bytes zeros, on
        // a page a power cut never wrote): zeros make the file hold it
        // before the checkpoint names it (the checkpoint syncs first).
        let len = vol.inner.storage.len()?;
        if len < replay_end {
            let zeros = vec![0u8; (replay_end - len) as usize];
            vol.inner.storage.write_at(&zeros, len)?;
        }
        if needs_checkpoint {
            tracing::info!(
                replayed,
                "volume was not closed cleanly; replayed the log and wrote a new checkpoint"
            );
            checkpoint::write(&vol.inner, false)?;
        } else {
            // Mark dirty: a crash from now on requires replay.
            let _one = vol.inner.ckpt_lock.lock();
            let mut sb = vol.inner.sb.lock();
            sb.clean = false;
            sbio::write(&*vol.inner.storage, &mut sb)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        storage: Arc<dyn Storage>,
        sb: Superblock,
        log: LogState,
        state: MapState,
        counters: &[u64],
        open: OpenOptions,
        mark: Option<FlushMark>,
        damage: RecoveryDamage,
    ) -> Result<Volume> {
        let mut state = state;
        if let Some(n) = open.map_runs_max {
            state.map.set_runs_max(n);
        }
        let engine = open.engine.clone().unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            // ISA-L's pool when the build has it (it only changes who runs
            // deflate:1..=3), else the CPU pool.
            Arc::new(squeeze_codec::isal::default_engine(n))
        });
        let inline = crate::dedup::inline_state::InlineDedup::new(
            sb.dedup,
            open.dedup_inline_sample
                .unwrap_or(crate::dedup::inline_state::INLINE_SAMPLE_DEFAULT),
        );
        let inner = Arc::new(Inner {
            storage,
            uuid: sb.uuid,
            short_records: (sb.version >= SHORT_HEADER_VERSION).into(),
            block_payloads: (sb.version >= BLOCK_VERSION).into(),
            logical_size: sb.logical_size.into(),
            seg_size: u64::from(sb.segment_size),
            policy: RwLock::new(ActivePolicy::with_adaptation(
                sb.policy,
                (!open.no_adapt).then(|| crate::pipeline::adapt::AdaptConfig {
                    law: open
                        .adapt_law
                        .unwrap_or(crate::pipeline::adapt::LAW_DEFAULT),
                    cpu: open.adapt_cpu.clone(),
                    defer: open.adapt_defer,
                    floor: open.burst_floor,
                }),
            )),
            sb: Mutex::new(sb),
            engine,
            written_seq: Mutex::new((log.next_seq, log.head_offset)),
            sync_lock: Mutex::new(Synced::new(log.next_seq, mark)),
            marks_in_flight: (Mutex::new(0), Condvar::new()),
            log: Mutex::new(log),
            state: RwLock::new(state),
            ranges: RangeLocks::default(),
            dedup_lock: Default::default(),
            inline,
            tickets: Tickets::default(),
            gate: RwLock::new(()),
            write_out_lock: Mutex::new(()),
            written: std::sync::atomic::AtomicU64::new(0),
            ckpt_lock: Mutex::new(()),
            resize_lock: Mutex::new(()),
            ckpt_history: Mutex::new(CheckpointHistory {
                older_segments: Vec::new(),
                prev_head_seq: u64::MAX,
                base_bytes: 0,
                delta_bytes: 0,
                deltas: 0,
                need_base: true,
                rebase_factor: checkpoint::REBASE_FACTOR,
                rebase_min_bytes: checkpoint::REBASE_MIN_BYTES,
            }),
            opened: Mutex::new(OpenReport::default()),
            cleaner_lock: Mutex::new(()),
            cleaning: Mutex::new(None),
            counters: Counters::default(),
            map_cache: map_cache_of(&open).into(),
            poisoned: Mutex::new(None),
            read_only: open.read_only,
            idle_merge: !open.no_idle_merge,
            prewrite: open.prewrite && !open.read_only,
            gc: open.gc.unwrap_or_default(),
            stop: (Mutex::new(false), Condvar::new()),
            allocate_ahead: open.background && !open.read_only,
            ahead: Default::default(),
        });
        inner.counters.load(counters);
        let maintenance = (open.background && !open.read_only).then(|| {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("sqz-maintenance".into())
                .spawn(move || crate::maintenance::maintenance_loop(&inner))
                .expect("spawn maintenance thread")
        });
        let allocator = inner.allocate_ahead.then(|| {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("sqz-allocate".into())
                .spawn(move || crate::space::ahead::run(&inner))
                .expect("spawn allocator thread")
        });
        Ok(Volume {
            inner,
            maintenance,
            allocator,
            closed: false,
            damage,
        })
    }

    /// Sets when a checkpoint writes a new base instead of a delta: once
    /// the deltas reach `factor` times the base and at least `min_bytes`.
    /// For tests that want bases often; the defaults suit every volume.
    #[doc(hidden)]
    pub fn set_rebase_threshold(&self, factor: u64, min_bytes: u64) {
        let mut h = self.inner.ckpt_history.lock();
        h.rebase_factor = factor;
        h.rebase_min_bytes = min_bytes;
    }

    /// Sets the bytes of RAM the sector map may use (tests page the map
    /// out by setting 0: every chunk that can go, goes at once).
    #[doc(hidden)]
    pub fn set_map_cache(&self, bytes: u64) {
        self.inner
            .map_cache
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
        pager::trim_map(&self.inner);
    }

    /// Logical size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.size()
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.inner.uuid
    }

    /// A copy of the superblock in force.
    pub fn superblock(&self) -> Superblock {
        self.inner.sb.lock().clone()
    }

    /// Changes the logical size to `new_size` bytes (a multiple of 4096),
    /// on a volume in use as well: a larger size at once; a smaller one only
    /// when nothing is mapped past it (else `Invalid`, naming the first
    /// mapped byte there). Writes to the tail given up wait for the change
    /// and then fail as out of range. Both superblock slots are rewritten,
    /// so a torn write of one still opens the volume at the new size (a
    /// record past the old size would be refused at the old one).
    pub fn resize(&self, new_size: u64) -> Result<()> {
        let _one = self.inner.resize_lock.lock();
        check_logical_size(new_size)?;
        self.inner.writable()?;
        let old = self.size();
        let (first, last) = (new_size.min(old) / SECTOR, new_size.max(old) / SECTOR);
        // The tail given up (or added): no write runs there meanwhile.
        let _range = self.inner.ranges.lock(first, last);
        if new_size < old {
            // Client sectors only: hidden addresses (shared content) lie
            // past every volume's end.
            let mapped = pager::with_map(&self.inner, |st| {
                st.map.next_mapped(first, squeeze_format::SHARED_BASE)
            })?;
            if let Some(lba) = mapped {
                return Err(EngineError::Invalid(Invalid::ShrinkOverData {
                    size: new_size,
                    mapped: lba * SECTOR,
                }));
            }
            // Replay refuses a record that reaches past the end, so no
            // record written before the shrink may be replayed after it: a
            // checkpoint (a base, which also upgrades a format 1 volume
            // whose dense stream could not describe the smaller size) first,
            // while the tail stays locked.
            self.inner.ckpt_history.lock().need_base = true;
            checkpoint::write(&self.inner, false)?;
        }
        let _one = self.inner.ckpt_lock.lock();
        let mut sb = self.inner.sb.lock();
        let mut next = sb.clone();
        next.logical_size = new_size;
        next.validate()
            .map_err(|e| EngineError::Invalid(Invalid::Format(e)))?;
        for _ in 0..2 {
            sbio::write(&*self.inner.storage, &mut next).inspect_err(|e| self.inner.poison(e))?;
        }
        *sb = next;
        self.inner
            .logical_size
            .store(new_size, std::sync::atomic::Ordering::Release);

        tracing::info!(from = old, to = new_size, "volume resized");
        Ok(())
    }

    /// The compression engine writes go through.
    pub fn engine(&self) -> &Arc<dyn CompressEngine> {
        &self.inner.engine
    }

    /// Reads `buf.len()` bytes at byte `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        read::read(&self.inner, offset, buf).map(|_| ())
    }

    /// [`Volume::read`], also telling whether the whole range is a hole
    /// (unmapped: never written, trimmed or zeroed), from the one map walk
    /// the read makes.
    pub fn read_or_hole(&self, offset: u64, buf: &mut [u8]) -> Result<bool> {
        read::read(&self.inner, offset, buf)
    }

    /// [`Volume::read_or_hole`] only if it waits for nothing: no disk (the
    /// bytes are in memory or the page cache), no paged-out map chunk, no
    /// lock a writer holds. `Ok(None)` when it would have waited (`buf` is
    /// then unspecified): read with [`Volume::read_or_hole`] instead, on a
    /// thread that may wait. For a server's request reader, which answers a
    /// read at once when it can and hands it to a worker when not.
    pub fn try_read_cached(&self, offset: u64, buf: &mut [u8]) -> Result<Option<bool>> {
        read::read_cached(&self.inner, offset, buf)
    }

    /// Writes `data` at byte `offset`; with `fua`, durable on return.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.write_hinted(offset, data, fua, Hint::None)
    }

    /// Writes with a compressibility hint (the embedding API's way to
    /// drive passive and aggressive modes).
    pub fn write_hinted(&self, offset: u64, data: &[u8], fua: bool, hint: Hint) -> Result<()> {
        write::write_from(&self.inner, offset, data, None, fua, hint, Zeros::Hole)
    }

    /// Writes the bytes `range` of a shared buffer at byte `offset`, as
    /// [`Volume::write`] does, without copying them for the compression
    /// engine (which needs owned input: `write` copies each request once).
    /// The NBD server hands its request payloads over this way.
    pub fn write_shared(
        &self,
        offset: u64,
        data: &Arc<Vec<u8>>,
        range: std::ops::Range<usize>,
        fua: bool,
    ) -> Result<()> {
        let Some(buf) = data.get(range.clone()) else {
            return Err(EngineError::Invalid(Invalid::BufferRange {
                range,
                len: data.len(),
            }));
        };
        write::write_from(
            &self.inner,
            offset,
            buf,
            Some((data, range.start)),
            fua,
            Hint::None,
            Zeros::Hole,
        )
    }

    /// Trims `[offset, offset+len)`: whole sectors inside it are unmapped
    /// (read as zeros, take no space); partial sectors are zeroed in place.
    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        write::zero_range(&self.inner, offset, len, fua)
    }

    /// Writes zeros over `[offset, offset+len)`; whole sectors become holes.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        write::zero_range(&self.inner, offset, len, fua)
    }

    /// Writes zeros over `[offset, offset+len)` that stay provisioned: stored
    /// as (compressed) data rather than holes, so [`Volume::block_status`]
    /// reports the range allocated (NBD's WRITE_ZEROES with NO_HOLE).
    pub fn write_zeroes_no_hole(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        write::provision_zeroes(&self.inner, offset, len, fua)
    }

    /// Makes every write acknowledged before this call durable.
    pub fn flush(&self) -> Result<()> {
        write::client_flush(&self.inner)
    }

    /// Hands every write acknowledged before this call to the backing file,
    /// not durably: once it returns, a kill of this process no longer loses
    /// them (they are out of its memory: the write-behind pool's staged log
    /// is written out), a crash of the machine still may until a flush.
    /// Concurrent callers share one write-out. Nothing to do when the
    /// volume writes through the page cache.
    pub fn write_out(&self) -> Result<()> {
        if self.inner.read_only {
            return Ok(());
        }
        crate::append::write_out(&self.inner)
    }

    /// Allocation status of `[offset, offset+len)`: runs of (length, hole).
    /// Zero sectors are holes. Stops after `max_runs` runs.
    pub fn block_status(&self, offset: u64, len: u64, max_runs: usize) -> Result<Vec<(u64, bool)>> {
        read::block_status(&self.inner, offset, len, max_runs)
    }

    /// A point-in-time view of the counters and space.
    pub fn stats(&self) -> VolumeStats {
        let mut s = crate::stats::collect(&self.inner);
        s.damage_at_open = (!self.damage.is_empty()).then(|| self.damage.to_string());
        s
    }

    /// Room for client data under the cap and the low-space warning: the
    /// part of `stats` a watcher polls.
    pub fn space(&self) -> Space {
        crate::stats::space(&self.inner)
    }

    /// Flushes, writes a final checkpoint and marks the volume clean.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        {
            let (m, cv) = &self.inner.stop;
            *m.lock() = true;
            cv.notify_all();
        }
        if let Some(h) = self.maintenance.take() {
            let _ = h.join();
        }
        self.inner.ahead.stop();
        if let Some(h) = self.allocator.take() {
            let _ = h.join();
        }
        if self.inner.read_only || self.inner.poisoned.lock().is_some() {
            return Ok(());
        }
        if self.inner.allocate_ahead {
            if let Err(e) = crate::space::ahead::release(&self.inner) {
                tracing::warn!("giving back the allocation ahead of the log head: {e}");
            }
        }
        checkpoint::write(&self.inner, true)
    }
}

/// The largest logical size a volume may be given: 2^63 - 2^30 bytes (8
/// EiB less 1 GiB). NBD sends the export size as an unsigned 64-bit
/// number, but its clients take it as a signed one (qemu, the Linux
/// kernel, libnbd: 2^63 reads as negative, or as 0), and qemu opens no
/// image longer than 2^63 aligned down to 1 GiB (its BDRV_MAX_LENGTH:
/// qemu-img 10.0 opens 2^63 - 2^30 bytes and refuses 4 KiB more with
/// "File too large"). The engine and the format would hold more: LBAs
/// are 64 bits in full record headers and checkpoint runs (short headers,
/// 40 bits, are written only where they fit), byte offsets stay under
/// 2^64.
pub const MAX_LOGICAL_SIZE: u64 = (1 << 63) - (1 << 30);

const _: () = assert!(MAX_LOGICAL_SIZE.is_multiple_of(SECTOR));

/// A logical size `create` and `resize` accept: a positive multiple of
/// 4096 up to [`MAX_LOGICAL_SIZE`].
fn check_logical_size(bytes: u64) -> Result<()> {
    if bytes == 0 || !bytes.is_multiple_of(SECTOR) {
        return Err(EngineError::Invalid(Invalid::SizeNotAligned { bytes }));
    }
    if bytes > MAX_LOGICAL_SIZE {
        return Err(EngineError::Invalid(Invalid::SizeTooLarge {
            bytes,
            max: MAX_LOGICAL_SIZE,
        }));
    }
    Ok(())
}

impl Drop for Volume {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!("closing volume: {e}");
        }
    }
}
