//! `squeeze check PATH [--json]`: verify both superblocks, the checkpoint,
//! the log after it, the accounting, and every live record; list damaged
//! sectors by LBA. Exit status 0 when clean, 1 when damage was found, 2 when
//! the volume cannot be opened at all.

use crate::util::{open_volume_read_only_locked, progress};
use anyhow::Result;
use squeeze_engine::check::check;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    pub path: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let vol = match open_volume_read_only_locked(&a.path, true) {
        Ok(v) => v,
        Err(e) => {
            if a.json {
                outln!(
                    "{}",
                    serde_json::json!({ "ok": false, "fatal": format!("{e:#}") })
                );
            } else {
                eprintln!("squeeze check: {}: {e:#}", a.path.display());
            }
            return Ok(ExitCode::from(2));
        }
    };
    let pb = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let pb = progress(0, "checking");
        pb.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} sectors")
                .expect("template"),
        );
        pb
    });
    let report = check(&vol, |done, total| {
        if let Some(pb) = &pb {
            pb.set_length(total);
            pb.set_position(done);
        }
    });
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        v["ok"] = serde_json::Value::Bool(report.is_clean());
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for (i, s) in report.superblock_slots.iter().enumerate() {
            outln!("superblock slot {i}: {s}");
        }
        outln!(
            "checked {} records covering {} sectors",
            report.records_checked,
            report.sectors_checked
        );
        if let Some(acc) = &report.accounting {
            outln!("ACCOUNTING ERROR: {acc}");
        }
        for d in &report.damaged {
            let last = d.first_lba + d.sectors - 1;
            outln!(
                "DAMAGED LBA {}..={} ({} sectors, bytes {}..{}): {}",
                d.first_lba,
                last,
                d.sectors,
                d.first_lba * 4096,
                (last + 1) * 4096,
                d.error
            );
        }
        if report.is_clean() {
            outln!("ok: no damage found");
        } else {
            outln!("{} damaged sectors", report.damaged_sectors());
        }
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
