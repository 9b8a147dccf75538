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
//! volume with a seq at or above the checkpoint's was written after it:
//! passing over a gap loses only the writes that had not completed (a killed
//! process loses nothing it was told was written). A flush waits for every
//! earlier write, so no gap ever precedes flushed data. After an unclean stop
//! the volume jumps its seqs by SEQ_JUMP_AFTER_RECOVERY and writes a fresh
//! checkpoint, so records left behind can never be taken for new ones.

use crate::chain_index::{ChainIndex, PieceIndex};
use crate::counters::Counter;
use crate::error::{EngineError, Result};
use crate::map::{Paged, SectorMap};
use crate::space::{SegState, SegmentId, SegmentTable, Usage};
use crate::state::{head_segment_of, max_segments, segment_of, Inner, LogState, MapState};
use crate::storage::Storage;
use squeeze_format::checkpoint::{pieces, MapRun};
use squeeze_format::checkpoint_v1::CheckpointReader;
use squeeze_format::{
    checksum, record::verify_payload, FormatError, MapEntry, PieceKind, RecordHeader, RecordKind,
    RecordScan, SegmentNote, Stride, Superblock, DATA_START, RECORD_HEADER_SIZE,
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
}

/// A replayed record met a paged-out chunk (nothing pages out before the
/// volume is open).
fn paged_at_recovery(p: Paged) -> EngineError {
    EngineError::Internal(format!("map chunk {} paged out during recovery", p.0))
}

/// Bytes of a chain's base and deltas; format 1's single stream counts as
/// a base that cannot take deltas.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChainShape {
    pub base_bytes: u64,
    pub delta_bytes: u64,
    pub deltas: u64,
    pub takes_deltas: bool,
}

/// What a checkpoint holds besides the map.
struct CheckpointPosition {
    generation: u64,
    next_seq: u64,
    head_offset: u64,
    counters: Vec<u64>,
    /// Segments' below-target notes (none before format 3).
    notes: Vec<SegmentNote>,
}

/// Reads and checks the checkpoint the superblock names.
pub fn read_checkpoint(storage: &dyn Storage, sb: &Superblock) -> Result<Vec<u8>> {
    let seg = u64::from(sb.segment_size);
    let len = sb.checkpoint.len;
    if len > seg * sb.checkpoint.segments.len() as u64 {
        return Err(EngineError::Metadata(FormatError::Invalid {
            what: "superblock",
            why: "checkpoint longer than its segments".into(),
        }));
    }
    let mut stream = vec![0u8; len as usize];
    for (k, s) in sb.checkpoint.segments.iter().enumerate() {
        let from = k * seg as usize;
        if from >= stream.len() {
            break;
        }
        let to = (from + seg as usize).min(stream.len());
        storage.read_at(&mut stream[from..to], sb.segment_offset(*s))?;
    }
    if sb.version == 1 {
        let got = checksum::crc32c(&stream);
        if got != sb.checkpoint.crc {
            return Err(EngineError::Metadata(FormatError::ChecksumMismatch {
                what: "checkpoint",
                expected: sb.checkpoint.crc,
                got,
            }));
        }
    }
    Ok(stream)
}

/// Loads the map from a format 2 chain: the base, then each delta in order;
/// every piece is checked by its own CRC, the last one also against the
/// superblock. Indexes where each piece's runs lie as it goes (the map
/// pages out to them).
fn load_chain(
    stream: &[u8],
    sb: &Superblock,
    map: &mut SectorMap,
    index: &mut ChainIndex,
) -> Result<(CheckpointPosition, ChainShape)> {
    let max_segs = max_segments(sb);
    let seg_size = u64::from(sb.segment_size);
    let mut shape = ChainShape {
        takes_deltas: true,
        ..ChainShape::default()
    };
    let mut last = None;
    let mut at = 0u64;
    for (k, piece) in pieces(stream, &sb.uuid).enumerate() {
        let piece = piece.map_err(EngineError::Metadata)?;
        let k = u16::try_from(k).map_err(|_| bad_checkpoint("more than 65535 pieces".into()))?;
        for run in piece.runs() {
            let run = run.map_err(EngineError::Metadata)?;
            check_run(&run, seg_size, max_segs)?;
            match piece.header.kind {
                PieceKind::Base => map.load_run(run),
                PieceKind::Delta => map.apply_run(run, Some(k)),
            }
        }
        index.pieces.push(PieceIndex::from_bytes(
            at + piece.runs_offset() as u64,
            piece.run_bytes(),
        ));
        at += piece.len;
        match piece.header.kind {
            PieceKind::Base => shape.base_bytes = piece.len,
            PieceKind::Delta => {
                shape.delta_bytes += piece.len;
                shape.deltas += 1;
            }
        }
        last = Some((
            piece.crc,
            CheckpointPosition {
                generation: piece.header.generation,
                next_seq: piece.header.next_seq,
                head_offset: piece.header.head_offset,
                counters: piece.counters,
                notes: piece.notes,
            },
        ));
    }
    let Some((crc, position)) = last else {
        return Err(bad_checkpoint("the chain holds no piece".into()));
    };
    if crc != sb.checkpoint.crc {
        return Err(EngineError::Metadata(FormatError::ChecksumMismatch {
            what: "checkpoint chain's last piece",
            expected: sb.checkpoint.crc,
            got: crc,
        }));
    }
    Ok((position, shape))
}

