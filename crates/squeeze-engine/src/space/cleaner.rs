//! The cleaner: garbage collection of the segment log.
//!
//! Every overwrite or trim leaves dead bytes behind in the segment that held
//! the old data. The cleaner picks victims by cost-benefit (free space gained
//! against age and copy cost, as in LFS: `(1 - u) * age / (1 + u)` with `u`
//! the live fraction), reads the victim once (512 KiB at a time), and
//! re-appends what is still live as Relocate records at the log head:
//! - a record whose sectors are all live is copied as it is (no codec time),
//!   unless a recompress algorithm is set, then it is recompressed with it
//!   (zram's idea: write fast, recompress cold data that moves anyway);
//! - a partly live record is decompressed and only its live runs are
//!   compressed again, so dead sectors inside an extent stop costing space.
//!
//! The victim then holds no live sector and the next checkpoint frees it and
//! punches it out of the file.
//!
//! Crash safety: relocations are ordinary log records whose replay applies
//! only where the map still points at the old record (so a relocation never
//! undoes a later client write); the victim is freed only by a checkpoint
//! that no longer needs it. A crash mid-clean loses nothing and at most
//! leaves the victim for the next pass.
//!
//! Policy ([`GcPolicy`]): a garbage budget decides when the background
//! thread cleans and which victims are worth their copy. It cleans one
//! victim at a time and sleeps as long as the victim took before the next,
//! so client I/O keeps at least half of the machine; once clients have been
//! idle for a second it works without pause on cheap victims (at most half
//! live, `idle_pass`), and the merger (`space::merge`) rewrites fragmented
//! windows first. A write that finds no room cleans in the foreground
//! before answering ENOSPC.

use crate::append::Room;
use crate::counters::Counter;
use crate::error::EngineError;
use crate::error::Result;
use crate::meta::checkpoint;
use crate::pipeline::compress::Item;
use crate::pipeline::compress::{encode, Payload};
use crate::pipeline::policy::{ActivePolicy, Hint};
use crate::pipeline::split::Piece;
use crate::space::{SegState, SegmentId};
use crate::state::Inner;
use squeeze_codec::Algorithm;
use squeeze_format::{
    record::verify_payload, CodecId, Policy, RecordScan, ScannedRecord, Stride, MAX_RECORD_BYTES,
    RECORD_ALIGN, SECTOR_SIZE,
};
use std::sync::Arc;

/// Relocated payload bytes per log append (bounds the memory of a pass).
const APPEND_BYTES_MAX: usize = 512 << 10;
/// Bytes of a victim read at a time (at most the segment): more than the
/// largest record, so a window always holds a whole one. The cleaner's
/// read buffer, whatever the segment size.
const WINDOW_BYTES: usize = 512 << 10;
const _: () = assert!(WINDOW_BYTES as u64 > 2 * MAX_RECORD_BYTES);
/// When free room is short, any segment below this live fraction will do.
pub const VICTIM_LIVE_MAX_TIGHT: f64 = 0.98;

/// When the cleaner works and which segments it thinks worth a copy: the
/// trade between the space dead bytes hold and the bytes that copying them
/// away writes (write amplification: the flash wear the seeds warn of).
/// Freeing a segment that is `u` live copies `u / (1 - u)` bytes per byte
/// freed, and the more garbage the log may keep, the emptier its victims:
/// on ext4 under fsx and fsstress a budget of 15% made the cleaner copy
/// 2.3 bytes per compressed byte clients wrote, 50% 0.42
/// (docs/benchmarks-history.md, "The garbage budget").
///
/// - While clients write, the cleaner starts once dead bytes exceed the
///   budget's share of the sealed log segments and takes victims below
///   `1 - budget` live.
/// - While they are idle, it starts at half the budget and takes only
///   victims at most half live (a byte copied per byte freed at worst).
/// - The budget is spent only from free room: when the room left (free and
///   allocatable segments under `--max-physical`, and the file system's
///   free space) is less than the budget's share of the sealed log, the
///   budget shrinks to that share, down to [`GARBAGE_BUDGET_MIN`]; with
///   fewer than 8 free segments any victim below 98% live will do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GcPolicy {
    /// Share of the sealed log that dead bytes may reach before the busy
    /// cleaner copies, in [`GARBAGE_BUDGET_MIN`]..=[`GARBAGE_BUDGET_MAX`].
    pub garbage_budget: f64,
}

