//! Stats assembly: a point-in-time view of the counters (`counters`), the
//! map, the segment table and the backing file, for `squeeze stats`, its
//! JSON and /metrics.

use crate::append::Room;
use crate::counters::{Counter, Counters};
use crate::meta::checkpoint;
use crate::meta::pager;
use crate::pipeline::adapt::Why;
use crate::state::Inner;
use squeeze_format::{CodecId, DATA_START, SECTOR_SIZE};

const SECTOR: u64 = SECTOR_SIZE as u64;

/// A point-in-time view for `squeeze stats`, JSON and /metrics.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct VolumeStats {
    pub logical_size: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Non-zero logical data currently mapped.
    pub mapped_bytes: u64,
    pub zero_sectors_written: u64,
    pub sectors_trimmed: u64,
    /// Live records (payload, header and alignment) the map refers to.
    pub stored_bytes: u64,
    /// What the backing file occupies on its device.
    pub physical_bytes: u64,
    /// Segments allocated in the backing file, in bytes.
    pub allocated_bytes: u64,
    /// Room client data can still use: under --max-physical (or the
    /// format's limit), net of the segments kept for checkpoints and
    /// cleaning, and never more than the file system's free space.
    pub free_physical_bytes: u64,
    /// The --max-physical cap (0 = none).
    pub physical_limit_bytes: u64,
    /// Set when less than 10% of the physical cap is left (as VDO warns).
    pub space_warning: Option<String>,
    /// What compression alone gives: the bytes the live records hold
    /// before compression (mapped_bytes less dedup_saved_bytes) over
    /// stored_bytes.
    pub compression_ratio: f64,
    /// Compression and deduplication together: mapped_bytes / stored_bytes.
    #[serde(default)]
    pub data_reduction_ratio: f64,
    /// Deduplication (docs/DEDUP.md): hidden addresses holding content
    /// that client sectors share, the client sectors that share one
    /// (indirect map entries), and the logical bytes sharing saved
    /// (references beyond the first of each content, x 4 KiB).
    #[serde(default)]
    pub dedup_shared_sectors: u64,
    #[serde(default)]
    pub dedup_references: u64,
    #[serde(default)]
    pub dedup_saved_bytes: u64,
    /// References per shared sector (dedup_references / dedup_shared_sectors).
    #[serde(default)]
    pub dedup_references_per_shared_sector: f64,
    /// Hidden addresses no sector refers to any more, not zeroed yet.
    #[serde(default)]
    pub dedup_orphans: u64,
    /// RAM of the reference counts.
    #[serde(default)]
    pub dedup_counts_memory_bytes: u64,
    /// Over the volume's life: client sectors linked to shared content, and
    /// sectors written once at hidden addresses.
    #[serde(default)]
    pub dedup_linked_sectors: u64,
    #[serde(default)]
    pub dedup_shared_writes: u64,
    /// The volume's dedup mode ("off", "idle" or "inline") and its index
    /// budget (the idle pass's, and the inline index's).
    #[serde(default)]
    pub dedup_mode: String,
    #[serde(default)]
    pub dedup_index_bytes: u64,
    /// Over the volume's life: whole idle passes (dedup mode idle), and the
    /// client sectors they linked (part of dedup_linked_sectors).
    #[serde(default)]
    pub dedup_idle_passes: u64,
    #[serde(default)]
    pub dedup_idle_linked_sectors: u64,
    /// The LBA an idle pass under way resumes at (0: none under way).
    #[serde(default)]
    pub dedup_idle_cursor: u64,
    /// Over the volume's life: client sectors the write path linked as
    /// they were written (dedup mode inline; part of
    /// dedup_linked_sectors), and written hooks the inline index named
    /// whose bytes differed from the source's (stored as usual).
    #[serde(default)]
    pub dedup_inline_linked_sectors: u64,
    #[serde(default)]
    pub dedup_inline_mismatched_sectors: u64,
    /// RAM of the inline index now (0 unless dedup mode inline), the
    /// hooks it holds, and its sampling (1 fingerprint in this many kept;
    /// 1: dense).
    #[serde(default)]
    pub dedup_inline_index_bytes: u64,
    #[serde(default)]
    pub dedup_inline_index_entries: u64,
    #[serde(default)]
    pub dedup_inline_index_sample: u64,
    /// Logical bytes over physical bytes on disk.
    pub effective_ratio: f64,
    pub bytes_per_algorithm: std::collections::BTreeMap<String, u64>,
    pub blobs_compressed: u64,
    pub blobs_rejected: u64,
    pub blobs_skipped: u64,
    pub compress_cpu_seconds: f64,
    pub decompress_cpu_seconds: f64,
    pub log_bytes_written: u64,
    /// Zeros written past the log head before small flushes, so that
    /// commits overwrite written blocks (space::prewrite): device writes
    /// that are neither records nor checkpoints.
    #[serde(default)]
    pub prewritten_bytes: u64,
    pub checkpoint_bytes_written: u64,
    pub checkpoints: u64,
    /// The checkpoint chain recovery reads: its base piece (the whole map),
    /// and the delta pieces (changed sectors only) written after it.
    #[serde(default)]
    pub checkpoint_base_bytes: u64,
    #[serde(default)]
    pub checkpoint_delta_bytes: u64,
    #[serde(default)]
    pub checkpoint_deltas: u64,
    /// Sectors whose mapping changed since the last checkpoint (what the
    /// next delta holds).
    #[serde(default)]
    pub map_dirty_sectors: u64,
    /// The last open: seconds from reading the superblocks to accepting
    /// writes (recovery's own checkpoint included), and log records
    /// replayed.
    #[serde(default)]
    pub open_seconds: f64,
    #[serde(default)]
    pub open_replayed_records: u64,
    /// Most RAM the sector map used while the last open loaded it and
    /// replayed the log (the map pages out as it loads: about the map's
    /// cache, whatever the map's size).
    #[serde(default)]
    pub open_map_peak_bytes: u64,
    /// Backing bytes written per stored byte of client data.
    pub write_amplification: f64,
    pub checksum_errors: u64,
    pub segments_total: u64,
    pub segments_free: u64,
    /// Log segments with nothing live in them that wait for a checkpoint
    /// to free them (up to `RECLAIM_BATCH` - 1 while clients write, the
    /// maintenance thread frees them in batches).
    #[serde(default)]
    pub segments_waiting: u64,
    pub segments_reclaimed: u64,
    /// Record bytes the cleaner relocated.
    pub cleaner_bytes_moved: u64,
    /// Of the cleaner's relocations (compaction and upgrades excluded):
    /// bytes written because dead bytes exceeded the garbage budget, while
    /// clients were idle under the budget, and because free segments ran
    /// short (`GcPolicy`).
    #[serde(default)]
    pub cleaner_over_budget_bytes: u64,
    #[serde(default)]
    pub cleaner_idle_bytes: u64,
    #[serde(default)]
    pub cleaner_space_bytes: u64,
    /// The garbage budget in force (a fraction of the sealed log): the
    /// policy's, or less when free room is short (`GcPolicy`).
    #[serde(default)]
    pub garbage_budget: f64,
    /// Seconds the cleaner spent cleaning victims (wall clock).
    pub cleaner_seconds: f64,
    /// Blobs the cleaner recompressed with the recompress algorithm.
    pub recompressed_blobs: u64,
    /// Sectors the merger rewrote: fragmented windows (scattered small
    /// records) written again as whole blobs while clients were idle.
    #[serde(default)]
    pub merged_bytes: u64,
    /// Record bytes those rewrites appended to the log.
    #[serde(default)]
    pub merge_bytes_written: u64,
    /// Raw bytes of client data written with a faster codec than the
    /// policy's because the compression engine was behind or the machine's
    /// cores were busy (the adaptive codec), since the volume was created.
    #[serde(default)]
    pub below_target_bytes: u64,
    /// Raw bytes written below the target that the upgrade has still to
    /// rewrite (an upper bound: some may be overwritten already; kept
    /// across a reopen by the checkpoint's segment notes).
    #[serde(default)]
    pub below_target_pending_bytes: u64,
    /// Raw bytes the upgrade rewrote with the policy's codec.
    #[serde(default)]
    pub upgraded_bytes: u64,
    /// Wall-clock seconds the upgrade spent.
    #[serde(default)]
    pub upgrade_seconds: f64,
    /// The idle squeeze's algorithm ("" when the policy has none):
    /// compressed data written at the target is rewritten with it while
    /// clients are idle (`space::squeeze`).
    #[serde(default)]
    pub idle_algorithm: String,
    /// Raw bytes the idle squeeze rewrote with it, since the volume was
    /// created.
    #[serde(default)]
    pub squeezed_bytes: u64,
    /// Raw bytes of compressed data in sealed and head segments the squeeze
    /// has still to rewrite (an upper bound; in memory only, 0 after a
    /// reopen; 0 without an idle algorithm).
    #[serde(default)]
    pub unsqueezed_pending_bytes: u64,
    /// Wall-clock seconds the idle squeeze spent.
    #[serde(default)]
    pub squeeze_seconds: f64,
    /// Of `below_target_bytes`, raw bytes the adaptive codec stored raw
    /// because the cores were saturated even at lz4 and the volume had
    /// room for them (`pipeline::burst`), since the volume was created.
    #[serde(default)]
    pub burst_raw_bytes: u64,
    /// Of those, bytes in segments the upgrade has still to rewrite (0
    /// after a reopen: the below-target notes still cover them).
    #[serde(default)]
    pub burst_raw_pending_bytes: u64,
    /// Of those, bytes in segments the upgrade rewrote with the target
    /// (the rest were overwritten or trimmed before it came).
    #[serde(default)]
    pub burst_raw_upgraded_bytes: u64,
    /// The adaptive codec's lowest rung ("raw" or "lz4"; "" without
    /// adaptation), and whether the room rule let the raw rung be taken
    /// at its last reading (true before any).
    #[serde(default)]
    pub burst_floor: String,
    #[serde(default)]
    pub burst_raw_room_open: bool,
    /// The cost model's work since the volume opened (`pipeline::cost`):
    /// up steps of the CPU law it vetoed (probes bound to saturate the
    /// cores), and rungs it skipped on the way down (lz4, straight to raw).
    #[serde(default)]
    pub adapt_vetoed_probes: u64,
    #[serde(default)]
    pub adapt_skipped_rungs: u64,
    /// The codec the last client write batch got (the target, or a rung
    /// under it while the engine was behind or the cores busy).
    #[serde(default)]
    pub write_algorithm: String,
    /// Why: "target", "backlog" (the compression engine was behind), "cpu"
    /// (the machine's cores were busy), "trial" (a trial found the client
    /// writing faster with the faster codec) or "deferred"; None without
    /// adaptation (in JSON: the name, or "" for None).
    #[serde(default, with = "why_or_empty")]
    pub write_algorithm_why: Option<Why>,
    /// The machine's busy CPU share (0-1) at the adaptive codec's last
    /// reading; None when it does not follow the CPU, or has not read yet.
    #[serde(default)]
    pub cpu_busy: Option<f64>,
    /// Dead bytes in sealed log segments (what cleaning can reclaim).
    pub garbage_bytes: u64,
    pub segment_size: u64,
    /// RAM of the sector map (resident chunks, paged-out chunks' slots,
    /// the record of changes, the index of the checkpoint chain).
    pub map_memory_bytes: u64,
    pub map_bytes_per_mapped_sector: f64,
    /// The map's cache: RAM it may use before chunks page out.
    #[serde(default)]
    pub map_cache_bytes: u64,
    /// Chunks (2 MiB of logical space each) that map something, and how
    /// many of them are paged out to the checkpoint chain.
    #[serde(default)]
    pub map_chunks: u64,
    #[serde(default)]
    pub map_paged_chunks: u64,
    /// Chunks read back from the chain, and paged out, since the volume
    /// was created.
    #[serde(default)]
    pub map_faults: u64,
    #[serde(default)]
    pub map_evictions: u64,
    /// Opens that found damage and went on, and the flushed records whose
    /// loss was accepted, over the volume's life.
    #[serde(default)]
    pub damaged_opens: u64,
    #[serde(default)]
    pub lost_flushed_records: u64,
    /// What the last open found damaged (`Volume::damage`), if anything.
    #[serde(default)]
    pub damage_at_open: Option<String>,
    pub read_only_reason: Option<String>,
}

