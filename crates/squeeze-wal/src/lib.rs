//! squeeze-wal: an append-only write-ahead log on a squeeze volume, with
//! group commit and two layouts (docs/KV.md, "The write-ahead log").
//!
//! - **dense**: records packed back to back; each commit rewrites the tail
//!   sector (the records before it in that sector, and the new ones), as
//!   databases' logs do on ordinary drives;
//! - **sparse**: each commit group starts a new 4 KiB sector; the rest of
//!   the group's last sector stays zero. The logical space this wastes
//!   costs nothing on a compressing volume, and no byte is written twice.
//!
//! Modules, bottom up: `header` (sector 0), `record` (record version 1,
//! 40-byte headers) and `record_v2` (version 2, 6 to 13 bytes: what the
//! chain knows is implied in the CRC), `reader` (windowed reads by log
//! position), `probe` (look for durable records beyond the end),
//! `recovery` (follow the chain to the end, then probe), `wal`
//! (create/open, group commit, truncation).
//!
//! Versions: the log header says which record version a log uses. New logs
//! use version 2; a log created with version 1 keeps it for its whole life
//! (it opens, recovers and appends version 1 records; nothing converts it).
//!
//! Invariants: a commit is acknowledged only after a flush that started
//! after its write; one group is written and flushed before the next is
//! written, so only the last group can be torn; sequence numbers are
//! consecutive over the log's life; the live log never spans more than
//! the record area.

pub mod error;
pub mod header;
pub mod probe;
pub mod reader;
pub mod record;
pub mod record_v2;
pub mod recovery;
pub mod wal;

pub use error::{Result, WalError};
pub use record::PAYLOAD_MAX;
pub use wal::{Wal, WalStats};

/// How commits are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Records packed; the tail sector rewritten at each commit.
    Dense,
    /// Each commit group starts a new sector.
    Sparse,
}

impl Layout {
    pub fn code(self) -> u32 {
        match self {
            Layout::Dense => 1,
            Layout::Sparse => 2,
        }
    }

    pub fn from_code(c: u32) -> Option<Layout> {
        match c {
            1 => Some(Layout::Dense),
            2 => Some(Layout::Sparse),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Layout::Dense => "dense",
            Layout::Sparse => "sparse",
        }
    }

    pub fn parse(s: &str) -> Option<Layout> {
        match s {
            "dense" => Some(Layout::Dense),
            "sparse" => Some(Layout::Sparse),
            _ => None,
        }
    }
}

/// The record format of a log, fixed at its creation (the header's version).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordVersion {
    /// 40-byte headers that carry the log id, seq, group and epoch
    /// (`record`); logs created before version 2.
    V1,
    /// 6 to 13 bytes: flags, CRC, length; the log id, seq and epoch
    /// implied in the CRC (`record_v2`). What `Wal::create` makes.
    V2,
}

impl RecordVersion {
    /// The version number in the log header.
    pub fn code(self) -> u32 {
        match self {
            RecordVersion::V1 => 1,
            RecordVersion::V2 => 2,
        }
    }

    pub fn from_code(c: u32) -> Option<RecordVersion> {
        match c {
            1 => Some(RecordVersion::V1),
            2 => Some(RecordVersion::V2),
            _ => None,
        }
    }

    /// The fewest bytes a record of this version takes (an empty payload).
    pub fn record_bytes_min(self) -> u64 {
        match self {
            RecordVersion::V1 => record::RECORD_HEADER_BYTES as u64,
            RecordVersion::V2 => record_v2::HEADER_BYTES_MIN as u64,
        }
    }
}

/// Where the log ends (recovery's answer; the probe starts there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct End {
    /// Position after the last record.
    pub pos: u64,
    /// Seq the next record gets.
    pub seq: u64,
    /// Epoch of the last record (if none: v1 0, v2 the header's
    /// `start_epoch`).
    pub epoch: u32,
}

/// A record's place in the log: its sequence number and log position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn {
    pub seq: u64,
    pub pos: u64,
}
