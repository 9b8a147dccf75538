//! Operating errors of the log (typed, `#[non_exhaustive]`); programmer
//! errors are assertions.

use squeeze_engine::EngineError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    #[error("volume: {0}")]
    Volume(#[from] EngineError),
    #[error("not a squeeze-wal log: {0}")]
    NotALog(String),
    #[error("unsupported squeeze-wal version {0}")]
    UnsupportedVersion(u32),
    #[error("log header checksum mismatch (expected {expected:#010x}, got {got:#010x})")]
    HeaderChecksum { expected: u32, got: u32 },
    #[error("the log is {found:?}, opened as {wanted:?}")]
    LayoutMismatch {
        found: crate::Layout,
        wanted: crate::Layout,
    },
    #[error("corrupt log: {0}")]
    Corrupt(String),
    #[error("record of {len} bytes is over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("log full: {0} (truncate the consumed prefix)")]
    Full(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("the log failed earlier ({0}); reopen it")]
    Failed(String),
}

impl WalError {
    /// The errno a command line or server should report.
    pub fn errno(&self) -> i32 {
        match self {
            WalError::Volume(e) => e.errno(),
            WalError::Full(_) => libc::ENOSPC,
            WalError::TooLarge { .. } | WalError::Invalid(_) | WalError::LayoutMismatch { .. } => {
                libc::EINVAL
            }
            _ => libc::EIO,
        }
    }
}

pub type Result<T, E = WalError> = std::result::Result<T, E>;
