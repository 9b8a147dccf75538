//! The codec-id registry. These numbers are written into every extent record
//! and into the superblock's policy; they are part of the on-disk format and
//! never change meaning. A new codec gets the next free number.

use crate::FormatError;

/// Numeric id of the algorithm that produced an extent's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CodecId {
    /// Payload is the raw sectors, stored uncompressed.
    None = 0,
    /// LZ4 block format (no frame), raw length from the record header.
    Lz4 = 1,
    /// Zstandard frame (single frame, content size present).
    Zstd = 2,
    /// Snappy raw (block) format.
    Snappy = 3,
    /// Raw DEFLATE (RFC 1951, no zlib or gzip wrapper).
    Deflate = 4,
}

impl CodecId {
    /// Every registered codec, in id order.
    pub const ALL: [CodecId; 5] = [
        CodecId::None,
        CodecId::Lz4,
        CodecId::Zstd,
        CodecId::Snappy,
        CodecId::Deflate,
    ];

    /// Decodes an id read from disk; an unknown id is a typed error.
    pub fn from_u8(value: u8) -> Result<CodecId, FormatError> {
        match value {
            0 => Ok(CodecId::None),
            1 => Ok(CodecId::Lz4),
            2 => Ok(CodecId::Zstd),
            3 => Ok(CodecId::Snappy),
            4 => Ok(CodecId::Deflate),
            other => Err(FormatError::UnknownCodec(other)),
        }
    }

    /// The name used on the command line and in statistics.
    pub fn name(self) -> &'static str {
        match self {
            CodecId::None => "none",
            CodecId::Lz4 => "lz4",
            CodecId::Zstd => "zstd",
            CodecId::Snappy => "snappy",
            CodecId::Deflate => "deflate",
        }
    }

    /// Parses a name as printed by [`CodecId::name`].
    pub fn from_name(name: &str) -> Option<CodecId> {
        CodecId::ALL.into_iter().find(|c| c.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_fixed() {
        // These values are on disk: changing one breaks every existing volume.
        assert_eq!(CodecId::None as u8, 0);
        assert_eq!(CodecId::Lz4 as u8, 1);
        assert_eq!(CodecId::Zstd as u8, 2);
        assert_eq!(CodecId::Snappy as u8, 3);
        assert_eq!(CodecId::Deflate as u8, 4);
        for c in CodecId::ALL {
            assert_eq!(CodecId::from_u8(c as u8).unwrap(), c);
            assert_eq!(CodecId::from_name(c.name()), Some(c));
        }
        assert!(matches!(
            CodecId::from_u8(5),
            Err(FormatError::UnknownCodec(5))
        ));
    }
}
