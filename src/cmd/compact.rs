//! `squeeze compact PATH`: bring a volume offline to its best ratio. First
//! the merger rewrites every fragmented window (scattered small records
//! left by small overwrites) as whole blobs (`--no-merge` skips it); then
//! the cleaner runs to completion: every segment holding dead bytes is
//! cleaned, a checkpoint frees the victims and they are punched out of the
//! file. Prints what was merged and reclaimed. With `--dedup`, a
//! deduplication pass runs first (docs/DEDUP.md): content found more than
//! once is stored once and shared, and the copies it replaced are among
//! what the cleaner then reclaims.

use crate::control_client::is_socket;
use crate::util::{human, open_volume, progress};
use anyhow::{bail, Result};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    pub path: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Only clean: do not rewrite fragmented windows as whole blobs first.
    #[arg(long)]
    pub no_merge: bool,
    /// Deduplicate first: share the content of 4 KiB sectors the volume
    /// holds more than once (reads the whole volume).
    #[arg(long)]
    pub dedup: bool,
    /// MiB of RAM for --dedup's fingerprint index (about 54,000 entries a
    /// MiB, one per 4 KiB sector: 211 MiB of data). A volume whose sectors
    /// do not fit keeps 1 fingerprint in up to 32 and finds the rest of a
    /// copy from them; content seen again after the index has forgotten
    /// it is not shared.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub dedup_index: u64,
}

/// Runs `work` with a progress bar on a terminal (none with --json); `work`
/// reports (done, total).
fn with_progress<T>(
    json: bool,
    msg: &str,
    template: &str,
    work: impl FnOnce(&mut dyn FnMut(u64, u64)) -> T,
) -> T {
    let pb = (!json && std::io::stderr().is_terminal()).then(|| {
        let pb = progress(0, msg);
        pb.set_style(indicatif::ProgressStyle::with_template(template).expect("template"));
        pb
    });
    let r = work(&mut |done, total| {
        if let Some(pb) = &pb {
            pb.set_length(total);
            pb.set_position(done);
        }
    });
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    r
}

pub fn run(a: Args) -> Result<ExitCode> {
    if is_socket(&a.path) {
        bail!(
            "{p} is a Unix socket (a running server's control socket?), not a volume file: \
             `squeeze compact` works on a volume file no server has open. A running server \
             merges and cleans by itself (in the background, and without pause once its \
             clients have been idle for a second); `squeeze stats {p}` shows what is left \
             (garbage_bytes). To compact now, stop the server and run `squeeze compact` on \
             its volume file.",
            p = a.path.display()
        );
    }
    if a.dedup && a.dedup_index == 0 {
        bail!("--dedup-index must be at least 1 (MiB)");
    }
    let vol = open_volume(&a.path, false)?;
    let before = vol.stats();
    let t_dedup = Instant::now();
    let dedup = if a.dedup {
        Some(with_progress(
            a.json,
            "deduplicating",
            "{msg} [{bar:40}] {percent}% of the LBA space",
            |p| vol.dedup(a.dedup_index << 20, p),
        )?)
    } else {
        None
    };
    let dedup_secs = t_dedup.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let merged = if a.no_merge {
        squeeze_engine::MergeReport::default()
    } else {
        with_progress(
            a.json,
            "merging",
            "{msg} [{bar:40}] {percent}% of the LBA space",
            |p| vol.merge(p),
        )?
    };
    let merge_secs = t0.elapsed().as_secs_f64();
    let rep = with_progress(
        a.json,
        "compacting",
        "{msg} [{bar:40}] {pos}/{len} segments",
        |p| vol.compact(p),
    )?;
    let secs = t0.elapsed().as_secs_f64() - merge_secs;
    let after = vol.stats();
    vol.close()?;
    let reclaimed = before.physical_bytes.saturating_sub(after.physical_bytes);
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "report": rep,
                "dedup": dedup,
                "dedup_seconds": dedup_secs,
                "merge": merged,
                "merge_seconds": merge_secs,
                "seconds": secs,
                "physical_bytes_before": before.physical_bytes,
                "physical_bytes_after": after.physical_bytes,
                "reclaimed_bytes": reclaimed,
                "stored_bytes": after.stored_bytes,
                "compression_ratio": after.compression_ratio,
            }))?
        );
    } else {
        if let Some(d) = &dedup {
            outln!(
                "deduplicated in {:.2} s: {} sectors fingerprinted, {} linked to shared content ({} of it written once), {} hidden addresses no longer shared zeroed; index {} ({} entries, 1 fingerprint in {} kept, {} forgotten)",
                dedup_secs,
                d.sectors_fingerprinted,
                d.sectors_linked,
                human(d.sectors_promoted * squeeze_engine::SECTOR_SIZE as u64),
                d.orphans_zeroed,
                human(d.index_bytes),
                d.index_entries,
                d.index_sample,
                d.index_evicted
            );
            if d.corrupt_windows > 0 {
                outln!(
                    "{} windows hold a record that failed its checksum and were left as they are: run `squeeze check`",
                    d.corrupt_windows
                );
            }
        }
        if !a.no_merge {
            outln!(
                "merged {} fragmented windows ({} rewritten as {} of records) in {:.2} s",
                merged.windows,
                human(merged.sectors * squeeze_engine::SECTOR_SIZE as u64),
                human(merged.bytes_written),
                merge_secs
            );
            if merged.corrupt_windows > 0 {
                outln!(
                    "{} windows hold a record that failed its checksum and were left as they are: run `squeeze check`",
                    merged.corrupt_windows
                );
            }
        }
        outln!(
            "compacted {}: cleaned {} segments, moved {} records ({} sectors, {} written, {} recompressed) in {:.2} s ({:.1} MB/s)",
            a.path.display(),
            rep.victims,
            rep.records_moved,
            rep.sectors_moved,
            human(rep.bytes_written),
            rep.recompressed,
            secs,
            rep.bytes_written as f64 / 1e6 / secs.max(1e-9)
        );
        outln!(
            "physical {} -> {} (reclaimed {}); {} stored, ratio {:.3}",
            human(before.physical_bytes),
            human(after.physical_bytes),
            human(reclaimed),
            human(after.stored_bytes),
            after.compression_ratio
        );
        if rep.corrupt_records > 0 {
            outln!(
                "{} records failed their checksum and were left in place: run `squeeze check`",
                rep.corrupt_records
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
