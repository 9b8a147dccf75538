//! `squeeze serve`'s options, and the TLS settings and NBD server
//! configuration they ask for.

use super::device::VolumeDevice;
use super::ublk::UblkOptions;
use crate::policy_args::PolicyArgs;
use crate::util::{human, parse_size};
use anyhow::{bail, Result};
use squeeze_nbd::{IpNet, ServerConfig, TlsConfig, TlsMode};
use std::path::PathBuf;
use std::sync::Arc;

pub const DEFAULT_DIR: &str = "squeeze-data";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";

#[derive(clap::Args)]
pub struct Args {
    /// Volume files to export (default: ./squeeze-data/default.sqz, created on first use).
    pub paths: Vec<PathBuf>,
    /// TCP address to listen on. Loopback by default: NBD has no authentication.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Listen on a Unix socket (mode 0600) instead of TCP (or as well, with --listen).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Also serve the volumes as files DIR/NAME of a FUSE file system, for
    /// a loop device (`losetup -f --show DIR/NAME`): a kernel block device
    /// where the kernel's nbd module is missing, one hop from the engine.
    /// Needs /dev/fuse and fusermount3 (Debian's fuse3). NBD stays on as
    /// well (--socket or --listen).
    #[arg(long, value_name = "DIR")]
    pub fuse_dir: Option<PathBuf>,
    /// Also serve each volume as a Linux block device, /dev/ublkbN, through
    /// the kernel's ublk driver (ublk_drv, Linux 6.0 or later): no NBD
    /// client and no loop device between the kernel and the engine. A
    /// device outlives a crash of this server: the next `squeeze serve
    /// --ublk` of the same volume takes it over, and a file system
    /// mounted on it goes on (docs/ARCHITECTURE.md, "ublk"). SIGINT/SIGTERM
    /// remove the devices. NBD then listens only with --socket or --listen.
    #[arg(long)]
    pub ublk: bool,
    /// Every write answered outlives a crash of this server process: the
    /// volumes write through the page cache (as SQUEEZE_IO=buffered)
    /// instead of the write-behind pool, which loses up to 32 MiB of
    /// answered, unflushed writes with the process. Needed under a client
    /// that reconnects to a restarted server and goes on
    /// (`squeeze nbd-attach`): its file system trusts what it was
    /// answered, flushed or not. --ublk needs none of it: its queues answer
    /// a write once the pool has written it out.
    #[arg(long)]
    pub restartable: bool,
    /// With --ublk: the device id (N of /dev/ublkbN) of each volume, in
    /// order (repeatable). Default: the device a killed server left for
    /// the volume, else the first free id.
    #[arg(long = "ublk-id", value_name = "N", requires = "ublk")]
    pub ublk_id: Vec<u32>,
    /// With --ublk: hardware queues per device (default: one per core, at
    /// most 16). The kernel sends a request to the queue of the CPU that
    /// submitted it.
    #[arg(long, value_name = "N", requires = "ublk",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub ublk_queues: Option<u16>,
    /// With --ublk: requests in flight per queue.
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub ublk_depth: u16,
    /// With --ublk: largest request the kernel sends (a multiple of 4 KiB,
    /// 64K to 32M); each queue holds one buffer this size per request.
    #[arg(long, value_name = "SIZE", default_value = "512K", value_parser = parse_max_io)]
    pub ublk_max_io: u64,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (and JSON at /stats).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// Control socket for `squeeze stats SOCKET` (default: beside the first volume, NAME.ctl).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Size of a volume this command creates (the default volume, or a missing PATH).
    #[arg(long, default_value = "64G", value_parser = parse_size)]
    pub size: u64,
    /// Policy of a volume this command creates.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// NBD worker threads (requests executed at once, over all connections); default 8 per core, at least 16 (reads mostly wait for the device).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Of those, WRITE requests executed at once, overriding what the volumes declare (they are CPU-bound: the codec): two per core, at least 4.
    #[arg(long)]
    pub write_workers: Option<usize>,
    /// Hand every READ to the workers. By default a connection's reader answers a READ of up to 32 KiB itself when the volume can without waiting (the page cache), sparing two thread switches a read; its reads then run one at a time, so on a host with many idle cores one connection's cached small reads may go faster over the workers.
    #[arg(long)]
    pub no_inline_reads: bool,
    /// Do not rewrite fragmented windows (left by small overwrites) as whole
    /// blobs while clients are idle. The cleaner still runs; `squeeze
    /// compact` still merges. Saves device writes at the cost of ratio.
    #[arg(long)]
    pub no_idle_merge: bool,
    /// Serve a volume that lost flushed data (records a flush made durable
    /// are gone, or the file was cut short: `squeeze check` names what),
    /// keeping what survives. Without it such a volume is refused, since
    /// the sectors of the lost records would read back older data. The
    /// loss becomes permanent, and `stats` counts it.
    #[arg(long)]
    pub accept_loss: bool,
    /// For databases and other small-commit workloads: before a flush that
    /// follows little log, write zeros over the next 512 KiB past the log
    /// head, once, so commits overwrite written blocks of the backing file
    /// instead of converting fallocated ones at every fdatasync (faster
    /// flushes; the log bytes of such a workload are written twice).
    /// docs/DATABASES.md
    #[arg(long)]
    pub prewrite: bool,
    /// Always compress writes with the policy's algorithm. By default a
    /// write batch takes a faster codec of the ladder under it (zstd:3 ->
    /// zstd:1 -> lz4) while the compression threads are behind, and
    /// the bytes written so are recompressed with the policy's algorithm
    /// when clients are idle (docs/ARCHITECTURE.md, "Adaptive write codec").
    #[arg(long)]
    pub no_adapt: bool,
    /// Step down the codec ladder only while the compression threads are
    /// behind, not also while the machine's cores are busy. By default the
    /// server reads /proc/stat and, once the cores have been at least 95%
    /// busy for 200 ms (client, server and compressor sharing them),
    /// writes with the ladder's fastest codec until they have been at most
    /// 75% busy for a second; between 80% and 95% busy it tries the fastest
    /// codec for half a second and keeps it only if the clients wrote at
    /// least 10% faster with it (docs/ARCHITECTURE.md, "Adaptive write
    /// codec").
    #[arg(long, conflicts_with = "no_adapt")]
    pub no_cpu_adapt: bool,
    /// The lowest codec the busy cores may take: `raw` (the default) stores
    /// a write batch uncompressed once the cores have stayed saturated at
    /// lz4 too, while the volume has room for it (at most a quarter of the
    /// room it had when the burst began, under --max-physical and the
    /// backing file system's free space), and the idle upgrade compresses
    /// it with the policy's algorithm; `lz4` keeps the ratio during bursts
    /// at lz4's. Changed on a running server with `squeeze set SOCKET
    /// --burst-floor` (docs/ARCHITECTURE.md, "Adaptive write codec").
    #[arg(long, value_name = "raw|lz4", default_value = "raw", value_parser = crate::policy_args::parse_floor)]
    pub burst_floor: squeeze_engine::pipeline::burst::BurstFloor,
    /// RAM the sector map of each volume may use (default 128M, at least
    /// 64K). Beyond it, map chunks that did not change since the last
    /// checkpoint page out to the checkpoint chain on the volume and are
    /// read back when needed; changed chunks stay until the next checkpoint,
    /// which comes early when they hold the map over its cache.
    /// docs/ARCHITECTURE.md, "Map paging".
    #[arg(long, value_parser = parse_map_cache)]
    pub map_cache: Option<u64>,
    /// Dedup mode inline: keep 1 fingerprint in N in the write path's
    /// index (a power of two, 1 to 32; default 8). Each hook found again
    /// is extended to the sectors around it by comparing bytes; 1 keeps
    /// every written sector (a dense index: 8 times the RAM for the same
    /// window of recent writes). Not stored in the volume
    /// (docs/DEDUP.md, "Inline").
    #[arg(long, value_name = "N", value_parser = parse_dedup_sample)]
    pub dedup_sample: Option<u64>,
    /// Drill, not for production: the compression engine reports itself
    /// always far behind (`squeeze_codec::Saturated`), so every write batch
    /// takes the fastest rung of the adaptive codec's ladder and idle time
    /// has upgrades to run. The SIGKILL torture uses it
    /// (`squeeze-torture --saturated-engine`).
    #[arg(long, hide = true, conflicts_with = "no_adapt")]
    pub simulate_saturated_engine: bool,
    /// Share of the sealed log, in percent (15-60), that dead bytes may
    /// reach before the cleaner copies while clients write: more saves
    /// device writes (write amplification) at the cost of space, and is
    /// spent only from free room (docs/ARCHITECTURE.md, "Cleaner policy").
    #[arg(long, value_name = "PERCENT", default_value_t = 50.0, value_parser = parse_gc)]
    pub gc_budget: f64,
    /// Server certificate chain (PEM, leaf first) for TLS (NBD_OPT_STARTTLS).
    /// With --tls-key; TLS is then required unless --tls-mode allow.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of the server certificate (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// off: no TLS; allow: offer TLS, serve plaintext clients too; require:
    /// refuse every option but STARTTLS (NBD_REP_ERR_TLS_REQD) until TLS is up.
    /// Default: require with --tls-cert, off without.
    #[arg(long, value_enum, value_name = "MODE")]
    pub tls_mode: Option<TlsModeArg>,
    /// Require TLS clients to present a certificate signed by a CA in FILE
    /// (PEM); the only client authentication NBD has.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Export allow-list (repeatable): only these exports are listed and
    /// selectable; others are refused as unknown. Default: every export.
    #[arg(long = "allow-export", value_name = "NAME")]
    pub allow_export: Vec<String>,
    /// Client address allow-list for TCP (repeatable, CIDR like 10.0.0.0/8 or
    /// a single address); others are closed on accept. Unix socket clients are
    /// always allowed (the socket is mode 0600). Default: any address.
    #[arg(long = "allow", value_name = "ADDR[/LEN]", value_parser = parse_net)]
    pub allow: Vec<IpNet>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsModeArg {
    Off,
    Allow,
    Require,
}

fn parse_gc(s: &str) -> Result<f64, String> {
    let p: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|e| format!("{s:?} is not a percentage: {e}"))?;
    squeeze_engine::GcPolicy::with_budget(p / 100.0).map_err(|e| e.to_string())?;
    Ok(p)
}

