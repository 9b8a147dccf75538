//! The checkpoint chain (formats 2 and 3): the sector map as of a log position,
//! written as a **base** piece (every mapped run) followed by **delta**
//! pieces (only the runs of sectors whose mapping changed since the piece
//! before). Each piece also carries the log position to replay from, the
//! persistent counters and (format 3) the segments' below-target notes, so
//! the last piece of a chain is a whole checkpoint: base + deltas in order =
//! the map at the last piece's head, with the last piece's counters and
//! notes.
//!
//! The pieces of a chain are laid end to end, each padded to 4 KiB, in the
//! segments the superblock lists; the superblock holds the chain's length
//! and the CRC-32C of its last piece, so appending a delta never rewrites a
//! byte an older superblock slot still names.
//!
//! ```text
//! byte  0  magic         [8]  "SQZCKPT\0"
//!       8  version       u32  3 (2: no notes; read, no longer written)
//!      12  kind          u32  0 = base, 1 = delta
//!      16  uuid          [16]
//!      32  generation    u64  superblock generation that first pointed here
//!      40  next_seq      u64  replay expects this sequence number next
//!      48  head_offset   u64  byte offset of the next record in the log
//!      56  run_count     u64  map runs that follow the counters
//!      64  counter_count u32
//!      68  crc           u32  CRC-32C of the whole piece with this field zero
//!      72  piece_len     u64  bytes of the piece, padding included (k x 4096)
//!      80  note_count    u32  segment notes after the counters (0 in format 2)
//!      84  reserved      [44] zero
//!     128  counters      u64 x counter_count
//!      ..  notes         note_count x (segment u32, below_target_bytes u64)
//!      ..  runs          run_count x (lba u64, sectors u32, first entry u64)
//!      ..  padding       zero up to piece_len
//! ```
//! A run maps `sectors` consecutive logical sectors from `lba` to
//! consecutive sectors of one record's extent, starting with `first`; a run
//! whose `first` is unmapped (0) unmaps its sectors (deltas only). Runs of a
//! piece are sorted by LBA and do not overlap.
//!
//! A note says that `below_target_bytes` raw bytes of blobs in `segment`
//! were written with a faster codec than the policy's target (the adaptive
//! codec under load) and wait for the idle upgrade; every piece lists every
//! segment with a note, sorted by segment, each once, bytes non-zero.
//!
//! This file: the layout, its constants, and the run and CRC codecs both
//! sides use; a piece is built in `encode` and read and checked in
//! `decode` (and, streamed, in `piece_decoder`).

pub mod decode;
pub mod encode;

use crate::le::{get_u32, get_u64};
use crate::{checksum, MapEntry};

// The public names of the chain, where callers have always found them.
pub use decode::{pieces, stored_crc, ChainOrder, Piece};
pub use encode::{PieceStream, PieceWriter};

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"SQZCKPT\0";
/// The format version of the checkpoint pieces written.
pub const VERSION: u32 = 3;
/// The oldest piece format read (format 2: pieces without notes).
pub const OLDEST_VERSION: u32 = 2;
/// Bytes of one encoded note.
pub const NOTE_BYTES: usize = 12;
/// Most notes a piece may carry (a sanity bound for decoding: one per
/// segment of the largest backing file).
pub const MAX_NOTES: usize = 1 << 24;
pub const PIECE_HEADER_SIZE: usize = 128;
/// Pieces are padded to this (a piece never shares a 4 KiB block with the
/// next one, so a torn write of a new piece cannot touch an old one).
pub const PIECE_ALIGN: u64 = 4096;
/// Bytes of one encoded run.
pub const RUN_BYTES: usize = 20;
/// Map entries per chunk (covers 2 MiB of logical space): the unit of the
/// engine's in-memory map, and of format 1's checkpoint stream.
pub const CHUNK_ENTRIES: usize = 512;
/// Most counters a checkpoint may carry (a sanity bound for decoding).
pub const MAX_COUNTERS: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceKind {
    /// The whole map: starts a chain.
    Base,
    /// The runs that changed since the piece before.
    Delta,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PieceHeader {
    pub kind: PieceKind,
    pub uuid: [u8; 16],
    pub generation: u64,
    pub next_seq: u64,
    pub head_offset: u64,
}

/// `sectors` logical sectors from `lba`, mapped to consecutive sectors of
/// one extent from `first`, or unmapped when `first` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapRun {
    pub lba: u64,
    pub sectors: u32,
    pub first: MapEntry,
}

