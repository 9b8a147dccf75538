//! Counters every stage updates (DESIGN principle 9). Persistent counters
//! are saved in checkpoints by their index, which is therefore part of the
//! format: new counters are appended, never renumbered.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident = $idx:expr, $doc:literal;)*) => {
        /// Index of a persistent counter.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Counter { $(#[doc = $doc] $name = $idx,)* }
        impl Counter {
            pub const ALL: &'static [Counter] = &[$(Counter::$name,)*];
        }
    };
}

counters! {
    BytesWritten = 0, "Bytes clients asked to write (writes, zeroes and trims excluded).";
    BytesRead = 1, "Bytes clients read.";
    ZeroSectorsWritten = 2, "Sectors written as all zeros (stored as holes).";
    SectorsTrimmed = 3, "Sectors trimmed or zeroed by write-zeroes.";
    BlobsCompressed = 4, "Blobs kept compressed (BlueStore compress_success_count).";
    BlobsRejected = 5, "Blobs compressed but stored raw: above the required ratio (compress_rejected_count).";
    BlobsSkipped = 6, "Blobs the incompressibility heuristic or the mode kept from the codec.";
    CompressNs = 7, "CPU nanoseconds spent compressing.";
    DecompressNs = 8, "CPU nanoseconds spent decompressing.";
    LogBytes = 9, "Bytes appended to the log (records and headers).";
    CheckpointBytes = 10, "Bytes written for checkpoints.";
    Checkpoints = 11, "Checkpoints written.";
    ChecksumErrors = 12, "Reads that failed a checksum.";
    RawIn = 13, "Raw bytes of blobs stored compressed (codec input).";
    StoredOut = 14, "Payload bytes of blobs stored compressed (codec output).";
    SegmentsReclaimed = 15, "Segments freed and punched out of the backing file.";
    CleanerBytesMoved = 16, "Record bytes the cleaner relocated.";
    RecompressedBlobs = 17, "Blobs the cleaner recompressed with the recompress algorithm.";
    CodecBytesNone = 18, "Raw bytes written per codec: none.";
    CodecBytesLz4 = 19, "Raw bytes written per codec: lz4.";
    CodecBytesZstd = 20, "Raw bytes written per codec: zstd.";
    CodecBytesSnappy = 21, "Raw bytes written per codec: snappy.";
    CodecBytesDeflate = 22, "Raw bytes written per codec: deflate.";
    Flushes = 23, "Flushes completed.";
    ClientBytesCompressed = 24, "Stored bytes of client data appended (payload plus header), for write amplification.";
    CleanerNs = 25, "Wall-clock nanoseconds the cleaner spent cleaning victims.";
    MergedSectors = 26, "Sectors the merger rewrote as whole blobs.";
    MergedBytes = 27, "Record bytes the merger appended.";
}

pub const COUNTERS: usize = 28;

#[derive(Default)]
pub struct Counters {
    v: [AtomicU64; COUNTERS],
}

impl Counters {
    pub fn add(&self, c: Counter, n: u64) {
        self.v[c as usize].fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self, c: Counter) -> u64 {
        self.v[c as usize].load(Ordering::Relaxed)
    }
    pub fn snapshot(&self) -> Vec<u64> {
        self.v.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    }
    pub fn load(&self, saved: &[u64]) {
        for (a, v) in self.v.iter().zip(saved) {
            a.store(*v, Ordering::Relaxed);
        }
    }
    pub fn codec_bytes(codec: squeeze_format::CodecId) -> Counter {
        use squeeze_format::CodecId;
        match codec {
            CodecId::None => Counter::CodecBytesNone,
            CodecId::Lz4 => Counter::CodecBytesLz4,
            CodecId::Zstd => Counter::CodecBytesZstd,
            CodecId::Snappy => Counter::CodecBytesSnappy,
            CodecId::Deflate => Counter::CodecBytesDeflate,
        }
    }
}

const _: () = assert!(COUNTERS <= squeeze_format::checkpoint::MAX_COUNTERS);
const _: () = assert!(Counter::ALL.len() == COUNTERS);

/// A point-in-time view for `squeeze stats`, JSON and /metrics.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct VolumeStats {
    pub logical_size: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Non-zero logical data currently mapped.
    pub mapped_bytes: u64,
    pub zero_sectors_written: u64,
    pub sectors_trimmed: u64,
    /// Live records (payload, header and alignment) the map refers to.
    pub stored_bytes: u64,
    /// What the backing file occupies on its device.
    pub physical_bytes: u64,
    /// Segments allocated in the backing file, in bytes.
    pub allocated_bytes: u64,
    /// Room client data can still use under --max-physical (or the
    /// format's limit), net of the segments kept for checkpoints and cleaning.
    pub free_physical_bytes: u64,
    /// The --max-physical cap (0 = none).
    pub physical_limit_bytes: u64,
    /// Set when less than 10% of the physical cap is left (as VDO warns).
    pub space_warning: Option<String>,
    /// mapped_bytes / stored_bytes.
    pub compression_ratio: f64,
    /// Logical bytes over physical bytes on disk.
    pub effective_ratio: f64,
    pub bytes_per_algorithm: std::collections::BTreeMap<String, u64>,
    pub blobs_compressed: u64,
    pub blobs_rejected: u64,
    pub blobs_skipped: u64,
    pub compress_cpu_seconds: f64,
    pub decompress_cpu_seconds: f64,
    pub log_bytes_written: u64,
    pub checkpoint_bytes_written: u64,
    pub checkpoints: u64,
    /// Backing bytes written per stored byte of client data.
    pub write_amplification: f64,
    pub checksum_errors: u64,
    pub segments_total: u64,
    pub segments_free: u64,
    pub segments_reclaimed: u64,
    /// Record bytes the cleaner relocated.
    pub cleaner_bytes_moved: u64,
    /// Seconds the cleaner spent cleaning victims (wall clock).
    pub cleaner_seconds: f64,
    /// Blobs the cleaner recompressed with the recompress algorithm.
    pub recompressed_blobs: u64,
    /// Sectors the merger rewrote: fragmented windows (scattered small
    /// records) written again as whole blobs while clients were idle.
    #[serde(default)]
    pub merged_bytes: u64,
    /// Record bytes those rewrites appended to the log.
    #[serde(default)]
    pub merge_bytes_written: u64,
    /// Dead bytes in sealed log segments (what cleaning can reclaim).
    pub garbage_bytes: u64,
    pub segment_size: u64,
    pub map_memory_bytes: u64,
    pub map_bytes_per_mapped_sector: f64,
    pub read_only_reason: Option<String>,
}
