//! Writing a checkpoint: a snapshot of the map exactly at a log position,
//! written into free segments, made current by a superblock write.
//!
//! Steps, and what a crash after each leaves:
//! 1. Under the log lock, wait until every reserved record is installed,
//!    then snapshot the map, the usage and the head. (Nothing on disk.)
//! 2. Sync: every record before the head is durable. (Old checkpoint +
//!    replay still rebuild the same state.)
//! 3. Write the stream into newly allocated free segments and sync.
//!    (Those segments were free: nothing refers to them yet.)
//! 4. Write the superblock naming the new checkpoint and sync: from here
//!    recovery starts at the new head.
//! 5. Free the segments of the checkpoint before the previous one (the
//!    previous one stays intact: the other superblock slot names it, and a
//!    damaged newest slot falls back to it) and every log segment that lies
//!    wholly before both checkpoints' replay positions and held no live
//!    sector in the snapshot; punch them out. (Nothing durable refers to them.)

use crate::counters::{Counter, COUNTERS};
use crate::error::{EngineError, Result};
use crate::meta::superblock as sbio;
use crate::space::{SegState, SegmentId};
use crate::state::Inner;
use squeeze_format::checkpoint::{CHECKPOINT_HEADER_SIZE, CHUNK_BYTES};
use squeeze_format::{checksum, CheckpointHeader, CheckpointRef, CheckpointWriter};

/// Bytes of a checkpoint stream holding `chunks` map chunks.
pub fn stream_len(chunks: u64) -> u64 {
    (CHECKPOINT_HEADER_SIZE + 8 * COUNTERS) as u64 + chunks * CHUNK_BYTES as u64
}

/// Segments a checkpoint of the current map needs, with `extra_chunks`
/// more map chunks than it has now.
pub(crate) fn segments_needed(inner: &Inner, extra_chunks: u64) -> u64 {
    let chunks = inner.state.read().map.chunk_count() as u64 + extra_chunks;
    stream_len(chunks).div_ceil(inner.seg_size)
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

/// Writes a checkpoint; with `clean`, also marks the volume cleanly closed.
pub fn write(inner: &Inner, clean: bool) -> Result<()> {
    let _one = inner.ckpt_lock.lock();
    if let Some(why) = inner.poisoned.lock().clone() {
        return Err(EngineError::ReadOnly(why));
    }
    // 1. Snapshot at the head.
    let (snapshot, head_offset, next_seq, freeable, generation, new_head_seq) = {
        let mut log = inner.log.lock();
        let t = inner.tickets.issued();
        inner.tickets.wait_below(t);
        let st = inner.state.read();
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
        (
            st.map.snapshot(),
            log.head_offset,
            log.next_seq,
            freeable,
            generation,
            new_head_seq,
        )
    };
    let fail = |e: EngineError| {
        inner.poison(&e);
        e
    };
    // 2. Everything before the head is durable.
    inner.storage.sync().map_err(|e| fail(e.into()))?;
    // 3. The stream.
    let header = CheckpointHeader {
        uuid: inner.uuid,
        generation,
        next_seq,
        head_offset,
    };
    let mut w = CheckpointWriter::new(&header, &inner.counters.snapshot(), snapshot.len());
    for (index, entries) in &snapshot {
        w.push_chunk(*index, entries);
    }
    drop(snapshot);
    let stream = w.finish();
    let n_segs = (stream.len() as u64).div_ceil(inner.seg_size);
    if n_segs as usize > squeeze_format::superblock::MAX_CKPT_SEGMENTS {
        return Err(EngineError::NoSpace(format!(
            "checkpoint needs {n_segs} segments; use a larger segment size"
        )));
    }
    let segs = allocate_segments(inner, n_segs, stream.len() as u64)?;
    for (k, s) in segs.iter().enumerate() {
        let from = k * inner.seg_size as usize;
        let to = (from + inner.seg_size as usize).min(stream.len());
        let off = inner.segment_offset(*s);
        if let Err(e) = inner.storage.write_at(&stream[from..to], off) {
            release(inner, &segs);
            return Err(fail(e.into()));
        }
    }
    inner.storage.sync().map_err(|e| fail(e.into()))?;
    // 4. Make it current.
    let old = {
        let mut sb = inner.sb.lock();
        let old = std::mem::replace(
            &mut sb.checkpoint,
            CheckpointRef {
                len: stream.len() as u64,
                crc: checksum::crc32c(&stream),
                segments: segs.clone(),
            },
        );
        sb.clean = clean;
        sbio::write(&*inner.storage, &mut sb).map_err(fail)?;
        debug_assert_eq!(sb.generation, generation);
        old
    };
    inner
        .counters
        .add(Counter::CheckpointBytes, stream.len() as u64 + 4096);
    inner.counters.add(Counter::Checkpoints, 1);
    // 5. Free what nothing durable needs any more: the checkpoint before the
    // previous one (the previous one stays, named by the other slot).
    let mut free = {
        let mut h = inner.ckpt_history.lock();
        h.prev_head_seq = new_head_seq;
        std::mem::replace(&mut h.older_segments, old.segments)
    };
    free.extend(freeable);
    let freed = release(inner, &free);
    inner.counters.add(Counter::SegmentsReclaimed, freed);
    Ok(())
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
