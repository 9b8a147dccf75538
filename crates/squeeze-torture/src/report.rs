//! What a torture run reports: its totals, or the failure with the seed,
//! cycle and command that replay it; and the counters of the server it
//! reads each cycle to add to the totals.

use crate::model::VerifyCounts;
use std::fmt;
use std::path::PathBuf;

/// A failed run: where, and what was wrong.
#[derive(Debug)]
pub struct Failure {
    pub seed: u64,
    pub cycle: u64,
    pub message: String,
    pub replay: String,
    pub workdir: Option<PathBuf>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "squeeze-torture FAILED at seed {} cycle {}:",
            self.seed, self.cycle
        )?;
        writeln!(f, "{}", self.message)?;
        writeln!(
            f,
            "replay (same operation stream; timing differs): {}",
            self.replay
        )?;
        if let Some(d) = &self.workdir {
            writeln!(f, "work dir kept (volume, serve.log): {}", d.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

/// What a run did.
#[derive(Default, Debug, Clone)]
pub struct Totals {
    pub cycles: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub unaligned_writes: u64,
    pub bytes_written: u64,
    pub reads: u64,
    pub flushes: u64,
    pub trims: u64,
    pub write_zeroes: u64,
    pub connections: u64,
    /// Requests sent but not answered when the server was killed.
    pub in_flight_at_kill: u64,
    pub kills: u64,
    pub clean_stops: u64,
    pub compacts: u64,
    pub compacts_killed: u64,
    pub checks: u64,
    pub verify: VerifyCounts,
    /// The volume's own counters (`squeeze stats`), summed over the server
    /// runs (each sampled after the start and just before the SIGKILL):
    /// checkpoints written, segments reclaimed, bytes the cleaner moved,
    /// log bytes written, bytes the idle merger rewrote.
    pub checkpoints: u64,
    pub segments_reclaimed: u64,
    pub cleaner_bytes_moved: u64,
    pub log_bytes_written: u64,
    pub merged_bytes: u64,
    /// Raw bytes written below the target codec, and raw bytes the idle
    /// upgrade rewrote with it (with `saturated_engine`).
    pub below_target_bytes: u64,
    pub upgraded_bytes: u64,
    /// Idle cycles whose server had upgraded bytes before its SIGKILL (the
    /// kill then lands during or right after an upgrade pass).
    pub kills_after_upgrades: u64,
    /// Whole idle dedup passes, the sectors they linked, and SIGKILLs that
    /// found one under way (its cursor past 0 just before the kill).
    pub dedup_idle_passes: u64,
    pub dedup_idle_linked_sectors: u64,
    pub kills_in_dedup_passes: u64,
    /// Cycles run in dedup mode inline (`--dedup`: every other one), and
    /// the client sectors linked as they were written.
    pub inline_cycles: u64,
    pub dedup_inline_linked_sectors: u64,
    /// Aligned writes that copied other sectors' content (`--dedup`).
    pub copy_writes: u64,
    pub seconds: f64,
}

impl fmt::Display for Totals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cycles in {:.1} s: {} SIGKILLs with {} requests in flight, {} connections; {} writes ({} FUA, {} unaligned, {:.1} MiB), {} reads, {} flushes, {} trims, {} write-zeroes; {} clean stops, {} compacts ({} killed), {} checks; after the crashes: {} sectors at their latest content, {} at an intermediate one, {} rolled back to durable; {} of these lost an acknowledged unflushed write; volume: {} checkpoints, {} segments reclaimed, cleaner moved {:.1} MiB, merger rewrote {:.1} MiB, log {:.1} MiB; {:.1} MiB written below the target codec, {:.1} MiB upgraded, {} idle kills after upgrades; {} copy writes, {} idle dedup passes linked {} sectors, {} kills with a dedup pass under way; {} cycles in dedup mode inline linked {} sectors as written",
            self.cycles,
            self.seconds,
            self.kills,
            self.in_flight_at_kill,
            self.connections,
            self.writes,
            self.fua_writes,
            self.unaligned_writes,
            self.bytes_written as f64 / (1u64 << 20) as f64,
            self.reads,
            self.flushes,
            self.trims,
            self.write_zeroes,
            self.clean_stops,
            self.compacts,
            self.compacts_killed,
            self.checks,
            self.verify.latest,
            self.verify.intermediate,
            self.verify.rolled_back,
            self.verify.lost_acked_unflushed,
            self.checkpoints,
            self.segments_reclaimed,
            self.cleaner_bytes_moved as f64 / (1u64 << 20) as f64,
            self.merged_bytes as f64 / (1u64 << 20) as f64,
            self.log_bytes_written as f64 / (1u64 << 20) as f64,
            self.below_target_bytes as f64 / (1u64 << 20) as f64,
            self.upgraded_bytes as f64 / (1u64 << 20) as f64,
            self.kills_after_upgrades,
            self.copy_writes,
            self.dedup_idle_passes,
            self.dedup_idle_linked_sectors,
            self.kills_in_dedup_passes,
            self.inline_cycles,
            self.dedup_inline_linked_sectors
        )
    }
}

/// checkpoints, segments_reclaimed, cleaner_bytes_moved, log_bytes_written,
/// merged_bytes, below_target_bytes, upgraded_bytes, dedup_idle_passes,
/// dedup_idle_linked_sectors, dedup_idle_cursor,
/// dedup_inline_linked_sectors of a running server.
pub(crate) type Counters = [u64; 11];
