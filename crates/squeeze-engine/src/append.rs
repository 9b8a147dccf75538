//! The log append: reservation (a seq and an offset for each record,
//! opening and allocating segments, under the log lock), the record
//! headers, the positional write of each contiguous run, the map install,
//! and the flush that makes appended records durable.
//!
//! append: reserve (log lock) -> write the records (no lock) -> install in
//!         the map (map lock) -> complete the ticket
//! flush:  wait for every ticket issued before it -> sync
//!
//! A failed write installs nothing and turns the volume read-only; a
//! failed reservation changes nothing (`NoSpace`: the caller may make room,
//! `space::make_room::append_making_room`).

use crate::counters::{Counter, Counters};
use crate::error::{EngineError, Internal, NoSpace, Result};
use crate::meta::pager;
use crate::meta::{checkpoint, flush_marks};
use crate::pipeline::compress::{Item, Outcome};
use crate::space::ahead::ALLOC_STEP;
use crate::space::{SegState, SegmentId};
use crate::state::Inner;
use squeeze_format::{
    checksum, CodecId, HeaderForm, RecordHeader, RecordKind, RECORD_ALIGN, RECORD_HEADER_SIZE,
    SECTOR_SIZE,
};
use std::sync::atomic::Ordering;

const SECTOR: u64 = SECTOR_SIZE as u64;

/// Whose log append this is: client data must leave room for what frees
/// space (trims, the cleaner's relocations and checkpoints).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    /// Client data: keeps CLEANER_RESERVE_SEGMENTS free beyond a checkpoint's needs.
    Data,
    /// Trims and write-zeroes: may use the cleaner's reserve.
    Reserve,
    /// The cleaner's relocations.
    Cleaner,
    /// The merger's rewrites: room as for client data (they never eat the
    /// cleaner's reserve), counted apart from client data.
    Merge,
    /// Deduplication's shared content and Links: room as for client data,
    /// counted apart from it.
    Dedup,
}

/// Segments client data leaves free for the cleaner and for trims.
pub const CLEANER_RESERVE_SEGMENTS: u64 = 2;

impl Room {
    pub(crate) fn extra_segments(self) -> u64 {
        match self {
            Room::Data | Room::Merge | Room::Dedup => 1 + CLEANER_RESERVE_SEGMENTS,
            Room::Reserve | Room::Cleaner => 1,
        }
    }
}

/// One slot of a log reservation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    pub offset: u64,
    pub seq: u64,
    /// `None` for a segment header the reservation inserted.
    pub item: Option<usize>,
    pub segment: SegmentId,
}

pub(crate) fn segment_header(uuid: &[u8; 16], seq: u64, segment: SegmentId) -> RecordHeader {
    RecordHeader {
        kind: RecordKind::SegmentHeader,
        codec: CodecId::None,
        seq,
        uuid: *uuid,
        lba: 0,
        sectors: 0,
        stored_len: 0,
        aux: u64::from(segment),
        payload_crc: 0,
        chunk_sectors: 0,
        block: false,
        form: HeaderForm::Full,
    }
}

/// The payload CRC an item's record carries (0 for zero records).
fn payload_crc(item: &Item, buf: &[u8]) -> u32 {
    match item {
        Item::Zero { .. } | Item::Link { .. } => 0,
        _ => item.known_crc().unwrap_or_else(|| {
            let p = item.payload(buf);
            debug_assert_eq!(p.chunk_sectors, 0, "a chunked payload knows its CRC");
            checksum::crc32c(p.body)
        }),
    }
}

