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

use crate::le::{get_u32, get_u64, put_u32, put_u64};
use crate::{checksum, FormatError, MapEntry};

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
        if self.first.is_mapped() {
            self.first.with_index(self.first.index() + i)
        } else {
            MapEntry::UNMAPPED
        }
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

/// Builds one piece.
pub struct PieceWriter {
    buf: Vec<u8>,
    runs: u64,
    last_end: u64,
    kind: PieceKind,
}

/// The header, counters and notes of a piece (its run count, length and
/// CRC still zero), in a buffer with room for `run_hint` runs.
fn piece_head(
    h: &PieceHeader,
    counters: &[u64],
    notes: &[SegmentNote],
    run_hint: usize,
) -> Vec<u8> {
    assert!(counters.len() <= MAX_COUNTERS && notes.len() <= MAX_NOTES);
    assert!(
        notes.windows(2).all(|w| w[0].segment < w[1].segment)
            && notes.iter().all(|n| n.below_target_bytes > 0),
        "notes out of order, repeated or empty"
    );
    let mut buf = Vec::with_capacity(
        PIECE_HEADER_SIZE + 8 * counters.len() + NOTE_BYTES * notes.len() + run_hint * RUN_BYTES,
    );
    buf.resize(PIECE_HEADER_SIZE, 0);
    buf[0..8].copy_from_slice(&CHECKPOINT_MAGIC);
    put_u32(&mut buf, 8, VERSION);
    put_u32(&mut buf, 12, h.kind as u32);
    buf[16..32].copy_from_slice(&h.uuid);
    put_u64(&mut buf, 32, h.generation);
    put_u64(&mut buf, 40, h.next_seq);
    put_u64(&mut buf, 48, h.head_offset);
    put_u32(&mut buf, 64, counters.len() as u32);
    put_u32(&mut buf, 80, notes.len() as u32);
    for c in counters {
        buf.extend_from_slice(&c.to_le_bytes());
    }
    for n in notes {
        buf.extend_from_slice(&n.segment.to_le_bytes());
        buf.extend_from_slice(&n.below_target_bytes.to_le_bytes());
    }
    buf
}

fn put_run(buf: &mut Vec<u8>, r: &MapRun) {
    buf.extend_from_slice(&encode_run(r));
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

impl PieceWriter {
    /// `notes` sorted by segment, each once, bytes non-zero.
    pub fn new(h: &PieceHeader, counters: &[u64], notes: &[SegmentNote], run_hint: usize) -> Self {
        PieceWriter {
            buf: piece_head(h, counters, notes, run_hint),
            runs: 0,
            last_end: 0,
            kind: h.kind,
        }
    }

    /// Appends a run: runs must come in LBA order without overlapping, and
    /// a base holds only mapped runs.
    pub fn push(&mut self, r: MapRun) {
        assert!(r.sectors > 0 && r.lba >= self.last_end, "runs out of order");
        assert!(self.kind == PieceKind::Delta || r.first.is_mapped());
        self.last_end = r.end();
        put_run(&mut self.buf, &r);
        self.runs += 1;
    }

    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// The padded piece with its length and CRC filled in.
    pub fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u64;
        let padded = len.div_ceil(PIECE_ALIGN) * PIECE_ALIGN;
        self.buf.resize(padded as usize, 0);
        put_u64(&mut self.buf, 56, self.runs);
        put_u64(&mut self.buf, 72, padded);
        let crc = piece_crc(&self.buf);
        put_u32(&mut self.buf, 68, crc);
        self.buf
    }
}

/// Builds one piece as a stream of byte slices, for a piece too large to
/// hold whole in memory (a base of a big map): the caller counts the runs
/// first, so the header's run count and length are known from the start,
/// takes the bytes as they accumulate, and at the end writes the CRC that
/// [`PieceStream::finish`] returns into the piece's bytes 68..72 (zero in
/// the stream: the CRC is computed over the piece with that field zero, so
/// the stream's running CRC is the piece's).
pub struct PieceStream {
    buf: Vec<u8>,
    crc: u32,
    taken: u64,
    runs: u64,
    expect_runs: u64,
    last_end: u64,
    kind: PieceKind,
    len: u64,
}

