//! Recovery: follow the chain of records from the header's start to the
//! end of the log, and tell a torn tail from damage to durable records.
//!
//! Decision table for the position `pos` where record `seq` is expected
//! (tests/recovery.rs covers each row):
//!
//! | found                                                          | action                     |
//! |----------------------------------------------------------------|----------------------------|
//! | at `pos` a record of this log, seq `seq`, epoch >= the previous | apply, advance             |
//! |   record's and <= the header's, CRC ok, inside the area        |                            |
//! | sparse only: such a record at the next sector boundary         | apply there (a new group)  |
//! | such a record at the start of the area (the writer wrapped)    | apply there                |
//! | none of these                                                  | end of log at `pos`, `seq` |
//! | ... and a valid record of this log of a LATER group (group >   | error: Corrupt (durable    |
//! |   `seq`) lies after the end, before the log would wrap         | records would be lost)     |
//!
//! Why it is sound: a group is flushed before the next is written, so only
//! the last group can be incomplete; its records carry group <= `seq`, and
//! so does every record left behind by an older epoch's torn tail. The
//! epoch (+1 at every writable open, durable before the first append)
//! keeps such leftovers out of the chain: after a new epoch's records, an
//! older epoch's record is never taken as the next one.

use crate::error::{Result, WalError};
use crate::header::Header;
use crate::reader::Reader;
use crate::record::{verify, RecordHeader, RECORD_HEADER_BYTES, RECORD_MAGIC};
use crate::{Layout, Lsn};
use squeeze_engine::Volume;
use squeeze_format::SECTOR_SIZE;

const SECTOR: u64 = SECTOR_SIZE as u64;

/// Where the log ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct End {
    /// Position after the last record.
    pub pos: u64,
    /// Seq the next record gets.
    pub seq: u64,
    /// Epoch of the last record (0 if none).
    pub epoch: u32,
}

/// Follows the chain from the header's start, calling `each` for every
/// record, and returns the end. Fails with `Corrupt` if durable records lie
/// beyond a damaged one.
pub fn scan(vol: &Volume, h: &Header, mut each: impl FnMut(Lsn, &[u8])) -> Result<End> {
    let mut r = Reader::new(vol, h);
    let mut end = End {
        pos: h.start_pos,
        seq: h.start_seq,
        epoch: 0,
    };
    let mut group = 0;
    loop {
        let mut found = None;
        for c in candidates(h, end.pos) {
            if let Some(rh) = record_at(&mut r, h, c, end.seq, end.epoch, group)? {
                found = Some((c, rh));
                break;
            }
        }
        let Some((at, rh)) = found else { break };
        let bytes = r
            .bytes(at, rh.record_bytes() as usize)?
            .expect("checked inside the area");
        each(
            Lsn {
                seq: rh.seq,
                pos: at,
            },
            &bytes[RECORD_HEADER_BYTES..],
        );
        end = End {
            pos: at + rh.record_bytes(),
            seq: rh.seq + 1,
            epoch: rh.epoch,
        };
        group = rh.group;
    }
    if let Some((at, rh)) = later_group_after(vol, &mut r, h, end)? {
        return Err(WalError::Corrupt(format!(
            "record {} at log position {} is damaged or missing, but record {} of a later \
             commit group (durable after it) follows at position {at}",
            end.seq, end.pos, rh.seq
        )));
    }
    Ok(end)
}

/// True if the valid record `lsn.seq` of this log is at `lsn.pos`.
pub fn record_is_at(vol: &Volume, h: &Header, lsn: Lsn) -> Result<bool> {
    let mut r = Reader::new(vol, h);
    Ok(record_at(&mut r, h, lsn.pos, lsn.seq, 0, 0)?.is_some())
}

/// Where record `seq` may start when the previous one ended at `pos`.
fn candidates(h: &Header, pos: u64) -> Vec<u64> {
    let mut c = vec![pos];
    if h.layout == Layout::Sparse && !pos.is_multiple_of(SECTOR) {
        c.push(pos.next_multiple_of(SECTOR));
    }
    let wrap = pos.next_multiple_of(h.area_bytes);
    if !c.contains(&wrap) {
        c.push(wrap);
    }
    // The live log never spans more than the area.
    c.retain(|&p| p + RECORD_HEADER_BYTES as u64 <= h.start_pos + h.area_bytes);
    c
}

/// The record at `pos` if it is the valid record `seq` of this log.
fn record_at(
    r: &mut Reader,
    h: &Header,
    pos: u64,
    seq: u64,
    min_epoch: u32,
    min_group: u64,
) -> Result<Option<RecordHeader>> {
    let Some(b) = r.bytes(pos, RECORD_HEADER_BYTES)? else {
        return Ok(None);
    };
    let Some(rh) = RecordHeader::decode(b) else {
        return Ok(None);
    };
    if rh.log_id != h.log_id
        || rh.seq != seq
        || rh.epoch < min_epoch
        || rh.epoch > h.epoch
        || rh.group < min_group
        || pos + rh.record_bytes() > h.start_pos + h.area_bytes
    {
        return Ok(None);
    }
    let Some(b) = r.bytes(pos, rh.record_bytes() as usize)? else {
        return Ok(None);
    };
    Ok(verify(b).then_some(rh))
}

/// A valid record of this log of a group later than `end.seq` anywhere in
/// the mapped part of the area after the end (one lap), if there is one.
fn later_group_after(
    vol: &Volume,
    r: &mut Reader,
    h: &Header,
    end: End,
) -> Result<Option<(u64, RecordHeader)>> {
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
                if let Some(found) = probe_run(r, h, end, at, run)? {
                    return Ok(Some(found));
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

fn probe_run(
    r: &mut Reader,
    h: &Header,
    end: End,
    from: u64,
    len: u64,
) -> Result<Option<(u64, RecordHeader)>> {
    let magic = RECORD_MAGIC.to_le_bytes();
    let mut at = from;
    while at < from + len {
        let n = (from + len - at).min(crate::reader::WINDOW_BYTES);
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
                if verify(b) {
                    return Ok(Some((p, rh)));
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
