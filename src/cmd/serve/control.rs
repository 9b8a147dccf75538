//! The control socket's server (thread `sqz-control`; beside the first
//! volume as NAME.ctl, mode 0600): the live statistics, and `set` and
//! `resize` on a running server's volumes. The request type and the client
//! are `crate::control_client`'s; the protocol is in docs/ARCHITECTURE.md,
//! "Control socket".

use super::accept::one_at_a_time;
use super::device::VolumeDevice;
use super::ublk_stats::{ublk_json, UblkRegistry};
use crate::control_client::ControlRequest;
use crate::policy_args::policy_json;
use anyhow::{bail, Context, Result};
use squeeze_engine::SettingsChange;
use squeeze_nbd::Server;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Longest request line the control socket reads.
const CONTROL_REQUEST_MAX: u64 = 64 << 10;

/// Binds the control socket at `path`, mode 0600; a socket left by a
/// server that is gone is replaced, anything else there is refused.
pub(super) fn bind_control(path: &Path) -> Result<UnixListener> {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if m.file_type().is_socket() && UnixStream::connect(path).is_err() {
            std::fs::remove_file(path)?;
        } else {
            bail!(
                "control socket {} exists: is another server running on this volume?",
                path.display()
            );
        }
    }
    let l = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(l)
}

/// The control socket, one client at a time: at most one request line
/// of JSON (`docs/ARCHITECTURE.md`, "Control socket"), then one answer and
/// the connection closes. No request (the client shuts its side, or sends
/// nothing for 2 s) asks for the statistics.
pub(super) fn control_loop(
    l: UnixListener,
    devs: &[(String, Arc<VolumeDevice>)],
    srv: &Server,
    ublk: &UblkRegistry,
    stop: &AtomicBool,
) {
    one_at_a_time(l.incoming(), stop, Duration::from_secs(2), |c| {
        let mut line = String::new();
        let read = BufReader::new((&mut *c).take(CONTROL_REQUEST_MAX)).read_line(&mut line);
        let body = match read {
            Ok(_) if line.trim().is_empty() => stats_json(devs, srv, ublk),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                stats_json(devs, srv, ublk)
            }
            Err(e) => serde_json::json!({ "error": format!("reading the request: {e}") }),
            Ok(_) => match control_request(line.trim(), devs, srv, ublk) {
                Ok(v) => v,
                Err(e) => serde_json::json!({ "error": crate::util::error_text(&e) }),
            },
        };
        let _ = c.write_all(body.to_string().as_bytes());
    });
}

fn control_request(
    line: &str,
    devs: &[(String, Arc<VolumeDevice>)],
    srv: &Server,
    ublk: &UblkRegistry,
) -> Result<serde_json::Value> {
    let req: ControlRequest =
        serde_json::from_str(line).context("a request is one line of JSON")?;
    let pick = || -> Result<&(String, Arc<VolumeDevice>)> {
        match &req.volume {
            Some(n) => devs.iter().find(|(name, _)| name == n).ok_or_else(|| {
                anyhow::anyhow!(
                    "no volume {n:?} here (volumes: {})",
                    devs.iter()
                        .map(|d| d.0.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }),
            None if devs.len() == 1 => Ok(&devs[0]),
            None => bail!("this server has several volumes: name one"),
        }
    };
    match req.op.as_str() {
        "stats" => Ok(stats_json(devs, srv, ublk)),
        "set" => {
            let (name, dev) = pick()?;
            let policy = req.policy.as_ref().filter(|p| p.given());
            let dedup = req.dedup.as_ref().filter(|d| d.given());
            if policy.is_none()
                && req.max_physical.is_none()
                && req.burst_floor.is_none()
                && dedup.is_none()
            {
                bail!("set: nothing to change");
            }
            // All or nothing: every change is checked before any is made.
            let policy = policy.map(|p| p.apply(dev.vol.policy())).transpose()?;
            let dedup = dedup
                .map(|d| d.apply(dev.vol.dedup_settings()))
                .transpose()?;
            let floor = req
                .burst_floor
                .as_deref()
                .map(|f| crate::policy_args::parse_floor(f).map_err(anyhow::Error::msg))
                .transpose()?;
            if floor.is_some() && dev.vol.stats().burst_floor.is_empty() {
                bail!("set: this volume does not adapt its codec (--no-adapt): no burst floor");
            }
            if policy.is_some() || req.max_physical.is_some() || dedup.is_some() {
                dev.vol.set_settings(SettingsChange {
                    policy,
                    max_physical: req.max_physical,
                    dedup,
                })?;
            }
            if let Some(f) = floor {
                dev.vol.set_burst_floor(f);
            }
            let floor = dev.vol.stats().burst_floor;
            tracing::info!(volume = %name, "settings changed through the control socket");
            Ok(serde_json::json!({
                "ok": true,
                "volume": name,
                "policy": policy_json(&dev.vol.policy()),
                "max_physical": dev.vol.superblock().max_physical,
                "dedup": crate::dedup_args::dedup_json(&dev.vol.dedup_settings()),
                "burst_floor": floor,
            }))
        }
        "resize" => {
            let (name, dev) = pick()?;
            let size = req.size.ok_or_else(|| anyhow::anyhow!("resize: no size"))?;
            dev.vol.resize(size)?;
            Ok(serde_json::json!({ "ok": true, "volume": name, "size": dev.vol.size() }))
        }
        op => bail!("unknown op {op:?}: use stats, set or resize"),
    }
}

/// Every volume's statistics and the NBD server's counters: the control
/// socket's `stats` answer, and what `--metrics` serves at /stats.
pub(super) fn stats_json(
    devs: &[(String, Arc<VolumeDevice>)],
    srv: &Server,
    ublk: &UblkRegistry,
) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (name, d) in devs {
        m.insert(
            name.clone(),
            serde_json::to_value(d.vol.stats()).expect("stats"),
        );
    }
    let mut j = serde_json::json!({ "volumes": m, "server": server_json(&srv.stats()) });
    if let Some(u) = ublk_json(ublk) {
        j["ublk"] = u;
    }
    j
}

/// The NBD server's counters as JSON.
fn server_json(s: &squeeze_nbd::ServerStats) -> serde_json::Value {
    let r = &s.requests;
    serde_json::json!({
        "connections_open": s.connections_open,
        "connections_total": s.connections_total,
        "requests_in_flight": s.requests_in_flight,
        "bytes_read": s.bytes_read,
        "reads_inline": s.reads_inline,
        "bytes_written": s.bytes_written,
        "errors": s.errors,
        "protocol_errors": s.protocol_errors,
        "requests": {
            "read": r.read, "write": r.write, "flush": r.flush, "trim": r.trim,
            "write_zeroes": r.write_zeroes, "block_status": r.block_status,
            "disc": r.disc, "other": r.other,
        },
    })
}
