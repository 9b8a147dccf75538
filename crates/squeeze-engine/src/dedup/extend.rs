//! The extension of an inline hook's match (dedup mode inline,
//! `dedup/inline.rs`): a hook of a write found again in the sampled index
//! names an *alignment* (the write's sector `i` holds what address `src`
//! holds); the write's sectors around `i` are compared byte for byte with
//! the sectors the same alignment puts beside `src`, a step of
//! [`STEP_SECTORS`] at a time, forward and then backward, until a sector
//! differs, is zero in the write, lies outside the source's range, or
//! (a client source) its range is busy. The run of equal sectors around
//! the hook is what the caller may link.
//!
//! Invariants:
//! - Only bytes read here are compared: the index says where to look,
//!   never what is there.
//! - A client source's sectors are read under their range locks, taken
//!   with `RangeLocks::try_lock` only (the writer holds its own range: it
//!   never waits for a second one) and handed to the caller with the run,
//!   so that the bytes compared are the bytes linked. A client source
//!   never overlaps the write's own range (`lba..lba + n`), nor leaves the
//!   volume.
//! - Hidden addresses are read under the dedup lock, which the caller
//!   holds (shared): nothing zeroes them until its Link is installed.
//! - The work is bounded by the run found plus a step each way: a hook
//!   whose neighbours differ costs one step's read.

use super::index::Loc;
use crate::error::{EngineError, Result};
use crate::locks::RangeGuard;
use crate::meta::pager;
use crate::read;
use crate::state::Inner;
use squeeze_format::{MapEntry, SECTOR_SIZE, SHARED_BASE, SHARED_SECTORS};

/// Sectors read and compared at a time: a default blob.
pub(crate) const STEP_SECTORS: usize = 32;

/// A run of the write's sectors `a..b` equal to the sectors from
/// `source` (the address of sector `a` at the hook's alignment), with the
/// range locks of a client source held.
pub(crate) struct Found<'a> {
    pub(crate) a: usize,
    pub(crate) b: usize,
    pub(crate) source: u64,
    _locks: Vec<RangeGuard<'a>>,
}

/// What came of a hook.
pub(crate) enum Extended<'a> {
    /// The run around the hook (at least the hook's own sector).
    Run(Found<'a>),
    /// The hook's own sector differs from its source's (a fingerprint
    /// collision, or a source rewritten since it was remembered, or
    /// failing its checksum).
    Differ,
    /// The hook's source sector is being written (its range lock is
    /// taken) or out of the volume.
    Busy,
    /// The hook's source no longer holds its own record (a client sector
    /// shared or trimmed since it was remembered, a hidden address
    /// zeroed): nothing to compare.
    Gone,
}

/// A step's source: its bytes and map entries.
struct Held {
    bytes: Vec<u8>,
    entries: Vec<MapEntry>,
}

/// How a step's read went.
enum Step {
    Read,
    Busy,
    Corrupt,
}

/// Extends the match of the write's hook `i` (the write: `chunk`, whole
/// sectors from `lba`; `nonzero[j]`: whether sector `j` is not all
/// zeros) at `src`, no further back than sector `floor` (the end of the
/// last run the write shared).
pub(crate) fn extend<'a>(
    inner: &'a Inner,
    chunk: &[u8],
    nonzero: &[bool],
    lba: u64,
    i: usize,
    src: Loc,
    floor: usize,
) -> Result<Extended<'a>> {
    let n = nonzero.len();
    debug_assert!(i < n && floor <= i && nonzero[i]);
    // The address of the write's sector 0 at this alignment, and the
    // addresses a source may have.
    let base = src.addr() as i128 - i as i128;
    let range = match src {
        Loc::Shared(_) => SHARED_BASE as i128..(SHARED_BASE + SHARED_SECTORS) as i128,
        Loc::Client(y) if y < lba => 0..lba as i128,
        Loc::Client(_) => (lba + n as u64) as i128..(inner.size() / SECTOR_SIZE as u64) as i128,
    };
    if !range.contains(&(src.addr() as i128)) {
        return Ok(Extended::Busy);
    }
    let lo = (range.start - base).max(floor as i128) as usize;
    let hi = (range.end - base).min(n as i128) as usize;
    let client = matches!(src, Loc::Client(_));
    let mut locks = Vec::new();
    let mut held = Held {
        bytes: vec![0u8; STEP_SECTORS * SECTOR_SIZE],
        entries: vec![MapEntry::UNMAPPED; STEP_SECTORS],
    };
    let sector = |j: usize| &chunk[j * SECTOR_SIZE..(j + 1) * SECTOR_SIZE];
    // Reads the source of the write's sectors p..q into `held`, under
    // their range lock for a client source.
    let read_step = |p: usize, q: usize, held: &mut Held, locks: &mut Vec<RangeGuard<'a>>| {
        let at = (base + p as i128) as u64;
        let end = (base + q as i128) as u64;
        if client {
            match inner.ranges.try_lock(at, end) {
                Some(g) => locks.push(g),
                None => return Ok(Step::Busy),
            }
        }
        let entries = &mut held.entries[..q - p];
        pager::with_map(inner, |st| st.map.get_range(at, entries))?;
        match read::read_sectors(inner, at, &mut held.bytes[..(q - p) * SECTOR_SIZE]) {
            Ok(()) => Ok(Step::Read),
            Err(EngineError::Corrupt { .. } | EngineError::Codec { .. }) => Ok(Step::Corrupt),
            Err(e) => Err(e),
        }
    };
    // A hidden address must hold a record, a client source its own (one
    // shared already is found from its hidden address's hooks: promoting
    // it again would store its content twice).
    let equal = |held: &Held, p: usize, j: usize| {
        nonzero[j]
            && held.entries[j - p].is_direct()
            && held.bytes[(j - p) * SECTOR_SIZE..(j - p + 1) * SECTOR_SIZE] == *sector(j)
    };
    // Forward from the hook.
    let mut b = i;
    loop {
        let (p, q) = (b, (b + STEP_SECTORS).min(hi));
        match read_step(p, q, &mut held, &mut locks)? {
            Step::Read => {}
            // The hook's own sector busy, or failing its checksum.
            Step::Busy if b == i => return Ok(Extended::Busy),
            Step::Corrupt if b == i => return Ok(Extended::Differ),
            Step::Busy | Step::Corrupt => break,
        }
        if b == i && !held.entries[0].is_direct() {
            return Ok(Extended::Gone);
        }
        while b < q && equal(&held, p, b) {
            b += 1;
        }
        if b < q || q == hi {
            break;
        }
    }
    if b == i {
        return Ok(Extended::Differ);
    }
    // Backward from the hook.
    let mut a = i;
    while a > lo {
        let (p, q) = (a.saturating_sub(STEP_SECTORS).max(lo), a);
        if !matches!(read_step(p, q, &mut held, &mut locks)?, Step::Read) {
            break;
        }
        while a > p && equal(&held, p, a - 1) {
            a -= 1;
        }
        if a > p {
            break;
        }
    }
    Ok(Extended::Run(Found {
        a,
        b,
        source: (base + a as i128) as u64,
        _locks: locks,
    }))
}
