//! The compression policy options (Ceph BlueStore's vocabulary) that
//! `create`, `set`, `import`, `bench` and `serve` take, and that a `set`
//! sends over the control socket; and a policy as `info` and the control
//! socket show it.

use crate::util::parse_size;
use anyhow::Result;
use squeeze_engine::{Algorithm, CodecId, CompressionMode, Policy};

/// Compression policy options (BlueStore's compression_* pool settings).
#[derive(clap::Args, Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyArgs {
    /// compression_algorithm: lz4, zstd, snappy, deflate or none, with an
    /// optional level (zstd:3, deflate:6).
    #[arg(long, value_name = "ALG[:LEVEL]")]
    pub algorithm: Option<String>,
    /// compression_mode: none, passive, aggressive or force. Over NBD the
    /// incompressibility heuristic supplies the hint passive and aggressive
    /// act on.
    #[arg(long)]
    pub mode: Option<String>,
    /// compression_required_ratio: keep a compressed blob only if it
    /// occupies at most this fraction of its raw size (0.000001 to 1,
    /// stored in millionths).
    #[arg(long, value_name = "RATIO", value_parser = parse_required_ratio)]
    pub required_ratio: Option<f64>,
    /// compression_min_blob_size: smaller blobs are stored raw.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub min_blob: Option<u64>,
    /// compression_max_blob_size: writes are cut into blobs of at most this.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_blob: Option<u64>,
    /// Cold data's algorithm (none = off). The algorithm's codec at another
    /// level (zstd:9 over zstd:3): the idle squeeze rewrites what clients
    /// wrote with it while they are idle, in chunks as written (frames of
    /// zstd:9 decode as fast as zstd:3's). Another codec: the cleaner
    /// recompresses the extents it moves with it.
    #[arg(long, value_name = "ALG[:LEVEL]")]
    pub recompress: Option<String>,
    /// Blobs larger than this are stored as independent chunks of this
    /// size, so a small read checks and decodes one chunk instead of the
    /// whole blob: a power of two from 4K to 64K, or 0 for one frame per
    /// blob (the best ratio, and 4 KiB reads that decode the whole blob).
    /// New volumes: 32K.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub read_chunk: Option<u64>,
}

impl PolicyArgs {
    /// Whether any option is given (a `set` with none changes no policy).
    pub fn given(&self) -> bool {
        self.algorithm.is_some()
            || self.mode.is_some()
            || self.required_ratio.is_some()
            || self.min_blob.is_some()
            || self.max_blob.is_some()
            || self.recompress.is_some()
            || self.read_chunk.is_some()
    }

    pub fn apply(&self, mut p: Policy) -> Result<Policy> {
        if let Some(a) = &self.algorithm {
            let alg = Algorithm::parse(a)?;
            p.codec = alg.codec;
            p.level = alg.level;
        }
        if let Some(m) = &self.mode {
            p.mode = CompressionMode::from_name(m).ok_or_else(|| {
                anyhow::anyhow!("unknown mode {m:?}: use none, passive, aggressive or force")
            })?;
        }
        if let Some(r) = self.required_ratio {
            p.required_ratio_ppm =
                required_ratio_ppm(r).map_err(|e| anyhow::anyhow!("--required-ratio {r}: {e}"))?;
        }
        if let Some(b) = self.min_blob {
            p.min_blob = u32::try_from(b).map_err(|_| anyhow::anyhow!("--min-blob too large"))?;
        }
        if let Some(b) = self.max_blob {
            p.max_blob = u32::try_from(b).map_err(|_| anyhow::anyhow!("--max-blob too large"))?;
        }
        if let Some(a) = &self.recompress {
            let alg = Algorithm::parse(a)?;
            p.recompress_codec = alg.codec;
            p.recompress_level = alg.level;
        }
        if let Some(b) = self.read_chunk {
            p.read_chunk =
                u32::try_from(b).map_err(|_| anyhow::anyhow!("--read-chunk too large"))?;
        }
        p.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(p)
    }
}

/// `--required-ratio` on the command line: a number [`required_ratio_ppm`]
/// takes (NaN, infinities and values that round to 0 millionths are
/// refused here, before a control socket's JSON could turn them into null).
fn parse_required_ratio(s: &str) -> Result<f64, String> {
    let r: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("not a number; {RATIO_RANGE}"))?;
    required_ratio_ppm(r).map(|_| r)
}

const RATIO_RANGE: &str = "give a number from 0.000001 to 1 (a compressed blob is kept \
                           when it takes at most this fraction of its raw size)";

/// The required ratio as stored: millionths, at least 1 (a finite number
/// in (0, 1] that rounds to 0 millionths, such as 1e-300, is refused rather
/// than stored as 0).
fn required_ratio_ppm(r: f64) -> Result<u32, String> {
    let ppm = (r * 1e6).round();
    if r.is_finite() && r <= 1.0 && ppm >= 1.0 {
        Ok(ppm as u32)
    } else {
        Err(RATIO_RANGE.to_string())
    }
}

/// A policy as `info --json` and the control socket show it.
pub fn policy_json(p: &Policy) -> serde_json::Value {
    serde_json::json!({
        "algorithm": alg_name(p.codec, p.level),
        "mode": p.mode.name(),
        "required_ratio": f64::from(p.required_ratio_ppm) / 1e6,
        "min_blob_size": p.min_blob,
        "max_blob_size": p.max_blob,
        "recompress": alg_name(p.recompress_codec, p.recompress_level),
        "read_chunk": p.read_chunk,
    })
}

/// "lz4", "zstd:3" for a codec and level.
pub fn alg_name(codec: CodecId, level: i32) -> String {
    Algorithm::new(codec, level).to_string()
}

/// `--burst-floor`: the adaptive codec's lowest rung under busy cores.
pub fn parse_floor(s: &str) -> Result<squeeze_engine::pipeline::burst::BurstFloor, String> {
    squeeze_engine::pipeline::burst::BurstFloor::parse(s)
        .ok_or_else(|| format!("{s:?}: the burst floor is raw or lz4"))
}
