//! The recommendation of `squeeze scan` ([`choose`]; the same rule gives
//! each type's advice, from that type's rows) weighs every measured row, whatever engine ran
//! it, by one rule over (compress speed per core, saving):
//!
//! - candidates: the rows a volume of this build runs as measured: every
//!   codec's, ISA-L's deflate rows included. Where the rows hold an
//!   algorithm on ISA-L too (`deflate:1 (isa-l)`), a volume runs it on
//!   ISA-L, so the library's row of that algorithm is shown for comparison
//!   only (listed in `why.superseded`);
//! - fast enough for inline use: a compress speed at least
//!   [`INLINE_SPEED_FRACTION`] of the fastest candidate's in the same run
//!   (a row without a measured speed counts as 0). The threshold is
//!   relative, not an absolute MB/s, so the verdict does not move with the
//!   host's speed, its load or the build profile;
//! - of those, the best saving wins; a saving within [`SAVING_TIE`] (one
//!   percentage point) of the best ties;
//! - never a dominated row: one that another candidate beats on both axes
//!   (at least as fast and saves at least as much, better on one);
//! - among the tied undominated rows the smallest blob wins (less read
//!   amplification), then the faster, then the larger saving.
//!
//! The JSON's `recommendation.why` (and each group's `choice.why`) gives
//! the fastest row, the threshold in MB/s, the best inline saving, the tied
//! rows in the order the tie-break ranks them and a sentence; the text
//! output prints the sentence after the recommendation.
//!

use super::measure::{self, Cell};
use serde::Serialize;

/// Below this best ratio a type is not worth compressing.
pub(super) const WORTH_RATIO: f64 = 1.1;
/// Single-core compress speed a row needs to be recommended for inline
/// use, as a fraction of the fastest candidate row's in the same run
/// (slower rows are listed, not recommended). A quarter: on the W3 tar in
/// docs/benchmarks.md lz4 runs 733 MB/s, deflate:1 244 and deflate:6 109.
pub(super) const INLINE_SPEED_FRACTION: f64 = 0.25;
/// Savings within this much (absolute: one percentage point) of the best
/// inline saving tie; the tie goes to the smaller blob, then the faster.
pub(super) const SAVING_TIE: f64 = 0.01;
/// The label suffix of the rows measured on ISA-L ([`measure::Config`]).
const ISAL_SUFFIX: &str = " (isa-l)";

#[derive(Serialize, Clone, Copy, Debug, Default)]
pub(super) struct CpuPerGib {
    pub(super) compress: f64,
    pub(super) decompress: f64,
}

#[derive(Serialize, Clone, Debug)]
pub(super) struct CodecRow {
    pub(super) algorithm: String,
    pub(super) codec: String,
    pub(super) level: i32,
    pub(super) blob_size: usize,
    pub(super) raw_bytes: u64,
    pub(super) stored_bytes: u64,
    pub(super) blobs: u64,
    pub(super) blobs_compressed: u64,
    pub(super) ratio: f64,
    pub(super) saving: f64,
    pub(super) compress_mbps: Option<f64>,
    pub(super) decompress_mbps: Option<f64>,
    pub(super) cpu_seconds_per_gib: CpuPerGib,
}

#[derive(Serialize, Clone, Debug)]
pub(super) struct Choice {
    /// The algorithm to configure (`--algorithm`), e.g. `deflate:3`.
    pub(super) algorithm: String,
    /// The chosen row's label in `codecs`, e.g. `deflate:3 (isa-l)`.
    pub(super) row: String,
    pub(super) codec: String,
    pub(super) level: i32,
    pub(super) mode: String,
    pub(super) max_blob_size: usize,
    pub(super) ratio: f64,
    pub(super) saving: f64,
    pub(super) compress_mbps: Option<f64>,
    pub(super) decompress_mbps: Option<f64>,
    pub(super) cpu_seconds_per_gib: CpuPerGib,
    pub(super) why: Why,
}

