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
    BelowTargetBytes = 28, "Raw bytes of client blobs written with a faster codec than the policy's (the adaptive codec under load).";
    UpgradedBytes = 29, "Raw bytes the upgrade rewrote with the policy's codec.";
    UpgradeNs = 30, "Wall-clock nanoseconds the upgrade spent.";
    CleanerOverBudgetBytes = 31, "Record bytes the cleaner relocated because dead bytes exceeded the garbage budget.";
    CleanerIdleBytes = 32, "Record bytes the cleaner relocated while clients were idle, under the budget.";
    CleanerSpaceBytes = 33, "Record bytes the cleaner relocated because free segments ran short (a write waiting for room, or fewer than 8 free).";
    PrewrittenBytes = 34, "Zero bytes written past the log head before small flushes (space::prewrite), so commits overwrite written blocks.";
    MapFaults = 35, "Map chunks read back from the checkpoint chain (paged in).";
    MapEvictions = 36, "Map chunks paged out to the checkpoint chain (the map over its cache).";
    DamagedOpens = 37, "Opens that found damage (a superblock slot, flushed records gone, a file cut short) and went on.";
    LostFlushedRecords = 38, "Flushed log records recovery found missing and whose loss was accepted at open (--accept-loss).";
    BurstRawBytes = 39, "Raw bytes of client blobs stored raw by the adaptive codec's raw rung (cores saturated, room to hold them; pipeline::burst).";
    BurstRawUpgradedBytes = 40, "Of those, raw bytes in segments the upgrade rewrote with the policy's codec.";
    SqueezedBytes = 41, "Raw bytes the idle squeeze rewrote with the policy's idle level (space::squeeze).";
    SqueezeNs = 42, "Wall-clock nanoseconds the idle squeeze spent.";
    DedupLinkedSectors = 43, "Client sectors deduplicated: linked to a hidden address (Link records), over the volume's life.";
    DedupSharedWrites = 44, "Sectors written at hidden addresses: the one copy of content that several client sectors share.";
    DedupIdlePasses = 45, "Whole deduplication passes the maintenance thread finished while clients were idle (dedup mode idle).";
    DedupIdleLinkedSectors = 46, "Client sectors the idle passes linked to hidden addresses (part of dedup_linked_sectors).";
    DedupIdleCursor = 47, "The LBA an unfinished idle dedup pass resumes at; 0 when none is under way (state, kept by checkpoints).";
    DedupIdleMark = 48, "BytesWritten when the last idle dedup pass began: the next begins once clients wrote enough since (state, kept by checkpoints).";
    DedupInlineLinkedSectors = 49, "Written client sectors linked to hidden addresses as they were written (dedup mode inline; part of dedup_linked_sectors, which also counts the source runs promotions link).";
    DedupInlineMismatchedSectors = 50, "Written sectors the inline index named a source for whose bytes differed (a collision, or the source rewritten since): stored as usual. Since the sampled index (session 26), the hooks whose own sector differed.";
}

pub const COUNTERS: usize = 51;

pub struct Counters {
    v: [AtomicU64; COUNTERS],
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            v: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Counters {
    pub fn add(&self, c: Counter, n: u64) {
        self.v[c as usize].fetch_add(n, Ordering::Relaxed);
    }
    /// For the counters that hold state (`DedupIdleCursor`,
    /// `DedupIdleMark`).
    pub fn set(&self, c: Counter, v: u64) {
        self.v[c as usize].store(v, Ordering::Relaxed);
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
