//! The codec implementations, one module per library, each with its
//! compressor (owning that library's reusable context) and the decode
//! function used by [`crate::codec::AnyDecompressor`].
//!
//! Invariants shared by every codec here:
//! - `compress` leaves `dst` holding exactly the compressed bytes on
//!   `Ok(Some(n))` (`dst.len() == n <= limit`) and empty on `Ok(None)`.
//! - decode functions write all of `dst` or return an error; bad input is
//!   an `Err`, never a panic or an out-of-bounds access.
//! - No per-call heap allocation in steady state: scratch buffers only grow.
//!
//! The `compress` bodies look alike (clear `dst`, take the library's bound,
//! call it, keep the output if it fits `limit`) but each is its library's
//! contract: where the bound comes from and what it says for input too
//! large (lz4 and snappy: an error or 0, so the blob stays raw), and how
//! an output over `limit` is reported (liblz4 returns 0, libdeflate
//! `InsufficientSpace`, libzstd "destination too small", snappy and ISA-L
//! write it or a code). A shared opening would hide exactly those
//! differences, so each codec keeps its own.

pub(crate) mod deflate;
pub(crate) mod lz4;
pub(crate) mod none;
pub(crate) mod snappy;
pub(crate) mod zstd;

/// A grow-only output buffer for libraries that write into an initialised
/// slice. Zeroed once when it grows, never per call.
#[derive(Default)]
pub(crate) struct Scratch {
    buf: Vec<u8>,
}

impl Scratch {
    pub(crate) fn get(&mut self, len: usize) -> &mut [u8] {
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        &mut self.buf[..len]
    }
}