impl PieceStream {
    /// A piece that will hold exactly `runs` runs.
    pub fn new(h: &PieceHeader, counters: &[u64], notes: &[SegmentNote], runs: u64) -> Self {
        let mut buf = piece_head(h, counters, notes, 0);
        let len = piece_len(counters.len(), notes.len(), runs);
        put_u64(&mut buf, 56, runs);
        put_u64(&mut buf, 72, len);
        PieceStream {
            buf,
            crc: 0,
            taken: 0,
            runs: 0,
            expect_runs: runs,
            last_end: 0,
            kind: h.kind,
            len,
        }
    }

    /// The piece's length, padding included (what it occupies).
    pub fn padded_len(&self) -> u64 {
        self.len
    }

    /// Appends a run (as [`PieceWriter::push`]).
    pub fn push(&mut self, r: MapRun) {
        assert!(r.sectors > 0 && r.lba >= self.last_end, "runs out of order");
        assert!(self.kind == PieceKind::Delta || r.first.is_mapped());
        assert!(
            self.runs < self.expect_runs,
            "more runs than the piece was made for"
        );
        self.last_end = r.end();
        put_run(&mut self.buf, &r);
        self.runs += 1;
    }

    /// Bytes encoded and not yet taken.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Takes the bytes encoded so far; they go at piece offset `taken()`
    /// before the call.
    pub fn take(&mut self) -> Vec<u8> {
        let b = std::mem::take(&mut self.buf);
        self.crc = if self.taken == 0 {
            checksum::crc32c(&b)
        } else {
            checksum::crc32c_append(self.crc, &b)
        };
        self.taken += b.len() as u64;
        b
    }

    /// Bytes taken so far: where the next taken bytes go in the piece.
    pub fn taken(&self) -> u64 {
        self.taken
    }

    /// The last bytes (the padding included) and the piece's CRC, to be
    /// written at piece offset 68 once every byte is in place. Panics when
    /// fewer runs came than the piece was made for.
    pub fn finish(mut self) -> (Vec<u8>, u32) {
        assert_eq!(
            self.runs, self.expect_runs,
            "fewer runs than the piece was made for"
        );
        let end = self.taken + self.buf.len() as u64;
        self.buf
            .resize(self.buf.len() + (self.len - end) as usize, 0);
        let last = self.take();
        (last, self.crc)
    }
}

/// The magic and version every checkpoint header (any format) starts
/// with; `b` holds at least the header. Returns the version found.
pub(crate) fn check_magic_and_version(
    b: &[u8],
    versions: std::ops::RangeInclusive<u32>,
) -> Result<u32, FormatError> {
    if b[0..8] != CHECKPOINT_MAGIC {
        return Err(FormatError::BadMagic { what: "checkpoint" });
    }
    let found = get_u32(b, 8);
    if !versions.contains(&found) {
        return Err(FormatError::UnsupportedVersion {
            found,
            supported: *versions.end(),
        });
    }
    Ok(found)
}

/// The CRC a finished piece carries in its header (what a superblock
/// naming it as a chain's last piece holds).
pub fn stored_crc(piece: &[u8]) -> u32 {
    get_u32(piece, 68)
}

/// CRC-32C of a piece as the header stores it (its crc field read as zero).
pub(crate) fn piece_crc(b: &[u8]) -> u32 {
    let crc = checksum::crc32c(&b[..68]);
    let crc = checksum::crc32c_append(crc, &[0; 4]);
    checksum::crc32c_append(crc, &b[72..])
}

/// What a piece's first [`PIECE_HEADER_SIZE`] bytes say, checked: the
/// magic and version, a length that holds the counters, notes and runs
/// they count, the volume, the kind and zero reserved bytes (all but the
/// CRC, which covers the whole piece).
pub(crate) struct Fixed {
    pub header: PieceHeader,
    pub len: u64,
    pub crc: u32,
    pub n_counters: usize,
    pub n_notes: usize,
    pub run_count: u64,
}

impl Fixed {
    /// Where the runs start, from the piece's first byte.
    pub fn runs_offset(&self) -> usize {
        runs_offset(self.n_counters, self.n_notes)
    }

