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
    let vol = match open_volume_read_only_locked(&a.path, true, true) {
        Ok(v) => v,
        Err(e) => {
            if a.json {
                outln!(
                    "{}",
                    serde_json::json!({ "ok": false, "fatal": crate::util::error_text(&e) })
                );
            } else {
                eprintln!(
                    "squeeze check: {}: {}",
                    a.path.display(),
                    crate::util::error_text(&e)
                );
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
        let r = &report.recovery;
        if let Some(sb) = &r.superblock {
            outln!("SUPERBLOCK DAMAGED: {sb}");
        }
        if let Some(m) = &r.damaged_marks {
            let slots: Vec<String> = m.slots.iter().map(u64::to_string).collect();
            outln!(
                "FLUSH MARKS DAMAGED: slot(s) {} hold neither zeros nor a mark{}",
                slots.join(", "),
                if m.after_crash {
                    ": the volume was not closed cleanly, so flushed writes after the newest \
                     intact mark may be missing without being named"
                } else {
                    " (the volume was closed cleanly: nothing needed them)"
                }
            );
        }
        if let Some(t) = &r.truncated {
            outln!(
                "TRUNCATED: the file is {} bytes, but its records reach byte {} or further ({} bytes or more cut off)",
                t.file_len,
                t.needed,
                t.needed - t.file_len
            );
        }
        for l in &r.lost {
            outln!(
                "LOST FLUSHED RECORDS: seqs {}..{} ({} records), damaged log at byte {}{}",
                l.first_seq,
                l.end_seq,
                l.end_seq - l.first_seq,
                l.log_offset,
                if l.lbas.is_empty() {
                    " (no header survived: their sectors cannot be named and read back older data)"
                        .to_string()
                } else {
                    String::new()
                }
            );
            for &(lba, n) in &l.lbas {
                let last = lba + u64::from(n) - 1;
                outln!(
                    "LOST LBA {}..={} ({} sectors, bytes {}..{}): a flushed write whose record is damaged",
                    lba,
                    last,
                    n,
                    lba * 4096,
                    (last + 1) * 4096
                );
            }
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
        } else if r.is_loss() {
            outln!(
                "{} damaged sectors; {} flushed log records lost{}",
                report.damaged_sectors(),
                r.lost_records(),
                if r.truncated.is_some() {
                    "; the file was cut short"
                } else {
                    ""
                }
            );
        } else if report.damaged.is_empty() && report.accounting.is_none() {
            outln!("damage found in the metadata; the data is intact (the next checkpoint rewrites it)");
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