/// The smallest budget (the cleaner's thresholds before the budget existed).
pub const GARBAGE_BUDGET_MIN: f64 = 0.15;
/// The largest budget a user may set: beyond it busy victims would have to
/// be less than 40% live and the log could hold 1.5 dead bytes per live one.
pub const GARBAGE_BUDGET_MAX: f64 = 0.6;
/// The default budget: write amplification 1.4-1.5 under ext4 with fsx and
/// fsstress (3.3 with the old 15%), for about a fifth more space at rest
/// (docs/benchmarks.md, "File-system write amplification").
pub const GARBAGE_BUDGET_DEFAULT: f64 = 0.5;
/// Idle cleaning takes victims at most this live.
pub const IDLE_VICTIM_LIVE_MAX: f64 = 0.5;

impl Default for GcPolicy {
    fn default() -> Self {
        GcPolicy {
            garbage_budget: GARBAGE_BUDGET_DEFAULT,
        }
    }
}

impl GcPolicy {
    /// A policy with `budget` (a fraction), refused outside the range.
    pub fn with_budget(budget: f64) -> std::result::Result<GcPolicy, String> {
        if !(GARBAGE_BUDGET_MIN..=GARBAGE_BUDGET_MAX).contains(&budget) {
            return Err(format!(
                "a garbage budget of {:.0}% is outside {:.0}%..={:.0}%",
                budget * 100.0,
                GARBAGE_BUDGET_MIN * 100.0,
                GARBAGE_BUDGET_MAX * 100.0
            ));
        }
        Ok(GcPolicy {
            garbage_budget: budget,
        })
    }
}

/// The budget in force: the policy's, or less when free room is short.
pub(crate) fn budget(inner: &Inner, sealed_total: u64) -> f64 {
    let want = inner.gc.garbage_budget;
    if sealed_total == 0 {
        return want;
    }
    let available = inner.log.lock().table.available() * inner.seg_size;
    let room = match inner.storage.free_bytes() {
        Ok(Some(fs_free)) => available.min(fs_free),
        _ => available,
    };
    want.min(room as f64 / sealed_total as f64)
        .max(GARBAGE_BUDGET_MIN)
}

/// Why a pass cleaned: the counter its bytes go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Busy,
    Idle,
}

/// How a victim's live records are rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rewrite {
    /// Cleaning: whole live records are copied as they are (recompressed
    /// only when a recompress algorithm of another codec is set), partly
    /// live ones recompressed.
    Clean,
    /// The upgrade of bytes written below the target: every live record is
    /// recompressed with the target (`all`: the segment is known to hold
    /// below-target bytes, whose level the record header does not name), or
    /// only records of a codec below the target's (`!all`: after a reopen,
    /// from what the headers say; a segment without such a record is left
    /// as it is). `keep_others`: the other records stay where they are (the
    /// log's head segment, which is not freed, is upgraded where it is).
    Upgrade { all: bool, keep_others: bool },
}

/// What cleaning did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct CleanReport {
    pub victims: u64,
    pub records_moved: u64,
    pub sectors_moved: u64,
    /// Record bytes the relocations appended.
    pub bytes_written: u64,
    /// Live bytes the victims held before (what was copied, as stored).
    pub bytes_live_before: u64,
    pub recompressed: u64,
    /// Records that failed their checksum and stayed where they are.
    pub corrupt_records: u64,
    /// Raw bytes rewritten with the target codec by the upgrade.
    #[serde(default)]
    pub upgraded_bytes: u64,
    /// Partly live records whose live runs were rewritten apart: their
    /// windows may be fragmented again (the idle merger looks once more).
    #[serde(default)]
    pub partial_records: u64,
}

impl CleanReport {
    fn add(&mut self, o: &CleanReport) {
        self.victims += o.victims;
        self.records_moved += o.records_moved;
        self.sectors_moved += o.sectors_moved;
        self.bytes_written += o.bytes_written;
        self.bytes_live_before += o.bytes_live_before;
        self.recompressed += o.recompressed;
        self.corrupt_records += o.corrupt_records;
        self.upgraded_bytes += o.upgraded_bytes;
        self.partial_records += o.partial_records;
    }
}