/// An item's record header; `payload_crc` from [`payload_crc`], computed
/// once per append outside every lock. `short`: the volume is in format 4,
/// so the header is short where its fields fit one.
fn item_header(
    uuid: &[u8; 16],
    item: &Item,
    buf: &[u8],
    seq: u64,
    payload_crc: u32,
    short: bool,
) -> RecordHeader {
    // Zero records carry no payload; a relocation names the record it
    // copies (aux), an extent nothing.
    let (kind, lba, sectors, aux) = match item {
        Item::Zero { lba, sectors } => (RecordKind::Zero, *lba, *sectors as u32, 0),
        Item::Moved {
            lba, sectors, from, ..
        } => (RecordKind::Relocate, *lba, *sectors, *from),
        Item::Blob { lba, sectors, .. } => (RecordKind::Extent, *lba, *sectors, 0),
        Item::Link {
            lba,
            sectors,
            target,
        } => (RecordKind::Link, *lba, *sectors, *target),
    };
    let payload = item.payload(buf);
    let stored_len = payload.len() as u32;
    RecordHeader {
        kind,
        codec: payload.codec,
        seq,
        uuid: *uuid,
        lba,
        sectors,
        stored_len,
        aux,
        payload_crc,
        chunk_sectors: payload.chunk_sectors,
        block: payload.block,
        form: HeaderForm::choose(short, kind, lba, sectors, stored_len, aux),
    }
}

/// Bytes `item` would occupy in the log if appended now.
pub(crate) fn record_len(inner: &Inner, item: &Item, buf: &[u8]) -> u64 {
    let short = inner.short_records.load(Ordering::Acquire);
    item_header(&inner.uuid, item, buf, 0, 0, short).record_len()
}

/// Appends encoded items to the log and installs them in the map.
pub(crate) fn append(inner: &Inner, items: &[Item], buf: &[u8], room: Room) -> Result<()> {
    // Short headers only once the superblock says format 4 (durably:
    // a checkpoint sets it, and never back), so that no build that
    // reads only full headers opens a log holding short ones.
    let short = inner.short_records.load(Ordering::Acquire);
    let lens: Vec<u64> = items
        .iter()
        .map(|it| item_header(&inner.uuid, it, buf, 0, 0, short).record_len())
        .collect();
    let crcs: Vec<u32> = items.iter().map(|it| payload_crc(it, buf)).collect();
    let (placements, ticket) = reserve(inner, &lens, room)?;
    let result = write_placements(inner, items, buf, &crcs, &placements, short);
    if let Err(e) = result {
        inner.poison(&e);
        inner.tickets.complete(ticket);
        return Err(e);
    }
    let installed = {
        let mut st = inner.state.write();
        let mut installed = Ok(());
        for p in placements.iter() {
            let Some(i) = p.item else { continue };
            let h = item_header(&inner.uuid, &items[i], buf, p.seq, crcs[i], short);
            // A chunk paged out is paged in here, under the lock; if
            // that fails the volume has turned read-only, and replay
            // installs the records written.
            if let Err(e) =
                pager::with_map_mut(inner, &mut st, |st| st.apply(&h, p.offset, inner.seg_size))
            {
                installed = Err(e);
                break;
            }
            if let Item::Blob {
                sectors,
                below_target: true,
                ..
            }
            | Item::Moved {
                sectors,
                below_target: true,
                ..
            } = &items[i]
            {
                st.usage
                    .note_below_target(p.segment, u64::from(*sectors) * SECTOR);
            }
            if let Item::Blob {
                sectors,
                outcome: Outcome::Compressed,
                ..
            }
            | Item::Moved {
                sectors,
                unsqueezed: true,
                ..
            } = &items[i]
            {
                st.usage
                    .note_unsqueezed(p.segment, u64::from(*sectors) * SECTOR);
            }
            if let Item::Blob {
                sectors,
                outcome: Outcome::Deferred,
                ..
            } = &items[i]
            {
                st.usage
                    .note_burst_raw(p.segment, u64::from(*sectors) * SECTOR);
            }
        }
        installed
    };
    inner.tickets.complete(ticket);
    installed?;
    let c = &inner.counters;
    for (it, len) in items.iter().zip(&lens) {
        match it {
            Item::Zero { .. } => {}
            Item::Link { sectors, .. } => c.add(Counter::DedupLinkedSectors, u64::from(*sectors)),
            Item::Moved { recompressed, .. } => {
                c.add(Counter::CleanerBytesMoved, *len);
                c.add(Counter::RecompressedBlobs, u64::from(*recompressed));
            }
            Item::Blob {
                sectors,
                outcome,
                below_target,
                ..
            } => {
                let raw = u64::from(*sectors) * SECTOR;
                if *below_target {
                    c.add(Counter::BelowTargetBytes, raw);
                }
                let payload = it.payload(buf);
                if room == Room::Merge {
                    c.add(Counter::MergedSectors, u64::from(*sectors));
                    c.add(Counter::MergedBytes, *len);
                } else if room == Room::Dedup {
                    c.add(Counter::DedupSharedWrites, u64::from(*sectors));
                } else {
                    c.add(Counters::codec_bytes(payload.codec), raw);
                    c.add(Counter::ClientBytesCompressed, *len);
                }
                match outcome {
                    Outcome::Compressed => {
                        c.add(Counter::BlobsCompressed, 1);
                        c.add(Counter::RawIn, raw);
                        c.add(Counter::StoredOut, payload.len() as u64);
                    }
                    Outcome::Rejected => c.add(Counter::BlobsRejected, 1),
                    Outcome::Skipped | Outcome::NotTried => c.add(Counter::BlobsSkipped, 1),
                    Outcome::Deferred => c.add(Counter::BurstRawBytes, raw),
                }
            }
        }
    }
    Ok(())
}