/// A point-in-time view of the counters and space.
pub(crate) fn collect(inner: &Inner) -> VolumeStats {
    let c = &inner.counters;
    let dedup = inner.sb.lock().dedup;
    // One snapshot of the map's state: the dedup figures and the mapped
    // sectors they are taken from must agree (mapped_bytes less
    // dedup_saved_bytes never goes below 0).
    let (
        (mapped, stored, map_mem, below_pending, burst_pending, dirty, chunks, paged),
        (shared_sectors, references, orphans, counts_mem),
    ) = {
        let st = inner.state.read();
        let sh = &st.shared;
        (
            (
                // Client sectors: the hidden addresses' own entries are not.
                st.map.mapped() - sh.mapped(),
                st.usage.live_bytes,
                st.map_memory_bytes(),
                st.usage.below_target_total(),
                st.usage.burst_raw_total(),
                st.map.dirty_sectors(),
                st.map.chunk_count() as u64,
                st.map.paged_count() as u64,
            ),
            (
                sh.shared_sectors(),
                sh.references(),
                sh.orphan_count(),
                sh.memory_bytes(),
            ),
        )
    };
    let idle_algorithm = inner.policy.read().idle_algorithm();
    let unsqueezed_pending = match idle_algorithm {
        Some(_) => inner.state.read().usage.unsqueezed_total(),
        None => 0,
    };
    let (write_algorithm, write_algorithm_why, cpu_busy, burst_floor, room_open) = {
        let p = inner.policy.read();
        match &p.adapt {
            Some(a) => (
                a.current().to_string(),
                Some(a.why()),
                a.cpu_busy(),
                a.floor().to_string(),
                a.raw_room_open(),
            ),
            None => (p.algorithm.to_string(), None, None, String::new(), false),
        }
    };
    let (adapt_vetoed_probes, adapt_skipped_rungs) = match &inner.policy.read().adapt {
        Some(a) => (a.vetoed_probes(), a.skipped_rungs()),
        None => (0, 0),
    };
    let (base_bytes, delta_bytes, deltas) = {
        let h = inner.ckpt_history.lock();
        (h.base_bytes, h.delta_bytes, h.deltas)
    };
    let opened = *inner.opened.lock();
    let (segments_total, segments_free) = {
        let log = inner.log.lock();
        (
            u64::from(log.table.len()),
            u64::from(log.table.len() - log.table.used()),
        )
    };
    let physical = inner.storage.physical_bytes().unwrap_or(0);
    let allocated = (segments_total - segments_free) * inner.seg_size + DATA_START;
    let mapped_bytes = mapped * SECTOR;
    let dedup_saved = references.saturating_sub(shared_sectors) * SECTOR;
    let mut per_alg = std::collections::BTreeMap::new();
    for codec in CodecId::ALL {
        per_alg.insert(
            codec.name().to_string(),
            c.get(Counters::codec_bytes(codec)),
        );
    }
    let client = c.get(Counter::ClientBytesCompressed);
    let Space {
        free_physical,
        limit,
        warning: space_warning,
    } = space(inner);
    VolumeStats {
        logical_size: inner.size(),
        bytes_written: c.get(Counter::BytesWritten),
        bytes_read: c.get(Counter::BytesRead),
        mapped_bytes,
        zero_sectors_written: c.get(Counter::ZeroSectorsWritten),
        sectors_trimmed: c.get(Counter::SectorsTrimmed),
        stored_bytes: stored,
        physical_bytes: physical,
        allocated_bytes: allocated,
        free_physical_bytes: free_physical,
        physical_limit_bytes: limit,
        space_warning,
        compression_ratio: ratio(mapped_bytes - dedup_saved, stored),
        data_reduction_ratio: ratio(mapped_bytes, stored),
        dedup_shared_sectors: shared_sectors,
        dedup_references: references,
        dedup_saved_bytes: dedup_saved,
        dedup_references_per_shared_sector: if shared_sectors == 0 {
            0.0
        } else {
            references as f64 / shared_sectors as f64
        },
        dedup_orphans: orphans,
        dedup_counts_memory_bytes: counts_mem,
        dedup_linked_sectors: c.get(Counter::DedupLinkedSectors),
        dedup_shared_writes: c.get(Counter::DedupSharedWrites),
        dedup_mode: dedup.mode.name().to_string(),
        dedup_index_bytes: dedup.index_bytes(),
        dedup_idle_passes: c.get(Counter::DedupIdlePasses),
        dedup_idle_linked_sectors: c.get(Counter::DedupIdleLinkedSectors),
        dedup_idle_cursor: c.get(Counter::DedupIdleCursor),
        dedup_inline_linked_sectors: c.get(Counter::DedupInlineLinkedSectors),
        dedup_inline_mismatched_sectors: c.get(Counter::DedupInlineMismatchedSectors),
        dedup_inline_index_bytes: inner.inline.memory_bytes(),
        dedup_inline_index_entries: inner.inline.entries(),
        dedup_inline_index_sample: inner.inline.sample(),
        effective_ratio: ratio(mapped_bytes, physical),
        bytes_per_algorithm: per_alg,
        blobs_compressed: c.get(Counter::BlobsCompressed),
        blobs_rejected: c.get(Counter::BlobsRejected),
        blobs_skipped: c.get(Counter::BlobsSkipped),
        compress_cpu_seconds: c.get(Counter::CompressNs) as f64 / 1e9,
        decompress_cpu_seconds: c.get(Counter::DecompressNs) as f64 / 1e9,
        log_bytes_written: c.get(Counter::LogBytes),
        prewritten_bytes: c.get(Counter::PrewrittenBytes),
        checkpoint_bytes_written: c.get(Counter::CheckpointBytes),
        checkpoints: c.get(Counter::Checkpoints),
        checkpoint_base_bytes: base_bytes,
        checkpoint_delta_bytes: delta_bytes,
        checkpoint_deltas: deltas,
        map_dirty_sectors: dirty,
        open_seconds: opened.duration.as_secs_f64(),
        open_replayed_records: opened.replayed,
        open_map_peak_bytes: opened.map_peak_bytes,
        write_amplification: if client == 0 {
            0.0
        } else {
            (c.get(Counter::LogBytes)
                + c.get(Counter::CheckpointBytes)
                + c.get(Counter::PrewrittenBytes)) as f64
                / client as f64
        },
        checksum_errors: c.get(Counter::ChecksumErrors),
        segments_total,
        segments_free,
        segments_waiting: crate::meta::checkpoint::reclaimable_segments(inner),
        segments_reclaimed: c.get(Counter::SegmentsReclaimed),
        cleaner_bytes_moved: c.get(Counter::CleanerBytesMoved),
        cleaner_over_budget_bytes: c.get(Counter::CleanerOverBudgetBytes),
        cleaner_idle_bytes: c.get(Counter::CleanerIdleBytes),
        cleaner_space_bytes: c.get(Counter::CleanerSpaceBytes),
        cleaner_seconds: c.get(Counter::CleanerNs) as f64 / 1e9,
        recompressed_blobs: c.get(Counter::RecompressedBlobs),
        merged_bytes: c.get(Counter::MergedSectors) * SECTOR,
        merge_bytes_written: c.get(Counter::MergedBytes),
        below_target_bytes: c.get(Counter::BelowTargetBytes),
        below_target_pending_bytes: below_pending,
        upgraded_bytes: c.get(Counter::UpgradedBytes),
        burst_raw_bytes: c.get(Counter::BurstRawBytes),
        burst_raw_pending_bytes: burst_pending,
        burst_raw_upgraded_bytes: c.get(Counter::BurstRawUpgradedBytes),
        burst_floor,
        burst_raw_room_open: room_open,
        adapt_vetoed_probes,
        adapt_skipped_rungs,
        upgrade_seconds: c.get(Counter::UpgradeNs) as f64 / 1e9,
        idle_algorithm: idle_algorithm.map(|a| a.to_string()).unwrap_or_default(),
        squeezed_bytes: c.get(Counter::SqueezedBytes),
        unsqueezed_pending_bytes: unsqueezed_pending,
        squeeze_seconds: c.get(Counter::SqueezeNs) as f64 / 1e9,
        write_algorithm,
        write_algorithm_why,
        cpu_busy,
        garbage_bytes: crate::space::victim::garbage(inner).0,
        garbage_budget: crate::space::victim::budget(inner, crate::space::victim::garbage(inner).1),
        segment_size: inner.seg_size,
        map_memory_bytes: map_mem,
        map_bytes_per_mapped_sector: if mapped == 0 {
            0.0
        } else {
            map_mem as f64 / mapped as f64
        },
        map_cache_bytes: pager::map_cache(inner),
        map_chunks: chunks,
        map_paged_chunks: paged,
        map_faults: c.get(Counter::MapFaults),
        map_evictions: c.get(Counter::MapEvictions),
        damaged_opens: c.get(Counter::DamagedOpens),
        lost_flushed_records: c.get(Counter::LostFlushedRecords),
        damage_at_open: None,
        read_only_reason: inner.poisoned.lock().as_ref().map(|e| e.to_string()),
    }
}

