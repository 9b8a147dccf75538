//! The idle pass (dedup modes `idle` and `inline`, docs/DEDUP.md): the maintenance
//! thread runs the deduplication pass (`pass::Pass`) while clients are
//! idle, a step at a time.
//!
//! - **Yielding.** A step reads windows until STEP_TIME has passed or a
//!   client did something (the caller's `stop`), and stops between two
//!   windows; the maintenance thread then serves the clients (its busy
//!   cleaner) and steps again once they have been idle for a while.
//! - **Resuming.** The pass under way is kept between steps (its index
//!   too), and its next LBA is the `DedupIdleCursor` counter, which
//!   checkpoints keep: a pass resumed after a restart (or by a fresh
//!   `IdleDedup`) goes on from there with an empty index. 0 = no pass
//!   under way (a stopped pass has read at least one window, so its cursor
//!   is past 0).
//! - **When a pass begins.** Once clients wrote (`BytesWritten`) at least
//!   a REARM_DIVISOR-th of the mapped bytes since the last pass began
//!   (`DedupIdleMark`, set when one begins): a volume nobody writes is not
//!   read again, and the idle reading is at most REARM_DIVISOR bytes per
//!   byte clients wrote (plus one pass after the mode is turned on).
//!
//! Everything a step writes is what `pass` writes (Extents at hidden
//! addresses, Links, Zeros): safe to cut at any point, as the pass is.

use super::pass::{DedupReport, Pass};
use crate::counters::Counter;
use crate::error::Result;
use crate::state::Inner;
use squeeze_format::SECTOR_SIZE;
use std::time::{Duration, Instant};

/// A new pass begins once clients wrote a REARM_DIVISOR-th of the mapped
/// bytes since the last began.
pub const REARM_DIVISOR: u64 = 4;
/// The longest a step reads before it gives the maintenance thread back
/// (each window is also a chance for `stop`).
pub const STEP_TIME: Duration = Duration::from_millis(100);

/// What a step did.
#[derive(Debug)]
pub enum IdleStep {
    /// Mode off, no pass due (nothing written since), or another pass
    /// holds the dedup lock.
    Nothing,
    /// Stopped between windows; the next step goes on at `at`.
    Stopped { at: u64 },
    /// A whole pass ended with this step.
    Finished(DedupReport),
}

/// The idle pass under way, if any.
#[derive(Default)]
pub(crate) struct IdleDedup {
    pass: Option<Pass>,
}

/// Whether `written` bytes since the last pass began call for a new one
/// over `mapped_sectors` client sectors.
fn due(written: u64, mapped_sectors: u64) -> bool {
    written > 0 && written.saturating_mul(REARM_DIVISOR) >= mapped_sectors * SECTOR_SIZE as u64
}

impl IdleDedup {
    /// One step: `stop()` is asked between windows (as well as STEP_TIME).
    pub(crate) fn step(
        &mut self,
        inner: &Inner,
        mut stop: impl FnMut() -> bool,
    ) -> Result<IdleStep> {
        let c = &inner.counters;
        let (settings, version) = {
            let sb = inner.sb.lock();
            (sb.dedup, sb.version)
        };
        if !settings.mode.idle_pass() || version < squeeze_format::DEDUP_VERSION {
            // Turned off: a pass under way is dropped.
            if self.pass.take().is_some() || c.get(Counter::DedupIdleCursor) != 0 {
                c.set(Counter::DedupIdleCursor, 0);
            }
            return Ok(IdleStep::Nothing);
        }
        inner.writable()?;
        let Some(_one) = inner.dedup_lock.try_write() else {
            return Ok(IdleStep::Nothing);
        };
        if self.pass.is_none() {
            let cursor = c.get(Counter::DedupIdleCursor);
            if cursor == 0 {
                let written = c.get(Counter::BytesWritten);
                // A mark past the count (counters restored from an older
                // checkpoint than the mark's): everything counts.
                let since = written
                    .checked_sub(c.get(Counter::DedupIdleMark))
                    .unwrap_or(written);
                let mapped = {
                    let st = inner.state.read();
                    st.map.mapped() - st.shared.mapped()
                };
                if !due(since, mapped) {
                    return Ok(IdleStep::Nothing);
                }
                c.set(Counter::DedupIdleMark, written);
            }
            self.pass = Some(Pass::new(inner, cursor, settings.index_bytes()));
        }
        let p = self.pass.as_mut().expect("a pass under way");
        let linked = p.rep.sectors_linked;
        let t0 = Instant::now();
        let r = p.run(inner, || t0.elapsed() >= STEP_TIME || stop(), |_, _| {});
        c.add(
            Counter::DedupIdleLinkedSectors,
            p.rep.sectors_linked - linked,
        );
        // An error keeps the pass: the next step goes on from its cursor.
        if !r? {
            debug_assert!(p.at > 0, "a stopped pass read a window");
            c.set(Counter::DedupIdleCursor, p.at.max(1));
            return Ok(IdleStep::Stopped { at: p.at });
        }
        let p = self.pass.take().expect("the pass that ran");
        c.set(Counter::DedupIdleCursor, 0);
        let rep = p.finish(inner)?;
        c.add(Counter::DedupIdlePasses, 1);
        tracing::info!(
            linked = rep.sectors_linked,
            promoted = rep.sectors_promoted,
            fingerprinted = rep.sectors_fingerprinted,
            "idle deduplication pass done"
        );
        Ok(IdleStep::Finished(rep))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_due_after_a_fraction_of_the_mapped_bytes_is_written() {
        assert!(!due(0, 0));
        assert!(!due(0, 100));
        assert!(due(1, 0));
        let mapped = 1000;
        let bytes = mapped * SECTOR_SIZE as u64;
        assert!(!due(bytes / REARM_DIVISOR - 1, mapped));
        assert!(due(bytes / REARM_DIVISOR, mapped));
    }
}
