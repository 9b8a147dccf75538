//! `squeeze serve`: the one adapter between the NBD layer (which knows
//! nothing of compression) and the engine (which knows nothing of sockets).
//!
//! Each PATH becomes an export named after the file's stem; the empty
//! export name selects the first. With no PATH a default volume under
//! ./squeeze-data/ is opened, created on first use. Live statistics are
//! served on a control socket (`squeeze stats SOCKET`) and, with
//! `--metrics`, in Prometheus text format over HTTP. SIGINT/SIGTERM stop
//! accepting, finish in-flight requests, flush, checkpoint and exit 0.
//!
//! The front door (NBD has no authentication of its own): TCP binds to
//! loopback unless `--listen` says otherwise, Unix sockets are mode 0600,
//! `--tls-cert`/`--tls-key` turn on TLS (NBD_OPT_STARTTLS, required by
//! default once certificates are given; `--tls-client-ca` also requires
//! client certificates), `--allow-export` limits the exports clients can
//! see and select, and `--allow` limits the addresses TCP clients may
//! connect from.

use crate::control_client::ControlRequest;
use crate::policy_args::{policy_json, PolicyArgs};
use crate::util::{create_volume, human, open_volume_with, parse_size};
use anyhow::{bail, Context, Result};
use squeeze_engine::{
    default_policy, CreateOptions, EngineError, OpenOptions, Volume, VolumeStats, MAX_LOGICAL_SIZE,
};
use squeeze_nbd::{BlockDevice, Export, IpNet, Listener, Server, ServerConfig, TlsConfig, TlsMode};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// RAM the sector map of each volume may use (default 128M, at least
    /// 64K). Beyond it, map chunks that did not change since the last
    /// checkpoint page out to the checkpoint chain on the volume and are
    /// read back when needed; changed chunks stay until the next checkpoint,
    /// which comes early when they hold the map over its cache.
    /// docs/ARCHITECTURE.md, "Map paging".
    #[arg(long, value_parser = parse_map_cache)]
    pub map_cache: Option<u64>,
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
    squeeze_engine::GcPolicy::with_budget(p / 100.0)?;
    Ok(p)
}

fn parse_net(s: &str) -> Result<IpNet, String> {
    s.parse()
}

/// The TLS settings the flags ask for.
fn tls_config(a: &Args) -> Result<Option<TlsConfig>> {
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

/// The engine volume as an NBD block device.
pub struct VolumeDevice {
    pub vol: Volume,
}

fn io_err(e: EngineError) -> io::Error {
    e.into_io()
}

impl BlockDevice for VolumeDevice {
    fn size(&self) -> u64 {
        self.vol.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.vol.read(offset, buf).map_err(io_err)
    }
    fn read_or_hole(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        // One map walk for the read and the hole test.
        self.vol.read_or_hole(offset, buf).map_err(io_err)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.vol.write(offset, data, fua).map_err(io_err)
    }
    fn write_owned(&self, offset: u64, data: Vec<u8>, fua: bool) -> io::Result<()> {
        // No copy for the compression engine: the payload becomes its input.
        let data = Arc::new(data);
        self.vol
            .write_shared(offset, &data, 0..data.len(), fua)
            .map_err(io_err)
    }
    fn flush(&self) -> io::Result<()> {
        self.vol.flush().map_err(io_err)
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        self.vol.trim(offset, len, fua).map_err(io_err)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_trim: bool, fua: bool) -> io::Result<()> {
        if may_trim {
            // Zeros are free (DESIGN principle 4): whole zero sectors become
            // holes and read back as zeros.
            self.vol.write_zeroes(offset, len, fua).map_err(io_err)
        } else {
            // NO_HOLE: the range must stay provisioned, which on a
            // compressing thin volume means mapped to records like written
            // data (zeros compress to almost nothing); BLOCK_STATUS then
            // reports it allocated, not a hole.
            self.vol
                .write_zeroes_no_hole(offset, len, fua)
                .map_err(io_err)
        }
    }
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, bool)>> {
        self.vol.block_status(offset, len, 4096).map_err(io_err)
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn can_fast_zero(&self) -> bool {
        true
    }
    fn max_concurrent_writes(&self) -> usize {
        volume_write_slots()
    }
}

/// WRITE requests a compressing volume runs at once: two per core, at
/// least 4. Writes are CPU-bound (the codec), and on 2 cores 4 wrote fio's
/// W1 at 1168-1298 MB/s where 8 managed 920-1211; reads, which mostly
/// wait for the device, keep every NBD worker.
fn volume_write_slots() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 2).clamp(4, 64)
}

