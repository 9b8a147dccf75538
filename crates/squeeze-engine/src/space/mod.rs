//! Segment accounting: which segments hold log records, which hold the
//! current checkpoint, which are free, and how many live bytes and sectors
//! each holds.
//!
//! Invariants:
//! - live_bytes of a segment = sum of `stored_share` of the map entries that
//!   point into it; live_sectors = number of such entries (kept by
//!   `MapState::replace`, checked by `Volume::verify_accounting` in tests).
//! - below_target of a segment = raw bytes of the blobs appended to it with
//!   a codec below the policy's target since it last held no live sector
//!   (an upper bound of what of it the upgrade has to rewrite). Every
//!   checkpoint piece carries these notes (format 3), and replay notes the
//!   records it applies that are below the target, so a reopened volume
//!   still knows what to upgrade.
//! - burst_raw of a segment = the part of below_target the ladder's raw
//!   rung stored raw (`pipeline::burst`), cleared with it; kept in memory
//!   only (a reopened volume counts it 0: its below_target note still
//!   sends the upgrade there). `burst_raw_total` is their sum.
//! - unsqueezed of a segment = raw bytes of the compressed blobs appended to
//!   it (client writes, merges, the upgrade's output, the cleaner's copies
//!   out of a segment with such bytes) since it last held no live sector:
//!   what the idle squeeze (`space::squeeze`) may rewrite with the policy's
//!   idle level. Kept in memory only: a reopened volume counts it 0, and
//!   what was written before the reopen keeps the level it was written at.
//! - A segment is reused only after a durable checkpoint no longer needs it:
//!   it held no live sector in that checkpoint's snapshot and every record in
//!   it precedes the checkpoint's replay position (so neither the checkpoint
//!   nor the replay after it can refer to it).

pub mod ahead;
pub mod cleaner;
pub mod gc_policy;
pub(crate) mod make_room;
pub mod merge;
pub mod prewrite;
pub mod relocate;
pub(crate) mod shared;
pub(crate) mod squeeze;
pub(crate) mod upgrade;
pub(crate) mod victim;

use squeeze_format::MapEntry;
use std::collections::BTreeSet;

/// Identifier of a segment: its index after DATA_START.
pub type SegmentId = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegState {
    /// Holds nothing anyone needs; its range is punched out of the file.
    Free,
    /// A log segment, opened with a SegmentHeader record of this seq.
    Log { opened_seq: u64 },
    /// Holds part of the newest durable checkpoint (or one being written).
    Checkpoint,
}

/// Segment states and the free list (guarded by the log lock).
pub struct SegmentTable {
    states: Vec<SegState>,
    free: BTreeSet<SegmentId>,
    /// Segments the backing file may hold at most.
    pub max_segments: u32,
}

impl SegmentTable {
    pub fn new(max_segments: u32) -> SegmentTable {
        SegmentTable {
            states: Vec::new(),
            free: BTreeSet::new(),
            max_segments,
        }
    }

    pub fn state(&self, s: SegmentId) -> SegState {
        self.states
            .get(s as usize)
            .copied()
            .unwrap_or(SegState::Free)
    }

    pub fn set(&mut self, s: SegmentId, state: SegState) {
        if self.states.len() <= s as usize {
            let from = self.states.len() as u32;
            self.states.resize(s as usize + 1, SegState::Free);
            self.free.extend(from..s);
        }
        self.states[s as usize] = state;
        if state == SegState::Free {
            self.free.insert(s);
        } else {
            self.free.remove(&s);
        }
    }

    /// Lowest free segment (keeps the file compact), if the cap allows.
    pub fn pick_free(&self) -> Option<SegmentId> {
        self.free.first().copied().or_else(|| {
            let next = self.states.len() as u32;
            (next < self.max_segments).then_some(next)
        })
    }

    /// The first segment from `from` on that is in use, if any.
    pub fn first_used_from(&self, from: SegmentId) -> Option<SegmentId> {
        (from..self.len()).find(|&s| self.state(s) != SegState::Free)
    }

    /// Changes the cap; segments past a lower one must all be free
    /// ([`SegmentTable::first_used_from`]): they are forgotten.
    pub fn set_cap(&mut self, max_segments: u32) {
        debug_assert!(self.first_used_from(max_segments).is_none());
        if self.states.len() > max_segments as usize {
            self.states.truncate(max_segments as usize);
            self.free.retain(|&s| s < max_segments);
        }
        self.max_segments = max_segments;
    }

