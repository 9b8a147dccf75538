//! Relocation: the live records of one segment re-appended at the log head
//! as Relocate records, so that the segment holds no live sector and the
//! next checkpoint frees it. The segment is read once, a window at a time
//! (64 KiB, grown up to `WINDOW_MAX` only for records that need it):
//! - a record whose sectors are all live is copied as it is (no codec time),
//!   unless a recompress algorithm is set, then it is recompressed with it
//!   (zram's idea: write fast, recompress cold data that moves anyway);
//! - a partly live record is decompressed and only its live runs are
//!   compressed again, so dead sectors inside an extent stop costing space.
//!
//! The cleaner (`Rewrite::Clean`), the upgrade to the target codec
//! (`Rewrite::Upgrade`) and the idle squeeze with the policy's idle level
//! (`Rewrite::Squeeze`) all rewrite a segment here.
//!
//! Crash safety: relocations are ordinary log records whose replay applies
//! only where the map still points at the old record (so a relocation never
//! undoes a later client write); the segment is freed only by a checkpoint
//! that no longer needs it. A crash mid-rewrite loses nothing and at most
//! leaves the segment for the next pass.

use crate::append::{self, Room};
use crate::counters::Counter;
use crate::error::Result;
use crate::meta::pager;
use crate::pipeline::compress::{encode, Item, Payload};
use crate::pipeline::policy::{ActivePolicy, Hint};
use crate::pipeline::split::Piece;
use crate::read;
use crate::space::{SegState, SegmentId};
use crate::state::Inner;
use squeeze_codec::Algorithm;
use squeeze_format::{
    record::verify_payload, CodecId, Policy, RecordScan, ScannedRecord, Stride, MAX_RECORD_BYTES,
    RECORD_ALIGN, SECTOR_SIZE,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Relocated payload bytes per log append (bounds the memory of a pass).
/// 256 KiB, and a window of 384 KiB, since session 27: at 512 KiB each
/// the cleaner held about a third of squeeze-kv's peak heap at 1 M YCSB
/// records (heaptrack; docs/KV.md, "Memory").
const APPEND_BYTES_MAX: usize = 256 << 10;
/// Bytes of a victim read at a time to begin with (at most the segment):
/// the cleaner's read buffer while the segment's records are small, as
/// squeeze-kv's one-sector buckets are. Session 30: a 384 KiB window
/// allocated (and mapped) for every pass was the 0.38 MiB spike above the
/// steady RSS at each pass in squeeze-kv's 5 M-record YCSB load (docs/KV.md,
/// "Memory").
const WINDOW_MIN: usize = 64 << 10;
/// The largest window: more than twice the largest record, so a window
/// that yields nothing still moves on by more than half its size. A window
/// that yields no record doubles up to this before the walk moves on
/// without one.
const WINDOW_MAX: usize = 384 << 10;
const _: () = assert!(WINDOW_MAX as u64 > 2 * MAX_RECORD_BYTES);
const _: () = assert!(WINDOW_MIN.is_multiple_of(RECORD_ALIGN as usize));

/// How a victim's live records are rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rewrite {
    /// Cleaning: whole live records are copied as they are (recompressed
    /// only when a recompress algorithm of another codec is set), partly
    /// live ones recompressed.
    Clean,
    /// The upgrade of bytes written below the target: every live record is
    /// recompressed with the target, or the policy's idle level where it
    /// has one (`ActivePolicy::idle_algorithm`) (`all`: the segment is known to hold
    /// below-target bytes, whose level the record header does not name), or
    /// only records of a codec below the target's (`!all`: after a reopen,
    /// from what the headers say; a segment without such a record is left
    /// as it is). `keep_others`: the other records stay where they are (the
    /// log's head segment, which is not freed, is upgraded where it is).
    Upgrade { all: bool, keep_others: bool },
    /// The idle squeeze (`space::squeeze`): every live record is
    /// recompressed with the policy's idle algorithm
    /// (`ActivePolicy::idle_algorithm`), and the segment freed.
    Squeeze,
}

