//! `squeeze serve --ublk`: each served volume as a Linux block device,
//! /dev/ublkbN, served from this process over io_uring (the kernel's
//! ublk_drv, Linux 6.0 or later, through the `libublk` crate). The queues
//! (`ublk_queue`) run every request on the one device adapter
//! (`device::VolumeDevice`) that NBD and the FUSE export use; nothing here
//! knows of compression.
//!
//! What the kernel is told: the volume's size; 512-byte logical and 4 KiB
//! physical blocks; a volatile write cache with FUA (so it sends FLUSH, and
//! FUA writes, which reach the engine's flush); discard and write-zeroes
//! in 4 KiB granules, up to `DISCARD_SECTORS_MAX` a request (trim and the
//! zero path); requests up to `--ublk-max-io` bytes; `--ublk-queues`
//! queues of `--ublk-depth` requests.
//!
//! Surviving our own crash (decision table; "ours" = the device's json in
//! /run/ublksrvd names this volume's uuid):
//!
//! | at start, for a volume | what `start` does |
//! |---|---|
//! | no device ours (and `--ublk-id` free or not given) | adds one (at `--ublk-id`, or the first free id) |
//! | a device ours whose server is gone (SIGKILL, crash) | takes it over: START_USER_RECOVERY (waits for the kernel to quiesce it, up to 30 s), then serves it; requests the dead server held are re-issued |
//! | a device ours whose server still runs | refused: another server serves this volume |
//! | `--ublk-id N` and device N is not ours | refused: it serves another volume, or squeeze cannot tell |
//!
//! Devices are added with UBLK_F_USER_RECOVERY and
//! UBLK_F_USER_RECOVERY_REISSUE: when the server dies the kernel keeps the
//! device and queues its I/O (a mounted file system waits, it sees no
//! error), and requests the dead server had taken are re-issued to the
//! next one (the engine takes a second write of the same bytes as a
//! write). That is only safe if the death lost no write it had answered:
//! the file system above goes on, trusting them. The volumes keep the
//! default write-behind pool (staged log in this process's memory, written
//! with O_DIRECT), so the queues answer a write only once a write-out has
//! handed its bytes to the file (`ublk_queue`: one O_DIRECT write for
//! every write that finished meanwhile); what the file holds outlives the
//! process.
//! A crash of the machine itself takes the file system down too; what
//! was flushed survives it, as on a disk with a volatile cache.
//!
//! A clean stop (SIGINT, SIGTERM) stops and deletes the devices: unmount
//! first, or the file system above gets I/O errors (the server exits all
//! the same; the kernel frees the device once the file system lets go).

use super::device::{volume_write_slots, VolumeDevice};
use super::ublk_queue::{serve_queue, Workers};
use super::ublk_stats::{UblkCounters, UblkDeviceStats, UblkRegistry};
use anyhow::{bail, Context, Result};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::sys;
use libublk::UblkFlags;
use squeeze_nbd::BlockDevice;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The ublk control device: present when the module is loaded.
const CONTROL: &str = "/dev/ublk-control";
/// Where libublk keeps each device's json (`NNNN.json`).
const RUN_DIR: &str = "/run/ublksrvd";
/// Largest DISCARD or WRITE_ZEROES request, in sectors: 4 GiB less a
/// granule (the request's length is a 32-bit byte count in the kernel).
const DISCARD_SECTORS_MAX: u32 = (u32::MAX >> 9) & !7;
/// How long `start` waits for a device to come up (a takeover may wait
/// 30 s for the kernel to quiesce the device).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// `--ublk-*`: the devices' shape.
#[derive(Clone, Debug)]
pub struct UblkOptions {
    pub queues: u16,
    pub depth: u16,
    pub max_io_bytes: u32,
    /// Device ids, one per volume in order; the others are found or
    /// allocated.
    pub ids: Vec<u32>,
}

/// A served device.
struct Running {
    name: String,
    id: u32,
    recovered: bool,
    counters: Arc<UblkCounters>,
    thread: JoinHandle<()>,
}

/// The ublk devices of a server; [`UblkExport::stop`] them before closing
/// the volumes.
pub struct UblkExport {
    running: Vec<Running>,
}

/// How a volume's device comes up.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// ADD_DEV at this id (-1: the kernel picks).
    Add(i32),
    /// START_USER_RECOVERY of the device a dead server left.
    Recover(u32),
}

