//! Flush marks at run time and at open (`squeeze_format::flush_mark` has
//! the layout): after each fdatasync of a client flush, the seq below
//! which every record of this open is durable goes to the next of the
//! sixteen mark slots, through the page cache (`Storage::write_through`), before the
//! flush returns. Recovery reads the newest mark: a record missing below
//! its seq was flushed, so its absence is damage, never a torn tail.
//!
//! Cost on the flush path: one pwrite of 72 bytes into the page cache per
//! flush that made new records durable; the storage's writeback thread
//! then sends the page to the device, ahead of the next fdatasync
//! (docs/benchmarks.md, "Flush path").

use crate::storage::Storage;
use squeeze_format::flush_mark::{FlushMark, FLUSH_MARK_LEN};
use squeeze_format::{FLUSH_MARK_SLOTS, FLUSH_MARK_SLOT_SIZE, FLUSH_MARK_START};
use std::io;

/// What the flushes of this open have made durable (held under the
/// flush's second stage lock, `Inner::sync_lock`).
#[derive(Debug)]
pub(crate) struct Synced {
    /// Every record of a ticket below this is durable.
    pub ticket: u64,
    /// The mark last written: marks written so far, and the seq it claimed.
    pub count: u64,
    pub marked_seq: u64,
    /// The first seq of this open: records below it belong to an earlier
    /// open and are covered by its checkpoint, not by these marks.
    pub epoch_seq: u64,
}

impl Synced {
    /// The state of a volume opened with its log's next seq at `epoch_seq`,
    /// after the mark `last` (the newest on disk, if any).
    pub fn new(epoch_seq: u64, last: Option<FlushMark>) -> Synced {
        Synced {
            ticket: 0,
            count: last.map_or(0, |m| m.count + 1),
            marked_seq: epoch_seq,
            epoch_seq,
        }
    }
}

/// What the mark slots say at open.
#[derive(Clone, Debug)]
pub(crate) struct Marks {
    /// The newest valid mark of the volume (None: no mark, or none intact).
    pub newest: Option<FlushMark>,
    /// Slots holding neither zeros nor a mark (`FlushMark::damaged_slots`):
    /// one of them may have held a newer mark than `newest`.
    pub damaged: Vec<u64>,
}

/// The marks of volume `uuid`.
pub(crate) fn read(storage: &dyn Storage, uuid: &[u8; 16]) -> io::Result<Marks> {
    let mut area = vec![0u8; FLUSH_MARK_SLOTS as usize * FLUSH_MARK_SLOT_SIZE];
    storage.read_at(&mut area, FLUSH_MARK_START)?;
    Ok(Marks {
        newest: FlushMark::newest(&area, uuid),
        damaged: FlushMark::damaged_slots(&area, uuid),
    })
}

/// Writes a placeholder (`FlushMark::placeholder`) to each of `slots`,
/// durably: at create to every slot, and to damaged slots once an open has
/// accepted what they might have claimed (or the volume was closed cleanly
/// and needed none of them), so that the next open does not report them
/// again.
pub(crate) fn write_placeholders(
    storage: &dyn Storage,
    uuid: &[u8; 16],
    slots: &[u64],
) -> io::Result<()> {
    if slots.is_empty() {
        return Ok(());
    }
    let mut page = [0u8; FLUSH_MARK_SLOT_SIZE];
    for &s in slots {
        let m = FlushMark::placeholder(*uuid, s);
        page[..FLUSH_MARK_LEN].copy_from_slice(&m.encode());
        storage.write_at(&page, squeeze_format::flush_mark::slot_offset(s))?;
    }
    storage.sync()
}

/// The mark saying that every record of this open with a seq below
/// `flushed_seq` is durable (an fdatasync that began after they were
/// written returned), `flushed_end` being the log head when `flushed_seq`
/// was the next seq; None when the last mark already says as much. Called
/// under the flush's second stage lock, which orders the marks' counts;
/// the caller writes the mark ([`write`]) after letting the lock go.
pub(crate) fn next(
    uuid: &[u8; 16],
    synced: &mut Synced,
    (flushed_seq, flushed_end): (u64, u64),
) -> Option<FlushMark> {
    if flushed_seq <= synced.marked_seq {
        return None;
    }
    let m = FlushMark {
        uuid: *uuid,
        count: synced.count,
        epoch_seq: synced.epoch_seq,
        flushed_seq,
        flushed_end,
    };
    synced.count += 1;
    synced.marked_seq = flushed_seq;
    Some(m)
}

/// Writes a mark to its slot. Marks of concurrent flushes may land out of
/// order; a slot is reused only sixteen marks later, and recovery takes
/// the mark that claims the most, so a late older mark never hides a newer
/// one that claims more.
pub(crate) fn write(storage: &dyn Storage, m: &FlushMark) -> io::Result<()> {
    let bytes: [u8; FLUSH_MARK_LEN] = m.encode();
    storage.write_through(&bytes, m.offset())
}