/// Marks this process as an I/O flusher (PR_SET_IO_FLUSHER, Linux 5.6):
/// its allocations then never wait on writeback to a device it serves.
/// A client on this host (the kernel's nbd client, a loop device on the
/// FUSE export, a file system or a Ceph OSD above either) may need memory
/// reclaim to write dirty pages to that very device; if the server's own
/// allocation waited for that reclaim, neither would move (the deadlock
/// Ceph's rbd-nbd and Rook hit, and why they set this flag). Needs
/// CAP_SYS_RESOURCE; without it (or on an older kernel) a warning is
/// logged and the server runs as before.
fn set_io_flusher() {
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) };
    if r != 0 {
        let e = io::Error::last_os_error();
        tracing::warn!(
            "PR_SET_IO_FLUSHER not set ({e}): a client on this host whose memory \
             reclaim writes to this server's device could deadlock under memory pressure"
        );
    } else {
        tracing::debug!("PR_SET_IO_FLUSHER set");
    }
}

fn export_name(path: &Path) -> String {
    path.file_stem()
        .map_or_else(|| "volume".into(), |s| s.to_string_lossy().into_owned())
}

/// The default engine, reporting itself saturated (the drill behind
/// `--simulate-saturated-engine`).
fn saturated_engine() -> Arc<dyn squeeze_codec::CompressEngine> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    Arc::new(squeeze_codec::Saturated(
        squeeze_codec::isal::default_engine(cores),
    ))
}

/// The machine's busy share for the adaptive codec, one reader per volume
/// (a reading covers the time since that volume's previous one); None,
/// said once, where /proc/stat cannot be read.
fn cpu_source() -> Option<Arc<dyn squeeze_engine::pipeline::headroom::BusySource>> {
    match squeeze_engine::pipeline::headroom::ProcStat::source() {
        Ok(s) => Some(s),
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "cannot read the machine's CPU time ({e}): the adaptive codec follows the compression threads' backlog only"
                )
            });
            None
        }
    }
}