fn uuid_hex(u: [u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// The volume uuid device `id`'s json names, if any.
fn json_uuid(id: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("{RUN_DIR}/{id:04}.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["target_data"]["squeeze"]["uuid"]
        .as_str()
        .map(str::to_string)
}

/// Whether device `id` exists (sysfs: no udev needed).
fn device_exists(id: u32) -> bool {
    Path::new(&format!("/sys/class/ublk-char/ublkc{id}")).exists()
}

/// Ids of the devices whose json names `uuid`.
fn devices_of(uuid: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(RUN_DIR) else {
        return Vec::new();
    };
    let mut ids: Vec<u32> = dir
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".json")?.parse().ok()
        })
        .filter(|&id| device_exists(id) && json_uuid(id).as_deref() == Some(uuid))
        .collect();
    ids.sort_unstable();
    ids
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// The decision table above, for the volume `uuid` named `name`.
fn plan(name: &str, uuid: &str, wanted: Option<u32>) -> Result<Plan> {
    let id = match wanted {
        Some(id) if !device_exists(id) => return Ok(Plan::Add(id as i32)),
        Some(id) => {
            if json_uuid(id).as_deref() != Some(uuid) {
                bail!(
                    "--ublk-id {id}: /dev/ublkb{id} exists and does not serve volume {name} \
                     (its {RUN_DIR}/{id:04}.json names another volume, or is missing); \
                     pick another id, or remove that device"
                );
            }
            id
        }
        None => match devices_of(uuid).first() {
            Some(&id) => id,
            None => return Ok(Plan::Add(-1)),
        },
    };
    let ctrl =
        UblkCtrl::new_simple(id as i32).map_err(|e| anyhow::anyhow!("ublk device {id}: {e}"))?;
    let info = ctrl.dev_info();
    if u32::from(info.state) == sys::UBLK_S_DEV_LIVE && process_alive(info.ublksrv_pid) {
        bail!(
            "/dev/ublkb{id} serves volume {name} already, from process {}: stop that server first",
            info.ublksrv_pid
        );
    }
    Ok(Plan::Recover(id))
}

/// What the kernel is told of the device (see the header).
fn set_params(dev: &mut UblkDev, size: u64, volume: &Path, uuid: &str) {
    dev.set_default_params(size);
    let p = &mut dev.tgt.params;
    p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
    p.basic.attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
    p.discard = sys::ublk_param_discard {
        discard_alignment: 0,
        discard_granularity: 4096,
        max_discard_sectors: DISCARD_SECTORS_MAX,
        max_write_zeroes_sectors: DISCARD_SECTORS_MAX,
        max_discard_segments: 1,
        reserved0: 0,
    };
    dev.set_target_json(serde_json::json!({
        "squeeze": { "volume": volume.display().to_string(), "uuid": uuid }
    }));
}

/// Threads serving requests other than writes, per device.
fn other_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 8).clamp(16, 128)
}

/// Runs one device until it stops (the thread `sqz-ublk-NAME`): builds it
/// as `plan` says, reports its id (or the failure) on `started`, serves,
/// and deletes it once its queues are down.
fn run_device(
    plan: Plan,
    o: &UblkOptions,
    dev: Arc<VolumeDevice>,
    volume: &Path,
    uuid: &str,
    workers: Workers,
    started: crossbeam_channel::Sender<Result<u32>>,
) {
    let fail = |e: anyhow::Error| {
        let _ = started.send(Err(e));
    };
    let (id, dev_flags) = match plan {
        Plan::Add(id) => (id, UblkFlags::UBLK_DEV_F_ADD_DEV),
        Plan::Recover(id) => {
            let recover =
                UblkCtrl::new_simple(id as i32).and_then(|c| c.start_user_recover().map(|_| ()));
            if let Err(e) = recover {
                return fail(anyhow::anyhow!(
                    "taking over /dev/ublkb{id} (START_USER_RECOVERY): {e}"
                ));
            }
            (id as i32, UblkFlags::UBLK_DEV_F_RECOVER_DEV)
        }
    };
    let ctrl = match UblkCtrlBuilder::default()
        .name("squeeze")
        .id(id)
        .nr_queues(o.queues)
        .depth(o.depth)
        .io_buf_bytes(o.max_io_bytes)
        .ctrl_flags(u64::from(
            sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE,
        ))
        .dev_flags(dev_flags)
        .build()
    {
        Ok(c) => c,
        Err(e) => return fail(anyhow::anyhow!("adding a ublk device: {e}")),
    };
    let size = dev.size();
    let reported = started.clone();
    let r = ctrl.run_target(
        |d| {
            set_params(d, size, volume, uuid);
            Ok(())
        },
        move |qid, d| serve_queue(qid, d, &workers),
        move |c| {
            let _ = reported.send(Ok(c.dev_info().dev_id));
        },
    );
    if let Err(e) = r {
        fail(anyhow::anyhow!("starting the ublk device: {e}"));
    }
    // Queues down (a stop, or the device deleted from outside): remove it.
    // A device taken over is not deleted by the drop of its control. The
    // asynchronous delete (Linux 6.9) does not wait for the block device's
    // last user: a file system still mounted on it (it gets I/O errors
    // now) does not hold the server's exit. Before 6.9 the delete waits.
    if ctrl.del_dev_async().is_err() {
        let _ = ctrl.del_dev();
    }
}

/// Fails unless the kernel's ublk driver is there (before any volume is
/// opened or created).
pub fn check_driver() -> Result<()> {
    if !Path::new(CONTROL).exists() {
        bail!(
            "--ublk: {CONTROL} is missing: the kernel's ublk driver is not loaded \
             (`modprobe ublk_drv`; Linux 6.0 or later built with CONFIG_BLK_DEV_UBLK). \
             Without it, serve over NBD (--socket, `nbd-client`) or --fuse-dir"
        );
    }
    Ok(())
}

