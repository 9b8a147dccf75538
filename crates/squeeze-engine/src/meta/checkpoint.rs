//! Writing a checkpoint: the sector map exactly at a log position, as a
//! piece of the checkpoint chain (format 2, `squeeze_format::checkpoint`):
//! a **delta** with only the sectors whose mapping changed since the last
//! checkpoint, appended after the chain's last piece, or a **base** with the
//! whole map, starting a new chain in free segments. A base is written when
//! the deltas add up to [`REBASE_FACTOR`] times the base (and at least
//! [`REBASE_MIN_BYTES`]), so checkpoint bytes follow what clients change,
//! not the size of the map, and recovery reads at most
//! `1 + REBASE_FACTOR` times a base; when `compact` asks for one
//! ([`write_base_if_room`]); and when the map pages and a quarter of its
//! chunks are spread over nearly as many pieces as a paged-out chunk may
//! be (`SectorMap::crowded`: changes all over the map would otherwise
//! hold it in memory).
//!
//! Steps, and what a crash after each leaves:
//! 1. Under the log lock, wait until every reserved record is installed,
//!    then encode the piece (the map's changed runs, or all of them), the
//!    counters and the head, and write it as it is encoded
//!    (`stream_piece`: its runs counted first, 64 KiB per write, its CRC
//!    last, so a big map's piece is never held whole in memory): a delta
//!    after the chain's last piece (the rest of its last segment, then
//!    newly allocated free segments), a base into newly allocated free
//!    segments. (Bytes no superblock names: pieces are padded to 4 KiB, so
//!    none shares a block with a named one, and new segments were free.)
//! 2. Sync: every record before the head is durable, and the piece. (Old
//!    checkpoint + replay still rebuild the same state.)
//! 3. Write the superblock naming the chain (its segments, its length and
//!    the CRC of the new last piece) and sync: from here recovery starts at
//!    the new head.
//! 4. Free the segments only the checkpoint before the previous one used
//!    (the previous one stays intact: the other superblock slot names it,
//!    and a damaged newest slot falls back to it) and every log segment that
//!    lies wholly before both checkpoints' replay positions and held no live
//!    sector at step 1; punch them out. (Nothing durable refers to them.)

use crate::chain_index::{ChainIndex, IndexBuilder, PieceIndex};
use crate::counters::{Counter, COUNTERS};
use crate::error::{EngineError, Internal, NoSpace, Result};
use crate::meta::pager;
use crate::meta::superblock as sbio;
use crate::space::Usage;
use crate::space::{SegState, SegmentId};
use crate::state::log_state::LogState;
use crate::state::map_state::MapState;
use crate::state::Inner;
use squeeze_format::checkpoint::SegmentNote;
use squeeze_format::checkpoint::{piece_len, runs_offset};
use squeeze_format::superblock::CHAIN_VERSION;
use squeeze_format::{CheckpointRef, MapRun, PieceHeader, PieceKind, PieceStream, FORMAT_VERSION};

/// A new base once the chain's deltas reach this many times its base ...
pub const REBASE_FACTOR: u64 = 3;
/// ... and at least this many bytes (a small map would otherwise be
/// rewritten at nearly every checkpoint for nothing: reading a few MiB of
/// deltas at recovery costs milliseconds).
pub const REBASE_MIN_BYTES: u64 = 4 << 20;

/// Segments a base piece of the current map needs, with `extra_runs` more
/// runs than it has now, plus one for a delta that spills over.
pub(crate) fn segments_needed(inner: &Inner, extra_runs: u64) -> u64 {
    let (runs, notes) = {
        let st = inner.state.read();
        (
            st.map.weight() + extra_runs,
            st.usage.below_target_notes().len(),
        )
    };
    piece_len(COUNTERS, notes, runs).div_ceil(inner.seg_size) + 1
}

/// True when dead log segments wait to be freed (by at most two
/// checkpoints: see `CheckpointHistory`).
pub(crate) fn reclaimable(inner: &Inner) -> bool {
    reclaimable_segments(inner) > 0
}

