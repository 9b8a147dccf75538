//! `Volume`'s maintenance passes on demand (tests, `squeeze compact`, the
//! CLI): one bounded pass of the cleaner, the upgrade or the idle squeeze,
//! the merger, a full compaction, deduplication (a whole pass, or a step of
//! the idle one), a checkpoint now. Each is
//! a hand-off to its stage in `space`, `dedup` or `meta`; the maintenance
//! thread runs the same stages by itself.

use crate::counters::Counter;
use crate::dedup::idle::{IdleDedup, IdleStep};
use crate::error::Result;
use crate::meta::checkpoint;
use crate::space::merge::MergeReport;
use crate::space::relocate::CleanReport;
use crate::volume::Volume;

impl Volume {
    /// Runs one bounded cleaner pass (at most one victim segment) if there
    /// is garbage worth collecting.
    pub fn clean_pass(&self) -> Result<Option<CleanReport>> {
        self.inner.writable()?;
        crate::space::cleaner::background_pass(&self.inner)
    }

    /// Runs one step of the upgrade (what the adaptive codec wrote below
    /// the policy's algorithm under load is rewritten with it; the
    /// maintenance thread does this while clients are idle): at most one
    /// segment. None when no segment is known to hold such bytes.
    pub fn upgrade_pass(&self) -> Result<Option<CleanReport>> {
        self.inner.writable()?;
        crate::space::upgrade::upgrade_pass(&self.inner)
    }

    /// Runs one step of the idle squeeze (compressed data written at the
    /// target is rewritten with the policy's idle level; the maintenance
    /// thread does this while clients are idle, after the upgrade): at most
    /// one segment. None without an idle level or such bytes in a sealed
    /// segment. See [`crate::space::squeeze`].
    pub fn squeeze_pass(&self) -> Result<Option<CleanReport>> {
        self.inner.writable()?;
        crate::space::squeeze::squeeze_pass(&self.inner)
    }

    /// Rewrites every fragmented window (scattered small records) as whole
    /// blobs with the current policy; see [`crate::space::merge`]. The
    /// records it replaces become garbage for [`Volume::compact`].
    /// `progress(lba, total_sectors)`.
    pub fn merge(&self, progress: impl FnMut(u64, u64)) -> Result<MergeReport> {
        self.inner.writable()?;
        crate::space::merge::merge_all(&self.inner, progress)
    }

    /// Upgrades what was written below the policy's algorithm (see
    /// [`Volume::upgrade_pass`]; after a reopen, every record of a codec
    /// under the target's), cleans every segment that holds dead bytes,
    /// then checkpoints so the victims are freed and punched out. `progress(done, total)` victims.
    pub fn compact(&self, progress: impl FnMut(u64, u64)) -> Result<CleanReport> {
        self.inner.writable()?;
        crate::space::upgrade::compact(&self.inner, progress)
    }

    /// Finds sectors whose content the volume holds more than once and
    /// shares it (see [`crate::dedup`]), with a fingerprint index of at
    /// most `index_budget` bytes; the records it replaces become garbage
    /// for [`Volume::compact`]. `progress(lba, total_sectors)`.
    pub fn dedup(
        &self,
        index_budget: u64,
        progress: impl FnMut(u64, u64),
    ) -> Result<crate::dedup::DedupReport> {
        self.inner.writable()?;
        // Links and indirect entries only once the superblock says a
        // version that has them (durably): a checkpoint makes it so.
        if self.inner.sb.lock().version < squeeze_format::DEDUP_VERSION {
            checkpoint::write(&self.inner, false)?;
        }
        let c = &self.inner.counters;
        let written = c.get(Counter::BytesWritten);
        let rep = crate::dedup::pass::pass(&self.inner, index_budget, progress)?;
        // A whole pass: the idle mode's next one waits for new writes.
        c.set(Counter::DedupIdleMark, written);
        c.set(Counter::DedupIdleCursor, 0);
        Ok(rep)
    }

    /// Runs one step of the idle deduplication pass (dedup mode `idle`;
    /// the maintenance thread does this while clients are idle, see
    /// [`crate::dedup::idle`]): at most `windows` windows (fewer when the
    /// step's time is up), from the cursor a stopped pass left.
    /// `IdleStep::Nothing` with mode off or no pass due.
    pub fn dedup_idle_step(&self, windows: u64) -> Result<IdleStep> {
        self.inner.writable()?;
        let mut n = 0;
        IdleDedup::default().step(&self.inner, || {
            n += 1;
            n >= windows
        })
    }

    /// Writes a checkpoint now (frees segments whose data is all dead).
    pub fn checkpoint(&self) -> Result<()> {
        self.inner.writable()?;
        checkpoint::write(&self.inner, false)
    }
}
