//! `squeeze tco`: a storage total-cost-of-ownership model in the spirit of
//! the SNIA TCO model used in seed 000 (cost per effective TB; CPU cores
//! saved -> a smaller CPU SKU -> lower TCO), fed with the ratio and CPU
//! seconds per GiB that `squeeze scan` or `squeeze bench` measured.
//!
//! Four scenarios over the same required effective capacity and write
//! throughput (formulas, inputs and sources: docs/TCO.md):
//! - `none`: no compression;
//! - `classic-cpu`: CPU compression in the classic stack (Ceph BlueStore),
//!   which loses a measured share of write throughput per server and keeps
//!   the CPU SKU it was measured on;
//! - `squeeze`: inline compression whose CPU cost is provisioned as cores
//!   from the measured CPU seconds per GiB;
//! - `offload`: a hardware offload with the user's cost, power, ratio and
//!   throughput loss (default: seed 001's QAT, built into the CPU package).
//!
//! Invariants: the model is pure arithmetic on the inputs (the same inputs
//! print the same numbers, which docs/TCO.md and tests/tco_*.rs check), and
//! every input is validated with an error naming the flag.
//!
//! `inputs` reads what the model takes in, `model` is the arithmetic; this
//! file holds the command line, its validation and the report.

mod inputs;
mod model;

use inputs::parse_sku;
pub use inputs::{default_skus, measured_from_json, parse_tb, Measured, Sku};
pub use model::{Model, Scenario};

use crate::svg;
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

/// Hours per year (365.25 days).
pub const HOURS_PER_YEAR: f64 = 8766.0;
const GIB_PER_GB: f64 = 1e9 / (1u64 << 30) as f64;

/// Model storage total cost of ownership with and without compression.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Read the measured ratio and CPU seconds per GiB from `squeeze scan
    /// --json` or `squeeze bench --json` output.
    #[arg(long, value_name = "FILE")]
    pub from_json: Option<PathBuf>,
    /// With a scan JSON: use this codec's figures instead of the
    /// recommendation (e.g. zstd:3), at --scan-blob.
    #[arg(long, value_name = "ALG[:LEVEL]")]
    pub scan_algorithm: Option<String>,
    /// With --scan-algorithm: the blob size row to use.
    #[arg(long, default_value = "128K", value_parser = crate::util::parse_size)]
    pub scan_blob: u64,
    /// Measured compression ratio (overrides the JSON).
    #[arg(long)]
    pub ratio: Option<f64>,
    /// Measured CPU seconds per GiB to compress[,to decompress] on one core
    /// (overrides the JSON).
    #[arg(long, value_name = "C[,D]")]
    pub cpu_s_per_gib: Option<String>,
    /// Effective (logical) capacity needed, decimal: 1P = 1000 TB.
    #[arg(long, default_value = "1P", value_parser = parse_tb)]
    pub capacity: f64,
    /// Client write throughput required, GB/s.
    #[arg(long, default_value_t = 100.0)]
    pub throughput: f64,
    /// Client read throughput required, GB/s (costs decompression cores).
    #[arg(long, default_value_t = 0.0)]
    pub read_throughput: f64,
    /// Drive cost, $ per raw TB.
    #[arg(long, default_value_t = 100.0)]
    pub drive_cost_per_tb: f64,
    /// Drive capacity, TB.
    #[arg(long, default_value_t = 3.84)]
    pub drive_tb: f64,
    /// Drive power, W.
    #[arg(long, default_value_t = 12.0)]
    pub drive_power: f64,
    /// Drives per server.
    #[arg(long, default_value_t = 12)]
    pub drives_per_server: u32,
    /// Server cost without CPUs and drives, $.
    #[arg(long, default_value_t = 10000.0)]
    pub server_cost: f64,
    /// Server power without CPUs and drives, W.
    #[arg(long, default_value_t = 250.0)]
    pub server_power: f64,
    /// CPU sockets per server.
    #[arg(long, default_value_t = 2)]
    pub sockets: u32,
    /// A CPU SKU per socket, NAME:CORES:COST:WATTS (repeatable). The first
    /// is the SKU the servers are bought with (and the classic stack keeps);
    /// other scenarios take the cheapest SKU with enough cores.
    #[arg(long = "cpu", value_name = "NAME:CORES:COST:WATTS", value_parser = parse_sku)]
    pub cpus: Vec<Sku>,
    /// Write throughput one server sustains when compression costs it no
    /// CPU, GB/s.
    #[arg(long, default_value_t = 8.3)]
    pub server_gbps: f64,
    /// Cores the storage stack itself uses per GB/s of client writes.
    #[arg(long, default_value_t = 5.13)]
    pub stack_cores_per_gbps: f64,
    /// Energy price, $ per kWh.
    #[arg(long, default_value_t = 0.15)]
    pub kwh_cost: f64,
    /// Power usage effectiveness (cooling and distribution overhead).
    #[arg(long, default_value_t = 1.5)]
    pub pue: f64,
    /// Years of operation.
    #[arg(long, default_value_t = 5.0)]
    pub years: f64,
    /// Replication factor (ignored with --ec).
    #[arg(long, default_value_t = 2.0)]
    pub replicas: f64,
    /// Erasure coding K+M instead of replication (e.g. 4+2).
    #[arg(long, value_name = "K+M")]
    pub ec: Option<String>,
    /// Fraction of raw capacity that may be filled.
    #[arg(long, default_value_t = 0.85)]
    pub usable: f64,
    /// Classic stack with CPU compression: share of write throughput lost.
    #[arg(long, default_value_t = 0.24)]
    pub cpu_throughput_loss: f64,
    /// Classic stack with CPU compression: its ratio (default: the measured).
    #[arg(long)]
    pub cpu_ratio: Option<f64>,
    /// Hardware offload: cost per server, $.
    #[arg(long, default_value_t = 0.0)]
    pub offload_cost: f64,
    /// Hardware offload: power per server, W.
    #[arg(long, default_value_t = 0.0)]
    pub offload_power: f64,
    /// Hardware offload: its ratio (default: the measured).
    #[arg(long)]
    pub offload_ratio: Option<f64>,
    /// Hardware offload: share of write throughput lost.
    #[arg(long, default_value_t = 0.0)]
    pub offload_throughput_loss: f64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG bar chart of the cost per effective TB.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<PathBuf>,
}