/// Dead log segments before the head: a checkpoint frees those also before
/// the previous checkpoint's head, a second one the rest.
pub(crate) fn reclaimable_segments(inner: &Inner) -> u64 {
    let log = inner.log.lock();
    let st = inner.state.read();
    dead_before(&log, &st.usage, log.head_seq()).count() as u64
}

/// Log segments opened before `seq` with nothing live in them.
fn dead_before<'a>(
    log: &'a LogState,
    usage: &'a Usage,
    seq: u64,
) -> impl Iterator<Item = SegmentId> + 'a {
    log.table.iter().filter_map(move |(s, state)| match state {
        SegState::Log { opened_seq } if opened_seq < seq && usage.get(s).live_sectors == 0 => {
            Some(s)
        }
        _ => None,
    })
}

/// Whether the next piece starts a new chain.
fn wants_base(inner: &Inner) -> bool {
    let (version, len) = {
        let sb = inner.sb.lock();
        (sb.version, sb.checkpoint.len)
    };
    let due = {
        let h = inner.ckpt_history.lock();
        h.need_base
            || h.delta_bytes >= (h.rebase_factor * h.base_bytes).max(h.rebase_min_bytes)
            // The map numbers a chain's pieces in 16 bits.
            || h.deltas + 1 >= u64::from(u16::MAX)
    };
    due || version < CHAIN_VERSION || len == 0 || inner.state.read().map.crowded()
}

/// Writes a checkpoint; with `clean`, also marks the volume cleanly closed.
pub fn write(inner: &Inner, clean: bool) -> Result<()> {
    write_piece(inner, clean, false)
}

/// Writes a checkpoint whose piece is a base when the free segments hold
/// one beside the cleaner's reserve, and one `write` would choose
/// otherwise. After a compaction that moved most of the map, the chain is
/// the old base plus deltas about as big as the map (up to
/// [`REBASE_FACTOR`] bases of them wait for the next rebase); a base now,
/// and any checkpoint after it, leave one piece of the map as it is.
pub fn write_base_if_room(inner: &Inner) -> Result<()> {
    let needed = segments_needed(inner, 0) + crate::space::gc_policy::TIGHT_SEGMENTS;
    let room = inner.log.lock().table.available() >= needed;
    write_piece(inner, false, room)
}

