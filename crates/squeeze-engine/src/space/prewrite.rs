//! Pre-writing the log past its head, so that a stream of small flushes
//! overwrites file blocks that are already written.
//!
//! The log lives in space allocated with fallocate, which ext4 (and XFS)
//! keep as *unwritten* extents until data reaches them. The first write into
//! such a block converts its extent, and the fdatasync after it must then
//! write the file's extent metadata as well as flush the device: measured
//! here (fio, 64 KiB direct writes + fdatasync on ext4), 181 us per
//! fdatasync into fallocated space against 64 us over written blocks. A
//! database that commits a few KiB at a time pays that at every commit,
//! because every commit lands in a block the log never wrote before.
//!
//! So a client flush that follows little log (less than SMALL_FLUSH since
//! the previous client flush, in the same segment) first writes zeros over
//! the next PREWRITE bytes past the head, once: they reach the file with
//! that flush's own write-out, one extent conversion for PREWRITE bytes of
//! log instead of one per flush. A workload that writes more than
//! SMALL_FLUSH between flushes never pays for it (its conversions are
//! already amortised); one that flushes after every few KiB writes its log
//! bytes twice, once as zeros (the bandwidth of such a workload is small).
//!
//! Opt-in (`OpenOptions::prewrite`, `squeeze serve --prewrite`): the zeros
//! are device writes, counted in `prewritten_bytes` and the write
//! amplification, and the metadata they spare is a few blocks, not bytes.
//! Under a file system whose journal commits are small flushes (fsx +
//! fsstress on ext4) they added 18-20% to what the disk wrote.
//!
//! Safety: the zeros are written with the log lock held, so they cover only
//! bytes no reservation has placed a record in yet, inside the head segment
//! and below `allocated_end` (fallocated: the write cannot fail for lack of
//! space). A record placed there later is staged over the zeros, never under
//! them: the write-behind pool orders the writes of one chunk (its lock is
//! held through each write to the file), and a buffered file's page cache
//! holds the newest bytes. A crash may keep the zeros or not; either way
//! the bytes past the head read as no record, as unwritten space does, and
//! recovery ends the log there (docs/FORMAT.md, crash table).

use super::ahead::ALLOC_STEP;
use crate::counters::Counter;
use crate::error::Result;
use crate::state::Inner;
use crate::storage::write_behind::BLOCK;

/// A client flush after less log than this (since the previous one) pre-writes.
pub const SMALL_FLUSH: u64 = 64 << 10;

/// How far past the head the log is pre-written; it is written again once
/// less than half of it is left.
pub const PREWRITE: u64 = 512 << 10;

// The step a pre-write stops short of the end of is whole write-behind chunks.
const _: () = assert!(ALLOC_STEP.is_multiple_of(crate::storage::WRITE_BEHIND_CHUNK as u64));

/// Called by a client flush before it syncs: pre-writes the log past the
/// head if the flushes are small. The zeros are staged like any write; the
/// flush's sync writes them out.
pub(crate) fn before_flush(inner: &Inner) -> Result<()> {
    static ZEROS: [u8; PREWRITE as usize] = [0; PREWRITE as usize];
    if !inner.prewrite {
        return Ok(());
    }
    let mut log = inner.log.lock();
    let head = log.head_offset;
    let seg_start = inner.segment_offset(log.head_segment);
    let seg_end = inner.segment_end(log.head_segment);
    let last = std::mem::replace(&mut log.prewritten.flush_head, head);
    let small = (seg_start..=head).contains(&last) && head - last < SMALL_FLUSH;
    if !small || !log.head_in_segment(inner.seg_size) {
        return Ok(());
    }
    let done = log.prewritten.to;
    let from = if (head..=seg_end).contains(&done) {
        done
    } else {
        head
    };
    if from >= head + PREWRITE / 2 {
        return Ok(());
    }
    // Not the last block of the head's ALLOC_STEP (a write-behind chunk):
    // zeros there would complete the chunk, which then leaves the pool, and
    // every later flush into it would read its block tail back from the file.
    let step_last = (head / ALLOC_STEP + 1) * ALLOC_STEP - BLOCK as u64;
    let to = (head + PREWRITE)
        .min(step_last)
        .min(log.allocated_end)
        .min(seg_end);
    if to <= from {
        return Ok(());
    }
    if let Err(e) = inner.storage.write_at(&ZEROS[..(to - from) as usize], from) {
        drop(log);
        return Err(inner.storage_failed(e));
    }
    log.prewritten.to = to;
    inner.counters.add(Counter::PrewrittenBytes, to - from);
    Ok(())
}
