//! The write path: range lock -> read-modify-write of partial sectors ->
//! pipeline (split, policy, compress) in batches -> log append; trims and
//! zero writes append zero records; FUA flushes before the reply.

use crate::append::{self, Room};
use crate::counters::Counter;
use crate::dedup;
use crate::error::Result;
use crate::pipeline::burst::RoomReading;
use crate::pipeline::compress::{encode, Item};
use crate::pipeline::policy::{ActivePolicy, Hint};
use crate::pipeline::split::{split, Piece, Zeros};
use crate::read;
use crate::space::make_room::append_making_room;
use crate::state::Inner;
use squeeze_codec::Algorithm;
use squeeze_format::SECTOR_SIZE;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const SECTOR: u64 = SECTOR_SIZE as u64;
/// Most bytes of client data one pipeline batch carries (bounds the memory
/// a single request pins while it is compressed).
pub const BATCH_BYTES_MAX: usize = 4 << 20;

pub(crate) fn write_from(
    inner: &Inner,
    offset: u64,
    data: &[u8],
    shared: Option<(&Arc<Vec<u8>>, usize)>,
    fua: bool,
    hint: Hint,
    zeros: Zeros,
) -> Result<()> {
    inner.check_range(offset, data.len() as u64)?;
    inner.writable()?;
    if data.is_empty() {
        return if fua { client_flush(inner) } else { Ok(()) };
    }
    let first = offset / SECTOR;
    let last = (offset + data.len() as u64).div_ceil(SECTOR);
    let _range = inner.ranges.lock(first, last);
    // A resize may have given up this range while we waited for it.
    inner.check_range(offset, data.len() as u64)?;
    if offset.is_multiple_of(SECTOR) && data.len().is_multiple_of(SECTOR_SIZE) {
        write_sectors(inner, first, data, shared, hint, zeros)?;
    } else {
        // Read-modify-write of the partial head and tail sectors.
        let mut tmp = vec![0u8; ((last - first) * SECTOR) as usize];
        let head_partial = !offset.is_multiple_of(SECTOR);
        let tail_partial = !(offset + data.len() as u64).is_multiple_of(SECTOR);
        // Only the partial edge sectors are read (a single sector once).
        if head_partial {
            read::read_sectors(inner, first, &mut tmp[..SECTOR_SIZE])?;
        }
        if tail_partial && (last - first > 1 || !head_partial) {
            let t = tmp.len() - SECTOR_SIZE;
            read::read_sectors(inner, last - 1, &mut tmp[t..])?;
        }
        let skip = (offset - first * SECTOR) as usize;
        tmp[skip..skip + data.len()].copy_from_slice(data);
        write_sectors(inner, first, &tmp, None, hint, zeros)?;
    }
    inner.counters.add(Counter::BytesWritten, data.len() as u64);
    if fua {
        client_flush(inner)?;
    }
    Ok(())
}

/// `data` is whole sectors from `lba`; `shared` as in [`encode`]. In dedup
/// mode inline each chunk first goes through `dedup::inline::share`, and
/// only what it did not share is stored.
fn write_sectors(
    inner: &Inner,
    lba: u64,
    data: &[u8],
    shared: Option<(&Arc<Vec<u8>>, usize)>,
    hint: Hint,
    zeros: Zeros,
) -> Result<()> {
    let policy = inner.policy.read().clone();
    let max_blob = policy.max_blob_sectors();
    let batch = BATCH_BYTES_MAX / policy.policy.max_blob as usize * policy.policy.max_blob as usize;
    let inline = inner.inline.on();
    for (k, chunk) in data.chunks(batch).enumerate() {
        let at = lba + (k * batch / SECTOR_SIZE) as u64;
        let shared = shared.map(|(a, base)| (a, base + k * batch));
        let written = inner.counters.get(Counter::BytesWritten);
        let room = || RoomReading {
            free_bytes: crate::stats::space(inner).free_physical,
            pending_raw_bytes: inner.state.read().usage.burst_raw_total(),
        };
        let alg = policy.write_algorithm(&*inner.engine, written, &room);
        let codec = (alg, inner.block_payloads.load(Ordering::Acquire));
        if !inline {
            store(inner, &policy, codec, hint, zeros, at, chunk, shared)?;
            continue;
        }
        let s = dedup::inline::share(inner, &policy, codec, hint, at, chunk, shared, max_blob)?;
        for &(a, b) in &s.rest {
            let part = &chunk[a * SECTOR_SIZE..b * SECTOR_SIZE];
            let shared = shared.map(|(buf, base)| (buf, base + a * SECTOR_SIZE));
            store(
                inner,
                &policy,
                codec,
                hint,
                zeros,
                at + a as u64,
                part,
                shared,
            )?;
        }
        dedup::inline::remember(inner, at, &s);
    }
    Ok(())
}

/// Stores `chunk` (whole sectors from `at`, at most one batch): split,
/// compressed with `codec`, appended.
#[expect(
    clippy::too_many_arguments,
    reason = "the write's own state, passed on"
)]
fn store(
    inner: &Inner,
    policy: &ActivePolicy,
    codec: (Algorithm, bool),
    hint: Hint,
    zeros: Zeros,
    at: u64,
    chunk: &[u8],
    shared: Option<(&Arc<Vec<u8>>, usize)>,
) -> Result<()> {
    let pieces = atomic_split(chunk, at, policy.max_blob_sectors(), zeros);
    let zero_sectors: u64 = pieces
        .iter()
        .map(|p| match p {
            Piece::Zero { sectors, .. } => *sectors,
            _ => 0,
        })
        .sum();
    inner
        .counters
        .add(Counter::ZeroSectorsWritten, zero_sectors);
    let (items, cpu_ns) = encode(&*inner.engine, policy, codec, hint, chunk, shared, &pieces);
    inner.counters.add(Counter::CompressNs, cpu_ns);
    if let Some(a) = &policy.adapt {
        a.record(codec.0, chunk.len() as u64, cpu_ns);
    }
    append_making_room(inner, &items, chunk, Room::Data)
}

