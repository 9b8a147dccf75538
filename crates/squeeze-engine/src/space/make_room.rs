//! Making room for an append: the write path's out-of-space retry. Every
//! append but the cleaner's own (client writes, trims, the merger's and the
//! upgrade's rewrites) goes through [`append_making_room`]: when the log
//! has no room, it cleans in the foreground (victim choice, relocation) and
//! checkpoints so that dead segments are freed, then tries once more
//! before answering ENOSPC. Above the cleaner's parts and the checkpoint,
//! which it drives.

use crate::append::{self, Room};
use crate::counters::Counter;
use crate::error::{EngineError, Result};
use crate::meta::checkpoint;
use crate::pipeline::compress::Item;
use crate::space::gc_policy::VICTIM_LIVE_MAX_TIGHT;
use crate::space::relocate::clean_segment;
use crate::space::victim::pick_victim;
use crate::state::Inner;

/// Appends `items` to the log; when there is no room, makes room (clean,
/// then checkpoint so dead segments are freed) and tries once more before
/// answering ENOSPC. For every append but the cleaner's own.
pub(crate) fn append_making_room(
    inner: &Inner,
    items: &[Item],
    buf: &[u8],
    room: Room,
) -> Result<()> {
    debug_assert!(room != Room::Cleaner);
    match append::append(inner, items, buf, room) {
        Err(EngineError::NoSpace(_)) => {
            make_room(inner)?;
            append::append(inner, items, buf, room)
        }
        r => r,
    }
}

/// Cleans until dead segments exist (or no victim is left), then writes a
/// checkpoint that frees them. Called by a write that found no room.
pub(crate) fn make_room(inner: &Inner) -> Result<()> {
    let _one = inner.cleaner_lock.lock();
    if !checkpoint::reclaimable(inner) {
        let mut done = Vec::new();
        for _ in 0..8 {
            let Some(v) = pick_victim(inner, VICTIM_LIVE_MAX_TIGHT, u64::MAX, &done, false) else {
                break;
            };
            let rep = clean_segment(inner, v)?;
            inner
                .counters
                .add(Counter::CleanerSpaceBytes, rep.bytes_written);
            done.push(v);
            if checkpoint::reclaimable(inner) {
                break;
            }
        }
    }
    // Two checkpoints: the first frees what lies before both replay
    // positions, the second what lay only before the newer one.
    for _ in 0..2 {
        if checkpoint::reclaimable(inner) {
            checkpoint::write(inner, false)?;
        }
    }
    Ok(())
}
