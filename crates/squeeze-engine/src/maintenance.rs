//! The maintenance thread (`sqz-maintenance`): while clients write, one
//! cleaner victim at a time with a rest as long as it took; once they have
//! been idle for IDLE_AFTER, deduplicating (dedup mode idle: `dedup::idle`,
//! a step of the pass, stopped between windows when a client comes),
//! merging, upgrading (rewriting with the target codec what the adaptive
//! codec wrote below it), squeezing (rewriting with the policy's idle level
//! what was written at the target: `space::squeeze`) and cleaning without
//! pause, one bounded step at a time; a checkpoint every CHECKPOINT_LOG_BYTES of log
//! or when dead segments wait to be freed (RECLAIM_BATCH of them while
//! clients write, any when idle or short of free segments).

use crate::counters::Counter;
use crate::meta::checkpoint;
use crate::meta::pager;
use crate::state::Inner;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Log bytes after which the background thread writes a checkpoint.
pub const CHECKPOINT_LOG_BYTES: u64 = 256 << 20;
/// ... or this many, when the map is over its cache (`meta::pager`).
pub const PRESSURE_LOG_BYTES: u64 = 16 << 20;

/// While clients write, dead segments wait until this many can be freed by
/// one checkpoint (on a small busy volume the cleaner empties a segment
/// every second or so, and a checkpoint for each was most of its checkpoint
/// bytes: issue 15).
pub const RECLAIM_BATCH: u64 = 4;

/// Fewer free segments than the cleaner's tight limit, in the volume's
/// segment table or in the file system under it.
fn short_of_room(inner: &Inner) -> bool {
    let tight = crate::space::gc_policy::TIGHT_SEGMENTS;
    inner.log.lock().table.available() < tight
        || matches!(inner.storage.free_bytes(),
            Ok(Some(free)) if free < tight * inner.seg_size)
}

/// Clients quiet this long, and the maintenance thread works without pause.
pub const IDLE_AFTER: Duration = Duration::from_secs(1);

/// Changes whenever a client reads, writes, trims or zeroes.
fn client_activity(inner: &Inner) -> u64 {
    let c = &inner.counters;
    c.get(Counter::BytesWritten)
        .wrapping_add(c.get(Counter::BytesRead))
        .wrapping_add(c.get(Counter::SectorsTrimmed))
}

/// The merger's state in the maintenance thread.
#[derive(Default)]
struct MergeState {
    cursor: crate::space::merge::Cursor,
    /// Clients wrote since the current sweep began.
    dirty: bool,
    /// Client activity at which a whole sweep found nothing to merge: no
    /// sweep until it changes.
    settled: Option<u64>,
    /// The merger stepped last while the upgrade had work: the upgrade's
    /// turn (they alternate while both have work, see `idle_step`).
    upgrade_turn: bool,
}

impl MergeState {
    /// The cleaner rewrote the live runs of partly live records apart, which
    /// may have fragmented their windows again: the merger sweeps once more.
    fn cleaned(&mut self, rep: &crate::space::relocate::CleanReport) {
        if rep.partial_records > 0 {
            self.settled = None;
        }
    }
}

/// The idle deduplication in the maintenance thread.
#[derive(Default)]
struct DedupState {
    idle: crate::dedup::idle::IdleDedup,
    /// Client activity at which a step failed (out of room, read-only): no
    /// step until it changes.
    failed_at: Option<u64>,
}

