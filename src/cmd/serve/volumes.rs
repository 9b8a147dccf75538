//! The served volumes: opened (a missing one created) with the engine
//! options the flags ask for, each named after its file, and closed at
//! the end.

use super::args::Args;
use super::device::VolumeDevice;
use crate::util::{create_volume, human, open_volume_io};
use anyhow::{bail, Context, Result};
use squeeze_engine::{
    default_policy, CreateOptions, IoMode, OpenOptions, Volume, MAX_LOGICAL_SIZE,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    // A ublk device outlives a crash of this server, and the file system
    // on it goes on trusting every write it was answered: the ublk queues
    // write the pool out before they answer (ublk_queue.rs), in either
    // mode (docs/ARCHITECTURE.md, "ublk"). An nbd device under `squeeze
    // nbd-attach` outlives it too, but NBD answers a write before the
    // pool is written out: with `--restartable` those writes go through
    // the page cache, so that they outlive the process.
    let io = if a.restartable {
        IoMode::Buffered
    } else {
        IoMode::from_env()
    };
    let serving = || {
        open_volume_io(
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
                dedup_inline_sample: a.dedup_sample,
                burst_floor: a.burst_floor,
                engine: a.simulate_saturated_engine.then(saturated_engine),
                gc: Some(squeeze_engine::GcPolicy {
                    garbage_budget: a.gc_budget / 100.0,
                }),
                ..Default::default()
            },
            io,
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

/// Opens every volume of `paths` (creating a missing one), each as the
/// export named after its file: refused when two would share a name or a
/// volume is larger than NBD clients can take.
pub(super) fn open_all(paths: &[PathBuf], a: &Args) -> Result<Vec<(String, Arc<VolumeDevice>)>> {
    let mut devices: Vec<(String, Arc<VolumeDevice>)> = Vec::new();
    for p in paths {
        let name = export_name(p);
        if devices.iter().any(|(n, _)| *n == name) {
            bail!("two volumes would share the export name {name:?}");
        }
        let vol = open_or_create(p, a)?;
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
    Ok(devices)
}

/// Flushes and closes every volume once the server is down: waits up to
/// 10 s for the last connection thread to drop its reference, then
/// checkpoints without the clean mark. True if any flush or close failed.
pub(super) fn close_all(devices: Vec<(String, Arc<VolumeDevice>)>) -> bool {
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
    failed
}
