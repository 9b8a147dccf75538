//! The checkpoint stream of format version 1: one whole snapshot of the
//! sector map (dense chunks), the log position to replay from, and the
//! persistent counters. Format 2 replaced it with a chain of run-encoded
//! pieces (`checkpoint/`); this reader stays so that a version 1 volume
//! opens (and is upgraded by its first checkpoint), and the writer so that
//! tests and the fuzz corpus can build version 1 streams.
//!
//! ```text
//! byte  0  magic         [8]  "SQZCKPT\0"
//!       8  version       u32  1
//!      12  reserved      u32  0
//!      16  uuid          [16]
//!      32  generation    u64  superblock generation that points here
//!      40  next_seq      u64  replay expects this sequence number next
//!      48  head_offset   u64  byte offset of the next record in the log
//!      56  chunk_count   u64  map chunks that follow
//!      64  counter_count u32  u64 counters that follow the header
//!      68  chunk_entries u32  CHUNK_ENTRIES
//!      72  reserved      [56] zero
//!     128  counters      u64 x counter_count
//!      ..  chunks        chunk_count x (chunk index u64, CHUNK_ENTRIES x MapEntry u64)
//! ```
//! Chunk `i` covers logical sectors `i*CHUNK_ENTRIES .. (i+1)*CHUNK_ENTRIES`;
//! chunks with no mapped sector are omitted, chunk indices strictly increase.

use crate::le::{get_u32, get_u64, put_u32, put_u64};
use crate::{FormatError, MapEntry};

pub use crate::checkpoint::{CHECKPOINT_MAGIC, CHUNK_ENTRIES, MAX_COUNTERS};
/// The format version whose checkpoint stream this is.
pub const VERSION: u32 = 1;
pub const CHECKPOINT_HEADER_SIZE: usize = 128;
/// Bytes one chunk takes in the stream.
pub const CHUNK_BYTES: usize = 8 + 8 * CHUNK_ENTRIES;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointHeader {
    pub uuid: [u8; 16],
    pub generation: u64,
    pub next_seq: u64,
    pub head_offset: u64,
}

/// Builds a checkpoint stream.
pub struct CheckpointWriter {
    buf: Vec<u8>,
    chunks: u64,
    last_index: Option<u64>,
}

impl CheckpointWriter {
    pub fn new(h: &CheckpointHeader, counters: &[u64], chunk_hint: usize) -> Self {
        assert!(counters.len() <= MAX_COUNTERS);
        let mut buf = Vec::with_capacity(
            CHECKPOINT_HEADER_SIZE + 8 * counters.len() + chunk_hint * CHUNK_BYTES,
        );
        buf.resize(CHECKPOINT_HEADER_SIZE, 0);
        buf[0..8].copy_from_slice(&CHECKPOINT_MAGIC);
        put_u32(&mut buf, 8, VERSION);
        buf[16..32].copy_from_slice(&h.uuid);
        put_u64(&mut buf, 32, h.generation);
        put_u64(&mut buf, 40, h.next_seq);
        put_u64(&mut buf, 48, h.head_offset);
        put_u32(&mut buf, 64, counters.len() as u32);
        put_u32(&mut buf, 68, CHUNK_ENTRIES as u32);
        for c in counters {
            buf.extend_from_slice(&c.to_le_bytes());
        }
        CheckpointWriter {
            buf,
            chunks: 0,
            last_index: None,
        }
    }

    /// Appends one chunk; indices must strictly increase.
    pub fn push_chunk(&mut self, index: u64, entries: &[MapEntry; CHUNK_ENTRIES]) {
        assert!(self.last_index.is_none_or(|l| l < index));
        self.last_index = Some(index);
        self.buf.extend_from_slice(&index.to_le_bytes());
        for e in entries {
            self.buf.extend_from_slice(&e.0.to_le_bytes());
        }
        self.chunks += 1;
    }

    pub fn finish(mut self) -> Vec<u8> {
        put_u64(&mut self.buf, 56, self.chunks);
        self.buf
    }
}

/// A decoded checkpoint: header, counters and a view of the chunks.
pub struct CheckpointReader<'a> {
    pub header: CheckpointHeader,
    pub counters: Vec<u64>,
    chunks: &'a [u8],
}

