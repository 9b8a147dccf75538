//! Operating errors of the engine (typed, `#[non_exhaustive]`); programmer
//! errors are assertions. Each maps to an errno for the NBD layer.
//!
//! Every variant carries its cause as a type, never as a string: why there
//! is no space ([`NoSpace`]), why a file is not a volume ([`NotAVolume`]),
//! why the volume is read-only ([`ReadOnly`], holding the failure that
//! turned it so), which argument is refused and with what value
//! ([`Invalid`]), which invariant broke ([`Internal`]).
//!
//! One rule for the text: an error's message is its cause's message or
//! ends with ": " and it, and the cause is also its `source()`. So `{e}`
//! alone says everything (logs, the NBD layer's `io::Error`), and a walker
//! of the source chain drops a cause the text before already ends with
//! (the CLI's `util::error_text`), so each cause prints once.

use crate::space::{SegUsage, SegmentId};
use squeeze_format::FormatError;
use std::io;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("I/O error on the backing file: {0}")]
    Io(#[from] io::Error),
    #[error("no space left: {0}")]
    NoSpace(#[source] NoSpace),
    #[error("range {offset}+{len} is outside the volume (size {size})")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("corrupt data at LBA {lba}: {source}")]
    Corrupt { lba: u64, source: FormatError },
    #[error("corrupt metadata: {0}")]
    Metadata(#[source] FormatError),
    /// A map chunk paged in from the checkpoint chain is not the chunk
    /// that was paged out.
    #[error("corrupt metadata: {0}")]
    ChainMismatch(#[source] ChunkMismatch),
    #[error("not a squeeze volume: {0}")]
    NotAVolume(#[source] NotAVolume),
    /// Flushed data is gone (recovery found missing records, or the file
    /// was cut short): the volume opens only when the caller accepts the
    /// loss (`OpenOptions::accept_loss`).
    #[error("the volume lost flushed data: {0}")]
    Damaged(Box<crate::damage::RecoveryDamage>),
    #[error("{0}")]
    ReadOnly(#[source] ReadOnly),
    #[error("invalid argument: {0}")]
    Invalid(#[source] Invalid),
    /// A broken invariant of the engine's own state (a bug): the volume
    /// turns read-only rather than act on it.
    #[error("internal error (the volume turned read-only; please report it): {0}")]
    Internal(#[source] Internal),
    #[error("codec error at LBA {lba}: {source}")]
    Codec {
        lba: u64,
        source: squeeze_codec::CodecError,
    },
}

/// Why there is no room for what was asked (ENOSPC): nothing was changed,
/// and the caller may make room and try again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NoSpace {
    /// The file system under the backing file is full.
    #[error("backing store: {0}")]
    Backing(#[source] io::Error),
    /// Too few free segments (within the `--max-physical` cap, when there
    /// is one) for the log to grow, less those kept for checkpoints.
    #[error(
        "backing store full: {free} segments free, {needed} needed plus {reserve} kept for \
         checkpoints"
    )]
    Segments {
        free: u64,
        needed: u64,
        reserve: u64,
    },
    /// No free segment for a checkpoint's stream.
    #[error("no free segment for a checkpoint")]
    CheckpointSegment,
    /// The file system under the backing file is full, met while
    /// allocating for a checkpoint.
    #[error("checkpoint: backing store: {0}")]
    CheckpointBacking(#[source] io::Error),
    /// A base checkpoint would span more segments than a superblock lists.
    #[error("checkpoint needs {segments} segments; use a larger segment size")]
    CheckpointTooLong { segments: u64 },
}

/// Why a file is not a squeeze volume.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotAVolume {
    #[error("the file is {len} bytes, shorter than the superblock area")]
    ShortFile { len: u64 },
    /// Neither superblock slot starts with the magic.
    #[error("no squeeze superblock (bad magic)")]
    BadMagic,
}

/// Why the volume takes no changes.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadOnly {
    #[error("volume is read-only (opened read-only)")]
    Opened,
    /// An unplanned failure (of the backing file, or of an invariant)
    /// turned the volume read-only: the first such failure. Reopen it.
    #[error("volume is read-only after an earlier failure (reopen it): {0}")]
    Failed(#[source] Arc<EngineError>),
}

/// An argument the engine refuses, with its value.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Invalid {
    /// A logical size that is 0 or not a multiple of a sector.
    #[error("size {bytes}: must be a positive multiple of {sector}", sector = squeeze_format::SECTOR_SIZE)]
    SizeNotAligned { bytes: u64 },
    #[error(
        "size {bytes}: the largest logical size is {max} bytes (8 EiB less 1 GiB), the most \
         NBD clients take (qemu, the Linux kernel and libnbd read the export size as a signed \
         64-bit number, and qemu aligns it down to 1 GiB)"
    )]
    SizeTooLarge { bytes: u64, max: u64 },
    #[error("segment size {bytes} is too large (at most {} bytes)", u32::MAX)]
    SegmentSizeTooLarge { bytes: u64 },
    /// A cap on the backing file below the superblocks and 4 segments.
    #[error("max-physical {bytes}: at least 4 segments ({min} bytes) are needed")]
    MaxPhysicalTooSmall { bytes: u64, min: u64 },
    /// A lower cap with a segment in use past it.
    #[error(
        "cannot cap the backing file at {bytes} bytes: segment {segment} (byte {offset}) past \
         the cap is in use (squeeze compact moves data down first)"
    )]
    CapOverData {
        bytes: u64,
        segment: SegmentId,
        offset: u64,
    },
    /// A smaller size with data mapped past it.
    #[error(
        "cannot shrink to {size} bytes: byte {mapped} and perhaps more past it hold data (trim \
         the tail first)"
    )]
    ShrinkOverData { size: u64, mapped: u64 },
    #[error("the backing store is not empty; refusing to overwrite it")]
    StoreNotEmpty,
    /// A range of a shared buffer that the buffer does not hold.
    #[error("range {range:?} outside a buffer of {len} bytes")]
    BufferRange {
        range: std::ops::Range<usize>,
        len: usize,
    },
    /// A policy or superblock field the format refuses.
    #[error("{0}")]
    Format(#[source] FormatError),
}

