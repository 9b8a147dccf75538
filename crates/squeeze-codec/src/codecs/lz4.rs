//! lz4 block format (no frame) via `lz4_flex`; the raw length is not in the
//! payload, it comes from the extent record.
//!
//! `lz4_flex::block::compress_into` refuses any output slice shorter than
//! `get_maximum_output_size(src.len())`, so it cannot stop early at `limit`:
//! we compress into a grow-only scratch buffer of the full bound (its hash
//! table lives on the stack) and copy out only results that fit.

use lz4_flex::block::{self, DecompressError};
use squeeze_format::CodecId;

use super::Scratch;
use crate::{Algorithm, CodecError, Compressor};

#[derive(Default)]
pub(crate) struct Lz4Compressor {
    scratch: Scratch,
}

impl Compressor for Lz4Compressor {
    fn algorithm(&self) -> Algorithm {
        Algorithm::new(CodecId::Lz4, 0)
    }

    fn compress(
        &mut self,
        src: &[u8],
        dst: &mut Vec<u8>,
        limit: usize,
    ) -> Result<Option<usize>, CodecError> {
        dst.clear();
        let out = self.scratch.get(block::get_maximum_output_size(src.len()));
        let n = block::compress_into(src, out).map_err(|e| CodecError::Internal {
            codec: CodecId::Lz4,
            why: e.to_string(),
        })?;
        if n > limit {
            return Ok(None);
        }
        dst.extend_from_slice(&out[..n]);
        Ok(Some(n))
    }
}

pub(crate) fn decode(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    match block::decompress_into(src, dst) {
        Ok(n) => CodecError::check_len(CodecId::Lz4, dst.len(), n),
        Err(DecompressError::OutputTooSmall { .. }) => Err(CodecError::TooLong {
            codec: CodecId::Lz4,
            expected: dst.len(),
        }),
        Err(e) => Err(CodecError::corrupt(CodecId::Lz4, e)),
    }
}
