//! The volume a store makes for itself when it is embedded (`squeeze kv
//! bench`, squeeze-ycsb): thin, the default policy, the maintenance thread
//! running, and sized for memory rather than for bursts.
//!
//! Compression is deferred (`OpenOptions::adapt_defer`): the store's
//! operations wait on their own bucket writes, so buckets go out as lz4
//! and the idle upgrade (or `compact`) rewrites them with the target,
//! zstd:3, once the store's clients pause.
//!
//! A store writes one 4 KiB bucket at a time and reads back what it just
//! wrote, so its log goes through the page cache (`io_mode`) rather than
//! a server's O_DIRECT write-behind pool of 32 MiB (with
//! `SQUEEZE_IO=direct`, a pool of 1 MiB); small segments keep what the
//! cleaner and the idle upgrade find to move in one victim small. With
//! both, what the process holds is the sector map (5 bytes per mapped
//! bucket since session 27, bounded by `VolumeOptions::map_cache`; each
//! chunk dense from its first bucket since session 30, as every bucket
//! gets mapped) plus a few MiB (docs/KV.md, "Memory").

use crate::Result;
use squeeze_engine::{
    CreateOptions, FileOptions, FileStorage, IoMode, OpenOptions, Volume, SECTOR_SIZE,
};
use std::path::Path;
use std::sync::Arc;

/// Segment size of a store's own volume.
pub const SEGMENT_SIZE: u64 = 4 << 20;
/// Write-behind chunks of a store's own volume, and their size, when it
/// writes with O_DIRECT (`SQUEEZE_IO=direct`): 1 MiB in all, where a
/// server's pool holds 32 chunks of 1 MiB.
pub const WRITE_BEHIND_CHUNKS: usize = 4;
pub const WRITE_BEHIND_CHUNK: usize = 256 << 10;

/// Through the page cache unless `SQUEEZE_IO` asks otherwise. A server's
/// volume writes its log with O_DIRECT, so a record leaves memory once its
/// chunk of the write-behind pool is written; for a store that reads back
/// what it just wrote (YCSB's zipfian updates, then reads of the same hot
/// keys) each such read then waits on the device. An off-CPU profile of
/// YCSB A (docs/KV.md, "Memory") put 930 ms of the two client threads'
/// 2.5 s off the CPU in such preads (268 waits of 0.5 ms or more, 3.5 ms
/// on average); through the page cache they were gone and read p99 fell
/// from 231-324 us to 17-19. The page cache is the kernel's memory, not
/// the process's, and the pool's buffers go too.
fn io_mode() -> IoMode {
    match std::env::var_os("SQUEEZE_IO") {
        Some(_) => IoMode::from_env(),
        None => IoMode::Buffered,
    }
}

fn file_options() -> FileOptions {
    FileOptions {
        mode: io_mode(),
        write_behind_chunks: WRITE_BEHIND_CHUNKS,
        write_behind_chunk: WRITE_BEHIND_CHUNK,
    }
}

/// Bytes of RAM a store's own volume lets its sector map use by default
/// (`OpenOptions::map_cache`; a server's default is 128 MiB): the map of
/// about 4 M buckets (16 M records at a quarter bucket each), so that the
/// bound holds a large store without pressing a smaller one. Pressing is
/// dear for this store: its puts are spread over every chunk of the map,
/// and each operation on a paged-out chunk reads it back under the state
/// lock.
/// At 5 M records a 2 MiB cache took the load from 62 k to 28 k puts/s
/// and YCSB A from 66 k to 17 k ops/s, and peak RSS did not fall (20 MiB
/// after the load, 27 by the end of the run, against 22 and 23; one run
/// each on a busy machine: docs/KV.md, "Memory"). Since changed chunks
/// page out with an overlay of their changed entries (session 25) a small
/// cache does bound it (13.8 MiB peak with 3 MiB, about 1/8 of
/// RocksDB's), but then nearly every operation reads a chunk back (5.06 M
/// faults over the 5 M-record load, 1.03 M over 1 M operations of A): A
/// fell to 8 k ops/s on a busy machine. Until a fault costs far less, the
/// default keeps the benchmark's map resident: 6.7 MiB since its dense
/// chunks hold 5 bytes an entry (session 27; 10.4 before).
pub const MAP_CACHE_DEFAULT: u64 = 32 << 20;

/// How a store's own volume is made, beside its bucket count.
#[derive(Clone, Copy, Debug)]
pub struct VolumeOptions {
    /// Bytes of RAM the sector map may use (`OpenOptions::map_cache`).
    pub map_cache: u64,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions {
            map_cache: MAP_CACHE_DEFAULT,
        }
    }
}

/// Creates the volume file `path` (which must not exist) with room for
/// `buckets` buckets after the store's header sector.
pub fn create_volume(path: &Path, buckets: u64) -> Result<Arc<Volume>> {
    create_volume_with(path, buckets, VolumeOptions::default())
}

/// `create_volume` with options.
pub fn create_volume_with(path: &Path, buckets: u64, v: VolumeOptions) -> Result<Arc<Volume>> {
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
            map_cache: Some(v.map_cache),
            // Every bucket gets mapped, one sector each: dense chunks from
            // the first, never a run list built only to be dropped.
            map_runs_max: Some(0),
            ..Default::default()
        },
    )?))
}
