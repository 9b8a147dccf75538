//! The merger: rewrites fragmented windows of the LBA space as whole blobs.
//!
//! Scattered small overwrites (4 KiB random writes over data written in
//! 128 KiB blobs) leave a window of `max_blob` sectors spread over many
//! small records: each is compressed alone (the codec sees 4 KiB of
//! context, the record pays its header), and the blob they
//! overwrote still occupies its whole size until the cleaner recompresses
//! what is left of it. On fio's 60%-compressible data the volume falls from
//! 2.47:1 to about 2.37:1 in live records alone.
//!
//! The merger reads such a window through the read path (checksums
//! verified) and writes each contiguous run of it again through the write
//! path as one blob, with the volume's policy. The small records and the
//! old blob become dead, the cleaner then frees their segments cheaply, and
//! the volume returns to the ratio of its sequential writes.
//!
//! A window is fragmented when its mapped sectors lie in more record pieces
//! than they form contiguous runs and at least a quarter of them
//! ([`SMALL_SHARE_MIN`]) lie in small records (under half of `max_blob`).
//! Blobs that are merely unaligned to the window are left alone, and so is
//! a window with a few small overwrites: rewriting 128 KiB for one 4 KiB
//! write would cost more device writes than it saves (a window is rewritten
//! at most once per 8 small overwrites of it, a write amplification of at
//! most 4 on those writes), and the cleaner frees the dead sectors there.
//!
//! When: only while clients are idle (the maintenance thread, one bounded
//! step at a time, stopping as soon as a request arrives), and in
//! `squeeze compact`. Rewriting costs a compression of the window, so it is
//! not done while clients want the CPU.
//!
//! Crash safety: a merge is an ordinary write of the bytes the window
//! already holds, made under the window's range lock from its read to its
//! map update, so its records are ordered in the log with every client
//! write to the window and replay rebuilds the same map. Until it is
//! synced, the records it replaced are still in the log: they are freed
//! only by a checkpoint, which syncs first.

use crate::append::Room;
use crate::counters::Counter;
use crate::error::{EngineError, Result};
use crate::meta::pager;
use crate::pipeline::compress::encode;
use crate::pipeline::policy::{ActivePolicy, Hint};
use crate::pipeline::split::Piece;
use crate::read;
use crate::space::make_room::append_making_room;
use crate::state::Inner;
use squeeze_format::{CodecId, CompressionMode, MapEntry, SECTOR_SIZE};
use std::sync::atomic::Ordering;

/// A window is merged once at least this share of its mapped sectors lies
/// in small records.
pub const SMALL_SHARE_MIN: f64 = 0.25;

/// Windows one step looks at, at most (one range lock spans them: 2 MiB of
/// LBA space with 128 KiB blobs).
const STEP_WINDOWS: u64 = 16;

/// Threads reading the windows of one step.
const READERS: usize = 4;

/// What merging did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct MergeReport {
    /// Fragmented windows rewritten.
    pub windows: u64,
    /// Sectors rewritten.
    pub sectors: u64,
    /// Record bytes appended.
    pub bytes_written: u64,
    /// Windows left as they are because a record failed its checksum.
    pub corrupt_windows: u64,
}

impl MergeReport {
    fn add(&mut self, o: &MergeReport) {
        self.windows += o.windows;
        self.sectors += o.sectors;
        self.bytes_written += o.bytes_written;
        self.corrupt_windows += o.corrupt_windows;
    }
}

/// Where a sweep over the LBA space stands.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cursor {
    /// Next LBA to look at.
    pub lba: u64,
    /// Windows merged since the sweep began at LBA 0.
    pub merged_this_sweep: u64,
}

/// True when merging the window whose entries are `entries` makes it
/// fewer, larger records (see the module text).
fn fragmented(entries: &[MapEntry], max_blob_sectors: u32) -> bool {
    let mut runs = 0;
    let mut pieces = 0;
    let mut mapped = 0;
    let mut small = 0;
    let mut prev: Option<MapEntry> = None;
    for &e in entries {
        // Indirect entries (deduplicated sectors) are not merged: their
        // content is shared and stays where it is.
        if !e.is_direct() {
            prev = None;
            continue;
        }
        match prev {
            None => {
                runs += 1;
                pieces += 1;
            }
            Some(p) if !(p.record_offset() == e.record_offset() && e.index() == p.index() + 1) => {
                pieces += 1
            }
            Some(_) => {}
        }
        mapped += 1;
        if e.sectors() * 2 < max_blob_sectors {
            small += 1;
        }
        prev = Some(e);
    }
    pieces > runs && small > 0 && small as f64 >= SMALL_SHARE_MIN * mapped as f64
}

