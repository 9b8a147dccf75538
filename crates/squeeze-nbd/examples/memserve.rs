//! Serve a sparse in-memory device over NBD, for trying clients by hand:
//!
//! ```text
//! cargo run -p squeeze-nbd --example memserve -- --socket /tmp/mem.sock --size 1G
//! qemu-io -f raw 'nbd+unix:///?socket=/tmp/mem.sock' -c 'write -P 0xab 0 1M'
//! nbdinfo --map 'nbd+unix:///?socket=/tmp/mem.sock'
//! ```
//!
//! Options: `--socket PATH` (Unix socket, mode 0600), `--listen ADDR:PORT`
//! (TCP), `--size N[K|M|G|T]` (default 1G), `--name NAME` (default "mem").
//! Logs with `RUST_LOG` (default info). SIGINT/SIGTERM: stop accepting,
//! finish in-flight requests, flush, print the counters, exit 0 (the shape
//! `squeeze serve` follows).

use std::sync::Arc;

use squeeze_nbd::{Export, Listener, MemDevice, Server};

fn parse_size(s: &str) -> Option<u64> {
    let (num, shift) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        b't' | b'T' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

fn usage() -> ! {
    eprintln!(
        "usage: memserve (--socket PATH | --listen ADDR:PORT) [--size N[K|M|G|T]] [--name NAME]"
    );
    std::process::exit(2);
}

/// Block SIGINT and SIGTERM in this thread and so in every thread spawned
/// after (call it first in `main`); returns the set for `sigwait`.
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-mask calls on a local, initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// A thread that waits for a signal of `set` (blocked by `block_signals`).
fn spawn_signal_waiter(set: libc::sigset_t, on_signal: impl FnOnce(i32) + Send + 'static) {
    std::thread::spawn(move || {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is initialised; `sig` is a valid out pointer.
        unsafe { libc::sigwait(&set, &mut sig) };
        on_signal(sig);
    });
}

fn main() {
    let signals = block_signals();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let mut socket = None;
    let mut listen = None;
    let mut size_bytes: u64 = 1 << 30;
    let mut name = "mem".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--socket" => socket = Some(value()),
            "--listen" => listen = Some(value()),
            "--size" => size_bytes = parse_size(&value()).unwrap_or_else(|| usage()),
            "--name" => name = value(),
            _ => usage(),
        }
    }
    let listener = match (socket, listen) {
        (Some(path), None) => Listener::bind_unix(path),
        (None, Some(addr)) => Listener::bind_tcp(addr),
        _ => usage(),
    }
    .unwrap_or_else(|e| {
        eprintln!("memserve: cannot listen: {e}");
        std::process::exit(1);
    });
    let device = Arc::new(MemDevice::new(size_bytes));
    let server = Server::new(vec![Export {
        name,
        description: format!("squeeze-nbd MemDevice, {size_bytes} bytes"),
        device,
    }])
    .expect("valid export");
    let stop = server.shutdown_handle();
    spawn_signal_waiter(signals, move |sig| {
        tracing::info!(sig, "signal received; shutting down");
        stop.shutdown();
    });
    tracing::info!(at = %listener.describe(), size_bytes, "serving a MemDevice");
    if let Err(e) = server.serve(listener) {
        eprintln!("memserve: {e}");
        std::process::exit(1);
    }
    // Every connection is closed: flush the devices, then report.
    for export in server.exports() {
        if let Err(e) = export.device.flush() {
            eprintln!("memserve: flush of {} failed: {e}", export.name);
            std::process::exit(1);
        }
    }
    tracing::info!(stats = ?server.stats(), "stopped");
}
