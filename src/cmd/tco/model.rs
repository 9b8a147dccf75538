//! The model itself: each scenario's servers, drives, cores, energy and
//! cost over the same required effective capacity and write throughput
//! (formulas and sources: docs/TCO.md). Pure arithmetic on its inputs.

use super::inputs::{Measured, Sku};
use super::{GIB_PER_GB, HOURS_PER_YEAR};
use serde::Serialize;

/// One scenario's results.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    pub name: String,
    pub ratio: f64,
    pub raw_tb: f64,
    pub drives: u64,
    pub servers_for_capacity: u64,
    pub servers_for_throughput: u64,
    pub servers_for_cores: u64,
    pub servers: u64,
    pub server_gbps: f64,
    pub cores_needed: f64,
    pub cores_needed_per_server: f64,
    pub cpu: String,
    pub cores_per_server: u32,
    pub servers_capex: f64,
    pub drives_capex: f64,
    pub power_watts: f64,
    pub energy_cost: f64,
    pub tco: f64,
    pub cost_per_effective_tb: f64,
}

/// The model's inputs after validation and defaults.
#[derive(Clone, Debug, Serialize)]
pub struct Model {
    pub measured: Measured,
    pub capacity_tb: f64,
    pub throughput_gbps: f64,
    pub read_throughput_gbps: f64,
    pub drive_cost_per_tb: f64,
    pub drive_tb: f64,
    pub drive_power_w: f64,
    pub drives_per_server: u32,
    pub server_cost: f64,
    pub server_power_w: f64,
    pub sockets: u32,
    pub cpus: Vec<Sku>,
    pub server_gbps: f64,
    pub stack_cores_per_gbps: f64,
    pub kwh_cost: f64,
    pub pue: f64,
    pub years: f64,
    pub protection: f64,
    pub protection_desc: String,
    pub usable: f64,
    pub cpu_throughput_loss: f64,
    pub cpu_ratio: f64,
    pub offload_cost: f64,
    pub offload_power_w: f64,
    pub offload_ratio: f64,
    pub offload_throughput_loss: f64,
}

/// Rounds a count up, tolerating floating-point noise just above an
/// integer (e.g. 26.000000000000004 -> 26).
fn ceil(x: f64) -> u64 {
    let r = x.round();
    if (x - r).abs() < 1e-9 {
        r.max(0.0) as u64
    } else {
        x.ceil().max(0.0) as u64
    }
}

struct Spec<'a> {
    name: &'a str,
    ratio: f64,
    loss: f64,
    compression_cores: f64,
    /// Keep the first SKU (the classic stack's loss was measured on it).
    fixed_sku: bool,
    extra_cost: f64,
    extra_watts: f64,
}

impl Model {
    fn energy(&self, watts: f64) -> f64 {
        watts / 1000.0 * HOURS_PER_YEAR * self.years * self.kwh_cost * self.pue
    }

    fn scenario(&self, s: &Spec) -> Scenario {
        let raw_tb = self.capacity_tb / s.ratio * self.protection / self.usable;
        let drives = ceil(raw_tb / self.drive_tb);
        let servers_for_capacity = ceil(drives as f64 / f64::from(self.drives_per_server));
        let server_gbps = self.server_gbps * (1.0 - s.loss);
        let servers_for_throughput = ceil(self.throughput_gbps / server_gbps);
        let cores_needed = self.throughput_gbps * self.stack_cores_per_gbps + s.compression_cores;
        let max_cores = self.cpus.iter().map(|c| c.cores).max().unwrap_or(1) * self.sockets;
        let servers_for_cores = if s.fixed_sku {
            0
        } else {
            ceil(cores_needed / f64::from(max_cores))
        };
        let servers = servers_for_capacity
            .max(servers_for_throughput)
            .max(servers_for_cores)
            .max(1);
        let per_server = cores_needed / servers as f64;
        let sockets = f64::from(self.sockets);
        let sku = if s.fixed_sku {
            &self.cpus[0]
        } else {
            // Cheapest over the model's life among SKUs with enough cores
            // (ties: the first listed).
            self.cpus
                .iter()
                .filter(|c| f64::from(c.cores * self.sockets) >= per_server - 1e-9)
                .min_by(|a, b| {
                    let life = |c: &Sku| sockets * (c.cost + self.energy(c.watts));
                    life(a).total_cmp(&life(b))
                })
                .unwrap_or(&self.cpus[0])
        };
        let n = servers as f64;
        let servers_capex = n * (self.server_cost + sockets * sku.cost + s.extra_cost);
        let drives_capex = drives as f64 * self.drive_tb * self.drive_cost_per_tb;
        let power_watts = n * (self.server_power_w + sockets * sku.watts + s.extra_watts)
            + drives as f64 * self.drive_power_w;
        let energy_cost = self.energy(power_watts);
        let tco = servers_capex + drives_capex + energy_cost;
        Scenario {
            name: s.name.to_string(),
            ratio: s.ratio,
            raw_tb,
            drives,
            servers_for_capacity,
            servers_for_throughput,
            servers_for_cores,
            servers,
            server_gbps,
            cores_needed,
            cores_needed_per_server: per_server,
            cpu: sku.name.clone(),
            cores_per_server: sku.cores * self.sockets,
            servers_capex,
            drives_capex,
            power_watts,
            energy_cost,
            tco,
            cost_per_effective_tb: tco / self.capacity_tb,
        }
    }

    /// The four scenarios: none, classic-cpu, squeeze, offload.
    pub fn scenarios(&self) -> Vec<Scenario> {
        let m = &self.measured;
        let squeeze_cores = self.throughput_gbps * GIB_PER_GB * m.cpu_s_per_gib_compress
            + self.read_throughput_gbps * GIB_PER_GB * m.cpu_s_per_gib_decompress;
        let base = Spec {
            name: "none",
            ratio: 1.0,
            loss: 0.0,
            compression_cores: 0.0,
            fixed_sku: false,
            extra_cost: 0.0,
            extra_watts: 0.0,
        };
        vec![
            self.scenario(&base),
            self.scenario(&Spec {
                name: "classic-cpu",
                ratio: self.cpu_ratio,
                loss: self.cpu_throughput_loss,
                fixed_sku: true,
                ..base
            }),
            self.scenario(&Spec {
                name: "squeeze",
                ratio: m.ratio,
                compression_cores: squeeze_cores,
                ..base
            }),
            self.scenario(&Spec {
                name: "offload",
                ratio: self.offload_ratio,
                loss: self.offload_throughput_loss,
                extra_cost: self.offload_cost,
                extra_watts: self.offload_power_w,
                ..base
            }),
        ]
    }
}
