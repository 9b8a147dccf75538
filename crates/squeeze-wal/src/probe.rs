//! The probe after recovery's end: is there a valid record of this log of
//! a LATER commit group (its group's first seq > the end's seq) in the
//! mapped part of the area after the end, before the log would wrap? If
//! so, a durable record was damaged (groups are flushed one after the
//! other, so a later group is durable only if every earlier one is), and
//! opening must fail rather than drop it and what follows.
//!
//! Where the probe looks: the mapped runs of one lap after the end. The
//! sectors before the header's start are trimmed at truncation and the
//! area past the tail was never written or was trimmed, so in a healthy
//! log these runs are the tail's sector and the head's: the probe costs
//! little unless there is something to find.
//!
//! - **v1**: every offset where the record magic appears; the header says
//!   the record's log, seq, group and epoch, then the CRC.
//! - **v2**: a record stores no seq; the first record of each group
//!   (FIRST) stores the seq's low 8 bits. A group holds at most 255
//!   records (`GROUP_RECORDS_MAX`), so the group after the one the
//!   end's record belongs to starts within 255 seqs above it: the probe
//!   looks for that group's FIRST record. At every offset where a FIRST
//!   header could start (sparse: sector boundaries, where every group
//!   starts; dense: every byte whose flags are a FIRST record's), it takes
//!   the one seq above the end's with those low bits, and each epoch from
//!   the end record's to the header's (one, or a few: the log's opens
//!   since that record), and checks the CRC with that seed. What v1's
//!   probe could do and v2's cannot: find a later group whose first record
//!   is damaged too (v1 read any record's group; v2 needs the first
//!   record of the next group, or of a later one within 255 seqs).
//!
//! Why no false alarm: a torn group's records carry group <= the end's seq
//! (v2: its only FIRST record is its first, which is either in the chain
//! or torn), older epochs' leftovers too, and a record of an earlier lap
//! or of the consumed prefix has a seq below the head's: none is a FIRST
//! record of seq > S with a matching CRC (v2) or a group > S (v1).
//!
//! Cost (v2): one CRC per FIRST-looking offset and epoch tried. In a
//! healthy log that is the head sector's consumed prefix (a few dozen
//! offsets in a dense log, one in a sparse one), times the opens since
//! the last record was written (each open bumps the epoch).

use crate::error::Result;
use crate::header::Header;
use crate::reader::{Reader, WINDOW_BYTES};
use crate::record::{self, RecordHeader, RECORD_HEADER_BYTES, RECORD_MAGIC};
use crate::record_v2::{self, RecordHeaderV2, FLAG_FIRST, HEADER_BYTES_MAX, HEADER_BYTES_MIN};
use crate::{End, Layout, RecordVersion};
use squeeze_engine::Volume;
use squeeze_format::SECTOR_SIZE;

const SECTOR: u64 = SECTOR_SIZE as u64;

/// A valid record of this log of a group later than `end.seq` anywhere in
/// the mapped part of the area after the end (one lap), if there is one:
/// its position and seq.
pub fn later_group_after(
    vol: &Volume,
    r: &mut Reader,
    h: &Header,
    end: End,
) -> Result<Option<(u64, u64)>> {
    let lap_end = h.start_pos + h.area_bytes;
    let mut pos = end.pos;
    while pos < lap_end {
        let off = r.offset(pos);
        let len = (h.area_bytes - off).min(lap_end - pos);
        // Mapped runs only: the unwritten and trimmed area reads as holes.
        let runs = vol.block_status(h.area_start + off, len, 4096)?;
        let mut at = pos;
        for (run, hole) in runs {
            if !hole {
                let found = match h.version {
                    RecordVersion::V1 => probe_run_v1(r, h, end, at, run)?,
                    RecordVersion::V2 => probe_run_v2(r, h, end, at, run)?,
                };
                if found.is_some() {
                    return Ok(found);
                }
            }
            at += run;
        }
        if at < pos + len {
            // More runs than asked for: go on from where they stopped.
            pos = at;
            continue;
        }
        pos += len;
    }
    Ok(None)
}

