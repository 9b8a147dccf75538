//! Operating errors of the engine (typed, `#[non_exhaustive]`); programmer
//! errors are assertions. Each maps to an errno for the NBD layer.

use squeeze_format::FormatError;
use std::io;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("I/O error on the backing file: {0}")]
    Io(#[from] io::Error),
    #[error("no space left: {0}")]
    NoSpace(String),
    #[error("range {offset}+{len} is outside the volume (size {size})")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("corrupt data at LBA {lba}: {source}")]
    Corrupt { lba: u64, source: FormatError },
    #[error("corrupt metadata: {0}")]
    Metadata(FormatError),
    #[error("not a squeeze volume: {0}")]
    NotAVolume(String),
    /// Flushed data is gone (recovery found missing records, or the file
    /// was cut short): the volume opens only when the caller accepts the
    /// loss (`OpenOptions::accept_loss`).
    #[error("the volume lost flushed data: {0}")]
    Damaged(Box<crate::damage::RecoveryDamage>),
    #[error("volume is read-only after an earlier I/O failure ({0}); reopen it")]
    ReadOnly(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A broken invariant of the engine's own state (a bug): the volume
    /// turns read-only rather than act on it.
    #[error("internal error (the volume turned read-only; please report it): {0}")]
    Internal(String),
    #[error("codec error at LBA {lba}: {source}")]
    Codec {
        lba: u64,
        source: squeeze_codec::CodecError,
    },
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
            EngineError::NoSpace(format!("backing store: {e}"))
        } else {
            EngineError::Io(e)
        }
    }

    pub(crate) fn is_enospc(e: &io::Error) -> bool {
        e.raw_os_error() == Some(libc::ENOSPC) || e.kind() == io::ErrorKind::StorageFull
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