/// Encodes the records of a reservation and writes each contiguous run
/// with one positional write: the headers, the payloads where the codec
/// left them and the padding, gathered without a copy
/// (`Storage::write_parts_at`).
fn write_placements(
    inner: &Inner,
    items: &[Item],
    buf: &[u8],
    crcs: &[u32],
    placements: &[Placement],
    short: bool,
) -> Result<()> {
    static PAD: [u8; RECORD_ALIGN as usize] = [0; RECORD_ALIGN as usize];
    let mut headers = vec![0u8; placements.len() * RECORD_HEADER_SIZE];
    let mut header_lens = Vec::with_capacity(placements.len());
    for (p, h) in placements
        .iter()
        .zip(headers.chunks_exact_mut(RECORD_HEADER_SIZE))
    {
        let header = match p.item {
            None => segment_header(&inner.uuid, p.seq, p.segment),
            Some(i) => item_header(&inner.uuid, &items[i], buf, p.seq, crcs[i], short),
        };
        header.encode(h);
        header_lens.push(header.header_len());
    }
    let mut parts: Vec<&[u8]> = Vec::with_capacity(placements.len() * 4);
    let (mut run_start, mut run_end, mut total) = (0u64, 0u64, 0u64);
    for ((p, h), &header_len) in placements
        .iter()
        .zip(headers.chunks_exact(RECORD_HEADER_SIZE))
        .zip(&header_lens)
    {
        let h = &h[..header_len];
        if !parts.is_empty() && run_end != p.offset {
            inner.storage.write_parts_at(&parts, run_start)?;
            total += run_end - run_start;
            parts.clear();
        }
        if parts.is_empty() {
            (run_start, run_end) = (p.offset, p.offset);
        }
        parts.push(h);
        let mut len = header_len as u64;
        if let Some(i) = p.item {
            let payload = items[i].payload(buf);
            for part in [payload.table, payload.body] {
                if !part.is_empty() {
                    parts.push(part);
                }
            }
            len = squeeze_format::align_record(len + payload.len() as u64);
            let pad = (len - header_len as u64) as usize - payload.len();
            if pad > 0 {
                parts.push(&PAD[..pad]);
            }
        }
        run_end += len;
    }
    if !parts.is_empty() {
        inner.storage.write_parts_at(&parts, run_start)?;
        total += run_end - run_start;
    }
    inner.counters.add(Counter::LogBytes, total);
    Ok(())
}

