//! The read path: map lookup (under the map lock and the reclaim gate) ->
//! record read (consecutive records in one read) -> header and payload
//! checksums -> decompress. Holes read as zeros. A chunked record (format
//! 5) has its table checked, then only the chunks that hold the sectors
//! asked for are checked and decoded: a 4 KiB read of a 128 KiB blob costs
//! a chunk, not the blob.

use crate::counters::Counter;
use crate::error::{EngineError, Result};
use crate::meta::pager;
use crate::state::Inner;
use crate::storage::aligned::{AlignedBuf, BLOCK};
use crate::storage::{not_cached, Fetch};
use squeeze_codec::CodecError;
use squeeze_format::map_entry::is_shared;
use squeeze_format::{CodecId, FormatError, MapEntry, RecordHeader, RECORD_ALIGN, SECTOR_SIZE};

const SECTOR: u64 = SECTOR_SIZE as u64;

thread_local! {
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static RAW_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static SPAN_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static STREAM_BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// Most bytes one read fetches for consecutive records.
const READ_SPAN_MAX: u64 = 4 << 20;
/// Requests from this size on read their records as a stream
/// (`Storage::read_stream`).
const READ_STREAM_MIN: usize = 64 << 10;

/// Bytes a small read of a large record fetches first: the longest header
/// and the longest chunk table (format 5), rounded up.
const HEAD_READ: usize = 512;
const _: () = assert!(
    HEAD_READ
        >= squeeze_format::RECORD_HEADER_SIZE + squeeze_format::MAX_CHUNK_TABLE_BYTES as usize
);

/// Reads the sectors `out` covers from the record `e` points at (the first
/// of them is `lba`, at index `e.index()` of the record).
/// The log is read as `fetch` says (`Fetch::Stream`: through
/// `Storage::read_stream`). On a volume that chunks its blobs, a read of at
/// most a quarter of a record reads its head first and, if it is chunked,
/// only the chunks it needs.
pub(crate) fn read_extent(
    inner: &Inner,
    e: MapEntry,
    lba: u64,
    out: &mut [u8],
    fetch: Fetch,
) -> Result<()> {
    let len = e.record_len() as usize;
    if fetch == Fetch::Stream {
        return with_stream(inner, e.record_offset(), len, |rec| {
            decode_extent(inner, e, lba, rec, out)
        });
    }
    READ_BUF.with_borrow_mut(|rec| {
        // Only where new blobs are chunked: a volume of one frame a blob
        // would pay a second read per record for nothing (its older
        // chunked records, if any, still decode whole below).
        if len >= 2 * HEAD_READ
            && out.len() * 4 <= len
            && inner.policy.read().policy.read_chunk != 0
        {
            rec.resize(HEAD_READ, 0);
            read_log(inner, rec, e.record_offset(), fetch)?;
            let h = check_header(inner, e, lba, rec)?;
            if h.is_chunked() {
                return read_chunks(inner, e, lba, &h, rec, out, fetch);
            }
            // One frame: the rest of the record too.
            rec.resize(len, 0);
            read_log(
                inner,
                &mut rec[HEAD_READ..],
                e.record_offset() + HEAD_READ as u64,
                fetch,
            )?;
            return decode_extent(inner, e, lba, rec, out);
        }
        rec.resize(len, 0);
        read_log(inner, rec, e.record_offset(), fetch)?;
        decode_extent(inner, e, lba, rec, out)
    })
}

/// Reads the `len` log bytes at `offset` as a stream
/// (`Storage::read_stream`) and hands them to `f`. They are read with the
/// rest of their first and last `BLOCK` into an aligned buffer, so that
/// a direct read (bytes not in the page cache) lands in place rather than
/// in a bounce buffer and then a copy, which was 16% of a sequential
/// read's CPU time (`perf` of `squeeze bench --read-chunk 0`, session 26).
fn with_stream<R>(
    inner: &Inner,
    offset: u64,
    len: usize,
    f: impl FnOnce(&[u8]) -> Result<R>,
) -> Result<R> {
    let block = BLOCK as u64;
    let start = offset / block * block;
    let n = ((offset + len as u64).div_ceil(block) * block - start) as usize;
    let at = (offset - start) as usize;
    STREAM_BUF.with_borrow_mut(|buf| {
        if buf.as_ref().is_none_or(|b| b.len() < n) {
            *buf = Some(AlignedBuf::new(n.next_multiple_of(1 << 20)));
        }
        let bytes = &mut buf.as_mut().expect("stream buffer")[..n];
        inner.storage.fetch(bytes, start, Fetch::Stream)?;
        f(&bytes[at..at + len])
    })
}

/// Reads and decodes the chunks of the chunked record `h` (at `e`, its
/// head in `head`) that hold the sectors `out` covers: one read for them,
/// fetched as `fetch` says.
fn read_chunks(
    inner: &Inner,
    e: MapEntry,
    lba: u64,
    h: &RecordHeader,
    head: &[u8],
    out: &mut [u8],
    fetch: Fetch,
) -> Result<()> {
    let hl = h.header_len();
    let fail = |err| chunk_failed(inner, lba, err);
    let table = squeeze_format::record::chunk_table(h, &head[hl..hl + h.table_len()])
        .map_err(|err| fail(ChunkError::Format(err)))?;
    let first = e.index();
    let end = first + (out.len() / SECTOR_SIZE) as u32;
    let chunks = table.covering(first..end);
    let (Some(a), Some(b)) = (chunks.first(), chunks.last()) else {
        unreachable!("a table covers every sector of its record");
    };
    let span = a.stored.start..b.stored.end;
    SPAN_BUF.with_borrow_mut(|bytes| -> Result<()> {
        bytes.resize(span.len(), 0);
        read_log(
            inner,
            bytes,
            e.record_offset() + (hl + span.start) as u64,
            fetch,
        )?;
        let t0 = std::time::Instant::now();
        let res = decode_chunks_with(h, &table, bytes, span.start, first, out);
        note_decode(inner, h, t0);
        res.map_err(fail)
    })
}

/// The engine's error for a chunked record that failed, counted.
fn chunk_failed(inner: &Inner, lba: u64, err: ChunkError) -> EngineError {
    inner.counters.add(Counter::ChecksumErrors, 1);
    match err {
        ChunkError::Format(source) => EngineError::Corrupt { lba, source },
        ChunkError::Codec(source) => EngineError::Codec { lba, source },
    }
}

/// Counts the time since `t0` as decompression when `h` is compressed.
fn note_decode(inner: &Inner, h: &RecordHeader, t0: std::time::Instant) {
    if h.codec != CodecId::None {
        inner.counters.add(
            Counter::DecompressNs,
            u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX),
        );
    }
}

