//! The read path: map lookup (under the map lock and the reclaim gate) ->
//! record read (consecutive records in one read) -> header and payload
//! checksums -> decompress. Holes read as zeros.

use crate::counters::Counter;
use crate::error::{EngineError, Result};
use crate::meta::pager;
use crate::state::Inner;
use squeeze_format::{CodecId, MapEntry, RecordHeader, RECORD_ALIGN, SECTOR_SIZE};

const SECTOR: u64 = SECTOR_SIZE as u64;

thread_local! {
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static RAW_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static SPAN_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most bytes one read fetches for consecutive records.
const READ_SPAN_MAX: u64 = 4 << 20;
/// Requests from this size on read their records as a stream
/// (`Storage::read_stream`).
const READ_STREAM_MIN: usize = 64 << 10;

/// Reads the sectors `out` covers from the record `e` points at (the first
/// of them is `lba`, at index `e.index()` of the record).
/// With `stream`, through `Storage::read_stream`.
pub(crate) fn read_extent(
    inner: &Inner,
    e: MapEntry,
    lba: u64,
    out: &mut [u8],
    stream: bool,
) -> Result<()> {
    READ_BUF.with_borrow_mut(|rec| {
        rec.resize(e.record_len() as usize, 0);
        read_log(inner, rec, e.record_offset(), stream)?;
        decode_extent(inner, e, lba, rec, out)
    })
}

/// Reads log bytes: as a stream (`Storage::read_stream`) or through the
/// page cache.
fn read_log(inner: &Inner, buf: &mut [u8], offset: u64, stream: bool) -> Result<()> {
    if stream {
        inner.storage.read_stream(buf, offset)?;
    } else {
        inner.storage.read_at(buf, offset)?;
    }
    Ok(())
}

/// Checks the record `rec` (the `e.record_len()` bytes at `e.record_offset()`)
/// against `e` and its checksums, and decodes the sectors `out` covers.
fn decode_extent(inner: &Inner, e: MapEntry, lba: u64, rec: &[u8], out: &mut [u8]) -> Result<()> {
    let corrupt = |source| {
        inner.counters.add(Counter::ChecksumErrors, 1);
        EngineError::Corrupt { lba, source }
    };
    let h = RecordHeader::decode(rec, &inner.uuid).map_err(corrupt)?;
    let expect_lba = lba - u64::from(e.index());
    if h.uuid != inner.uuid
        || !h.kind.has_payload()
        || h.lba != expect_lba
        || h.sectors != e.sectors()
        || h.record_len() != e.record_len()
    {
        return Err(corrupt(squeeze_format::FormatError::Invalid {
            what: "record",
            why: format!(
                "map points at a record for LBA {} x{} ({:?}), expected LBA {expect_lba} x{}",
                h.lba,
                h.sectors,
                h.kind,
                e.sectors()
            ),
        }));
    }
    let payload = &rec[h.header_len()..h.header_len() + h.stored_len as usize];
    squeeze_format::record::verify_payload(&h, payload).map_err(corrupt)?;
    let first = e.index() as usize * SECTOR_SIZE;
    if h.codec == CodecId::None {
        out.copy_from_slice(&payload[first..first + out.len()]);
        return Ok(());
    }
    // Monotonic time around the codec call (see squeeze_codec::run_job).
    let t0 = std::time::Instant::now();
    let res = if first == 0 && out.len() == h.raw_len() {
        squeeze_codec::decompress(h.codec, payload, out)
    } else {
        RAW_BUF.with_borrow_mut(|raw| {
            raw.resize(h.raw_len(), 0);
            let r = squeeze_codec::decompress(h.codec, payload, raw);
            if r.is_ok() {
                out.copy_from_slice(&raw[first..first + out.len()]);
            }
            r
        })
    };
    inner.counters.add(
        Counter::DecompressNs,
        u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX),
    );
    res.map_err(|source| {
        inner.counters.add(Counter::ChecksumErrors, 1);
        EngineError::Codec { lba, source }
    })
}

/// Reads `buf.len()` bytes at byte `offset`. Returns true when every
/// sector of the range is a hole (a structured NBD READ then answers
/// OFFSET_HOLE), from the same map walk as the read.
pub(crate) fn read(inner: &Inner, offset: u64, buf: &mut [u8]) -> Result<bool> {
    inner.check_range(offset, buf.len() as u64)?;
    if buf.is_empty() {
        return Ok(false);
    }
    let first = offset / SECTOR;
    let last = (offset + buf.len() as u64).div_ceil(SECTOR);
    let all_hole = if offset.is_multiple_of(SECTOR) && buf.len().is_multiple_of(SECTOR_SIZE) {
        read_sectors_mapped(inner, first, buf)?
    } else {
        let mut tmp = vec![0u8; ((last - first) * SECTOR) as usize];
        let all_hole = read_sectors_mapped(inner, first, &mut tmp)?;
        let skip = (offset - first * SECTOR) as usize;
        buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
        all_hole
    };
    inner.counters.add(Counter::BytesRead, buf.len() as u64);
    Ok(all_hole)
}

