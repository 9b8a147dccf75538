//! When the cleaner works and which victims it takes ([`GcPolicy`], the
//! garbage budget and its limits): the policy half of the cleaner's
//! "policy and victim choice", a part of `Inner` (`Inner::gc`) with the
//! thresholds the checkpoint and the maintenance thread share. It imports
//! nothing of the engine, so everything above `state` may name it.

/// When free room is short, any segment below this live fraction will do.
pub const VICTIM_LIVE_MAX_TIGHT: f64 = 0.98;

/// When the cleaner works and which segments it thinks worth a copy: the
/// trade between the space dead bytes hold and the bytes that copying them
/// away writes (write amplification: the flash wear the seeds warn of).
/// Freeing a segment that is `u` live copies `u / (1 - u)` bytes per byte
/// freed, and the more garbage the log may keep, the emptier its victims:
/// on ext4 under fsx and fsstress a budget of 15% made the cleaner copy
/// 2.3 bytes per compressed byte clients wrote, 50% 0.42
/// (docs/benchmarks-history.md, "The garbage budget").
///
/// - While clients write, the cleaner starts once dead bytes exceed the
///   budget's share of the sealed log segments and takes victims below
///   `1 - budget` live.
/// - While they are idle, it starts at half the budget and takes only
///   victims at most half live (a byte copied per byte freed at worst).
/// - The budget is spent only from free room: when the room left (free and
///   allocatable segments under `--max-physical`, and the file system's
///   free space) is less than the budget's share of the sealed log, the
///   budget shrinks to that share, down to [`GARBAGE_BUDGET_MIN`]; with
///   fewer than 8 free segments any victim below 98% live will do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GcPolicy {
    /// Share of the sealed log that dead bytes may reach before the busy
    /// cleaner copies, in [`GARBAGE_BUDGET_MIN`]..=[`GARBAGE_BUDGET_MAX`].
    pub garbage_budget: f64,
}

/// The smallest budget (the cleaner's thresholds before the budget existed).
pub const GARBAGE_BUDGET_MIN: f64 = 0.15;
/// The largest budget a user may set: beyond it busy victims would have to
/// be less than 40% live and the log could hold 1.5 dead bytes per live one.
pub const GARBAGE_BUDGET_MAX: f64 = 0.6;
/// The default budget: write amplification 1.4-1.5 under ext4 with fsx and
/// fsstress (3.3 with the old 15%), for about a fifth more space at rest
/// (docs/benchmarks.md, "File-system write amplification").
pub const GARBAGE_BUDGET_DEFAULT: f64 = 0.5;
/// Idle cleaning takes victims at most this live.
pub const IDLE_VICTIM_LIVE_MAX: f64 = 0.5;

impl Default for GcPolicy {
    fn default() -> Self {
        GcPolicy {
            garbage_budget: GARBAGE_BUDGET_DEFAULT,
        }
    }
}

impl GcPolicy {
    /// A policy with `budget` (a fraction), refused outside the range.
    pub fn with_budget(budget: f64) -> std::result::Result<GcPolicy, BudgetOutOfRange> {
        if !(GARBAGE_BUDGET_MIN..=GARBAGE_BUDGET_MAX).contains(&budget) {
            return Err(BudgetOutOfRange { budget });
        }
        Ok(GcPolicy {
            garbage_budget: budget,
        })
    }
}

/// A garbage budget outside `GARBAGE_BUDGET_MIN..=GARBAGE_BUDGET_MAX`.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error(
    "a garbage budget of {:.0}% is outside {:.0}%..={:.0}%",
    budget * 100.0,
    GARBAGE_BUDGET_MIN * 100.0,
    GARBAGE_BUDGET_MAX * 100.0
)]
pub struct BudgetOutOfRange {
    /// The budget asked for (a fraction).
    pub budget: f64,
}

/// Fewer free segments than this, and the cleaner takes any victim and
/// dead segments are freed at once.
pub const TIGHT_SEGMENTS: u64 = 8;