/// Makes every record appended before the call durable. Two stages,
/// pipelined across concurrent flushes: the write-out of staged log
/// bytes, then one fdatasync for every group written out before it,
/// followed by a flush mark (`meta::flush_marks`) saying how far the
/// log is durable.
pub(crate) fn flush(inner: &Inner) -> Result<()> {
    inner.check_not_poisoned()?;
    let target = inner.tickets.issued();
    inner.tickets.wait_below(target);
    // Stage 1: every record of a ticket below `target` reaches the file.
    write_out_below(inner, target)?;
    // Stage 2: one fdatasync makes durable every write that completed
    // before it began: all that stage 1 reported written when it starts.
    // While it runs, the next group's stage 1 writes out (pipelined:
    // docs/ARCHITECTURE.md, "Flush, pipelined").
    let mut synced = inner.sync_lock.lock();
    if synced.ticket >= target {
        // An earlier group's fdatasync covered this flush: its mark may
        // still be being written (after that group let the lock go).
        // Wait for it, so no flush returns before a mark covers it.
        drop(synced);
        wait_for_marks(inner);
        return Ok(());
    }
    // A failed fdatasync before this one may have dropped written pages,
    // and the file reports that error once: a later fdatasync returns
    // Ok over the loss. The flush that met it poisoned the volume before
    // letting go of the lock, so this one fails too.
    inner.check_not_poisoned()?;
    let upto = inner.written.load(Ordering::Acquire);
    // Stored only after its write-out completed, so whatever this reads
    // was written before the fdatasync below begins.
    let upto_seq = *inner.written_seq.lock();
    if let Err(e) = inner.storage.sync_written() {
        let e = EngineError::Io(e);
        inner.poison(&e);
        return Err(e);
    }
    synced.ticket = upto;
    let mark = flush_marks::next(&inner.uuid, &mut synced, upto_seq);
    // The next group's fdatasync need not wait for this mark's write;
    // flushes this fdatasync covered wait for it (`marks_in_flight`).
    let Some(m) = mark else {
        // An earlier mark claims as much; it may still be in flight.
        drop(synced);
        wait_for_marks(inner);
        inner.counters.add(Counter::Flushes, 1);
        return Ok(());
    };
    *inner.marks_in_flight.0.lock() += 1;
    drop(synced);
    let written = flush_marks::write(&*inner.storage, &m);
    {
        let (n, cv) = &inner.marks_in_flight;
        *n.lock() -= 1;
        cv.notify_all();
    }
    if let Err(e) = written {
        let e = EngineError::Io(e);
        inner.poison(&e);
        return Err(e);
    }
    inner.counters.add(Counter::Flushes, 1);
    Ok(())
}

/// Hands every record appended before the call to the backing file (the
/// write-behind pool's staged bytes are written out), not durably: a kill
/// of this process no longer loses them, a crash of the machine may until
/// the next flush. The first stage of [`flush`] alone; concurrent callers
/// share one write-out.
pub(crate) fn write_out(inner: &Inner) -> Result<()> {
    inner.check_not_poisoned()?;
    let target = inner.tickets.issued();
    inner.tickets.wait_below(target);
    write_out_below(inner, target)
}

/// Every record of a ticket below `target` (all complete) reaches the file,
/// taking along whatever completed meanwhile; nothing to do when an
/// earlier write-out already covered `target`.
fn write_out_below(inner: &Inner, target: u64) -> Result<()> {
    let _w = inner.write_out_lock.lock();
    inner.check_not_poisoned()?;
    if inner.written.load(Ordering::Acquire) < target {
        // Tickets are issued under the log lock in seq order: every
        // record of a ticket below `upto` has a seq below `upto_seq`.
        let (upto, upto_seq, upto_end) = {
            let log = inner.log.lock();
            (inner.tickets.issued(), log.next_seq, log.head_offset)
        };
        inner.tickets.wait_below(upto);
        if let Err(e) = inner.storage.write_out() {
            let e = EngineError::Io(e);
            inner.poison(&e);
            return Err(e);
        }
        *inner.written_seq.lock() = (upto_seq, upto_end);
        inner.written.store(upto, Ordering::Release);
    }
    Ok(())
}

/// Waits until no flush mark is being written (`marks_in_flight`).
fn wait_for_marks(inner: &Inner) {
    let (n, cv) = &inner.marks_in_flight;
    let mut n = n.lock();
    while *n > 0 {
        cv.wait(&mut n);
    }
}

