//! What the volume may hold after a crash, per 4 KiB sector.
//!
//! Requests in flight never overlap at sector granularity (the driver
//! reserves sectors before it sends), so each sector has one well-defined
//! history: its durable content, then the contents later writes gave it, in
//! order. A write becomes durable when it is acknowledged with FUA, or when
//! a FLUSH sent after its acknowledgement completes. After a crash each
//! sector must hold its durable content or one of the later contents:
//! anything else is lost data (an older content) or invented data.

use crate::content::{hash, SECTOR};
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

#[derive(Clone, Debug)]
struct Sector {
    busy: bool,
    /// Fingerprint of the durable content, and the write that made it.
    durable: u64,
    durable_id: u64,
    /// (write id, fingerprint) of every content given since, oldest first.
    pending: Vec<(u64, u64)>,
}

/// How the sectors compared after a crash.
#[derive(Default, Debug, Clone, Copy)]
pub struct VerifyCounts {
    /// Sectors holding the content last written to them.
    pub latest: u64,
    /// Sectors holding an intermediate content (neither the durable nor
    /// the latest one).
    pub intermediate: u64,
    /// Sectors holding their durable content although something newer was
    /// written (allowed: the newer writes were not yet durable).
    pub rolled_back: u64,
    /// Of the sectors not at their latest content, those that lost an
    /// acknowledged (but not yet flushed) write. Allowed by the promise;
    /// counted because after a process crash the page cache survives.
    pub lost_acked_unflushed: u64,
}

impl VerifyCounts {
    pub fn add(&mut self, o: &VerifyCounts) {
        self.latest += o.latest;
        self.intermediate += o.intermediate;
        self.rolled_back += o.rolled_back;
        self.lost_acked_unflushed += o.lost_acked_unflushed;
    }

    /// True when every sector holds what was last written to it.
    pub fn exact(&self) -> bool {
        self.intermediate == 0 && self.rolled_back == 0
    }
}

pub struct Model {
    /// What a client reading now would see (latest issued content).
    pub latest: Vec<u8>,
    sectors: Vec<Sector>,
    /// Writes acknowledged without FUA and not yet covered by a flush, in
    /// acknowledgement order; `acked_base` is the index of the first.
    acked: VecDeque<u64>,
    acked_base: u64,
    /// Sector ranges of those writes.
    ranges: HashMap<u64, (u64, u64)>,
    /// Description of each write id (for failure reports), kept for the
    /// current cycle only.
    pub notes: HashMap<u64, String>,
}

/// Id of the state a fresh volume starts in (all zeros, never written).
pub const INITIAL_ID: u64 = 0;

impl Model {
    pub fn new(size: u64) -> Model {
        let sectors = size.div_ceil(SECTOR) as usize;
        let zero = hash(&[0u8; SECTOR as usize]);
        Model {
            latest: vec![0u8; size as usize],
            sectors: vec![
                Sector {
                    busy: false,
                    durable: zero,
                    durable_id: INITIAL_ID,
                    pending: Vec::new(),
                };
                sectors
            ],
            acked: VecDeque::new(),
            acked_base: 0,
            ranges: HashMap::new(),
            notes: HashMap::new(),
        }
    }

    pub fn sectors(&self) -> u64 {
        self.sectors.len() as u64
    }

    /// Sectors `[first, last)` touched by `[offset, offset+len)`.
    pub fn span(offset: u64, len: u64) -> (u64, u64) {
        (offset / SECTOR, (offset + len.max(1)).div_ceil(SECTOR))
    }

    /// Marks `[first, last)` busy if none of it is.
    pub fn try_reserve(&mut self, first: u64, last: u64) -> bool {
        let r = &mut self.sectors[first as usize..last as usize];
        if r.iter().any(|s| s.busy) {
            return false;
        }
        r.iter_mut().for_each(|s| s.busy = true);
        true
    }

    pub fn release(&mut self, first: u64, last: u64) {
        for s in &mut self.sectors[first as usize..last as usize] {
            debug_assert!(s.busy);
            s.busy = false;
        }
    }

