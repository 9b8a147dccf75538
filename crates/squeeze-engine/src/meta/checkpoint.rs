//! Writing a checkpoint: the sector map exactly at a log position, as a
//! piece of the checkpoint chain (format 2, `squeeze_format::checkpoint`):
//! a **delta** with only the sectors whose mapping changed since the last
//! checkpoint, appended after the chain's last piece, or a **base** with the
//! whole map, starting a new chain in free segments. A base is written when
//! the deltas add up to [`REBASE_FACTOR`] times the base (and at least
//! [`REBASE_MIN_BYTES`]), so checkpoint bytes follow what clients change,
//! not the size of the map, and recovery reads at most
//! `1 + REBASE_FACTOR` times a base.
//!
//! Steps, and what a crash after each leaves:
//! 1. Under the log lock, wait until every reserved record is installed,
//!    then encode the piece (the map's changed runs, or all of them), the
//!    counters and the head. (Nothing on disk.)
//! 2. Sync: every record before the head is durable. (Old checkpoint +
//!    replay still rebuild the same state.)
//! 3. Write the piece and sync: a delta goes after the chain's last piece
//!    (the rest of its last segment, then newly allocated free segments), a
//!    base into newly allocated free segments. (Bytes no superblock names:
//!    pieces are padded to 4 KiB, so none shares a block with a named one.)
//! 4. Write the superblock naming the chain (its segments, its length and
//!    the CRC of the new last piece) and sync: from here recovery starts at
//!    the new head.
//! 5. Free the segments only the checkpoint before the previous one used
//!    (the previous one stays intact: the other superblock slot names it,
//!    and a damaged newest slot falls back to it) and every log segment that
//!    lies wholly before both checkpoints' replay positions and held no live
//!    sector at step 1; punch them out. (Nothing durable refers to them.)

use crate::counters::{Counter, COUNTERS};
use crate::error::{EngineError, Result};
use crate::meta::superblock as sbio;
use crate::space::{SegState, SegmentId};
use crate::state::Inner;
use squeeze_format::checkpoint::piece_len;
use squeeze_format::{CheckpointRef, PieceHeader, PieceKind, PieceWriter, FORMAT_VERSION};

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
    let log = inner.log.lock();
    let head_seq = match log.table.state(log.head_segment) {
        SegState::Log { opened_seq } => opened_seq,
        _ => 0,
    };
    // Dead segments before the head: a checkpoint frees those also before
    // the previous checkpoint's head, a second one the rest.
    let st = inner.state.read();
    let any = log.table.iter().any(|(s, state)| match state {
        SegState::Log { opened_seq } => opened_seq < head_seq && st.usage.get(s).live_sectors == 0,
        _ => false,
    });
    any
}

/// Whether the next piece starts a new chain.
fn wants_base(inner: &Inner) -> bool {
    let (version, len) = {
        let sb = inner.sb.lock();
        (sb.version, sb.checkpoint.len)
    };
    let h = inner.ckpt_history.lock();
    h.need_base
        || version < FORMAT_VERSION
        || len == 0
        || h.delta_bytes >= (h.rebase_factor * h.base_bytes).max(h.rebase_min_bytes)
}