/// True when the policy compresses, so that merging can gain anything.
pub(crate) fn worthwhile(inner: &Inner) -> bool {
    let p = inner.policy.read().clone();
    p.policy.mode != CompressionMode::None && p.algorithm.codec != CodecId::None
}

/// Looks at up to [`STEP_WINDOWS`] windows from `cursor` (skipping never
/// written space) and merges the fragmented ones. Returns what it did and
/// whether the sweep reached the end of the volume (the cursor is then back
/// at LBA 0).
pub(crate) fn step(inner: &Inner, cursor: &mut Cursor) -> Result<(MergeReport, bool)> {
    let policy = inner.policy.read().clone();
    let w = u64::from(policy.max_blob_sectors());
    let total = inner.size() / SECTOR_SIZE as u64;
    let mut rep = MergeReport::default();
    let from = cursor.lba;
    let next = pager::with_map(inner, |st| st.map.next_mapped(from, total))?;
    let Some(first) = next else {
        cursor.lba = 0;
        return Ok((rep, true));
    };
    let span_start = first / w * w;
    let span_end = (span_start + STEP_WINDOWS * w).min(total);
    cursor.lba = span_end;
    // Cheap look first, without the range lock: most spans need nothing.
    let wants = |entries: &[MapEntry]| {
        entries
            .chunks(w as usize)
            .any(|c| fragmented(c, policy.max_blob_sectors()))
    };
    let n = (span_end - span_start) as usize;
    let mut entries = vec![MapEntry::UNMAPPED; n];
    pager::with_map(inner, |st| st.map.get_range(span_start, &mut entries))?;
    if wants(&entries) {
        let _range = inner.ranges.lock(span_start, span_end);
        // Look again under the lock: clients may have written meanwhile.
        pager::with_map(inner, |st| st.map.get_range(span_start, &mut entries))?;
        rep = merge_span(inner, &policy, span_start, &entries)?;
    }
    cursor.merged_this_sweep += rep.windows;
    let done = span_end >= total;
    if done {
        cursor.lba = 0;
    }
    Ok((rep, done))
}