    /// Segments in use (not free).
    pub fn used(&self) -> u32 {
        self.states.len() as u32 - self.free.len() as u32
    }

    /// Free segments available, counting the untouched tail up to the cap.
    pub fn available(&self) -> u64 {
        self.free.len() as u64
            + u64::from(self.max_segments.saturating_sub(self.states.len() as u32))
    }

    pub fn len(&self) -> u32 {
        self.states.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (SegmentId, SegState)> + '_ {
        self.states.iter().enumerate().map(|(i, s)| (i as u32, *s))
    }
}

/// Stored bytes of `n` sectors of one extent from `first`: sector i of an
/// extent of k sectors and len bytes holds len / k bytes, plus one for
/// i < len % k (`MapEntry::stored_share`).
fn run_bytes(first: MapEntry, n: u32) -> u64 {
    let (len, k) = (first.record_len(), u64::from(first.sectors()));
    let (a, n) = (u64::from(first.index()), u64::from(n));
    n * (len / k) + (a + n).min(len % k).saturating_sub(a)
}

/// Live bytes and sectors of one segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegUsage {
    pub live_bytes: u64,
    pub live_sectors: u64,
}

/// Per-segment usage (guarded by the map lock, updated with every mapping).
#[derive(Default, Clone)]
pub struct Usage {
    segs: Vec<SegUsage>,
    /// Sum of live_bytes over all segments.
    pub live_bytes: u64,
    /// Raw bytes written below the target per segment (see the module).
    below_target: Vec<u64>,
    /// Of those, bytes stored raw by the raw rung, and their sum.
    burst_raw: Vec<u64>,
    burst_raw_total: u64,
    /// Raw bytes not yet squeezed per segment, and their sum (see the
    /// module).
    unsqueezed: Vec<u64>,
    unsqueezed_total: u64,
}

impl Usage {
    pub fn get(&self, s: SegmentId) -> SegUsage {
        self.segs.get(s as usize).copied().unwrap_or_default()
    }

    pub fn add(&mut self, s: SegmentId, e: MapEntry) {
        if self.segs.len() <= s as usize {
            self.segs.resize(s as usize + 1, SegUsage::default());
        }
        let u = &mut self.segs[s as usize];
        u.live_bytes += e.stored_share();
        u.live_sectors += 1;
        self.live_bytes += e.stored_share();
    }

    /// Adds `n` sectors of one extent from `first` (a run of the map, as
    /// recovery rebuilds usage): what `n` calls of `add` would add.
    pub fn add_run(&mut self, s: SegmentId, first: MapEntry, n: u32) {
        if self.segs.len() <= s as usize {
            self.segs.resize(s as usize + 1, SegUsage::default());
        }
        let bytes = run_bytes(first, n);
        let u = &mut self.segs[s as usize];
        u.live_bytes += bytes;
        u.live_sectors += u64::from(n);
        self.live_bytes += bytes;
    }

    /// Removes `n` sectors of one extent from `first`: what `n` calls of
    /// `remove` would remove.
    pub fn remove_run(&mut self, s: SegmentId, first: MapEntry, n: u32) {
        let bytes = run_bytes(first, n);
        let u = &mut self.segs[s as usize];
        assert!(u.live_sectors >= u64::from(n) && u.live_bytes >= bytes);
        u.live_bytes -= bytes;
        u.live_sectors -= u64::from(n);
        self.live_bytes -= bytes;
        if u.live_sectors == 0 {
            self.clear_below_target(s);
            self.clear_unsqueezed(s);
        }
    }

    pub fn remove(&mut self, s: SegmentId, e: MapEntry) {
        let u = &mut self.segs[s as usize];
        assert!(u.live_sectors > 0 && u.live_bytes >= e.stored_share());
        u.live_bytes -= e.stored_share();
        u.live_sectors -= 1;
        self.live_bytes -= e.stored_share();
        if u.live_sectors == 0 {
            self.clear_below_target(s);
            self.clear_unsqueezed(s);
        }
    }

    /// `raw` bytes of a compressed blob just mapped into `s` are not
    /// squeezed yet.
    pub fn note_unsqueezed(&mut self, s: SegmentId, raw: u64) {
        if self.unsqueezed.len() <= s as usize {
            self.unsqueezed.resize(s as usize + 1, 0);
        }
        self.unsqueezed[s as usize] += raw;
        self.unsqueezed_total += raw;
    }

