//! Recovery: newest valid checkpoint + replay of the log after it.
//!
//! Decision table for each position the replay visits (one test per row in
//! tests/recovery.rs):
//!
//! | bytes at the position                                   | action                              |
//! |---------------------------------------------------------|-------------------------------------|
//! | valid header, our uuid, seq = expected, payload CRC ok   | apply, advance                      |
//! | anything else (a write that never completed, torn,      | continue at the valid record with   |
//! | zeros, an older record, another volume)                  | the smallest seq >= expected, later |
//! |                                                         | in this segment or at the start of  |
//! |                                                         | another segment (by its header)     |
//! | ... and there is none                                    | end of log: replay stops here       |
//!
//! Seqs never repeat over a volume's life, so every valid record of this
//! volume with a seq at or above the checkpoint's was written after it. A
//! flush waits for every earlier write, so on an undamaged medium no gap
//! precedes flushed data: a gap, or a log that ends, below the newest flush
//! mark's seq (`meta::flush_marks`) is damage, and is reported as the loss
//! of those flushed records (`damage::LostRecords`, with the LBAs of any
//! whose header survived); above it, it is a write that never completed
//! (nothing was promised), passed over. Replay goes on past a gap either
//! way, so records after the damage are recovered. After an unclean stop
//! the volume jumps its seqs by SEQ_JUMP_AFTER_RECOVERY and writes a fresh
//! checkpoint, so records left behind can never be taken for new ones.