/// Merges the fragmented windows of `[span_start, span_start +
/// entries.len())`, whose range lock the caller holds.
fn merge_span(
    inner: &Inner,
    policy: &ActivePolicy,
    span_start: u64,
    entries: &[MapEntry],
) -> Result<MergeReport> {
    let w = policy.max_blob_sectors() as usize;
    let mut rep = MergeReport::default();
    let mut buf = vec![0u8; entries.len() * SECTOR_SIZE];
    let mut pieces = Vec::new();
    // Read the fragmented windows, READERS at a time: their small records
    // lie all over the log, one read each, so the time goes in the
    // device's latency, which parallel reads overlap.
    let wanted: Vec<(usize, &mut [u8])> = buf
        .chunks_mut(w * SECTOR_SIZE)
        .enumerate()
        .filter(|(k, _)| {
            let win = &entries[k * w..((k + 1) * w).min(entries.len())];
            fragmented(win, policy.max_blob_sectors())
        })
        .collect();
    let mut lanes: Vec<Vec<(usize, &mut [u8])>> = (0..READERS).map(|_| Vec::new()).collect();
    for (n, x) in wanted.into_iter().enumerate() {
        lanes[n % READERS].push(x);
    }
    let mut read: Vec<(usize, Result<()>)> = std::thread::scope(|sc| {
        let handles: Vec<_> = lanes
            .into_iter()
            .filter(|l| !l.is_empty())
            .map(|lane| {
                sc.spawn(move || {
                    lane.into_iter()
                        .map(|(k, out)| {
                            (
                                k,
                                read::read_sectors(inner, span_start + (k * w) as u64, out),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("merge reader panicked"))
            .collect()
    });
    read.sort_by_key(|r| r.0);
    for (k, res) in read {
        let win = &entries[k * w..((k + 1) * w).min(entries.len())];
        let at = k * w;
        let lba = span_start + at as u64;
        match res {
            Ok(()) => {}
            Err(e @ (EngineError::Corrupt { .. } | EngineError::Codec { .. })) => {
                tracing::warn!("merger: window at LBA {lba} left as it is: {e}");
                rep.corrupt_windows += 1;
                continue;
            }
            Err(e) => return Err(e),
        }
        // Each contiguous mapped run becomes one blob (a run fits the
        // window, and the window is one max_blob).
        let mut i = 0;
        while i < win.len() {
            if !win[i].is_direct() {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < win.len() && win[j].is_direct() {
                j += 1;
            }
            pieces.push(Piece::Data {
                lba: lba + i as u64,
                sectors: (j - i) as u32,
                start: (at + i) * SECTOR_SIZE,
            });
            rep.sectors += (j - i) as u64;
            i = j;
        }
        rep.windows += 1;
    }
    if pieces.is_empty() {
        return Ok(rep);
    }
    // Idle work: always the target, never a rung under it.
    let blocks = inner.block_payloads.load(Ordering::Acquire);
    let (items, cpu_ns) = encode(
        &*inner.engine,
        policy,
        (policy.algorithm, blocks),
        Hint::None,
        &buf,
        None,
        &pieces,
    );
    inner.counters.add(Counter::CompressNs, cpu_ns);
    let before = inner.counters.get(Counter::MergedBytes);
    append_making_room(inner, &items, &buf, Room::Merge)?;
    rep.bytes_written = inner.counters.get(Counter::MergedBytes) - before;
    Ok(rep)
}

/// Sweeps the whole volume once, merging every fragmented window.
/// `progress(lba, total_sectors)`.
pub(crate) fn merge_all(inner: &Inner, mut progress: impl FnMut(u64, u64)) -> Result<MergeReport> {
    let total = inner.size() / SECTOR_SIZE as u64;
    let mut cursor = Cursor::default();
    let mut rep = MergeReport::default();
    loop {
        let (r, done) = step(inner, &mut cursor)?;
        rep.add(&r);
        progress(if done { total } else { cursor.lba }, total);
        if done {
            return Ok(rep);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(rec: u64, index: u32, sectors: u32) -> MapEntry {
        MapEntry::new(
            squeeze_format::DATA_START + rec * 4096,
            index,
            sectors,
            4096,
        )
    }

    #[test]
    fn whole_blobs_are_not_fragmented() {
        let w: Vec<MapEntry> = (0..32).map(|i| e(0, i, 32)).collect();
        assert!(!fragmented(&w, 32));
        // Two unaligned large blobs: left alone.
        let w: Vec<MapEntry> = (0..32)
            .map(|i| {
                if i < 16 {
                    e(0, 16 + i, 32)
                } else {
                    e(9, i - 16, 32)
                }
            })
            .collect();
        assert!(!fragmented(&w, 32));
        // Small records each in its own run (holes between): nothing to gain.
        let w: Vec<MapEntry> = (0..32u32)
            .map(|i| {
                if i % 2 == 0 {
                    e(u64::from(i), 0, 1)
                } else {
                    MapEntry::UNMAPPED
                }
            })
            .collect();
        assert!(!fragmented(&w, 32));
        assert!(!fragmented(&[MapEntry::UNMAPPED; 32], 32));
    }

    #[test]
    fn small_overwrites_fragment_a_window() {
        let mut w: Vec<MapEntry> = (0..32).map(|i| e(0, i, 32)).collect();
        // A few small overwrites: not worth rewriting 32 sectors for.
        for i in [3, 7, 11, 20, 21, 22, 30] {
            w[i] = e(50 + i as u64, 0, 1);
            assert!(!fragmented(&w, 32), "{i}");
        }
        // The eighth makes a quarter.
        w[0] = e(49, 0, 1);
        assert!(fragmented(&w, 32));
        // A quarter of a half-filled window.
        let mut w: Vec<MapEntry> = (0..32)
            .map(|i| {
                if i < 16 {
                    e(0, i, 16)
                } else {
                    MapEntry::UNMAPPED
                }
            })
            .collect();
        for i in [2, 5, 9] {
            w[i] = e(60 + i as u64, 0, 1);
        }
        assert!(!fragmented(&w, 32));
        w[12] = e(80, 0, 1);
        assert!(fragmented(&w, 32));
        // 4 KiB records written one after the other: one run, many records.
        let w: Vec<MapEntry> = (0..32u32).map(|i| e(100 + u64::from(i), 0, 1)).collect();
        assert!(fragmented(&w, 32));
    }
}