/// Sealed log segments: (id, opened_seq, live bytes, live sectors), with the
/// log's next seq.
fn sealed(inner: &Inner) -> (Vec<(SegmentId, u64, u64, u64)>, u64) {
    let log = inner.log.lock();
    let head_seq = log.head_seq();
    let st = inner.state.read();
    let v = log
        .table
        .iter()
        .filter_map(|(s, state)| match state {
            SegState::Log { opened_seq } if opened_seq < head_seq => {
                let u = st.usage.get(s);
                Some((s, opened_seq, u.live_bytes, u.live_sectors))
            }
            _ => None,
        })
        .collect();
    (v, log.next_seq)
}

/// Fewer free segments than this, and the cleaner takes any victim and
/// dead segments are freed at once.
pub(crate) const TIGHT_SEGMENTS: u64 = 8;

/// Dead bytes in sealed log segments, and their total size.
pub(crate) fn garbage(inner: &Inner) -> (u64, u64) {
    dead_and_total(inner, false)
}

/// As [`garbage`], over the sealed segments that still hold live data: an
/// empty one waits for a checkpoint to free it (the maintenance thread
/// batches those), and cleaning another segment would not free it sooner.
pub(crate) fn collectable(inner: &Inner) -> (u64, u64) {
    dead_and_total(inner, true)
}

fn dead_and_total(inner: &Inner, holding_only: bool) -> (u64, u64) {
    let (segs, _) = sealed(inner);
    let (n, live) = segs
        .iter()
        .filter(|s| !holding_only || s.3 > 0)
        .fold((0u64, 0u64), |(n, live), s| (n + 1, live + s.2));
    let total = n * inner.seg_size;
    (total.saturating_sub(live), total)
}

/// The largest record the log holds (a max-size blob stored raw, with its
/// header): a sealed segment's unused tail is always shorter, since the
/// next record did not fit there.
fn max_record_len() -> u64 {
    squeeze_format::align_record(
        (squeeze_format::RECORD_HEADER_SIZE
            + squeeze_format::MAX_BLOB_SECTORS as usize * squeeze_format::SECTOR_SIZE)
            as u64,
    )
}

