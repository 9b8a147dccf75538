//! The codec plugin interface (DESIGN principle 6): per-thread
//! [`Compressor`]s that own their library's reusable context, and one
//! [`Decompressor`] that decodes every registered [`CodecId`].
//!
//! Invariants:
//! - A compressor is `Send` but not `Sync`: one per worker thread.
//! - `compress` never returns output longer than `limit`; "would not fit"
//!   is `Ok(None)` (the caller stores raw), not an error.
//! - `decompress` fills exactly `dst.len()` bytes or fails; bytes from disk
//!   never panic it.
//! - Decoder contexts are created lazily, on the first payload of a codec.

use std::cell::RefCell;

use squeeze_format::CodecId;

use crate::codecs::{deflate, lz4, none, snappy, zstd};
use crate::{Algorithm, CodecError};

/// A per-thread compressor for one [`Algorithm`] (holds reusable contexts).
pub trait Compressor: Send {
    /// The algorithm (codec and level as requested) this compressor runs.
    fn algorithm(&self) -> Algorithm;

    /// Compresses `src` into `dst` (cleared first). `Ok(Some(n))`: `dst`
    /// holds the `n <= limit` compressed bytes. `Ok(None)`: the output
    /// would exceed `limit` bytes (`dst` is empty; store raw instead).
    fn compress(
        &mut self,
        src: &[u8],
        dst: &mut Vec<u8>,
        limit: usize,
    ) -> Result<Option<usize>, CodecError>;

    /// Compresses `src` (an extent's raw bytes) into `dst` (cleared first)
    /// as a block payload (format 6, `squeeze_format::zstd_block`): the
    /// body of one compressed block of `src` up to its last non-zero byte.
    /// Only zstd has one; every other codec answers `NotABlock`.
    fn compress_block(
        &mut self,
        src: &[u8],
        dst: &mut Vec<u8>,
        limit: usize,
    ) -> Result<BlockOutcome, CodecError> {
        let _ = (src, dst, limit);
        Ok(BlockOutcome::NotABlock)
    }
}

/// What [`Compressor::compress_block`] made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockOutcome {
    /// `dst` holds the `n <= limit` bytes of a block payload.
    Body(usize),
    /// The body would exceed `limit`: store raw.
    TooBig,
    /// No block payload (another codec, or the frame was not one block):
    /// compress a frame instead.
    NotABlock,
}

/// A per-thread decompressor for every codec in the registry.
pub trait Decompressor: Send {
    /// Decompresses `src` into exactly `dst.len()` bytes; any other length
    /// or corrupt input is an error (never a panic).
    fn decompress(&mut self, codec: CodecId, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError>;
}

/// A compressor for `alg`, or the library's error (e.g. libzstd could not
/// allocate its context). Out-of-range levels are clamped.
pub fn try_new_compressor(alg: Algorithm) -> Result<Box<dyn Compressor>, CodecError> {
    Ok(match alg.codec {
        CodecId::None => Box::new(none::NoneCompressor),
        CodecId::Lz4 => Box::new(lz4::Lz4Compressor::default()),
        CodecId::Zstd => Box::new(zstd::ZstdCompressor::new(alg)?),
        CodecId::Snappy => Box::new(snappy::SnappyCompressor::new()),
        CodecId::Deflate => Box::new(deflate::DeflateCompressor::new(alg)?),
    })
}

/// A compressor for `alg`. Out-of-range levels are clamped.
///
/// # Panics
/// If the codec library cannot allocate its context (out of memory).
pub fn new_compressor(alg: Algorithm) -> Box<dyn Compressor> {
    match try_new_compressor(alg) {
        Ok(c) => c,
        Err(e) => panic!("cannot create a {alg} compressor: {e}"),
    }
}

/// A decompressor that handles every [`CodecId`] (`None` = copy).
pub fn new_decompressor() -> Box<dyn Decompressor> {
    Box::new(AnyDecompressor::default())
}

/// Decompresses with this thread's own [`Decompressor`] (for the read path,
/// called from many threads; contexts are reused across calls).
pub fn decompress(codec: CodecId, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    thread_local! {
        static DECOMPRESSOR: RefCell<AnyDecompressor> = RefCell::new(AnyDecompressor::default());
    }
    DECOMPRESSOR.with_borrow_mut(|d| d.decompress(codec, src, dst))
}

/// Decodes a block payload (format 6, `squeeze_format::zstd_block`) into
/// `dst`, the extent's raw bytes: the block's content, then zeros. Corrupt
/// input, or content longer than `dst`, is an error (never a panic).
pub fn decompress_block(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    thread_local! {
        static BLOCKS: RefCell<(Option<::zstd::bulk::Decompressor<'static>>, Vec<u8>)> =
            const { RefCell::new((None, Vec::new())) };
    }
    BLOCKS.with_borrow_mut(|(ctx, frame)| {
        let ctx = match ctx {
            Some(ctx) => ctx,
            slot => slot.insert(::zstd::bulk::Decompressor::new().map_err(|e| {
                CodecError::Internal {
                    codec: CodecId::Zstd,
                    why: e.to_string(),
                }
            })?),
        };
        zstd::decode_block(ctx, frame, src, dst)
    })
}

/// Decoder contexts for every codec, each created on first use.
#[derive(Default)]
pub(crate) struct AnyDecompressor {
    zstd: Option<::zstd::bulk::Decompressor<'static>>,
    snappy: Option<::snap::raw::Decoder>,
    deflate: Option<libdeflater::Decompressor>,
}

impl Decompressor for AnyDecompressor {
    fn decompress(&mut self, codec: CodecId, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        match codec {
            CodecId::None => none::decode(src, dst),
            CodecId::Lz4 => lz4::decode(src, dst),
            CodecId::Zstd => {
                let ctx = match &mut self.zstd {
                    Some(ctx) => ctx,
                    slot => slot.insert(::zstd::bulk::Decompressor::new().map_err(|e| {
                        CodecError::Internal {
                            codec,
                            why: e.to_string(),
                        }
                    })?),
                };
                zstd::decode(ctx, src, dst)
            }
            CodecId::Snappy => snappy::decode(
                self.snappy.get_or_insert_with(snap::raw::Decoder::new),
                src,
                dst,
            ),
            CodecId::Deflate => deflate::decode(
                self.deflate
                    .get_or_insert_with(libdeflater::Decompressor::new),
                src,
                dst,
            ),
        }
    }
}