/// Reads whole sectors from `lba` into `out` (holes read as zeros).
pub(crate) fn read_sectors(inner: &Inner, lba: u64, out: &mut [u8]) -> Result<()> {
    read_sectors_mapped(inner, lba, out).map(|_| ())
}

/// `read_sectors`, telling whether every sector was a hole.
fn read_sectors_mapped(inner: &Inner, lba: u64, out: &mut [u8]) -> Result<bool> {
    let n = out.len() / SECTOR_SIZE;
    let _gate = inner.gate.read();
    let mut entries = vec![MapEntry::UNMAPPED; n];
    pager::with_map(inner, |st| st.map.get_range(lba, &mut entries))?;
    if entries.iter().all(|e| !e.is_mapped()) {
        out.fill(0);
        return Ok(true);
    }
    // Runs of sectors i..j that come from consecutive indices of one record.
    let mut runs: Vec<(usize, usize, MapEntry)> = Vec::new();
    let mut i = 0;
    while i < n {
        let e = entries[i];
        if !e.is_mapped() {
            out[i * SECTOR_SIZE..(i + 1) * SECTOR_SIZE].fill(0);
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < n
            && entries[j].record_offset() == e.record_offset()
            && entries[j].index() == e.index() + (j - i) as u32
        {
            j += 1;
        }
        runs.push((i, j, e));
        i = j;
    }
    // A large request is a stream (a sequential read, a copy): its
    // records come from the page cache only if already there, so it
    // does not fill memory with pages read once. Small reads go through
    // the page cache, which then holds compressed records for the reads
    // of their other sectors.
    let stream = out.len() >= READ_STREAM_MIN;
    // Records that follow each other in the log (a sequential write read
    // back) are fetched with one read: one system call instead of one per
    // record, which in this VM costs as much as copying 10-20 KiB.
    let mut g = 0;
    while g < runs.len() {
        let first = runs[g].2.record_offset();
        let mut end = first + runs[g].2.record_len();
        let mut h = g + 1;
        while h < runs.len() {
            let e = runs[h].2;
            let next_end = e.record_offset() + e.record_len();
            if e.record_offset() != end.next_multiple_of(RECORD_ALIGN)
                || next_end - first > READ_SPAN_MAX
            {
                break;
            }
            end = next_end;
            h += 1;
        }
        if h == g + 1 {
            let (i, j, e) = runs[g];
            read_extent(
                inner,
                e,
                lba + i as u64,
                &mut out[i * SECTOR_SIZE..j * SECTOR_SIZE],
                stream,
            )?;
        } else {
            SPAN_BUF.with_borrow_mut(|span| -> Result<()> {
                span.resize((end - first) as usize, 0);
                read_log(inner, span, first, stream)?;
                for &(i, j, e) in &runs[g..h] {
                    let at = (e.record_offset() - first) as usize;
                    let rec = &span[at..at + e.record_len() as usize];
                    decode_extent(
                        inner,
                        e,
                        lba + i as u64,
                        rec,
                        &mut out[i * SECTOR_SIZE..j * SECTOR_SIZE],
                    )?;
                }
                Ok(())
            })?;
        }
        g = h;
    }
    Ok(false)
}

/// Allocation status of `[offset, offset+len)`: runs of (length, hole).
/// Zero sectors are holes. Stops after `max_runs` runs.
pub(crate) fn block_status(
    inner: &Inner,
    offset: u64,
    len: u64,
    max_runs: usize,
) -> Result<Vec<(u64, bool)>> {
    inner.check_range(offset, len)?;
    let end = offset + len;
    let mut runs: Vec<(u64, bool)> = Vec::new();
    let mut at = offset;
    while at < end && runs.len() < max_runs {
        let lba = at / SECTOR;
        // Each step looks at the map afresh: a paged-out chunk is paged
        // in and the step taken again.
        let (mapped, next) = pager::with_map(inner, |st| {
            let mapped = st.map.get(lba)?.is_mapped();
            let next = if mapped {
                let mut l = lba + 1;
                while l * SECTOR < end && st.map.get(l)?.is_mapped() {
                    l += 1;
                }
                l * SECTOR
            } else {
                let limit = end.div_ceil(SECTOR);
                st.map.next_mapped(lba, limit)?.unwrap_or(limit) * SECTOR
            };
            Ok((mapped, next))
        })?;
        let next = next.min(end);
        match runs.last_mut() {
            Some((l, h)) if *h != mapped => *l += next - at,
            _ => runs.push((next - at, !mapped)),
        }
        at = next;
    }
    Ok(runs)
}