    /// Where the runs end (the padding starts).
    pub fn runs_end(&self) -> u64 {
        self.runs_offset() as u64 + self.run_count * RUN_BYTES as u64
    }
}

fn invalid_piece(why: String) -> FormatError {
    FormatError::Invalid {
        what: "checkpoint piece",
        why,
    }
}

/// The version and length of the piece whose header `b` starts with.
fn version_and_len(b: &[u8]) -> Result<(u32, u64), FormatError> {
    if b.len() < PIECE_HEADER_SIZE {
        return Err(FormatError::Truncated {
            what: "checkpoint piece",
            need: PIECE_HEADER_SIZE,
            have: b.len(),
        });
    }
    let version = check_magic_and_version(b, OLDEST_VERSION..=VERSION)?;
    let len = get_u64(b, 72);
    if len < PIECE_ALIGN || !len.is_multiple_of(PIECE_ALIGN) {
        return Err(invalid_piece(format!("length {len}")));
    }
    Ok((version, len))
}

/// Decodes and checks the header `b` starts with (see [`Fixed`]).
pub(crate) fn decode_fixed(b: &[u8], uuid: &[u8; 16]) -> Result<Fixed, FormatError> {
    let (version, len) = version_and_len(b)?;
    if &b[16..32] != uuid {
        return Err(FormatError::WrongVolume { what: "checkpoint" });
    }
    let kind = match get_u32(b, 12) {
        0 => PieceKind::Base,
        1 => PieceKind::Delta,
        k => return Err(invalid_piece(format!("unknown kind {k}"))),
    };
    let n_counters = get_u32(b, 64) as usize;
    if n_counters > MAX_COUNTERS {
        return Err(invalid_piece(format!("{n_counters} counters")));
    }
    // Format 2 has no notes: its byte 80 is reserved (zero), checked with
    // the rest below.
    let n_notes = if version >= 3 {
        get_u32(b, 80) as usize
    } else {
        0
    };
    if n_notes > MAX_NOTES {
        return Err(invalid_piece(format!("{n_notes} notes")));
    }
    let run_count = get_u64(b, 56);
    let notes_end = runs_offset(n_counters, n_notes);
    if notes_end as u64 > len {
        return Err(invalid_piece(format!(
            "{n_notes} notes do not fit {len} bytes"
        )));
    }
    let runs_end = u128::from(run_count) * RUN_BYTES as u128 + notes_end as u128;
    if runs_end > u128::from(len) || u128::from(len) - runs_end >= u128::from(PIECE_ALIGN) {
        return Err(invalid_piece(format!(
            "{run_count} runs do not fill {len} bytes"
        )));
    }
    let reserved = if version >= 3 { 84 } else { 80 };
    if b[reserved..PIECE_HEADER_SIZE].iter().any(|&x| x != 0) {
        return Err(invalid_piece("nonzero reserved bytes".into()));
    }
    Ok(Fixed {
        header: PieceHeader {
            kind,
            uuid: *uuid,
            generation: get_u64(b, 32),
            next_seq: get_u64(b, 40),
            head_offset: get_u64(b, 48),
        },
        len,
        crc: get_u32(b, 68),
        n_counters,
        n_notes,
        run_count,
    })
}

/// The counters and notes of the piece `b` starts with (at least up to
/// its runs), checked: notes sorted by segment, each once, bytes non-zero.
pub(crate) fn decode_counters_and_notes(
    b: &[u8],
    f: &Fixed,
) -> Result<(Vec<u64>, Vec<SegmentNote>), FormatError> {
    let counters_end = PIECE_HEADER_SIZE + 8 * f.n_counters;
    let notes: Vec<SegmentNote> = b[counters_end..f.runs_offset()]
        .chunks_exact(NOTE_BYTES)
        .map(|c| SegmentNote {
            segment: get_u32(c, 0),
            below_target_bytes: get_u64(c, 4),
        })
        .collect();
    if !notes.windows(2).all(|w| w[0].segment < w[1].segment)
        || notes.iter().any(|n| n.below_target_bytes == 0)
    {
        return Err(invalid_piece(
            "segment notes out of order, repeated or empty".into(),
        ));
    }
    let counters = (0..f.n_counters)
        .map(|i| get_u64(b, PIECE_HEADER_SIZE + 8 * i))
        .collect();
    Ok((counters, notes))
}