fn write_piece(inner: &Inner, clean: bool, force_base: bool) -> Result<()> {
    let _one = inner.ckpt_lock.lock();
    inner.check_not_poisoned()?;
    let mut base = force_base || wants_base(inner);
    let chain = inner.sb.lock().checkpoint.clone();
    // 1. The piece, at the head.
    let (built, freeable, generation, new_head_seq) = {
        let mut log = inner.log.lock();
        let t = inner.tickets.issued();
        inner.tickets.wait_below(t);
        let mut st = inner.state.write();
        let new_head_seq = log.head_seq();
        // Log segments are freed only once neither this checkpoint's replay
        // nor the previous one's (the other superblock slot) can visit them.
        let before = new_head_seq.min(inner.ckpt_history.lock().prev_head_seq);
        let freeable: Vec<SegmentId> = dead_before(&log, &st.usage, before).collect();
        log.bytes_since_checkpoint = 0;
        let generation = inner.sb.lock().generation + 1;
        // From here until the superblock names the piece, a failure leaves
        // the changes taken out of the map's record (they are put back, but
        // a delta's may be half written): the next checkpoint then writes
        // everything.
        inner.ckpt_history.lock().need_base = true;
        // Chunks spread over too many pieces go whole into this one only
        // when the map pages.
        let pressed = st.map.memory_bytes() > pager::map_cache(inner);
        st.map.freeze(pressed);
        let counters = inner.counters.snapshot();
        let notes = st.usage.below_target_notes();
        let mut header = PieceHeader {
            kind: PieceKind::Delta,
            uuid: inner.uuid,
            generation,
            next_seq: log.next_seq,
            head_offset: log.head_offset,
        };
        let mut built = None;
        if !base {
            let b = stream_piece(
                inner,
                &mut log,
                &st,
                Some(&chain),
                &header,
                &counters,
                &notes,
            );
            // A chain longer than the superblock can list restarts.
            if matches!(b, Built::TooLong) {
                base = true;
            } else {
                built = Some(b);
            }
        }
        let built = match built {
            Some(b) => b,
            None => {
                header.kind = PieceKind::Base;
                stream_piece(inner, &mut log, &st, None, &header, &counters, &notes)
            }
        };
        (built, freeable, generation, new_head_seq)
    };
    // A failure from here on puts the changes back in the map's record.
    let fail = |e: EngineError| {
        inner.poison(&e);
        inner.state.write().map.thaw();
        e
    };
    let (new_ref, piece_bytes, index) = match built {
        Built::Written {
            chain,
            bytes,
            index,
        } => (chain, bytes, index),
        Built::TooLong => unreachable!("a base always fits in a new chain"),
        Built::Refused(e) => {
            inner.state.write().map.thaw();
            return Err(e);
        }
        Built::AllocFailed(e) => {
            inner.state.write().map.thaw();
            return Err(e.into_engine(inner));
        }
        Built::WriteFailed(segs, e) => {
            release(inner, &segs);
            return Err(fail(e));
        }
    };
    // 2. Everything before the head is durable, and the piece.
    if let Err(e) = inner.storage.sync() {
        let only_new: Vec<SegmentId> = new_ref
            .segments
            .iter()
            .filter(|s| !chain.segments.contains(s))
            .copied()
            .collect();
        release(inner, &only_new);
        return Err(fail(e.into()));
    }
    // 3. Make it current.
    {
        let mut sb = inner.sb.lock();
        sb.checkpoint = new_ref.clone();
        sb.version = FORMAT_VERSION;
        sb.clean = clean;
        sbio::write(&*inner.storage, &mut sb).map_err(fail)?;
        debug_assert_eq!(sb.generation, generation);
    }
    // The superblock says this build's format, durably: records may have
    // short headers and block payloads from now on.
    inner
        .short_records
        .store(true, std::sync::atomic::Ordering::Release);
    inner
        .block_payloads
        .store(true, std::sync::atomic::Ordering::Release);
    // The map's chunks are in the chain now: those that did not change
    // since may page out.
    {
        let mut st = inner.state.write();
        let st = &mut *st;
        match (&mut st.chain, base) {
            (Some(c), false) => {
                c.segments = new_ref.segments.clone();
                c.pieces.push(index);
                st.map.note_delta((c.pieces.len() - 1) as u16);
            }
            (None, false) => {
                // A delta on a chain read from format 1 (not indexed):
                // nothing pages out until the next base.
                st.map.note_delta(0);
                st.map.untrack_all();
            }
            (_, true) => {
                st.chain = Some(ChainIndex {
                    segments: new_ref.segments.clone(),
                    pieces: vec![index],
                });
                st.map.note_base();
            }
        }
        pager::page_out(inner, st);
    }
    inner
        .counters
        .add(Counter::CheckpointBytes, piece_bytes + 4096);
    inner.counters.add(Counter::Checkpoints, 1);
    // 4. Free what nothing durable needs any more: segments only the
    // checkpoint before the previous one used (the previous one stays,
    // named by the other slot).
    let mut free = {
        let mut h = inner.ckpt_history.lock();
        h.prev_head_seq = new_head_seq;
        h.need_base = false;
        if base {
            h.base_bytes = piece_bytes;
            h.delta_bytes = 0;
            h.deltas = 0;
        } else {
            h.delta_bytes += piece_bytes;
            h.deltas += 1;
        }
        let previous_only: Vec<SegmentId> = chain
            .segments
            .iter()
            .filter(|s| !new_ref.segments.contains(s))
            .copied()
            .collect();
        let mut older = std::mem::replace(&mut h.older_segments, previous_only);
        older.retain(|s| !new_ref.segments.contains(s));
        older
    };
    free.extend(freeable);
    let freed = release(inner, &free);
    inner.counters.add(Counter::SegmentsReclaimed, freed);
    Ok(())
}