/// What cleaning did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct CleanReport {
    pub victims: u64,
    pub records_moved: u64,
    pub sectors_moved: u64,
    /// Record bytes the relocations appended.
    pub bytes_written: u64,
    /// Live bytes the victims held before (what was copied, as stored).
    pub bytes_live_before: u64,
    pub recompressed: u64,
    /// Records that failed their checksum and stayed where they are.
    pub corrupt_records: u64,
    /// Raw bytes rewritten with the target codec by the upgrade.
    #[serde(default)]
    pub upgraded_bytes: u64,
    /// Partly live records whose live runs were rewritten apart: their
    /// windows may be fragmented again (the idle merger looks once more).
    #[serde(default)]
    pub partial_records: u64,
    /// Raw bytes rewritten with the idle algorithm by the squeeze.
    #[serde(default)]
    pub squeezed_bytes: u64,
}

impl CleanReport {
    pub(crate) fn add(&mut self, o: &CleanReport) {
        self.victims += o.victims;
        self.records_moved += o.records_moved;
        self.sectors_moved += o.sectors_moved;
        self.bytes_written += o.bytes_written;
        self.bytes_live_before += o.bytes_live_before;
        self.recompressed += o.recompressed;
        self.corrupt_records += o.corrupt_records;
        self.upgraded_bytes += o.upgraded_bytes;
        self.partial_records += o.partial_records;
        self.squeezed_bytes += o.squeezed_bytes;
    }
}

/// A live run of a partly live record, waiting to be compressed again.
struct Run {
    lba: u64,
    sectors: u32,
    from: u64,
    /// Where its bytes start in the pending decompressed records.
    start: usize,
}

/// Relocates everything still live in segment `s`.
pub(crate) fn clean_segment(inner: &Inner, s: SegmentId) -> Result<CleanReport> {
    rewrite_segment(inner, s, Rewrite::Clean)
}

/// Relocates everything still live in segment `s`, as `mode` says.
pub(crate) fn rewrite_segment(inner: &Inner, s: SegmentId, mode: Rewrite) -> Result<CleanReport> {
    let t0 = std::time::Instant::now();
    // Announce the victim before looking at it: a checkpoint freeing it from
    // now on leaves it alone (see `Inner::cleaning`).
    *inner.cleaning.lock() = Some(s);
    let r = clean_segment_inner(inner, s, mode);
    *inner.cleaning.lock() = None;
    let ns = t0.elapsed().as_nanos() as u64;
    match mode {
        Rewrite::Clean => inner.counters.add(Counter::CleanerNs, ns),
        Rewrite::Upgrade { .. } => inner.counters.add(Counter::UpgradeNs, ns),
        Rewrite::Squeeze => inner.counters.add(Counter::SqueezeNs, ns),
    }
    if let Ok(rep) = &r {
        inner
            .counters
            .add(Counter::UpgradedBytes, rep.upgraded_bytes);
        inner
            .counters
            .add(Counter::SqueezedBytes, rep.squeezed_bytes);
    }
    r
}