/// Why [`choose`] picked its row: the figures of the rule, from the rows.
#[derive(Serialize, Clone, Debug)]
pub(super) struct Why {
    /// The fastest candidate row ("label blob", e.g. "lz4 64K").
    pub(super) fastest: String,
    pub(super) fastest_compress_mbps: f64,
    /// [`INLINE_SPEED_FRACTION`].
    pub(super) inline_speed_fraction: f64,
    /// `inline_speed_fraction * fastest_compress_mbps`.
    pub(super) inline_min_compress_mbps: f64,
    /// Candidate rows at least that fast.
    pub(super) inline_rows: usize,
    /// The best saving among them.
    pub(super) best_inline_saving: f64,
    /// [`SAVING_TIE`].
    pub(super) saving_tie: f64,
    /// The undominated inline rows within `saving_tie` of the best, in
    /// tie-break order (smallest blob, then fastest): the first is chosen.
    pub(super) tied: Vec<String>,
    /// Library rows that are not candidates: the rows measure their
    /// algorithm on ISA-L too, which is what a volume runs.
    pub(super) superseded: Vec<String>,
    pub(super) text: String,
}

fn ratio(c: &Cell) -> f64 {
    if c.stored == 0 {
        1.0
    } else {
        c.raw as f64 / c.stored as f64
    }
}

