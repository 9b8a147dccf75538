//! Building a checkpoint piece (the layout is in the parent module): whole
//! in memory (`PieceWriter`), or streamed in slices for a piece too large
//! to hold (`PieceStream`), byte for byte the same piece. Both assert what
//! the caller must uphold: runs in LBA order without overlap, a base
//! mapped only, notes sorted and non-empty, the run count announced.

use super::{
    encode_run, piece_crc, piece_len, MapRun, PieceHeader, PieceKind, SegmentNote,
    CHECKPOINT_MAGIC, MAX_COUNTERS, MAX_NOTES, NOTE_BYTES, PIECE_ALIGN, PIECE_HEADER_SIZE,
    RUN_BYTES, VERSION,
};
use crate::checksum;
use crate::le::{put_u32, put_u64};

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
    chunk: usize,
    crc: u32,
    taken: u64,
    runs: u64,
    expect_runs: u64,
    last_end: u64,
    kind: PieceKind,
    len: u64,
}

impl PieceStream {
    /// A piece that will hold exactly `runs` runs, taken about `chunk`
    /// bytes at a time: the buffer is allocated once, for `chunk` bytes
    /// plus one run and the padding (or the whole piece when that is
    /// smaller), and kept from one take to the next.
    pub fn new(
        h: &PieceHeader,
        counters: &[u64],
        notes: &[SegmentNote],
        runs: u64,
        chunk: usize,
    ) -> Self {
        let head = piece_head(h, counters, notes, 0);
        let len = piece_len(counters.len(), notes.len(), runs);
        let cap = (chunk + RUN_BYTES + PIECE_ALIGN as usize)
            .min(usize::try_from(len).unwrap_or(usize::MAX))
            .max(head.len());
        let mut buf = Vec::with_capacity(cap);
        buf.extend_from_slice(&head);
        put_u64(&mut buf, 56, runs);
        put_u64(&mut buf, 72, len);
        PieceStream {
            buf,
            chunk,
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

    /// True once `chunk` bytes wait to be taken.
    pub fn full(&self) -> bool {
        self.buf.len() >= self.chunk
    }

    /// Hands the bytes encoded and not yet taken to `write`, with the
    /// piece offset they go at, then empties the buffer (keeping it).
    pub fn take<R>(&mut self, write: impl FnOnce(u64, &[u8]) -> R) -> R {
        self.crc = if self.taken == 0 {
            checksum::crc32c(&self.buf)
        } else {
            checksum::crc32c_append(self.crc, &self.buf)
        };
        let at = self.taken;
        self.taken += self.buf.len() as u64;
        let r = write(at, &self.buf);
        self.buf.clear();
        r
    }

    /// Hands the last bytes (the padding included) to `write`, as
    /// [`PieceStream::take`], and returns the piece's CRC with what
    /// `write` returned: the CRC goes at piece offset 68 once every byte
    /// is in place. Panics when fewer runs came than the piece was made
    /// for.
    pub fn finish<R>(mut self, write: impl FnOnce(u64, &[u8]) -> R) -> (R, u32) {
        assert_eq!(
            self.runs, self.expect_runs,
            "fewer runs than the piece was made for"
        );
        let end = self.taken + self.buf.len() as u64;
        self.buf
            .resize(self.buf.len() + (self.len - end) as usize, 0);
        let r = self.take(write);
        (r, self.crc)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{header, notes, run};
    use super::*;
    use crate::checkpoint::Piece;

    /// A streamed piece, taken in slices of every size and its CRC put in
    /// place, is the piece `PieceWriter` builds whole.
    #[test]
    fn a_streamed_piece_is_the_whole_piece() {
        for runs in [0u64, 1, 7, 300] {
            for slice in [1usize, 20, 4096, 1 << 20] {
                let h = header(PieceKind::Base, 9);
                let mut w = PieceWriter::new(&h, &[7, 8], &notes(), 0);
                let mut st = PieceStream::new(&h, &[7, 8], &notes(), runs, slice);
                let cap = st.buf.capacity();
                let mut got = Vec::new();
                let mut put = |at: u64, b: &[u8]| {
                    assert_eq!(at, got.len() as u64);
                    got.extend_from_slice(b);
                };
                for i in 0..runs {
                    let r = run(i * 100, 1 + i as u32 % 40, (i + 1) << 20);
                    w.push(r);
                    st.push(r);
                    if st.full() {
                        st.take(&mut put);
                    }
                }
                assert_eq!(st.buf.capacity(), cap, "the buffer is allocated once");
                let len = st.padded_len();
                let ((), crc) = st.finish(&mut put);
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
        let mut st = PieceStream::new(&header(PieceKind::Base, 1), &[], &[], 2, 4096);
        st.push(run(0, 1, 1 << 20));
        let _ = st.finish(|_, _| ());
    }
}