/// One step of work while clients are idle; false when there is none left.
fn idle_step(inner: &Inner, ms: &mut MergeState, dd: &mut DedupState, activity: u64) -> bool {
    use crate::space::{cleaner, merge, upgrade, victim};
    // Merging turns the records it replaces into garbage: collect it first
    // once there is as much as the busy cleaner would start at.
    let (dead, total) = victim::collectable(inner);
    if total > 0 && dead as f64 > victim::budget(inner, total) * total as f64 {
        match cleaner::background_pass(inner) {
            Ok(Some(rep)) => {
                ms.cleaned(&rep);
                return true;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!("cleaner pass failed: {e}");
                return false;
            }
        }
    }
    // Dedup mode idle: a step of the pass, which stops between windows
    // as soon as a client does something. Before the merger: it leaves
    // shared sectors alone, so what the pass links it need not rewrite
    // (merging content about to be shared is wasted work).
    if dd.failed_at != Some(activity) {
        match dd.idle.step(inner, || client_activity(inner) != activity) {
            Ok(crate::dedup::IdleStep::Nothing) => {}
            Ok(_) => return true,
            Err(e) => {
                tracing::info!("idle deduplication stopped: {e}");
                dd.failed_at = Some(activity);
            }
        }
    }
    // The merger, and the upgrade after it, take turns while both have
    // work: a client that writes a little between idle spells (a
    // database's background writer) fragments windows again during every
    // sweep, so the sweep never settles, and an upgrade that waited for it
    // never ran (4.8-5.2 GB still below the target 120 s after session
    // 25's PostgreSQL runs).
    let merge_due = inner.idle_merge && ms.settled != Some(activity) && merge::worthwhile(inner);
    if merge_due && !ms.upgrade_turn {
        ms.upgrade_turn = true;
        merge_step(inner, ms, activity);
        return true;
    }
    ms.upgrade_turn = false;
    // Shared content no client sector refers to any more (its sharers
    // were overwritten or trimmed): zeroed, so the cleaner can take it.
    if inner.state.read().shared.orphan_count() > 0 {
        match crate::dedup::orphans::zero_now(inner) {
            Ok(n) if n > 0 => return true,
            Ok(_) => {}
            Err(e) => tracing::info!("zeroing unshared content stopped: {e}"),
        }
    }
    // Bytes written below the target under load: rewritten with it now.
    match upgrade::upgrade_pass(inner) {
        Ok(Some(_)) => return true,
        Ok(None) => {}
        Err(e) => tracing::info!("upgrade stopped: {e}"),
    }
    if merge_due {
        merge_step(inner, ms, activity);
        return true;
    }
    // Then what was written at the target: rewritten with the idle level.
    match crate::space::squeeze::squeeze_pass(inner) {
        Ok(Some(_)) => return true,
        Ok(None) => {}
        Err(e) => tracing::info!("squeeze stopped: {e}"),
    }
    match cleaner::idle_pass(inner) {
        Ok(Some(rep)) => {
            ms.cleaned(&rep);
            true
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!("cleaner pass failed: {e}");
            false
        }
    }
}

/// One step of the merger's sweep; a sweep that merged nothing while no
/// client wrote settles it until clients do something.
fn merge_step(inner: &Inner, ms: &mut MergeState, activity: u64) {
    if ms.cursor.lba == 0 {
        ms.cursor.merged_this_sweep = 0;
        ms.dirty = false;
    }
    match crate::space::merge::step(inner, &mut ms.cursor) {
        Ok((_, done)) => {
            if done && ms.cursor.merged_this_sweep == 0 && !ms.dirty {
                ms.settled = Some(activity);
            }
        }
        Err(e) => {
            // Out of room or read-only: try again after clients did
            // something.
            tracing::info!("merger stopped: {e}");
            ms.settled = Some(activity);
        }
    }
}