impl<'a> CheckpointReader<'a> {
    /// Validates the stream's framing (the caller has checked its CRC).
    pub fn decode(b: &'a [u8], uuid: &[u8; 16]) -> Result<Self, FormatError> {
        let trunc = |need| FormatError::Truncated {
            what: "checkpoint",
            need,
            have: b.len(),
        };
        if b.len() < CHECKPOINT_HEADER_SIZE {
            return Err(trunc(CHECKPOINT_HEADER_SIZE));
        }
        crate::checkpoint::decode::check_magic_and_version(b, VERSION..=VERSION)?;
        if &b[16..32] != uuid {
            return Err(FormatError::WrongVolume { what: "checkpoint" });
        }
        let n_counters = get_u32(b, 64) as usize;
        if n_counters > MAX_COUNTERS || get_u32(b, 68) as usize != CHUNK_ENTRIES {
            return Err(FormatError::Invalid {
                what: "checkpoint",
                why: "bad counter count or chunk size".into(),
            });
        }
        let chunk_count = get_u64(b, 56);
        let counters_end = CHECKPOINT_HEADER_SIZE + 8 * n_counters;
        let need = u128::from(chunk_count) * CHUNK_BYTES as u128 + counters_end as u128;
        if need != b.len() as u128 {
            return Err(FormatError::Invalid {
                what: "checkpoint",
                why: format!("{chunk_count} chunks do not fill {} bytes", b.len()),
            });
        }
        let counters = (0..n_counters)
            .map(|i| get_u64(b, CHECKPOINT_HEADER_SIZE + 8 * i))
            .collect();
        Ok(CheckpointReader {
            header: CheckpointHeader {
                uuid: *uuid,
                generation: get_u64(b, 32),
                next_seq: get_u64(b, 40),
                head_offset: get_u64(b, 48),
            },
            counters,
            chunks: &b[counters_end..],
        })
    }

    pub fn chunk_count(&self) -> usize {
        self.chunks.len() / CHUNK_BYTES
    }

    /// Chunk `i` as (chunk index, entries). Errors if indices do not increase.
    pub fn chunks(
        &self,
    ) -> impl Iterator<Item = Result<(u64, Box<[MapEntry; CHUNK_ENTRIES]>), FormatError>> + '_ {
        let mut last: Option<u64> = None;
        self.chunks.chunks_exact(CHUNK_BYTES).map(move |c| {
            let index = get_u64(c, 0);
            if last.is_some_and(|l| l >= index) {
                return Err(FormatError::Invalid {
                    what: "checkpoint",
                    why: "chunk indices not increasing".into(),
                });
            }
            last = Some(index);
            let mut entries = Box::new([MapEntry::UNMAPPED; CHUNK_ENTRIES]);
            for (i, e) in entries.iter_mut().enumerate() {
                *e = MapEntry(get_u64(c, 8 + 8 * i));
            }
            Ok((index, entries))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = CheckpointHeader {
            uuid: [1; 16],
            generation: 4,
            next_seq: 99,
            head_offset: 1 << 20,
        };
        let mut w = CheckpointWriter::new(&h, &[1, 2, 3], 2);
        let mut a = [MapEntry::UNMAPPED; CHUNK_ENTRIES];
        a[5] = MapEntry::new(1 << 20, 0, 1, 4160);
        w.push_chunk(3, &a);
        w.push_chunk(10, &a);
        let b = w.finish();
        let r = CheckpointReader::decode(&b, &[1; 16]).unwrap();
        assert_eq!(r.header, h);
        assert_eq!(r.counters, vec![1, 2, 3]);
        let chunks: Vec<_> = r.chunks().map(|c| c.unwrap()).collect();
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[1].0, 10);
        assert_eq!(chunks[1].1[5], a[5]);
        assert!(matches!(
            CheckpointReader::decode(&b, &[2; 16]),
            Err(FormatError::WrongVolume { .. })
        ));
        assert!(CheckpointReader::decode(&b[..b.len() - 1], &[1; 16]).is_err());
    }
}