    /// Records write `id` of `data` at `offset` (sectors already reserved).
    pub fn apply_write(&mut self, id: u64, offset: u64, data: &[u8]) {
        let o = offset as usize;
        self.latest[o..o + data.len()].copy_from_slice(data);
        let (first, last) = Model::span(offset, data.len() as u64);
        for lba in first..last {
            let b = (lba * SECTOR) as usize;
            let end = (b + SECTOR as usize).min(self.latest.len());
            let h = hash(&self.latest[b..end]);
            self.sectors[lba as usize].pending.push((id, h));
        }
    }

    /// Write `id` covering `[first, last)` was acknowledged.
    pub fn acked_write(&mut self, id: u64, first: u64, last: u64, fua: bool) {
        if fua {
            self.make_durable(id, first, last);
        } else {
            self.acked.push_back(id);
            self.ranges.insert(id, (first, last));
        }
    }

    /// The mark a FLUSH sent now carries: it covers every write
    /// acknowledged so far.
    pub fn flush_mark(&self) -> u64 {
        self.acked_base + self.acked.len() as u64
    }

    /// A FLUSH that carried `mark` completed.
    pub fn flushed(&mut self, mark: u64) {
        while self.acked_base < mark {
            let id = self.acked.pop_front().expect("mark within acked");
            self.acked_base += 1;
            let (first, last) = self.ranges.remove(&id).expect("range of acked write");
            self.make_durable(id, first, last);
        }
    }

    fn make_durable(&mut self, id: u64, first: u64, last: u64) {
        for s in &mut self.sectors[first as usize..last as usize] {
            // Not found: a later write to the sector is durable already.
            if let Some(pos) = s.pending.iter().position(|p| p.0 == id) {
                s.durable = s.pending[pos].1;
                s.durable_id = id;
                s.pending.drain(..=pos);
            }
        }
    }

    /// Compares `image` (the whole volume read after a restart) with what
    /// may be there. On success the image becomes the new durable state
    /// (the caller flushes it) and every in-flight mark is dropped.
    pub fn verify(&mut self, image: &[u8]) -> Result<VerifyCounts, Vec<String>> {
        assert_eq!(image.len(), self.latest.len());
        let mut c = VerifyCounts::default();
        let mut bad = Vec::new();
        let mut bad_count = 0u64;
        for (lba, s) in self.sectors.iter().enumerate() {
            let b = lba * SECTOR as usize;
            let end = (b + SECTOR as usize).min(image.len());
            let got = &image[b..end];
            let h = hash(got);
            // Position of the content found in the history [durable,
            // pending...]: the newest match.
            let found = if s.pending.last().map_or(s.durable, |p| p.1) == h {
                Some(s.pending.len())
            } else if let Some(i) = s.pending.iter().rposition(|p| p.1 == h) {
                Some(i + 1)
            } else if h == s.durable {
                Some(0)
            } else {
                None
            };
            match found {
                Some(i) if i == s.pending.len() => c.latest += 1,
                Some(i) => {
                    if i == 0 {
                        c.rolled_back += 1;
                    } else {
                        c.intermediate += 1;
                    }
                    if s.pending[i..]
                        .iter()
                        .any(|p| self.ranges.contains_key(&p.0))
                    {
                        c.lost_acked_unflushed += 1;
                    }
                }
                None => {
                    bad_count += 1;
                    if bad.len() < 8 {
                        bad.push(self.describe_bad(lba as u64, got));
                    }
                }
            }
        }
        if bad_count > 0 {
            bad.insert(
                0,
                format!(
                    "{bad_count} of {} sectors hold neither their durable content nor a later one",
                    self.sectors.len()
                ),
            );
            return Err(bad);
        }
        self.reset_to(image);
        Ok(c)
    }

    /// Adopts `image` as the durable state with nothing pending.
    pub fn reset_to(&mut self, image: &[u8]) {
        self.latest.copy_from_slice(image);
        for (lba, s) in self.sectors.iter_mut().enumerate() {
            let b = lba * SECTOR as usize;
            let end = (b + SECTOR as usize).min(image.len());
            s.durable = hash(&image[b..end]);
            s.busy = false;
            s.pending.clear();
        }
        self.acked.clear();
        self.acked_base = 0;
        self.ranges.clear();
        self.notes.clear();
    }

