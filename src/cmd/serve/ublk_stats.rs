//! The ublk devices' request counters (`serve --ublk`): counted by the
//! queues' workers (`ublk_queue`), read by the control socket's `stats`
//! (key `ublk`), by /metrics (`squeeze_ublk_*`) and by the summary a
//! clean stop prints. What the engine did with the requests is in each
//! volume's own statistics, whatever the front end.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Requests served, by kind, over all queues of one device.
#[derive(Default)]
pub struct UblkCounters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
    pub discards: AtomicU64,
    pub write_zeroes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub errors: AtomicU64,
}

/// One served device.
pub struct UblkDeviceStats {
    /// The volume's export name.
    pub volume: String,
    /// /dev/ublkbN.
    pub device: String,
    /// Taken over from a server that died (not added by this one).
    pub taken_over: bool,
    pub counters: Arc<UblkCounters>,
}

/// The devices of a server: empty without `--ublk`, filled as they come up.
pub type UblkRegistry = Arc<Mutex<Vec<UblkDeviceStats>>>;

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// The devices as JSON, keyed by volume; None without devices.
pub(super) fn ublk_json(reg: &UblkRegistry) -> Option<serde_json::Value> {
    let devs = reg.lock();
    if devs.is_empty() {
        return None;
    }
    let mut m = serde_json::Map::new();
    for d in devs.iter() {
        let c = &d.counters;
        m.insert(
            d.volume.clone(),
            serde_json::json!({
                "device": d.device,
                "taken_over": d.taken_over,
                "bytes_read": get(&c.bytes_read),
                "bytes_written": get(&c.bytes_written),
                "errors": get(&c.errors),
                "requests": {
                    "read": get(&c.reads), "write": get(&c.writes), "flush": get(&c.flushes),
                    "discard": get(&c.discards), "write_zeroes": get(&c.write_zeroes),
                },
            }),
        );
    }
    Some(serde_json::Value::Object(m))
}

/// The devices in Prometheus text format, appended to `out`.
pub(super) fn ublk_prometheus(reg: &UblkRegistry, out: &mut String) {
    let devs = reg.lock();
    if devs.is_empty() {
        return;
    }
    out.push_str(
        "# HELP squeeze_ublk_requests_total ublk requests served, by op.\n\
         # TYPE squeeze_ublk_requests_total counter\n",
    );
    for d in devs.iter() {
        let c = &d.counters;
        for (op, v) in [
            ("read", &c.reads),
            ("write", &c.writes),
            ("flush", &c.flushes),
            ("discard", &c.discards),
            ("write_zeroes", &c.write_zeroes),
        ] {
            out.push_str(&format!(
                "squeeze_ublk_requests_total{{export=\"{}\",device=\"{}\",op=\"{op}\"}} {}\n",
                d.volume,
                d.device,
                get(v)
            ));
        }
    }
    for (name, help, f) in [
        (
            "ublk_read_bytes_total",
            "Bytes ublk READ requests returned.",
            (|c: &UblkCounters| get(&c.bytes_read)) as fn(&UblkCounters) -> u64,
        ),
        (
            "ublk_written_bytes_total",
            "Bytes ublk WRITE requests carried.",
            |c: &UblkCounters| get(&c.bytes_written),
        ),
        (
            "ublk_errors_total",
            "ublk requests answered with an error.",
            |c: &UblkCounters| get(&c.errors),
        ),
    ] {
        out.push_str(&format!(
            "# HELP squeeze_{name} {help}\n# TYPE squeeze_{name} counter\n"
        ));
        for d in devs.iter() {
            out.push_str(&format!(
                "squeeze_{name}{{export=\"{}\",device=\"{}\"}} {}\n",
                d.volume,
                d.device,
                f(&d.counters)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_show_in_json_and_prometheus() {
        let reg: UblkRegistry = Arc::default();
        assert!(ublk_json(&reg).is_none());
        let c = Arc::new(UblkCounters::default());
        c.flushes.fetch_add(3, Ordering::Relaxed);
        reg.lock().push(UblkDeviceStats {
            volume: "vol".into(),
            device: "/dev/ublkb0".into(),
            taken_over: true,
            counters: c,
        });
        let j = ublk_json(&reg).unwrap();
        assert_eq!(j["vol"]["requests"]["flush"], 3);
        assert_eq!(j["vol"]["taken_over"], true);
        let mut p = String::new();
        ublk_prometheus(&reg, &mut p);
        assert!(p.contains(
            "squeeze_ublk_requests_total{export=\"vol\",device=\"/dev/ublkb0\",op=\"flush\"} 3"
        ));
        assert!(p.contains("# TYPE squeeze_ublk_errors_total counter"));
    }
}
