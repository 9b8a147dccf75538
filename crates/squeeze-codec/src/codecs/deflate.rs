//! Raw DEFLATE (RFC 1951, no zlib/gzip wrapper) via libdeflate, levels
//! 1..=12 (default 6).
//!
//! libdeflate accepts an output buffer smaller than its bound and gives up
//! as soon as the output would not fit, so compression runs into a scratch
//! slice of exactly `limit` bytes (capped at the bound) and "insufficient
//! space" is `Ok(None)`.

use libdeflater::{CompressionError, CompressionLvl, DecompressionError};
use squeeze_format::CodecId;

use super::Scratch;
use crate::{Algorithm, CodecError, Compressor};

pub(crate) struct DeflateCompressor {
    alg: Algorithm,
    ctx: libdeflater::Compressor,
    scratch: Scratch,
}

impl DeflateCompressor {
    pub(crate) fn new(alg: Algorithm) -> Result<Self, CodecError> {
        let level = alg.effective_level();
        let lvl = CompressionLvl::new(level).map_err(|_| CodecError::BadLevel {
            codec: CodecId::Deflate,
            level,
            min: crate::algorithm::DEFLATE_LEVELS.0,
            max: crate::algorithm::DEFLATE_LEVELS.1,
        })?;
        Ok(DeflateCompressor {
            alg,
            ctx: libdeflater::Compressor::new(lvl),
            scratch: Scratch::default(),
        })
    }
}

impl Compressor for DeflateCompressor {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }

    fn compress(
        &mut self,
        src: &[u8],
        dst: &mut Vec<u8>,
        limit: usize,
    ) -> Result<Option<usize>, CodecError> {
        dst.clear();
        let bound = self.ctx.deflate_compress_bound(src.len());
        let out = self.scratch.get(limit.min(bound));
        match self.ctx.deflate_compress(src, out) {
            Ok(n) => {
                dst.extend_from_slice(&out[..n]);
                Ok(Some(n))
            }
            Err(CompressionError::InsufficientSpace) => Ok(None),
        }
    }
}

pub(crate) fn decode(
    ctx: &mut libdeflater::Decompressor,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), CodecError> {
    match ctx.deflate_decompress(src, dst) {
        Ok(n) => CodecError::check_len(CodecId::Deflate, dst.len(), n),
        Err(DecompressionError::InsufficientSpace) => Err(CodecError::TooLong {
            codec: CodecId::Deflate,
            expected: dst.len(),
        }),
        Err(DecompressionError::BadData) => Err(CodecError::corrupt(
            CodecId::Deflate,
            "invalid DEFLATE stream",
        )),
    }
}
