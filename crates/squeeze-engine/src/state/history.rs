//! What checkpoints and the last open left behind for the next ones and
//! for stats: parts of `Inner` that import only the segment id.

use crate::space::SegmentId;

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
