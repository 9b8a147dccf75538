//! `squeeze set PATH|SOCKET [--volume NAME] [policy] [--max-physical SIZE]
//! [--dedup off|idle|inline] [--dedup-index MIB] [--burst-floor raw|lz4]`: change
//! the policy for future writes (as `ceph osd pool set` does; data already
//! written keeps its codec), the cap on the backing file and the
//! deduplication settings (docs/DEDUP.md), on a volume file or, through its
//! control socket, on a running server; and a running server's burst floor
//! (not stored in the volume: `serve --burst-floor`).

use crate::control_client::{control_call, is_socket, ControlRequest};
use crate::dedup_args::{dedup_text, DedupArgs};
use crate::policy_args::{policy_json, PolicyArgs};
use crate::util::{human, open_volume, parse_size};
use anyhow::{bail, Result};
use squeeze_engine::SettingsChange;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A volume file, or a running server's control socket.
    pub path: PathBuf,
    /// With a control socket: the export to change (needed when the server
    /// serves several).
    #[arg(long, value_name = "NAME")]
    pub volume: Option<String>,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Cap on the backing file's allocated bytes (0 = none). Lowering it
    /// below what the file uses is refused (compact first).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_physical: Option<u64>,
    #[command(flatten)]
    pub dedup: DedupArgs,
    /// With a control socket: the adaptive codec's lowest rung under busy
    /// cores, `raw` or `lz4` (as `squeeze serve --burst-floor`).
    #[arg(long, value_name = "raw|lz4", value_parser = crate::policy_args::parse_floor)]
    pub burst_floor: Option<squeeze_engine::pipeline::burst::BurstFloor>,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let policy_changes = a.policy.given();
    let dedup_changes = a.dedup.given();
    if !policy_changes && a.max_physical.is_none() && a.burst_floor.is_none() && !dedup_changes {
        bail!(
            "nothing to change: give policy options (--algorithm, --mode, ...), --max-physical, --dedup, --dedup-index or --burst-floor"
        );
    }
    let mut floor = String::new();
    // (volume, policy as `policy_json` shows it, max_physical, dedup)
    let (name, p, max_physical, dedup) = if is_socket(&a.path) {
        let v = control_call(
            &a.path,
            &ControlRequest {
                op: "set".into(),
                volume: a.volume.clone(),
                policy: policy_changes.then(|| a.policy.clone()),
                max_physical: a.max_physical,
                dedup: dedup_changes.then(|| a.dedup.clone()),
                burst_floor: a.burst_floor.map(|f| f.to_string()),
                ..Default::default()
            },
        )?;
        floor = v["burst_floor"].as_str().unwrap_or("").to_string();
        (
            v["volume"].as_str().unwrap_or("?").to_string(),
            v["policy"].clone(),
            v["max_physical"].as_u64().unwrap_or(0),
            format!(
                "{}, index {} MiB",
                v["dedup"]["mode"].as_str().unwrap_or("?"),
                v["dedup"]["index_bytes"].as_u64().unwrap_or(0) >> 20
            ),
        )
    } else {
        if a.volume.is_some() {
            bail!("--volume names an export of a running server: PATH is a volume file");
        }
        if a.burst_floor.is_some() {
            bail!("--burst-floor is not stored in the volume: give it to `squeeze serve`, or set it on a running server through its control socket");
        }
        let vol = open_volume(&a.path, false)?;
        // All or nothing: every change is checked before any is made.
        let policy = policy_changes
            .then(|| a.policy.apply(vol.policy()))
            .transpose()?;
        let dedup = dedup_changes
            .then(|| a.dedup.apply(vol.dedup_settings()))
            .transpose()?;
        vol.set_settings(SettingsChange {
            policy,
            max_physical: a.max_physical,
            dedup,
        })?;
        let p = policy_json(&vol.policy());
        let cap = vol.superblock().max_physical;
        let d = dedup_text(&vol.dedup_settings());
        vol.close()?;
        (a.path.display().to_string(), p, cap, d)
    };
    let policy = format!(
        "algorithm {} mode {} required_ratio {} min_blob {} max_blob {} recompress {} read_chunk {}",
        p["algorithm"].as_str().unwrap_or("?"),
        p["mode"].as_str().unwrap_or("?"),
        // As stored (millionths) and as `info` prints it: 0.000001, not 1e-6.
        p["required_ratio"].as_f64().unwrap_or(f64::NAN),
        p["min_blob_size"],
        p["max_blob_size"],
        p["recompress"].as_str().unwrap_or("?"),
        p["read_chunk"]
    );
    let cap = if max_physical == 0 {
        "none".to_string()
    } else {
        human(max_physical)
    };
    if floor.is_empty() {
        outln!("{name}: {policy} max_physical {cap} dedup {dedup}");
    } else {
        outln!("{name}: {policy} max_physical {cap} dedup {dedup} burst_floor {floor}");
    }
    Ok(ExitCode::SUCCESS)
}
