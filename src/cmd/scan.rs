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
//!    compressing (best ratio < 1.1).
//!
//! Invariants: an unreadable path or a special file is reported on stderr,
//! counted in the report and skipped; the scan goes on. Measuring never
//! alters the input (files are opened read-only).

pub mod detect;
pub mod measure;
pub mod svg;
pub mod walk;

use crate::util::{human, progress};
use anyhow::{bail, Context, Result};
use detect::{detect, DataType};
use indicatif::ProgressBar;
use measure::{Cell, Group, Measurer, BLOB_SIZES};
use serde::Serialize;
use squeeze_codec::{Algorithm, CodecId};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use walk::{read_at, WalkStats};

/// Size of the pieces read (and the largest blob measured).
pub const PIECE: u64 = 128 << 10;
/// Bytes of a file's start used to detect its type.
const HEADER: u64 = 4096;
/// Below this best ratio a type is not worth compressing.
pub const WORTH_RATIO: f64 = 1.1;
/// Single-core compress speed a codec needs to be recommended for inline
/// use (slower ones are listed, not recommended).
pub const INLINE_MIN_MBPS: f64 = 200.0;
/// Among codecs, a saving within this much of the best counts as a tie,
/// and the cheaper CPU wins.
const SAVING_TIE: f64 = 0.01;
/// The smallest blob size reaching this fraction of a codec's best saving
/// is recommended (smaller blobs: less read amplification).
const BLOB_SAVING_FRACTION: f64 = 0.95;

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
}

#[derive(Serialize, Clone, Copy, Debug, Default)]
pub struct CpuPerGib {
    pub compress: f64,
    pub decompress: f64,
}

#[derive(Serialize, Clone, Debug)]
struct CodecRow {
    algorithm: String,
    codec: String,
    level: i32,
    blob_size: usize,
    raw_bytes: u64,
    stored_bytes: u64,
    blobs: u64,
    blobs_compressed: u64,
    ratio: f64,
    saving: f64,
    compress_mbps: Option<f64>,
    decompress_mbps: Option<f64>,
    cpu_seconds_per_gib: CpuPerGib,
}

#[derive(Serialize, Clone, Debug)]
struct Choice {
    algorithm: String,
    codec: String,
    level: i32,
    mode: String,
    max_blob_size: usize,
    ratio: f64,
    saving: f64,
    compress_mbps: Option<f64>,
    decompress_mbps: Option<f64>,
    cpu_seconds_per_gib: CpuPerGib,
}

#[derive(Serialize)]
struct GroupReport {
    #[serde(rename = "type")]
    kind: String,
    bytes_scanned: u64,
    share: f64,
    pieces: u64,
    formats: BTreeMap<String, u64>,
    /// Per blob size: fraction of blobs the incompressibility heuristic
    /// (mode aggressive) would store raw without running the codec.
    heuristic_skip_fraction: BTreeMap<usize, f64>,
    best_ratio: f64,
    worth_compressing: bool,
    advice: String,
    choice: Option<Choice>,
    codecs: Vec<CodecRow>,
}

#[derive(Serialize)]
struct NotWorth {
    #[serde(rename = "type")]
    kind: String,
    share: f64,
    best_ratio: f64,
    heuristic_skip_fraction: f64,
}

#[derive(Serialize)]
struct Recommendation {
    algorithm: String,
    codec: String,
    level: i32,
    mode: String,
    max_blob_size: usize,
    ratio: f64,
    saving: f64,
    compress_mbps: Option<f64>,
    decompress_mbps: Option<f64>,
    cpu_seconds_per_gib: CpuPerGib,
    /// Saving extrapolated to all data found (bytes).
    expected_bytes_saved: u64,
    not_worth_compressing: Vec<NotWorth>,
    summary: String,
}

#[derive(Serialize)]
struct Report {
    tool: &'static str,
    machine: String,
    paths: Vec<String>,
    sampled: bool,
    sample_bytes_target: Option<u64>,
    piece_size: u64,
    bytes_logical: u64,
    bytes_data: u64,
    bytes_scanned: u64,
    #[serde(flatten)]
    walk: WalkStats,
    recommendation: Recommendation,
    all: GroupReport,
    groups: Vec<GroupReport>,
}

fn ratio(c: &Cell) -> f64 {
    if c.stored == 0 {
        1.0
    } else {
        c.raw as f64 / c.stored as f64
    }
}

