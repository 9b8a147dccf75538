//! Operating errors of the store (typed, `#[non_exhaustive]`).

use squeeze_engine::EngineError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    #[error("volume: {0}")]
    Volume(#[from] EngineError),
    #[error("not a squeeze-kv store: {0}")]
    NotAStore(String),
    #[error("unsupported squeeze-kv version {0}")]
    UnsupportedVersion(u32),
    #[error("store header checksum mismatch (expected {expected:#010x}, got {got:#010x})")]
    HeaderChecksum { expected: u32, got: u32 },
    #[error("the store was created with {what} {found}, opened with {wanted}")]
    Mismatch {
        what: &'static str,
        found: u64,
        wanted: u64,
    },
    #[error("corrupt bucket {bucket}: {why}")]
    CorruptBucket { bucket: u64, why: String },
    #[error("{what} of {len} bytes is over the limit: {why}")]
    TooLarge {
        what: &'static str,
        len: usize,
        why: String,
    },
    #[error("no room for the key: {0}")]
    Full(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl KvError {
    pub fn errno(&self) -> i32 {
        match self {
            KvError::Volume(e) => e.errno(),
            KvError::Full(_) => libc::ENOSPC,
            KvError::TooLarge { .. } | KvError::Invalid(_) | KvError::Mismatch { .. } => {
                libc::EINVAL
            }
            _ => libc::EIO,
        }
    }
}

pub type Result<T, E = KvError> = std::result::Result<T, E>;
