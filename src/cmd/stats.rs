//! `squeeze stats PATH [--json]`: what the volume holds and what it cost.
//! PATH is a volume file, or the control socket of a running server
//! (`squeeze serve --control PATH`), which answers with live figures.

use crate::control_client::{is_socket, query_control};
use crate::util::{human, open_volume_read_only};
use anyhow::{Context, Result};
use squeeze_engine::pipeline::adapt::Why;
use squeeze_engine::VolumeStats;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A volume file, or a running server's control socket.
    pub path: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let socket = is_socket(&a.path);
    let mut ublk = serde_json::Value::Null;
    let (stats, server): (Vec<(String, VolumeStats)>, Option<serde_json::Value>) = if socket {
        let live = query_control(&a.path)
            .with_context(|| format!("asking the server at {}", a.path.display()))?;
        ublk = live.ublk;
        (live.volumes, Some(live.server))
    } else {
        let vol = open_volume_read_only(&a.path, true)?;
        (vec![(a.path.display().to_string(), vol.stats())], None)
    };
    if a.json {
        if stats.len() == 1 && !socket {
            outln!("{}", serde_json::to_string_pretty(&stats[0].1)?);
        } else {
            // One object per volume; from a server, each also carries the
            // NBD server's counters (for all its exports) as "nbd_server",
            // and its ublk device's as "ublk".
            let m: serde_json::Map<String, serde_json::Value> = stats
                .into_iter()
                .map(|(k, v)| {
                    let mut o = serde_json::to_value(v).expect("stats serialise");
                    if let (Some(srv), Some(obj)) = (&server, o.as_object_mut()) {
                        obj.insert("nbd_server".into(), srv.clone());
                    }
                    if let (Some(u), Some(obj)) = (ublk.get(&k), o.as_object_mut()) {
                        obj.insert("ublk".into(), u.clone());
                    }
                    (k, o)
                })
                .collect();
            outln!("{}", serde_json::to_string_pretty(&m)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    for (name, st) in &stats {
        print_stats(name, st);
        if let Some(u) = ublk.get(name) {
            print_ublk(u);
        }
    }
    if let Some(srv) = &server {
        print_server(srv);
    }
    Ok(ExitCode::SUCCESS)
}

/// A volume's ublk device and its counters, from the control socket's answer.
fn print_ublk(v: &serde_json::Value) {
    let r = &v["requests"];
    let q = |k: &str| r[k].as_u64().unwrap_or(0);
    let how = if v["taken_over"].as_bool() == Some(true) {
        "taken over from a server that died"
    } else {
        "added by this server"
    };
    outln!(
        "ublk device            {} ({how}), {} errors",
        v["device"].as_str().unwrap_or("?"),
        v["errors"].as_u64().unwrap_or(0)
    );
    outln!(
        "ublk requests          read {}, write {}, flush {}, discard {}, write_zeroes {}",
        q("read"),
        q("write"),
        q("flush"),
        q("discard"),
        q("write_zeroes")
    );
}

/// The NBD server's counters, from its control socket's answer.
fn print_server(v: &serde_json::Value) {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let r = &v["requests"];
    let q = |k: &str| r[k].as_u64().unwrap_or(0);
    outln!(
        "nbd server             {} connections open ({} in all), {} requests in flight, {} errors ({} protocol)",
        n("connections_open"),
        n("connections_total"),
        n("requests_in_flight"),
        n("errors"),
        n("protocol_errors")
    );
    outln!(
        "nbd requests           read {} ({} answered by the connection's reader), write {}, flush {}, trim {}, write_zeroes {}, block_status {}, disc {}, other {}",
        q("read"),
        n("reads_inline"),
        q("write"),
        q("flush"),
        q("trim"),
        q("write_zeroes"),
        q("block_status"),
        q("disc"),
        q("other")
    );
}

pub fn print_stats(name: &str, s: &VolumeStats) {
    outln!("volume                 {name}");
    outln!("logical size           {}", human(s.logical_size));
    outln!("bytes written          {}", human(s.bytes_written));
    outln!("bytes read             {}", human(s.bytes_read));
    outln!(
        "mapped (non-zero)      {} ({} zero sectors written, {} trimmed)",
        human(s.mapped_bytes),
        s.zero_sectors_written,
        s.sectors_trimmed
    );
    outln!("stored (live extents)  {}", human(s.stored_bytes));
    outln!(
        "physical (du)          {} of {} allocated, {} free",
        human(s.physical_bytes),
        human(s.allocated_bytes),
        human(s.free_physical_bytes)
    );
    outln!("compression ratio      {:.3}", s.compression_ratio);
    outln!(
        "dedup mode             {}, index {} MiB; {} idle passes linked {} sectors{}",
        s.dedup_mode,
        s.dedup_index_bytes >> 20,
        s.dedup_idle_passes,
        s.dedup_idle_linked_sectors,
        if s.dedup_idle_cursor > 0 {
            format!(", one under way at LBA {}", s.dedup_idle_cursor)
        } else {
            String::new()
        }
    );
    if s.dedup_mode == "inline" || s.dedup_inline_linked_sectors > 0 {
        outln!(
            "dedup inline           {} sectors linked as written, {} mismatched; index {}, {} hooks (1 in {})",
            s.dedup_inline_linked_sectors,
            s.dedup_inline_mismatched_sectors,
            human(s.dedup_inline_index_bytes),
            s.dedup_inline_index_entries,
            s.dedup_inline_index_sample
        );
    }
    if s.dedup_references > 0 || s.dedup_orphans > 0 {
        outln!(
            "deduplication          {} saved: {} sectors share {} stored once ({:.2} each), {} unshared waiting to be zeroed; data reduction {:.3}",
            human(s.dedup_saved_bytes),
            s.dedup_references,
            s.dedup_shared_sectors,
            s.dedup_references_per_shared_sector,
            s.dedup_orphans,
            s.data_reduction_ratio
        );
    }
    outln!(
        "effective ratio        {:.3} (mapped / physical)",
        s.effective_ratio
    );
    let per: Vec<String> = s
        .bytes_per_algorithm
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k} {}", human(*v)))
        .collect();
    outln!("bytes per algorithm    {}", per.join(", "));
    outln!(
        "blobs                  {} compressed, {} rejected (over required ratio), {} skipped",
        s.blobs_compressed,
        s.blobs_rejected,
        s.blobs_skipped
    );
    outln!(
        "CPU seconds            {:.3} compressing, {:.3} decompressing",
        s.compress_cpu_seconds,
        s.decompress_cpu_seconds
    );
    outln!(
        "log written            {} ({} checkpoints, {}; {} pre-written), write amplification {:.3}",
        human(s.log_bytes_written),
        s.checkpoints,
        human(s.checkpoint_bytes_written),
        human(s.prewritten_bytes),
        s.write_amplification
    );
    outln!(
        "checkpoint chain       a base of {} + {} deltas ({}); {} sectors changed since",
        human(s.checkpoint_base_bytes),
        s.checkpoint_deltas,
        human(s.checkpoint_delta_bytes),
        s.map_dirty_sectors
    );
    outln!(
        "last open              {:.3} s, {} log records replayed, map at most {} meanwhile",
        s.open_seconds,
        s.open_replayed_records,
        human(s.open_map_peak_bytes)
    );
    outln!(
        "segments               {} in file, {} free, {} dead waiting for a checkpoint, {} reclaimed, {} each",
        s.segments_total,
        s.segments_free,
        s.segments_waiting,
        s.segments_reclaimed,
        human(s.segment_size)
    );
    outln!(
        "cleaner                {} garbage (budget {:.0}%), {} moved ({} over the budget, {} idle, {} short of room), {} blobs recompressed",
        human(s.garbage_bytes),
        s.garbage_budget * 100.0,
        human(s.cleaner_bytes_moved),
        human(s.cleaner_over_budget_bytes),
        human(s.cleaner_idle_bytes),
        human(s.cleaner_space_bytes),
        s.recompressed_blobs
    );
    outln!(
        "merger                 {} rewritten as whole blobs ({} of records)",
        human(s.merged_bytes),
        human(s.merge_bytes_written)
    );
    outln!(
        "adaptive codec         last writes {}{}; {} written below target, {} pending, {} upgraded{}",
        s.write_algorithm,
        why_rung(s),
        human(s.below_target_bytes),
        human(s.below_target_pending_bytes),
        human(s.upgraded_bytes),
        if s.upgrade_seconds > 0.0 {
            format!(
                " at {:.0} MB/s",
                s.upgraded_bytes as f64 / 1e6 / s.upgrade_seconds
            )
        } else {
            String::new()
        }
    );
    if !s.burst_floor.is_empty() {
        outln!(
            "burst floor            {}{}; {} stored raw under saturated cores, {} pending, {} upgraded; {} probes vetoed, {} rungs skipped",
            s.burst_floor,
            if s.burst_floor == "raw" && !s.burst_raw_room_open {
                " (room spent: lz4)"
            } else {
                ""
            },
            human(s.burst_raw_bytes),
            human(s.burst_raw_pending_bytes),
            human(s.burst_raw_upgraded_bytes),
            s.adapt_vetoed_probes,
            s.adapt_skipped_rungs
        );
    }
    outln!(
        "map memory             {} ({:.2} bytes per mapped sector; cache {})",
        human(s.map_memory_bytes),
        s.map_bytes_per_mapped_sector,
        human(s.map_cache_bytes)
    );
    if s.map_paged_chunks > 0 || s.map_faults > 0 {
        outln!(
            "map paging             {} of {} chunks paged out; {} read back, {} paged out since creation",
            s.map_paged_chunks,
            s.map_chunks,
            s.map_faults,
            s.map_evictions
        );
    }
    outln!("checksum errors        {}", s.checksum_errors);
    if s.damaged_opens > 0 {
        outln!(
            "damage                 {} opens found damage; {} flushed records lost (accepted)",
            s.damaged_opens,
            s.lost_flushed_records
        );
    }
    if let Some(d) = &s.damage_at_open {
        outln!("DAMAGED AT OPEN        {d}");
    }
    if let Some(w) = &s.space_warning {
        outln!("WARNING                {w}");
    }
    if let Some(r) = &s.read_only_reason {
        outln!("READ-ONLY              {r}");
    }
}

/// " (the compression threads were behind)" and the like after the rung the
/// last writes got, with the machine's busy share when the codec reads it.
fn why_rung(s: &VolumeStats) -> String {
    let busy = s
        .cpu_busy
        .map(|b| format!("machine CPU {:.0}% busy", b * 100.0));
    let why = match s.write_algorithm_why {
        Some(w @ (Why::Backlog | Why::Cpu | Why::Trial)) => Some(w.to_string()),
        _ => None,
    };
    match (why, busy) {
        (Some(w), Some(b)) => format!(" ({w}; {b})"),
        (Some(w), None) => format!(" ({w})"),
        (None, Some(b)) => format!(" ({b})"),
        (None, None) => String::new(),
    }
}