/// A broken invariant of the engine's own state, with the figures that
/// show it.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Internal {
    #[error("log head {head_offset} is outside its segment {segment}")]
    HeadOutsideSegment {
        head_offset: u64,
        segment: SegmentId,
    },
    #[error(
        "log head {head_offset} / allocated end {allocated_end} outside the head segment \
         {segment}"
    )]
    AllocationOutsideSegment {
        head_offset: u64,
        allocated_end: u64,
        segment: SegmentId,
    },
    #[error("map paging: chain byte {at} lies past the chain's {segments} segments")]
    ChainBytePastEnd { at: u64, segments: usize },
    #[error("map chunk {chunk} is in piece {piece} of a chain of {pieces}")]
    PieceOutsideChain {
        chunk: u64,
        piece: u16,
        pieces: usize,
    },
    #[error("map chunk {chunk} is paged out without a chain")]
    PagedWithoutChain { chunk: u64 },
    #[error("map chunk {chunk} paged out twice")]
    PagedTwice { chunk: u64 },
    #[error("map chunk {chunk} paged out at open")]
    PagedAtOpen { chunk: u64 },
}

/// A chunk read back from the checkpoint chain that does not match what
/// was paged out (`map::SectorMap::install`).
#[derive(Clone, Debug, thiserror::Error)]
#[error(
    "map chunk {chunk} read back from the checkpoint chain maps {mapped} sectors in {runs} \
     runs, not the {paged_mapped} in {paged_runs} it was paged out with"
)]
pub struct ChunkMismatch {
    pub chunk: u64,
    pub mapped: u32,
    pub runs: u64,
    pub paged_mapped: u32,
    pub paged_runs: u64,
}

