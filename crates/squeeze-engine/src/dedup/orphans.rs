//! Orphans: hidden addresses whose content no client sector refers to any
//! more (`space::shared`). Zeroing them (Zero records of the hidden
//! addresses) turns their records to garbage for the cleaner.
//!
//! Under `Inner::dedup_lock`, so that no pass links to an address being
//! zeroed; each is checked again under the map lock just before its Zero
//! is appended: a reference that came meanwhile keeps it.

use crate::append::Room;
use crate::error::Result;
use crate::pipeline::compress::Item;
use crate::space::make_room::append_making_room;
use crate::state::Inner;

/// Orphans zeroed per append.
const BATCH: usize = 1024;

/// Zeroes every orphan; returns how many. The caller holds
/// `inner.dedup_lock` (a pass does; `zero_now` takes it).
pub(crate) fn zero(inner: &Inner) -> Result<u64> {
    let mut done = 0;
    loop {
        let batch = inner.state.read().shared.orphans(BATCH);
        if batch.is_empty() {
            return Ok(done);
        }
        // Runs of consecutive addresses, each one Zero record.
        let mut items: Vec<Item> = Vec::new();
        for h in batch {
            match items.last_mut() {
                Some(Item::Zero { lba, sectors }) if *lba + *sectors == h => *sectors += 1,
                _ => items.push(Item::Zero { lba: h, sectors: 1 }),
            }
        }
        let n: u64 = items
            .iter()
            .map(|it| match it {
                Item::Zero { sectors, .. } => *sectors,
                _ => 0,
            })
            .sum();
        append_making_room(inner, &items, &[], Room::Reserve)?;
        // Installing the Zeros took them off the orphans (their entries
        // went); an address never mapped is taken off here.
        let mut st = inner.state.write();
        for it in &items {
            if let Item::Zero { lba, sectors } = it {
                for h in *lba..*lba + *sectors {
                    st.shared.zeroed(h);
                }
            }
        }
        done += n;
    }
}

/// `zero` for the maintenance thread: nothing while a pass runs (the
/// pass zeroes what it leaves at its end; the maintenance thread must not
/// wait for it, its checkpoints would wait too).
pub(crate) fn zero_now(inner: &Inner) -> Result<u64> {
    match inner.dedup_lock.try_write() {
        Some(_one) => zero(inner),
        None => Ok(0),
    }
}