    /// Forgets the unsqueezed bytes of `s` (the squeeze rewrote what it
    /// could of it, or nothing live is left there).
    pub fn clear_unsqueezed(&mut self, s: SegmentId) {
        if let Some(b) = self.unsqueezed.get_mut(s as usize) {
            self.unsqueezed_total -= std::mem::take(b);
        }
    }

    /// Raw bytes of `s` not squeezed yet (an upper bound: some may be dead).
    pub fn unsqueezed(&self, s: SegmentId) -> u64 {
        self.unsqueezed.get(s as usize).copied().unwrap_or(0)
    }

    /// Sum of [`Usage::unsqueezed`] over all segments.
    pub fn unsqueezed_total(&self) -> u64 {
        self.unsqueezed_total
    }

    /// `raw` bytes of a blob just mapped into `s` were written below the
    /// target codec.
    pub fn note_below_target(&mut self, s: SegmentId, raw: u64) {
        if self.below_target.len() <= s as usize {
            self.below_target.resize(s as usize + 1, 0);
        }
        self.below_target[s as usize] += raw;
    }

    /// Forgets the below-target bytes of `s` (the upgrade rewrote what it
    /// could of it).
    /// Returns the bytes of them the raw rung had stored raw.
    pub fn clear_below_target(&mut self, s: SegmentId) -> u64 {
        if let Some(b) = self.below_target.get_mut(s as usize) {
            *b = 0;
        }
        match self.burst_raw.get_mut(s as usize) {
            Some(b) => {
                let was = std::mem::take(b);
                self.burst_raw_total -= was;
                was
            }
            None => 0,
        }
    }

    /// `raw` bytes of a blob just mapped into `s` were stored raw by the
    /// ladder's raw rung (also noted below the target).
    pub fn note_burst_raw(&mut self, s: SegmentId, raw: u64) {
        if self.burst_raw.len() <= s as usize {
            self.burst_raw.resize(s as usize + 1, 0);
        }
        self.burst_raw[s as usize] += raw;
        self.burst_raw_total += raw;
    }

    /// Bytes of `s` the raw rung stored raw (see the module).
    pub fn burst_raw(&self, s: SegmentId) -> u64 {
        self.burst_raw.get(s as usize).copied().unwrap_or(0)
    }

    /// Bytes the raw rung stored raw that the upgrade has still to rewrite
    /// (an upper bound, as below_target's).
    pub fn burst_raw_total(&self) -> u64 {
        self.burst_raw_total
    }

    /// Raw bytes written below the target into `s` (an upper bound of what
    /// is still live of them).
    pub fn below_target(&self, s: SegmentId) -> u64 {
        self.below_target.get(s as usize).copied().unwrap_or(0)
    }

    /// The segments with a below-target note, in order, with their bytes
    /// (what a checkpoint piece records).
    pub fn below_target_notes(&self) -> Vec<squeeze_format::SegmentNote> {
        self.below_target
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b > 0)
            .map(|(s, &b)| squeeze_format::SegmentNote {
                segment: s as SegmentId,
                below_target_bytes: b,
            })
            .collect()
    }

    /// Sum of [`Usage::below_target`] over all segments.
    pub fn below_target_total(&self) -> u64 {
        self.below_target.iter().sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = (SegmentId, SegUsage)> + '_ {
        self.segs.iter().enumerate().map(|(i, u)| (i as u32, *u))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_list_grows_and_caps() {
        let mut t = SegmentTable::new(3);
        assert_eq!(t.pick_free(), Some(0));
        t.set(0, SegState::Log { opened_seq: 1 });
        t.set(2, SegState::Checkpoint);
        assert_eq!(t.pick_free(), Some(1));
        t.set(1, SegState::Log { opened_seq: 2 });
        assert_eq!(t.pick_free(), None);
        assert_eq!(t.used(), 3);
        t.set(0, SegState::Free);
        assert_eq!(t.pick_free(), Some(0));
        assert_eq!(t.available(), 1);
    }

    #[test]
    fn add_run_adds_what_each_sector_would() {
        for k in 1..=32u32 {
            for len in [16u64, 1072, 4160, 4176, 65_600, 131_136] {
                for a in 0..k {
                    for n in 1..=k - a {
                        let first = MapEntry::new(1 << 20, a, k, len);
                        let mut one = Usage::default();
                        for i in 0..n {
                            one.add(3, first.with_index(a + i));
                        }
                        let mut run = Usage::default();
                        run.add_run(3, first, n);
                        assert_eq!(run.get(3), one.get(3), "k {k} len {len} a {a} n {n}");
                        assert_eq!(run.live_bytes, one.live_bytes);
                    }
                }
            }
        }
    }
}
