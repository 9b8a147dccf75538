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
pub use space::merge::MergeReport;
pub use squeeze_codec::{Algorithm, CompressEngine, CpuPool};
pub use squeeze_format::{CodecId, CompressionMode, Policy, SECTOR_SIZE};
pub use stats::VolumeStats;
pub use storage::{FileStorage, IoMode, SimFaults, SimStorage, Storage};
pub use volume::{default_policy, CreateOptions, OpenOptions, Volume};