/// Writes a checkpoint; with `clean`, also marks the volume cleanly closed.
pub fn write(inner: &Inner, clean: bool) -> Result<()> {
    let _one = inner.ckpt_lock.lock();
    if let Some(why) = inner.poisoned.lock().clone() {
        return Err(EngineError::ReadOnly(why));
    }
    let mut base = wants_base(inner);
    let chain = inner.sb.lock().checkpoint.clone();
    // 1. The piece, at the head.
    let (piece, freeable, generation, new_head_seq) = {
        let mut log = inner.log.lock();
        let t = inner.tickets.issued();
        inner.tickets.wait_below(t);
        let mut st = inner.state.write();
        let head_seq = match log.table.state(log.head_segment) {
            SegState::Log { opened_seq } => opened_seq,
            _ => 0,
        };
        // Log segments are freed only once neither this checkpoint's replay
        // nor the previous one's (the other superblock slot) can visit them.
        let head_seq = head_seq.min(inner.ckpt_history.lock().prev_head_seq);
        let freeable: Vec<SegmentId> = log
            .table
            .iter()
            .filter(|&(s, state)| match state {
                SegState::Log { opened_seq } => {
                    opened_seq < head_seq && st.usage.get(s).live_sectors == 0
                }
                _ => false,
            })
            .map(|(s, _)| s)
            .collect();
        log.bytes_since_checkpoint = 0;
        let generation = inner.sb.lock().generation + 1;
        let new_head_seq = match log.table.state(log.head_segment) {
            SegState::Log { opened_seq } => opened_seq,
            _ => 0,
        };
        // From here until the superblock names the piece, a failure leaves
        // the changes taken out of the map's record: the next checkpoint
        // then writes everything.
        inner.ckpt_history.lock().need_base = true;
        let dirty = st.map.take_dirty();
        let counters = inner.counters.snapshot();
        let notes = st.usage.below_target_notes();
        let mut header = PieceHeader {
            kind: PieceKind::Delta,
            uuid: inner.uuid,
            generation,
            next_seq: log.next_seq,
            head_offset: log.head_offset,
        };
        let mut piece = None;
        if !base {
            let mut w = PieceWriter::new(&header, &counters, &notes, 0);
            st.map.delta_runs(&dirty, |r| w.push(r));
            let p = w.finish();
            // A chain longer than the superblock can list restarts.
            let spill = (p.len() as u64).saturating_sub(room_after(inner, &chain));
            let segs = chain.segments.len() as u64 + spill.div_ceil(inner.seg_size);
            if segs <= squeeze_format::superblock::MAX_CKPT_SEGMENTS as u64 {
                piece = Some(p);
            } else {
                base = true;
            }
        }
        let piece = match piece {
            Some(p) => p,
            None => {
                header.kind = PieceKind::Base;
                let mut w = PieceWriter::new(&header, &counters, &notes, st.map.weight() as usize);
                st.map.for_each_run(|r| w.push(r));
                w.finish()
            }
        };
        (piece, freeable, generation, new_head_seq)
    };
    let fail = |e: EngineError| {
        inner.poison(&e);
        e
    };
    // 2. Everything before the head is durable.
    inner.storage.sync().map_err(|e| fail(e.into()))?;
    // 3. The piece.
    let crc = squeeze_format::checkpoint::stored_crc(&piece);
    let new_ref = if base {
        if piece.len() as u64
            > inner.seg_size * squeeze_format::superblock::MAX_CKPT_SEGMENTS as u64
        {
            return Err(EngineError::NoSpace(format!(
                "checkpoint needs {} segments; use a larger segment size",
                (piece.len() as u64).div_ceil(inner.seg_size)
            )));
        }
        let segs = write_new(inner, &piece).map_err(|e| match e {
            e @ EngineError::NoSpace(_) => e,
            e => fail(e),
        })?;
        CheckpointRef {
            len: piece.len() as u64,
            crc,
            segments: segs,
        }
    } else {
        append(inner, &chain, &piece, crc).map_err(|e| match e {
            e @ EngineError::NoSpace(_) => e,
            e => fail(e),
        })?
    };
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
    // 4. Make it current.
    {
        let mut sb = inner.sb.lock();
        sb.checkpoint = new_ref.clone();
        sb.version = FORMAT_VERSION;
        sb.clean = clean;
        sbio::write(&*inner.storage, &mut sb).map_err(fail)?;
        debug_assert_eq!(sb.generation, generation);
    }
    inner
        .counters
        .add(Counter::CheckpointBytes, piece.len() as u64 + 4096);
    inner.counters.add(Counter::Checkpoints, 1);
    // 5. Free what nothing durable needs any more: segments only the
    // checkpoint before the previous one used (the previous one stays,
    // named by the other slot).
    let mut free = {
        let mut h = inner.ckpt_history.lock();
        h.prev_head_seq = new_head_seq;
        h.need_base = false;
        if base {
            h.base_bytes = piece.len() as u64;
            h.delta_bytes = 0;
            h.deltas = 0;
        } else {
            h.delta_bytes += piece.len() as u64;
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

/// Appends a delta piece after the chain's last piece: into the rest of its
/// last segment, then into new segments. Returns the longer chain.
fn append(inner: &Inner, chain: &CheckpointRef, piece: &[u8], crc: u32) -> Result<CheckpointRef> {
    let room = (room_after(inner, chain) as usize).min(piece.len());
    if room > 0 {
        let last = *chain
            .segments
            .last()
            .expect("a chain with room has a segment");
        let off = inner.segment_offset(last) + chain.len % inner.seg_size;
        inner
            .storage
            .allocate(off, room as u64)
            .map_err(|e| match inner.storage_failed(e) {
                EngineError::NoSpace(why) => EngineError::NoSpace(format!("checkpoint: {why}")),
                other => other,
            })?;
        inner.storage.write_at(&piece[..room], off)?;
    }
    let mut segments = chain.segments.clone();
    if room < piece.len() {
        segments.extend(write_new(inner, &piece[room..])?);
    }
    Ok(CheckpointRef {
        len: chain.len + piece.len() as u64,
        crc,
        segments,
    })
}

/// Writes `bytes` into newly allocated free segments, from their start;
/// returns them.
fn write_new(inner: &Inner, bytes: &[u8]) -> Result<Vec<SegmentId>> {
    let n = (bytes.len() as u64).div_ceil(inner.seg_size);
    let segs = allocate_segments(inner, n, bytes.len() as u64)?;
    for (k, s) in segs.iter().enumerate() {
        let from = k * inner.seg_size as usize;
        let to = (from + inner.seg_size as usize).min(bytes.len());
        let off = inner.segment_offset(*s);
        if let Err(e) = inner.storage.write_at(&bytes[from..to], off) {
            release(inner, &segs);
            return Err(e.into());
        }
    }
    Ok(segs)
}

/// Allocates `n` free segments for a stream of `len` bytes (only the bytes
/// the stream uses in each, rounded to 4 KiB).
fn allocate_segments(inner: &Inner, n: u64, len: u64) -> Result<Vec<SegmentId>> {
    let mut log = inner.log.lock();
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
            return Err(EngineError::NoSpace(
                "no free segment for a checkpoint".into(),
            ));
        };
        let off = inner.segment_offset(s);
        if let Err(e) = inner.storage.allocate(off, bytes) {
            for s in &segs {
                log.table.set(*s, SegState::Free);
            }
            drop(log);
            return Err(match inner.storage_failed(e) {
                EngineError::NoSpace(why) => EngineError::NoSpace(format!("checkpoint: {why}")),
                other => other,
            });
        }
        log.table.set(s, SegState::Checkpoint);
        segs.push(s);
    }
    Ok(segs)
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
