//! What `squeeze scan` reports: each type's rows, advice and choice, the
//! sum over all data, the recommendation; as JSON, as text, and as an SVG
//! chart.

use super::choose::{choose, row, Choice, CodecRow, CpuPerGib, Why};
use super::dedup::DedupReport;
use super::detect::DataType;
use super::measure::{self, Cell, Group, BLOB_SIZES};
use super::walk::WalkStats;
use super::PIECE;
use crate::svg;
use crate::util::human;
use serde::Serialize;
use squeeze_codec::{Algorithm, CodecId};
use std::collections::BTreeMap;

#[derive(Serialize)]
pub(super) struct GroupReport {
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
pub(super) struct NotWorth {
    #[serde(rename = "type")]
    kind: String,
    share: f64,
    best_ratio: f64,
    heuristic_skip_fraction: f64,
}

#[derive(Serialize)]
pub(super) struct Recommendation {
    algorithm: String,
    /// The `all.codecs` row recommended (its `algorithm` label); for mode
    /// none, `none`.
    row: String,
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
    /// How the rule chose it; null when the data is not worth compressing.
    why: Option<Why>,
}

#[derive(Serialize)]
pub(super) struct Report {
    pub(super) tool: &'static str,
    pub(super) machine: String,
    pub(super) paths: Vec<String>,
    pub(super) sampled: bool,
    pub(super) sample_bytes_target: Option<u64>,
    pub(super) piece_size: u64,
    pub(super) bytes_logical: u64,
    pub(super) bytes_data: u64,
    pub(super) bytes_scanned: u64,
    #[serde(flatten)]
    pub(super) walk: WalkStats,
    pub(super) recommendation: Recommendation,
    pub(super) all: GroupReport,
    pub(super) groups: Vec<GroupReport>,
    /// `--dedup`'s estimate; absent without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) dedup: Option<DedupReport>,
}

pub(super) fn group_report(
    kind: &str,
    g: &Group,
    algs: &[measure::Config],
    total: u64,
) -> GroupReport {
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
            c.row,
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
pub(super) fn sum_groups(groups: &BTreeMap<DataType, Group>, n_algs: usize) -> Group {
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

pub(super) fn recommend(
    all: &GroupReport,
    groups: &[GroupReport],
    bytes_data: u64,
) -> Recommendation {
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
                c.row,
                c.mode,
                human(c.max_blob_size as u64),
                100.0 * c.saving,
                c.ratio,
                c.cpu_seconds_per_gib.compress,
                c.cpu_seconds_per_gib.decompress
            );
            Recommendation {
                algorithm: c.algorithm.clone(),
                row: c.row.clone(),
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
                why: Some(c.why.clone()),
            }
        }
        None => Recommendation {
            algorithm: Algorithm::new(CodecId::None, 0).to_string(),
            row: Algorithm::new(CodecId::None, 0).to_string(),
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
            why: None,
        },
    }
}

fn mbps(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |m| format!("{m:.0}"))
}

pub(super) fn print_text(r: &Report) {
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
    if let Some(why) = &r.recommendation.why {
        outln!("why: {}", why.text);
    }
    for n in &r.recommendation.not_worth_compressing {
        outln!(
            "not worth compressing: {} ({:.1}% of the data, best ratio {:.3}): store raw; mode aggressive's heuristic will skip it ({:.0}% of its 128 KiB blobs flagged)",
            n.kind,
            100.0 * n.share,
            n.best_ratio,
            100.0 * n.heuristic_skip_fraction
        );
    }
    if let Some(d) = &r.dedup {
        outln!();
        outln!("{}", dedup_text(d));
    }
}

/// `--dedup`'s line: the duplicate share, what it saves, and how it was
/// counted.
fn dedup_text(d: &DedupReport) -> String {
    let nonzero = d.blocks - d.zero_blocks;
    let how = if d.sample_rate >= 1.0 {
        "every fingerprint counted".to_string()
    } else {
        format!(
            "estimated from 1 in {:.0} fingerprints ({} blocks)",
            1.0 / d.sample_rate,
            d.sampled_blocks
        )
    };
    format!(
        "dedup at 4 KiB: {:.1}% of the {} non-zero blocks repeat another: about {} saved before compression \
         ({} all-zero blocks are holes either way; {how}; index {})",
        100.0 * d.duplicate_fraction,
        nonzero,
        human(d.bytes_saved_estimate),
        d.zero_blocks,
        human(d.index_bytes)
    )
}

/// Ratio against single-core compress speed for all data, one line per
/// codec through its blob sizes.
pub(super) fn chart(all: &GroupReport) -> String {
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
