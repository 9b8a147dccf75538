//! What the default `squeeze bench` run reports: the JSON (`--json`) and
//! the text.

use crate::util::human;

#[derive(serde::Serialize)]
pub(super) struct Report {
    pub(super) machine: String,
    pub(super) cores: usize,
    pub(super) threads: usize,
    /// Requests in flight, raw codec and engine alike.
    pub(super) writers: usize,
    pub(super) algorithm: String,
    /// The compression engine of both passes (isal-pool when ISA-L is
    /// present: it runs deflate:1..=3).
    pub(super) engine: String,
    /// --adapt: the engine's writes could go below the algorithm.
    pub(super) adaptive: bool,
    /// Share of the engine's last timed write stored with a faster codec
    /// than the algorithm (0 without --adapt).
    pub(super) below_target_fraction: f64,
    pub(super) mode: String,
    pub(super) max_blob: u32,
    pub(super) data: String,
    pub(super) bytes: u64,
    /// Timed repetitions; every speed is the median over them.
    pub(super) reps: u32,
    /// Until every write is acknowledged (fio's app bandwidth: no flush).
    pub(super) write_mbps: f64,
    /// The same write on the untimed warm-up volume (0 with --no-warmup):
    /// what a first pass over never-touched memory costs.
    pub(super) cold_write_mbps: f64,
    /// Including the final flush that makes it all durable.
    pub(super) write_durable_mbps: f64,
    /// The second read of the same data: the page cache holds the
    /// compressed log, so this is the engine's own cost.
    pub(super) read_mbps: f64,
    /// The first read, from the device (the log is written with O_DIRECT
    /// and bypasses the page cache).
    pub(super) cold_read_mbps: f64,
    pub(super) backing_write_mbps: f64,
    pub(super) raw_compress_mbps: f64,
    pub(super) raw_decompress_mbps: f64,
    /// The raw codec decoding the same data cut as the engine stores it
    /// when the policy chunks payloads (independent frames of `read_chunk`
    /// raw bytes; 0 when it does not): what the layout costs apart from
    /// the engine.
    pub(super) raw_decompress_chunks_mbps: f64,
    pub(super) read_chunk: u32,
    pub(super) write_vs_raw: f64,
    /// Each repetition's engine write against the raw compress beside it
    /// (write_vs_raw is their median).
    pub(super) write_vs_raw_reps: Vec<f64>,
    pub(super) read_vs_raw: f64,
    /// The engine's read against `raw_decompress_chunks_mbps` (0: none).
    pub(super) read_vs_raw_chunks: f64,
    pub(super) ratio: f64,
    pub(super) raw_ratio: f64,
    pub(super) cpu_utilization_write: f64,
    pub(super) cpu_utilization_read: f64,
    pub(super) cpu_seconds_per_gib_write: f64,
    pub(super) cpu_seconds_per_gib_read: f64,
    /// The raw compress passes: process CPU seconds per GiB, and the share
    /// of the cores they kept busy (the engine's overhead is the difference
    /// in the first and the idle time in the second).
    pub(super) raw_cpu_seconds_per_gib_compress: f64,
    pub(super) raw_cpu_utilization_compress: f64,
    pub(super) zero_write_mbps: f64,
    /// 4 KiB reads at random offsets (`random_read`), everything in the
    /// page cache: the engine's and a plain file's of the same bytes, the
    /// engine against the file (the median of each repetition's ratio),
    /// and process CPU microseconds per read of each.
    pub(super) random_read_iops: f64,
    pub(super) raw_file_random_read_iops: f64,
    pub(super) random_read_vs_raw_file: f64,
    pub(super) cpu_us_per_random_read: f64,
    pub(super) raw_file_cpu_us_per_random_read: f64,
    pub(super) map_bytes_per_mapped_sector: f64,
    pub(super) blobs_compressed: u64,
    pub(super) blobs_rejected: u64,
    pub(super) blobs_skipped: u64,
}

