//! The squeeze on-disk format, with no I/O: every byte layout the engine
//! writes is encoded and decoded here, explicitly little-endian, and checked
//! with CRC-32C. docs/FORMAT.md is the prose version of this crate; the two
//! change together.

pub mod checkpoint;
pub mod checkpoint_v1;
pub mod checksum;
pub mod chunks;
pub mod codec_id;
pub mod dedup_settings;
pub mod flush_mark;
pub mod layout;
mod le;
pub mod map_entry;
pub mod piece_decoder;
pub mod record;
pub mod record_scan;
mod record_short;
pub mod superblock;
pub mod zstd_block;

pub use checkpoint::{
    MapRun, Piece, PieceHeader, PieceKind, PieceStream, PieceWriter, SegmentNote, CHUNK_ENTRIES,
};
pub use codec_id::CodecId;
pub use dedup_settings::{DedupMode, DedupSettings};
pub use flush_mark::FlushMark;
pub use layout::*;
pub use map_entry::MapEntry;
pub use piece_decoder::{PieceDecoder, PieceHead};
pub use record::{HeaderForm, RecordHeader, RecordKind};
pub use record_scan::{RecordScan, ScannedRecord, Stride};
pub use superblock::{
    CheckpointRef, CompressionMode, Policy, Superblock, BLOCK_VERSION, CHUNKED_VERSION,
    DEDUP_VERSION, FORMAT_VERSION, SHORT_HEADER_VERSION,
};

/// A decode failure: bytes from disk never panic, they produce one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("bad magic: not a squeeze {what}")]
    BadMagic { what: &'static str },
    #[error("unsupported format version {found} (this build reads versions up to {supported})")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("unknown codec id {0}")]
    UnknownCodec(u8),
    #[error("{what} checksum mismatch: stored {expected:#010x}, computed {got:#010x}")]
    ChecksumMismatch {
        what: &'static str,
        expected: u32,
        got: u32,
    },
    #[error("{what} belongs to another volume")]
    WrongVolume { what: &'static str },
    #[error("invalid {what}: {why}")]
    Invalid { what: &'static str, why: String },
    #[error("{what} truncated: need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
}