fn probe_run_v1(
    r: &mut Reader,
    h: &Header,
    end: End,
    from: u64,
    len: u64,
) -> Result<Option<(u64, u64)>> {
    let magic = RECORD_MAGIC.to_le_bytes();
    let mut at = from;
    while at < from + len {
        let n = (from + len - at).min(WINDOW_BYTES);
        let hits: Vec<u64> = {
            let Some(b) = r.bytes(at, n as usize)? else {
                break;
            };
            b.windows(4)
                .enumerate()
                .filter(|(_, w)| *w == magic)
                .map(|(i, _)| at + i as u64)
                .collect()
        };
        for p in hits {
            let Some(b) = r.bytes(p, RECORD_HEADER_BYTES)? else {
                continue;
            };
            let Some(rh) = RecordHeader::decode(b) else {
                continue;
            };
            if rh.log_id != h.log_id || rh.group <= end.seq || rh.epoch > h.epoch {
                continue;
            }
            if let Some(b) = r.bytes(p, rh.record_bytes() as usize)? {
                if record::verify(b) {
                    return Ok(Some((p, rh.seq)));
                }
            }
        }
        if at + n >= from + len {
            break;
        }
        // Overlap by the magic's length less one: a magic across windows.
        at += n - 3;
    }
    Ok(None)
}

/// A FIRST header found by the probe: its position and what it stores.
struct Hit {
    pos: u64,
    rh: RecordHeaderV2,
}

fn probe_run_v2(
    r: &mut Reader,
    h: &Header,
    end: End,
    from: u64,
    len: u64,
) -> Result<Option<(u64, u64)>> {
    let lap_end = h.start_pos + h.area_bytes;
    let step = match h.layout {
        Layout::Sparse => SECTOR,
        Layout::Dense => 1,
    };
    let mut at = from;
    while at < from + len {
        let n = (from + len - at).min(WINDOW_BYTES);
        let hits: Vec<Hit> = {
            let Some(b) = r.bytes(at, n as usize)? else {
                break;
            };
            let mut hits = Vec::new();
            let mut p = at.next_multiple_of(step);
            while p < at + n {
                let i = (p - at) as usize;
                if b[i] & FLAG_FIRST != 0 {
                    if let Some(rh) = RecordHeaderV2::decode(&b[i..]) {
                        if p + rh.record_bytes() <= lap_end {
                            hits.push(Hit { pos: p, rh });
                        }
                    }
                }
                p += step;
            }
            hits
        };
        for hit in hits {
            if let Some(seq) = check_hit(r, h, end, &hit)? {
                return Ok(Some((hit.pos, seq)));
            }
        }
        if at + n >= from + len {
            break;
        }
        // Overlap by a header's length less one: a header across windows.
        at += n - (HEADER_BYTES_MAX as u64 - 1);
    }
    Ok(None)
}

/// The seq of the record at `hit` if it is a valid FIRST record of this log
/// of the group after the end's (its seq within `GROUP_RECORDS_MAX` above
/// `end.seq`), of an epoch from `end.epoch` to the header's.
fn check_hit(r: &mut Reader, h: &Header, end: End, hit: &Hit) -> Result<Option<u64>> {
    let s8 = hit.rh.first.expect("FIRST records only");
    let seq = end.seq + 1 + u64::from(s8.wrapping_sub((end.seq + 1) as u8));
    // Records end.seq .. seq-1 lie between the end and the hit.
    if seq - end.seq > (hit.pos - end.pos) / HEADER_BYTES_MIN as u64 {
        return Ok(None);
    }
    let epochs = match hit.rh.epoch {
        Some(e) if e < end.epoch || e > h.epoch => return Ok(None),
        Some(e) => e..=e,
        None => end.epoch..=h.epoch,
    };
    let Some(b) = r.bytes(hit.pos, hit.rh.record_bytes() as usize)? else {
        return Ok(None);
    };
    for epoch in epochs {
        if record_v2::verify(b, h.log_id, seq, epoch) {
            return Ok(Some(seq));
        }
    }
    Ok(None)
}