fn open_or_create(path: &Path, a: &Args) -> Result<Volume> {
    let serving = || {
        open_volume_with(
            path,
            OpenOptions {
                background: true,
                no_idle_merge: a.no_idle_merge,
                accept_loss: a.accept_loss,
                prewrite: a.prewrite,
                no_adapt: a.no_adapt,
                adapt_cpu: if a.no_adapt || a.no_cpu_adapt {
                    None
                } else {
                    cpu_source()
                },
                map_cache: a.map_cache,
                engine: a.simulate_saturated_engine.then(saturated_engine),
                gc: Some(squeeze_engine::GcPolicy {
                    garbage_budget: a.gc_budget / 100.0,
                }),
                ..Default::default()
            },
        )
    };
    if path.exists() {
        return serving();
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut o = CreateOptions::new(a.size);
    o.policy = a.policy.apply(default_policy())?;
    let v = create_volume(path, &o)?;
    noteln!(
        "created {} ({} logical, thin)",
        path.display(),
        human(a.size)
    );
    // Reopen with the background thread running.
    v.close()?;
    serving()
}

pub fn run(a: Args) -> Result<ExitCode> {
    // Bad TLS flags or files fail before any volume is opened or created.
    let tls = tls_config(&a)?;
    set_io_flusher();
    let paths = if a.paths.is_empty() {
        vec![PathBuf::from(DEFAULT_DIR).join("default.sqz")]
    } else {
        a.paths.clone()
    };
    let mut devices: Vec<(String, Arc<VolumeDevice>)> = Vec::new();
    for p in &paths {
        let name = export_name(p);
        if devices.iter().any(|(n, _)| *n == name) {
            bail!("two volumes would share the export name {name:?}");
        }
        let vol = open_or_create(p, &a)?;
        // A volume made before sizes were capped: its clients would see a
        // negative size, or none.
        if vol.size() > MAX_LOGICAL_SIZE {
            bail!(
                "{}: logical size {} bytes is more than NBD clients can take \
                 (at most {MAX_LOGICAL_SIZE} bytes): shrink it first with \
                 `squeeze resize {} --size SIZE`",
                p.display(),
                vol.size(),
                p.display()
            );
        }
        devices.push((name, Arc::new(VolumeDevice { vol })));
    }
    let exports: Vec<Export> = devices
        .iter()
        .zip(&paths)
        .map(|((name, dev), p)| Export {
            name: name.clone(),
            description: format!("squeeze volume {}", p.display()),
            device: dev.clone() as Arc<dyn BlockDevice>,
        })
        .collect();
    let mut config = ServerConfig::default();
    if let Some(w) = a.workers {
        config.workers = w.max(1);
    }
    // Without --write-workers the volumes' own declaration
    // (`VolumeDevice::max_concurrent_writes`) sizes the write slots.
    if let Some(w) = a.write_workers {
        config.write_workers = Some(w.max(1));
    }
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
    let tls_mode = config.tls.as_ref().map(|t| t.mode());
    let visible: Vec<String> = devices
        .iter()
        .map(|d| d.0.clone())
        .filter(|n| a.allow_export.is_empty() || a.allow_export.contains(n))
        .collect();
    let server = Server::with_config(exports, config).map_err(|e| anyhow::anyhow!("{e}"))?;

    let mut listeners = Vec::new();
    if let Some(s) = &a.socket {
        listeners.push(Listener::bind_unix(s).with_context(|| format!("binding {}", s.display()))?);
    }
    if a.listen.is_some() || a.socket.is_none() {
        let addr = a.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        listeners.push(Listener::bind_tcp(addr).with_context(|| format!("listening on {addr}"))?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let control_path = a
        .control
        .clone()
        .unwrap_or_else(|| paths[0].with_extension("ctl"));
    let control = bind_control(&control_path)?;
    let stats_devices: Arc<Vec<(String, Arc<VolumeDevice>)>> = Arc::new(devices.clone());
    // The statistics threads hold clones of the devices and of the server;
    // they are stopped and joined before the volumes are closed, so that the
    // final checkpoint (Volume::close) runs.
    let mut helpers = Vec::new();
    {
        let devs = stats_devices.clone();
        let srv = server.clone();
        let stop = stop.clone();
        helpers.push(
            std::thread::Builder::new()
                .name("sqz-control".into())
                .spawn(move || control_loop(control, &devs, &srv, &stop))?,
        );
    }
    let mut metrics_addr = None;
    if let Some(m) = &a.metrics {
        let l = TcpListener::bind(m).with_context(|| format!("metrics listener on {m}"))?;
        metrics_addr = Some(l.local_addr()?);
        let devs = stats_devices.clone();
        let srv = server.clone();
        let stop = stop.clone();
        helpers.push(
            std::thread::Builder::new()
                .name("sqz-metrics".into())
                .spawn(move || metrics_loop(l, &devs, &srv, &stop))?,
        );
    }
    {
        // The low-space warning in the log, once per crossing each way.
        let devs = stats_devices.clone();
        let stop = stop.clone();
        helpers.push(
            std::thread::Builder::new()
                .name("sqz-space".into())
                .spawn(move || space_watch(&devs, &stop))?,
        );
    }
    drop(stats_devices);
    let fuse = match &a.fuse_dir {
        Some(dir) => Some(super::serve_fuse::FuseExport::mount(
            dir,
            devices.clone(),
            volume_write_slots(),
        )?),
        None => None,
    };

    print_connect_help(
        &listeners,
        &visible,
        tls_mode,
        &control_path,
        a.metrics.as_deref(),
    );
    if let Some(f) = &fuse {
        for name in &visible {
            noteln!(
                "  block device: losetup -f --show {}",
                f.dir().join(name).display()
            );
        }
    }

    // Signals: stop accepting, let in-flight requests finish.
    let handle = server.shutdown_handle();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    std::thread::Builder::new()
        .name("sqz-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "shutting down");
                noteln!("squeeze serve: signal {sig}, finishing in-flight requests");
                handle.shutdown();
            }
        })?;
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            let srv = server.clone();
            std::thread::spawn(move || srv.serve(l))
        })
        .collect();
    let mut result = Ok(());
    for t in threads {
        if let Err(e) = t.join().expect("serve thread") {
            result = Err(e);
        }
    }
    // Every connection is closed and every dispatched request answered.
    server.shutdown_handle().shutdown();
    stop.store(true, Ordering::SeqCst);
    // Wake the statistics threads out of accept().
    let _ = UnixStream::connect(&control_path);
    if let Some(m) = metrics_addr {
        let _ = std::net::TcpStream::connect(m);
    }
    for h in helpers {
        let _ = h.join();
    }
    let _ = std::fs::remove_file(&control_path);
    drop(server);
    // The FUSE export: later requests fail, the mount goes (lazily), and
    // its references to the volumes with it.
    if let Some(f) = fuse {
        f.stop();
    }
    let mut failed = false;
    for (name, dev) in devices {
        if let Err(e) = dev.vol.flush() {
            noteln!("squeeze serve: flushing {name}: {e}");
            failed = true;
        }
        // Connection threads drop their references as they finish; wait for
        // the last one (a busy machine may take a moment) so that close()
        // can write the final checkpoint and the clean mark.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut dev = dev;
        let closed = loop {
            match Arc::try_unwrap(dev) {
                // Flush, final checkpoint, clean mark.
                Ok(d) => break d.vol.close(),
                Err(d) if std::time::Instant::now() < deadline => {
                    dev = d;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(d) => {
                    noteln!(
                        "squeeze serve: {name} still in use 10 s after the drain; \
                         checkpointing without the clean mark"
                    );
                    break d.vol.checkpoint();
                }
            }
        };
        if let Err(e) = closed {
            noteln!("squeeze serve: closing {name}: {e}");
            failed = true;
        }
    }
    result.context("serving")?;
    if failed {
        return Ok(ExitCode::FAILURE);
    }
    noteln!("squeeze serve: volumes flushed and checkpointed; bye");
    Ok(ExitCode::SUCCESS)
}

