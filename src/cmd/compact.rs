//! `squeeze compact PATH`: run the cleaner to completion offline: every
//! segment holding dead bytes is cleaned, a checkpoint frees the victims and
//! they are punched out of the file. Prints what was reclaimed.

use crate::util::{human, open_volume, progress};
use anyhow::Result;
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
}

pub fn run(a: Args) -> Result<ExitCode> {
    let vol = open_volume(&a.path, false)?;
    let before = vol.stats();
    let pb = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let pb = progress(0, "compacting");
        pb.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} segments")
                .expect("template"),
        );
        pb
    });
    let t0 = Instant::now();
    let rep = vol.compact(|done, total| {
        if let Some(pb) = &pb {
            pb.set_length(total);
            pb.set_position(done);
        }
    })?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let secs = t0.elapsed().as_secs_f64();
    let after = vol.stats();
    vol.close()?;
    let reclaimed = before.physical_bytes.saturating_sub(after.physical_bytes);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "report": rep,
                "seconds": secs,
                "physical_bytes_before": before.physical_bytes,
                "physical_bytes_after": after.physical_bytes,
                "reclaimed_bytes": reclaimed,
                "stored_bytes": after.stored_bytes,
                "compression_ratio": after.compression_ratio,
            }))?
        );
    } else {
        println!(
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
        println!(
            "physical {} -> {} (reclaimed {}); {} stored, ratio {:.3}",
            human(before.physical_bytes),
            human(after.physical_bytes),
            human(reclaimed),
            human(after.stored_bytes),
            after.compression_ratio
        );
        if rep.corrupt_records > 0 {
            println!(
                "{} records failed their checksum and were left in place: run `squeeze check`",
                rep.corrupt_records
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