/// Loads the map from a format 1 stream (dense chunks).
fn load_v1(stream: &[u8], sb: &Superblock, map: &mut SectorMap) -> Result<CheckpointPosition> {
    let max_segs = max_segments(sb);
    let seg_size = u64::from(sb.segment_size);
    let ck = CheckpointReader::decode(stream, &sb.uuid).map_err(EngineError::Metadata)?;
    for chunk in ck.chunks() {
        let (index, entries) = chunk.map_err(EngineError::Metadata)?;
        for e in entries.iter().filter(|e| e.is_mapped()) {
            check_entry(*e, seg_size, max_segs)?;
        }
        if (index + 1) * squeeze_format::CHUNK_ENTRIES as u64
            > sb.sectors() + squeeze_format::CHUNK_ENTRIES as u64
        {
            return Err(bad_checkpoint(format!(
                "map chunk {index} beyond the volume"
            )));
        }
        map.load_chunk(index, entries);
    }
    Ok(CheckpointPosition {
        generation: ck.header.generation,
        next_seq: ck.header.next_seq,
        head_offset: ck.header.head_offset,
        counters: ck.counters,
        notes: Vec::new(),
    })
}

fn bad_checkpoint(why: String) -> EngineError {
    EngineError::Metadata(FormatError::Invalid {
        what: "checkpoint",
        why,
    })
}

/// A map entry points into the segments of the volume.
fn check_entry(e: MapEntry, seg_size: u64, max_segs: u32) -> Result<()> {
    if e.record_offset() < DATA_START
        || segment_of(e.record_offset(), seg_size) >= max_segs
        || e.record_len() == 0
    {
        return Err(bad_checkpoint(format!(
            "map entry {:#x} out of bounds",
            e.0
        )));
    }
    Ok(())
}

/// A run points into the volume's segments. Whether it lies inside the
/// volume is checked on the whole map once the chain is applied
/// ([`check_inside`]): after a shrink (`Volume::resize`), runs of the chain
/// from before it may lie past the new end, unmapped by a later piece.
fn check_run(r: &MapRun, seg_size: u64, max_segs: u32) -> Result<()> {
    if r.first.is_mapped() {
        check_entry(r.first, seg_size, max_segs)?;
    }
    Ok(())
}

/// Nothing is mapped past the volume's end.
fn check_inside(map: &SectorMap, sectors: u64) -> Result<()> {
    match map
        .next_mapped(sectors, u64::MAX)
        .map_err(paged_at_recovery)?
    {
        Some(lba) => Err(bad_checkpoint(format!(
            "sector {lba} mapped beyond the volume's {sectors} sectors"
        ))),
        None => Ok(()),
    }
}