/// The best victim by cost-benefit among sealed segments opened before
/// `opened_before`, holding live data below `max_live` of a segment and,
/// with `tail_is_not_garbage`, more dead bytes than the longest record:
/// a segment's bytes that are not live include the tail no record fitted
/// in, and a segment full of 128 KiB raw blobs is only 75% live in 512 KiB
/// segments; cleaning it writes the same blobs into a new segment as full,
/// again and again, for nothing (issue 16).
pub(crate) fn pick_victim(
    inner: &Inner,
    max_live: f64,
    opened_before: u64,
    exclude: &[SegmentId],
    tail_is_not_garbage: bool,
) -> Option<SegmentId> {
    let (segs, next_seq) = sealed(inner);
    let min_dead = if tail_is_not_garbage {
        max_record_len()
    } else {
        0
    };
    segs.into_iter()
        .filter(|&(s, opened, live, sectors)| {
            sectors > 0
                && opened < opened_before
                && (live as f64) < max_live * inner.seg_size as f64
                && inner.seg_size.saturating_sub(live) > min_dead
                && !exclude.contains(&s)
        })
        .map(|(s, opened, live, _)| {
            let u = live as f64 / inner.seg_size as f64;
            let age = (next_seq - opened) as f64;
            (s, (1.0 - u) * age / (1.0 + u))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(s, _)| s)
}

/// A live run of a partly live record, waiting to be compressed again.
struct Run {
    lba: u64,
    sectors: u32,
    from: u64,
    /// Where its bytes start in the pending decompressed records.
    start: usize,
}

/// Relocates everything still live in segment `s`.
pub(crate) fn clean_segment(inner: &Inner, s: SegmentId) -> Result<CleanReport> {
    rewrite_segment(inner, s, Rewrite::Clean)
}

/// Relocates everything still live in segment `s`, as `mode` says.
pub(crate) fn rewrite_segment(inner: &Inner, s: SegmentId, mode: Rewrite) -> Result<CleanReport> {
    let t0 = std::time::Instant::now();
    // Announce the victim before looking at it: a checkpoint freeing it from
    // now on leaves it alone (see `Inner::cleaning`).
    *inner.cleaning.lock() = Some(s);
    let r = clean_segment_inner(inner, s, mode);
    *inner.cleaning.lock() = None;
    let ns = t0.elapsed().as_nanos() as u64;
    match mode {
        Rewrite::Clean => inner.counters.add(Counter::CleanerNs, ns),
        Rewrite::Upgrade { .. } => inner.counters.add(Counter::UpgradeNs, ns),
    }
    if let Ok(rep) = &r {
        inner
            .counters
            .add(Counter::UpgradedBytes, rep.upgraded_bytes);
    }
    r
}

/// Calls `f` with each record of segment `s` in log order and its offset
/// in the backing file, reading the segment [`WINDOW_BYTES`] at a time into
/// `buf`, until `f` answers false. The walk is that of one [`RecordScan`]
/// over the whole segment: a window goes on from the end of the last
/// record it yielded, or from where a record that did not end inside it
/// may begin. False when the segment is no longer a log segment.
fn walk_records(
    inner: &Inner,
    s: SegmentId,
    buf: &mut Vec<u8>,
    mut f: impl FnMut(ScannedRecord<'_>, u64) -> Result<bool>,
) -> Result<bool> {
    let seg_off = inner.segment_offset(s);
    let seg_size = inner.seg_size as usize;
    let window = WINDOW_BYTES.min(seg_size);
    buf.resize(window, 0);
    let mut pos = 0usize;
    loop {
        let len = window.min(seg_size - pos);
        {
            let _gate = inner.gate.read();
            if !matches!(inner.log.lock().table.state(s), SegState::Log { .. }) {
                return Ok(false);
            }
            inner
                .storage
                .read_at(&mut buf[..len], seg_off + pos as u64)?;
        }
        let mut last_end = 0;
        for rec in RecordScan::new(&buf[..len], inner.uuid, Stride::Record) {
            last_end = rec.offset + rec.header.record_len() as usize;
            let at = seg_off + (pos + rec.offset) as u64;
            if !f(rec, at)? {
                return Ok(true);
            }
        }
        if pos + len == seg_size {
            return Ok(true);
        }
        // A record beginning before `floor` would have ended inside.
        let align = RECORD_ALIGN as usize;
        let floor = (len - MAX_RECORD_BYTES as usize) / align * align;
        pos += last_end.max(floor);
    }
}

fn clean_segment_inner(inner: &Inner, s: SegmentId, mode: Rewrite) -> Result<CleanReport> {
    let mut rep = CleanReport {
        victims: 1,
        ..Default::default()
    };
    {
        let _gate = inner.gate.read();
        if !matches!(inner.log.lock().table.state(s), SegState::Log { .. }) {
            return Ok(CleanReport::default());
        }
        rep.bytes_live_before = inner.state.read().usage.get(s).live_bytes;
    }
    let mut buf = Vec::new();
    let policy = inner.policy.read().clone();
    let recompress = match mode {
        Rewrite::Upgrade { .. } => Some(policy.algorithm),
        Rewrite::Clean => (policy.policy.recompress_codec != CodecId::None).then(|| {
            Algorithm::new(
                policy.policy.recompress_codec,
                policy.policy.recompress_level,
            )
        }),
    };
    let victim_below = inner.state.read().usage.below_target(s) > 0;
    let upgrade_this = |codec: CodecId| match mode {
        Rewrite::Upgrade { all: true, .. } => true,
        Rewrite::Upgrade { all: false, .. } => {
            crate::pipeline::adapt::below_target_codec(codec, policy.algorithm)
        }
        Rewrite::Clean => false,
    };
    if matches!(mode, Rewrite::Upgrade { all: false, .. }) {
        let mut found = false;
        walk_records(inner, s, &mut buf, |rec, rec_abs| {
            let h = rec.header;
            if !h.kind.has_payload() || !upgrade_this(h.codec) {
                return Ok(true);
            }
            found = inner.with_map(|st| {
                for i in 0..u64::from(h.sectors) {
                    let e = st.map.get(h.lba + i)?;
                    if e.is_mapped() && e.record_offset() == rec_abs {
                        return Ok(true);
                    }
                }
                Ok(false)
            })?;
            Ok(!found)
        })?;
        if !found {
            // Nothing below the target here: leave the segment as it is.
            return Ok(CleanReport::default());
        }
    }
    let mut items: Vec<Item> = Vec::new();
    let mut pending_bytes = 0usize;
    let mut runs: Vec<Run> = Vec::new();
    // The partly live records, decompressed back to back: the runs' bytes,
    // handed to the compression engine as they are (no gathering copy).
    let mut raw: Vec<u8> = Vec::new();
    walk_records(inner, s, &mut buf, |rec, rec_abs| {
        let h = rec.header;
        if !h.kind.has_payload() {
            return Ok(true);
        }
        if matches!(
            mode,
            Rewrite::Upgrade {
                keep_others: true,
                ..
            }
        ) && !upgrade_this(h.codec)
        {
            return Ok(true);
        }
        let live: Vec<bool> = inner.with_map(|st| {
            (0..u64::from(h.sectors))
                .map(|i| {
                    let e = st.map.get(h.lba + i)?;
                    Ok(e.is_mapped() && e.record_offset() == rec_abs)
                })
                .collect()
        })?;
        if !live.contains(&true) {
            return Ok(true);
        }
        let payload = rec.payload;
        if let Err(e) = verify_payload(&h, payload) {
            tracing::warn!(
                "cleaner: record at {rec_abs} for LBA {} left in place: {e}",
                h.lba
            );
            rep.corrupt_records += 1;
            return Ok(true);
        }
        let recompress_this = match mode {
            Rewrite::Clean => recompress.is_some_and(|a| a.codec != h.codec),
            Rewrite::Upgrade { .. } => upgrade_this(h.codec),
        };
        if live.iter().all(|&l| l) && !recompress_this {
            pending_bytes += payload.len();
            items.push(Item::Moved {
                lba: h.lba,
                sectors: h.sectors,
                codec: h.codec,
                payload: payload.to_vec(),
                from: rec_abs,
                recompressed: false,
                // Copied as it is: if its segment held bytes below the
                // target, it may be one of them (the header names no level).
                below_target: victim_below && h.codec != CodecId::None,
            });
            rep.sectors_moved += u64::from(h.sectors);
        } else {
            let base = raw.len();
            raw.resize(base + h.raw_len(), 0);
            if h.codec == CodecId::None {
                raw[base..].copy_from_slice(payload);
            } else if let Err(e) = squeeze_codec::decompress(h.codec, payload, &mut raw[base..]) {
                tracing::warn!("cleaner: record at {rec_abs} does not decompress: {e}");
                rep.corrupt_records += 1;
                raw.truncate(base);
                return Ok(true);
            }
            // The whole record is held until the batch goes out (its dead
            // sectors too), so it counts whole against the batch's bound.
            pending_bytes += h.raw_len();
            rep.partial_records += 1;
            let mut i = 0;
            while i < live.len() {
                if !live[i] {
                    i += 1;
                    continue;
                }
                let mut j = i + 1;
                while j < live.len() && live[j] {
                    j += 1;
                }
                runs.push(Run {
                    lba: h.lba + i as u64,
                    sectors: (j - i) as u32,
                    from: rec_abs,
                    start: base + i * SECTOR_SIZE,
                });
                rep.sectors_moved += (j - i) as u64;
                i = j;
            }
        }
        rep.records_moved += 1;
        if pending_bytes >= APPEND_BYTES_MAX {
            flush_items(
                inner, &mut items, &mut runs, &mut raw, recompress, mode, &policy, &mut rep,
            )?;
            pending_bytes = 0;
        }
        Ok(true)
    })?;
    flush_items(
        inner, &mut items, &mut runs, &mut raw, recompress, mode, &policy, &mut rep,
    )?;
    Ok(rep)
}

/// Compresses the pending runs and appends everything pending. The runs go
/// through the write pipeline's compress stage as the merger's windows do
/// (one batch, the policy's plan, heuristic and required ratio), with the
/// recompress algorithm in place of the policy's when one is set.
#[expect(
    clippy::too_many_arguments,
    reason = "the pending state of one victim, passed apart to keep its borrows apart"
)]
fn flush_items(
    inner: &Inner,
    items: &mut Vec<Item>,
    runs: &mut Vec<Run>,
    raw: &mut Vec<u8>,
    recompress: Option<Algorithm>,
    mode: Rewrite,
    policy: &ActivePolicy,
    rep: &mut CleanReport,
) -> Result<()> {
    if !runs.is_empty() {
        let policy = match recompress {
            Some(a) => ActivePolicy::new(Policy {
                codec: a.codec,
                level: a.level,
                ..policy.policy
            }),
            None => policy.clone(),
        };
        let pieces: Vec<Piece> = runs
            .iter()
            .map(|r| Piece::Data {
                lba: r.lba,
                sectors: r.sectors,
                start: r.start,
            })
            .collect();
        // Shared with the engine's jobs as it is (no copy for them either).
        let buf = Arc::new(std::mem::take(raw));
        let (encoded, cpu_ns) = encode(
            &*inner.engine,
            &policy,
            policy.algorithm,
            Hint::None,
            &buf,
            Some((&buf, 0)),
            &pieces,
        );
        inner.counters.add(Counter::CompressNs, cpu_ns);
        for (r, it) in runs.drain(..).zip(encoded) {
            let Item::Blob { payload, .. } = it else {
                unreachable!("a data piece encodes to a blob");
            };
            let (codec, payload, recompressed) = match payload {
                Payload::Compressed { codec, data, .. } => (codec, data, recompress.is_some()),
                Payload::Raw { start } => {
                    let len = r.sectors as usize * SECTOR_SIZE;
                    (CodecId::None, buf[start..start + len].to_vec(), false)
                }
            };
            rep.recompressed += u64::from(recompressed);
            if recompressed && mode != Rewrite::Clean {
                rep.upgraded_bytes += u64::from(r.sectors) * SECTOR_SIZE as u64;
            }
            items.push(Item::Moved {
                lba: r.lba,
                sectors: r.sectors,
                codec,
                payload,
                from: r.from,
                recompressed,
                // Compressed again with the target (or the recompress
                // algorithm), or raw because it does not compress.
                below_target: false,
            });
        }
    }
    if items.is_empty() {
        return Ok(());
    }
    rep.bytes_written += items
        .iter()
        .map(|it| inner.record_len(it, &[]))
        .sum::<u64>();
    // The upgrade makes room as client data does: it never eats the
    // cleaner's reserve (it stops on NoSpace; the cleaner frees room).
    let room = match mode {
        Rewrite::Clean => Room::Cleaner,
        Rewrite::Upgrade { .. } => Room::Merge,
    };
    inner.append(items, &[], room)?;
    items.clear();
    Ok(())
}

