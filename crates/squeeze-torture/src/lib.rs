//! Process crash torture for `squeeze serve`.
//!
//! [`run`] creates a small volume (64 MiB logical, 1 MiB segments, so the
//! cleaner and checkpoints run), starts the real server, and repeats a
//! cycle: 1-3 NBD connections with several requests in flight each write
//! known content (writes with and without FUA, aligned and unaligned,
//! compressible, incompressible and zero; TRIM, WRITE_ZEROES, FLUSH and
//! READs checked live) for 50-500 ms; the server gets SIGKILL while
//! requests are in flight; it is restarted (recovery) and every sector is
//! read back and checked against the [`model`]: a sector must hold its
//! durable content (the last write acknowledged with FUA or before a
//! completed FLUSH) or a content written after it, never older or invented
//! bytes. Optionally the server is stopped between cycles and `squeeze
//! check` and `squeeze compact` (sometimes SIGKILLed part way) run on the
//! volume.
//!
//! Everything random comes from the seed (per cycle and per connection
//! streams), so a failure names its seed and cycle; the interleaving of
//! the threads and the moment of the kill relative to the requests still
//! depend on timing.

mod clients;
pub mod content;
pub mod model;
pub mod nbd;
pub mod options;
pub mod proc;
pub mod report;
pub mod rng;
pub mod torture;

pub use options::Options;
pub use report::{Failure, Totals};
pub use torture::run;