pub(crate) fn maintenance_loop(inner: &Arc<Inner>) {
    let (m, cv) = &inner.stop;
    let mut pause = Duration::from_millis(500);
    let mut activity = client_activity(inner);
    let mut active_at = Instant::now();
    let mut ms = MergeState::default();
    let mut dd = DedupState::default();
    loop {
        {
            let mut stop = m.lock();
            if *stop {
                return;
            }
            if !pause.is_zero() {
                cv.wait_for(&mut stop, pause);
            }
            if *stop {
                return;
            }
        }
        pause = Duration::from_millis(500);
        if inner.poisoned.lock().is_some() {
            continue;
        }
        let a = client_activity(inner);
        if a != activity {
            activity = a;
            active_at = Instant::now();
            ms.dirty = true;
        }
        if active_at.elapsed() >= IDLE_AFTER {
            // Clients are away: merge and clean without pause, one bounded
            // step at a time, so a request that arrives waits for one step.
            if idle_step(inner, &mut ms, &mut dd, activity) {
                pause = Duration::ZERO;
            } else if let Err(e) = crate::space::ahead::release(inner) {
                // Nothing left to do: the head keeps only its step.
                tracing::debug!("giving back the allocation ahead of the log head: {e}");
            }
        } else {
            // Clean one victim; then rest as long as it took, so client I/O
            // keeps at least half of the time.
            let t0 = Instant::now();
            match crate::space::cleaner::background_pass(inner) {
                Ok(Some(_)) => pause = t0.elapsed().max(Duration::from_millis(1)),
                Ok(None) => {}
                Err(e) => tracing::warn!("cleaner pass failed: {e}"),
            }
        }
        let since = inner.log.lock().bytes_since_checkpoint;
        // What changed since the last checkpoint stays in memory (the
        // overlays of changed chunks paged out, and changed chunks that
        // cannot page out): when it holds the map over its cache, a
        // checkpoint comes early.
        let due = since >= CHECKPOINT_LOG_BYTES
            || (since >= PRESSURE_LOG_BYTES && pager::map_over_cache(inner));
        // Dead segments are freed by a checkpoint: while clients write, one
        // for every RECLAIM_BATCH of them (each checkpoint is a delta, a
        // superblock and a sync); at once when idle or short of segments or
        // of room in the file system.
        let waiting = checkpoint::reclaimable_segments(inner);
        let reclaim = waiting > 0
            && (waiting >= RECLAIM_BATCH
                || active_at.elapsed() >= IDLE_AFTER
                || short_of_room(inner));
        if due || reclaim {
            if let Err(e) = checkpoint::write(inner, false) {
                tracing::warn!("background checkpoint failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{default_policy, CreateOptions, OpenOptions, SimStorage, Volume};

    /// A client that writes one sector between idle steps (fragmenting a
    /// window, and changing the activity each time, so the merger's sweep
    /// never settles): the upgrade still runs, in turns with the merger.
    #[test]
    fn the_upgrade_takes_turns_with_a_merger_that_never_settles() {
        const MIB: usize = 1 << 20;
        let s = Arc::new(SimStorage::new());
        let mut o = CreateOptions::new(64 << 20);
        o.segment_size = 2 << 20;
        o.policy = default_policy();
        Volume::create(s.clone(), &o).unwrap().close().unwrap();
        let v = Volume::open(
            s,
            OpenOptions {
                background: false,
                // Every batch at lz4, below the zstd:3 target.
                adapt_defer: true,
                ..OpenOptions::default()
            },
        )
        .unwrap();
        let mut model = squeeze_codec::testdata::fio_like(16 * MIB, 60, 4096, 3);
        for (k, c) in model.chunks(MIB).enumerate() {
            v.write((k * MIB) as u64, c, false).unwrap();
        }
        v.flush().unwrap();
        assert!(v.stats().below_target_pending_bytes > 0);
        let inner = &v.inner;
        let (mut ms, mut dd) = (MergeState::default(), DedupState::default());
        let sector = vec![0x5au8; 4096];
        for i in 0..64usize {
            let at = (i * 37 % 4096) * 4096;
            v.write(at as u64, &sector, false).unwrap();
            model[at..at + 4096].copy_from_slice(&sector);
            let activity = client_activity(inner);
            ms.dirty = true;
            idle_step(inner, &mut ms, &mut dd, activity);
        }
        let st = v.stats();
        assert!(st.upgraded_bytes > 0, "no upgrade in 64 idle steps: {st:?}");
        let mut got = vec![0u8; model.len()];
        v.read(0, &mut got).unwrap();
        assert!(got == model);
        v.close().unwrap();
    }
}
