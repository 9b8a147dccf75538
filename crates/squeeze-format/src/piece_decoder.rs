//! Decoding a checkpoint piece from its bytes fed in order, in slices of
//! any size, without holding it whole: the base of a big map is larger
//! than the RAM the engine may give its map while a volume opens. The
//! checks are [`Piece::decode`]'s, in the order the bytes come: the header
//! and its layout first, then the counters and notes, then every run as it
//! arrives, the padding, and the CRC of the whole piece at the end.
//!
//! [`Piece::decode`]: crate::checkpoint::decode::Piece::decode

use crate::checkpoint::decode::{decode_counters_and_notes, decode_fixed, Fixed, RunCheck};
use crate::checkpoint::{decode_run, PieceHeader, SegmentNote, PIECE_HEADER_SIZE, RUN_BYTES};
use crate::{checksum, FormatError, MapRun};

/// Where a piece's CRC lies: the CRC is computed with these bytes zero.
const CRC_FIELD: std::ops::Range<u64> = 68..72;

/// A piece's header, counters and notes: all of it but its runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PieceHead {
    pub header: PieceHeader,
    pub counters: Vec<u64>,
    /// Sorted by segment, each once, bytes non-zero (checked).
    pub notes: Vec<SegmentNote>,
    /// Bytes the piece occupies (padding included).
    pub len: u64,
    /// Its CRC (what a superblock naming it as a chain's last piece holds).
    pub crc: u32,
    pub run_count: u64,
}

impl PieceHead {
    /// Where the runs start, from the piece's first byte.
    pub fn runs_offset(&self) -> usize {
        crate::checkpoint::runs_offset(self.counters.len(), self.notes.len())
    }
}

/// Decodes one piece from its bytes in order (see the module).
pub struct PieceDecoder {
    uuid: [u8; 16],
    /// Bytes fed so far.
    fed: u64,
    /// The piece's bytes up to its runs (header, counters, notes), kept
    /// until they are all in.
    prefix: Vec<u8>,
    fixed: Option<Fixed>,
    head: Option<PieceHead>,
    /// CRC of the bytes fed, the CRC field read as zero.
    crc: u32,
    /// The first bytes of a run the last slice cut.
    carry: Vec<u8>,
    check: Option<RunCheck>,
}

impl PieceDecoder {
    /// A decoder for a piece of volume `uuid`.
    pub fn new(uuid: [u8; 16]) -> PieceDecoder {
        PieceDecoder {
            uuid,
            fed: 0,
            prefix: Vec::new(),
            fixed: None,
            head: None,
            crc: 0,
            carry: Vec::with_capacity(RUN_BYTES),
            check: None,
        }
    }

    /// Bytes of the piece still to come: the rest of its header until the
    /// header is in, then the rest of its length. Feed at most that many.
    pub fn remaining(&self) -> u64 {
        match &self.fixed {
            None => (PIECE_HEADER_SIZE as u64).saturating_sub(self.fed),
            Some(f) => f.len - self.fed,
        }
    }

    /// The header, counters and notes, once they are in.
    pub fn head(&self) -> Option<&PieceHead> {
        self.head.as_ref()
    }

    /// Takes the next bytes of the piece (at most [`Self::remaining`]),
    /// calling `f` with each run they complete, checked.
    pub fn feed(&mut self, b: &[u8], mut f: impl FnMut(MapRun)) -> Result<(), FormatError> {
        assert!(b.len() as u64 <= self.remaining(), "fed past the piece");
        self.crc_append(b);
        let mut rest = b;
        while !rest.is_empty() {
            let at = self.fed;
            let n = match (self.fixed.as_ref().map(|fx| fx.runs_offset()), &self.head) {
                (None, _) => self.take_prefix(rest, PIECE_HEADER_SIZE),
                (Some(need), None) => self.take_prefix(rest, need),
                (Some(_), Some(_)) => {
                    let runs_end = self.fixed.as_ref().expect("matched").runs_end();
                    if at < runs_end {
                        let n = (runs_end - at).min(rest.len() as u64) as usize;
                        self.runs(&rest[..n], &mut f)?;
                        n
                    } else {
                        if rest.iter().any(|&x| x != 0) {
                            return Err(FormatError::Invalid {
                                what: "checkpoint piece",
                                why: "nonzero padding".into(),
                            });
                        }
                        rest.len()
                    }
                }
            };
            self.fed += n as u64;
            rest = &rest[n..];
            self.settle_prefix()?;
        }
        Ok(())
    }

