//! The threads beside the NBD server that read the volumes' statistics:
//! the control socket (`sqz-control`), the `--metrics` listener
//! (`sqz-metrics`) and the low-space watcher (`sqz-space`). They hold
//! clones of the devices and of the server; they are stopped and joined
//! before the volumes are closed, so that the final checkpoint
//! (Volume::close) runs.

use super::control::{bind_control, control_loop};
use super::device::VolumeDevice;
use super::metrics::metrics_loop;
use super::ublk_stats::UblkRegistry;
use super::watch::space_watch;
use anyhow::{Context, Result};
use squeeze_nbd::Server;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub(super) struct StatsThreads {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    control_path: PathBuf,
    metrics_addr: Option<SocketAddr>,
}

impl StatsThreads {
    /// Binds the control socket at `control_path` and, with `metrics`, the
    /// metrics listener, and starts the three threads.
    pub(super) fn start(
        control_path: &Path,
        metrics: Option<&str>,
        devices: &[(String, Arc<VolumeDevice>)],
        server: &Server,
        ublk: &UblkRegistry,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let control = bind_control(control_path)?;
        let stats_devices: Arc<Vec<(String, Arc<VolumeDevice>)>> = Arc::new(devices.to_vec());
        let mut threads = Vec::new();
        {
            let devs = stats_devices.clone();
            let srv = server.clone();
            let ublk = ublk.clone();
            let stop = stop.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("sqz-control".into())
                    .spawn(move || control_loop(control, &devs, &srv, &ublk, &stop))?,
            );
        }
        let mut metrics_addr = None;
        if let Some(m) = metrics {
            let l = TcpListener::bind(m).with_context(|| format!("metrics listener on {m}"))?;
            metrics_addr = Some(l.local_addr()?);
            let devs = stats_devices.clone();
            let srv = server.clone();
            let ublk = ublk.clone();
            let stop = stop.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("sqz-metrics".into())
                    .spawn(move || metrics_loop(l, &devs, &srv, &ublk, &stop))?,
            );
        }
        {
            // The low-space warning in the log, once per crossing each way.
            let devs = stats_devices.clone();
            let stop = stop.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("sqz-space".into())
                    .spawn(move || space_watch(&devs, &stop))?,
            );
        }
        Ok(Self {
            stop,
            threads,
            control_path: control_path.to_path_buf(),
            metrics_addr,
        })
    }

    /// Stops and joins the threads, and removes the control socket.
    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the statistics threads out of accept().
        let _ = UnixStream::connect(&self.control_path);
        if let Some(m) = self.metrics_addr {
            let _ = TcpStream::connect(m);
        }
        for h in self.threads {
            let _ = h.join();
        }
        let _ = std::fs::remove_file(&self.control_path);
    }
}