/// Bytes left in the chain's last segment after its last piece.
fn room_after(inner: &Inner, chain: &CheckpointRef) -> u64 {
    let used = chain.len % inner.seg_size;
    if chain.segments.is_empty() || used == 0 {
        0
    } else {
        inner.seg_size - used
    }
}

/// Why segments for a checkpoint could not be had.
enum AllocError {
    NoFree,
    Io(std::io::Error),
}

impl AllocError {
    /// The engine's error (a storage failure nobody planned for poisons the
    /// volume); call without the log lock held.
    fn into_engine(self, inner: &Inner) -> EngineError {
        match self {
            AllocError::NoFree => EngineError::NoSpace(NoSpace::CheckpointSegment),
            AllocError::Io(e) => match inner.storage_failed(e) {
                EngineError::NoSpace(NoSpace::Backing(e)) => {
                    EngineError::NoSpace(NoSpace::CheckpointBacking(e))
                }
                other => other,
            },
        }
    }
}

/// Allocates `n` free segments for a stream of `len` bytes (only the bytes
/// the stream uses in each, rounded to 4 KiB), under the caller's log lock.
fn allocate_segments(
    inner: &Inner,
    log: &mut LogState,
    n: u64,
    len: u64,
) -> std::result::Result<Vec<SegmentId>, AllocError> {
    let mut segs = Vec::new();
    for k in 0..n {
        let bytes = (len - k * inner.seg_size)
            .min(inner.seg_size)
            .div_ceil(4096)
            * 4096;
        let Some(s) = log.table.pick_free() else {
            for s in &segs {
                log.table.set(*s, SegState::Free);
            }
            return Err(AllocError::NoFree);
        };
        let off = inner.segment_offset(s);
        if let Err(e) = inner.storage.allocate(off, bytes) {
            for s in &segs {
                log.table.set(*s, SegState::Free);
            }
            return Err(AllocError::Io(e));
        }
        log.table.set(s, SegState::Checkpoint);
        segs.push(s);
    }
    Ok(segs)
}

/// Bytes a streamed piece is taken in: one write each, from one buffer
/// allocated for the piece (`PieceStream::new`).
const STREAM_CHUNK: usize = 64 << 10;

/// Writes `bytes` at byte `at` of a stream laid end to end in `segs`.
fn write_stream(
    inner: &Inner,
    segs: &[SegmentId],
    mut at: u64,
    mut bytes: &[u8],
) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let k = (at / inner.seg_size) as usize;
        let within = at % inner.seg_size;
        let n = ((inner.seg_size - within) as usize).min(bytes.len());
        inner
            .storage
            .write_at(&bytes[..n], inner.segment_offset(segs[k]) + within)?;
        bytes = &bytes[n..];
        at += n as u64;
    }
    Ok(())
}

