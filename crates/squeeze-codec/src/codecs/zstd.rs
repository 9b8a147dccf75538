//! zstd via libzstd's bulk API with reusable contexts: one single frame per
//! payload, content size present in the frame header, no checksum (the
//! extent record checksums the payload); or (format 6) a block payload,
//! the body of the one block of a frame without content size, whose frame
//! and block headers the reader rebuilds (`squeeze_format::zstd_block`).
//!
//! Compression writes into `dst`'s capacity, reserved to `limit` (capped at
//! `ZSTD_compressBound`), so libzstd stops as soon as the output would not
//! fit and reports "destination too small", which we answer with `Ok(None)`.

use ::zstd::bulk;
use ::zstd::zstd_safe;
use squeeze_format::zstd_block;
use squeeze_format::CodecId;

use crate::codec::BlockOutcome;
use crate::{Algorithm, CodecError, Compressor};

pub(crate) struct ZstdCompressor {
    alg: Algorithm,
    ctx: bulk::Compressor<'static>,
    /// Frames without content size, for block payloads (made on first use).
    block_ctx: Option<bulk::Compressor<'static>>,
}

impl ZstdCompressor {
    pub(crate) fn new(alg: Algorithm) -> Result<Self, CodecError> {
        let ctx =
            bulk::Compressor::new(alg.effective_level()).map_err(|e| CodecError::Internal {
                codec: CodecId::Zstd,
                why: e.to_string(),
            })?;
        Ok(ZstdCompressor {
            alg,
            ctx,
            block_ctx: None,
        })
    }
}

impl Compressor for ZstdCompressor {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }

    fn compress_block(
        &mut self,
        src: &[u8],
        dst: &mut Vec<u8>,
        limit: usize,
    ) -> Result<BlockOutcome, CodecError> {
        self.block(src, dst, limit)
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

impl ZstdCompressor {
    /// The context for block payloads: content size off (the record knows
    /// the raw length), no checksum, no dictionary.
    fn block_ctx(&mut self) -> Result<&mut bulk::Compressor<'static>, CodecError> {
        let internal = |e: std::io::Error| CodecError::Internal {
            codec: CodecId::Zstd,
            why: e.to_string(),
        };
        if self.block_ctx.is_none() {
            let mut c = bulk::Compressor::new(self.alg.effective_level()).map_err(internal)?;
            c.set_parameter(zstd_safe::CParameter::ContentSizeFlag(false))
                .map_err(internal)?;
            c.set_parameter(zstd_safe::CParameter::ChecksumFlag(false))
                .map_err(internal)?;
            self.block_ctx = Some(c);
        }
        Ok(self.block_ctx.as_mut().expect("just made"))
    }

    /// See [`Compressor::compress_block`].
    pub(crate) fn block(
        &mut self,
        src: &[u8],
        dst: &mut Vec<u8>,
        limit: usize,
    ) -> Result<BlockOutcome, CodecError> {
        dst.clear();
        if src.len() > zstd_block::MAX_RAW_BYTES {
            return Ok(BlockOutcome::NotABlock);
        }
        // The zeros after the last non-zero byte are implied.
        let Some(last) = src.iter().rposition(|&b| b != 0) else {
            return Ok(BlockOutcome::NotABlock);
        };
        let content = &src[..=last];
        // Room for the frame of a body of `limit` bytes, and no more: the
        // library stops as soon as the output would not fit.
        let cap = limit
            .saturating_add(zstd_block::IMPLIED_BYTES)
            .min(zstd_safe::compress_bound(content.len()));
        dst.reserve_exact(cap);
        let mut frame = std::mem::take(dst);
        let made = self.block_ctx()?.compress_to_buffer(content, &mut frame);
        let outcome = match made {
            Ok(n) if n <= cap => match zstd_block::body_of_frame(&frame[..n], src.len()) {
                Some(body) if body.len() <= limit => BlockOutcome::Body(body.len()),
                Some(_) => BlockOutcome::TooBig,
                None => BlockOutcome::NotABlock,
            },
            _ => BlockOutcome::TooBig,
        };
        if let BlockOutcome::Body(n) = outcome {
            frame.drain(..zstd_block::IMPLIED_BYTES);
            debug_assert_eq!(frame.len(), n);
        } else {
            frame.clear();
        }
        *dst = frame;
        Ok(outcome)
    }
}

/// Decodes the block payload `body` into `dst` (the extent's raw bytes):
/// the implied headers and `body` in `frame` (a scratch buffer), decoded,
/// then zeros to the end of `dst`.
pub(crate) fn decode_block(
    ctx: &mut bulk::Decompressor<'static>,
    frame: &mut Vec<u8>,
    body: &[u8],
    dst: &mut [u8],
) -> Result<(), CodecError> {
    if dst.len() > zstd_block::MAX_RAW_BYTES || body.is_empty() || body.len() >= dst.len() {
        return Err(CodecError::corrupt(
            CodecId::Zstd,
            format!("a block payload of {} bytes for {}", body.len(), dst.len()),
        ));
    }
    frame.clear();
    frame.extend_from_slice(&zstd_block::implied_header(dst.len(), body.len()));
    frame.extend_from_slice(body);
    let n = ctx
        .decompress_to_buffer(&frame[..], dst)
        .map_err(|e| CodecError::corrupt(CodecId::Zstd, e))?;
    if n == 0 || dst[n - 1] == 0 {
        // The writer cut the zeros after the last non-zero byte: content
        // that ends in one was not written so.
        return Err(CodecError::corrupt(
            CodecId::Zstd,
            "a block payload whose content ends in a zero",
        ));
    }
    dst[n..].fill(0);
    Ok(())
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