/// Appends `items` to the log; when there is no room, makes room (clean,
/// then checkpoint so dead segments are freed) and tries once more before
/// answering ENOSPC. For every append but the cleaner's own.
pub(crate) fn append_making_room(
    inner: &Inner,
    items: &[Item],
    buf: &[u8],
    room: Room,
) -> Result<()> {
    debug_assert!(room != Room::Cleaner);
    match inner.append(items, buf, room) {
        Err(EngineError::NoSpace(_)) => {
            make_room(inner)?;
            inner.append(items, buf, room)
        }
        r => r,
    }
}

/// Cleans until dead segments exist (or no victim is left), then writes a
/// checkpoint that frees them. Called by a write that found no room.
pub(crate) fn make_room(inner: &Inner) -> Result<()> {
    let _one = inner.cleaner_lock.lock();
    if !checkpoint::reclaimable(inner) {
        let mut done = Vec::new();
        for _ in 0..8 {
            let Some(v) = pick_victim(inner, VICTIM_LIVE_MAX_TIGHT, u64::MAX, &done, false) else {
                break;
            };
            let rep = clean_segment(inner, v)?;
            inner
                .counters
                .add(Counter::CleanerSpaceBytes, rep.bytes_written);
            done.push(v);
            if checkpoint::reclaimable(inner) {
                break;
            }
        }
    }
    // Two checkpoints: the first frees what lies before both replay
    // positions, the second what lay only before the newer one.
    for _ in 0..2 {
        if checkpoint::reclaimable(inner) {
            checkpoint::write(inner, false)?;
        }
    }
    Ok(())
}

