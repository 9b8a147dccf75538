//! squeeze-kv: a table-less hash key-value store on a thin squeeze volume
//! (docs/KV.md), after KallaxDB (the seed "The True Value of Storage
//! Drives with Built-in Transparent Compression"): keys are hashed with
//! XXH64 straight onto the volume's sectors, each 4 KiB sector a loosely
//! filled bucket of records with zeros after them. The volume's logical
//! size is many times the data; compression keeps the zeros and the empty
//! buckets off the disk. Nothing per key lives in memory.
//!
//! Modules, bottom up: `header` (sector 0: layout and seed), `bucket` (the
//! sector format), `store` (hashing, chains, put/get/delete, crash order), `volume` (the
//! volume a store makes for itself when embedded).

pub mod bucket;
pub mod error;
pub mod header;
pub mod store;
pub mod volume;

pub use error::{KvError, Result};
pub use store::{
    CreateStore, Expect, Store, BUCKETS_PER_KEY_DEFAULT, KEY_MAX, PROBE_MAX_DEFAULT, RECORD_MAX,
};
pub use volume::{create_volume, create_volume_with, VolumeOptions};