fn positive(v: f64, flag: &str) -> Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        bail!("{flag} must be a positive number, not {v}")
    }
}

fn non_negative(v: f64, flag: &str) -> Result<f64> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        bail!("{flag} must be a number >= 0, not {v}")
    }
}

fn loss(v: f64, flag: &str) -> Result<f64> {
    if v.is_finite() && (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        bail!("{flag} must be in [0, 1), not {v}")
    }
}

fn ratio_ok(v: f64, flag: &str) -> Result<f64> {
    if v.is_finite() && v >= 1.0 {
        Ok(v)
    } else {
        bail!("{flag} must be >= 1 (a compression ratio), not {v}")
    }
}

/// Validates the arguments and resolves the measured figures.
pub fn model(a: &Args) -> Result<(Model, String)> {
    let (mut measured, mut source) = match &a.from_json {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            let (m, s) = measured_from_json(
                &text,
                &p.display().to_string(),
                a.scan_algorithm.as_deref(),
                a.scan_blob,
            )?;
            (Some(m), s)
        }
        None => {
            if a.scan_algorithm.is_some() {
                bail!("--scan-algorithm needs --from-json with squeeze scan output");
            }
            (None, String::new())
        }
    };
    if let Some(r) = a.ratio {
        let m = measured.get_or_insert(Measured {
            ratio: 1.0,
            cpu_s_per_gib_compress: 0.0,
            cpu_s_per_gib_decompress: 0.0,
        });
        m.ratio = r;
        source = "command line".into();
    }
    if let Some(c) = &a.cpu_s_per_gib {
        let Some(m) = measured.as_mut() else {
            bail!("--cpu-s-per-gib needs --ratio (or --from-json)");
        };
        let (cs, ds) = match c.split_once(',') {
            Some((x, y)) => (x, Some(y)),
            None => (c.as_str(), None),
        };
        let parse = |s: &str| -> Result<f64> {
            s.trim()
                .parse::<f64>()
                .map_err(|_| anyhow!("--cpu-s-per-gib: not a number: {s:?}"))
        };
        m.cpu_s_per_gib_compress = parse(cs)?;
        if let Some(d) = ds {
            m.cpu_s_per_gib_decompress = parse(d)?;
        }
        source = if a.from_json.is_some() {
            format!("{source}, CPU cost from the command line")
        } else {
            "command line".into()
        };
    }
    let Some(measured) = measured else {
        bail!(
            "no measured figures: give --from-json FILE (squeeze scan --json or squeeze bench --json output), or --ratio R and --cpu-s-per-gib C[,D]"
        );
    };
    ratio_ok(measured.ratio, "the measured ratio (--ratio)")?;
    non_negative(
        measured.cpu_s_per_gib_compress,
        "--cpu-s-per-gib (compress)",
    )?;
    non_negative(
        measured.cpu_s_per_gib_decompress,
        "--cpu-s-per-gib (decompress)",
    )?;
    let (protection, protection_desc) = match &a.ec {
        Some(ec) => {
            let (k, m) = ec
                .split_once('+')
                .ok_or_else(|| anyhow!("--ec {ec:?}: want K+M, e.g. 4+2"))?;
            let k: u32 = k
                .trim()
                .parse()
                .map_err(|_| anyhow!("--ec {ec:?}: bad K"))?;
            let m: u32 = m
                .trim()
                .parse()
                .map_err(|_| anyhow!("--ec {ec:?}: bad M"))?;
            if k == 0 {
                bail!("--ec {ec:?}: K must be at least 1");
            }
            (
                f64::from(k + m) / f64::from(k),
                format!("erasure coding {k}+{m}"),
            )
        }
        None => {
            if !(a.replicas.is_finite() && a.replicas >= 1.0) {
                bail!("--replicas must be >= 1, not {}", a.replicas);
            }
            (a.replicas, format!("{}x replication", a.replicas))
        }
    };
    if !(a.usable > 0.0 && a.usable <= 1.0) {
        bail!("--usable must be in (0, 1], not {}", a.usable);
    }
    if a.drives_per_server == 0 || a.sockets == 0 {
        bail!("--drives-per-server and --sockets must be at least 1");
    }
    let model = Model {
        measured,
        capacity_tb: positive(a.capacity, "--capacity")?,
        throughput_gbps: positive(a.throughput, "--throughput")?,
        read_throughput_gbps: non_negative(a.read_throughput, "--read-throughput")?,
        drive_cost_per_tb: non_negative(a.drive_cost_per_tb, "--drive-cost-per-tb")?,
        drive_tb: positive(a.drive_tb, "--drive-tb")?,
        drive_power_w: non_negative(a.drive_power, "--drive-power")?,
        drives_per_server: a.drives_per_server,
        server_cost: non_negative(a.server_cost, "--server-cost")?,
        server_power_w: non_negative(a.server_power, "--server-power")?,
        sockets: a.sockets,
        cpus: if a.cpus.is_empty() {
            default_skus()
        } else {
            a.cpus.clone()
        },
        server_gbps: positive(a.server_gbps, "--server-gbps")?,
        stack_cores_per_gbps: non_negative(a.stack_cores_per_gbps, "--stack-cores-per-gbps")?,
        kwh_cost: non_negative(a.kwh_cost, "--kwh-cost")?,
        pue: ratio_ok(a.pue, "--pue")?,
        years: positive(a.years, "--years")?,
        protection,
        protection_desc,
        usable: a.usable,
        cpu_throughput_loss: loss(a.cpu_throughput_loss, "--cpu-throughput-loss")?,
        cpu_ratio: ratio_ok(a.cpu_ratio.unwrap_or(measured.ratio), "--cpu-ratio")?,
        offload_cost: non_negative(a.offload_cost, "--offload-cost")?,
        offload_power_w: non_negative(a.offload_power, "--offload-power")?,
        offload_ratio: ratio_ok(a.offload_ratio.unwrap_or(measured.ratio), "--offload-ratio")?,
        offload_throughput_loss: loss(a.offload_throughput_loss, "--offload-throughput-loss")?,
    };
    Ok((model, source))
}

