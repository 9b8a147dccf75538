//! snappy raw (block) format via `snap::raw`. The payload starts with a
//! varint of the raw length, which decode checks against the expected
//! length before doing any work.
//!
//! Like lz4, `snap::raw::Encoder::compress` demands an output of
//! `max_compress_len(src.len())`, so it cannot stop early at `limit`: it
//! compresses into a grow-only scratch buffer and copies out what fits.

use snap::raw::{decompress_len, max_compress_len, Decoder, Encoder};
use squeeze_format::CodecId;

use super::Scratch;
use crate::{Algorithm, CodecError, Compressor};

pub(crate) struct SnappyCompressor {
    encoder: Encoder,
    scratch: Scratch,
}

impl SnappyCompressor {
    pub(crate) fn new() -> Self {
        SnappyCompressor {
            encoder: Encoder::new(),
            scratch: Scratch::default(),
        }
    }
}

impl Compressor for SnappyCompressor {
    fn algorithm(&self) -> Algorithm {
        Algorithm::new(CodecId::Snappy, 0)
    }

    fn compress(
        &mut self,
        src: &[u8],
        dst: &mut Vec<u8>,
        limit: usize,
    ) -> Result<Option<usize>, CodecError> {
        dst.clear();
        let bound = max_compress_len(src.len());
        if bound == 0 {
            // Input above snappy's 2^32-1 limit: not compressible by it.
            return Ok(None);
        }
        let out = self.scratch.get(bound);
        let n = self
            .encoder
            .compress(src, out)
            .map_err(|e| CodecError::Internal {
                codec: CodecId::Snappy,
                why: e.to_string(),
            })?;
        if n > limit {
            return Ok(None);
        }
        dst.extend_from_slice(&out[..n]);
        Ok(Some(n))
    }
}

pub(crate) fn decode(decoder: &mut Decoder, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    let raw_len = decompress_len(src).map_err(|e| CodecError::corrupt(CodecId::Snappy, e))?;
    CodecError::check_len(CodecId::Snappy, dst.len(), raw_len)?;
    let n = decoder
        .decompress(src, dst)
        .map_err(|e| CodecError::corrupt(CodecId::Snappy, e))?;
    CodecError::check_len(CodecId::Snappy, dst.len(), n)
}