/// Room for client data under the cap, without the rest of the stats
/// (cheap enough for a watcher that polls it several times a second).
pub struct Space {
    /// Bytes client data can still take (`VolumeStats::free_physical_bytes`).
    pub free_physical: u64,
    /// The --max-physical cap (0 = none).
    pub limit: u64,
    /// Set while less than 10% of the cap is left.
    pub warning: Option<String>,
}

pub(crate) fn space(inner: &Inner) -> Space {
    let available = inner.log.lock().table.available();
    let limit = inner.sb.lock().max_physical;
    // Room client data can still use: the segments kept for checkpoints,
    // trims and the cleaner are not theirs.
    let kept = checkpoint::segments_needed(inner, 0) + Room::Data.extra_segments();
    // ... and no more than the device can still take: the file system's
    // free space (free segments are holes: writing them takes new blocks).
    let free_physical = available.saturating_sub(kept) * inner.seg_size;
    let free_physical = match inner.storage.free_bytes() {
        Ok(Some(fs_free)) => free_physical.min(fs_free),
        _ => free_physical,
    };
    let warning = (limit > 0 && free_physical * 10 < limit).then(|| {
        format!(
            "physical space low: {} MiB of the {} MiB cap left; trim or grow --max-physical",
            free_physical >> 20,
            limit >> 20
        )
    });
    Space {
        free_physical,
        limit,
        warning,
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        if a == 0 {
            1.0
        } else {
            f64::INFINITY
        }
    } else {
        a as f64 / b as f64
    }
}

/// `Option<Why>` in JSON as it always was: the reason's name, or "" when
/// the codec does not adapt.
mod why_or_empty {
    use super::Why;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(why: &Option<Why>, s: S) -> Result<S::Ok, S::Error> {
        match why {
            Some(w) => w.serialize(s),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Why>, D::Error> {
        let name = String::deserialize(d)?;
        if name.is_empty() {
            return Ok(None);
        }
        Why::deserialize(serde::de::value::StrDeserializer::<D::Error>::new(&name)).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct W {
        #[serde(default, with = "why_or_empty")]
        why: Option<Why>,
    }

    #[test]
    fn the_reason_reads_in_json_as_it_always_did() {
        for (why, json) in [
            (None, r#"{"why":""}"#),
            (Some(Why::Cpu), r#"{"why":"cpu"}"#),
            (Some(Why::Deferred), r#"{"why":"deferred"}"#),
        ] {
            let w = W { why };
            assert_eq!(serde_json::to_string(&w).unwrap(), json);
            assert_eq!(serde_json::from_str::<W>(json).unwrap(), w);
        }
        assert_eq!(serde_json::from_str::<W>("{}").unwrap(), W { why: None });
    }
}
