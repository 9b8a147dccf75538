//! Chunked payloads (format 5): a record of more than `chunk_sectors`
//! sectors whose payload is independent pieces of `chunk_sectors` sectors
//! each (the last may be shorter), behind a table, so that a read of a few
//! sectors checks and decodes only the chunks that hold them instead of the
//! whole record (BlueStore keeps a checksum per 4 KiB of a blob for the same
//! reason).
//!
//! ```text
//! payload  table | chunk 0 | chunk 1 | ... | chunk n-1
//! table    n entries of 8 bytes, n = ceil(sectors / chunk_sectors):
//!            0  stored_len  u32  bytes of the chunk in the payload (>= 1)
//!            4  crc         u32  CRC-32C of those bytes
//! ```
//!
//! A chunk whose stored length equals its raw length is stored raw; any
//! shorter one is one frame of the record's codec (the writer compresses a
//! chunk with a limit of one byte under its raw length, so a frame is never
//! that long). The record header's `payload_crc` is the CRC-32C of the
//! table, which holds every chunk's: the table is checked once, then only
//! the chunks a read needs. The chunk size is in the record header
//! (`record.rs`); the volume's policy chooses it (`Policy::read_chunk`).

use crate::le::{get_u32, put_u32};
use crate::{checksum, FormatError, SECTOR_SIZE};
use std::ops::Range;

/// Bytes of one table entry.
pub const CHUNK_ENTRY_BYTES: usize = 8;
/// Chunk sizes a record may use, in sectors: powers of two up to this.
pub const MAX_CHUNK_SECTORS: u32 = 16;

/// Whether `chunk_sectors` is a chunk size a record may carry (0 is "one
/// frame", not chunked).
pub fn valid_chunk_sectors(chunk_sectors: u32) -> bool {
    chunk_sectors.is_power_of_two() && chunk_sectors <= MAX_CHUNK_SECTORS
}

/// Number of chunks of a record of `sectors` sectors.
pub fn chunk_count(sectors: u32, chunk_sectors: u32) -> usize {
    sectors.div_ceil(chunk_sectors) as usize
}

/// Bytes of the table of a record of `sectors` sectors.
pub fn table_len(sectors: u32, chunk_sectors: u32) -> usize {
    chunk_count(sectors, chunk_sectors) * CHUNK_ENTRY_BYTES
}

/// One chunk of a chunked payload, located.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Its bytes in the payload (after the table).
    pub stored: Range<usize>,
    /// The record's sectors it holds (indices from the record's first).
    pub sectors: Range<u32>,
    /// CRC-32C of its stored bytes.
    pub crc: u32,
}

impl Chunk {
    /// Raw bytes it decodes to.
    pub fn raw_len(&self) -> usize {
        (self.sectors.end - self.sectors.start) as usize * SECTOR_SIZE
    }

    /// Stored raw (not a codec frame).
    pub fn is_raw(&self) -> bool {
        self.stored.len() == self.raw_len()
    }

    /// Checks its bytes against the table's CRC.
    pub fn verify(&self, bytes: &[u8]) -> Result<(), FormatError> {
        let got = checksum::crc32c(bytes);
        if got != self.crc {
            return Err(FormatError::ChecksumMismatch {
                what: "payload chunk",
                expected: self.crc,
                got,
            });
        }
        Ok(())
    }
}

/// A decoded and checked chunk table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkTable {
    chunks: Vec<Chunk>,
}

impl ChunkTable {
    /// Decodes the table at the start of `payload` (at least the table's
    /// bytes; more may follow) of a record of `sectors` sectors in chunks of
    /// `chunk_sectors`, whose payload is `stored_len` bytes: the table's CRC
    /// must be `table_crc` (the header's payload CRC) and its lengths must
    /// add up to the payload, each chunk at least one byte and at most its
    /// raw length.
    pub fn decode(
        payload: &[u8],
        sectors: u32,
        chunk_sectors: u32,
        stored_len: u32,
        table_crc: u32,
    ) -> Result<ChunkTable, FormatError> {
        let bad = |why: String| {
            Err(FormatError::Invalid {
                what: "chunk table",
                why,
            })
        };
        if !valid_chunk_sectors(chunk_sectors) || chunk_sectors >= sectors {
            return bad(format!("chunks of {chunk_sectors} sectors in {sectors}"));
        }
        let tlen = table_len(sectors, chunk_sectors);
        if payload.len() < tlen {
            return Err(FormatError::Truncated {
                what: "chunk table",
                need: tlen,
                have: payload.len(),
            });
        }
        let table = &payload[..tlen];
        let got = checksum::crc32c(table);
        if got != table_crc {
            return Err(FormatError::ChecksumMismatch {
                what: "chunk table",
                expected: table_crc,
                got,
            });
        }
        let mut at = tlen;
        let mut chunks = Vec::with_capacity(tlen / CHUNK_ENTRY_BYTES);
        for (i, e) in table.chunks_exact(CHUNK_ENTRY_BYTES).enumerate() {
            let first = i as u32 * chunk_sectors;
            let end = (first + chunk_sectors).min(sectors);
            let len = get_u32(e, 0) as usize;
            let raw = (end - first) as usize * SECTOR_SIZE;
            if len == 0 || len > raw {
                return bad(format!("chunk {i} of {len} bytes for {raw} raw"));
            }
            chunks.push(Chunk {
                stored: at..at + len,
                sectors: first..end,
                crc: get_u32(e, 4),
            });
            at += len;
        }
        if at != stored_len as usize {
            return bad(format!(
                "table and chunks add up to {at} bytes, the payload is {stored_len}"
            ));
        }
        Ok(ChunkTable { chunks })
    }

