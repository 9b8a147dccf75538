//! ISA-L (Intel's Intelligent Storage Acceleration Library, igzip): the
//! seeds' software accelerator for DEFLATE, from Debian's libisal through a
//! small C shim (`csrc/isal_shim.c`, built by `build.rs` when pkg-config
//! finds libisal; `cfg(squeeze_isal)`).
//!
//! - [`IsalDeflate`]: a [`Compressor`] writing raw DEFLATE with ISA-L's
//!   levels 1..=3, for `deflate:1..=3`. Records keep codec id deflate: any
//!   inflater decodes them (squeeze reads them with libdeflate).
//! - [`isal_pool`]: the batch [`CompressEngine`] with ISA-L behind it: the
//!   CPU pool's workers running ISA-L for the deflate levels it has and
//!   the usual libraries (libdeflate for deflate:4..=12) for everything
//!   else. [`default_engine`] picks it when ISA-L is present.
//!
//! Invariants: as every [`Compressor`] (output never longer than `limit`,
//! "does not fit" is `Ok(None)`); an ISA-L error is a `CodecError`, which
//! the pool turns into "store raw" and counts.

use crate::{Algorithm, CodecError, Compressor, CpuPool};
use squeeze_format::CodecId;

/// The deflate levels ISA-L runs (as its levels 1..=3).
pub const ISAL_DEFLATE_LEVELS: (i32, i32) = (1, 3);

/// True when this build links ISA-L.
pub fn available() -> bool {
    cfg!(squeeze_isal)
}

/// True when ISA-L runs `alg` (deflate at levels 1..=3) in this build.
pub fn runs(alg: Algorithm) -> bool {
    available()
        && alg.codec == CodecId::Deflate
        && (ISAL_DEFLATE_LEVELS.0..=ISAL_DEFLATE_LEVELS.1).contains(&alg.effective_level())
}

/// A compressor for `alg`: ISA-L where it [`runs`] it, else the usual
/// library ([`crate::try_new_compressor`]).
pub fn try_new_compressor(alg: Algorithm) -> Result<Box<dyn Compressor>, CodecError> {
    #[cfg(squeeze_isal)]
    if runs(alg) {
        return Ok(Box::new(IsalDeflate::new(alg)?));
    }
    crate::try_new_compressor(alg)
}

/// The batch engine with ISA-L behind it: `threads` workers (0: one per
/// CPU) that run deflate:1..=3 on ISA-L and every other algorithm on its
/// usual library. Without ISA-L in the build, the plain CPU pool.
pub fn isal_pool(threads: usize) -> CpuPool {
    if available() {
        CpuPool::with_compressors(threads, "isal-pool", try_new_compressor)
    } else {
        CpuPool::new(threads)
    }
}

/// The engine a volume gets unless told otherwise: [`isal_pool`] when ISA-L
/// is present (it only changes deflate:1..=3), else the CPU pool.
pub fn default_engine(threads: usize) -> CpuPool {
    isal_pool(threads)
}

#[cfg(squeeze_isal)]
pub use imp::IsalDeflate;

#[cfg(squeeze_isal)]
mod imp {
    use super::*;
    use crate::codecs::Scratch;

    #[repr(C)]
    struct Ctx {
        _opaque: [u8; 0],
    }

    extern "C" {
        fn sqz_isal_new(level: u32) -> *mut Ctx;
        fn sqz_isal_free(c: *mut Ctx);
        fn sqz_isal_deflate(c: *mut Ctx, src: *const u8, len: u32, dst: *mut u8, cap: u32) -> i64;
    }

    /// Raw DEFLATE with ISA-L at one level (owns the library's context and
    /// level buffer).
    pub struct IsalDeflate {
        alg: Algorithm,
        ctx: *mut Ctx,
        scratch: Scratch,
    }

    // SAFETY: the context is owned by this value alone and used only
    // through `&mut self`; ISA-L keeps no thread-affine state in it.
    unsafe impl Send for IsalDeflate {}

    impl IsalDeflate {
        /// A compressor for `alg`, deflate at levels 1..=3.
        pub fn new(alg: Algorithm) -> Result<Self, CodecError> {
            let level = alg.effective_level();
            if alg.codec != CodecId::Deflate
                || !(ISAL_DEFLATE_LEVELS.0..=ISAL_DEFLATE_LEVELS.1).contains(&level)
            {
                return Err(CodecError::BadLevel {
                    codec: alg.codec,
                    level,
                    min: ISAL_DEFLATE_LEVELS.0,
                    max: ISAL_DEFLATE_LEVELS.1,
                });
            }
            // SAFETY: plain constructor; NULL is handled.
            let ctx = unsafe { sqz_isal_new(level as u32) };
            if ctx.is_null() {
                return Err(CodecError::Internal {
                    codec: CodecId::Deflate,
                    why: "ISA-L: cannot allocate a deflate context".into(),
                });
            }
            Ok(IsalDeflate {
                alg,
                ctx,
                scratch: Scratch::default(),
            })
        }
    }

    impl Drop for IsalDeflate {
        fn drop(&mut self) {
            // SAFETY: `ctx` came from sqz_isal_new and is freed once.
            unsafe { sqz_isal_free(self.ctx) }
        }
    }

    impl Compressor for IsalDeflate {
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
            let too_big = |what: &str| CodecError::Internal {
                codec: CodecId::Deflate,
                why: format!("ISA-L: {what} over 4 GiB"),
            };
            let len = u32::try_from(src.len()).map_err(|_| too_big("input"))?;
            let cap = u32::try_from(limit).map_err(|_| too_big("limit"))?;
            let out = self.scratch.get(limit);
            // SAFETY: src and out are valid for len and cap bytes; the shim
            // writes at most cap bytes into out.
            let n = unsafe { sqz_isal_deflate(self.ctx, src.as_ptr(), len, out.as_mut_ptr(), cap) };
            match n {
                0 => Ok(None),
                n if n >= 0 => {
                    let n = n as usize;
                    assert!(n <= limit, "ISA-L wrote {n} bytes into {limit}");
                    dst.extend_from_slice(&out[..n]);
                    Ok(Some(n))
                }
                e => Err(CodecError::Internal {
                    codec: CodecId::Deflate,
                    why: format!("ISA-L deflate failed: error {e}"),
                }),
            }
        }
    }
}