impl UblkExport {
    /// Brings up a device for each of `devices` (`paths` their files), as
    /// the decision table in the header says, and waits until each serves.
    pub fn start(
        devices: &[(String, Arc<VolumeDevice>)],
        paths: &[std::path::PathBuf],
        o: &UblkOptions,
        registry: &UblkRegistry,
    ) -> Result<UblkExport> {
        check_driver()?;
        if o.ids.len() > devices.len() {
            bail!("{} --ublk-id for {} volume(s)", o.ids.len(), devices.len());
        }
        let recovery = sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE;
        match UblkCtrl::get_features() {
            Some(f) if f & u64::from(recovery) == u64::from(recovery) => {}
            Some(f) => noteln!(
                "squeeze serve: this kernel's ublk (features {f:#x}) cannot re-issue requests \
                 to a restarted server: a crash of this server fails the I/O it held"
            ),
            None => {}
        }
        let mut export = UblkExport {
            running: Vec::new(),
        };
        for (i, ((name, dev), path)) in devices.iter().zip(paths).enumerate() {
            let uuid = uuid_hex(dev.vol.uuid());
            let volume = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            let plan = match plan(name, &uuid, o.ids.get(i).copied()) {
                Ok(p) => p,
                Err(e) => {
                    export.stop();
                    return Err(e);
                }
            };
            let recovered = matches!(plan, Plan::Recover(_));
            let counters = Arc::new(UblkCounters::default());
            let workers =
                Workers::start(name, dev, &counters, volume_write_slots(), other_threads())?;
            let (tx, rx) = crossbeam_channel::bounded(2);
            let thread = {
                let (o, dev) = (o.clone(), dev.clone());
                std::thread::Builder::new()
                    .name(format!("sqz-ublk-{name}"))
                    .spawn(move || run_device(plan, &o, dev, &volume, &uuid, workers, tx))?
            };
            let id = match rx.recv_timeout(START_TIMEOUT) {
                Ok(Ok(id)) => id,
                Ok(Err(e)) => {
                    let _ = thread.join();
                    export.stop();
                    return Err(e).with_context(|| format!("--ublk: volume {name}"));
                }
                Err(_) => {
                    export.stop();
                    bail!("--ublk: volume {name}: the device did not come up in {START_TIMEOUT:?}");
                }
            };
            registry.lock().push(UblkDeviceStats {
                volume: name.clone(),
                device: format!("/dev/ublkb{id}"),
                taken_over: recovered,
                counters: counters.clone(),
            });
            export.running.push(Running {
                name: name.clone(),
                id,
                recovered,
                counters,
                thread,
            });
        }
        Ok(export)
    }

    /// (volume name, block device path, taken over from a dead server).
    pub fn devices(&self) -> Vec<(String, String, bool)> {
        self.running
            .iter()
            .map(|r| (r.name.clone(), format!("/dev/ublkb{}", r.id), r.recovered))
            .collect()
    }

    /// Stops and deletes every device (requests the kernel has sent are
    /// answered first), and waits for their threads.
    pub fn stop(self) {
        for r in &self.running {
            match UblkCtrl::new_simple(r.id as i32) {
                Ok(c) => {
                    if let Err(e) = c.kill_dev() {
                        noteln!("squeeze serve: stopping /dev/ublkb{}: {e}", r.id);
                    }
                }
                Err(e) => noteln!("squeeze serve: stopping /dev/ublkb{}: {e}", r.id),
            }
        }
        for r in self.running {
            let _ = r.thread.join();
            let c = &r.counters;
            noteln!(
                "squeeze serve: /dev/ublkb{} ({}) removed: {} reads ({} bytes), {} writes \
                 ({} bytes), {} flushes, {} discards, {} write-zeroes, {} errors",
                r.id,
                r.name,
                c.reads.load(Ordering::Relaxed),
                c.bytes_read.load(Ordering::Relaxed),
                c.writes.load(Ordering::Relaxed),
                c.bytes_written.load(Ordering::Relaxed),
                c.flushes.load(Ordering::Relaxed),
                c.discards.load(Ordering::Relaxed),
                c.write_zeroes.load(Ordering::Relaxed),
                c.errors.load(Ordering::Relaxed),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The discard limit is whole 4 KiB granules and fits the kernel's
    /// 32-bit byte count.
    #[test]
    fn discard_limit_is_granular_and_fits() {
        assert_eq!(DISCARD_SECTORS_MAX % 8, 0);
        assert!(u64::from(DISCARD_SECTORS_MAX) * 512 <= u64::from(u32::MAX));
    }

    /// Without a device of ours and without an id, a device is added
    /// wherever the kernel likes.
    #[test]
    fn no_device_of_ours_means_add() {
        let p = plan("v", "00000000000000000000000000000000-none", None).unwrap();
        assert_eq!(p, Plan::Add(-1));
    }
}