/// A broken accounting invariant (`Volume::verify_accounting`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Accounting {
    /// The map could not be walked (paged in).
    #[error(transparent)]
    Map(#[from] EngineError),
    #[error("segment {segment}: usage {usage:?}, map implies {implied:?}")]
    Segment {
        segment: SegmentId,
        usage: SegUsage,
        implied: SegUsage,
    },
    #[error("total live bytes differ: usage {usage}, map implies {implied}")]
    LiveBytes { usage: u64, implied: u64 },
    #[error("chunk {chunk} paged")]
    ChunkPaged { chunk: u64 },
    /// A hidden address's reference count is not the number of indirect
    /// entries naming it (deduplication).
    #[error("hidden address {target:#x}: {counted} references counted, the map holds {implied}")]
    References {
        target: u64,
        counted: u32,
        implied: u32,
    },
    /// A client sector shares a hidden address that holds no record.
    #[error("LBA {lba} shares hidden address {target:#x}, which holds no record")]
    DanglingReference { lba: u64, target: u64 },
    #[error(
        "map chunk {chunk}: the checkpoint chain (pieces {pieces:?}) does not hold what the map \
         does"
    )]
    ChainDiffers { chunk: u64, pieces: Vec<u16> },
}

impl EngineError {
    /// The errno an NBD client should see.
    pub fn errno(&self) -> i32 {
        match self {
            EngineError::NoSpace(_) => libc::ENOSPC,
            EngineError::OutOfRange { .. } | EngineError::Invalid(_) => libc::EINVAL,
            EngineError::ReadOnly(_) => libc::EROFS,
            EngineError::Io(e) if e.raw_os_error() == Some(libc::ENOSPC) => libc::ENOSPC,
            _ => libc::EIO,
        }
    }

    /// Converts into an `io::Error` whose kind carries the errno's meaning.
    pub fn into_io(self) -> io::Error {
        let kind = match self.errno() {
            libc::ENOSPC => io::ErrorKind::StorageFull,
            libc::EINVAL => io::ErrorKind::InvalidInput,
            libc::EROFS => io::ErrorKind::ReadOnlyFilesystem,
            _ => io::ErrorKind::Other,
        };
        match self {
            // ENOSPC keeps its errno; any other failure of the backing file
            // is the device's (EIO), never the client's: an EINVAL from
            // fallocate must not tell a client its request was invalid.
            EngineError::Io(e) if Self::is_enospc(&e) => e,
            other => io::Error::new(kind, other),
        }
    }

    /// An error of the backing store: ENOSPC is `NoSpace` (the caller may
    /// make room and try again), anything else `Io`.
    pub(crate) fn from_storage(e: io::Error) -> EngineError {
        if Self::is_enospc(&e) {
            EngineError::NoSpace(NoSpace::Backing(e))
        } else {
            EngineError::Io(e)
        }
    }

    pub(crate) fn is_enospc(e: &io::Error) -> bool {
        e.raw_os_error() == Some(libc::ENOSPC) || e.kind() == io::ErrorKind::StorageFull
    }

    /// A copy, for one failure told to several callers (the one that
    /// turned the volume read-only, `Inner::poison`; a commit group's
    /// records): the same variant and figures; an `io::Error` keeps its OS
    /// error code (else its kind and text).
    pub fn duplicate(&self) -> EngineError {
        match self {
            EngineError::Io(e) => EngineError::Io(copy_io(e)),
            EngineError::NoSpace(n) => EngineError::NoSpace(match n {
                NoSpace::Backing(e) => NoSpace::Backing(copy_io(e)),
                NoSpace::CheckpointBacking(e) => NoSpace::CheckpointBacking(copy_io(e)),
                NoSpace::Segments {
                    free,
                    needed,
                    reserve,
                } => NoSpace::Segments {
                    free: *free,
                    needed: *needed,
                    reserve: *reserve,
                },
                NoSpace::CheckpointSegment => NoSpace::CheckpointSegment,
                NoSpace::CheckpointTooLong { segments } => NoSpace::CheckpointTooLong {
                    segments: *segments,
                },
            }),
            EngineError::OutOfRange { offset, len, size } => EngineError::OutOfRange {
                offset: *offset,
                len: *len,
                size: *size,
            },
            EngineError::Corrupt { lba, source } => EngineError::Corrupt {
                lba: *lba,
                source: source.clone(),
            },
            EngineError::Metadata(e) => EngineError::Metadata(e.clone()),
            EngineError::ChainMismatch(m) => EngineError::ChainMismatch(m.clone()),
            EngineError::NotAVolume(n) => EngineError::NotAVolume(n.clone()),
            EngineError::Damaged(d) => EngineError::Damaged(d.clone()),
            EngineError::ReadOnly(r) => EngineError::ReadOnly(r.clone()),
            EngineError::Invalid(i) => EngineError::Invalid(i.clone()),
            EngineError::Internal(i) => EngineError::Internal(i.clone()),
            EngineError::Codec { lba, source } => EngineError::Codec {
                lba: *lba,
                source: source.clone(),
            },
        }
    }
}

