//! `squeeze scan`: what compression would gain on the user's own data.
//!
//! 1. walk: files, directories (symlinks inside them not followed) and
//!    block devices; only data extents count (SEEK_DATA/SEEK_HOLE);
//! 2. plan: by default `--sample-mib` MiB in 128 KiB pieces spread evenly
//!    over all the data, `--full` reads every byte;
//! 3. detect: each file's type from its first 4 KiB (magic bytes, text
//!    heuristics); pieces of files that are "binary" or start with zeros
//!    (disk images, block devices) are classified piece by piece, and an
//!    all-zero piece is "zeros" wherever it is;
//! 4. measure: every piece cut into blobs of 4K, 16K, 64K and 128K and run
//!    through lz4, zstd:1/3/9, snappy and deflate:1/6 (see `measure`);
//! 5. report: per type and for all data, ratio, saving, single-core speeds
//!    and CPU seconds per GiB; a recommended policy; the types not worth
//!    compressing (best ratio < 1.1);
//! 6. with `--dedup`, a second pass reads every byte and estimates what
//!    deduplication of 4 KiB sectors would save (see `dedup`).
//!
//! The recommendation is `choose`'s rule (see its docs); `report` makes
//! the report and prints it.
//!
//! Invariants: an unreadable path or a special file is reported on stderr,
//! counted in the report and skipped; the scan goes on. Measuring never
//! alters the input (files are opened read-only).

mod choose;
pub mod dedup;
pub mod detect;
pub mod measure;
mod report;
pub mod walk;

use crate::machine::machine;
use crate::util::progress;
use anyhow::{bail, Context, Result};
use detect::detect;
use indicatif::ProgressBar;
use measure::Measurer;
use report::{chart, group_report, print_text, recommend, sum_groups, GroupReport, Report};
use std::fs::File;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use walk::{read_at, WalkStats};

/// Size of the pieces read (and the largest blob measured).
pub const PIECE: u64 = 128 << 10;
/// Bytes of a file's start used to detect its type.
const HEADER: u64 = 4096;

/// Measure what each codec and blob size gains on your data, by type.
#[derive(clap::Args)]
pub struct Args {
    /// Files, directories or block devices to scan.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Read every byte instead of sampling.
    #[arg(long)]
    pub full: bool,
    /// MiB to sample, spread evenly over all data (ignored with --full).
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub sample_mib: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG chart of ratio against single-core compress speed.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<PathBuf>,
    /// Measuring threads (each measurement is single-core); default: cores.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also estimate what deduplication of 4 KiB sectors saves: reads
    /// every byte once more (not sampled) and fingerprints each block.
    #[arg(long)]
    pub dedup: bool,
    /// MiB of RAM for --dedup's fingerprints: exact while they fit, then
    /// sampled by fingerprint (the report gives the rate).
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub dedup_mem: u64,
}

