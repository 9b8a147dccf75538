//! What the model takes in: CPU SKUs (`--sku`), capacities (`--capacity`),
//! and the measured ratio and CPU seconds per GiB, read from `squeeze scan
//! --json` or `squeeze bench --json` output.

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

/// A CPU SKU (per socket).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sku {
    pub name: String,
    pub cores: u32,
    pub cost: f64,
    pub watts: f64,
}

/// Seed 000's two Ice Lake SKUs: core counts and TDP from Intel's
/// specifications; prices are illustrative round figures (the seed does
/// not give its prices).
pub fn default_skus() -> Vec<Sku> {
    vec![
        Sku {
            name: "xeon-gold-6338".into(),
            cores: 32,
            cost: 2700.0,
            watts: 205.0,
        },
        Sku {
            name: "xeon-gold-5318n".into(),
            cores: 24,
            cost: 1400.0,
            watts: 150.0,
        },
    ]
}

pub(super) fn parse_sku(s: &str) -> Result<Sku, String> {
    let p: Vec<&str> = s.split(':').collect();
    if p.len() != 4 {
        return Err(format!("{s:?}: want NAME:CORES:COST:WATTS"));
    }
    let num = |v: &str, what: &str| -> Result<f64, String> {
        match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
            _ => Err(format!("{s:?}: bad {what} {v:?}")),
        }
    };
    let cores = num(p[1], "cores")?;
    if cores < 1.0 || cores.fract() != 0.0 {
        return Err(format!("{s:?}: cores must be a whole number >= 1"));
    }
    Ok(Sku {
        name: p[0].to_string(),
        cores: cores as u32,
        cost: num(p[2], "cost")?,
        watts: num(p[3], "watts")?,
    })
}

/// "1P" -> 1000, "500T" -> 500, "1000" -> 1000 (decimal TB).
pub fn parse_tb(s: &str) -> Result<f64, String> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.strip_suffix('B').unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('T') => (&t[..t.len() - 1], 1.0),
        Some('P') => (&t[..t.len() - 1], 1e3),
        Some('E') => (&t[..t.len() - 1], 1e6),
        Some('G') => (&t[..t.len() - 1], 1e-3),
        _ => (t, 1.0),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v * mult),
        _ => Err(format!("not a capacity: {s:?} (use e.g. 1P, 500T or 1000)")),
    }
}

/// The measured figures the model needs.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Measured {
    pub ratio: f64,
    pub cpu_s_per_gib_compress: f64,
    pub cpu_s_per_gib_decompress: f64,
}

fn field<'a>(v: &'a Value, path: &str, file: &str, kind: &str) -> Result<&'a Value> {
    let mut cur = v;
    for part in path.split('.') {
        cur = cur
            .get(part)
            .ok_or_else(|| anyhow!("{file}: {kind} JSON has no field `{path}`"))?;
    }
    Ok(cur)
}

fn number(v: &Value, path: &str, file: &str, kind: &str) -> Result<f64> {
    field(v, path, file, kind)?
        .as_f64()
        .ok_or_else(|| anyhow!("{file}: {kind} JSON field `{path}` is not a number"))
}

/// Reads the figures from `squeeze scan --json` (recommendation, or the
/// row for `alg` at `blob`) or `squeeze bench --json` output.
pub fn measured_from_json(
    text: &str,
    file: &str,
    alg: Option<&str>,
    blob: u64,
) -> Result<(Measured, String)> {
    let v: Value = serde_json::from_str(text).with_context(|| format!("{file}: not valid JSON"))?;
    let is_scan = v.get("tool").and_then(Value::as_str) == Some("squeeze scan")
        || v.get("recommendation").is_some();
    let is_bench = v.get("write_mbps").is_some() || v.get("cpu_seconds_per_gib_write").is_some();
    if is_scan {
        let kind = "squeeze scan";
        if let Some(alg) = alg {
            let want = squeeze_codec::Algorithm::parse(alg)?.to_string();
            let rows = field(&v, "all.codecs", file, kind)?
                .as_array()
                .ok_or_else(|| anyhow!("{file}: `all.codecs` is not a list"))?;
            let row = rows
                .iter()
                .find(|r| {
                    r.get("algorithm").and_then(Value::as_str) == Some(want.as_str())
                        && r.get("blob_size").and_then(Value::as_u64) == Some(blob)
                })
                .ok_or_else(|| {
                    anyhow!("{file}: no `all.codecs` row for {want} at blob size {blob}")
                })?;
            let m = Measured {
                ratio: number(row, "ratio", file, kind)?,
                cpu_s_per_gib_compress: number(row, "cpu_seconds_per_gib.compress", file, kind)?,
                cpu_s_per_gib_decompress: number(
                    row,
                    "cpu_seconds_per_gib.decompress",
                    file,
                    kind,
                )?,
            };
            return Ok((m, format!("squeeze scan {file}, {want} at {blob} B blobs")));
        }
        let m = Measured {
            ratio: number(&v, "recommendation.ratio", file, kind)?,
            cpu_s_per_gib_compress: number(
                &v,
                "recommendation.cpu_seconds_per_gib.compress",
                file,
                kind,
            )?,
            cpu_s_per_gib_decompress: number(
                &v,
                "recommendation.cpu_seconds_per_gib.decompress",
                file,
                kind,
            )?,
        };
        let alg = v
            .pointer("/recommendation/algorithm")
            .and_then(Value::as_str)
            .unwrap_or("?");
        Ok((m, format!("squeeze scan {file}, recommended {alg}")))
    } else if is_bench {
        let kind = "squeeze bench";
        if alg.is_some() {
            bail!("--scan-algorithm needs a squeeze scan JSON; {file} is squeeze bench output");
        }
        let m = Measured {
            ratio: number(&v, "ratio", file, kind)?,
            cpu_s_per_gib_compress: number(&v, "cpu_seconds_per_gib_write", file, kind)?,
            cpu_s_per_gib_decompress: number(&v, "cpu_seconds_per_gib_read", file, kind)?,
        };
        let alg = v.get("algorithm").and_then(Value::as_str).unwrap_or("?");
        Ok((m, format!("squeeze bench {file}, {alg}")))
    } else {
        bail!(
            "{file}: neither squeeze scan JSON (no field `recommendation`) nor squeeze bench JSON (no field `cpu_seconds_per_gib_write`)"
        )
    }
}