fn print_connect_help(
    listeners: &[Listener],
    exports: &[String],
    tls: Option<TlsMode>,
    control: &Path,
    metrics: Option<&str>,
) {
    let first = &exports[0];
    // libnbd spells TLS with an "s"; qemu needs a tls-creds object.
    for l in listeners {
        let (uri, tls_uri, qemu_tls) = match l {
            Listener::Tcp(t) => {
                let a = t
                    .local_addr()
                    .map_or_else(|_| DEFAULT_LISTEN.into(), |a| a.to_string());
                let (host, port) = a.rsplit_once(':').unwrap_or((&a, "10809"));
                (
                    format!("nbd://{a}/{first}"),
                    format!("nbds://{a}/{first}?tls-certificates=CERTDIR"),
                    format!("driver=nbd,server.type=inet,server.host={host},server.port={port},export={first},tls-creds=tls0"),
                )
            }
            Listener::Unix(_, p) => (
                format!("nbd+unix:///{first}?socket={}", p.display()),
                format!(
                    "nbds+unix:///{first}?socket={}&tls-certificates=CERTDIR",
                    p.display()
                ),
                format!(
                    "driver=nbd,server.type=unix,server.path={},export={first},tls-creds=tls0,tls-hostname=localhost",
                    p.display()
                ),
            ),
        };
        noteln!("squeeze serve: listening on {}", l.describe());
        noteln!("  exports: {}", exports.join(", "));
        if let Some(mode) = tls {
            let m = if mode == TlsMode::Require {
                "required"
            } else {
                "offered"
            };
            noteln!("  TLS {m}; CERTDIR holds ca-cert.pem (and client-cert.pem, client-key.pem);");
            noteln!("  qemu's tls-hostname is a name in the server certificate");
            noteln!("  nbdinfo '{tls_uri}'");
            noteln!(
                "  qemu-img info --object tls-creds-x509,id=tls0,endpoint=client,dir=CERTDIR --image-opts '{qemu_tls}'"
            );
            if mode == TlsMode::Require {
                continue;
            }
        }
        noteln!("  qemu-img info '{uri}'");
        noteln!("  qemu-io -f raw '{uri}' -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M'");
        noteln!("  nbdinfo --map '{uri}'");
        noteln!("  nbdfuse /mnt/squeeze '{uri}'");
        if let Listener::Tcp(t) = l {
            if let Ok(a) = t.local_addr() {
                noteln!("  nbd-client {} {} /dev/nbd0 -N {first}", a.ip(), a.port());
            }
        }
        noteln!("  fio --ioengine=nbd --uri='{uri}' --rw=write --bs=128k --iodepth=32 --size=1g --name=w");
    }
    noteln!("  squeeze stats {}", control.display());
    if let Some(m) = metrics {
        noteln!("  curl http://{m}/metrics");
    }
}

