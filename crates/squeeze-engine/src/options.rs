//! How a volume is made and opened: `CreateOptions` (size, segments, cap,
//! policy, with the measured default policy) and `OpenOptions` (read-only,
//! the compression engine, background threads, the adaptive codec, the
//! map's cache, accepting loss), apart from the lifecycle in `volume`.

use squeeze_codec::CompressEngine;
use squeeze_format::{CodecId, CompressionMode, DedupSettings, Policy};
use std::sync::Arc;

/// Parameters of a new volume.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub logical_size: u64,
    pub segment_size: u64,
    /// Cap on the backing store's allocated bytes (0 = none).
    pub max_physical: u64,
    pub policy: Policy,
    /// Deduplication's mode and index budget (docs/DEDUP.md; off by
    /// default).
    pub dedup: DedupSettings,
}

impl CreateOptions {
    pub fn new(logical_size: u64) -> CreateOptions {
        CreateOptions {
            logical_size,
            segment_size: 32 << 20,
            max_physical: 0,
            policy: default_policy(),
            dedup: DedupSettings::default(),
        }
    }
}

/// The default policy: zstd level 3 (zstd's, qemu's and Ceph's default
/// level), aggressive, BlueStore's 0.875 required ratio, blobs of 4 to 128
/// KiB. Measured here over NBD in one harness run (docs/benchmarks-history.md): on
/// the benchmark tar of real files it stores 2.70:1 where qemu's compressed
/// qcow2 (zstd, 64 KiB clusters) stores 2.67:1 and zstd:1 with 64 KiB blobs
/// 2.57:1; on fio's data zstd:3 costs zstd:1's time (both ~850 MB/s per
/// core), on real files a third more CPU; 128 KiB blobs cost 4 KiB random
/// reads a quarter of their IOPS (66.5k -> 49.3k, raw qemu-nbd ~45k).
/// Data written is squeezed to zstd:9 when clients are idle
/// ([`DEFAULT_IDLE_LEVEL`]).
pub fn default_policy() -> Policy {
    Policy {
        codec: CodecId::Zstd,
        level: 3,
        mode: CompressionMode::Aggressive,
        required_ratio_ppm: 875_000,
        min_blob: 4096,
        max_blob: 128 << 10,
        recompress_codec: CodecId::Zstd,
        recompress_level: DEFAULT_IDLE_LEVEL,
        read_chunk: DEFAULT_READ_CHUNK,
    }
}

/// The default `Policy::read_chunk`: blobs of more than 32 KiB are stored
/// as independent 32 KiB chunks, so a 4 KiB read decodes 32 KiB, not the
/// blob. Measured with `cargo run --release -p squeeze-codec --example
/// chunk_ratio` (docs/benchmarks.md, "Engine: 4 KiB random reads"): on
/// fio's data (60% compressible) zstd:3 stores 0.22% more bytes than one
/// frame per 128 KiB blob, and a 4 KiB read's CRC and decode cost a third;
/// on the W3 tar of real files 2.85% more bytes, and a quarter.
pub const DEFAULT_READ_CHUNK: u32 = 32 << 10;

/// The default idle level (`Policy::recompress_level` with the target's
/// codec: `space::squeeze`): what clients wrote at zstd:3 is rewritten at
/// zstd:9 while they are idle. Measured on the W3 tar of real files
/// (docs/benchmarks.md, "W3 after idle"): 32 KiB chunks store 0.967x what
/// zstd:3 alone stores in one frame a 128 KiB blob, and 1.006x once
/// squeezed at zstd:9, whose 4 KiB reads cost no more CPU (zstd decodes
/// level 9 as fast as 3); level 9 compresses about a fifth as fast as 3
/// (`examples/chunk_ratio`), the idle CPU it costs.
pub const DEFAULT_IDLE_LEVEL: i32 = 9;

