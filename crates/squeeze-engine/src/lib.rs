//! The squeeze engine: a crash-safe, inline-compressing, log-structured
//! volume. See docs/ARCHITECTURE.md for the data path; each stage is one
//! module:
//!
//! - `volume`: the LBA space, flush/FUA semantics, the public API
//! - `pipeline`: split -> policy -> compress
//! - `locks`: range locks and flush tickets
//! - `map`: the sector map
//! - `space`: segment states, free list, live-byte accounting
//! - `meta`: superblock, checkpoints, recovery
//! - `storage`: the backing file and the crash/fault simulator
//! - `check`: the scrubber behind `squeeze check`
//! - `stats`: counters

pub mod check;
pub mod error;
pub mod locks;
pub mod map;
pub(crate) mod meta;
pub mod pipeline;
pub mod space;
pub mod stats;
pub mod storage;
pub mod volume;

pub use error::{EngineError, Result};
pub use pipeline::policy::Hint;
pub use space::cleaner::CleanReport;
pub use squeeze_codec::{Algorithm, CompressEngine, CpuPool};
pub use squeeze_format::{CodecId, CompressionMode, Policy, SECTOR_SIZE};
pub use stats::VolumeStats;
pub use storage::{FileStorage, SimFaults, SimStorage, Storage};
pub use volume::{default_policy, CreateOptions, OpenOptions, Volume};

/// CPU time of the calling thread, in nanoseconds.
pub fn cpu_time_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