/// Reads log bytes through the page cache, or with `Fetch::Cached` only
/// from it (a stream's go through `with_stream`).
fn read_log(inner: &Inner, buf: &mut [u8], offset: u64, fetch: Fetch) -> Result<()> {
    inner.storage.fetch(buf, offset, fetch)?;
    Ok(())
}

/// Decodes the header at the start of `rec` (the record `e` points at, for
/// `lba`) and checks it against `e`.
fn check_header(inner: &Inner, e: MapEntry, lba: u64, rec: &[u8]) -> Result<RecordHeader> {
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
    Ok(h)
}

/// Checks the record `rec` (the `e.record_len()` bytes at `e.record_offset()`)
/// against `e` and its checksums, and decodes the sectors `out` covers.
fn decode_extent(inner: &Inner, e: MapEntry, lba: u64, rec: &[u8], out: &mut [u8]) -> Result<()> {
    let corrupt = |source| {
        inner.counters.add(Counter::ChecksumErrors, 1);
        EngineError::Corrupt { lba, source }
    };
    let h = check_header(inner, e, lba, rec)?;
    let payload = &rec[h.header_len()..h.header_len() + h.stored_len as usize];
    let first = e.index() as usize * SECTOR_SIZE;
    if h.is_chunked() {
        let t0 = std::time::Instant::now();
        let res = decode_chunks(&h, payload, e.index(), out);
        note_decode(inner, &h, t0);
        return res.map_err(|err| chunk_failed(inner, lba, err));
    }
    squeeze_format::record::verify_payload(&h, payload).map_err(corrupt)?;
    if h.codec == CodecId::None {
        out.copy_from_slice(&payload[first..first + out.len()]);
        return Ok(());
    }
    // Monotonic time around the codec call (see squeeze_codec::run_job).
    let t0 = std::time::Instant::now();
    let res = if first == 0 && out.len() == h.raw_len() {
        decompress_whole(&h, payload, out)
    } else {
        RAW_BUF.with_borrow_mut(|raw| {
            raw.resize(h.raw_len(), 0);
            let r = decompress_whole(&h, payload, raw);
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

/// Why a chunked payload did not decode.
pub(crate) enum ChunkError {
    /// Its table or a chunk failed its checksum, or the table is invalid.
    Format(FormatError),
    /// A chunk passed its checksum but does not decode.
    Codec(CodecError),
}

/// Checks the table of the chunked record `h` (payload `payload`) and
/// decodes its sectors from index `first` into `out`: only the chunks that
/// hold them are checked and decoded.
pub(crate) fn decode_chunks(
    h: &RecordHeader,
    payload: &[u8],
    first: u32,
    out: &mut [u8],
) -> std::result::Result<(), ChunkError> {
    let table = squeeze_format::record::chunk_table(h, payload).map_err(ChunkError::Format)?;
    decode_chunks_with(h, &table, payload, 0, first, out)
}

/// [`decode_chunks`] with the table decoded, and `bytes` the payload's
/// bytes from offset `base` on (at least those of the chunks needed).
fn decode_chunks_with(
    h: &RecordHeader,
    table: &squeeze_format::chunks::ChunkTable,
    bytes: &[u8],
    base: usize,
    first: u32,
    out: &mut [u8],
) -> std::result::Result<(), ChunkError> {
    let end = first + (out.len() / SECTOR_SIZE) as u32;
    for c in table.covering(first..end) {
        let stored = &bytes[c.stored.start - base..c.stored.end - base];
        c.verify(stored).map_err(ChunkError::Format)?;
        // The part of the chunk asked for, in `out` and in the chunk.
        let from = c.sectors.start.max(first);
        let to = c.sectors.end.min(end);
        let dst = (from - first) as usize * SECTOR_SIZE..(to - first) as usize * SECTOR_SIZE;
        if from == c.sectors.start && to == c.sectors.end {
            squeeze_codec::chunked::decompress_chunk(h.codec, c, stored, &mut out[dst])
                .map_err(ChunkError::Codec)?;
            continue;
        }
        let skip = (from - c.sectors.start) as usize * SECTOR_SIZE;
        if c.is_raw() {
            out[dst.clone()].copy_from_slice(&stored[skip..skip + dst.len()]);
            continue;
        }
        RAW_BUF.with_borrow_mut(|raw| {
            raw.resize(c.raw_len(), 0);
            squeeze_codec::chunked::decompress_chunk(h.codec, c, stored, raw)
                .map_err(ChunkError::Codec)?;
            out[dst.clone()].copy_from_slice(&raw[skip..skip + dst.len()]);
            Ok(())
        })?;
    }
    Ok(())
}

/// Decodes the whole payload of the record `h` (checked by the caller with
/// `verify_payload`) into `out`, its raw bytes: the cleaner's decode.
pub(crate) fn decode_payload(
    h: &RecordHeader,
    payload: &[u8],
    out: &mut [u8],
) -> std::result::Result<(), ChunkError> {
    if h.is_chunked() {
        return decode_chunks(h, payload, 0, out);
    }
    decompress_whole(h, payload, out).map_err(ChunkError::Codec)
}

/// Decodes the unchunked payload of `h` into `out`, its raw bytes: one
/// frame of its codec, or a block payload (format 6).
fn decompress_whole(
    h: &RecordHeader,
    payload: &[u8],
    out: &mut [u8],
) -> std::result::Result<(), CodecError> {
    if h.block {
        squeeze_codec::decompress_block(payload, out)
    } else {
        squeeze_codec::decompress(h.codec, payload, out)
    }
}

/// Reads `buf.len()` bytes at byte `offset`. Returns true when every
/// sector of the range is a hole (a structured NBD READ then answers
/// OFFSET_HOLE), from the same map walk as the read.
pub(crate) fn read(inner: &Inner, offset: u64, buf: &mut [u8]) -> Result<bool> {
    read_as(inner, offset, buf, Fetch::Wait)
}

/// [`read`] if it needs no wait: for no disk (every byte it reads is in
/// memory or the page cache), no paged-out part of the map and no lock
/// held by a writer. None when it would have waited; `buf` is then
/// unspecified and its bytes are not counted as read (the time of a decode
/// done before the wait was met is). The NBD server answers small reads
/// so on the thread that reads the requests, without a hand-off to a worker
/// (two thread switches a read); a read that would wait goes to a worker.
/// Damage found is reported as by [`read`].
pub(crate) fn read_cached(inner: &Inner, offset: u64, buf: &mut [u8]) -> Result<Option<bool>> {
    match read_as(inner, offset, buf, Fetch::Cached) {
        Err(EngineError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        r => r.map(Some),
    }
}

/// [`read`], fetching as `fetch` says (`Wait` or `Cached`).
fn read_as(inner: &Inner, offset: u64, buf: &mut [u8], fetch: Fetch) -> Result<bool> {
    inner.check_range(offset, buf.len() as u64)?;
    if buf.is_empty() {
        return Ok(false);
    }
    let first = offset / SECTOR;
    let last = (offset + buf.len() as u64).div_ceil(SECTOR);
    let all_hole = if offset.is_multiple_of(SECTOR) && buf.len().is_multiple_of(SECTOR_SIZE) {
        read_sectors_mapped(inner, first, buf, fetch)?
    } else {
        let mut tmp = vec![0u8; ((last - first) * SECTOR) as usize];
        let all_hole = read_sectors_mapped(inner, first, &mut tmp, fetch)?;
        let skip = (offset - first * SECTOR) as usize;
        buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
        all_hole
    };
    inner.counters.add(Counter::BytesRead, buf.len() as u64);
    Ok(all_hole)
}

/// Reads whole sectors from `lba` into `out` (holes read as zeros).
pub(crate) fn read_sectors(inner: &Inner, lba: u64, out: &mut [u8]) -> Result<()> {
    read_sectors_mapped(inner, lba, out, Fetch::Wait).map(|_| ())
}

/// `read_sectors`, telling whether every sector was a hole; with
/// `Fetch::Cached`, `WouldBlock` rather than any wait (`read_cached`).
fn read_sectors_mapped(inner: &Inner, lba: u64, out: &mut [u8], fetch: Fetch) -> Result<bool> {
    let n = out.len() / SECTOR_SIZE;
    let _gate = match fetch {
        Fetch::Cached => inner.gate.try_read().ok_or_else(not_cached)?,
        _ => inner.gate.read(),
    };
    let mut entries = vec![MapEntry::UNMAPPED; n];
    // Deduplicated sectors read their hidden address's record, looked up
    // under the same map lock (a hidden address is zeroed only once no
    // sector refers to it): `rec_lba` is the logical address each record
    // is checked against.
    let mut rec_lba: Vec<u64> = Vec::new();
    let lookup = |st: &crate::state::map_state::MapState| {
        st.map.get_range(lba, &mut entries)?;
        if !entries.iter().any(|e| e.is_indirect()) {
            return Ok(false);
        }
        rec_lba.clear();
        rec_lba.extend(lba..lba + n as u64);
        for (e, r) in entries.iter_mut().zip(rec_lba.iter_mut()) {
            if let Some(t) = e.target() {
                *e = st.map.get(t)?;
                *r = t;
            }
        }
        Ok(true)
    };
    let shared = match fetch {
        Fetch::Cached => pager::with_resident_map(inner, lookup).ok_or_else(not_cached)?,
        _ => pager::with_map(inner, lookup)?,
    };
    if shared {
        if let Some(i) = entries
            .iter()
            .zip(&rec_lba)
            .position(|(e, &r)| is_shared(r) && !e.is_direct())
        {
            inner.counters.add(Counter::ChecksumErrors, 1);
            return Err(EngineError::Corrupt {
                lba: lba + i as u64,
                source: squeeze_format::FormatError::Invalid {
                    what: "map",
                    why: format!(
                        "the sector shares hidden address {:#x}, which holds no record",
                        rec_lba[i]
                    ),
                },
            });
        }
    }
    if entries.iter().all(|e| !e.is_mapped()) {
        out.fill(0);
        return Ok(true);
    }
    let rec = |i: usize| if shared { rec_lba[i] } else { lba + i as u64 };
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
    let fetch = match fetch {
        Fetch::Wait if out.len() >= READ_STREAM_MIN => Fetch::Stream,
        f => f,
    };
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
                rec(i),
                &mut out[i * SECTOR_SIZE..j * SECTOR_SIZE],
                fetch,
            )
            .map_err(|err| at_client(err, lba + i as u64))?;
        } else {
            let rec_of = &rec;
            let mut decode_all = |span: &[u8]| -> Result<()> {
                for &(i, j, e) in &runs[g..h] {
                    let at = (e.record_offset() - first) as usize;
                    let rec = &span[at..at + e.record_len() as usize];
                    decode_extent(
                        inner,
                        e,
                        rec_of(i),
                        rec,
                        &mut out[i * SECTOR_SIZE..j * SECTOR_SIZE],
                    )
                    .map_err(|err| at_client(err, lba + i as u64))?;
                }
                Ok(())
            };
            let len = (end - first) as usize;
            if fetch == Fetch::Stream {
                with_stream(inner, first, len, decode_all)?;
            } else {
                SPAN_BUF.with_borrow_mut(|span| -> Result<()> {
                    span.resize(len, 0);
                    read_log(inner, span, first, fetch)?;
                    decode_all(span)
                })?;
            }
        }
        g = h;
    }
    Ok(false)
}

/// An error met reading the record of a hidden address on behalf of
/// client sector `client`: it names the client's sector.
fn at_client(e: EngineError, client: u64) -> EngineError {
    match e {
        EngineError::Corrupt { source, .. } => EngineError::Corrupt {
            lba: client,
            source,
        },
        EngineError::Codec { source, .. } => EngineError::Codec {
            lba: client,
            source,
        },
        e => e,
    }
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
