//! The log's state under the log lock (`Inner::log`): the head, how far
//! the head segment is allocated and pre-written, the segment table, and
//! the helpers that place an offset in a segment. A part of `Inner` below
//! it: it imports only the segment table (`space`) and the format.
//!
//! Invariant: the head lies in the head segment
//! (`LogState::head_in_segment`).

use crate::space::{SegState, SegmentId, SegmentTable};
use squeeze_format::{Superblock, DATA_START, MAX_BACKING_BYTES, RECORD_HEADER_SIZE};

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
    pub prewritten: Prewritten,
}

impl LogState {
    /// The sequence number the head segment was opened with (0 when the
    /// head is not in a log segment): segments opened before it are sealed.
    pub fn head_seq(&self) -> u64 {
        match self.table.state(self.head_segment) {
            SegState::Log { opened_seq } => opened_seq,
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

/// Where pre-writing stands (`space::prewrite`): kept in `LogState`, under
/// the log lock.
#[derive(Clone, Copy, Debug, Default)]
pub struct Prewritten {
    /// The log is pre-written from the head up to here (when in the head
    /// segment, at or past the head).
    pub to: u64,
    /// The head at the previous client flush.
    pub flush_head: u64,
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
