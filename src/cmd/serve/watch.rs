//! The low-space watcher (thread `sqz-space`): the crossing of the 10%
//! mark of a volume's physical cap, each way, in the log.

use super::device::VolumeDevice;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Logs a warning when a volume's free physical room falls under 10% of
/// its cap (`VolumeStats::space_warning`), and a note when it is back above,
/// checking four times a second until `stop`: a client filling a volume at
/// 500 MB/s crosses the last 10% of a 3 GiB cap in about 0.6 s
/// (bench/ceph_thin.sh), so the warning must come from a short poll.
pub(super) fn space_watch(devs: &[(String, Arc<VolumeDevice>)], stop: &AtomicBool) {
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
