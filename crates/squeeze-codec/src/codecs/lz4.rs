//! lz4 block format (no frame, no size prefix) via liblz4 through the `lz4`
//! crate's block API (`LZ4_compress_default` / `LZ4_decompress_safe`); the
//! raw length is not in the payload, it comes from the extent record.
//!
//! The block format is the one lz4_flex reads and writes (squeeze used
//! lz4_flex before; `tests/lz4_compat.rs` checks both directions), so
//! existing volumes stay readable.
//!
//! liblz4 honours an output capacity below `LZ4_compressBound`: it stops as
//! soon as the output would not fit and returns 0. We compress into a
//! grow-only scratch buffer of `min(limit, bound)` bytes (its hash table
//! lives on the stack, `LZ4_HEAPMODE 0`), so incompressible input is given
//! up early, and copy out only results that fit.
//!
//! `LZ4_decompress_safe` bounds every read and write by the input and output
//! lengths and reports corrupt input as a negative return; it cannot tell
//! "corrupt" from "decodes to more than `dst.len()` bytes", so both are
//! [`CodecError::Corrupt`] (never `TooLong`).

use std::io::ErrorKind;

use lz4::block;
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
        // Err: input above LZ4_MAX_INPUT_SIZE (~2 GiB), not compressible by lz4.
        let Ok(bound) = block::compress_bound(src.len()) else {
            return Ok(None);
        };
        let cap = limit.min(bound);
        let out = self.scratch.get(cap);
        match block::compress_to_buffer(src, None, false, out) {
            Ok(n) if n <= limit => {
                dst.extend_from_slice(&out[..n]);
                Ok(Some(n))
            }
            // Cannot happen (liblz4 never writes past `cap`); kept total.
            Ok(_) => Ok(None),
            // liblz4 returned 0: the output would exceed `cap < bound`.
            Err(e) if e.kind() == ErrorKind::Other && cap < bound => Ok(None),
            Err(e) => Err(CodecError::Internal {
                codec: CodecId::Lz4,
                why: e.to_string(),
            }),
        }
    }
}

pub(crate) fn decode(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    // liblz4 takes both lengths as C ints; an lz4 block never exceeds
    // LZ4_MAX_INPUT_SIZE, so anything longer is not ours.
    let Ok(expected) = i32::try_from(dst.len()) else {
        return Err(CodecError::corrupt(
            CodecId::Lz4,
            format!("expected length {} exceeds lz4's limit", dst.len()),
        ));
    };
    if i32::try_from(src.len()).is_err() {
        return Err(CodecError::corrupt(
            CodecId::Lz4,
            format!("payload of {} bytes exceeds lz4's limit", src.len()),
        ));
    }
    match block::decompress_to_buffer(src, Some(expected), dst) {
        Ok(n) => CodecError::check_len(CodecId::Lz4, dst.len(), n),
        Err(_) => Err(CodecError::corrupt(
            CodecId::Lz4,
            format!(
                "invalid lz4 block, or it decodes to more than the expected {} bytes",
                dst.len()
            ),
        )),
    }
}