pub fn run(a: Args) -> Result<ExitCode> {
    if !a.full && a.sample_mib == 0 {
        bail!("--sample-mib must be at least 1");
    }
    if a.dedup && a.dedup_mem == 0 {
        bail!("--dedup-mem must be at least 1 (MiB)");
    }
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let mut st = WalkStats::default();
    let inputs = walk::walk(&a.paths, &mut st);
    let budget = (!a.full).then_some(a.sample_mib << 20);
    let plan = walk::plan(&inputs, budget, PIECE);
    let bytes_logical: u64 = inputs.iter().map(|i| i.size).sum();
    let bytes_data: u64 = inputs.iter().map(walk::Input::data_bytes).sum();
    let to_read: u64 = plan.iter().flatten().map(|p| p.1).sum();
    let sampled = to_read < bytes_data;
    let pb = if std::io::stderr().is_terminal() && to_read > (32 << 20) {
        progress(to_read, "scan")
    } else {
        ProgressBar::hidden()
    };

    let mut m = Measurer::new(threads);
    let mut bytes_scanned = 0u64;
    for (inp, pieces) in inputs.iter().zip(&plan) {
        if pieces.is_empty() {
            continue;
        }
        let f = match File::open(&inp.path) {
            Ok(f) => f,
            Err(e) => {
                pb.suspend(|| st.unreadable(&inp.path, "open", &e));
                continue;
            }
        };
        let file_type = match read_at(&f, 0, HEADER.min(inp.size)) {
            Ok(h) => detect(&h),
            Err(e) => {
                pb.suspend(|| st.unreadable(&inp.path, "read", &e));
                continue;
            }
        };
        let per_piece = inp.block_device || file_type.kind.per_piece();
        for &(off, len) in pieces {
            let buf = match read_at(&f, off, len) {
                Ok(b) => b,
                Err(e) => {
                    st.unreadable += 1;
                    pb.suspend(|| {
                        st.problem(format!(
                            "cannot read {} at offset {off}: {e} (rest of it skipped)",
                            inp.path.display()
                        ))
                    });
                    break;
                }
            };
            if buf.is_empty() {
                continue;
            }
            let d = if per_piece || buf.iter().all(|&b| b == 0) {
                detect(&buf)
            } else {
                file_type
            };
            bytes_scanned += buf.len() as u64;
            pb.inc(len);
            m.add(d.kind, d.format, buf)?;
        }
    }
    pb.set_message("measuring");
    m.flush()?;
    pb.finish_and_clear();
    let dedup = a
        .dedup
        .then(|| dedup_pass(&inputs, a.dedup_mem << 20, &mut st));
    if bytes_scanned == 0 {
        eprintln!("squeeze scan: no data found to measure");
    }

    let algs = m.algs().to_vec();
    let all_g = sum_groups(&m.groups, algs.len());
    let all = group_report("all", &all_g, &algs, bytes_scanned);
    let groups: Vec<GroupReport> = m
        .groups
        .iter()
        .map(|(k, g)| group_report(k.name(), g, &algs, bytes_scanned))
        .collect();
    let recommendation = recommend(&all, &groups, bytes_data);
    let report = Report {
        tool: "squeeze scan",
        machine: machine(),
        paths: a.paths.iter().map(|p| p.display().to_string()).collect(),
        sampled,
        sample_bytes_target: budget,
        piece_size: PIECE,
        bytes_logical,
        bytes_data,
        bytes_scanned,
        walk: st,
        recommendation,
        all,
        groups,
        dedup,
    };
    if let Some(path) = &a.chart {
        std::fs::write(path, chart(&report.all))
            .with_context(|| format!("writing chart {}", path.display()))?;
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// The `--dedup` pass: every data extent read in full, block by block
/// from each file's offset 0; an unreadable file is reported and skipped.
fn dedup_pass(inputs: &[walk::Input], mem: u64, st: &mut WalkStats) -> dedup::DedupReport {
    const READ: u64 = 1 << 20;
    let block = dedup::BLOCK as u64;
    let mut est = dedup::DedupEstimator::new(mem);
    let total: u64 = inputs.iter().map(walk::Input::data_bytes).sum();
    let pb = if std::io::stderr().is_terminal() && total > (32 << 20) {
        progress(total, "dedup")
    } else {
        ProgressBar::hidden()
    };
    for inp in inputs {
        let f = match File::open(&inp.path) {
            Ok(f) => f,
            Err(e) => {
                pb.suspend(|| st.unreadable(&inp.path, "open", &e));
                continue;
            }
        };
        // Extents rounded out to whole blocks; a block two extents share
        // is counted once.
        let mut next = 0u64;
        'extents: for &(start, len) in &inp.extents {
            let mut off = (start / block * block).max(next);
            let end = (start + len).div_ceil(block) * block;
            while off < end {
                let n = READ.min(end - off).min(inp.size.saturating_sub(off));
                if n == 0 {
                    break;
                }
                match read_at(&f, off, n) {
                    Ok(buf) if !buf.is_empty() => {
                        est.add_all(&buf);
                        pb.inc(buf.len() as u64);
                        off += buf.len().div_ceil(dedup::BLOCK) as u64 * block;
                    }
                    Ok(_) => break,
                    Err(e) => {
                        st.unreadable += 1;
                        pb.suspend(|| {
                            st.problem(format!(
                                "cannot read {} at offset {off}: {e} (rest of it skipped)",
                                inp.path.display()
                            ))
                        });
                        break 'extents;
                    }
                }
            }
            next = off;
        }
    }
    pb.finish_and_clear();
    est.report()
}