fn bind_control(path: &Path) -> Result<UnixListener> {
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

fn stats_json(devs: &[(String, Arc<VolumeDevice>)], srv: &Server) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (name, d) in devs {
        m.insert(
            name.clone(),
            serde_json::to_value(d.vol.stats()).expect("stats"),
        );
    }
    serde_json::json!({ "volumes": m, "server": server_json(&srv.stats()) })
}

/// The NBD server's counters as JSON.
fn server_json(s: &squeeze_nbd::ServerStats) -> serde_json::Value {
    let r = &s.requests;
    serde_json::json!({
        "connections_open": s.connections_open,
        "connections_total": s.connections_total,
        "requests_in_flight": s.requests_in_flight,
        "bytes_read": s.bytes_read,
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

/// The control socket, one client at a time: at most one request line
/// of JSON (`docs/ARCHITECTURE.md`, "Control socket"), then one answer and
/// the connection closes. No request (the client shuts its side, or sends
/// nothing for 2 s) asks for the statistics.
fn control_loop(
    l: UnixListener,
    devs: &[(String, Arc<VolumeDevice>)],
    srv: &Server,
    stop: &AtomicBool,
) {
    for conn in l.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut c) = conn else { continue };
        let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        let mut line = String::new();
        let read = BufReader::new((&mut c).take(CONTROL_REQUEST_MAX)).read_line(&mut line);
        let body = match read {
            Ok(_) if line.trim().is_empty() => stats_json(devs, srv),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                stats_json(devs, srv)
            }
            Err(e) => serde_json::json!({ "error": format!("reading the request: {e}") }),
            Ok(_) => match control_request(line.trim(), devs, srv) {
                Ok(v) => v,
                Err(e) => serde_json::json!({ "error": crate::util::error_text(&e) }),
            },
        };
        let _ = c.write_all(body.to_string().as_bytes());
    }
}

