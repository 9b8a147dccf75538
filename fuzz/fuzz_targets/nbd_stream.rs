//! The NBD server against a hostile client: the input is the client's whole
//! byte stream (handshake, options, requests, payloads), sent on a fresh
//! connection to one long-lived squeeze_nbd::Server over a Unix socket,
//! with two small MemDevice exports ("mem", 1 MiB, read-write; "ro",
//! 64 KiB, read-only). The client then half-closes; the server must answer
//! what it answers and close the connection within the timeout. A panic in
//! any server thread aborts the process (libFuzzer's panic hook); a server
//! that does not close is reported as a hang by the panic below.
//! Run with `-detect_leaks=0`: a finished connection's thread may still be
//! exiting when libFuzzer's leak check runs, which LeakSanitizer reports.
//!
//! squeeze-nbd has no API to serve a pre-connected stream, so each input is
//! one connection to a listener in a temporary directory. The devices keep
//! their contents across inputs (harmless for the protocol code under test).

#![no_main]

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use squeeze_nbd::{Export, Listener, MemDevice, Server, ServerConfig};

/// How long the server may take to finish answering and close once the
/// client's stream has ended.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

struct Harness {
    socket: PathBuf,
    server: Server,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        // libFuzzer's main is not Rust's: SIGPIPE is not ignored, and a
        // reply written to a client that hung up would kill the process.
        // SAFETY: setting a signal disposition to SIG_IGN has no other effect.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let dir = std::env::temp_dir().join(format!("squeeze-fuzz-nbd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let socket = dir.join("nbd.sock");
        let listener = Listener::bind_unix(&socket).expect("bind");
        let exports = vec![
            Export {
                name: "mem".into(),
                description: "fuzz scratch".into(),
                device: Arc::new(MemDevice::new(1 << 20)),
            },
            Export {
                name: "ro".into(),
                description: "read-only".into(),
                device: Arc::new(MemDevice::new(64 << 10).with_read_only(true)),
            },
        ];
        let config = ServerConfig {
            workers: 2,
            handshake_timeout: Some(Duration::from_secs(2)),
            send_timeout: Some(Duration::from_secs(2)),
            ..ServerConfig::default()
        };
        let server = Server::with_config(exports, config).expect("server");
        let s2 = server.clone();
        std::thread::spawn(move || s2.serve(listener));
        Harness { socket, server }
    })
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    let s = UnixStream::connect(&h.socket).expect("connect");
    s.set_read_timeout(Some(CLOSE_TIMEOUT)).expect("timeout");
    s.set_write_timeout(Some(CLOSE_TIMEOUT)).expect("timeout");
    // Write from another thread: the server may answer (and block on us)
    // while we are still sending.
    let mut w = s.try_clone().expect("clone");
    let input = data.to_vec();
    let writer = std::thread::spawn(move || {
        // The server may close first (protocol error, disconnect): EPIPE.
        let _ = w.write_all(&input);
        let _ = w.shutdown(Shutdown::Write);
    });
    let mut r = &s;
    let mut buf = vec![0u8; 256 << 10];
    let start = Instant::now();
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!(
                    "nbd server hang: connection still open {:?} after the client's stream \
                     ended ({} input bytes)",
                    start.elapsed(),
                    data.len()
                );
            }
            // ECONNRESET: the server closed with our bytes unread.
            Err(_) => break,
        }
    }
    writer.join().expect("writer thread");
    // The server must also release the connection (its thread may still
    // be exiting: run with -detect_leaks=0, see README.md).
    while h.server.stats().connections_open != 0 {
        assert!(
            start.elapsed() < 2 * CLOSE_TIMEOUT,
            "nbd server hang: connection closed but still counted open"
        );
        std::thread::sleep(Duration::from_micros(50));
    }
});