fn row(cfg: measure::Config, blob_size: usize, c: &Cell) -> CodecRow {
    let alg = cfg.alg;
    let gib = c.raw as f64 / (1u64 << 30) as f64;
    let per_gib = |ns: u64| {
        if gib > 0.0 {
            ns as f64 / 1e9 / gib
        } else {
            0.0
        }
    };
    let mbps = |bytes: u64, ns: u64| (ns > 0 && bytes > 0).then(|| bytes as f64 * 1e3 / ns as f64);
    CodecRow {
        algorithm: cfg.to_string(),
        codec: alg.codec.name().to_string(),
        level: alg.effective_level(),
        blob_size,
        raw_bytes: c.raw,
        stored_bytes: c.stored,
        blobs: c.blobs,
        blobs_compressed: c.blobs_compressed,
        ratio: ratio(c),
        saving: if c.raw == 0 {
            0.0
        } else {
            1.0 - c.stored as f64 / c.raw as f64
        },
        compress_mbps: mbps(c.raw, c.compress_ns),
        decompress_mbps: mbps(c.raw_decompressed, c.decompress_ns),
        cpu_seconds_per_gib: CpuPerGib {
            compress: per_gib(c.compress_ns),
            decompress: per_gib(c.decompress_ns),
        },
    }
}

/// The policy for a set of rows: among codecs fast enough for inline use,
/// each at the smallest blob size reaching 95% of its best saving, the
/// best saving wins; savings within one percentage point tie and the
/// lower CPU cost (compress + decompress) wins. `None` when the best ratio
/// is below [`WORTH_RATIO`].
fn choose(rows: &[CodecRow]) -> Option<Choice> {
    let best_ratio = rows.iter().map(|r| r.ratio).fold(0.0, f64::max);
    if best_ratio < WORTH_RATIO {
        return None;
    }
    // ISA-L's rows are the same algorithm on another engine (a volume gets
    // it for deflate:1..=3 when present): the choice names algorithms.
    let fast = |r: &&CodecRow| {
        !r.algorithm.ends_with("(isa-l)") && r.compress_mbps.is_none_or(|m| m >= INLINE_MIN_MBPS)
    };
    let mut pool: Vec<&CodecRow> = rows.iter().filter(fast).collect();
    if pool.is_empty() {
        pool = rows
            .iter()
            .filter(|r| !r.algorithm.ends_with("(isa-l)"))
            .collect();
    }
    let mut per_alg: Vec<&CodecRow> = Vec::new();
    let mut algs: Vec<&str> = pool.iter().map(|r| r.algorithm.as_str()).collect();
    algs.dedup();
    for a in algs {
        let mut mine: Vec<&CodecRow> = pool.iter().copied().filter(|r| r.algorithm == a).collect();
        mine.sort_by_key(|r| r.blob_size);
        let top = mine.iter().map(|r| r.saving).fold(f64::MIN, f64::max);
        if let Some(r) = mine.iter().find(|r| r.saving >= BLOB_SAVING_FRACTION * top) {
            per_alg.push(r);
        }
    }
    let best = per_alg.iter().map(|r| r.saving).fold(f64::MIN, f64::max);
    let cost = |r: &CodecRow| r.cpu_seconds_per_gib.compress + r.cpu_seconds_per_gib.decompress;
    let pick = per_alg
        .iter()
        .filter(|r| r.saving >= best - SAVING_TIE)
        .min_by(|a, b| cost(a).total_cmp(&cost(b)))?;
    Some(Choice {
        algorithm: pick.algorithm.clone(),
        codec: pick.codec.clone(),
        level: pick.level,
        mode: "aggressive".into(),
        max_blob_size: pick.blob_size,
        ratio: pick.ratio,
        saving: pick.saving,
        compress_mbps: pick.compress_mbps,
        decompress_mbps: pick.decompress_mbps,
        cpu_seconds_per_gib: pick.cpu_seconds_per_gib,
    })
}

