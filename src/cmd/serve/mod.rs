//! `squeeze serve`: the engine's volumes served over NBD (and, with
//! `--fuse-dir`, as files of a FUSE file system; with `--ublk`, as Linux
//! block devices /dev/ublkbN), through the one adapter between the front
//! ends and the engine (`device`).
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
//!
//! The rooms: `args` (the options, TLS, the NBD server's configuration),
//! `volumes` (opening, creating and closing the served volumes), `device`
//! (the adapter), `fuse` (the FUSE export), `ublk` (the ublk devices:
//! adding, taking over after a crash, removing), `ublk_queue` (their
//! queues: requests to the adapter) and `ublk_stats` (their counters),
//! `control` (the control
//! socket's server), `metrics` (Prometheus over HTTP), `accept` (the accept
//! loop those two share), `watch` (the low-space watcher), `stats_threads`
//! (starting and stopping those three) and `connect_help` (what the server
//! prints on start); `run` here starts them, serves until a signal, and
//! shuts them down in order.

mod accept;
mod args;
mod connect_help;
mod control;
mod device;
mod fuse;
mod metrics;
mod stats_threads;
mod ublk;
mod ublk_queue;
mod ublk_stats;
mod volumes;
mod watch;

pub use args::Args;

use anyhow::{Context, Result};
use args::{server_config, tls_config, ublk_options, DEFAULT_DIR, DEFAULT_LISTEN};
use connect_help::print_connect_help;
use device::volume_write_slots;
use squeeze_nbd::{BlockDevice, Export, Listener, Server};
use stats_threads::StatsThreads;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

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

pub fn run(a: Args) -> Result<ExitCode> {
    // Bad TLS flags or files fail before any volume is opened or created.
    let tls = tls_config(&a)?;
    if a.ublk {
        ublk::check_driver()?;
    }
    set_io_flusher();
    let paths = if a.paths.is_empty() {
        vec![PathBuf::from(DEFAULT_DIR).join("default.sqz")]
    } else {
        a.paths.clone()
    };
    let devices = volumes::open_all(&paths, &a)?;
    let exports: Vec<Export> = devices
        .iter()
        .zip(&paths)
        .map(|((name, dev), p)| Export {
            name: name.clone(),
            description: format!("squeeze volume {}", p.display()),
            device: dev.clone() as Arc<dyn BlockDevice>,
        })
        .collect();
    let config = server_config(&a, &devices, tls)?;
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
    // With --ublk, NBD only where asked for.
    if a.listen.is_some() || (a.socket.is_none() && !a.ublk) {
        let addr = a.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        listeners.push(Listener::bind_tcp(addr).with_context(|| format!("listening on {addr}"))?);
    }
    let control_path = a
        .control
        .clone()
        .unwrap_or_else(|| paths[0].with_extension("ctl"));
    let ublk_registry = ublk_stats::UblkRegistry::default();
    let stats = StatsThreads::start(
        &control_path,
        a.metrics.as_deref(),
        &devices,
        &server,
        &ublk_registry,
    )?;
    let fuse = match &a.fuse_dir {
        Some(dir) => Some(fuse::FuseExport::mount(
            dir,
            devices.clone(),
            volume_write_slots(),
        )?),
        None => None,
    };

    let ublk = if a.ublk {
        match ublk::UblkExport::start(&devices, &paths, &ublk_options(&a), &ublk_registry) {
            Ok(u) => Some(u),
            Err(e) => {
                if let Some(f) = fuse {
                    f.stop();
                }
                stats.stop();
                return Err(e);
            }
        }
    } else {
        None
    };

    print_connect_help(
        &listeners,
        &visible,
        tls_mode,
        &control_path,
        a.metrics.as_deref(),
    );
    if let Some(u) = &ublk {
        for (name, dev, recovered) in u.devices() {
            let how = if recovered {
                "taken over from a server that died"
            } else {
                "added"
            };
            noteln!("  block device: {dev} (volume {name}; ublk, {how})");
        }
    }
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
    let (signalled_tx, signalled) = crossbeam_channel::bounded::<()>(1);
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
                let _ = signalled_tx.send(());
            }
        })?;
    // Without a listener (--ublk alone) nothing else waits for the signal.
    let no_listener = listeners.is_empty();
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            let srv = server.clone();
            std::thread::spawn(move || srv.serve(l))
        })
        .collect();
    if no_listener {
        let _ = signalled.recv();
    }
    let mut result = Ok(());
    for t in threads {
        if let Err(e) = t.join().expect("serve thread") {
            result = Err(e);
        }
    }
    // Every connection is closed and every dispatched request answered.
    server.shutdown_handle().shutdown();
    stats.stop();
    drop(server);
    // The FUSE export: later requests fail, the mount goes (lazily), and
    // its references to the volumes with it.
    if let Some(f) = fuse {
        f.stop();
    }
    // The ublk devices: requests the kernel sent are answered, then the
    // devices go.
    if let Some(u) = ublk {
        u.stop();
    }
    let failed = volumes::close_all(devices);
    result.context("serving")?;
    if failed {
        return Ok(ExitCode::FAILURE);
    }
    noteln!("squeeze serve: volumes flushed and checkpointed; bye");
    Ok(ExitCode::SUCCESS)
}