/// One bounded background pass: at most one victim. Returns None when there
/// is nothing worth cleaning.
pub(crate) fn background_pass(inner: &Inner) -> Result<Option<CleanReport>> {
    pass(inner, Reason::Busy)
}

/// One pass while clients are idle (see [`GcPolicy`]).
pub(crate) fn idle_pass(inner: &Inner) -> Result<Option<CleanReport>> {
    pass(inner, Reason::Idle)
}

/// Cleans one victim when [`GcPolicy`] says so for `reason` (any victim
/// below the tight limit when free segments run short).
fn pass(inner: &Inner, reason: Reason) -> Result<Option<CleanReport>> {
    let _one = inner.cleaner_lock.lock();
    let (dead, total) = collectable(inner);
    let b = budget(inner, total);
    let (start, max_live) = match reason {
        Reason::Busy => (b, 1.0 - b),
        Reason::Idle => (b / 2.0, IDLE_VICTIM_LIVE_MAX),
    };
    let tight = {
        let log = inner.log.lock();
        log.table.available() < TIGHT_SEGMENTS
    };
    let max_live = if tight {
        VICTIM_LIVE_MAX_TIGHT
    } else if total > 0 && dead > 0 && dead as f64 > start * total as f64 {
        max_live
    } else {
        return Ok(None);
    };
    // Short of free segments, every dead byte counts (several tails may
    // add up to a segment); otherwise a victim must hold more than a tail.
    let Some(v) = pick_victim(inner, max_live, u64::MAX, &[], !tight) else {
        return Ok(None);
    };
    let rep = clean_segment(inner, v)?;
    let counter = match (tight, reason) {
        (true, _) => Counter::CleanerSpaceBytes,
        (false, Reason::Busy) => Counter::CleanerOverBudgetBytes,
        (false, Reason::Idle) => Counter::CleanerIdleBytes,
    };
    inner.counters.add(counter, rep.bytes_written);
    Ok(Some(rep))
}