    /// Every chunk, in order.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// The chunks that hold the record's sectors `sectors`.
    pub fn covering(&self, sectors: Range<u32>) -> &[Chunk] {
        let first = self
            .chunks
            .partition_point(|c| c.sectors.end <= sectors.start);
        let end = self
            .chunks
            .partition_point(|c| c.sectors.start < sectors.end);
        &self.chunks[first..end.max(first)]
    }
}

/// Builds a table: `entries` are each chunk's (stored length, CRC-32C) in
/// order. Returns the table's bytes (the payload's start) and their CRC-32C
/// (the header's payload CRC).
pub fn encode_table(entries: &[(u32, u32)]) -> (Vec<u8>, u32) {
    let mut t = vec![0u8; entries.len() * CHUNK_ENTRY_BYTES];
    for (e, &(len, crc)) in t.chunks_exact_mut(CHUNK_ENTRY_BYTES).zip(entries) {
        put_u32(e, 0, len);
        put_u32(e, 4, crc);
    }
    let crc = checksum::crc32c(&t);
    (t, crc)
}

/// The table of `raw` (whole sectors) stored raw in chunks of
/// `chunk_sectors`, and its CRC.
pub fn raw_table(raw: &[u8], chunk_sectors: u32) -> (Vec<u8>, u32) {
    let entries: Vec<(u32, u32)> = raw
        .chunks(chunk_sectors as usize * SECTOR_SIZE)
        .map(|c| (c.len() as u32, checksum::crc32c(c)))
        .collect();
    encode_table(&entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(chunks: &[Vec<u8>]) -> (Vec<u8>, u32) {
        let entries: Vec<(u32, u32)> = chunks
            .iter()
            .map(|c| (c.len() as u32, checksum::crc32c(c)))
            .collect();
        let (mut p, crc) = encode_table(&entries);
        for c in chunks {
            p.extend_from_slice(c);
        }
        (p, crc)
    }

    #[test]
    fn a_table_locates_and_checks_its_chunks() {
        // 10 sectors in chunks of 4: 4 + 4 + 2 sectors; the second raw.
        let chunks = vec![vec![1u8; 100], vec![2u8; 4 * SECTOR_SIZE], vec![3u8; 7]];
        let (p, crc) = payload(&chunks);
        let t = ChunkTable::decode(&p, 10, 4, p.len() as u32, crc).unwrap();
        assert_eq!(t.chunks().len(), 3);
        let c = &t.chunks()[1];
        assert_eq!((c.sectors.clone(), c.is_raw()), (4..8, true));
        assert_eq!(&p[c.stored.clone()], &chunks[1][..]);
        c.verify(&p[c.stored.clone()]).unwrap();
        assert!(t.chunks()[0].verify(&p[c.stored.clone()]).is_err());
        assert_eq!(t.chunks()[2].sectors, 8..10);
        assert!(!t.chunks()[2].is_raw());
        let at = |r: Range<u32>| {
            t.covering(r)
                .iter()
                .map(|c| c.sectors.start)
                .collect::<Vec<_>>()
        };
        assert_eq!(at(0..1), vec![0]);
        assert_eq!(at(3..5), vec![0, 4]);
        assert_eq!(at(8..10), vec![8]);
        assert_eq!(at(0..10), vec![0, 4, 8]);
        // Only the table is needed to decode the table.
        let tl = table_len(10, 4);
        assert_eq!(
            ChunkTable::decode(&p[..tl], 10, 4, p.len() as u32, crc).unwrap(),
            t
        );
    }

    #[test]
    fn a_bad_table_is_refused() {
        let chunks = vec![vec![1u8; 100], vec![2u8; 50]];
        let (p, crc) = payload(&chunks);
        let n = p.len() as u32;
        let dec = |p: &[u8], sectors, cs, n, crc| ChunkTable::decode(p, sectors, cs, n, crc);
        assert!(dec(&p, 8, 4, n, crc).is_ok());
        // Its CRC, its length, the payload's length, the chunk size.
        assert!(matches!(
            dec(&p, 8, 4, n, crc ^ 1),
            Err(FormatError::ChecksumMismatch { .. })
        ));
        assert!(matches!(
            dec(&p[..15], 8, 4, n, crc),
            Err(FormatError::Truncated { .. })
        ));
        assert!(dec(&p, 8, 4, n + 1, crc).is_err());
        assert!(dec(&p, 8, 3, n, crc).is_err());
        assert!(dec(&p, 4, 4, n, crc).is_err());
        assert!(dec(&p, 8, 32, n, crc).is_err());
        // A chunk of no bytes, or longer than its raw size, with a valid CRC.
        for len in [0u32, 4 * SECTOR_SIZE as u32 + 1] {
            let (mut q, qcrc) = encode_table(&[(len, 0), (50, 0)]);
            q.resize(16 + len as usize + 50, 0);
            assert!(dec(&q, 8, 4, q.len() as u32, qcrc).is_err(), "{len}");
        }
    }

    #[test]
    fn a_raw_table_covers_every_sector() {
        let raw: Vec<u8> = (0..9 * SECTOR_SIZE).map(|i| (i / 97) as u8).collect();
        let (t, crc) = raw_table(&raw, 4);
        let mut p = t.clone();
        p.extend_from_slice(&raw);
        let table = ChunkTable::decode(&p, 9, 4, p.len() as u32, crc).unwrap();
        for c in table.chunks() {
            assert!(c.is_raw());
            c.verify(&p[c.stored.clone()]).unwrap();
        }
        assert_eq!(table.chunks().len(), 3);
    }
}
