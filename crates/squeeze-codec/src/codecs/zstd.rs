//! zstd via libzstd's bulk API with reusable contexts: one single frame per
//! payload, content size present in the frame header, no checksum (the
//! extent record checksums the payload).
//!
//! Compression writes into `dst`'s capacity, reserved to `limit` (capped at
//! `ZSTD_compressBound`), so libzstd stops as soon as the output would not
//! fit and reports "destination too small", which we answer with `Ok(None)`.

use ::zstd::bulk;
use ::zstd::zstd_safe;
use squeeze_format::CodecId;

use crate::{Algorithm, CodecError, Compressor};

pub(crate) struct ZstdCompressor {
    alg: Algorithm,
    ctx: bulk::Compressor<'static>,
}

impl ZstdCompressor {
    pub(crate) fn new(alg: Algorithm) -> Result<Self, CodecError> {
        let ctx =
            bulk::Compressor::new(alg.effective_level()).map_err(|e| CodecError::Internal {
                codec: CodecId::Zstd,
                why: e.to_string(),
            })?;
        Ok(ZstdCompressor { alg, ctx })
    }
}

impl Compressor for ZstdCompressor {
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
        let bound = zstd_safe::compress_bound(src.len());
        dst.reserve_exact(limit.min(bound));
        match self.ctx.compress_to_buffer(src, dst) {
            Ok(n) if n <= limit => Ok(Some(n)),
            Ok(_) => {
                // `dst` had more capacity than `limit` from an earlier use.
                dst.clear();
                Ok(None)
            }
            // With a valid context, the only error libzstd can return for
            // an output smaller than its bound is "destination too small".
            Err(_) if dst.capacity() < bound => {
                dst.clear();
                Ok(None)
            }
            Err(e) => {
                dst.clear();
                Err(CodecError::Internal {
                    codec: CodecId::Zstd,
                    why: e.to_string(),
                })
            }
        }
    }
}

pub(crate) fn decode(
    ctx: &mut bulk::Decompressor<'static>,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), CodecError> {
    match zstd_safe::get_frame_content_size(src) {
        Ok(Some(n)) if n != dst.len() as u64 => {
            return Err(CodecError::WrongLength {
                codec: CodecId::Zstd,
                expected: dst.len(),
                got: usize::try_from(n).unwrap_or(usize::MAX),
            })
        }
        Ok(_) => {}
        Err(_) => return Err(CodecError::corrupt(CodecId::Zstd, "not a zstd frame")),
    }
    let n = ctx.decompress_to_buffer(src, dst).map_err(|e| {
        if e.to_string().contains("too small") {
            CodecError::TooLong {
                codec: CodecId::Zstd,
                expected: dst.len(),
            }
        } else {
            CodecError::corrupt(CodecId::Zstd, e)
        }
    })?;
    CodecError::check_len(CodecId::Zstd, dst.len(), n)
}