impl Report {
    /// The report as text.
    pub(super) fn print(&self) {
        outln!("machine          {}", self.machine);
        outln!("data             {} of {}", human(self.bytes), self.data);
        outln!(
            "policy           {} {} max_blob {}, {} threads, {} writers; speeds are medians of {} runs",
            self.algorithm,
            self.mode,
            human(u64::from(self.max_blob)),
            self.threads,
            self.writers,
            self.reps
        );
        outln!(
            "engine           {}{}",
            self.engine,
            if self.adaptive {
                format!(
                    ", adaptive codec: {:.1}% of the last write below {}",
                    100.0 * self.below_target_fraction,
                    self.algorithm
                )
            } else {
                String::new()
            }
        );
        outln!(
            "engine write     {:>8.1} MB/s  ({}), backing file {:.1} MB/s, CPU {:.0}%, {:.2} CPU s/GiB",
            self.write_mbps,
            of_raw(self.write_vs_raw, "compress"),
            self.backing_write_mbps,
            100.0 * self.cpu_utilization_write,
            self.cpu_seconds_per_gib_write
        );
        outln!(
            "  with the flush {:>8.1} MB/s  (the final fdatasync of the backing file included)",
            self.write_durable_mbps
        );
        if self.cold_write_mbps > 0.0 {
            outln!(
                "  cold           {:>8.1} MB/s  (the untimed warm-up pass: first touch of fresh memory and page cache)",
                self.cold_write_mbps
            );
        }
        outln!(
            "engine read      {:>8.1} MB/s  ({}), CPU {:.0}%, {:.2} CPU s/GiB",
            self.read_mbps,
            of_raw(self.read_vs_raw, "decompress"),
            100.0 * self.cpu_utilization_read,
            self.cpu_seconds_per_gib_read
        );
        outln!(
            "  cold           {:>8.1} MB/s  (the first read, from the device: the log bypasses the page cache)",
            self.cold_read_mbps
        );
        outln!(
            "4K random read   {:>8.0} IOPS  ({:.0}% of a plain file's {:.0}), {:.1} CPU us a read (the file's {:.1})",
            self.random_read_iops,
            100.0 * self.random_read_vs_raw_file,
            self.raw_file_random_read_iops,
            self.cpu_us_per_random_read,
            self.raw_file_cpu_us_per_random_read
        );
        outln!(
            "raw compress     {:>8.1} MB/s  CPU {:.0}%, {:.2} CPU s/GiB",
            self.raw_compress_mbps,
            100.0 * self.raw_cpu_utilization_compress,
            self.raw_cpu_seconds_per_gib_compress
        );
        if self.write_vs_raw_reps.len() > 1 {
            let reps: Vec<String> = self
                .write_vs_raw_reps
                .iter()
                .map(|x| format!("{:.0}%", 100.0 * x))
                .collect();
            outln!("  write vs raw by run: {}", reps.join(", "));
        }
        outln!("raw decompress   {:>8.1} MB/s", self.raw_decompress_mbps);
        if self.raw_decompress_chunks_mbps > 0.0 {
            outln!(
                "  in {} chunks   {:>8.1} MB/s  (the blobs cut as the engine stores them; engine read {:.0}% of it)",
                human(u64::from(self.read_chunk)),
                self.raw_decompress_chunks_mbps,
                100.0 * self.read_vs_raw_chunks
            );
        }
        outln!(
            "ratio            {:.3} stored (raw codec alone: {:.3}); blobs {} compressed, {} rejected, {} skipped",
            self.ratio, self.raw_ratio, self.blobs_compressed, self.blobs_rejected, self.blobs_skipped
        );
        outln!(
            "zero writes      {:>8.1} MB/s (one thread)",
            self.zero_write_mbps
        );
        outln!(
            "map memory       {:.2} bytes per mapped sector",
            self.map_bytes_per_mapped_sector
        );
    }
}

/// "83% of raw compress", or why there is no such figure.
fn of_raw(ratio: f64, what: &str) -> String {
    if ratio > 0.0 {
        format!("{:.0}% of raw {what}", 100.0 * ratio)
    } else {
        "no codec runs: nothing to compare".into()
    }
}
