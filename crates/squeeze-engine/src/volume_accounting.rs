//! The accounting invariants checked against the map (tests and `squeeze
//! check`): segment usage is what the direct map entries imply, every
//! hidden address's references are the indirect entries naming it and it
//! holds a record, and the checkpoint chain holds what each chunk that may
//! page out holds.

use crate::error::Accounting;
use crate::meta::pager;
use crate::space::Usage;
use crate::state::log_state::segment_of;
use crate::volume::Volume;

impl Volume {
    /// Verifies the accounting invariants (tests and `check`): usage equals
    /// what the map implies, and the checkpoint chain holds what each chunk
    /// that may page out holds.
    pub fn verify_accounting(&self) -> Result<(), Accounting> {
        let mut u = Usage::default();
        let mut refs: std::collections::BTreeMap<u64, (u64, u32)> = Default::default();
        let mut direct_hidden = std::collections::BTreeSet::new();
        let st = self.inner.state.read();
        pager::for_each_chunk_locked(&self.inner, &st, |_, entries| {
            for &(lba, e) in entries {
                if let Some(t) = e.target() {
                    refs.entry(t).or_insert((lba, 0)).1 += 1;
                } else {
                    u.add(segment_of(e.record_offset(), self.inner.seg_size), e);
                    if squeeze_format::map_entry::is_shared(lba) {
                        direct_hidden.insert(lba);
                    }
                }
            }
        })?;
        for (&target, &(lba, implied)) in &refs {
            if !direct_hidden.contains(&target) {
                return Err(Accounting::DanglingReference { lba, target });
            }
            let counted = st.shared.count(target);
            if counted != implied {
                return Err(Accounting::References {
                    target,
                    counted,
                    implied,
                });
            }
        }
        if let Some((target, counted)) = st.shared.counts().find(|(t, _)| !refs.contains_key(t)) {
            return Err(Accounting::References {
                target,
                counted,
                implied: 0,
            });
        }
        for (s, got) in st.usage.iter() {
            if got != u.get(s) {
                return Err(Accounting::Segment {
                    segment: s,
                    usage: got,
                    implied: u.get(s),
                });
            }
        }
        if u.live_bytes != st.usage.live_bytes {
            return Err(Accounting::LiveBytes {
                usage: st.usage.live_bytes,
                implied: u.live_bytes,
            });
        }
        drop(st);
        pager::verify_pages(&self.inner)?;
        Ok(())
    }
}