#[derive(Serialize)]
struct Savings {
    vs_none: f64,
    vs_classic_cpu: f64,
    vs_offload: f64,
}

#[derive(Serialize)]
struct Report<'a> {
    tool: &'static str,
    source: String,
    model: &'a Model,
    scenarios: &'a [Scenario],
    /// 1 - TCO(squeeze) / TCO(other): positive means squeeze costs less.
    squeeze_saving: Savings,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (m, source) = model(&a)?;
    let sc = m.scenarios();
    let tco = |n: &str| sc.iter().find(|s| s.name == n).map_or(f64::NAN, |s| s.tco);
    let sq = tco("squeeze");
    let savings = Savings {
        vs_none: 1.0 - sq / tco("none"),
        vs_classic_cpu: 1.0 - sq / tco("classic-cpu"),
        vs_offload: 1.0 - sq / tco("offload"),
    };
    if let Some(path) = &a.chart {
        let part = |name: &str| svg::BarSeries {
            name: name.to_string(),
            color: None,
        };
        let per_tb = |v: f64| svg::Cell::value(v / m.capacity_tb);
        let chart = svg::BarChart {
            title: format!(
                "squeeze tco: $ per effective TB over {} years ({} TB effective, {} GB/s)",
                m.years, m.capacity_tb, m.throughput_gbps
            ),
            y_label: Some("$ per effective TB".to_string()),
            groups: sc.iter().map(|s| s.name.clone()).collect(),
            series: vec![
                part("servers"),
                part("drives"),
                part("energy"),
                part("total"),
            ],
            cells: sc
                .iter()
                .map(|s| {
                    vec![
                        per_tb(s.servers_capex),
                        per_tb(s.drives_capex),
                        per_tb(s.energy_cost),
                        per_tb(s.tco),
                    ]
                })
                .collect(),
            ..svg::BarChart::default()
        };
        std::fs::write(path, chart.draw()?)
            .with_context(|| format!("writing chart {}", path.display()))?;
    }
    if a.json {
        let r = Report {
            tool: "squeeze tco",
            source,
            model: &m,
            scenarios: &sc,
            squeeze_saving: savings,
        };
        outln!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "measured ({source}): ratio {:.3}, {:.3} CPU s/GiB compress, {:.3} decompress",
        m.measured.ratio,
        m.measured.cpu_s_per_gib_compress,
        m.measured.cpu_s_per_gib_decompress
    );
    outln!(
        "need {} TB effective, {} GB/s writes, {} GB/s reads; {}, {:.0}% fillable; {} years",
        m.capacity_tb,
        m.throughput_gbps,
        m.read_throughput_gbps,
        m.protection_desc,
        100.0 * m.usable,
        m.years
    );
    outln!();
    outln!(
        "{:<12} {:>6} {:>9} {:>7} {:>8} {:>11} {:<16} {:>13} {:>12} {:>10}",
        "scenario",
        "ratio",
        "raw TB",
        "drives",
        "servers",
        "cores need",
        "CPU (cores/srv)",
        "TCO $",
        "$/TB eff",
        "squeeze vs"
    );
    for s in &sc {
        let vs = if s.name == "squeeze" {
            "-".to_string()
        } else {
            let d = 100.0 * (sq / s.tco - 1.0);
            if d.abs() < 0.05 {
                "0.0%".to_string()
            } else {
                format!("{d:+.1}%")
            }
        };
        outln!(
            "{:<12} {:>6.3} {:>9.1} {:>7} {:>8} {:>11.1} {:<16} {:>13.0} {:>12.2} {:>10}",
            s.name,
            s.ratio,
            s.raw_tb,
            s.drives,
            s.servers,
            s.cores_needed,
            format!("{} ({})", s.cpu, s.cores_per_server),
            s.tco,
            s.cost_per_effective_tb,
            vs
        );
    }
    outln!();
    outln!(
        "squeeze saves {:.1}% against no compression, {:.1}% against CPU compression in the classic stack ({:.0}% write throughput lost), {:.1}% against the offload",
        100.0 * savings.vs_none,
        100.0 * savings.vs_classic_cpu,
        100.0 * m.cpu_throughput_loss,
        100.0 * savings.vs_offload
    );
    outln!("(\"squeeze vs\": squeeze's TCO relative to that row, negative = squeeze costs less; formulas and sources: docs/TCO.md)");
    Ok(ExitCode::SUCCESS)
}
