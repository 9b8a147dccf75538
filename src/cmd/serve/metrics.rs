//! `squeeze serve --metrics ADDR:PORT`: the statistics over HTTP, in
//! Prometheus text exposition format (/metrics) and as JSON (/stats).

use super::accept::one_at_a_time;
use super::control::stats_json;
use super::device::VolumeDevice;
use super::ublk_stats::{ublk_prometheus, UblkRegistry};
use squeeze_engine::VolumeStats;
use squeeze_nbd::Server;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// The `--metrics` listener (thread `sqz-metrics`), one client at a time:
/// Prometheus text at /metrics, the control socket's statistics JSON at
/// /stats, over HTTP/1.0.
pub(super) fn metrics_loop(
    l: TcpListener,
    devs: &[(String, Arc<VolumeDevice>)],
    srv: &Server,
    ublk: &UblkRegistry,
    stop: &AtomicBool,
) {
    one_at_a_time(l.incoming(), stop, Duration::from_secs(5), |c| {
        // Read the request line and the headers up to the blank line: closing
        // with unread request bytes would make the kernel answer with a RST,
        // and the client could lose the response.
        let mut first = String::new();
        {
            let mut r = BufReader::new((&mut *c).take(16 << 10));
            if r.read_line(&mut first).is_err() {
                return;
            }
            let mut line = String::new();
            while first.starts_with("GET")
                && matches!(r.read_line(&mut line), Ok(n) if n > 0)
                && !line.trim_end().is_empty()
            {
                line.clear();
            }
        }
        let path = first.split_whitespace().nth(1).unwrap_or("/");
        let (status, ctype, body) = match path {
            "/metrics" => (
                "200 OK",
                "text/plain; version=0.0.4",
                prometheus(devs, srv, ublk),
            ),
            "/stats" => (
                "200 OK",
                "application/json",
                stats_json(devs, srv, ublk).to_string(),
            ),
            _ => (
                "404 Not Found",
                "text/plain",
                "try /metrics or /stats\n".into(),
            ),
        };
        let reply = format!(
            "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = c.write_all(reply.as_bytes());
        let _ = c.shutdown(std::net::Shutdown::Write);
    });
}

/// The statistics in Prometheus text exposition format.
pub(super) fn prometheus(
    devs: &[(String, Arc<VolumeDevice>)],
    srv: &Server,
    ublk: &UblkRegistry,
) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, help: &str, kind: &str, vals: Vec<(String, f64)>| {
        out.push_str(&format!(
            "# HELP squeeze_{name} {help}\n# TYPE squeeze_{name} {kind}\n"
        ));
        for (export, v) in vals {
            out.push_str(&format!("squeeze_{name}{{export=\"{export}\"}} {v}\n"));
        }
    };
    let stats: Vec<(String, VolumeStats)> = devs
        .iter()
        .map(|(n, d)| (n.clone(), d.vol.stats()))
        .collect();
    macro_rules! m {
        ($name:literal, $help:literal, $kind:literal, $f:expr) => {
            metric(
                $name,
                $help,
                $kind,
                stats
                    .iter()
                    .map(|(n, s)| (n.clone(), $f(s) as f64))
                    .collect(),
            )
        };
    }
    m!(
        "logical_size_bytes",
        "Logical size of the volume.",
        "gauge",
        |s: &VolumeStats| s.logical_size
    );
    m!(
        "written_bytes_total",
        "Bytes clients wrote.",
        "counter",
        |s: &VolumeStats| s.bytes_written
    );
    m!(
        "read_bytes_total",
        "Bytes clients read.",
        "counter",
        |s: &VolumeStats| s.bytes_read
    );
    m!(
        "mapped_bytes",
        "Non-zero logical data.",
        "gauge",
        |s: &VolumeStats| s.mapped_bytes
    );
    m!(
        "stored_bytes",
        "Live compressed extents.",
        "gauge",
        |s: &VolumeStats| s.stored_bytes
    );
    m!(
        "physical_bytes",
        "Bytes the backing file occupies on disk.",
        "gauge",
        |s: &VolumeStats| s.physical_bytes
    );
    m!(
        "free_physical_bytes",
        "Room left under the physical cap.",
        "gauge",
        |s: &VolumeStats| s.free_physical_bytes
    );
    m!(
        "physical_limit_bytes",
        "The --max-physical cap (0: none).",
        "gauge",
        |s: &VolumeStats| s.physical_limit_bytes
    );
    m!(
        "space_low",
        "1 while less than 10% of the physical cap is left (the alert rule in docs/CEPH.md).",
        "gauge",
        |s: &VolumeStats| u64::from(s.space_warning.is_some())
    );
    m!(
        "compression_ratio",
        "Bytes the live records hold before compression over stored bytes (deduplication apart).",
        "gauge",
        |s: &VolumeStats| s.compression_ratio
    );
    m!(
        "data_reduction_ratio",
        "Mapped bytes over stored bytes: compression and deduplication.",
        "gauge",
        |s: &VolumeStats| s.data_reduction_ratio
    );
    m!(
        "dedup_saved_bytes",
        "Logical bytes deduplication saved (shared sectors' references beyond the first).",
        "gauge",
        |s: &VolumeStats| s.dedup_saved_bytes
    );
    m!(
        "dedup_shared_sectors",
        "Hidden addresses holding content client sectors share.",
        "gauge",
        |s: &VolumeStats| s.dedup_shared_sectors
    );
    m!(
        "dedup_references",
        "Client sectors that share content (indirect map entries).",
        "gauge",
        |s: &VolumeStats| s.dedup_references
    );
    m!(
        "dedup_counts_memory_bytes",
        "RAM of deduplication's reference counts.",
        "gauge",
        |s: &VolumeStats| s.dedup_counts_memory_bytes
    );
    m!(
        "dedup_idle_passes_total",
        "Whole deduplication passes run while clients were idle (dedup mode idle).",
        "counter",
        |s: &VolumeStats| s.dedup_idle_passes
    );
    m!(
        "dedup_idle_linked_sectors_total",
        "Client sectors the idle deduplication passes linked to shared content.",
        "counter",
        |s: &VolumeStats| s.dedup_idle_linked_sectors
    );
    m!(
        "dedup_inline_linked_sectors_total",
        "Client sectors the write path linked to shared content as they were written (dedup mode inline).",
        "counter",
        |s: &VolumeStats| s.dedup_inline_linked_sectors
    );
    m!(
        "dedup_inline_mismatched_sectors_total",
        "Written hooks the inline index named whose bytes differed from the source's (stored as usual).",
        "counter",
        |s: &VolumeStats| s.dedup_inline_mismatched_sectors
    );
    m!(
        "dedup_inline_index_bytes",
        "RAM of the inline deduplication index.",
        "gauge",
        |s: &VolumeStats| s.dedup_inline_index_bytes
    );
    m!(
        "dedup_inline_index_entries",
        "Hooks the inline deduplication index holds (1 fingerprint in dedup_inline_index_sample).",
        "gauge",
        |s: &VolumeStats| s.dedup_inline_index_entries
    );
    m!(
        "dedup_inline_index_sample",
        "The inline deduplication index keeps 1 fingerprint in this many (1: dense).",
        "gauge",
        |s: &VolumeStats| s.dedup_inline_index_sample
    );
    m!(
        "blobs_compressed_total",
        "Blobs stored compressed.",
        "counter",
        |s: &VolumeStats| s.blobs_compressed
    );
    m!(
        "blobs_rejected_total",
        "Blobs over the required ratio, stored raw.",
        "counter",
        |s: &VolumeStats| s.blobs_rejected
    );
    m!(
        "blobs_skipped_total",
        "Blobs the heuristic or mode kept from the codec.",
        "counter",
        |s: &VolumeStats| s.blobs_skipped
    );
    m!(
        "compress_cpu_seconds_total",
        "CPU seconds compressing.",
        "counter",
        |s: &VolumeStats| s.compress_cpu_seconds
    );
    m!(
        "decompress_cpu_seconds_total",
        "CPU seconds decompressing.",
        "counter",
        |s: &VolumeStats| s.decompress_cpu_seconds
    );
    m!(
        "garbage_bytes",
        "Dead bytes in sealed log segments (what cleaning can reclaim).",
        "gauge",
        |s: &VolumeStats| s.garbage_bytes
    );
    m!(
        "garbage_budget_ratio",
        "Share of the sealed log dead bytes may reach before the cleaner copies (the budget in force).",
        "gauge",
        |s: &VolumeStats| s.garbage_budget
    );
    m!(
        "cleaner_over_budget_bytes_total",
        "Record bytes the cleaner relocated because dead bytes exceeded the garbage budget.",
        "counter",
        |s: &VolumeStats| s.cleaner_over_budget_bytes
    );
    m!(
        "cleaner_idle_bytes_total",
        "Record bytes the cleaner relocated while clients were idle, under the budget.",
        "counter",
        |s: &VolumeStats| s.cleaner_idle_bytes
    );
    m!(
        "cleaner_short_of_room_bytes_total",
        "Record bytes the cleaner relocated because free segments ran short.",
        "counter",
        |s: &VolumeStats| s.cleaner_space_bytes
    );
    m!(
        "merged_bytes_total",
        "Logical bytes the merger rewrote as whole blobs while clients were idle.",
        "counter",
        |s: &VolumeStats| s.merged_bytes
    );
    m!(
        "below_target_bytes_total",
        "Raw bytes of client writes stored with a faster codec than the policy's while the compression threads were behind or the cores busy.",
        "counter",
        |s: &VolumeStats| s.below_target_bytes
    );
    m!(
        "cpu_busy_ratio",
        "The machine's busy CPU share at the adaptive codec's last reading (0 without the CPU signal).",
        "gauge",
        |s: &VolumeStats| s.cpu_busy.unwrap_or(0.0)
    );
    m!(
        "below_target_pending_bytes",
        "Raw bytes written below the policy's codec that the idle upgrade has still to rewrite (upper bound).",
        "gauge",
        |s: &VolumeStats| s.below_target_pending_bytes
    );
    m!(
        "upgraded_bytes_total",
        "Raw bytes the idle upgrade rewrote with the policy's codec.",
        "counter",
        |s: &VolumeStats| s.upgraded_bytes
    );
    m!(
        "burst_raw_bytes_total",
        "Raw bytes of client writes stored uncompressed because the cores were saturated even at lz4 and the volume had room (the adaptive codec's raw rung).",
        "counter",
        |s: &VolumeStats| s.burst_raw_bytes
    );
    m!(
        "burst_raw_pending_bytes",
        "Of those, bytes the idle upgrade has still to compress (upper bound).",
        "gauge",
        |s: &VolumeStats| s.burst_raw_pending_bytes
    );
    m!(
        "burst_raw_upgraded_bytes_total",
        "Of those, bytes the idle upgrade compressed with the policy's codec.",
        "counter",
        |s: &VolumeStats| s.burst_raw_upgraded_bytes
    );
    m!(
        "adapt_vetoed_probes_total",
        "Up steps of the adaptive codec's CPU law that its cost model vetoed since the volume opened (the slower rung would have saturated the cores at the client's rate).",
        "counter",
        |s: &VolumeStats| s.adapt_vetoed_probes
    );
    m!(
        "adapt_skipped_rungs_total",
        "Rungs the cost model skipped on the way down since the volume opened (lz4, straight from the target to raw).",
        "counter",
        |s: &VolumeStats| s.adapt_skipped_rungs
    );
    m!(
        "upgrade_seconds_total",
        "Wall-clock seconds the idle upgrade spent (upgraded_bytes_total over it is the upgrade rate).",
        "counter",
        |s: &VolumeStats| s.upgrade_seconds
    );
    m!(
        "prewritten_bytes_total",
        "Zeros written past the log head before small flushes, so commits overwrite written blocks (part of write_amplification).",
        "counter",
        |s: &VolumeStats| s.prewritten_bytes
    );
    m!(
        "segments_waiting",
        "Log segments with nothing live in them waiting for a checkpoint to free them (freed in batches while clients write).",
        "gauge",
        |s: &VolumeStats| s.segments_waiting
    );
    m!(
        "write_amplification",
        "Backing bytes written per stored client byte (log, checkpoints and pre-written zeros).",
        "gauge",
        |s: &VolumeStats| s.write_amplification
    );
    m!(
        "checksum_errors_total",
        "Reads that failed a checksum.",
        "counter",
        |s: &VolumeStats| s.checksum_errors
    );
    m!(
        "map_memory_bytes",
        "RAM used by the sector map.",
        "gauge",
        |s: &VolumeStats| s.map_memory_bytes
    );
    m!(
        "map_cache_bytes",
        "RAM the sector map may use before chunks page out.",
        "gauge",
        |s: &VolumeStats| s.map_cache_bytes
    );
    m!(
        "map_paged_chunks",
        "Map chunks (2 MiB of logical space each) paged out to the checkpoint chain.",
        "gauge",
        |s: &VolumeStats| s.map_paged_chunks
    );
    m!(
        "map_faults_total",
        "Map chunks read back from the checkpoint chain.",
        "counter",
        |s: &VolumeStats| s.map_faults
    );
    m!(
        "damaged_opens_total",
        "Opens that found damage (a superblock slot, flushed records gone, a file cut short) and went on.",
        "counter",
        |s: &VolumeStats| s.damaged_opens
    );
    m!(
        "lost_flushed_records_total",
        "Flushed log records found missing at open whose loss was accepted (--accept-loss).",
        "counter",
        |s: &VolumeStats| s.lost_flushed_records
    );
    m!(
        "checkpoint_chain_bytes",
        "Bytes of the checkpoint chain recovery reads (base and deltas).",
        "gauge",
        |s: &VolumeStats| s.checkpoint_base_bytes + s.checkpoint_delta_bytes
    );
    m!(
        "checkpoint_base_bytes",
        "Bytes of the checkpoint chain's base piece (the whole map).",
        "gauge",
        |s: &VolumeStats| s.checkpoint_base_bytes
    );
    m!(
        "open_seconds",
        "Seconds the last open took (recovery included).",
        "gauge",
        |s: &VolumeStats| s.open_seconds
    );
    m!(
        "read_only",
        "1 when the volume turned read-only after an I/O failure.",
        "gauge",
        |s: &VolumeStats| u32::from(s.read_only_reason.is_some())
    );
    let n = srv.stats();
    for (name, help, kind, v) in [
        (
            "nbd_connections_open",
            "NBD connections open.",
            "gauge",
            n.connections_open,
        ),
        (
            "nbd_connections_total",
            "NBD connections accepted.",
            "counter",
            n.connections_total,
        ),
        (
            "nbd_requests_in_flight",
            "NBD requests being served.",
            "gauge",
            n.requests_in_flight,
        ),
        (
            "nbd_requests_total",
            "NBD requests received.",
            "counter",
            n.requests.total(),
        ),
        (
            "nbd_reads_inline_total",
            "NBD READs answered by the connection's reader, without a worker.",
            "counter",
            n.reads_inline,
        ),
        (
            "nbd_errors_total",
            "NBD requests answered with an error.",
            "counter",
            n.errors,
        ),
        (
            "nbd_protocol_errors_total",
            "NBD connections closed for a protocol violation.",
            "counter",
            n.protocol_errors,
        ),
    ] {
        out.push_str(&format!(
            "# HELP squeeze_{name} {help}\n# TYPE squeeze_{name} {kind}\nsqueeze_{name} {v}\n"
        ));
    }
    ublk_prometheus(ublk, &mut out);
    out
}
