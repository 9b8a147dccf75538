//! Deduplication of 4 KiB sectors (issue 38; the design: docs/DEDUP.md).
//!
//! Shared content lives at hidden addresses (`SHARED_BASE` and up) as
//! ordinary records; client sectors that share it hold indirect map
//! entries (`MapEntry::indirect`), written by Link records; the number of
//! sharers of each hidden address is kept from the map
//! (`space::shared::SharedRefs`). Everything below the map (compression,
//! the cleaner, relocation, checksums) sees ordinary records.
//! - `index`: the fingerprint index (XXH3-128 -> location, a bounded
//!   window);
//! - `pass`: the pass that finds duplicates and shares them (`squeeze
//!   compact --dedup`, `Volume::dedup`);
//! - `idle`: the pass run by the maintenance thread while clients are
//!   idle (dedup modes `idle` and `inline`), a step at a time, resumed
//!   from a cursor;
//! - `inline`: the write path's sharing (dedup mode `inline`): each
//!   written hook looked up in a sampled index of recent content;
//! - `extend`: a hook's match extended to the sectors around it, bytes
//!   compared (for `inline`);
//! - `inline_state`: that mode's state in the volume (on, budget,
//!   sampling, index);
//! - `share`: the records of a share (content at hidden addresses, Links),
//!   for the pass and the inline path;
//! - `orphans`: hidden addresses no sector refers to any more, zeroed.

pub(crate) mod extend;
pub mod idle;
pub(crate) mod index;
pub(crate) mod inline;
pub mod inline_state;
pub(crate) mod orphans;
pub mod pass;
pub(crate) mod share;

pub use idle::IdleStep;
pub use inline_state::{is_hook, valid_sample, INLINE_SAMPLE_DEFAULT};
pub use pass::DedupReport;
