//! `Volume`'s settings, on a volume in use as well: the compression policy,
//! the cap on the backing file (`--max-physical`), deduplication's mode and
//! index budget (docs/DEDUP.md), all kept in the superblock and changed
//! together by `set_settings`; and the adaptive codec's burst floor, which
//! is not stored.

use crate::error::{EngineError, Invalid, Result};
use crate::meta::{checkpoint, superblock as sbio};
use crate::pipeline::burst::BurstFloor;
use crate::pipeline::policy::ActivePolicy;
use crate::state::log_state::max_segments;
use crate::volume::Volume;
use squeeze_format::{DedupSettings, Policy, CHUNKED_VERSION, DATA_START, DEDUP_VERSION};

/// Settings to change; `None` leaves one as it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct SettingsChange {
    pub policy: Option<Policy>,
    /// Bytes, 0 = no cap (see [`Volume::set_max_physical`]).
    pub max_physical: Option<u64>,
    pub dedup: Option<DedupSettings>,
}

impl Volume {
    pub fn policy(&self) -> Policy {
        self.inner.policy.read().policy
    }

    /// Deduplication's mode and index budget.
    pub fn dedup_settings(&self) -> DedupSettings {
        self.inner.sb.lock().dedup
    }

    /// Test hook: the inline index's fingerprints cut to 2 bits, so that
    /// different contents collide and every share must be refused by the
    /// comparison of bytes (`tests/dedup_inline.rs`, the simulator).
    #[doc(hidden)]
    pub fn debug_weak_inline_fingerprints(&self, weak: bool) {
        self.inner.inline.set_weak(weak);
    }

    /// Changes the policy for future writes and records it durably.
    pub fn set_policy(&self, policy: Policy) -> Result<()> {
        self.set_settings(SettingsChange {
            policy: Some(policy),
            ..Default::default()
        })
    }

    /// Changes the cap on the backing file's allocated bytes
    /// (`--max-physical`; 0 = none), on a volume in use as well. A lower
    /// cap is refused while a segment past it is in use (clean or compact
    /// first); segments past it that are free are forgotten. Both superblock
    /// slots are rewritten, as for [`Volume::resize`].
    pub fn set_max_physical(&self, bytes: u64) -> Result<()> {
        self.set_settings(SettingsChange {
            max_physical: Some(bytes),
            ..Default::default()
        })
    }

    /// Changes the policy for future writes, the cap on the backing file's
    /// allocated bytes (see [`Volume::set_max_physical`]) and the
    /// deduplication settings, any of them, all or nothing: every change is
    /// checked before any is made, and one superblock (written to both
    /// slots, as for [`Volume::resize`]) records them together. On a volume
    /// in use as well. Dedup settings need format 7: an older volume is
    /// upgraded by a checkpoint first.
    pub fn set_settings(&self, change: SettingsChange) -> Result<()> {
        let SettingsChange {
            policy,
            max_physical,
            dedup,
        } = change;
        if let Some(p) = &policy {
            p.validate()
                .map_err(|e| EngineError::Invalid(Invalid::Format(e)))?;
        }
        if let Some(d) = &dedup {
            d.validate()
                .map_err(|e| EngineError::Invalid(Invalid::Format(e)))?;
        }
        let _one = self.inner.resize_lock.lock();
        let seg = self.inner.seg_size;
        if let Some(bytes) = max_physical.filter(|&b| b != 0 && b < DATA_START + 4 * seg) {
            return Err(EngineError::Invalid(Invalid::MaxPhysicalTooSmall {
                bytes,
                min: DATA_START + 4 * seg,
            }));
        }
        self.inner.writable()?;
        // The dedup settings live in format 7's superblock (docs/FORMAT.md):
        // a checkpoint makes an older volume 7 first.
        if dedup.is_some_and(|d| d != DedupSettings::default())
            && self.inner.sb.lock().version < DEDUP_VERSION
        {
            checkpoint::write(&self.inner, false)?;
        }
        let _one = self.inner.ckpt_lock.lock();
        let mut log = self.inner.log.lock();
        let mut sb = self.inner.sb.lock();
        let mut next = sb.clone();
        if let Some(p) = policy {
            next.policy = p;
            // Version 4 and 5 differ only in the records version 5 may
            // write: a version 4 volume that asks for chunks is version 5
            // from this superblock on (older ones upgrade at their next
            // checkpoint first).
            if p.read_chunk != 0 && next.version + 1 == CHUNKED_VERSION {
                next.version = CHUNKED_VERSION;
            }
        }
        if let Some(bytes) = max_physical {
            next.max_physical = bytes;
        }
        if let Some(d) = dedup {
            next.dedup = d;
        }
        next.validate()
            .map_err(|e| EngineError::Invalid(Invalid::Format(e)))?;
        let cap = max_segments(&next);
        if let Some(bytes) = max_physical {
            if let Some(s) = log.table.first_used_from(cap) {
                return Err(EngineError::Invalid(Invalid::CapOverData {
                    bytes,
                    segment: s,
                    offset: sb.segment_offset(s),
                }));
            }
        }
        for _ in 0..2 {
            sbio::write(&*self.inner.storage, &mut next).inspect_err(|e| self.inner.poison(e))?;
        }
        if max_physical.is_some() {
            log.table.set_cap(cap);
            tracing::info!(
                from = sb.max_physical,
                to = next.max_physical,
                "max-physical changed"
            );
        }
        if dedup.is_some() && next.dedup != sb.dedup {
            tracing::info!(
                mode = next.dedup.mode.name(),
                index_mib = next.dedup.index_mib,
                "dedup settings changed"
            );
        }
        drop(log);
        if let Some(p) = policy {
            let mut active = self.inner.policy.write();
            let adapt = active.adapt.as_ref().map(|a| a.config());
            *active = ActivePolicy::with_adaptation(p, adapt);
        }
        self.inner.inline.configure(next.dedup);
        *sb = next;
        Ok(())
    }

    /// Sets the adaptive codec's lowest rung under saturated cores
    /// (`OpenOptions::burst_floor`) for the writes to come; the volume's
    /// file is not touched. None when the volume does not adapt.
    pub fn set_burst_floor(&self, floor: BurstFloor) -> Option<BurstFloor> {
        let p = self.inner.policy.read();
        let a = p.adapt.as_ref()?;
        a.set_floor(floor);
        Some(a.floor())
    }
}