    /// Copies bytes of `b` into the prefix until it holds `need` bytes;
    /// returns how many it took.
    fn take_prefix(&mut self, b: &[u8], need: usize) -> usize {
        let n = need.saturating_sub(self.prefix.len()).min(b.len());
        self.prefix.extend_from_slice(&b[..n]);
        n
    }

    /// Decodes the header, then the counters and notes, as soon as their
    /// bytes are in.
    fn settle_prefix(&mut self) -> Result<(), FormatError> {
        if self.fixed.is_none() && self.prefix.len() >= PIECE_HEADER_SIZE {
            let fx = decode_fixed(&self.prefix, &self.uuid)?;
            self.check = Some(RunCheck::new(fx.header.kind));
            self.fixed = Some(fx);
        }
        if let (Some(fx), None) = (&self.fixed, &self.head) {
            if self.prefix.len() >= fx.runs_offset() {
                let (counters, notes) = decode_counters_and_notes(&self.prefix, fx)?;
                self.head = Some(PieceHead {
                    header: fx.header.clone(),
                    counters,
                    notes,
                    len: fx.len,
                    crc: fx.crc,
                    run_count: fx.run_count,
                });
                self.prefix = Vec::new();
            }
        }
        Ok(())
    }

    /// Decodes the runs in `b` (bytes of the runs' area, in order).
    fn runs(&mut self, mut b: &[u8], f: &mut impl FnMut(MapRun)) -> Result<(), FormatError> {
        let check = self.check.as_mut().expect("the header is in");
        if !self.carry.is_empty() {
            let n = (RUN_BYTES - self.carry.len()).min(b.len());
            self.carry.extend_from_slice(&b[..n]);
            b = &b[n..];
            if self.carry.len() < RUN_BYTES {
                return Ok(());
            }
            f(check.check(decode_run(&self.carry))?);
            self.carry.clear();
        }
        let mut whole = b.chunks_exact(RUN_BYTES);
        for c in &mut whole {
            f(check.check(decode_run(c))?);
        }
        self.carry.extend_from_slice(whole.remainder());
        Ok(())
    }

    /// Folds `b`, the next bytes, into the CRC (the CRC field as zero).
    fn crc_append(&mut self, b: &[u8]) {
        let (lo, hi) = (self.fed, self.fed + b.len() as u64);
        let zero_lo = CRC_FIELD.start.clamp(lo, hi);
        let zero_hi = CRC_FIELD.end.clamp(lo, hi);
        let cut = |x: u64| (x - lo) as usize;
        self.crc = checksum::crc32c_append(self.crc, &b[..cut(zero_lo)]);
        self.crc = checksum::crc32c_append(self.crc, &[0u8; 4][..cut(zero_hi) - cut(zero_lo)]);
        self.crc = checksum::crc32c_append(self.crc, &b[cut(zero_hi)..]);
    }