use crate::counters::Counter;
use crate::damage::{LostRecords, Truncation};
use crate::error::Result;
use crate::meta::load::{bad_checkpoint, load, ChainShape, Loaded};
use crate::meta::pager::{ChainBytes, Pager};
use crate::space::{SegState, SegmentId, SegmentTable};
use crate::state::log_state::{head_segment_of, max_segments, segment_of, LogState};
use crate::state::map_state::MapState;
use crate::state::Inner;
use crate::storage::Storage;
use squeeze_format::map_entry::is_shared;
use squeeze_format::{
    record::verify_payload, FlushMark, RecordHeader, RecordKind, RecordScan, Stride, Superblock,
    DATA_START, DEDUP_VERSION, RECORD_ALIGN, RECORD_HEADER_SIZE, SHORT_HEADER_SIZE,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

pub struct Recovered {
    pub log: LogState,
    pub state: MapState,
    pub counters: Vec<u64>,
    /// Records applied by replay.
    pub replayed: u64,
    /// Opened seq of the segment holding the checkpoint's replay position.
    pub checkpoint_head_seq: u64,
    /// The shape of the checkpoint chain read.
    pub chain: ChainShape,
    /// Most RAM the map used while the volume opened.
    pub map_peak_bytes: u64,
    /// Flushed records replay could not find (by the flush mark).
    pub lost: Vec<LostRecords>,
    /// The file ends before a record the map or the log names.
    pub truncated: Option<Truncation>,
    /// The end of the furthest record replayed. A record whose last bytes
    /// are zeros verifies even where the file ends before them (reads past
    /// the end give zeros): the open extends the file over it before its
    /// checkpoint names it (`Volume::open`), so that every record a
    /// checkpoint names lies inside the file.
    pub replay_end: u64,
}

/// A run of seqs replay passed over: `[from, to)` (`to` = u64::MAX: the
/// log ended), met at byte `at`.
struct Gap {
    from: u64,
    to: u64,
    at: u64,
}

/// Rebuilds the state from `sb`'s checkpoint and the log after it; `older`
/// are the previous checkpoint's segments (kept, not free). The map pages
/// out beyond `map_cache` bytes as it loads and as the log replays. `mark`
/// is the newest flush mark: seqs it covers that replay cannot find are
/// reported lost.
pub fn recover(
    storage: &dyn Storage,
    sb: &Superblock,
    older: &[SegmentId],
    map_cache: u64,
    mark: Option<FlushMark>,
) -> Result<Recovered> {
    let seg_size = u64::from(sb.segment_size);
    let max_segs = max_segments(sb);
    let src = ChainBytes { storage, seg_size };
    let mut pager = Pager::new(src, map_cache);
    let Loaded {
        mut state,
        position: ck,
        shape: chain,
        mut peak_bytes,
        max_record_end,
    } = load(storage, sb, &mut pager)?;
    if ck.generation > sb.generation {
        return Err(bad_checkpoint(format!(
            "generation {} is newer than the superblock's {}",
            ck.generation, sb.generation
        )));
    }
    for n in &ck.notes {
        if n.segment >= max_segs {
            return Err(bad_checkpoint(format!(
                "a below-target note names segment {} of {max_segs}",
                n.segment
            )));
        }
        // A note of a segment with nothing live is stale (its records died
        // after the note was written): the map is the truth.
        if state.usage.get(n.segment).live_sectors > 0 {
            state
                .usage
                .note_below_target(n.segment, n.below_target_bytes);
        }
    }
    let target = squeeze_codec::Algorithm::new(sb.policy.codec, sb.policy.level);
    let mut counters = ck.counters.clone();
    counters.resize(crate::counters::COUNTERS, 0);

    // Segment headers: seq -> segment, for following the log across segments.
    let file_len = storage.len()?;
    let n_segs = (file_len.saturating_sub(DATA_START).div_ceil(seg_size) as u32).min(max_segs);
    let mut by_seq: BTreeMap<u64, SegmentId> = BTreeMap::new();
    let mut opened: HashMap<SegmentId, u64> = HashMap::new();
    let mut hdr = [0u8; RECORD_HEADER_SIZE];
    for s in 0..n_segs {
        storage.read_at(&mut hdr, sb.segment_offset(s))?;
        if let Ok(h) = RecordHeader::decode(&hdr, &sb.uuid) {
            if h.kind == RecordKind::SegmentHeader && h.uuid == sb.uuid && h.aux == u64::from(s) {
                by_seq.insert(h.seq, s);
                opened.insert(s, h.seq);
            }
        }
    }

    // Replay.
    let head0 = ck.head_offset;
    if head0 < DATA_START || segment_of(head0, seg_size) >= max_segs {
        return Err(bad_checkpoint(format!("head offset {head0} out of bounds")));
    }
    let mut pos = head0;
    let mut expected = ck.next_seq;
    let mut visited: BTreeSet<SegmentId> = BTreeSet::new();
    // Records never cross a segment end, so `pos` stays inside (or at the
    // end of) the segment being replayed, `head_segment`: a head on a
    // segment boundary is the end of the segment before it, never the start
    // of the next (that is entered only by its header, through `by_seq`).
    let mut head_segment = head_segment_of(pos, seg_size);
    visited.insert(head_segment);
    let mut replayed = 0u64;
    let mut replay_end = 0u64;
    let mut gaps: Vec<Gap> = Vec::new();
    // Headers that survived in records whose payload did not: (seq, lba, sectors).
    let mut named: Vec<(u64, u64, u32)> = Vec::new();
    let mut buf = Vec::new();
    // A clean close leaves nothing after the head.
    let mut more = !sb.clean;
    while more {
        if let Some(h) = read_record(storage, sb, head_segment, pos, expected, &mut buf) {
            pager.with_map_mut(&mut state, |st| st.apply(&h, pos, seg_size))?;
            if h.kind == RecordKind::Extent {
                counters[Counter::BytesWritten as usize] += h.raw_len() as u64;
            }
            // What was written (or relocated) below the target since the
            // checkpoint: the upgrade's work, as the append noted it.
            if h.kind.has_payload() && crate::pipeline::adapt::below_target_codec(h.codec, target) {
                state
                    .usage
                    .note_below_target(segment_of(pos, seg_size), h.raw_len() as u64);
            }
            counters[Counter::LogBytes as usize] += h.record_len();
            pos += h.record_len();
            replay_end = replay_end.max(pos);
            expected += 1;
            replayed += 1;
            continue;
        }
        // A gap (a record whose write never completed, or damage), or the
        // end of this segment's records: continue with the valid record of
        // the smallest seq above, here or at the start of another segment.
        let here = scan_forward(storage, sb, head_segment, pos, expected, &mut named)?;
        let there = by_seq
            .range(expected..)
            .find(|(_, s)| !visited.contains(s))
            .map(|(q, s)| (*q, *s));
        let gap_at = pos;
        match (here, there) {
            (Some((p, q)), t) if t.is_none_or(|(q2, _)| q < q2) => {
                gaps.push(Gap {
                    from: expected,
                    to: q,
                    at: gap_at,
                });
                pos = p;
                expected = q;
            }
            (_, Some((q, s))) => {
                gaps.push(Gap {
                    from: expected,
                    to: q,
                    at: gap_at,
                });
                visited.insert(s);
                head_segment = s;
                pos = sb.segment_offset(s);
                expected = q;
            }
            (_, None) => {
                gaps.push(Gap {
                    from: expected,
                    to: u64::MAX,
                    at: gap_at,
                });
                more = false;
            }
        }
    }
    peak_bytes = peak_bytes.max(state.map.memory_bytes());
    counters[Counter::MapFaults as usize] += pager.faults;
    counters[Counter::MapEvictions as usize] += pager.evictions;
    let skipped: u64 = gaps
        .iter()
        .filter(|g| g.to != u64::MAX)
        .map(|g| g.to - g.from)
        .sum();
    if skipped > 0 {
        tracing::info!(
            skipped,
            "replay passed over records missing from the log (writes that never completed, \
             unless a flush mark covers them)"
        );
    }
    let lost = lost_records(&gaps, &named, ck.next_seq, mark);
    // The file must hold every record the map names, and the log head at
    // the newest flush mark where the mark is of records after the
    // checkpoint. (Not every record replayed: one whose last bytes are
    // zeros verifies when the file ends before them, as reads past the end
    // give zeros; it is the unflushed tail a power cut left on a page
    // boundary, and reads back right.)
    let flushed_end = mark
        .filter(|m| m.flushed_seq > ck.next_seq.max(m.epoch_seq))
        .map_or(0, |m| m.flushed_end);
    // Record ends (in the map, in the mark) are aligned: the content ends
    // at most RECORD_ALIGN - 1 bytes before.
    let content = |end: u64| end.saturating_sub(RECORD_ALIGN - 1);
    let needed = content(max_record_end).max(content(flushed_end));
    let truncated = (file_len < needed).then_some(Truncation { file_len, needed });

    // Segment states.
    let mut table = SegmentTable::new(max_segs);
    for s in 0..n_segs {
        table.set(s, SegState::Free);
    }
    let log_state = |s: SegmentId| SegState::Log {
        opened_seq: opened.get(&s).copied().unwrap_or(0),
    };
    for (s, u) in state.usage.iter() {
        if u.live_sectors > 0 {
            table.set(s, log_state(s));
        }
    }
    for &s in &visited {
        table.set(s, log_state(s));
    }
    table.set(head_segment, log_state(head_segment));
    for &s in sb.checkpoint.segments.iter().chain(older) {
        if s == head_segment {
            return Err(bad_checkpoint(format!(
                "the log head ({pos}) is in checkpoint segment {s}"
            )));
        }
        if s < max_segs {
            table.set(s, SegState::Checkpoint);
        }
    }
    let checkpoint_head_seq = opened
        .get(&head_segment_of(head0, seg_size))
        .copied()
        .unwrap_or(0);
    Ok(Recovered {
        log: LogState {
            head_offset: pos,
            allocated_end: pos,
            head_segment,
            next_seq: expected,
            table,
            bytes_since_checkpoint: 0,
            ahead_pending: false,
            ahead_failed: None,
            prewritten: Default::default(),
        },
        state,
        counters,
        replayed,
        checkpoint_head_seq,
        chain,
        map_peak_bytes: peak_bytes,
        lost,
        truncated,
        replay_end,
    })
}

/// The gaps that a flush mark covers: records of seqs in
/// `[max(mark's epoch, checkpoint's next seq), mark's flushed seq)` were
/// durable before the crash, so each one replay did not find is lost.
fn lost_records(
    gaps: &[Gap],
    named: &[(u64, u64, u32)],
    checkpoint_seq: u64,
    mark: Option<FlushMark>,
) -> Vec<LostRecords> {
    let Some(m) = mark else { return Vec::new() };
    let lo = m.epoch_seq.max(checkpoint_seq);
    let hi = m.flushed_seq;
    gaps.iter()
        .filter_map(|g| {
            let (from, to) = (g.from.max(lo), g.to.min(hi));
            (from < to).then(|| {
                let mut lbas: Vec<(u64, u32)> = named
                    .iter()
                    .filter(|(q, _, _)| (from..to).contains(q))
                    .map(|&(_, lba, n)| (lba, n))
                    .collect();
                lbas.sort_unstable();
                lbas.dedup();
                LostRecords {
                    first_seq: from,
                    end_seq: to,
                    log_offset: g.at,
                    lbas,
                }
            })
        })
        .collect()
}

/// Reads the record at `pos` in segment `seg` if it is the valid record
/// `expected`. A segment header counts only at the start of `seg`: the
/// header of the segment after a full one is not a continuation of it.
fn read_record(
    storage: &dyn Storage,
    sb: &Superblock,
    seg: SegmentId,
    pos: u64,
    expected: u64,
    buf: &mut Vec<u8>,
) -> Option<RecordHeader> {
    let seg_start = sb.segment_offset(seg);
    let seg_end = seg_start + u64::from(sb.segment_size);
    if pos < seg_start || pos + SHORT_HEADER_SIZE as u64 > seg_end {
        return None;
    }
    // A full header's bytes, or as many as the segment has left (a short
    // record may end there).
    let mut hdr = [0u8; RECORD_HEADER_SIZE];
    let n = (seg_end - pos).min(RECORD_HEADER_SIZE as u64) as usize;
    storage.read_at(&mut hdr[..n], pos).ok()?;
    let h = RecordHeader::decode(&hdr[..n], &sb.uuid).ok()?;
    if h.uuid != sb.uuid || h.seq != expected || pos + h.record_len() > seg_end {
        return None;
    }
    if h.kind == RecordKind::SegmentHeader && (pos != seg_start || h.aux != u64::from(seg)) {
        return None;
    }
    if h.stored_len > 0 {
        buf.resize(h.stored_len as usize, 0);
        storage.read_at(buf, pos + h.header_len() as u64).ok()?;
        verify_payload(&h, buf).ok()?;
    }
    in_range(&h, sb).then_some(h)
}

/// Whether a record's sectors lie where its kind may: client records
/// inside the volume, records of hidden addresses (deduplication) inside
/// their range, a Link from the first to the second (its target range is
/// checked by the header's bounds) in a volume whose version has Links.
fn in_range(h: &RecordHeader, sb: &Superblock) -> bool {
    let n = u64::from(h.sectors);
    let client = h.lba + n <= sb.sectors();
    let hidden = n > 0 && is_shared(h.lba) && is_shared(h.lba + n - 1);
    match h.kind {
        RecordKind::Extent | RecordKind::Relocate | RecordKind::Zero => client || hidden,
        RecordKind::Link => client && sb.version >= DEDUP_VERSION,
        RecordKind::SegmentHeader => true,
    }
}

/// The first valid record after `pos` in segment `seg` with a seq of at
/// least `min_seq`, as (offset, seq). Probes every record-aligned offset:
/// headers and payloads are checksummed, and every record of this volume
/// with such a seq was written after the checkpoint (seqs never repeat).
///
/// Records passed over whose header is intact but whose payload fails its
/// checksum (or reaches past the volume) go to `named` as (seq, lba,
/// sectors): damaged records whose sectors can be named.
fn scan_forward(
    storage: &dyn Storage,
    sb: &Superblock,
    seg: SegmentId,
    pos: u64,
    min_seq: u64,
    named: &mut Vec<(u64, u64, u32)>,
) -> Result<Option<(u64, u64)>> {
    let seg_size = u64::from(sb.segment_size);
    let seg_start = sb.segment_offset(seg);
    let seg_end = seg_start + seg_size;
    // The record at `pos` itself, when its header survived.
    let mut hdr = [0u8; RECORD_HEADER_SIZE];
    let n = (seg_end.saturating_sub(pos)).min(RECORD_HEADER_SIZE as u64) as usize;
    if n >= SHORT_HEADER_SIZE && storage.read_at(&mut hdr[..n], pos).is_ok() {
        if let Ok(h) = RecordHeader::decode(&hdr[..n], &sb.uuid) {
            if h.uuid == sb.uuid && h.seq >= min_seq && h.kind.has_payload() {
                named.push((h.seq, h.lba, h.sectors));
            }
        }
    }
    let from = squeeze_format::align_record(pos + 1);
    // Read in windows (a gap is usually followed closely by the next
    // record), each overlapping the next by a whole record.
    const WINDOW: u64 = 1 << 20;
    let overlap = squeeze_format::MAX_RECORD_BYTES.div_ceil(16) * 16;
    let mut start = from;
    let mut buf = Vec::new();
    while start + SHORT_HEADER_SIZE as u64 <= seg_end {
        let end = (start + WINDOW + overlap).min(seg_end);
        buf.resize((end - start) as usize, 0);
        storage.read_at(&mut buf, start)?;
        // Probe offsets in [start, start + WINDOW) (all of them in the last window).
        let probe_end = if end == seg_end {
            buf.len()
        } else {
            WINDOW as usize
        };
        let found = RecordScan::new(&buf, sb.uuid, Stride::Probe)
            .take_while(|r| r.offset < probe_end)
            .find(|r| {
                let h = &r.header;
                if h.seq < min_seq || h.kind == RecordKind::SegmentHeader {
                    return false;
                }
                let ok = in_range(h, sb) && verify_payload(h, r.payload).is_ok();
                if !ok && h.kind.has_payload() {
                    named.push((h.seq, h.lba, h.sectors));
                }
                ok
            });
        if let Some(r) = found {
            return Ok(Some((start + r.offset as u64, r.header.seq)));
        }
        if end == seg_end {
            break;
        }
        start += WINDOW;
    }
    Ok(None)
}

/// Punches every free segment inside the file (space a crash left behind).
pub fn punch_free(inner: &Inner) -> Result<()> {
    let free: Vec<SegmentId> = {
        let log = inner.log.lock();
        log.table
            .iter()
            .filter(|(_, s)| *s == SegState::Free)
            .map(|(s, _)| s)
            .collect()
    };
    for s in free {
        let off = inner.segment_offset(s);
        inner.storage.punch(off, inner.seg_size)?;
    }
    Ok(())
}