/// Checks a piece's runs in order: non-empty, sorted, not overlapping,
/// inside their extent, and mapped in a base.
pub(crate) struct RunCheck {
    kind: PieceKind,
    last_end: u64,
}

impl RunCheck {
    pub fn new(kind: PieceKind) -> RunCheck {
        RunCheck { kind, last_end: 0 }
    }

    pub fn check(&mut self, r: MapRun) -> Result<MapRun, FormatError> {
        let bad = |why: &str| {
            Err(FormatError::Invalid {
                what: "checkpoint run",
                why: format!("{why}: {r:?}"),
            })
        };
        if r.sectors == 0
            || r.lba < self.last_end
            || r.lba.checked_add(u64::from(r.sectors)).is_none()
        {
            return bad("empty, overlapping or out of order");
        }
        if r.first.is_mapped() {
            if r.first.record_len() == 0
                || u64::from(r.first.index()) + u64::from(r.sectors) > u64::from(r.first.sectors())
            {
                return bad("runs past its extent");
            }
        } else if self.kind == PieceKind::Base {
            return bad("unmapped run in a base");
        }
        self.last_end = r.end();
        Ok(r)
    }
}

/// A decoded piece: its header, counters, notes and a view of its runs.
pub struct Piece<'a> {
    pub header: PieceHeader,
    pub counters: Vec<u64>,
    /// Sorted by segment, each once, bytes non-zero (checked).
    pub notes: Vec<SegmentNote>,
    /// Bytes the piece occupies (padding included).
    pub len: u64,
    /// Its CRC (what a superblock naming it as a chain's last piece holds).
    pub crc: u32,
    runs: &'a [u8],
}

impl<'a> Piece<'a> {
    /// Decodes and checks the piece at the start of `b` (which may go on
    /// with later pieces).
    pub fn decode(b: &'a [u8], uuid: &[u8; 16]) -> Result<Self, FormatError> {
        let (_, len) = version_and_len(b)?;
        if len > b.len() as u64 {
            return Err(FormatError::Truncated {
                what: "checkpoint piece",
                need: usize::try_from(len).unwrap_or(usize::MAX),
                have: b.len(),
            });
        }
        let b = &b[..len as usize];
        // The CRC first: damage anywhere is reported as damage.
        let crc = get_u32(b, 68);
        let got = piece_crc(b);
        if got != crc {
            return Err(FormatError::ChecksumMismatch {
                what: "checkpoint piece",
                expected: crc,
                got,
            });
        }
        let f = decode_fixed(b, uuid)?;
        let runs_end = f.runs_end() as usize;
        if b[runs_end..].iter().any(|&x| x != 0) {
            return Err(invalid_piece("nonzero padding".into()));
        }
        let (counters, notes) = decode_counters_and_notes(b, &f)?;
        Ok(Piece {
            runs: &b[f.runs_offset()..runs_end],
            header: f.header,
            counters,
            notes,
            len,
            crc,
        })
    }

    pub fn run_count(&self) -> usize {
        self.runs.len() / RUN_BYTES
    }

    /// Where the runs start, from the piece's first byte.
    pub fn runs_offset(&self) -> usize {
        runs_offset(self.counters.len(), self.notes.len())
    }

    /// The encoded runs, [`RUN_BYTES`] each (checked by [`Piece::runs`]).
    pub fn run_bytes(&self) -> &'a [u8] {
        self.runs
    }

    /// The runs, checked as [`RunCheck`] does.
    pub fn runs(&self) -> impl Iterator<Item = Result<MapRun, FormatError>> + '_ {
        let mut check = RunCheck::new(self.header.kind);
        self.runs
            .chunks_exact(RUN_BYTES)
            .map(move |c| check.check(decode_run(c)))
    }
}

/// The order of a chain's pieces: a base, then deltas with increasing
/// generations.
#[derive(Default)]
pub struct ChainOrder {
    last_generation: Option<u64>,
}

