//! Reading a checkpoint piece back (the layout is in the parent module):
//! its header checked field by field (`decode_fixed`), its counters and
//! notes, its runs (`RunCheck`), the CRC over the whole piece first, and
//! the order of a chain's pieces (`ChainOrder`, `pieces`). Bytes from disk
//! never panic: every fault is a typed `FormatError`.

use super::{
    decode_run, piece_crc, runs_offset, MapRun, PieceHeader, PieceKind, SegmentNote,
    CHECKPOINT_MAGIC, MAX_COUNTERS, MAX_NOTES, NOTE_BYTES, OLDEST_VERSION, PIECE_ALIGN,
    PIECE_HEADER_SIZE, RUN_BYTES, VERSION,
};
use crate::le::{get_u32, get_u64};
use crate::FormatError;

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
        if let Some(t) = r.first.target() {
            // Indirect: consecutive hidden addresses, all of them hidden.
            if !crate::map_entry::is_shared(t + u64::from(r.sectors) - 1) {
                return bad("runs past the hidden addresses");
            }
        } else if r.first.is_mapped() {
            if u64::from(r.first.index()) + u64::from(r.sectors) > u64::from(r.first.sectors()) {
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
mod tests {
    use super::super::tests::{header, run};
    use super::*;
    use crate::checkpoint::PieceWriter;
    use crate::le::put_u32;

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