fn group_report(kind: &str, g: &Group, algs: &[measure::Config], total: u64) -> GroupReport {
    let mut codecs = Vec::new();
    for (a, alg) in algs.iter().enumerate() {
        for (s, &bs) in BLOB_SIZES.iter().enumerate() {
            codecs.push(row(*alg, bs, &g.cells[a][s]));
        }
    }
    let best_ratio = codecs.iter().map(|r| r.ratio).fold(0.0, f64::max);
    let heuristic_skip_fraction: BTreeMap<usize, f64> = BLOB_SIZES
        .iter()
        .zip(g.heuristic.iter())
        .map(|(&bs, &(n, k))| (bs, if n == 0 { 0.0 } else { k as f64 / n as f64 }))
        .collect();
    let choice = choose(&codecs);
    let worth = choice.is_some();
    let advice = match &choice {
        Some(_) if kind == "zeros" => {
            "free in squeeze: all-zero blobs are stored as holes, no codec runs".to_string()
        }
        Some(c) => format!(
            "compress: {} max_blob {}, ratio {:.2} ({:.1}% saved)",
            c.algorithm,
            human(c.max_blob_size as u64),
            c.ratio,
            100.0 * c.saving
        ),
        None => {
            let skip = heuristic_skip_fraction[&(PIECE as usize)];
            let mut s = format!(
                "store raw; mode aggressive's heuristic will skip it (best ratio {best_ratio:.3})"
            );
            if skip < 0.9 && kind != "zeros" {
                s += &format!(
                    "; note: the heuristic flags only {:.0}% of its 128 KiB blobs, the rest cost a codec call each",
                    100.0 * skip
                );
            }
            s
        }
    };
    GroupReport {
        kind: kind.to_string(),
        bytes_scanned: g.bytes,
        share: if total == 0 {
            0.0
        } else {
            g.bytes as f64 / total as f64
        },
        pieces: g.pieces,
        formats: g.formats.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        heuristic_skip_fraction,
        best_ratio,
        worth_compressing: worth,
        advice,
        choice,
        codecs,
    }
}

/// Sums the groups into "all data".
fn sum_groups(groups: &BTreeMap<DataType, Group>, n_algs: usize) -> Group {
    let mut all = Group {
        cells: vec![[Cell::default(); BLOB_SIZES.len()]; n_algs],
        ..Default::default()
    };
    for g in groups.values() {
        all.bytes += g.bytes;
        all.pieces += g.pieces;
        for (k, v) in &g.formats {
            *all.formats.entry(k).or_default() += v;
        }
        for s in 0..BLOB_SIZES.len() {
            all.heuristic[s].0 += g.heuristic[s].0;
            all.heuristic[s].1 += g.heuristic[s].1;
        }
        for a in 0..n_algs {
            for s in 0..BLOB_SIZES.len() {
                let (x, y) = (&mut all.cells[a][s], &g.cells[a][s]);
                x.raw += y.raw;
                x.stored += y.stored;
                x.blobs += y.blobs;
                x.blobs_compressed += y.blobs_compressed;
                x.raw_decompressed += y.raw_decompressed;
                x.compress_ns += y.compress_ns;
                x.decompress_ns += y.decompress_ns;
            }
        }
    }
    all
}

