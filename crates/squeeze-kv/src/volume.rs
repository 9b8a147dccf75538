//! The volume a store makes for itself when it is embedded (`squeeze kv
//! bench`, squeeze-ycsb): thin, the default policy, the maintenance thread
//! running, and sized for memory rather than for bursts.
//!
//! Compression is deferred (`OpenOptions::adapt_defer`): the store's
//! operations wait on their own bucket writes, so buckets go out as lz4
//! and the idle upgrade (or `compact`) rewrites them with the target,
//! zstd:3, once the store's clients pause.
//!
//! A store writes one 4 KiB bucket at a time, so the backing file's
//! write-behind pool needs a few chunks, not the 32 MiB a server keeps to
//! let NBD bursts run ahead of the device; small segments keep what the
//! cleaner and the idle upgrade find to move in one victim small. With
//! both, what the process holds is the sector map (8 bytes per mapped
//! bucket) plus a few MiB (docs/KV.md, "Memory").

use crate::Result;
use squeeze_engine::{CreateOptions, FileOptions, FileStorage, OpenOptions, Volume, SECTOR_SIZE};
use std::path::Path;
use std::sync::Arc;

/// Segment size of a store's own volume.
pub const SEGMENT_SIZE: u64 = 4 << 20;
/// Write-behind chunks (1 MiB each) of a store's own volume.
pub const WRITE_BEHIND_CHUNKS: usize = 2;

fn file_options() -> FileOptions {
    FileOptions {
        write_behind_chunks: WRITE_BEHIND_CHUNKS,
        ..FileOptions::from_env()
    }
}

/// Creates the volume file `path` (which must not exist) with room for
/// `buckets` buckets after the store's header sector.
pub fn create_volume(path: &Path, buckets: u64) -> Result<Arc<Volume>> {
    let mut o = CreateOptions::new((buckets + 1) * SECTOR_SIZE as u64);
    o.segment_size = SEGMENT_SIZE;
    let storage = FileStorage::create_opts(path, file_options())
        .map_err(squeeze_engine::EngineError::from)?;
    Ok(Arc::new(Volume::create_with(
        Arc::new(storage),
        &o,
        OpenOptions {
            background: true,
            // Buckets as lz4 now, zstd:3 when the clients pause.
            adapt_defer: true,
            ..Default::default()
        },
    )?))
}