    /// Ends the piece: every byte came and the CRC matches.
    pub fn finish(self) -> Result<PieceHead, FormatError> {
        let (Some(fx), Some(head)) = (&self.fixed, self.head) else {
            return Err(FormatError::Truncated {
                what: "checkpoint piece",
                need: PIECE_HEADER_SIZE,
                have: self.fed as usize,
            });
        };
        if self.fed < fx.len {
            return Err(FormatError::Truncated {
                what: "checkpoint piece",
                need: usize::try_from(fx.len).unwrap_or(usize::MAX),
                have: self.fed as usize,
            });
        }
        if self.crc != head.crc {
            return Err(FormatError::ChecksumMismatch {
                what: "checkpoint piece",
                expected: head.crc,
                got: self.crc,
            });
        }
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::tests::header;
    use crate::checkpoint::{Piece, PieceKind, PieceWriter};
    use crate::MapEntry;

    fn piece(kind: PieceKind, runs: u64, notes: &[SegmentNote]) -> Vec<u8> {
        let mut w = PieceWriter::new(&header(kind, 3), &[5, 6, 7], notes, 0);
        for i in 0..runs {
            let first = if kind == PieceKind::Delta && i % 3 == 0 {
                MapEntry::UNMAPPED
            } else {
                MapEntry::new((i + 1) << 20, 0, 32, 32 * 4096)
            };
            w.push(MapRun {
                lba: i * 100,
                sectors: 1 + i as u32 % 32,
                first,
            });
        }
        w.finish()
    }

    /// Feeds `b` in slices of `slice` bytes, as far as the decoder asks.
    fn stream(b: &[u8], slice: usize) -> Result<(PieceHead, Vec<MapRun>), FormatError> {
        let mut d = PieceDecoder::new([1; 16]);
        let mut runs = Vec::new();
        let mut at = 0usize;
        while d.remaining() > 0 {
            let n = (d.remaining() as usize).min(slice).min(b.len() - at);
            if n == 0 {
                break;
            }
            d.feed(&b[at..at + n], |r| runs.push(r))?;
            at += n;
        }
        Ok((d.finish()?, runs))
    }

    /// Streamed in slices of every size, a piece decodes to what
    /// `Piece::decode` makes of it whole.
    #[test]
    fn a_streamed_piece_decodes_as_the_whole_piece() {
        let notes = [SegmentNote {
            segment: 4,
            below_target_bytes: 9,
        }];
        for kind in [PieceKind::Base, PieceKind::Delta] {
            for runs in [0u64, 1, 2, 205, 1000] {
                let b = piece(kind, runs, &notes);
                let whole = Piece::decode(&b, &[1; 16]).unwrap();
                let want: Vec<MapRun> = whole.runs().map(|r| r.unwrap()).collect();
                for slice in [1usize, 7, 20, 64, 129, 4096, 1 << 20] {
                    let (head, got) = stream(&b, slice).unwrap();
                    assert_eq!(got, want, "{kind:?} {runs} runs, slices of {slice}");
                    assert_eq!(head.header, whole.header);
                    assert_eq!(head.counters, whole.counters);
                    assert_eq!(head.notes, whole.notes);
                    assert_eq!((head.len, head.crc), (whole.len, whole.crc));
                    assert_eq!(head.run_count, runs);
                    assert_eq!(head.runs_offset(), whole.runs_offset());
                }
            }
        }
    }

    /// A flipped bit anywhere, in any slicing, is refused, as
    /// `Piece::decode` refuses it; so is a piece cut short.
    #[test]
    fn damage_is_refused_in_any_slicing() {
        let b = piece(PieceKind::Base, 300, &[]);
        for at in (0..b.len()).step_by(97).chain([68, 69, 71, 72, 127, 128]) {
            let mut bad = b.clone();
            bad[at] ^= 0x10;
            assert!(Piece::decode(&bad, &[1; 16]).is_err());
            for slice in [1usize, 20, 4096] {
                assert!(
                    stream(&bad, slice).is_err(),
                    "bit flip at {at}, slices of {slice}"
                );
            }
        }
        for cut in [0usize, 100, 128, 4000, b.len() - 1] {
            assert!(stream(&b[..cut], 1 << 20).is_err(), "cut at {cut}");
        }
        let mut other = PieceDecoder::new([2; 16]);
        assert!(matches!(
            other.feed(&b[..PIECE_HEADER_SIZE], |_| {}),
            Err(FormatError::WrongVolume { .. })
        ));
    }
}