/// Calls `f` with each record of segment `s` in log order and its offset
/// in the backing file, reading the segment a window at a time into `buf`,
/// until `f` answers false. The walk is that of one [`RecordScan`] over the
/// whole segment: a window goes on from the end of the last record it
/// yielded, or, when it yielded none, is read again twice as large (from
/// [`WINDOW_MIN`] up to [`WINDOW_MAX`]), and at the largest goes on from
/// where a record that did not end inside it may begin. So the buffer
/// grows only as far as the segment's largest record needs. False when
/// the segment is no longer a log segment.
fn walk_records(
    inner: &Inner,
    s: SegmentId,
    buf: &mut Vec<u8>,
    mut f: impl FnMut(ScannedRecord<'_>, u64) -> Result<bool>,
) -> Result<bool> {
    let seg_off = inner.segment_offset(s);
    let seg_size = inner.seg_size as usize;
    let mut window = WINDOW_MIN.min(seg_size);
    let mut pos = 0usize;
    loop {
        let len = window.min(seg_size - pos);
        if buf.len() < len {
            buf.resize(len, 0);
        }
        {
            let _gate = inner.gate.read();
            if !matches!(inner.log.lock().table.state(s), SegState::Log { .. }) {
                return Ok(false);
            }
            inner
                .storage
                .read_at(&mut buf[..len], seg_off + pos as u64)?;
        }
        let mut last_end = 0;
        for rec in RecordScan::new(&buf[..len], inner.uuid, Stride::Record) {
            last_end = rec.offset + rec.header.record_len() as usize;
            let at = seg_off + (pos + rec.offset) as u64;
            if !f(rec, at)? {
                return Ok(true);
            }
        }
        if pos + len == seg_size {
            return Ok(true);
        }
        // A record beginning before `floor` would have ended inside.
        let align = RECORD_ALIGN as usize;
        let floor = len.saturating_sub(MAX_RECORD_BYTES as usize) / align * align;
        match last_end.max(floor) {
            // Nothing yielded and nothing ruled out: the same place again,
            // with room for a larger record (`f` saw nothing of this window).
            0 => window = (window * 2).min(WINDOW_MAX),
            step => pos += step,
        }
    }
}

fn clean_segment_inner(inner: &Inner, s: SegmentId, mode: Rewrite) -> Result<CleanReport> {
    let mut rep = CleanReport {
        victims: 1,
        ..Default::default()
    };
    {
        let _gate = inner.gate.read();
        if !matches!(inner.log.lock().table.state(s), SegState::Log { .. }) {
            return Ok(CleanReport::default());
        }
        rep.bytes_live_before = inner.state.read().usage.get(s).live_bytes;
    }
    let mut buf = Vec::new();
    let policy = inner.policy.read().clone();
    let recompress = match mode {
        // Straight to the idle level where there is one: one rewrite, not
        // the target's and then the squeeze's.
        Rewrite::Upgrade { .. } => Some(policy.idle_algorithm().unwrap_or(policy.algorithm)),
        Rewrite::Squeeze => match policy.idle_algorithm() {
            Some(a) => Some(a),
            None => return Ok(CleanReport::default()),
        },
        // An idle level is the squeeze's only: the cleaner rewrites with
        // the target meanwhile (its runs are noted unsqueezed).
        Rewrite::Clean => (policy.policy.recompress_codec != CodecId::None
            && policy.idle_algorithm().is_none())
        .then(|| {
            Algorithm::new(
                policy.policy.recompress_codec,
                policy.policy.recompress_level,
            )
        }),
    };
    let victim_below = inner.state.read().usage.below_target(s) > 0;
    let victim_unsqueezed = inner.state.read().usage.unsqueezed(s) > 0;
    let upgrade_this = |codec: CodecId| match mode {
        Rewrite::Upgrade { all: true, .. } | Rewrite::Squeeze => true,
        Rewrite::Upgrade { all: false, .. } => {
            crate::pipeline::adapt::below_target_codec(codec, policy.algorithm)
        }
        Rewrite::Clean => false,
    };
    if matches!(mode, Rewrite::Upgrade { all: false, .. }) {
        let mut found = false;
        walk_records(inner, s, &mut buf, |rec, rec_abs| {
            let h = rec.header;
            if !h.kind.has_payload() || !upgrade_this(h.codec) {
                return Ok(true);
            }
            found = pager::with_map(inner, |st| {
                for i in 0..u64::from(h.sectors) {
                    let e = st.map.get(h.lba + i)?;
                    if e.is_mapped() && e.record_offset() == rec_abs {
                        return Ok(true);
                    }
                }
                Ok(false)
            })?;
            Ok(!found)
        })?;
        if !found {
            // Nothing below the target here: leave the segment as it is.
            return Ok(CleanReport::default());
        }
    }
    let mut items: Vec<Item> = Vec::new();
    let mut pending_bytes = 0usize;
    let mut runs: Vec<Run> = Vec::new();
    // The partly live records, decompressed back to back: the runs' bytes,
    // handed to the compression engine as they are (no gathering copy).
    let mut raw: Vec<u8> = Vec::new();
    walk_records(inner, s, &mut buf, |rec, rec_abs| {
        let h = rec.header;
        if !h.kind.has_payload() {
            return Ok(true);
        }
        if matches!(
            mode,
            Rewrite::Upgrade {
                keep_others: true,
                ..
            }
        ) && !upgrade_this(h.codec)
        {
            return Ok(true);
        }
        let live: Vec<bool> = pager::with_map(inner, |st| {
            (0..u64::from(h.sectors))
                .map(|i| {
                    let e = st.map.get(h.lba + i)?;
                    Ok(e.is_mapped() && e.record_offset() == rec_abs)
                })
                .collect()
        })?;
        if !live.contains(&true) {
            return Ok(true);
        }
        let payload = rec.payload;
        if let Err(e) = verify_payload(&h, payload) {
            tracing::warn!(
                "cleaner: record at {rec_abs} for LBA {} left in place: {e}",
                h.lba
            );
            rep.corrupt_records += 1;
            return Ok(true);
        }
        let recompress_this = match mode {
            Rewrite::Clean => recompress.is_some_and(|a| a.codec != h.codec),
            Rewrite::Upgrade { .. } | Rewrite::Squeeze => upgrade_this(h.codec),
        };
        if live.iter().all(|&l| l) && !recompress_this {
            pending_bytes += payload.len();
            items.push(Item::Moved {
                lba: h.lba,
                sectors: h.sectors,
                codec: h.codec,
                payload: payload.to_vec(),
                chunk_sectors: h.chunk_sectors,
                block: h.block,
                // Checked above: the copy carries the same CRC.
                crc: Some(h.payload_crc),
                from: rec_abs,
                recompressed: false,
                // Copied as it is: if its segment held bytes below the
                // target, it may be one of them (the header names no level).
                below_target: victim_below && h.codec != CodecId::None,
                unsqueezed: victim_unsqueezed && h.codec != CodecId::None,
            });
            rep.sectors_moved += u64::from(h.sectors);
        } else {
            let base = raw.len();
            raw.resize(base + h.raw_len(), 0);
            if h.codec == CodecId::None && !h.is_chunked() {
                raw[base..].copy_from_slice(payload);
            } else if let Err(e) = read::decode_payload(&h, payload, &mut raw[base..]) {
                let e = match e {
                    read::ChunkError::Format(e) => e.to_string(),
                    read::ChunkError::Codec(e) => e.to_string(),
                };
                tracing::warn!("cleaner: record at {rec_abs} does not decompress: {e}");
                rep.corrupt_records += 1;
                raw.truncate(base);
                return Ok(true);
            }
            // The whole record is held until the batch goes out (its dead
            // sectors too), so it counts whole against the batch's bound.
            pending_bytes += h.raw_len();
            rep.partial_records += 1;
            let mut i = 0;
            while i < live.len() {
                if !live[i] {
                    i += 1;
                    continue;
                }
                let mut j = i + 1;
                while j < live.len() && live[j] {
                    j += 1;
                }
                runs.push(Run {
                    lba: h.lba + i as u64,
                    sectors: (j - i) as u32,
                    from: rec_abs,
                    start: base + i * SECTOR_SIZE,
                });
                rep.sectors_moved += (j - i) as u64;
                i = j;
            }
        }
        rep.records_moved += 1;
        if pending_bytes >= APPEND_BYTES_MAX {
            flush_items(
                inner, &mut items, &mut runs, &mut raw, recompress, mode, &policy, &mut rep,
            )?;
            pending_bytes = 0;
        }
        Ok(true)
    })?;
    flush_items(
        inner, &mut items, &mut runs, &mut raw, recompress, mode, &policy, &mut rep,
    )?;
    Ok(rep)
}

/// Compresses the pending runs and appends everything pending. The runs go
/// through the write pipeline's compress stage as the merger's windows do
/// (one batch, the policy's plan, heuristic and required ratio), with the
/// recompress algorithm in place of the policy's when one is set.
#[expect(
    clippy::too_many_arguments,
    reason = "the pending state of one victim, passed apart to keep its borrows apart"
)]
fn flush_items(
    inner: &Inner,
    items: &mut Vec<Item>,
    runs: &mut Vec<Run>,
    raw: &mut Vec<u8>,
    recompress: Option<Algorithm>,
    mode: Rewrite,
    policy: &ActivePolicy,
    rep: &mut CleanReport,
) -> Result<()> {
    if !runs.is_empty() {
        // Output at the idle level is squeezed (before `policy` is the
        // recompress algorithm's).
        let squeezed = recompress.is_some() && recompress == policy.idle_algorithm();
        let policy = match recompress {
            Some(a) => ActivePolicy::new(Policy {
                codec: a.codec,
                level: a.level,
                ..policy.policy
            }),
            None => policy.clone(),
        };
        let pieces: Vec<Piece> = runs
            .iter()
            .map(|r| Piece::Data {
                lba: r.lba,
                sectors: r.sectors,
                start: r.start,
            })
            .collect();
        // Shared with the engine's jobs as it is (no copy for them either).
        let buf = Arc::new(std::mem::take(raw));
        let blocks = inner.block_payloads.load(Ordering::Acquire);
        let (encoded, cpu_ns) = encode(
            &*inner.engine,
            &policy,
            (policy.algorithm, blocks),
            Hint::None,
            &buf,
            Some((&buf, 0)),
            &pieces,
        );
        inner.counters.add(Counter::CompressNs, cpu_ns);
        for (r, it) in runs.drain(..).zip(encoded) {
            let Item::Blob { payload, .. } = it else {
                unreachable!("a data piece encodes to a blob");
            };
            let recompressed =
                matches!(payload, Payload::Compressed { .. }) && recompress.is_some();
            let (codec, payload, chunk_sectors, block, crc) = match payload {
                Payload::Compressed {
                    codec,
                    data,
                    crc,
                    chunk_sectors,
                    block,
                } => (codec, data, chunk_sectors, block, crc),
                Payload::Raw { start, chunks } => {
                    let len = r.sectors as usize * SECTOR_SIZE;
                    let raw = &buf[start..start + len];
                    match chunks {
                        Some(c) => (
                            CodecId::None,
                            [&c.table[..], raw].concat(),
                            c.sectors,
                            false,
                            Some(c.crc),
                        ),
                        None => (CodecId::None, raw.to_vec(), 0, false, None),
                    }
                }
            };
            rep.recompressed += u64::from(recompressed);
            let compressed = codec != CodecId::None;
            let raw_bytes = u64::from(r.sectors) * SECTOR_SIZE as u64;
            match mode {
                Rewrite::Upgrade { .. } if recompressed => rep.upgraded_bytes += raw_bytes,
                Rewrite::Squeeze if recompressed => rep.squeezed_bytes += raw_bytes,
                _ => {}
            }
            items.push(Item::Moved {
                lba: r.lba,
                sectors: r.sectors,
                codec,
                payload,
                chunk_sectors,
                block,
                crc,
                from: r.from,
                recompressed,
                // Compressed again with the target (or the recompress
                // algorithm), or raw because it does not compress.
                below_target: false,
                unsqueezed: compressed && !squeezed,
            });
        }
    }
    if items.is_empty() {
        return Ok(());
    }
    rep.bytes_written += items
        .iter()
        .map(|it| append::record_len(inner, it, &[]))
        .sum::<u64>();
    // The upgrade makes room as client data does: it never eats the
    // cleaner's reserve (it stops on NoSpace; the cleaner frees room).
    let room = match mode {
        Rewrite::Clean => Room::Cleaner,
        Rewrite::Upgrade { .. } | Rewrite::Squeeze => Room::Merge,
    };
    append::append(inner, items, &[], room)?;
    items.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::victim::sealed;
    use crate::{CreateOptions, SimStorage, Volume};

    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// Writes with `write` until a few segments are sealed, damages one
    /// header (the last record beginning inside the first window of the
    /// second sealed segment), then checks that the windowed walk of every
    /// sealed segment yields what one scan of the whole segment yields, in
    /// order. Returns the largest buffer a walk used and how many records
    /// crossed a multiple of [`WINDOW_MIN`].
    fn walk_matches_whole_scan(mut write: impl FnMut(&Volume)) -> (usize, usize) {
        let s = Arc::new(SimStorage::new());
        let mut o = CreateOptions::new(256 << 20);
        o.segment_size = 4 << 20;
        let v = Volume::create(s.clone(), &o).unwrap();
        while sealed(&v.inner).0.len() < 5 {
            write(&v);
        }
        v.flush().unwrap();
        let inner = &v.inner;
        let segs: Vec<SegmentId> = sealed(inner).0.iter().map(|&(s, ..)| s).collect();
        let seg_off = inner.segment_offset(segs[1]);
        let mut whole = vec![0u8; inner.seg_size as usize];
        inner.storage.read_at(&mut whole, seg_off).unwrap();
        let cut = RecordScan::new(&whole, inner.uuid, Stride::Record)
            .map(|r| r.offset)
            .filter(|&o| o < WINDOW_MIN)
            .last()
            .unwrap();
        s.flip_bit(seg_off + cut as u64 + 10, 3);
        let (mut crossing, mut most) = (0, 0);
        for seg in segs {
            let seg_off = inner.segment_offset(seg);
            inner.storage.read_at(&mut whole, seg_off).unwrap();
            let want: Vec<(u64, u64, u32)> = RecordScan::new(&whole, inner.uuid, Stride::Record)
                .map(|r| {
                    (
                        seg_off + r.offset as u64,
                        r.header.seq,
                        r.header.payload_crc,
                    )
                })
                .collect();
            assert!(!want.is_empty());
            crossing += RecordScan::new(&whole, inner.uuid, Stride::Record)
                .filter(|r| {
                    let end = r.offset + r.header.record_len() as usize;
                    r.offset / WINDOW_MIN != (end - 1) / WINDOW_MIN
                })
                .count();
            let mut got = Vec::new();
            let mut buf = Vec::new();
            let log = walk_records(inner, seg, &mut buf, |r, at| {
                got.push((at, r.header.seq, r.header.payload_crc));
                Ok(true)
            })
            .unwrap();
            assert!(log);
            assert_eq!(got, want, "segment {seg}");
            most = most.max(buf.len());
        }
        (most, crossing)
    }

    /// Records of every size, up to the largest (incompressible 128 KiB):
    /// the window grows for them, never past [`WINDOW_MAX`].
    #[test]
    fn the_windowed_walk_finds_what_a_whole_segment_scan_finds() {
        let mut rnd = xorshift(0x9E37_79B9_7F4A_7C15);
        let mut off = 0u64;
        let (most, crossing) = walk_matches_whole_scan(|v| {
            let sectors = 1 + rnd() % 32;
            let len = sectors as usize * SECTOR_SIZE;
            let buf: Vec<u8> = if rnd().is_multiple_of(3) {
                vec![(rnd() % 7) as u8 + 1; len]
            } else {
                (0..len).map(|_| rnd() as u8).collect()
            };
            v.write(off, &buf, false).unwrap();
            off += len as u64;
        });
        assert!(most > WINDOW_MIN && most <= WINDOW_MAX, "{most}");
        assert!(crossing >= 4, "{crossing} records across a window boundary");
    }

    /// Scattered one-sector records (squeeze-kv's buckets), compressible or
    /// not: the walk never needs more than [`WINDOW_MIN`].
    #[test]
    fn small_records_are_walked_in_the_smallest_window() {
        let mut rnd = xorshift(0x2545_F491_4F6C_DD1D);
        let (most, crossing) = walk_matches_whole_scan(|v| {
            let lba = rnd() % (64 << 10);
            let buf: Vec<u8> = if rnd().is_multiple_of(2) {
                let b = (rnd() % 7) as u8 + 1;
                (0..SECTOR_SIZE).map(|i| b ^ (i / 512) as u8).collect()
            } else {
                (0..SECTOR_SIZE).map(|_| rnd() as u8).collect()
            };
            v.write(lba * SECTOR_SIZE as u64, &buf, false).unwrap();
        });
        assert_eq!(most, WINDOW_MIN);
        assert!(crossing >= 4, "{crossing} records across a window boundary");
    }
}