/// Writes a piece as it is encoded (a piece of a big map is never held
/// whole in memory: 20 bytes per run, 2.5 times the map itself when every
/// sector is a record of its own): with `delta` (the chain the superblock
/// names), a delta of the map's frozen changes after the chain's last
/// piece, in the rest of its last segment and then new ones; without, a
/// base of every run in new segments (paged-out chunks read back from the
/// chain as they come). Called under the log and state locks, so the map
/// cannot change between the count of the piece's runs and their encoding.
fn stream_piece(
    inner: &Inner,
    log: &mut LogState,
    st: &MapState,
    delta: Option<&CheckpointRef>,
    header: &PieceHeader,
    counters: &[u64],
    notes: &[SegmentNote],
) -> Built {
    let runs = match delta {
        Some(_) => {
            let mut n = 0u64;
            st.map.delta_runs(|_| n += 1);
            n
        }
        None => st.map.base_runs(),
    };
    let mut w = PieceStream::new(header, counters, notes, runs, STREAM_CHUNK);
    let len = w.padded_len();
    // The piece is byte `start` on of the chain laid over `segs`.
    let (start, mut segs, room) = match delta {
        Some(chain) => (
            chain.len,
            chain.segments.clone(),
            room_after(inner, chain).min(len),
        ),
        None => (0, Vec::new(), 0),
    };
    let fresh = (len - room).div_ceil(inner.seg_size);
    if segs.len() as u64 + fresh > squeeze_format::superblock::MAX_CKPT_SEGMENTS as u64 {
        return match delta {
            Some(_) => Built::TooLong,
            None => Built::Refused(EngineError::NoSpace(NoSpace::CheckpointTooLong {
                segments: fresh,
            })),
        };
    }
    if room > 0 {
        let off = inner.segment_offset(*segs.last().expect("a chain with room has a segment"))
            + start % inner.seg_size;
        if let Err(e) = inner.storage.allocate(off, room) {
            return Built::AllocFailed(AllocError::Io(e));
        }
    }
    let new = match allocate_segments(inner, log, fresh, len - room) {
        Ok(new) => new,
        Err(e) => return Built::AllocFailed(e),
    };
    segs.extend_from_slice(&new);
    let mut index = IndexBuilder::new(start + runs_offset(counters.len(), notes.len()) as u64);
    let mut failed: Option<std::io::Error> = None;
    let mut put = |r: MapRun| {
        if failed.is_some() {
            return;
        }
        w.push(r);
        index.push(&r);
        if w.full() {
            failed = w
                .take(|at, b| write_stream(inner, &segs, start + at, b))
                .err();
        }
    };
    let listed = match delta {
        Some(_) => {
            st.map.delta_runs(&mut put);
            Ok(())
        }
        None => st.map.for_each_run(
            |c, pieces| match &st.chain {
                Some(chain) => pager::read_back_chunk(inner, chain, c, pieces),
                None => Err(inner.internal(Internal::PagedWithoutChain { chunk: c })),
            },
            &mut put,
        ),
    };
    if let Err(e) = listed {
        return Built::WriteFailed(new, e);
    }
    let r = failed.map_or_else(
        || {
            let (written, crc) = w.finish(|at, b| write_stream(inner, &segs, start + at, b));
            written?;
            // The CRC last: until it is in place the piece does not verify
            // (and nothing names it yet anyway).
            write_stream(inner, &segs, start + 68, &crc.to_le_bytes())?;
            Ok(crc)
        },
        Err,
    );
    match r {
        Ok(crc) => Built::Written {
            chain: CheckpointRef {
                len: start + len,
                crc,
                segments: segs,
            },
            bytes: len,
            index: index.finish(),
        },
        Err(e) => Built::WriteFailed(new, e.into()),
    }
}

/// What step 1 made.
enum Built {
    /// The piece, written; the chain that ends with it, its bytes, and
    /// where its runs lie.
    Written {
        chain: CheckpointRef,
        bytes: u64,
        index: PieceIndex,
    },
    /// A delta that would make the chain longer than the superblock can
    /// list (nothing written): a base instead.
    TooLong,
    /// A base larger than the superblock can list.
    Refused(EngineError),
    /// No room for the piece.
    AllocFailed(AllocError),
    /// Writing the piece (or reading a paged-out chunk back for it)
    /// failed; these segments were allocated for it.
    WriteFailed(Vec<SegmentId>, EngineError),
}

/// Returns segments to the free list and punches them out of the file;
/// returns how many were freed.
pub(crate) fn release(inner: &Inner, segs: &[SegmentId]) -> u64 {
    if segs.is_empty() {
        return 0;
    }
    let mut freed = 0;
    let _gate = inner.gate.write();
    let mut log = inner.log.lock();
    let busy = *inner.cleaning.lock();
    for &s in segs {
        if Some(s) == busy {
            continue; // being cleaned: freed by the next checkpoint
        }
        let off = inner.segment_offset(s);
        if let Err(e) = inner.storage.punch(off, inner.seg_size) {
            // Nothing refers to the segment, but the file failed in a way
            // nobody planned for.
            tracing::error!("punching segment {s}: {e}");
            inner.storage_failed(e);
        }
        log.table.set(s, SegState::Free);
        freed += 1;
    }
    freed
}
