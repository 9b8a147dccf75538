//! The two records every share is made of, for the pass (`pass.rs`) and
//! the inline write path (`inline.rs`) alike: a content written once at
//! fresh hidden addresses (`promote`), and Links of client runs to hidden
//! addresses (`link`). The callers verify the bytes and hold the range
//! locks of the runs they link (docs/DEDUP.md, "Log records").
//!
//! Invariant: the Links of a promotion are appended after its Extents,
//! in a later append, so a Link never names an address whose record was
//! not installed first.

use crate::append::Room;
use crate::counters::Counter;
use crate::error::Result;
use crate::pipeline::compress::{encode, Item};
use crate::pipeline::policy::{ActivePolicy, Hint};
use crate::pipeline::split::Piece;
use crate::space::make_room::append_making_room;
use crate::state::Inner;
use squeeze_codec::Algorithm;
use squeeze_format::SECTOR_SIZE;
use std::sync::Arc;

/// Appends one Link of each client run starting at `sharers` (`sectors`
/// long) to the hidden addresses from `h`.
pub(super) fn link(inner: &Inner, sharers: &[u64], sectors: u64, h: u64) -> Result<()> {
    let links: Vec<Item> = sharers
        .iter()
        .map(|&lba| Item::Link {
            lba,
            sectors: sectors as u32,
            target: h,
        })
        .collect();
    append_making_room(inner, &links, &[], Room::Dedup)
}

/// How a promotion's content is encoded: the codec (and whether block
/// payloads are allowed), the hint, and the buffer `run` lies in (as in
/// `encode`).
pub(super) type Encoding<'a> = ((Algorithm, bool), Hint, Option<(&'a Arc<Vec<u8>>, usize)>);

/// Writes `run` once at fresh hidden addresses (blobs of at most the
/// policy's `max_blob` sectors, compressed with `codec`; `buf` as in
/// `encode`), then links the client runs starting at `sharers` to them.
/// Returns the first hidden address.
pub(super) fn promote(
    inner: &Inner,
    policy: &ActivePolicy,
    (codec, hint, buf): Encoding<'_>,
    run: &[u8],
    sharers: &[u64],
) -> Result<u64> {
    let k = (run.len() / SECTOR_SIZE) as u64;
    let h = inner.state.write().shared.allocate(k);
    let max_blob = u64::from(policy.max_blob_sectors());
    let pieces: Vec<Piece> = (0..k)
        .step_by(max_blob as usize)
        .map(|q| Piece::Data {
            lba: h + q,
            sectors: (k - q).min(max_blob) as u32,
            start: q as usize * SECTOR_SIZE,
        })
        .collect();
    let (blob, cpu_ns) = encode(&*inner.engine, policy, codec, hint, run, buf, &pieces);
    inner.counters.add(Counter::CompressNs, cpu_ns);
    if let Some(a) = &policy.adapt {
        a.record(codec.0, run.len() as u64, cpu_ns);
    }
    append_making_room(inner, &blob, run, Room::Dedup)?;
    link(inner, sharers, k, h)?;
    Ok(h)
}