pub fn run(a: Args) -> Result<ExitCode> {
    if !a.full && a.sample_mib == 0 {
        bail!("--sample-mib must be at least 1");
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
                st.unreadable += 1;
                pb.suspend(|| {
                    st.problem(format!("cannot open {}: {e} (skipped)", inp.path.display()))
                });
                continue;
            }
        };
        let file_type = match read_at(&f, 0, HEADER.min(inp.size)) {
            Ok(h) => detect(&h),
            Err(e) => {
                st.unreadable += 1;
                pb.suspend(|| {
                    st.problem(format!("cannot read {}: {e} (skipped)", inp.path.display()))
                });
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
        machine: super::bench::machine(),
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

fn recommend(all: &GroupReport, groups: &[GroupReport], bytes_data: u64) -> Recommendation {
    let not_worth: Vec<NotWorth> = groups
        .iter()
        .filter(|g| !g.worth_compressing)
        .map(|g| NotWorth {
            kind: g.kind.clone(),
            share: g.share,
            best_ratio: g.best_ratio,
            heuristic_skip_fraction: g.heuristic_skip_fraction[&(PIECE as usize)],
        })
        .collect();
    match &all.choice {
        Some(c) => {
            let summary = format!(
                "{} mode {} max_blob {}: expected saving {:.1}% (ratio {:.2}), {:.2} CPU s/GiB to compress and {:.2} to decompress on one core",
                c.algorithm,
                c.mode,
                human(c.max_blob_size as u64),
                100.0 * c.saving,
                c.ratio,
                c.cpu_seconds_per_gib.compress,
                c.cpu_seconds_per_gib.decompress
            );
            Recommendation {
                algorithm: c.algorithm.clone(),
                codec: c.codec.clone(),
                level: c.level,
                mode: c.mode.clone(),
                max_blob_size: c.max_blob_size,
                ratio: c.ratio,
                saving: c.saving,
                compress_mbps: c.compress_mbps,
                decompress_mbps: c.decompress_mbps,
                cpu_seconds_per_gib: c.cpu_seconds_per_gib,
                expected_bytes_saved: (bytes_data as f64 * c.saving) as u64,
                not_worth_compressing: not_worth,
                summary,
            }
        }
        None => Recommendation {
            algorithm: Algorithm::new(CodecId::None, 0).to_string(),
            codec: "none".into(),
            level: 0,
            mode: "none".into(),
            max_blob_size: PIECE as usize,
            ratio: 1.0,
            saving: 0.0,
            compress_mbps: None,
            decompress_mbps: None,
            cpu_seconds_per_gib: CpuPerGib::default(),
            expected_bytes_saved: 0,
            not_worth_compressing: not_worth,
            summary: format!(
                "store raw (mode none): the best codec reaches only ratio {:.3} on this data",
                all.best_ratio
            ),
        },
    }
}

fn mbps(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |m| format!("{m:.0}"))
}

fn print_text(r: &Report) {
    let w = &r.walk;
    outln!(
        "scanned {} of {} data ({} logical) in {} files and {} block devices{}",
        human(r.bytes_scanned),
        human(r.bytes_data),
        human(r.bytes_logical),
        w.files,
        w.block_devices,
        if r.sampled {
            format!(", sampled in {} KiB pieces", r.piece_size >> 10)
        } else {
            ", read in full".into()
        }
    );
    if w.unreadable + w.special_skipped + w.symlinks_skipped > 0 {
        outln!(
            "skipped: {} unreadable, {} special files, {} symlinks (not followed)",
            w.unreadable,
            w.special_skipped,
            w.symlinks_skipped
        );
    }
    outln!("machine: {}", r.machine);
    outln!();
    outln!(
        "{:<11} {:>6} {:>11} {:>10}  advice",
        "type",
        "share",
        "scanned",
        "best ratio"
    );
    for g in &r.groups {
        outln!(
            "{:<11} {:>5.1}% {:>11} {:>10.3}  {}",
            g.kind,
            100.0 * g.share,
            human(g.bytes_scanned),
            g.best_ratio,
            g.advice
        );
    }
    outln!();
    outln!("all data, single core:");
    outln!(
        "{:<10} {:>5} {:>7} {:>7} {:>10} {:>12} {:>16}",
        "codec",
        "blob",
        "ratio",
        "saving",
        "comp MB/s",
        "decomp MB/s",
        "CPU s/GiB c / d"
    );
    for c in &r.all.codecs {
        outln!(
            "{:<10} {:>5} {:>7.3} {:>6.1}% {:>10} {:>12} {:>8.2} / {:<6.2}",
            c.algorithm,
            format!("{}K", c.blob_size >> 10),
            c.ratio,
            100.0 * c.saving,
            mbps(c.compress_mbps),
            mbps(c.decompress_mbps),
            c.cpu_seconds_per_gib.compress,
            c.cpu_seconds_per_gib.decompress
        );
    }
    outln!();
    outln!("recommendation: {}", r.recommendation.summary);
    for n in &r.recommendation.not_worth_compressing {
        outln!(
            "not worth compressing: {} ({:.1}% of the data, best ratio {:.3}): store raw; mode aggressive's heuristic will skip it ({:.0}% of its 128 KiB blobs flagged)",
            n.kind,
            100.0 * n.share,
            n.best_ratio,
            100.0 * n.heuristic_skip_fraction
        );
    }
}

/// Ratio against single-core compress speed for all data, one line per
/// codec through its blob sizes.
fn chart(all: &GroupReport) -> String {
    let mut series: Vec<svg::Series> = Vec::new();
    for c in &all.codecs {
        let point = (
            c.compress_mbps.unwrap_or(0.0),
            c.ratio,
            format!("{}K", c.blob_size >> 10),
        );
        match series.last_mut() {
            Some((name, pts)) if *name == c.algorithm => pts.push(point),
            _ => series.push((c.algorithm.clone(), vec![point])),
        }
    }
    svg::scatter(
        "squeeze scan: ratio against single-core compress speed (blob 4K..128K)",
        "compress MB/s per core (log scale)",
        "compression ratio",
        &series,
    )
}
