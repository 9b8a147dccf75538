//! What a client sends never reaches the server's log in full: a
//! 5,000-byte export name, or one carrying a newline and a terminal escape
//! sequence, is logged cut to a short prefix with its length, escaped, on
//! one line.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use squeeze_nbd::MemDevice;

/// Everything the server logs, at every level, in one buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() -> Captured {
    let captured = Captured::default();
    let writer = captured.clone();
    // Global: the server logs from its connection threads. Set before
    // TestServer's own (then ignored) subscriber.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    captured
}

#[test]
fn client_strings_are_cut_and_escaped_in_log_lines() {
    let logs = capture_logs();
    let dev = Arc::new(MemDevice::new(1 << 20));
    let srv = TestServer::start(vec![export("mem", dev)]);

    let mut name = b"evil\n2026-01-01T00:00:00Z  WARN forged line\x1b[2J".to_vec();
    name.resize(5000, b'A');

    // NBD_OPT_GO naming no export: refused, logged at debug.
    let mut c = srv.client();
    c.start();
    let mut go = (4000u32).to_be_bytes().to_vec();
    go.extend_from_slice(&name[..4000]);
    go.extend_from_slice(&0u16.to_be_bytes());
    c.send_option(OPT_GO, &go);
    assert_eq!(c.opt_replies()[0].kind, REP_ERR_UNKNOWN);
    // NBD_OPT_EXPORT_NAME naming no export: the connection is closed,
    // logged at warn as a protocol violation.
    c.send_option(OPT_EXPORT_NAME, &name);
    assert!(c.is_closed_by_server());
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.server.stats().protocol_errors == 0 {
        assert!(Instant::now() < deadline, "no protocol violation counted");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The violation is logged right after it is counted.
    std::thread::sleep(Duration::from_millis(100));

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("(5000 bytes)"), "{text}");
    assert!(text.contains("(4000 bytes)"), "{text}");
    assert!(
        text.contains("evil\\n2026-01-01T00:00:00Z  WARN forged line\\u{1b}[2J"),
        "{text}"
    );
    assert!(!text.contains("forged line\x1b"), "raw escape in the log");
    assert!(
        !text.lines().any(|l| l.starts_with("2026-01-01")),
        "forged line"
    );
    assert!(
        !text.contains(&"A".repeat(200)),
        "a client string logged in full"
    );
    for line in text.lines() {
        assert!(line.len() < 600, "{} bytes: {line}", line.len());
    }
}
