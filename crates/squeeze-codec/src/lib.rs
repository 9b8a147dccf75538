//! squeeze-codec: the compression stage of the write path and the
//! decompression step of the read path.
//!
//! ```text
//! write pipeline ... policy -> [engine: CpuPool -> Compressor] -> segment log
//! read path      ... extent read -> checksum -> [decompress] -> client
//! ```
//!
//! - [`Algorithm`]: a codec id from `squeeze_format`'s registry plus a level.
//! - [`Compressor`] / [`Decompressor`]: per-thread codec contexts
//!   (liblz4, libzstd, snap, libdeflate), see [`codec`].
//! - [`looks_incompressible`]: the btrfs-style sampling heuristic.
//! - [`CompressEngine`] / [`CpuPool`]: batch compression off the caller's
//!   thread, with per-job CPU time; [`isal`]: the same pool with ISA-L's
//!   igzip behind deflate:1..=3 (Debian's libisal, when present).
//! - [`Saturated`]: any engine reporting itself far behind (a drill for the
//!   adaptive codec and the idle upgrade).
//! - [`chunked`]: blobs as independent chunks behind a table (format 5),
//!   so a small read decodes one chunk.
//! - [`testdata`]: fio-like synthetic data for tests and `squeeze bench`.
//!
//! Invariant for the whole crate: bytes from disk never panic it — every
//! decode failure is a [`CodecError`].

pub mod algorithm;
pub mod chunked;
pub mod codec;
mod codecs;
pub mod cputime;
pub mod engine;
pub mod error;
pub mod heuristic;
pub mod isal;
pub mod pool;
pub mod process;
pub mod saturated;
pub mod testdata;

pub use algorithm::Algorithm;
pub use codec::{
    decompress, decompress_block, new_compressor, new_decompressor, try_new_compressor,
    BlockOutcome, Compressor, Decompressor,
};
pub use cputime::thread_cpu_ns;
pub use engine::{CompressEngine, Job, JobOutput, JobResult};
pub use error::CodecError;
pub use heuristic::looks_incompressible;
pub use pool::{CompressorFactory, CpuPool};
pub use saturated::Saturated;
pub use squeeze_format::CodecId;