pub(crate) fn zero_range(inner: &Inner, offset: u64, len: u64, fua: bool) -> Result<()> {
    inner.check_range(offset, len)?;
    inner.writable()?;
    let end = offset + len;
    let first_full = offset.div_ceil(SECTOR);
    let last_full = end / SECTOR;
    // Partial sectors at either edge: write zeros through the data path.
    if first_full > last_full {
        return write_from(
            inner,
            offset,
            &vec![0u8; len as usize],
            None,
            fua,
            Hint::None,
            Zeros::Hole,
        );
    }
    if offset < first_full * SECTOR {
        let n = (first_full * SECTOR - offset) as usize;
        write_from(
            inner,
            offset,
            &vec![0u8; n],
            None,
            false,
            Hint::None,
            Zeros::Hole,
        )?;
    }
    if end > last_full * SECTOR {
        let n = (end - last_full * SECTOR) as usize;
        write_from(
            inner,
            last_full * SECTOR,
            &vec![0u8; n],
            None,
            false,
            Hint::None,
            Zeros::Hole,
        )?;
    }
    if last_full > first_full {
        let _range = inner.ranges.lock(first_full, last_full);
        inner.check_range(offset, len)?;
        let mut items = Vec::new();
        let mut lba = first_full;
        while lba < last_full {
            let n = (last_full - lba).min(u64::from(u32::MAX));
            items.push(Item::Zero { lba, sectors: n });
            lba += n;
        }
        append_making_room(inner, &items, &[], Room::Reserve)?;
        inner
            .counters
            .add(Counter::SectorsTrimmed, last_full - first_full);
    }
    if fua {
        client_flush(inner)?;
    }
    Ok(())
}

/// Writes zeros over `[offset, offset+len)` as stored data, not holes
/// (NBD_CMD_FLAG_NO_HOLE): the range stays mapped, so block status
/// reports it allocated. Zeros compress to almost nothing with any
/// codec; with mode none they cost their full size.
pub(crate) fn provision_zeroes(inner: &Inner, offset: u64, len: u64, fua: bool) -> Result<()> {
    static ZEROS: [u8; BATCH_BYTES_MAX] = [0; BATCH_BYTES_MAX];
    inner.check_range(offset, len)?;
    inner.writable()?;
    let end = offset + len;
    let mut at = offset;
    while at < end {
        // Batches end on multiples of the batch size (whole sectors).
        let next = ((at / BATCH_BYTES_MAX as u64 + 1) * BATCH_BYTES_MAX as u64).min(end);
        let n = (next - at) as usize;
        write_from(
            inner,
            at,
            &ZEROS[..n],
            None,
            false,
            Hint::None,
            Zeros::Store,
        )?;
        at = next;
    }
    if fua {
        client_flush(inner)?;
    }
    Ok(())
}

/// A client's flush: every write acknowledged before it is durable;
/// then the allocation ahead of the head is given back (at most once a
/// second).
pub(crate) fn client_flush(inner: &Inner) -> Result<()> {
    if inner.read_only {
        return Ok(());
    }
    crate::space::prewrite::before_flush(inner)?;
    append::flush(inner)?;
    if inner.allocate_ahead {
        crate::space::ahead::release_after_flush(inner);
    }
    Ok(())
}

/// [`split`], except that a chunk of at most `max_blob` sectors holding both
/// all-zero and non-zero sectors stays one blob, zeros included: one write
/// of up to max_blob sectors is then one record, atomic across a crash
/// whatever its content (docs/RELIABILITY.md, "Atomic writes"). A database
/// page with an all-zero 4 KiB half (PostgreSQL's 8 KiB WAL and heap pages
/// often have one) must not tear into a zero record and an extent. The zero
/// sectors stay mapped and cost their compressed size (a few bytes with any
/// codec; 4 KiB each when the blob is stored raw).
fn atomic_split(chunk: &[u8], lba: u64, max_blob: u32, zeros: Zeros) -> Vec<Piece> {
    let pieces = split(chunk, lba, max_blob, zeros);
    let mixed = pieces.len() > 1 && pieces.iter().any(|p| matches!(p, Piece::Data { .. }));
    let sectors = chunk.len() / SECTOR_SIZE;
    if mixed && sectors <= max_blob as usize {
        vec![Piece::Data {
            lba,
            sectors: sectors as u32,
            start: 0,
        }]
    } else {
        pieces
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sectors(pattern: &[u8]) -> Vec<u8> {
        pattern
            .iter()
            .flat_map(|&b| std::iter::repeat_n(b, SECTOR_SIZE))
            .collect()
    }

    #[test]
    fn a_mixed_write_of_at_most_max_blob_sectors_is_one_blob() {
        let buf = sectors(&[0, 1, 0, 1]);
        assert_eq!(
            atomic_split(&buf, 8, 4, Zeros::Hole),
            vec![Piece::Data {
                lba: 8,
                sectors: 4,
                start: 0
            }]
        );
        // More sectors than one blob: zeros stay holes (several records
        // either way).
        let p = atomic_split(&buf, 8, 3, Zeros::Hole);
        assert_eq!(p.len(), 4, "{p:?}");
        // All-zero and all-data writes are unchanged.
        let z = sectors(&[0, 0]);
        assert_eq!(
            atomic_split(&z, 0, 4, Zeros::Hole),
            vec![Piece::Zero { lba: 0, sectors: 2 }]
        );
    }
}