    fn describe_bad(&self, lba: u64, got: &[u8]) -> String {
        let s = &self.sectors[lba as usize];
        let mut m = format!(
            "sector {lba} (byte offset {}): durable content is from write {}",
            lba * SECTOR,
            self.note(s.durable_id)
        );
        if s.pending.is_empty() {
            m.push_str(", nothing written since");
        } else {
            let ids: Vec<String> = s.pending.iter().map(|p| p.0.to_string()).collect();
            let _ = write!(m, ", written since by writes [{}]", ids.join(", "));
        }
        let zeros = got.iter().filter(|b| **b == 0).count();
        let st = crate::content::stamps(got, lba * SECTOR);
        let _ = write!(
            m,
            "; found {} zero bytes of {}, stamps of writes {:?} (id, count; {} = misplaced stamp), first bytes {:02x?}",
            zeros,
            got.len(),
            st,
            u64::MAX,
            &got[..got.len().min(24)]
        );
        for (id, _) in st {
            if let Some(n) = self.notes.get(&id) {
                let _ = write!(m, "; write {id} was {n}");
            }
        }
        for p in &s.pending {
            if let Some(n) = self.notes.get(&p.0) {
                let _ = write!(m, "; write {} was {n}", p.0);
            }
        }
        m
    }

    fn note(&self, id: u64) -> String {
        match self.notes.get(&id) {
            Some(n) => format!("{id} ({n})"),
            None if id == INITIAL_ID => "0 (initial zeros)".into(),
            None => format!("{id} (from an earlier cycle)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(m: &Model) -> Vec<u8> {
        m.latest.clone()
    }

    #[test]
    fn flush_makes_acked_writes_durable() {
        let mut m = Model::new(4 * SECTOR);
        let zero = img(&m);
        assert!(m.try_reserve(0, 1));
        m.apply_write(1, 0, &[7u8; 4096]);
        m.release(0, 1);
        let mark_before = m.flush_mark();
        m.acked_write(1, 0, 1, false);
        let one = img(&m);
        // Not flushed: zeros or the write are both fine.
        assert!(m.clone_verify(&zero).is_ok());
        assert!(m.clone_verify(&one).is_ok());
        // A flush sent before the ack covers nothing.
        m.flushed(mark_before);
        assert!(m.clone_verify(&zero).is_ok());
        m.flushed(m.flush_mark());
        assert!(m.clone_verify(&zero).is_err());
        assert!(m.clone_verify(&one).is_ok());
        // Invented bytes are caught.
        let mut bad = one.clone();
        bad[5000] = 1;
        assert!(m.clone_verify(&bad).is_err());
    }

    #[test]
    fn fua_and_partial_writes() {
        let mut m = Model::new(2 * SECTOR);
        assert!(m.try_reserve(0, 2));
        assert!(!m.try_reserve(1, 2));
        m.apply_write(1, 100, &[1u8; 5000]);
        m.release(0, 2);
        m.acked_write(1, 0, 2, true);
        let a = img(&m);
        assert!(m.try_reserve(0, 1));
        m.apply_write(2, 10, &[2u8; 20]);
        m.release(0, 1);
        let b = img(&m);
        assert!(m.clone_verify(&a).is_ok());
        assert!(m.clone_verify(&b).is_ok());
        let mut c = a.clone();
        c[..4096].fill(0);
        assert!(m.clone_verify(&c).is_err(), "lost a FUA write");
    }

    impl Model {
        fn clone_verify(&self, image: &[u8]) -> Result<VerifyCounts, Vec<String>> {
            let mut m = Model {
                latest: self.latest.clone(),
                sectors: self.sectors.clone(),
                acked: self.acked.clone(),
                acked_base: self.acked_base,
                ranges: self.ranges.clone(),
                notes: self.notes.clone(),
            };
            m.verify(image)
        }
    }
}
