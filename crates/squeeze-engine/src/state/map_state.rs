//! The sector map with the live bytes of each segment, under the map lock
//! (`Inner::state`): a part of `Inner` below it.
//!
//! Invariants: the usage of a segment is the sum of the direct map entries
//! that point into it; the count of a hidden address is the number of
//! indirect entries that name it (`MapState::replace` keeps all three in
//! step; `account_run` does the same for a run at open).

use super::log_state::segment_of;
use crate::chain_index::ChainIndex;
use crate::map::{Paged, SectorMap};
use crate::space::shared::SharedRefs;
use crate::space::Usage;
use squeeze_format::map_entry::is_shared;
use squeeze_format::{MapEntry, MapRun, RecordHeader, RecordKind};

pub(crate) struct MapState {
    pub map: SectorMap,
    pub usage: Usage,
    /// References of the hidden addresses (deduplication).
    pub shared: SharedRefs,
    /// Where the runs of the checkpoint chain lie: the map pages chunks
    /// out to it (`meta::pager`). None until a chain in format 2 or later
    /// is read or written.
    pub chain: Option<ChainIndex>,
}

impl MapState {
    /// RAM of the map and of the chain index it pages out to.
    pub fn map_memory_bytes(&self) -> u64 {
        self.map.memory_bytes() + self.chain.as_ref().map_or(0, |c| c.memory_bytes())
    }

    /// Points `lba` at `new`, keeping segment usage and references in step.
    pub fn replace(&mut self, lba: u64, new: MapEntry, seg_size: u64) -> Result<MapEntry, Paged> {
        let old = self.map.set(lba, new)?;
        account(
            &mut self.usage,
            &mut self.shared,
            seg_size,
            lba,
            old,
            1,
            false,
        );
        account(
            &mut self.usage,
            &mut self.shared,
            seg_size,
            lba,
            new,
            1,
            true,
        );
        Ok(old)
    }

    /// Unmaps `[lba, lba+n)`, visiting mapped sectors only. Stopped by a
    /// paged-out chunk, it has unmapped what lies before it: calling it
    /// again once the chunk is in finishes the job.
    pub fn unmap(&mut self, lba: u64, n: u64, seg_size: u64) -> Result<(), Paged> {
        let end = lba + n;
        let mut at = lba;
        while let Some(l) = self.map.next_mapped(at, end)? {
            self.replace(l, MapEntry::UNMAPPED, seg_size)?;
            at = l + 1;
        }
        Ok(())
    }

    /// Applies a record at `offset` (runtime install and replay alike).
    /// Refused for a paged-out chunk before anything changes, except for a
    /// zero record, whose application may be repeated.
    pub fn apply(&mut self, h: &RecordHeader, offset: u64, seg_size: u64) -> Result<(), Paged> {
        match h.kind {
            RecordKind::Extent => {
                self.map.need(h.lba, u64::from(h.sectors))?;
                for i in 0..h.sectors {
                    let e = MapEntry::new(offset, i, h.sectors, h.record_len());
                    self.replace(h.lba + u64::from(i), e, seg_size)?;
                }
            }
            RecordKind::Relocate => {
                self.map.need(h.lba, u64::from(h.sectors))?;
                for i in 0..h.sectors {
                    let lba = h.lba + u64::from(i);
                    let cur = self.map.get(lba)?;
                    // The old record's offset identifies it; a sector's
                    // index in it is fixed by its LBA, so the offset is
                    // all a relocation has to match.
                    if cur.is_mapped() && cur.record_offset() == h.aux {
                        let e = MapEntry::new(offset, i, h.sectors, h.record_len());
                        self.replace(lba, e, seg_size)?;
                    }
                }
            }
            RecordKind::Zero => self.unmap(h.lba, u64::from(h.sectors), seg_size)?,
            RecordKind::Link => {
                // Each sector is linked only where its hidden address holds
                // a record: at runtime always (the pass links after the
                // content's Extent is installed); in replay, a crash may
                // have lost that Extent (unflushed, torn, passed over) and
                // kept the Link after it, which then leaves the sector as
                // it was rather than point it at nothing.
                self.map.need(h.lba, u64::from(h.sectors))?;
                self.map.need(h.aux, u64::from(h.sectors))?;
                for i in 0..h.sectors {
                    let t = h.aux + u64::from(i);
                    if self.map.get(t)?.is_direct() {
                        let e = MapEntry::indirect(t);
                        self.replace(h.lba + u64::from(i), e, seg_size)?;
                    }
                }
            }
            RecordKind::SegmentHeader => {}
        }
        Ok(())
    }
}

/// Adds (`add`) or takes off what `n` consecutive entries from `first`
/// at `lba` hold: a direct run's bytes in its segment's usage, an
/// indirect run's references; a hidden address's own entries make it
/// known to `shared` (mapped: never allocated again, an orphan until
/// referenced; unmapped: zeroed).
pub(crate) fn account(
    usage: &mut Usage,
    shared: &mut SharedRefs,
    seg_size: u64,
    lba: u64,
    first: MapEntry,
    n: u32,
    add: bool,
) {
    if first.is_direct() {
        let seg = segment_of(first.record_offset(), seg_size);
        if add {
            usage.add_run(seg, first, n);
        } else {
            usage.remove_run(seg, first, n);
        }
        if is_shared(lba) {
            shared.count_mapped(u64::from(n), add);
            for i in 0..u64::from(n) {
                if add {
                    shared.note_mapped(lba + i);
                } else {
                    shared.zeroed(lba + i);
                }
            }
        }
    } else if first.is_indirect() {
        for i in 0..n {
            if add {
                shared.add(first.advance(i));
            } else {
                shared.remove(first.advance(i));
            }
        }
    }
}

/// `account` for a run of the checkpoint chain.
pub(crate) fn account_run(
    usage: &mut Usage,
    shared: &mut SharedRefs,
    seg_size: u64,
    r: &MapRun,
    add: bool,
) {
    account(usage, shared, seg_size, r.lba, r.first, r.sectors, add);
}