impl MapRun {
    pub fn end(&self) -> u64 {
        self.lba + u64::from(self.sectors)
    }

    /// The entry of sector `lba + i`.
    pub fn entry(&self, i: u32) -> MapEntry {
        self.first.advance(i)
    }
}

/// Bytes of a piece with `counters` counters, `notes` notes and `runs`
/// runs, padded.
pub fn piece_len(counters: usize, notes: usize, runs: u64) -> u64 {
    ((PIECE_HEADER_SIZE + 8 * counters + NOTE_BYTES * notes) as u64 + runs * RUN_BYTES as u64)
        .div_ceil(PIECE_ALIGN)
        * PIECE_ALIGN
}

/// A segment's below-target note (see the module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentNote {
    pub segment: u32,
    pub below_target_bytes: u64,
}

/// The encoding of one run: lba u64, sectors u32, first entry u64.
pub fn encode_run(r: &MapRun) -> [u8; RUN_BYTES] {
    let mut b = [0u8; RUN_BYTES];
    b[0..8].copy_from_slice(&r.lba.to_le_bytes());
    b[8..12].copy_from_slice(&r.sectors.to_le_bytes());
    b[12..20].copy_from_slice(&r.first.0.to_le_bytes());
    b
}

/// Decodes one encoded run (the first [`RUN_BYTES`] of `c`), unchecked: for
/// runs read back from a piece already checked whole (the engine pages its
/// map out to the chain and reads parts of pieces back, each part checked
/// by a CRC it kept).
pub fn decode_run(c: &[u8]) -> MapRun {
    MapRun {
        lba: get_u64(c, 0),
        sectors: get_u32(c, 8),
        first: MapEntry(get_u64(c, 12)),
    }
}

/// Where the runs of a piece with `counters` counters and `notes` notes
/// start, from the piece's first byte.
pub fn runs_offset(counters: usize, notes: usize) -> usize {
    PIECE_HEADER_SIZE + 8 * counters + NOTE_BYTES * notes
}