pub(super) fn row(cfg: measure::Config, blob_size: usize, c: &Cell) -> CodecRow {
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

/// The row's label and blob size, as `why` names rows ("zstd:3 64K").
fn row_name(r: &CodecRow) -> String {
    format!("{} {}K", r.algorithm, r.blob_size >> 10)
}

/// The row's compress speed for the rule (none measured: 0).
fn speed(r: &CodecRow) -> f64 {
    r.compress_mbps.unwrap_or(0.0)
}

/// True when `o` beats `r` on both axes: at least as fast and saving at
/// least as much, strictly better on one.
fn dominates(o: &CodecRow, r: &CodecRow) -> bool {
    speed(o) >= speed(r) && o.saving >= r.saving && (speed(o) > speed(r) || o.saving > r.saving)
}

/// The policy for a set of rows, by the rule of the module comment: of
/// the candidate rows (all but library rows of an algorithm also measured
/// on ISA-L) at least [`INLINE_SPEED_FRACTION`] as fast as the fastest
/// candidate, the best saving; savings within [`SAVING_TIE`] of it tie;
/// no row dominated by another candidate; the smallest blob, then the
/// fastest, then the larger saving wins the tie. `None` when the best
/// ratio is below [`WORTH_RATIO`].
pub(super) fn choose(rows: &[CodecRow]) -> Option<Choice> {
    let best_ratio = rows.iter().map(|r| r.ratio).fold(0.0, f64::max);
    if best_ratio < WORTH_RATIO {
        return None;
    }
    let on_isal: Vec<&str> = rows
        .iter()
        .filter_map(|r| r.algorithm.strip_suffix(ISAL_SUFFIX))
        .collect();
    let (candidates, superseded): (Vec<&CodecRow>, Vec<&CodecRow>) = rows
        .iter()
        .partition(|r| !on_isal.contains(&r.algorithm.as_str()));
    let fastest = *candidates
        .iter()
        .max_by(|a, b| speed(a).total_cmp(&speed(b)))?;
    let min_speed = INLINE_SPEED_FRACTION * speed(fastest);
    let inline: Vec<&CodecRow> = candidates
        .iter()
        .copied()
        .filter(|r| speed(r) >= min_speed)
        .collect();
    let best = inline.iter().map(|r| r.saving).fold(f64::MIN, f64::max);
    let mut tied: Vec<&CodecRow> = inline
        .iter()
        .copied()
        .filter(|r| r.saving >= best - SAVING_TIE)
        .filter(|r| !candidates.iter().any(|o| dominates(o, r)))
        .collect();
    tied.sort_by(|a, b| {
        a.blob_size
            .cmp(&b.blob_size)
            .then(speed(b).total_cmp(&speed(a)))
            .then(b.saving.total_cmp(&a.saving))
    });
    // Never empty: the fastest of the inline rows saving `best` is tied
    // and undominated.
    let pick = *tied.first()?;
    let mut superseded: Vec<String> = superseded.iter().map(|r| r.algorithm.clone()).collect();
    superseded.dedup();
    let mut text = format!(
        "{} saves {:.1}%, within {:.1} percentage points of the best ({:.1}%) among the {} of \
         {} candidate rows compressing at least {:.0}% as fast as the fastest ({}, {:.0} MB/s \
         per core: {:.0} MB/s and up); no row is at least as fast and saves at least as much; \
         a tie goes to the smallest blob, then the fastest",
        row_name(pick),
        100.0 * pick.saving,
        100.0 * SAVING_TIE,
        100.0 * best,
        inline.len(),
        candidates.len(),
        100.0 * INLINE_SPEED_FRACTION,
        row_name(fastest),
        speed(fastest),
        min_speed,
    );
    if tied.len() > 1 {
        let others: Vec<String> = tied[1..].iter().map(|r| row_name(r)).collect();
        text += &format!(" (tied: {})", others.join(", "));
    }
    if !superseded.is_empty() {
        text += &format!(
            "; not candidates: the library rows of {} (a volume runs {} on ISA-L)",
            superseded.join(", "),
            if superseded.len() == 1 { "it" } else { "them" }
        );
    }
    let why = Why {
        fastest: row_name(fastest),
        fastest_compress_mbps: speed(fastest),
        inline_speed_fraction: INLINE_SPEED_FRACTION,
        inline_min_compress_mbps: min_speed,
        inline_rows: inline.len(),
        best_inline_saving: best,
        saving_tie: SAVING_TIE,
        tied: tied.iter().map(|r| row_name(r)).collect(),
        superseded,
        text,
    };
    let algorithm = pick
        .algorithm
        .strip_suffix(ISAL_SUFFIX)
        .unwrap_or(&pick.algorithm)
        .to_string();
    Some(Choice {
        algorithm,
        row: pick.algorithm.clone(),
        codec: pick.codec.clone(),
        level: pick.level,
        mode: "aggressive".into(),
        max_blob_size: pick.blob_size,
        ratio: pick.ratio,
        saving: pick.saving,
        compress_mbps: pick.compress_mbps,
        decompress_mbps: pick.decompress_mbps,
        cpu_seconds_per_gib: pick.cpu_seconds_per_gib,
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use squeeze_codec::Algorithm;

    /// A synthetic row: `label` as scan names it, blob size in KiB, saving
    /// and compress MB/s per core.
    fn synth(label: &str, blob_kib: usize, saving: f64, mbps: f64) -> CodecRow {
        let (name, _) = label.split_once(" (").unwrap_or((label, ""));
        let alg = Algorithm::parse(name).unwrap();
        let raw = 1u64 << 20;
        let stored = (raw as f64 * (1.0 - saving)) as u64;
        CodecRow {
            algorithm: label.to_string(),
            codec: alg.codec.name().to_string(),
            level: alg.effective_level(),
            blob_size: blob_kib << 10,
            raw_bytes: raw,
            stored_bytes: stored,
            blobs: 1,
            blobs_compressed: 1,
            ratio: raw as f64 / stored as f64,
            saving,
            compress_mbps: Some(mbps),
            decompress_mbps: Some(4.0 * mbps),
            cpu_seconds_per_gib: CpuPerGib {
                compress: 1024.0 / mbps,
                decompress: 256.0 / mbps,
            },
        }
    }

    fn picked(rows: &[CodecRow]) -> (String, usize) {
        let c = choose(rows).expect("a choice");
        (c.row, c.max_blob_size >> 10)
    }

    /// The issue's case (an Intel Xeon, debug build): snappy at 16 KiB
    /// (0.50, 245 MB/s) was recommended over ISA-L rows both faster and
    /// better. deflate:1 and deflate:3 on ISA-L tie within a point; same
    /// blob, so the faster wins.
    #[test]
    fn the_issue_case_does_not_pick_snappy() {
        let rows = [
            synth("snappy", 16, 0.50, 245.0),
            synth("deflate:3 (isa-l)", 128, 0.65, 254.0),
            synth("deflate:1 (isa-l)", 128, 0.645, 323.0),
        ];
        let c = choose(&rows).unwrap();
        assert_ne!(c.codec, "snappy");
        assert_eq!(
            (c.row.as_str(), c.max_blob_size),
            ("deflate:1 (isa-l)", 128 << 10)
        );
        // The algorithm to configure; a volume runs it on ISA-L.
        assert_eq!(c.algorithm, "deflate:1");
        assert_eq!(c.why.fastest, "deflate:1 (isa-l) 128K");
        assert!((c.why.inline_min_compress_mbps - 0.25 * 323.0).abs() < 1e-9);
        assert_eq!(
            c.why.tied,
            ["deflate:1 (isa-l) 128K", "deflate:3 (isa-l) 128K"]
        );
        assert!(c.why.superseded.is_empty());
    }

    /// A whole debug-build run of this project's test text (2 MiB, on a
    /// shared 2-core Xeon): (label, blob KiB, saving, compress MB/s).
    const DEBUG_RUN: [(&str, usize, f64, f64); 36] = [
        ("lz4", 4, 0.3706, 219.1),
        ("lz4", 16, 0.4066, 220.9),
        ("lz4", 64, 0.4226, 316.1),
        ("lz4", 128, 0.4894, 203.4),
        ("zstd:1", 4, 0.6094, 148.2),
        ("zstd:1", 16, 0.6459, 116.1),
        ("zstd:1", 64, 0.6590, 185.8),
        ("zstd:1", 128, 0.6634, 134.5),
        ("zstd:3", 4, 0.6178, 111.4),
        ("zstd:3", 16, 0.6510, 99.1),
        ("zstd:3", 64, 0.6753, 137.6),
        ("zstd:3", 128, 0.6816, 126.1),
        ("zstd:9", 4, 0.6344, 14.8),
        ("zstd:9", 16, 0.6751, 10.7),
        ("zstd:9", 64, 0.6916, 16.5),
        ("zstd:9", 128, 0.6962, 18.1),
        ("snappy", 4, 0.4510, 169.5),
        ("snappy", 16, 0.5005, 189.9),
        ("snappy", 64, 0.5253, 216.9),
        ("snappy", 128, 0.5253, 206.2),
        ("deflate:1", 4, 0.6288, 82.9),
        ("deflate:1", 16, 0.6495, 104.3),
        ("deflate:1", 64, 0.6583, 121.1),
        ("deflate:1", 128, 0.6607, 120.5),
        ("deflate:6", 4, 0.6342, 38.2),
        ("deflate:6", 16, 0.6711, 34.8),
        ("deflate:6", 64, 0.6904, 32.8),
        ("deflate:6", 128, 0.6944, 29.5),
        ("deflate:1 (isa-l)", 4, 0.6196, 145.2),
        ("deflate:1 (isa-l)", 16, 0.6373, 222.3),
        ("deflate:1 (isa-l)", 64, 0.6437, 251.2),
        ("deflate:1 (isa-l)", 128, 0.6454, 272.8),
        ("deflate:3 (isa-l)", 4, 0.6251, 143.3),
        ("deflate:3 (isa-l)", 16, 0.6450, 197.3),
        ("deflate:3 (isa-l)", 64, 0.6509, 236.7),
        ("deflate:3 (isa-l)", 128, 0.6523, 228.7),
    ];

    fn debug_run(scale: f64) -> Vec<CodecRow> {
        DEBUG_RUN
            .iter()
            .map(|&(l, b, s, m)| synth(l, b, s, scale * m))
            .collect()
    }

    /// The rule on a real run: threshold a quarter of lz4's 316 MB/s, so
    /// zstd:9 and deflate:6 are out; libdeflate's deflate:1 is not a
    /// candidate (a volume runs deflate:1 on ISA-L); zstd:3 64K and 128K
    /// tie within a point, neither dominated, and the smaller blob wins.
    #[test]
    fn a_debug_run_picks_the_best_inline_saving() {
        let c = choose(&debug_run(1.0)).unwrap();
        assert_eq!((c.row.as_str(), c.max_blob_size), ("zstd:3", 64 << 10));
        assert_eq!(c.why.fastest, "lz4 64K");
        assert_eq!(c.why.inline_rows, 24);
        assert_eq!(c.why.best_inline_saving, 0.6816);
        assert_eq!(c.why.tied, ["zstd:3 64K", "zstd:3 128K"]);
        assert_eq!(c.why.superseded, ["deflate:1"]);
        assert!(
            c.why.text.starts_with(
                "zstd:3 64K saves 67.5%, within 1.0 percentage points of the best (68.2%) \
                 among the 24 of 32 candidate rows compressing at least 25% as fast as the \
                 fastest (lz4 64K, 316 MB/s per core: 79 MB/s and up)"
            ),
            "{}",
            c.why.text
        );
        assert!(
            c.why.text.ends_with(
                "(tied: zstd:3 128K); not candidates: the library rows of deflate:1 \
                 (a volume runs it on ISA-L)"
            ),
            "{}",
            c.why.text
        );
    }

    /// Every speed 10x lower or 10x higher (a slower host, a release
    /// build): the same choice and the same reasons.
    #[test]
    fn the_choice_does_not_move_with_the_hosts_speed() {
        let base = choose(&debug_run(1.0)).unwrap();
        for scale in [0.01, 0.1, 3.0, 10.0] {
            let c = choose(&debug_run(scale)).unwrap();
            assert_eq!((&c.row, c.max_blob_size), (&base.row, base.max_blob_size));
            assert_eq!(c.why.tied, base.why.tied);
            assert_eq!(c.why.inline_rows, base.why.inline_rows);
        }
    }

    /// No candidate row is at least as fast and saves at least as much as
    /// the choice, whatever the rows: random tables of every shape.
    #[test]
    fn the_choice_is_never_dominated() {
        let labels = ["lz4", "zstd:1", "zstd:3", "snappy", "deflate:1 (isa-l)"];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..2000 {
            let mut rows = Vec::new();
            for l in labels {
                for b in [4, 16, 64, 128] {
                    if next() < 0.8 {
                        rows.push(synth(l, b, 0.1 + 0.8 * next(), 1.0 + 999.0 * next()));
                    }
                }
            }
            let Some(c) = choose(&rows) else { continue };
            let pick = rows
                .iter()
                .find(|r| r.algorithm == c.row && r.blob_size == c.max_blob_size)
                .unwrap();
            assert!(!rows.iter().any(|o| dominates(o, pick)), "{:#?}", c.why);
            let fastest = rows.iter().map(speed).fold(0.0, f64::max);
            assert!(speed(pick) >= INLINE_SPEED_FRACTION * fastest);
            let best = rows
                .iter()
                .filter(|r| speed(r) >= INLINE_SPEED_FRACTION * fastest)
                .map(|r| r.saving)
                .fold(0.0, f64::max);
            assert!(pick.saving >= best - SAVING_TIE);
        }
    }

    /// A tie goes to the smaller blob only when no row dominates it.
    #[test]
    fn a_tie_goes_to_the_smaller_undominated_blob() {
        // 64K saves a little less and is faster: undominated, it wins.
        let rows = [
            synth("lz4", 64, 0.40, 800.0),
            synth("zstd:3", 64, 0.625, 400.0),
            synth("zstd:3", 128, 0.63, 380.0),
        ];
        assert_eq!(picked(&rows), ("zstd:3".into(), 64));
        // 64K slower and worse than 128K: dominated, 128K wins.
        let rows = [
            synth("lz4", 64, 0.40, 800.0),
            synth("zstd:3", 64, 0.625, 370.0),
            synth("zstd:3", 128, 0.63, 380.0),
        ];
        assert_eq!(picked(&rows), ("zstd:3".into(), 128));
        // Outside the tie, the best saving wins whatever its blob.
        let rows = [
            synth("lz4", 64, 0.40, 800.0),
            synth("zstd:3", 4, 0.60, 300.0),
            synth("zstd:3", 128, 0.63, 290.0),
        ];
        assert_eq!(picked(&rows), ("zstd:3".into(), 128));
    }

    /// Below a quarter of the fastest row, a codec is listed, not chosen;
    /// a library row whose algorithm also has ISA-L rows is no candidate.
    #[test]
    fn slow_rows_and_superseded_library_rows_are_not_chosen() {
        let rows = [
            synth("lz4", 64, 0.40, 800.0),
            synth("zstd:9", 64, 0.70, 199.0),
            synth("zstd:3", 64, 0.60, 200.0),
        ];
        assert_eq!(picked(&rows), ("zstd:3".into(), 64));
        let rows = [
            synth("lz4", 64, 0.40, 800.0),
            synth("deflate:1", 64, 0.66, 500.0),
            synth("deflate:1 (isa-l)", 64, 0.64, 450.0),
        ];
        let c = choose(&rows).unwrap();
        assert_eq!(
            (c.row.as_str(), c.algorithm.as_str()),
            ("deflate:1 (isa-l)", "deflate:1")
        );
        assert_eq!(c.why.superseded, ["deflate:1"]);
        // Without ISA-L's rows, libdeflate's is what a volume runs.
        assert_eq!(picked(&rows[..2]), ("deflate:1".into(), 64));
    }

    #[test]
    fn data_not_worth_compressing_gets_no_choice() {
        let rows = [
            synth("lz4", 64, 0.05, 800.0),
            synth("zstd:3", 64, 0.08, 400.0),
        ];
        assert!(choose(&rows).is_none());
    }
}
