//! Recovery: follow the chain of records from the header's start to the
//! end of the log, and tell a torn tail from damage to durable records.
//!
//! Decision table for the position `pos` where record `seq` is expected
//! (tests/recovery.rs covers each row):
//!
//! | found                                                          | action                     |
//! |----------------------------------------------------------------|----------------------------|
//! | at `pos` a record of this log, seq `seq`, epoch >= the previous | apply, advance             |
//! |   record's and <= the header's, CRC ok, inside the area (v2:   |                            |
//! |   the epoch is the previous record's unless the record stores  |                            |
//! |   one; log id, seq and epoch are checked through the CRC)      |                            |
//! | sparse only: such a record at the next sector boundary         | apply there (a new group)  |
//! | such a record at the start of the area (the writer wrapped)    | apply there                |
//! | none of these                                                  | end of log at `pos`, `seq` |
//! | ... and a valid record of this log of a LATER group (group >   | error: Corrupt (durable    |
//! |   `seq`) lies after the end, before the log would wrap (v2:    | records would be lost)     |
//! |   the first record of such a group; `probe.rs`)                |                            |
//!
//! Why it is sound: a group is flushed before the next is written, so only
//! the last group can be incomplete; its records carry group <= `seq`, and
//! so does every record left behind by an older epoch's torn tail. The
//! epoch (+1 at every writable open, durable before the first append)
//! keeps such leftovers out of the chain: after a new epoch's records, an
//! older epoch's record is never taken as the next one. Version 2 records
//! store none of the log id, seq and epoch, and check all three through
//! their CRC's seed (`record_v2.rs` says why that is as safe).

use crate::error::{Result, WalError};
use crate::header::Header;
use crate::reader::Reader;
use crate::record::{self, RecordHeader, RECORD_HEADER_BYTES};
use crate::record_v2::{self, RecordHeaderV2};
use crate::{Layout, Lsn, RecordVersion};
use squeeze_engine::Volume;
use squeeze_format::SECTOR_SIZE;

const SECTOR: u64 = SECTOR_SIZE as u64;

pub use crate::End;

/// A record the chain took: what its header stores or implies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub seq: u64,
    pub epoch: u32,
    /// Seq of the first record of its group (v2: implied, and only known
    /// from the chain's first FIRST record on; 0 before).
    pub group: u64,
    pub header_bytes: usize,
    pub len: u32,
}

impl Found {
    pub fn record_bytes(&self) -> u64 {
        (self.header_bytes + self.len as usize) as u64
    }
}

/// Follows the chain from the header's start, calling `each` for every
/// record (with its epoch), and returns the end. Fails with `Corrupt` if
/// durable records lie beyond a damaged one.
pub fn scan(vol: &Volume, h: &Header, mut each: impl FnMut(Lsn, u32, &[u8])) -> Result<End> {
    let mut r = Reader::new(vol, h);
    let mut end = End {
        pos: h.start_pos,
        seq: h.start_seq,
        epoch: h.start_epoch,
    };
    let mut group = 0;
    loop {
        let mut found = None;
        for c in candidates(h, end.pos) {
            if let Some(f) = record_at(&mut r, h, c, end.seq, end.epoch, group)? {
                found = Some((c, f));
                break;
            }
        }
        let Some((at, f)) = found else { break };
        let bytes = r
            .bytes(at, f.record_bytes() as usize)?
            .expect("checked inside the area");
        each(
            Lsn {
                seq: f.seq,
                pos: at,
            },
            f.epoch,
            &bytes[f.header_bytes..],
        );
        end = End {
            pos: at + f.record_bytes(),
            seq: f.seq + 1,
            epoch: f.epoch,
        };
        group = f.group;
    }
    if let Some((at, seq)) = crate::probe::later_group_after(vol, &mut r, h, end)? {
        return Err(WalError::Corrupt(format!(
            "record {} at log position {} is damaged or missing, but record {seq} of a later \
             commit group (durable after it) follows at position {at}",
            end.seq, end.pos
        )));
    }
    Ok(end)
}

/// True if the valid record `lsn.seq` of this log, of epoch `epoch`, is at
/// `lsn.pos` (v1 records store their epoch: any epoch matches).
pub fn record_is_at(vol: &Volume, h: &Header, lsn: Lsn, epoch: u32) -> Result<bool> {
    let mut r = Reader::new(vol, h);
    let epoch = match h.version {
        RecordVersion::V1 => 0,
        RecordVersion::V2 => epoch,
    };
    Ok(record_at(&mut r, h, lsn.pos, lsn.seq, epoch, 0)?
        .is_some_and(|f| h.version == RecordVersion::V1 || f.epoch == epoch))
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
    c.retain(|&p| p + h.version.record_bytes_min() <= h.start_pos + h.area_bytes);
    c
}

/// The record at `pos` if it is the valid record `seq` of this log, of an
/// epoch from `min_epoch` (the previous record's) to the header's.
fn record_at(
    r: &mut Reader,
    h: &Header,
    pos: u64,
    seq: u64,
    min_epoch: u32,
    min_group: u64,
) -> Result<Option<Found>> {
    match h.version {
        RecordVersion::V1 => record_at_v1(r, h, pos, seq, min_epoch, min_group),
        RecordVersion::V2 => record_at_v2(r, h, pos, seq, min_epoch, min_group),
    }
}

fn record_at_v1(
    r: &mut Reader,
    h: &Header,
    pos: u64,
    seq: u64,
    min_epoch: u32,
    min_group: u64,
) -> Result<Option<Found>> {
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
    Ok(record::verify(b).then_some(Found {
        seq,
        epoch: rh.epoch,
        group: rh.group,
        header_bytes: RECORD_HEADER_BYTES,
        len: rh.len,
    }))
}

fn record_at_v2(
    r: &mut Reader,
    h: &Header,
    pos: u64,
    seq: u64,
    min_epoch: u32,
    group: u64,
) -> Result<Option<Found>> {
    let Some(flags) = r.bytes(pos, 1)?.map(|b| b[0]) else {
        return Ok(None);
    };
    let Some(n) = RecordHeaderV2::header_bytes_of(flags) else {
        return Ok(None);
    };
    let Some(b) = r.bytes(pos, n)? else {
        return Ok(None);
    };
    let Some(rh) = RecordHeaderV2::decode(b) else {
        return Ok(None);
    };
    let epoch = match rh.epoch {
        Some(e) if e < min_epoch || e > h.epoch => return Ok(None),
        Some(e) => e,
        None => min_epoch,
    };
    if rh.first.is_some_and(|s8| s8 != seq as u8) {
        return Ok(None);
    }
    if pos + rh.record_bytes() > h.start_pos + h.area_bytes {
        return Ok(None);
    }
    let Some(b) = r.bytes(pos, rh.record_bytes() as usize)? else {
        return Ok(None);
    };
    Ok(record_v2::verify(b, h.log_id, seq, epoch).then_some(Found {
        seq,
        epoch,
        group: if rh.first.is_some() { seq } else { group },
        header_bytes: n,
        len: rh.len,
    }))
}