fn parse_net(s: &str) -> Result<IpNet, String> {
    s.parse()
}

/// `--ublk-max-io`: 64 KiB to 32 MiB (ublk's buffer limit), whole 4 KiB pages.
fn parse_max_io(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if !(64 << 10..=32 << 20).contains(&v) || v % 4096 != 0 {
        return Err(format!("{s}: a multiple of 4K from 64K to 32M"));
    }
    Ok(v)
}

/// The ublk devices' shape the flags ask for.
pub(super) fn ublk_options(a: &Args) -> UblkOptions {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    UblkOptions {
        queues: a.ublk_queues.unwrap_or(cores.min(16) as u16),
        depth: a.ublk_depth,
        max_io_bytes: a.ublk_max_io as u32,
        ids: a.ublk_id.clone(),
    }
}

/// `--map-cache`: a size of at least `MAP_CACHE_MIN`.
fn parse_map_cache(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v < squeeze_engine::MAP_CACHE_MIN {
        return Err(format!(
            "{s} is below the smallest map cache, {}",
            human(squeeze_engine::MAP_CACHE_MIN)
        ));
    }
    Ok(v)
}

fn parse_dedup_sample(s: &str) -> Result<u64, String> {
    let v: u64 = s.parse().map_err(|e| format!("{s}: {e}"))?;
    if !squeeze_engine::dedup::valid_sample(v) {
        return Err(format!("{s}: a power of two from 1 to 32"));
    }
    Ok(v)
}

