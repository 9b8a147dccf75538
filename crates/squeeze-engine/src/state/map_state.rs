//! The sector map with the live bytes of each segment, under the map lock
//! (`Inner::state`): a part of `Inner` below it.
//!
//! Invariant: the usage of a segment is the sum of the map entries that
//! point into it (`MapState::replace` keeps both in step).

use super::log_state::segment_of;
use crate::chain_index::ChainIndex;
use crate::map::{Paged, SectorMap};
use crate::space::Usage;
use squeeze_format::{MapEntry, RecordHeader, RecordKind};

pub(crate) struct MapState {
    pub map: SectorMap,
    pub usage: Usage,
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

    /// Points `lba` at `new`, keeping segment usage in step.
    pub fn replace(&mut self, lba: u64, new: MapEntry, seg_size: u64) -> Result<MapEntry, Paged> {
        let old = self.map.set(lba, new)?;
        if old.is_mapped() {
            self.usage
                .remove(segment_of(old.record_offset(), seg_size), old);
        }
        if new.is_mapped() {
            self.usage
                .add(segment_of(new.record_offset(), seg_size), new);
        }
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
            RecordKind::SegmentHeader => {}
        }
        Ok(())
    }
}
