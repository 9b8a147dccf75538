//! The squeeze engine: a crash-safe, inline-compressing, log-structured
//! volume. See docs/ARCHITECTURE.md for the data path and the layers (no
//! module imports one above it: `scripts/check_house.py`); each stage is one
//! module:
//!
//! - `volume`: the public API and the lifecycle (create, open, close)
//! - `options`: how a volume is created and opened
//! - `read`: the read path
//! - `write`: the write path (read-modify-write, batches, zero ranges)
//! - `pipeline`: split -> policy -> compress
//! - `append`: log reservation, record write, map install, flush
//! - `maintenance`: the background thread
//! - `space`: segment states, live bytes, allocation ahead and pre-writing,
//!   the cleaner (`gc_policy`, `victim`, `relocate`, `cleaner`, `upgrade`),
//!   making room for an append (`make_room`), the merger
//! - `meta`: superblock, checkpoints, recovery, and paging the map out to
//!   the checkpoint chain (`meta::pager`)
//! - `chain_index`: where the checkpoint chain's runs lie (for paging)
//! - `state`: the shared state every stage works on (`Inner`), its parts in
//!   modules below it (`state::{log_state, map_state, history, ahead_mailbox}`)
//! - `locks`: range locks and flush tickets
//! - `map`: the sector map
//! - `storage`: the backing file and the crash/fault simulator
//! - `check`: the scrubber behind `squeeze check`
//! - `damage`: what opening a volume found damaged (`Volume::damage`)
//! - `counters`, `stats`: the counters, and the stats assembled from them

pub(crate) mod append;
pub(crate) mod chain_index;
pub mod check;
pub mod counters;
pub mod damage;
pub mod dedup;
pub mod error;
pub mod locks;
pub(crate) mod maintenance;
pub mod map;
pub(crate) mod meta;
pub mod options;
pub mod pipeline;
pub(crate) mod read;
pub mod space;
pub(crate) mod state;
pub mod stats;
pub mod storage;
pub mod volume;
mod volume_accounting;
mod volume_passes;
mod volume_settings;
pub(crate) mod write;

pub use damage::{DamagedMarks, RecoveryDamage};
pub use error::{EngineError, Result};
pub use pipeline::policy::Hint;
pub use space::gc_policy::{GcPolicy, GARBAGE_BUDGET_MIN};
pub use space::merge::MergeReport;
pub use space::relocate::CleanReport;
pub use squeeze_codec::{Algorithm, CompressEngine, CpuPool};
pub use squeeze_format::{CodecId, CompressionMode, DedupMode, DedupSettings, Policy, SECTOR_SIZE};
pub use stats::{Space, VolumeStats};
pub use storage::{FileOptions, FileStorage, IoMode, SimFaults, SimStorage, Storage};
pub use volume::{
    default_policy, CreateOptions, OpenOptions, Volume, MAP_CACHE_DEFAULT, MAP_CACHE_MIN,
    MAX_LOGICAL_SIZE,
};
pub use volume_settings::SettingsChange;