/// CRC-32C of a piece as the header stores it (its crc field read as zero).
pub(crate) fn piece_crc(b: &[u8]) -> u32 {
    let crc = checksum::crc32c(&b[..68]);
    let crc = checksum::crc32c_append(crc, &[0; 4]);
    checksum::crc32c_append(crc, &b[72..])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A piece header of volume [1; 16] (the decoder's tests use it too).
    pub(crate) fn header(kind: PieceKind, generation: u64) -> PieceHeader {
        PieceHeader {
            kind,
            uuid: [1; 16],
            generation,
            next_seq: 99,
            head_offset: 1 << 20,
        }
    }

    pub(crate) fn run(lba: u64, sectors: u32, offset: u64) -> MapRun {
        MapRun {
            lba,
            sectors,
            first: if offset == 0 {
                MapEntry::UNMAPPED
            } else {
                MapEntry::new(offset, 0, 32, 32 * 4096 + 64)
            },
        }
    }

    pub(crate) fn notes() -> Vec<SegmentNote> {
        vec![
            SegmentNote {
                segment: 3,
                below_target_bytes: 128 << 10,
            },
            SegmentNote {
                segment: 70_000,
                below_target_bytes: 1,
            },
        ]
    }

    #[test]
    fn a_chain_round_trips() {
        let mut w = PieceWriter::new(&header(PieceKind::Base, 4), &[1, 2, 3], &[], 2);
        w.push(run(0, 32, 1 << 20));
        w.push(run(1000, 5, 2 << 20));
        let base = w.finish();
        assert_eq!(base.len() as u64, piece_len(3, 0, 2));
        let mut w = PieceWriter::new(&header(PieceKind::Delta, 6), &[4, 5, 6], &notes(), 2);
        w.push(run(3, 2, 0));
        w.push(run(1000, 32, 3 << 20));
        let delta = w.finish();
        let chain = [base.clone(), delta.clone()].concat();
        let ps: Vec<_> = pieces(&chain, &[1; 16]).map(|p| p.unwrap()).collect();
        assert_eq!(ps.len(), 2);
        assert_eq!(ps[0].header, header(PieceKind::Base, 4));
        assert_eq!(ps[1].counters, vec![4, 5, 6]);
        assert!(ps[0].notes.is_empty());
        assert_eq!(ps[1].notes, notes());
        assert_eq!(ps[1].crc, get_u32(&delta, 68));
        let runs: Vec<_> = ps[1].runs().map(|r| r.unwrap()).collect();
        assert_eq!(runs, vec![run(3, 2, 0), run(1000, 32, 3 << 20)]);
        assert_eq!(runs[1].entry(5).index(), 5);
        assert_eq!(runs[0].entry(1), MapEntry::UNMAPPED);
    }

    /// Indirect runs (deduplication) round-trip, name consecutive hidden
    /// addresses, and are refused where they run past the hidden range.
    #[test]
    fn indirect_runs() {
        use crate::layout::{SHARED_BASE, SHARED_SECTORS};
        let ind = |lba, sectors, t| MapRun {
            lba,
            sectors,
            first: MapEntry::indirect(t),
        };
        let mut w = PieceWriter::new(&header(PieceKind::Base, 4), &[1, 2, 3], &[], 2);
        w.push(run(0, 4, 1 << 20));
        w.push(ind(4, 100, SHARED_BASE + 7));
        let b = w.finish();
        let p = Piece::decode(&b, &[1; 16]).unwrap();
        let runs: Vec<_> = p.runs().map(|r| r.unwrap()).collect();
        assert_eq!(runs[1], ind(4, 100, SHARED_BASE + 7));
        assert_eq!(runs[1].entry(99).target(), Some(SHARED_BASE + 106));

        let last = SHARED_BASE + SHARED_SECTORS - 1;
        let mut w = PieceWriter::new(&header(PieceKind::Base, 4), &[1, 2, 3], &[], 2);
        w.push(ind(0, 1, last));
        w.push(ind(1, 2, last));
        let b = w.finish();
        let p = Piece::decode(&b, &[1; 16]).unwrap();
        let mut runs = p.runs();
        assert!(runs.next().unwrap().is_ok());
        let e = runs.next().unwrap().unwrap_err().to_string();
        assert!(e.contains("past the hidden addresses"), "{e}");
    }

    /// The runs lie where `runs_offset` says, each as `encode_run` makes it
    /// (what the engine reads back when it pages its map in).
    #[test]
    fn runs_lie_at_runs_offset() {
        let mut w = PieceWriter::new(&header(PieceKind::Delta, 2), &[1, 2, 3], &notes(), 2);
        let rs = [run(3, 2, 0), run(1000, 32, 3 << 20)];
        for r in rs {
            w.push(r);
        }
        let b = w.finish();
        let p = Piece::decode(&b, &[1; 16]).unwrap();
        let at = runs_offset(3, notes().len());
        assert_eq!(p.runs_offset(), at);
        assert_eq!(p.run_bytes(), &b[at..at + 2 * RUN_BYTES]);
        for (k, r) in rs.iter().enumerate() {
            let c = &b[at + k * RUN_BYTES..at + (k + 1) * RUN_BYTES];
            assert_eq!(c, encode_run(r));
            assert_eq!(decode_run(c), *r);
        }
    }
}