/// Rebuilds the state from `sb`'s checkpoint and the log after it; `older`
/// are the previous checkpoint's segments (kept, not free).
pub fn recover(storage: &dyn Storage, sb: &Superblock, older: &[SegmentId]) -> Result<Recovered> {
    let seg_size = u64::from(sb.segment_size);
    let max_segs = max_segments(sb);
    let stream = read_checkpoint(storage, sb)?;
    let mut state = MapState {
        map: SectorMap::new(),
        usage: Usage::default(),
        chain: None,
    };
    let (ck, chain) = if sb.version == 1 {
        let ck = load_v1(&stream, sb, &mut state.map)?;
        let shape = ChainShape {
            base_bytes: stream.len() as u64,
            ..ChainShape::default()
        };
        (ck, shape)
    } else {
        let mut index = ChainIndex {
            segments: sb.checkpoint.segments.clone(),
            pieces: Vec::new(),
        };
        let loaded = load_chain(&stream, sb, &mut state.map, &mut index)?;
        state.chain = Some(index);
        loaded
    };
    drop(stream);
    check_inside(&state.map, sb.sectors())?;
    if ck.generation > sb.generation {
        return Err(bad_checkpoint(format!(
            "generation {} is newer than the superblock's {}",
            ck.generation, sb.generation
        )));
    }
    let usage = &mut state.usage;
    state.map.for_each_run(
        |c, _| Err(paged_at_recovery(Paged(c))),
        |r| {
            // A run is consecutive sectors of one extent: one record,
            // one segment.
            let seg = segment_of(r.first.record_offset(), seg_size);
            usage.add_run(seg, r.first, r.sectors);
        },
    )?;
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
        if let Ok(h) = RecordHeader::decode(&hdr) {
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
    let mut skipped = 0u64;
    let mut buf = Vec::new();
    // A clean close leaves nothing after the head.
    let mut more = !sb.clean;
    while more {
        if let Some(h) = read_record(storage, sb, head_segment, pos, expected, &mut buf) {
            state.apply(&h, pos, seg_size).map_err(paged_at_recovery)?;
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
            expected += 1;
            replayed += 1;
            continue;
        }
        // A gap (a record whose write never completed), or the end of this
        // segment's records: continue with the valid record of the smallest
        // seq above, here or at the start of another segment.
        let here = scan_forward(storage, sb, head_segment, pos, expected)?;
        let there = by_seq
            .range(expected..)
            .find(|(_, s)| !visited.contains(s))
            .map(|(q, s)| (*q, *s));
        match (here, there) {
            (Some((p, q)), t) if t.is_none_or(|(q2, _)| q < q2) => {
                skipped += q - expected;
                pos = p;
                expected = q;
            }
            (_, Some((q, s))) => {
                skipped += q - expected;
                visited.insert(s);
                head_segment = s;
                pos = sb.segment_offset(s);
                expected = q;
            }
            (_, None) => more = false,
        }
    }
    if skipped > 0 {
        tracing::info!(
            skipped,
            "replay passed over records whose writes never completed before the crash"
        );
    }

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
    })
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
    if pos < seg_start || pos + RECORD_HEADER_SIZE as u64 > seg_end {
        return None;
    }
    let mut hdr = [0u8; RECORD_HEADER_SIZE];
    storage.read_at(&mut hdr, pos).ok()?;
    let h = RecordHeader::decode(&hdr).ok()?;
    if h.uuid != sb.uuid || h.seq != expected || pos + h.record_len() > seg_end {
        return None;
    }
    if h.kind == RecordKind::SegmentHeader && (pos != seg_start || h.aux != u64::from(seg)) {
        return None;
    }
    if h.stored_len > 0 {
        buf.resize(h.stored_len as usize, 0);
        storage.read_at(buf, pos + RECORD_HEADER_SIZE as u64).ok()?;
        verify_payload(&h, buf).ok()?;
    }
    if matches!(
        h.kind,
        RecordKind::Extent | RecordKind::Relocate | RecordKind::Zero
    ) && h.lba + u64::from(h.sectors) > sb.sectors()
    {
        return None;
    }
    Some(h)
}

/// The first valid record after `pos` in segment `seg` with a seq of at
/// least `min_seq`, as (offset, seq). Probes every record-aligned offset:
/// headers and payloads are checksummed, and every record of this volume
/// with such a seq was written after the checkpoint (seqs never repeat).
fn scan_forward(
    storage: &dyn Storage,
    sb: &Superblock,
    seg: SegmentId,
    pos: u64,
    min_seq: u64,
) -> Result<Option<(u64, u64)>> {
    let seg_size = u64::from(sb.segment_size);
    let seg_start = sb.segment_offset(seg);
    let seg_end = seg_start + seg_size;
    let from = squeeze_format::align_record(pos + 1);
    // Read in windows (a gap is usually followed closely by the next
    // record), each overlapping the next by a whole record.
    const WINDOW: u64 = 1 << 20;
    let overlap = squeeze_format::MAX_RECORD_BYTES.div_ceil(16) * 16;
    let mut start = from;
    let mut buf = Vec::new();
    while start + RECORD_HEADER_SIZE as u64 <= seg_end {
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
                h.seq >= min_seq
                    && h.kind != RecordKind::SegmentHeader
                    && h.lba + u64::from(h.sectors) <= sb.sectors()
                    && verify_payload(h, r.payload).is_ok()
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
