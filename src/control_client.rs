//! The client of a running server's control socket (`squeeze serve`,
//! `docs/ARCHITECTURE.md`, "Control socket"), and the request it sends,
//! which the server parses: `stats` reads the live statistics through it,
//! `set` and `resize` change a running server's volumes, and `compact`
//! refuses a socket it is given ([`is_socket`]).

use crate::dedup_args::DedupArgs;
use crate::policy_args::PolicyArgs;
use anyhow::{bail, Context, Result};
use squeeze_engine::VolumeStats;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Whether `path` is a Unix socket (a running server's control socket).
pub fn is_socket(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
        .unwrap_or(false)
}

/// A control request: what a `squeeze set` or `squeeze resize` on the
/// control socket sends.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct ControlRequest {
    /// "stats", "set" or "resize".
    pub op: String,
    /// The export to change; may be left out when the server has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// set: the policy options to change (as on the command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyArgs>,
    /// set: the new --max-physical in bytes (0 = none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_physical: Option<u64>,
    /// set: the dedup options to change (as on the command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup: Option<DedupArgs>,
    /// set: the adaptive codec's lowest rung under busy cores ("raw" or
    /// "lz4"; `serve --burst-floor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_floor: Option<String>,
    /// resize: the new logical size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// Sends `req` to a server's control socket and returns its answer; an
/// `"error"` answer is an error.
pub fn control_call(path: &Path, req: &ControlRequest) -> Result<serde_json::Value> {
    let mut c = UnixStream::connect(path)?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    c.write_all(line.as_bytes())?;
    c.shutdown(std::net::Shutdown::Write)?;
    let mut s = String::new();
    c.read_to_string(&mut s)?;
    let v: serde_json::Value =
        serde_json::from_str(&s).context("malformed answer from the control socket")?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        bail!("{e}");
    }
    Ok(v)
}

/// A running server's answer on its control socket.
pub struct LiveStats {
    /// Each volume's statistics.
    pub volumes: Vec<(String, VolumeStats)>,
    /// The NBD server's counters (connections, requests by type, bytes,
    /// errors), for all its exports together.
    pub server: serde_json::Value,
    /// `serve --ublk`'s devices by volume (device, requests by type,
    /// bytes, errors); Null without them.
    pub ublk: serde_json::Value,
}

/// Reads the live statistics from a server's control socket.
pub fn query_control(path: &Path) -> Result<LiveStats> {
    let v = control_call(
        path,
        &ControlRequest {
            op: "stats".into(),
            ..Default::default()
        },
    )?;
    let vols = v["volumes"]
        .as_object()
        .ok_or_else(|| anyhow::anyhow!("malformed answer from the control socket"))?;
    Ok(LiveStats {
        volumes: vols
            .iter()
            .map(|(k, v)| Ok((k.clone(), stats_from_json(v)?)))
            .collect::<Result<_>>()?,
        server: v["server"].clone(),
        ublk: v["ublk"].clone(),
    })
}

fn stats_from_json(v: &serde_json::Value) -> Result<VolumeStats> {
    Ok(serde_json::from_value(v.clone())?)
}
