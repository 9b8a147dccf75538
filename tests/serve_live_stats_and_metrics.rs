//! Live statistics while serving: `squeeze stats CONTROL_SOCKET` (text and
//! `--json`) shows bytes_written growing as a client writes, with the NBD
//! server's request counts beside the volume's figures, and
//! `--metrics ADDR:PORT` serves Prometheus text at /metrics (JSON at /stats).

mod common;

use common::*;
use std::io::{Read, Write};

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Value of `squeeze_NAME{export="vol"}` in Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    let key = format!("squeeze_{name}{{export=\"vol\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn stats_and_metrics_grow_while_serving() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let w = Workdir::new();
    // The CPU signal off: on a busy test machine it could step the codec
    // down (tests/serve_busy_cores_adapt.rs covers it), and this test
    // counts on nothing below the target.
    let srv = Serve::start(&w, &["--metrics", &addr, "--no-cpu-adapt"]);

    let before = live_stats(&srv)["bytes_written"].as_u64().unwrap();
    let m0 = http_get(&addr, "/metrics");
    assert!(m0.starts_with("HTTP/1.0 200"), "{m0}");
    assert!(m0.contains("text/plain; version=0.0.4"), "{m0}");
    assert!(
        m0.contains("# TYPE squeeze_written_bytes_total counter"),
        "{m0}"
    );
    assert_eq!(metric(&m0, "logical_size_bytes"), (1u64 << 30) as f64);
    let w0 = metric(&m0, "written_bytes_total");

    let mut c = srv.client(true);
    let data = mixed_data(8 << 20, 3);
    assert_eq!(c.write(0, &data), 0);
    assert_eq!(c.flush(), 0);

    let st = live_stats(&srv);
    let after = st["bytes_written"].as_u64().unwrap();
    assert!(after >= before + (8 << 20), "{before} -> {st}");
    assert!(st["mapped_bytes"].as_u64().unwrap() > 0, "{st}");

    // The NBD server's counters come with each volume's: the write and
    // the flush above are counted.
    let nbd = &st["nbd_server"];
    assert!(nbd["requests"]["write"].as_u64().unwrap() >= 1, "{st}");
    assert!(nbd["requests"]["flush"].as_u64().unwrap() >= 1, "{st}");
    assert!(nbd["bytes_written"].as_u64().unwrap() >= 8 << 20, "{st}");
    assert!(nbd["connections_open"].as_u64().unwrap() >= 1, "{st}");

    let text = run(squeeze().arg("stats").arg(&srv.control));
    assert!(text.contains("bytes written"), "{text}");
    assert!(text.contains("compression ratio"), "{text}");
    assert!(text.contains("nbd requests           read "), "{text}");

    let m1 = http_get(&addr, "/metrics");
    assert!(
        metric(&m1, "written_bytes_total") >= w0 + (8 << 20) as f64,
        "{m1}"
    );
    assert!(metric(&m1, "compression_ratio") > 1.0, "{m1}");
    // No cap, so never low on space.
    assert_eq!(metric(&m1, "space_low"), 0.0, "{m1}");
    assert_eq!(metric(&m1, "physical_limit_bytes"), 0.0, "{m1}");
    let j = http_get(&addr, "/stats");
    assert!(j.starts_with("HTTP/1.0 200"), "{j}");
    assert!(j.contains("application/json"), "{j}");
    let body = j.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert!(
        v["volumes"]["vol"]["bytes_written"].as_u64().unwrap() >= after,
        "{v}"
    );
    assert!(
        v["server"]["requests"]["write"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert!(
        v["server"]["connections_open"].as_u64().unwrap() >= 1,
        "{v}"
    );
    assert!(m1.contains("squeeze_nbd_requests_total "), "{m1}");
    // The adaptive codec's gauges and counters (one writer: no backlog, so
    // nothing below the target).
    for name in [
        "below_target_bytes_total",
        "below_target_pending_bytes",
        "upgraded_bytes_total",
        "upgrade_seconds_total",
    ] {
        assert_eq!(metric(&m1, name), 0.0, "{name}: {m1}");
    }
    assert_eq!(metric(&m1, "cpu_busy_ratio"), 0.0, "{m1}");
    // Nothing was overwritten: no dead segment waits for a checkpoint.
    assert_eq!(metric(&m1, "segments_waiting"), 0.0, "{m1}");
    assert_eq!(v["volumes"]["vol"]["write_algorithm"], "zstd:3", "{v}");
    assert_eq!(v["volumes"]["vol"]["below_target_bytes"], 0, "{v}");
    assert!(http_get(&addr, "/nope").starts_with("HTTP/1.0 404"));
    c.disconnect();
    srv.stop();
}
