//! Dedup mode inline's state, kept in the volume's `Inner` (`state.rs`):
//! whether the mode is on, the index budget, and the index of recent
//! content itself (made at the first write, dropped when the mode or the
//! budget changes). The write path that uses it is `dedup/inline.rs`; this
//! file depends on nothing above the index, so `state` can hold it.
//!
//! Invariant: the index is None whenever the mode is off.

use super::index::{fingerprint, Index};
use parking_lot::Mutex;
use squeeze_format::{DedupMode, DedupSettings};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The inline mode's state: whether it is on, its index (made at the
/// first write, dropped when the mode or the budget changes).
pub(crate) struct InlineDedup {
    on: AtomicBool,
    pub(super) budget: AtomicU64,
    pub(super) index: Mutex<Option<Index>>,
    /// Test hook (`Volume::debug_weak_inline_fingerprints`): fingerprints
    /// cut to 2 bits, so that different contents collide.
    weak: AtomicBool,
}

impl InlineDedup {
    pub(crate) fn new(s: DedupSettings) -> InlineDedup {
        InlineDedup {
            on: AtomicBool::new(s.mode == DedupMode::Inline),
            budget: AtomicU64::new(s.index_bytes()),
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

    pub(super) fn fingerprint(&self, s: &[u8]) -> u128 {
        let fp = fingerprint(s);
        if self.weak.load(Ordering::Relaxed) {
            fp & 3
        } else {
            fp
        }
    }
}