/// Reserves log space for records of the given lengths: assigns each a
/// seq and an offset, opening (and allocating) new segments as needed.
pub(crate) fn reserve(inner: &Inner, lens: &[u64], room: Room) -> Result<(Vec<Placement>, u64)> {
    let mut log = inner.log.lock();
    inner.check_not_poisoned()?;
    let step = ALLOC_STEP.min(inner.seg_size);
    // A new head segment gets half of the allocation ahead at once (one
    // fallocate where the writers would otherwise race the allocator
    // thread through the first steps); the allocator extends it.
    let first_alloc = if inner.allocate_ahead {
        crate::space::ahead::ALLOC_AHEAD / 2
    } else {
        0
    };
    // Dry run: how far into the head segment, how many new segments and
    // how much of each.
    let mut pos = log.head_offset;
    let mut end = inner.segment_end(log.head_segment);
    let mut head_need = log.head_offset;
    let mut new_used: Vec<u64> = Vec::new();
    for &len in lens {
        if pos + len > end {
            new_used.push(RECORD_HEADER_SIZE as u64);
            pos = inner.segment_offset(0) + RECORD_HEADER_SIZE as u64; // any fresh segment start
            end = inner.segment_end(0);
        }
        pos += len;
        match new_used.last_mut() {
            Some(u) => *u += len,
            None => head_need = pos,
        }
    }
    let new_segments = new_used.len() as u64;
    if !log.head_in_segment(inner.seg_size) {
        return Err(inner.internal(Internal::HeadOutsideSegment {
            head_offset: log.head_offset,
            segment: log.head_segment,
        }));
    }
    if head_need > log.allocated_end {
        let to = (head_need.div_ceil(step) * step).min(inner.segment_end(log.head_segment));
        inner
            .storage
            .allocate(log.allocated_end, to - log.allocated_end)
            .map_err(|e| inner.storage_failed(e))?;
        log.allocated_end = to;
    }
    let mut fresh = Vec::new();
    // How much of the last new segment got allocated.
    let mut last_alloc_end = None;
    if new_segments > 0 {
        let extra_chunks = lens.len() as u64 * 2 + 2;
        let reserve = checkpoint::segments_needed(inner, extra_chunks) + room.extra_segments();
        if log.table.available() < new_segments + reserve {
            return Err(EngineError::NoSpace(NoSpace::Segments {
                free: log.table.available(),
                needed: new_segments,
                reserve,
            }));
        }
        for used in &new_used {
            let s = log.table.pick_free().expect("available segment");
            let off = inner.segment_offset(s);
            let need = (used.div_ceil(step) * step).min(inner.seg_size);
            let n = need.max(first_alloc).min(inner.seg_size);
            // On a nearly full disk, what the records need may still fit.
            let allocated = match inner.storage.allocate(off, n) {
                Err(_) if n > need => inner.storage.allocate(off, need).map(|()| need),
                r => r.map(|()| n),
            };
            match allocated {
                Ok(n) => last_alloc_end = Some(n),
                Err(e) => {
                    for f in fresh {
                        log.table.set(f, SegState::Free);
                    }
                    return Err(inner.storage_failed(e));
                }
            }
            log.table.set(s, SegState::Log { opened_seq: 0 });
            fresh.push(s);
        }
    }
    let mut placements = Vec::with_capacity(lens.len() + fresh.len());
    let mut fresh = fresh.into_iter();
    let mut total = 0;
    for (i, &len) in lens.iter().enumerate() {
        if log.head_offset + len > inner.segment_end(log.head_segment) {
            let s = fresh.next().expect("segment reserved");
            let seq = log.next_seq;
            log.next_seq += 1;
            log.table.set(s, SegState::Log { opened_seq: seq });
            let off = inner.segment_offset(s);
            placements.push(Placement {
                offset: off,
                seq,
                item: None,
                segment: s,
            });
            log.head_segment = s;
            log.head_offset = off + RECORD_HEADER_SIZE as u64;
            total += RECORD_HEADER_SIZE as u64;
        }
        placements.push(Placement {
            offset: log.head_offset,
            seq: log.next_seq,
            item: Some(i),
            segment: log.head_segment,
        });
        log.next_seq += 1;
        log.head_offset += len;
        total += len;
    }
    let head_start = inner.segment_offset(log.head_segment);
    if let Some(n) = last_alloc_end {
        log.allocated_end = head_start + n;
    }
    if inner.allocate_ahead {
        crate::space::ahead::maybe_request(inner, &mut log);
    }
    log.bytes_since_checkpoint += total;
    let ticket = inner.tickets.issue();
    Ok((placements, ticket))
}