/// The TLS settings the flags ask for.
pub(super) fn tls_config(a: &Args) -> Result<Option<TlsConfig>> {
    let mode = match (a.tls_mode, &a.tls_cert) {
        (Some(TlsModeArg::Off), Some(_)) => {
            bail!("--tls-mode off with --tls-cert: drop one of them")
        }
        (Some(TlsModeArg::Off), None) | (None, None) => return Ok(None),
        (Some(_), None) => bail!("--tls-mode allow/require needs --tls-cert and --tls-key"),
        (Some(TlsModeArg::Allow), Some(_)) => TlsMode::Allow,
        (Some(TlsModeArg::Require) | None, Some(_)) => TlsMode::Require,
    };
    let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) else {
        bail!("--tls-cert and --tls-key go together");
    };
    let c = TlsConfig::from_pem_files(cert, key, a.tls_client_ca.as_deref(), mode)
        .map_err(|e| anyhow::anyhow!("loading TLS certificates: {e}"))?;
    Ok(Some(c))
}

/// What the flags ask of the NBD server: worker threads, write slots,
/// TLS and the allow-lists (each `--allow-export` must name one of
/// `devices`).
pub(super) fn server_config(
    a: &Args,
    devices: &[(String, Arc<VolumeDevice>)],
    tls: Option<TlsConfig>,
) -> Result<ServerConfig> {
    let mut config = ServerConfig::default();
    if let Some(w) = a.workers {
        config.workers = w.max(1);
    }
    // Without --write-workers the volumes' own declaration
    // (`VolumeDevice::max_concurrent_writes`) sizes the write slots.
    if let Some(w) = a.write_workers {
        config.write_workers = Some(w.max(1));
    }
    config.inline_reads = !a.no_inline_reads;
    config.tls = tls;
    if !a.allow_export.is_empty() {
        for n in &a.allow_export {
            if !devices.iter().any(|(d, _)| d == n) {
                bail!(
                    "--allow-export {n:?}: no such export (exports: {})",
                    devices
                        .iter()
                        .map(|d| d.0.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        config.allowed_exports = Some(a.allow_export.clone());
    }
    if !a.allow.is_empty() {
        config.allowed_peers = Some(a.allow.clone());
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NBD has no authentication: without --listen, TCP is loopback only.
    #[test]
    fn default_listen_address_is_loopback() {
        let a: std::net::SocketAddr = DEFAULT_LISTEN.parse().unwrap();
        assert!(a.ip().is_loopback());
    }
}
