//! Operating errors of the codec layer.
//!
//! Invariants: every failure that bad bytes (from disk or a user's string)
//! can cause is one of these variants; none of them is ever a panic.
//! Programmer errors (a broken internal invariant) stay `assert!`s.

use squeeze_format::CodecId;

/// What can go wrong when parsing an algorithm or running a codec.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The algorithm name is not in the codec-id registry.
    #[error("unknown compression algorithm {0:?} (expected one of none, lz4, zstd[:level], snappy, deflate[:level])")]
    UnknownAlgorithm(String),

    /// A level outside the codec's range, or a level given to a codec
    /// that has none.
    #[error("bad level {level} for {}: accepted {min}..={max}", codec.name())]
    BadLevel {
        codec: CodecId,
        level: i32,
        /// Smallest accepted level (both 0 when the codec has no levels).
        min: i32,
        max: i32,
    },

    /// The payload is not a valid stream of this codec.
    #[error("corrupt {} payload: {why}", codec.name())]
    Corrupt { codec: CodecId, why: String },

    /// The payload is valid but decodes to a different length than the
    /// caller expected (the record's raw length).
    #[error("{} payload decodes to {got} bytes, expected {expected}", codec.name())]
    WrongLength {
        codec: CodecId,
        expected: usize,
        got: usize,
    },

    /// The payload decodes to more than the expected length; the decoder
    /// stopped at the end of the output buffer, so the true length is
    /// unknown.
    #[error("{} payload decodes to more than the expected {expected} bytes", codec.name())]
    TooLong { codec: CodecId, expected: usize },

    /// The codec library failed while compressing (not a size overflow,
    /// which is `Ok(None)`): e.g. allocation failure inside libzstd.
    #[error("{} compressor failed: {why}", codec.name())]
    Internal { codec: CodecId, why: String },
}

impl CodecError {
    pub(crate) fn corrupt(codec: CodecId, why: impl std::fmt::Display) -> CodecError {
        CodecError::Corrupt {
            codec,
            why: why.to_string(),
        }
    }

    /// Checks a decoder's output length against the expected one.
    pub(crate) fn check_len(codec: CodecId, expected: usize, got: usize) -> Result<(), CodecError> {
        if got == expected {
            Ok(())
        } else {
            Err(CodecError::WrongLength {
                codec,
                expected,
                got,
            })
        }
    }
}