impl ChainOrder {
    /// Checks the next piece's header (`at`: its chain byte offset, for
    /// the error).
    pub fn next(&mut self, h: &PieceHeader, at: u64) -> Result<(), FormatError> {
        let first = self.last_generation.is_none();
        if first != (h.kind == PieceKind::Base) {
            return Err(FormatError::Invalid {
                what: "checkpoint chain",
                why: format!("piece at byte {at} is a {:?}", h.kind),
            });
        }
        if self.last_generation.is_some_and(|g| h.generation <= g) {
            return Err(FormatError::Invalid {
                what: "checkpoint chain",
                why: format!("generation {} does not increase", h.generation),
            });
        }
        self.last_generation = Some(h.generation);
        Ok(())
    }
}

/// The pieces of a chain in order: a base, then deltas with increasing
/// generations, filling `chain` exactly.
pub fn pieces<'a>(
    chain: &'a [u8],
    uuid: &'a [u8; 16],
) -> impl Iterator<Item = Result<Piece<'a>, FormatError>> + 'a {
    let mut at = 0usize;
    let mut order = ChainOrder::default();
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || at >= chain.len() {
            return None;
        }
        let r = Piece::decode(&chain[at..], uuid)
            .and_then(|p| order.next(&p.header, at as u64).map(|()| p));
        match &r {
            Ok(p) => at += p.len as usize,
            Err(_) => failed = true,
        }
        Some(r)
    })
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

    fn run(lba: u64, sectors: u32, offset: u64) -> MapRun {
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

    /// A streamed piece, taken in slices of every size and its CRC put in
    /// place, is the piece `PieceWriter` builds whole.
    #[test]
    fn a_streamed_piece_is_the_whole_piece() {
        for runs in [0u64, 1, 7, 300] {
            for slice in [1usize, 20, 4096, 1 << 20] {
                let h = header(PieceKind::Base, 9);
                let mut w = PieceWriter::new(&h, &[7, 8], &notes(), 0);
                let mut st = PieceStream::new(&h, &[7, 8], &notes(), runs);
                let mut got = Vec::new();
                for i in 0..runs {
                    let r = run(i * 100, 1 + i as u32 % 40, (i + 1) << 20);
                    w.push(r);
                    st.push(r);
                    if st.pending() >= slice {
                        assert_eq!(st.taken(), got.len() as u64);
                        got.extend_from_slice(&st.take());
                    }
                }
                let len = st.padded_len();
                let (last, crc) = st.finish();
                got.extend_from_slice(&last);
                put_u32(&mut got, 68, crc);
                let whole = w.finish();
                assert_eq!(len, whole.len() as u64, "{runs} runs, slices of {slice}");
                assert!(got == whole, "{runs} runs, slices of {slice}");
                let p = Piece::decode(&got, &[1; 16]).unwrap();
                assert_eq!(p.crc, crc);
            }
        }
    }

    #[test]
    #[should_panic(expected = "fewer runs")]
    fn a_streamed_piece_short_of_its_runs_is_refused() {
        let mut st = PieceStream::new(&header(PieceKind::Base, 1), &[], &[], 2);
        st.push(run(0, 1, 1 << 20));
        let _ = st.finish();
    }

    fn notes() -> Vec<SegmentNote> {
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

    /// `piece` rewritten as format 2 wrote it (version 2, no notes).
    fn as_version_2(mut piece: Vec<u8>) -> Vec<u8> {
        assert_eq!(get_u32(&piece, 80), 0);
        put_u32(&mut piece, 8, 2);
        let crc = piece_crc(&piece);
        put_u32(&mut piece, 68, crc);
        piece
    }

    #[test]
    fn format_2_pieces_still_decode() {
        let mut w = PieceWriter::new(&header(PieceKind::Base, 4), &[1, 2], &[], 1);
        w.push(run(0, 32, 1 << 20));
        let v2 = as_version_2(w.finish());
        let p = Piece::decode(&v2, &[1; 16]).unwrap();
        assert_eq!(p.counters, vec![1, 2]);
        assert!(p.notes.is_empty());
        assert_eq!(p.runs().collect::<Result<Vec<_>, _>>().unwrap().len(), 1);
        // Format 2's byte 80 is reserved: a note count there is damage.
        let mut bad = v2.clone();
        put_u32(&mut bad, 80, 1);
        let crc = piece_crc(&bad);
        put_u32(&mut bad, 68, crc);
        assert!(Piece::decode(&bad, &[1; 16]).is_err());
        // Versions outside 2..=3 are refused by name.
        for v in [1, 4] {
            let mut b = v2.clone();
            put_u32(&mut b, 8, v);
            assert!(matches!(
                Piece::decode(&b, &[1; 16]),
                Err(FormatError::UnsupportedVersion { found, .. }) if found == v
            ));
        }
    }

    #[test]
    fn bad_notes_are_refused() {
        let uuid = [1; 16];
        let piece_with = |notes: &[(u32, u64)], count: Option<u32>| {
            let mut w = PieceWriter::new(&header(PieceKind::Base, 4), &[7], &[], 1);
            w.push(run(0, 32, 1 << 20));
            let mut b = w.finish();
            // Rebuild by hand: counters, the notes as given, the run.
            let run_at = PIECE_HEADER_SIZE + 8;
            let run_bytes = b[run_at..run_at + RUN_BYTES].to_vec();
            b.truncate(run_at);
            for &(seg, bytes) in notes {
                b.extend_from_slice(&seg.to_le_bytes());
                b.extend_from_slice(&bytes.to_le_bytes());
            }
            b.extend_from_slice(&run_bytes);
            b.resize(4096, 0);
            put_u32(&mut b, 80, count.unwrap_or(notes.len() as u32));
            let crc = piece_crc(&b);
            put_u32(&mut b, 68, crc);
            b
        };
        let good = piece_with(&[(1, 5), (2, 6)], None);
        assert_eq!(Piece::decode(&good, &uuid).unwrap().notes.len(), 2);
        for (notes, count, what) in [
            (&[(2u32, 5u64), (1, 6)][..], None, "out of order"),
            (&[(2, 5), (2, 6)][..], None, "repeated"),
            (&[(2, 0)][..], None, "empty"),
            (&[(2, 5)][..], Some(400), "more notes than bytes"),
            (&[(2, 5)][..], Some(u32::MAX), "absurd count"),
        ] {
            let b = piece_with(notes, count);
            assert!(Piece::decode(&b, &uuid).is_err(), "{what}");
        }
    }

    #[test]
    fn damage_and_misuse_are_refused() {
        let mut w = PieceWriter::new(&header(PieceKind::Base, 4), &[1], &[], 1);
        w.push(run(0, 32, 1 << 20));
        let base = w.finish();
        let uuid = [1; 16];
        // A flipped bit anywhere, padding included.
        for at in [0, 20, 70, 130, 4000] {
            let mut b = base.clone();
            b[at] ^= 1;
            assert!(Piece::decode(&b, &uuid).is_err(), "bit flip at {at}");
        }
        assert!(matches!(
            Piece::decode(&base, &[2; 16]),
            Err(FormatError::WrongVolume { .. })
        ));
        assert!(Piece::decode(&base[..4095], &uuid).is_err());
        // A delta cannot start a chain, a base cannot follow one.
        let mut w = PieceWriter::new(&header(PieceKind::Delta, 5), &[1], &[], 0);
        w.push(run(7, 1, 0));
        let delta = w.finish();
        assert!(pieces(&delta, &uuid).next().unwrap().is_err());
        let two_bases = [base.clone(), base.clone()].concat();
        assert!(pieces(&two_bases, &uuid).nth(1).unwrap().is_err());
        // Generations must increase.
        let mut w = PieceWriter::new(&header(PieceKind::Delta, 4), &[1], &[], 0);
        w.push(run(7, 1, 0));
        let stale = [base.clone(), w.finish()].concat();
        assert!(pieces(&stale, &uuid).nth(1).unwrap().is_err());
        // A run that goes past its extent.
        let mut bad = base.clone();
        bad[PIECE_HEADER_SIZE + 8 + 8..PIECE_HEADER_SIZE + 8 + 12]
            .copy_from_slice(&33u32.to_le_bytes());
        let crc = piece_crc(&bad);
        put_u32(&mut bad, 68, crc);
        let p = Piece::decode(&bad, &uuid).unwrap();
        assert!(p.runs().next().unwrap().is_err());
    }
}