/// An `io::Error` like `e`: its OS error code, else its kind and text.
fn copy_io(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

impl From<NoSpace> for EngineError {
    fn from(e: NoSpace) -> Self {
        EngineError::NoSpace(e)
    }
}

impl From<Invalid> for EngineError {
    fn from(e: Invalid) -> Self {
        EngineError::Invalid(e)
    }
}

impl From<NotAVolume> for EngineError {
    fn from(e: NotAVolume) -> Self {
        EngineError::NotAVolume(e)
    }
}

impl From<ReadOnly> for EngineError {
    fn from(e: ReadOnly) -> Self {
        EngineError::ReadOnly(e)
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_stay_what_nbd_clients_expect() {
        let enospc = || io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(EngineError::from_storage(enospc()).errno(), libc::ENOSPC);
        assert_eq!(
            EngineError::NoSpace(NoSpace::CheckpointSegment).errno(),
            libc::ENOSPC
        );
        assert_eq!(
            EngineError::Invalid(Invalid::StoreNotEmpty).errno(),
            libc::EINVAL
        );
        assert_eq!(EngineError::ReadOnly(ReadOnly::Opened).errno(), libc::EROFS);
        let first = Arc::new(EngineError::Io(io::Error::from_raw_os_error(libc::EIO)));
        let ro = EngineError::ReadOnly(ReadOnly::Failed(first));
        assert_eq!(ro.errno(), libc::EROFS);
        assert_eq!(ro.into_io().kind(), io::ErrorKind::ReadOnlyFilesystem);
        let internal = EngineError::Internal(Internal::PagedTwice { chunk: 3 });
        assert_eq!(internal.errno(), libc::EIO);
        // ENOSPC reaches the NBD layer as StorageFull, or as the very error.
        assert_eq!(
            EngineError::from_storage(enospc()).into_io().kind(),
            io::ErrorKind::StorageFull
        );
        assert_eq!(
            EngineError::Io(enospc()).into_io().raw_os_error(),
            Some(libc::ENOSPC)
        );
    }

    #[test]
    fn the_text_ends_with_each_cause_so_a_chain_walk_says_it_once() {
        let first = EngineError::from_storage(io::Error::from_raw_os_error(libc::EIO));
        let e = EngineError::ReadOnly(ReadOnly::Failed(Arc::new(first.duplicate())));
        let text = e.to_string();
        let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(&e);
        let mut depth = 0;
        while let Some(c) = cause {
            let c_text = c.to_string();
            assert!(
                text == c_text || text.ends_with(&format!(": {c_text}")),
                "{text:?} / {c}"
            );
            cause = c.source();
            depth += 1;
        }
        assert_eq!(
            depth, 3,
            "the ReadOnly reason, the first error, its io::Error"
        );
        assert!(
            text.starts_with("volume is read-only after an earlier failure (reopen it): I/O"),
            "{text}"
        );
    }

    #[test]
    fn a_duplicate_keeps_the_os_error() {
        let e = EngineError::from_storage(io::Error::from_raw_os_error(libc::ENOSPC));
        let d = e.duplicate();
        assert!(
            matches!(&d, EngineError::NoSpace(NoSpace::Backing(io)) if io.raw_os_error() == Some(libc::ENOSPC))
        );
        assert_eq!(d.to_string(), e.to_string());
    }
}
