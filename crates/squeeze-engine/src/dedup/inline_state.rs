//! Dedup mode inline's state, kept in the volume's `Inner` (`state.rs`):
//! whether the mode is on, the index budget, its sampling (1 hook in
//! `sample` fingerprints kept: a choice of the process that opened the
//! volume, `OpenOptions::dedup_inline_sample`, never stored), and the
//! index of recent content itself (made at the first write, dropped when
//! the mode or the budget changes). The write path that uses it is `dedup/inline.rs`; this
//! file depends on nothing above the index, so `state` can hold it.
//!
//! Invariant: the index is None whenever the mode is off.

use super::index::{fingerprint, hook, Index, MAX_SAMPLE};
use parking_lot::Mutex;
use squeeze_format::{DedupMode, DedupSettings};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The inline index's sampling by default: 1 fingerprint in 8 kept,
/// 0.59 GB of RAM per TB of window, under VDO's dense index's 1 GB per TB
/// (docs/DEDUP.md, "Inline", measured).
pub const INLINE_SAMPLE_DEFAULT: u64 = 8;

/// The inline mode's state: whether it is on, its index (made at the
/// first write, dropped when the mode or the budget changes).
pub(crate) struct InlineDedup {
    on: AtomicBool,
    pub(super) budget: AtomicU64,
    /// 1 fingerprint in `sample` is a hook kept in the index (a power of
    /// two, 1 to `MAX_SAMPLE`; 1 is dense).
    pub(super) sample: u64,
    pub(super) index: Mutex<Option<Index>>,
    /// Test hook (`Volume::debug_weak_inline_fingerprints`): fingerprints
    /// cut to 2 bits, so that different contents collide.
    weak: AtomicBool,
}

impl InlineDedup {
    /// `sample`: as [`valid_sample`] checks (the caller's option).
    pub(crate) fn new(s: DedupSettings, sample: u64) -> InlineDedup {
        assert!(valid_sample(sample), "inline sample {sample}");
        InlineDedup {
            on: AtomicBool::new(s.mode == DedupMode::Inline),
            budget: AtomicU64::new(s.index_bytes()),
            sample,
            index: Mutex::new(None),
            weak: AtomicBool::new(false),
        }
    }

    /// The settings changed (`Volume::set_settings`): the index is
    /// dropped unless the mode stays inline with the same budget.
    pub(crate) fn configure(&self, s: DedupSettings) {
        let on = s.mode == DedupMode::Inline;
        let mut ix = self.index.lock();
        if !on || self.budget.load(Ordering::Relaxed) != s.index_bytes() {
            *ix = None;
        }
        self.budget.store(s.index_bytes(), Ordering::Relaxed);
        self.on.store(on, Ordering::Release);
    }

    /// Whether writes go through `inline::share`.
    pub(crate) fn on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    pub(crate) fn set_weak(&self, weak: bool) {
        self.weak.store(weak, Ordering::Relaxed);
    }

    /// RAM of the index.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.index.lock().as_ref().map_or(0, Index::memory_bytes)
    }

    /// Entries (hooks) the index holds.
    pub(crate) fn entries(&self) -> u64 {
        self.index.lock().as_ref().map_or(0, |ix| ix.len() as u64)
    }

    /// 1 fingerprint in this many kept.
    pub(crate) fn sample(&self) -> u64 {
        self.sample
    }

    pub(super) fn fingerprint(&self, s: &[u8]) -> u128 {
        let fp = fingerprint(s);
        if self.weak.load(Ordering::Relaxed) {
            fp & 3
        } else {
            fp
        }
    }
}

/// Whether `sample` is a sampling the inline index takes: a power of two
/// from 1 (dense) to `MAX_SAMPLE`.
pub fn valid_sample(sample: u64) -> bool {
    sample.is_power_of_two() && sample <= MAX_SAMPLE
}

/// Whether `sector`'s fingerprint is a hook of an index keeping 1 in
/// `sample` (tests build duplicate runs around hooks with it).
pub fn is_hook(sector: &[u8], sample: u64) -> bool {
    debug_assert!(valid_sample(sample));
    hook(fingerprint(sector), sample)
}