/// One step of the idle upgrade: the sealed segment holding the most bytes
/// written below the target is rewritten with the target (every live
/// record of it). None when no sealed segment holds any. A segment is tried
/// once: whatever stays in it (a corrupt record, no room) is not retried.
pub(crate) fn upgrade_pass(inner: &Inner) -> Result<Option<CleanReport>> {
    let _one = inner.cleaner_lock.lock();
    let (segs, _) = sealed(inner);
    let best = {
        let st = inner.state.read();
        segs.iter()
            .map(|&(s, ..)| (s, st.usage.below_target(s)))
            .filter(|&(_, b)| b > 0)
            .max_by_key(|&(_, b)| b)
    };
    let Some((s, _)) = best else {
        return Ok(None);
    };
    let r = rewrite_segment(
        inner,
        s,
        Rewrite::Upgrade {
            all: true,
            keep_others: false,
        },
    );
    inner.state.write().usage.clear_below_target(s);
    r.map(Some)
}

/// Upgrades what was written below the target (see [`compact`]), then
/// cleans every segment sealed before the call that holds any dead byte,
/// upgrades the records of a codec below the target's in the head segment
/// (that of the call's start and the current one), then checkpoints so the
/// victims are freed. `progress(done, total)`.
pub(crate) fn compact(inner: &Inner, mut progress: impl FnMut(u64, u64)) -> Result<CleanReport> {
    let _one = inner.cleaner_lock.lock();
    let (start_seq, head_at_start) = {
        let log = inner.log.lock();
        (log.next_seq, log.head_segment)
    };
    let mut rep = CleanReport::default();
    let total = sealed(inner).0.len() as u64;
    // Each victim once: one holding a corrupt record keeps it (and stays).
    let mut done = Vec::new();
    // First the upgrade of what was written below the target: the segments
    // known to hold such bytes, and when the counters say some were never
    // upgraded (a reopened volume knows no segment), every segment with a
    // record of a codec below the target's.
    let by_codec =
        inner.counters.get(Counter::BelowTargetBytes) > inner.counters.get(Counter::UpgradedBytes);
    for (s, _, _, sectors) in sealed(inner).0 {
        let flagged = inner.state.read().usage.below_target(s) > 0;
        if sectors == 0 || !(flagged || by_codec) {
            continue;
        }
        let r = rewrite_segment(
            inner,
            s,
            Rewrite::Upgrade {
                all: flagged,
                keep_others: false,
            },
        );
        inner.state.write().usage.clear_below_target(s);
        let r = match r {
            // No room for the rewrite: the cleaning below makes some.
            Err(EngineError::NoSpace(_)) => break,
            r => r?,
        };
        if r.records_moved > 0 {
            rep.add(&r);
            done.push(s);
            progress(rep.victims, total);
        }
    }
    while let Some(v) = pick_victim(inner, 1.0 - 1e-9, start_seq, &done, false) {
        let r = match clean_segment(inner, v) {
            // The victims cleaned so far, and segments trimmed empty, keep
            // their room until two checkpoints free them (see `make_room`):
            // on a nearly full volume, free them and go on.
            Err(EngineError::NoSpace(_)) if checkpoint::reclaimable(inner) => {
                checkpoint::write(inner, false)?;
                checkpoint::write(inner, false)?;
                clean_segment(inner, v)?
            }
            r => r?,
        };
        rep.add(&r);
        done.push(v);
        progress(rep.victims, total);
    }
    // The head segment of the call's start was no victim (the log was
    // still filling it; the relocations may have sealed it since), nor is
    // the head now: their records of a codec below the target's are
    // upgraded where they are (a head's copies go to the head itself, and
    // the walk passes over them: their codec is the target's). A note is
    // cleared unless a client wrote below the target meanwhile.
    for step in 0..2 {
        let s = match step {
            0 => head_at_start,
            _ => inner.log.lock().head_segment,
        };
        let below = inner.state.read().usage.below_target(s);
        if done.contains(&s) || !(below > 0 || by_codec) {
            continue;
        }
        done.push(s);
        // The head keeps what is at the target; a sealed one is rewritten
        // whole (and freed).
        let keep_others = s == inner.log.lock().head_segment;
        let mode = Rewrite::Upgrade {
            all: false,
            keep_others,
        };
        match rewrite_segment(inner, s, mode) {
            // No room: the segment keeps its bytes as they are.
            Err(EngineError::NoSpace(_)) => {}
            r => {
                let r = r?;
                let mut st = inner.state.write();
                if st.usage.below_target(s) == below {
                    st.usage.clear_below_target(s);
                }
                if r.records_moved > 0 {
                    rep.add(&r);
                }
            }
        }
    }
    // Two checkpoints free every victim (see `make_room`). The first is a
    // base where there is room for one, so that the chain left is the map
    // as it now is, not the base before plus deltas of every sector moved.
    checkpoint::write_base_if_room(inner)?;
    checkpoint::write(inner, false)?;
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CreateOptions, SimStorage, Volume};

    /// The windowed walk yields the records one scan of the whole segment
    /// yields, in order, with records of every size across window
    /// boundaries and a damaged header just before one.
    #[test]
    fn the_windowed_walk_finds_what_a_whole_segment_scan_finds() {
        let s = Arc::new(SimStorage::new());
        let mut o = CreateOptions::new(256 << 20);
        o.segment_size = 4 << 20;
        let v = Volume::create(s.clone(), &o).unwrap();
        // Incompressible 4 KiB..128 KiB writes (raw records up to the
        // largest) and compressible ones, until a few segments are sealed.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut off = 0u64;
        while off < 40 << 20 {
            let sectors = 1 + rnd() % 32;
            let len = sectors as usize * SECTOR_SIZE;
            let buf: Vec<u8> = if rnd() % 3 == 0 {
                vec![(rnd() % 7) as u8 + 1; len]
            } else {
                (0..len).map(|_| rnd() as u8).collect()
            };
            v.write(off, &buf, false).unwrap();
            off += len as u64;
        }
        v.flush().unwrap();
        let inner = &v.inner;
        let segs: Vec<SegmentId> = sealed(inner).0.iter().map(|&(s, ..)| s).collect();
        assert!(segs.len() >= 4, "{} sealed segments", segs.len());
        // Damage a header 48 bytes before the second window of one segment.
        let damaged = segs[1];
        let seg_off = inner.segment_offset(damaged);
        let mut whole = vec![0u8; inner.seg_size as usize];
        inner.storage.read_at(&mut whole, seg_off).unwrap();
        let cut = RecordScan::new(&whole, inner.uuid, Stride::Record)
            .map(|r| r.offset)
            .filter(|&o| o < WINDOW_BYTES)
            .last()
            .unwrap();
        s.flip_bit(seg_off + cut as u64 + 10, 3);
        let mut crossing = 0;
        for seg in segs {
            let seg_off = inner.segment_offset(seg);
            inner.storage.read_at(&mut whole, seg_off).unwrap();
            let want: Vec<(u64, u64, u32)> = RecordScan::new(&whole, inner.uuid, Stride::Record)
                .map(|r| {
                    (
                        seg_off + r.offset as u64,
                        r.header.seq,
                        r.header.payload_crc,
                    )
                })
                .collect();
            crossing += RecordScan::new(&whole, inner.uuid, Stride::Record)
                .filter(|r| {
                    let end = r.offset + r.header.record_len() as usize;
                    r.offset / WINDOW_BYTES != (end - 1) / WINDOW_BYTES
                })
                .count();
            let mut got = Vec::new();
            let mut buf = Vec::new();
            let log = walk_records(inner, seg, &mut buf, |r, at| {
                got.push((at, r.header.seq, r.header.payload_crc));
                Ok(true)
            })
            .unwrap();
            assert!(log);
            assert_eq!(got, want, "segment {seg}");
            assert!(buf.len() <= WINDOW_BYTES);
        }
        assert!(crossing >= 4, "{crossing} records across a window boundary");
    }
}