/// Logs a warning when a volume's free physical room falls under 10% of
/// its cap (`VolumeStats::space_warning`), and a note when it is back above,
/// checking four times a second until `stop`: a client filling a volume at
/// 500 MB/s crosses the last 10% of a 3 GiB cap in about 0.6 s
/// (bench/ceph_thin.sh), so the warning must come from a short poll.
fn space_watch(devs: &[(String, Arc<VolumeDevice>)], stop: &AtomicBool) {
    let mut low = vec![false; devs.len()];
    while !stop.load(Ordering::SeqCst) {
        for (i, (name, d)) in devs.iter().enumerate() {
            let sp = d.vol.space();
            match (&sp.warning, low[i]) {
                (Some(w), false) => {
                    tracing::warn!(volume = %name, free = sp.free_physical, "{w}");
                    low[i] = true;
                }
                (None, true) => {
                    tracing::info!(volume = %name, free = sp.free_physical,
                        "physical space is no longer low");
                    low[i] = false;
                }
                _ => {}
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Longest request line the control socket reads.
const CONTROL_REQUEST_MAX: u64 = 64 << 10;

fn control_request(
    line: &str,
    devs: &[(String, Arc<VolumeDevice>)],
    srv: &Server,
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
        "stats" => Ok(stats_json(devs, srv)),
        "set" => {
            let (name, dev) = pick()?;
            let policy = req.policy.as_ref().filter(|p| p.given());
            if policy.is_none() && req.max_physical.is_none() {
                bail!("set: nothing to change");
            }
            // All or nothing: every change is checked before any is made.
            let policy = policy.map(|p| p.apply(dev.vol.policy())).transpose()?;
            dev.vol.set_settings(policy, req.max_physical)?;
            tracing::info!(volume = %name, "settings changed through the control socket");
            Ok(serde_json::json!({
                "ok": true,
                "volume": name,
                "policy": policy_json(&dev.vol.policy()),
                "max_physical": dev.vol.superblock().max_physical,
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

fn metrics_loop(
    l: TcpListener,
    devs: &[(String, Arc<VolumeDevice>)],
    srv: &Server,
    stop: &AtomicBool,
) {
    for conn in l.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut c) = conn else { continue };
        let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        // Read the request line and the headers up to the blank line: closing
        // with unread request bytes would make the kernel answer with a RST,
        // and the client could lose the response.
        let mut first = String::new();
        {
            let mut r = BufReader::new((&mut c).take(16 << 10));
            if r.read_line(&mut first).is_err() {
                continue;
            }
            let mut line = String::new();
            while first.starts_with("GET")
                && matches!(r.read_line(&mut line), Ok(n) if n > 0)
                && !line.trim_end().is_empty()
            {
                line.clear();
            }
        }
        let path = first.split_whitespace().nth(1).unwrap_or("/");
        let (status, ctype, body) = match path {
            "/metrics" => ("200 OK", "text/plain; version=0.0.4", prometheus(devs, srv)),
            "/stats" => (
                "200 OK",
                "application/json",
                stats_json(devs, srv).to_string(),
            ),
            _ => (
                "404 Not Found",
                "text/plain",
                "try /metrics or /stats\n".into(),
            ),
        };
        let reply = format!(
            "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = c.write_all(reply.as_bytes());
        let _ = c.shutdown(std::net::Shutdown::Write);
    }
}

/// The statistics in Prometheus text exposition format.
pub fn prometheus(devs: &[(String, Arc<VolumeDevice>)], srv: &Server) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, help: &str, kind: &str, vals: Vec<(String, f64)>| {
        out.push_str(&format!(
            "# HELP squeeze_{name} {help}\n# TYPE squeeze_{name} {kind}\n"
        ));
        for (export, v) in vals {
            out.push_str(&format!("squeeze_{name}{{export=\"{export}\"}} {v}\n"));
        }
    };
    let stats: Vec<(String, VolumeStats)> = devs
        .iter()
        .map(|(n, d)| (n.clone(), d.vol.stats()))
        .collect();
    macro_rules! m {
        ($name:literal, $help:literal, $kind:literal, $f:expr) => {
            metric(
                $name,
                $help,
                $kind,
                stats
                    .iter()
                    .map(|(n, s)| (n.clone(), $f(s) as f64))
                    .collect(),
            )
        };
    }
    m!(
        "logical_size_bytes",
        "Logical size of the volume.",
        "gauge",
        |s: &VolumeStats| s.logical_size
    );
    m!(
        "written_bytes_total",
        "Bytes clients wrote.",
        "counter",
        |s: &VolumeStats| s.bytes_written
    );
    m!(
        "read_bytes_total",
        "Bytes clients read.",
        "counter",
        |s: &VolumeStats| s.bytes_read
    );
    m!(
        "mapped_bytes",
        "Non-zero logical data.",
        "gauge",
        |s: &VolumeStats| s.mapped_bytes
    );
    m!(
        "stored_bytes",
        "Live compressed extents.",
        "gauge",
        |s: &VolumeStats| s.stored_bytes
    );
    m!(
        "physical_bytes",
        "Bytes the backing file occupies on disk.",
        "gauge",
        |s: &VolumeStats| s.physical_bytes
    );
    m!(
        "free_physical_bytes",
        "Room left under the physical cap.",
        "gauge",
        |s: &VolumeStats| s.free_physical_bytes
    );
    m!(
        "physical_limit_bytes",
        "The --max-physical cap (0: none).",
        "gauge",
        |s: &VolumeStats| s.physical_limit_bytes
    );
    m!(
        "space_low",
        "1 while less than 10% of the physical cap is left (the alert rule in docs/CEPH.md).",
        "gauge",
        |s: &VolumeStats| u64::from(s.space_warning.is_some())
    );
    m!(
        "compression_ratio",
        "Mapped bytes over stored bytes.",
        "gauge",
        |s: &VolumeStats| s.compression_ratio
    );
    m!(
        "blobs_compressed_total",
        "Blobs stored compressed.",
        "counter",
        |s: &VolumeStats| s.blobs_compressed
    );
    m!(
        "blobs_rejected_total",
        "Blobs over the required ratio, stored raw.",
        "counter",
        |s: &VolumeStats| s.blobs_rejected
    );
    m!(
        "blobs_skipped_total",
        "Blobs the heuristic or mode kept from the codec.",
        "counter",
        |s: &VolumeStats| s.blobs_skipped
    );
    m!(
        "compress_cpu_seconds_total",
        "CPU seconds compressing.",
        "counter",
        |s: &VolumeStats| s.compress_cpu_seconds
    );
    m!(
        "decompress_cpu_seconds_total",
        "CPU seconds decompressing.",
        "counter",
        |s: &VolumeStats| s.decompress_cpu_seconds
    );
    m!(
        "garbage_bytes",
        "Dead bytes in sealed log segments (what cleaning can reclaim).",
        "gauge",
        |s: &VolumeStats| s.garbage_bytes
    );
    m!(
        "garbage_budget_ratio",
        "Share of the sealed log dead bytes may reach before the cleaner copies (the budget in force).",
        "gauge",
        |s: &VolumeStats| s.garbage_budget
    );
    m!(
        "cleaner_over_budget_bytes_total",
        "Record bytes the cleaner relocated because dead bytes exceeded the garbage budget.",
        "counter",
        |s: &VolumeStats| s.cleaner_over_budget_bytes
    );
    m!(
        "cleaner_idle_bytes_total",
        "Record bytes the cleaner relocated while clients were idle, under the budget.",
        "counter",
        |s: &VolumeStats| s.cleaner_idle_bytes
    );
    m!(
        "cleaner_short_of_room_bytes_total",
        "Record bytes the cleaner relocated because free segments ran short.",
        "counter",
        |s: &VolumeStats| s.cleaner_space_bytes
    );
    m!(
        "merged_bytes_total",
        "Logical bytes the merger rewrote as whole blobs while clients were idle.",
        "counter",
        |s: &VolumeStats| s.merged_bytes
    );
    m!(
        "below_target_bytes_total",
        "Raw bytes of client writes stored with a faster codec than the policy's while the compression threads were behind or the cores busy.",
        "counter",
        |s: &VolumeStats| s.below_target_bytes
    );
    m!(
        "cpu_busy_ratio",
        "The machine's busy CPU share at the adaptive codec's last reading (0 without the CPU signal).",
        "gauge",
        |s: &VolumeStats| s.cpu_busy.unwrap_or(0.0)
    );
    m!(
        "below_target_pending_bytes",
        "Raw bytes written below the policy's codec that the idle upgrade has still to rewrite (upper bound).",
        "gauge",
        |s: &VolumeStats| s.below_target_pending_bytes
    );
    m!(
        "upgraded_bytes_total",
        "Raw bytes the idle upgrade rewrote with the policy's codec.",
        "counter",
        |s: &VolumeStats| s.upgraded_bytes
    );
    m!(
        "upgrade_seconds_total",
        "Wall-clock seconds the idle upgrade spent (upgraded_bytes_total over it is the upgrade rate).",
        "counter",
        |s: &VolumeStats| s.upgrade_seconds
    );
    m!(
        "prewritten_bytes_total",
        "Zeros written past the log head before small flushes, so commits overwrite written blocks (part of write_amplification).",
        "counter",
        |s: &VolumeStats| s.prewritten_bytes
    );
    m!(
        "segments_waiting",
        "Log segments with nothing live in them waiting for a checkpoint to free them (freed in batches while clients write).",
        "gauge",
        |s: &VolumeStats| s.segments_waiting
    );
    m!(
        "write_amplification",
        "Backing bytes written per stored client byte (log, checkpoints and pre-written zeros).",
        "gauge",
        |s: &VolumeStats| s.write_amplification
    );
    m!(
        "checksum_errors_total",
        "Reads that failed a checksum.",
        "counter",
        |s: &VolumeStats| s.checksum_errors
    );
    m!(
        "map_memory_bytes",
        "RAM used by the sector map.",
        "gauge",
        |s: &VolumeStats| s.map_memory_bytes
    );
    m!(
        "map_cache_bytes",
        "RAM the sector map may use before chunks page out.",
        "gauge",
        |s: &VolumeStats| s.map_cache_bytes
    );
    m!(
        "map_paged_chunks",
        "Map chunks (2 MiB of logical space each) paged out to the checkpoint chain.",
        "gauge",
        |s: &VolumeStats| s.map_paged_chunks
    );
    m!(
        "map_faults_total",
        "Map chunks read back from the checkpoint chain.",
        "counter",
        |s: &VolumeStats| s.map_faults
    );
    m!(
        "damaged_opens_total",
        "Opens that found damage (a superblock slot, flushed records gone, a file cut short) and went on.",
        "counter",
        |s: &VolumeStats| s.damaged_opens
    );
    m!(
        "lost_flushed_records_total",
        "Flushed log records found missing at open whose loss was accepted (--accept-loss).",
        "counter",
        |s: &VolumeStats| s.lost_flushed_records
    );
    m!(
        "checkpoint_chain_bytes",
        "Bytes of the checkpoint chain recovery reads (base and deltas).",
        "gauge",
        |s: &VolumeStats| s.checkpoint_base_bytes + s.checkpoint_delta_bytes
    );
    m!(
        "checkpoint_base_bytes",
        "Bytes of the checkpoint chain's base piece (the whole map).",
        "gauge",
        |s: &VolumeStats| s.checkpoint_base_bytes
    );
    m!(
        "open_seconds",
        "Seconds the last open took (recovery included).",
        "gauge",
        |s: &VolumeStats| s.open_seconds
    );
    m!(
        "read_only",
        "1 when the volume turned read-only after an I/O failure.",
        "gauge",
        |s: &VolumeStats| u32::from(s.read_only_reason.is_some())
    );
    let n = srv.stats();
    for (name, help, kind, v) in [
        (
            "nbd_connections_open",
            "NBD connections open.",
            "gauge",
            n.connections_open,
        ),
        (
            "nbd_connections_total",
            "NBD connections accepted.",
            "counter",
            n.connections_total,
        ),
        (
            "nbd_requests_in_flight",
            "NBD requests being served.",
            "gauge",
            n.requests_in_flight,
        ),
        (
            "nbd_requests_total",
            "NBD requests received.",
            "counter",
            n.requests.total(),
        ),
        (
            "nbd_errors_total",
            "NBD requests answered with an error.",
            "counter",
            n.errors,
        ),
        (
            "nbd_protocol_errors_total",
            "NBD connections closed for a protocol violation.",
            "counter",
            n.protocol_errors,
        ),
    ] {
        out.push_str(&format!(
            "# HELP squeeze_{name} {help}\n# TYPE squeeze_{name} {kind}\nsqueeze_{name} {v}\n"
        ));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    /// NBD has no authentication: without --listen, TCP is loopback only.
    #[test]
    fn default_listen_address_is_loopback() {
        let a: std::net::SocketAddr = DEFAULT_LISTEN.parse().unwrap();
        assert!(a.ip().is_loopback());
    }

    /// A served volume declares the compressing write limit, and the NBD
    /// server's write slots are that, unless --write-workers overrides it.
    #[test]
    fn volumes_declare_the_write_slots_the_server_uses() {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        assert_eq!(volume_write_slots(), (cores * 2).clamp(4, 64));
        let dir = std::env::temp_dir().join(format!("sqz-serve-slots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.sqz");
        let _ = std::fs::remove_file(&path);
        let vol = create_volume(&path, &CreateOptions::new(1 << 20)).unwrap();
        let dev = Arc::new(VolumeDevice { vol });
        assert_eq!(dev.max_concurrent_writes(), volume_write_slots());
        let export = |d: &Arc<VolumeDevice>| Export {
            name: "v".into(),
            description: String::new(),
            device: d.clone() as Arc<dyn BlockDevice>,
        };
        let server = Server::with_config(vec![export(&dev)], ServerConfig::default()).unwrap();
        assert_eq!(server.write_slots(), volume_write_slots());
        drop(server);
        let config = ServerConfig {
            write_workers: Some(2),
            ..ServerConfig::default()
        };
        let server = Server::with_config(vec![export(&dev)], config).unwrap();
        assert_eq!(server.write_slots(), 2);
        drop(server);
        drop(dev);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
