//! Fixed sizes and the placement of every structure in the backing file.
//!
//! ```text
//! offset 0        superblock slot 0 (4 KiB)
//! offset 4 KiB    superblock slot 1 (4 KiB)
//! offset 8 KiB    flush mark slots 0..16 (4 KiB each)
//! offset 72 KiB   unused, zero (reserved up to DATA_START)
//! DATA_START      segment 0 | segment 1 | ... | segment N-1
//!                 (each segment_size bytes; a segment holds either log
//!                  records or a piece of a checkpoint, never both)
//! ```
//!
//! Log records inside a segment start at multiples of [`RECORD_ALIGN`]; this
//! fine alignment is what makes a 4 KiB sector that compresses to 1.1 KiB
//! cost about 1.1 KiB (DESIGN principle 3).

/// Bytes in one logical sector: the unit of the LBA space and of the map.
pub const SECTOR_SIZE: usize = 4096;
/// Size of one superblock slot.
pub const SUPERBLOCK_SIZE: usize = 4096;
/// Number of superblock slots (written alternately, by generation parity).
pub const SUPERBLOCK_SLOTS: u64 = 2;
/// Where the flush marks start (`flush_mark.rs`): right after the
/// superblock slots.
pub const FLUSH_MARK_START: u64 = SUPERBLOCK_SIZE as u64 * SUPERBLOCK_SLOTS;
/// Size of one flush mark slot (a page of its own, so that a torn write of
/// one slot never touches the other or a superblock).
pub const FLUSH_MARK_SLOT_SIZE: usize = 4096;
/// Number of flush mark slots (written in turn: a page is rewritten only
/// every 16 flushes, when its writeback has long finished, so a mark never
/// waits for the page's previous write to reach the device).
pub const FLUSH_MARK_SLOTS: u64 = 16;
/// Where segment 0 starts.
pub const DATA_START: u64 = 1 << 20;
/// Alignment of log records inside a segment, in bytes.
pub const RECORD_ALIGN: u64 = 16;
/// Size of a full log record header (every kind; the only form before
/// format 4).
pub const RECORD_HEADER_SIZE: usize = 64;
/// Size of a short record header (format 4: extents and relocations).
pub const SHORT_HEADER_SIZE: usize = 32;
/// Sectors a short header can address (its LBA is 40 bits).
pub const SHORT_MAX_SECTORS: u64 = 1 << 40;

/// Hidden addresses (deduplication, docs/DEDUP.md): logical sectors from
/// here up hold content shared by several client sectors, which map to
/// them through indirect entries. No client reaches them: a volume is at
/// most 2^51 sectors (the engine's MAX_LOGICAL_SIZE).
pub const SHARED_BASE: u64 = 1 << 52;
/// How many hidden addresses an indirect map entry can name.
pub const SHARED_SECTORS: u64 = (1 << 50) - 1;
/// The most sectors one extent record may hold (128 KiB, BlueStore's default
/// compression_max_blob_size).
pub const MAX_BLOB_SECTORS: u32 = 32;
/// Largest chunk table (format 5, `chunks.rs`): a record of
/// MAX_BLOB_SECTORS in chunks of one sector.
pub const MAX_CHUNK_TABLE_BYTES: u64 = MAX_BLOB_SECTORS as u64 * 8;
/// Largest record: header plus an uncompressed blob of MAX_BLOB_SECTORS
/// behind the largest chunk table.
pub const MAX_RECORD_BYTES: u64 = RECORD_HEADER_SIZE as u64
    + MAX_CHUNK_TABLE_BYTES
    + MAX_BLOB_SECTORS as u64 * SECTOR_SIZE as u64;
/// Smallest and largest allowed segment sizes.
pub const SEGMENT_SIZE_MIN: u64 = 512 << 10;
pub const SEGMENT_SIZE_MAX: u64 = 1 << 30;
/// Highest byte offset a map entry can address (40 bits of 16-byte units).
pub const MAX_BACKING_BYTES: u64 = (1u64 << 40) * RECORD_ALIGN;

const _: () =
    assert!(DATA_START >= FLUSH_MARK_START + FLUSH_MARK_SLOT_SIZE as u64 * FLUSH_MARK_SLOTS);
const _: () = assert!(DATA_START.is_multiple_of(RECORD_ALIGN));
const _: () = assert!((RECORD_HEADER_SIZE as u64).is_multiple_of(RECORD_ALIGN));
const _: () = assert!((SHORT_HEADER_SIZE as u64).is_multiple_of(RECORD_ALIGN));
const _: () = assert!(SEGMENT_SIZE_MIN >= 2 * MAX_RECORD_BYTES);
// A map entry stores the record length in 14 bits of 16-byte units.
const _: () = assert!(MAX_RECORD_BYTES.div_ceil(RECORD_ALIGN) < (1 << 14));

/// Rounds `n` up to the record alignment.
pub const fn align_record(n: u64) -> u64 {
    n.div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

/// Bytes a record with a full header and `payload_len` bytes of payload
/// occupies in the log: its header, the payload and the padding to the
/// next record (the most any record with that payload occupies).
pub const fn record_bytes(payload_len: u64) -> u64 {
    align_record(RECORD_HEADER_SIZE as u64 + payload_len)
}

/// Byte offset of `segment` in the backing file (segments of
/// `segment_size` bytes from DATA_START): the one place this is computed.
pub const fn segment_offset(segment_size: u64, segment: u32) -> u64 {
    DATA_START + segment as u64 * segment_size
}
