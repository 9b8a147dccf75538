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
//! Modules, bottom up: `header` (sector 0), `record` (the record format),
//! `reader` (windowed reads by log position), `recovery` (find the end),
//! `wal` (create/open, group commit, truncation).
//!
//! Invariants: a commit is acknowledged only after a flush that started
//! after its write; one group is written and flushed before the next is
//! written, so only the last group can be torn; sequence numbers are
//! consecutive over the log's life; the live log never spans more than
//! the record area.

pub mod error;
pub mod header;
pub mod reader;
pub mod record;
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

/// A record's place in the log: its sequence number and log position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn {
    pub seq: u64,
    pub pos: u64,
}