/// How to open a volume.
#[derive(Clone, Default)]
pub struct OpenOptions {
    /// Open without writing anything (recovery happens in memory only).
    pub read_only: bool,
    /// Compression engine; default a CPU pool with one thread per core
    /// (`squeeze_codec::isal::default_engine`: ISA-L runs deflate:1..=3
    /// when present).
    pub engine: Option<Arc<dyn CompressEngine>>,
    /// Run the background maintenance thread (periodic checkpoints).
    pub background: bool,
    /// Open a volume that lost flushed data (`EngineError::Damaged`:
    /// records a flush mark covers are missing, or the file was cut
    /// short), keeping what survives: its lost sectors read back as they
    /// were before the lost records (or as a later record wrote them).
    /// Opened writable, the loss becomes permanent with the checkpoint
    /// recovery writes, and `Counter::LostFlushedRecords` counts it.
    pub accept_loss: bool,
    /// With `background`: do not merge fragmented windows while clients
    /// are idle (the cleaner still runs; [`Volume::merge`] still works).
    pub no_idle_merge: bool,
    /// Before a client flush that follows less than 64 KiB of log, write
    /// zeros over the next 512 KiB past the log head, once
    /// ([`crate::space::prewrite`]): commits then overwrite written blocks
    /// instead of converting the file system's unwritten extents at every
    /// fdatasync (fsync latency 269 -> 186 us here), at the price of
    /// writing the log bytes of such a workload twice. Off by default: on
    /// fsx + fsstress under ext4 it added 18% device writes.
    pub prewrite: bool,
    /// Always compress client writes with the policy's algorithm, even when
    /// the compression engine falls behind. By default (false) a write
    /// batch may take a faster rung of the ladder under it
    /// (`pipeline::adapt`), which the maintenance thread upgrades while
    /// clients are idle: clients do not wait on compression they could
    /// skip, and the volume converges to the target's ratio.
    pub no_adapt: bool,
    /// Dedup mode inline's index keeps 1 fingerprint in this many (a power
    /// of two, 1 to 32; 1 is a dense index): hooks, whose matches the
    /// write path extends to the sectors around them by comparing bytes
    /// (`dedup::inline`). None: `dedup::inline_state::INLINE_SAMPLE_DEFAULT`
    /// (8). RAM only, not stored in the volume; changing it needs a
    /// reopen.
    pub dedup_inline_sample: Option<u64>,
    /// The adaptive codec's control law; None: `pipeline::law::LAW_DEFAULT`.
    pub adapt_law: Option<crate::pipeline::law::Law>,
    /// Also step down the ladder while the machine's cores are busy
    /// (`pipeline::headroom`: `squeeze serve` passes /proc/stat's reader),
    /// under `pipeline::law::HEADROOM_LAW`. None: the engine's backlog
    /// alone decides, as for an embedded volume by default.
    pub adapt_cpu: Option<Arc<dyn crate::pipeline::headroom::BusySource>>,
    /// Deferred compression (`pipeline::adapt::AdaptConfig::defer`): client
    /// writes always take the ladder's fastest rung (lz4 under a zstd
    /// target), counted below target; the maintenance thread's idle upgrade
    /// and [`Volume::compact`] rewrite them with the target. For a store
    /// whose clients run in its own process (squeeze-kv's own volume);
    /// ignored with `no_adapt`.
    pub adapt_defer: bool,
    /// The adaptive codec's lowest rung while the cores are saturated
    /// (`pipeline::burst`): raw (the default: bursts stored raw while the
    /// volume has room for them, compressed by the idle upgrade) or lz4
    /// (the ratio kept during bursts). Changed on an open volume with
    /// [`Volume::set_burst_floor`]; not stored in the volume.
    pub burst_floor: crate::pipeline::burst::BurstFloor,
    /// When the cleaner works; None: the default garbage budget
    /// (`space::gc_policy::GcPolicy`).
    pub gc: Option<crate::space::gc_policy::GcPolicy>,
    /// Bytes of RAM the sector map may use before chunks that did not
    /// change since the last checkpoint page out to the checkpoint chain
    /// (`meta::pager`); None: [`MAP_CACHE_DEFAULT`]. The map pages out as
    /// it loads at open too. Chunks changed since the last checkpoint stay
    /// in memory whatever the cache; the maintenance thread writes a
    /// checkpoint early when they hold the map over its cache. Any size is
    /// taken (0 pages out every chunk that can go: tests); the command line
    /// asks for at least [`MAP_CACHE_MIN`].
    pub map_cache: Option<u64>,
    /// Runs a chunk of the sector map (2 MiB of logical space) keeps as a
    /// run list before it turns dense; None: 128, the most that costs
    /// less than a dense chunk. A volume that scattered writes will map
    /// whole (squeeze-kv's bucket table) gains nothing from run lists it
    /// soon replaces, and building and dropping them fragments the heap:
    /// 0 makes a chunk dense from its first entry (session 30: peak RSS of
    /// the 5 M-record YCSB store 0.6-0.9 MiB lower, docs/KV.md "Memory").
    /// A sparsely written volume pays for a low bound: up to 2560 or 4096
    /// bytes a chunk where its runs cost 16 bytes each. Not stored in the
    /// volume.
    pub map_runs_max: Option<usize>,
}

/// The map cache `open` asks for.
pub(crate) fn map_cache_of(open: &OpenOptions) -> u64 {
    open.map_cache.unwrap_or(MAP_CACHE_DEFAULT)
}

/// The map's cache by default: 128 MiB holds the map of about 16 TiB
/// written in 64 KiB blobs, or of 16 GiB of scattered 4 KiB writes.
pub const MAP_CACHE_DEFAULT: u64 = 128 << 20;
/// The smallest map cache `squeeze serve --map-cache` takes (below it,
/// most lookups would read the map back).
pub const MAP_CACHE_MIN: u64 = 64 << 10;
