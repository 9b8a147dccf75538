//! squeeze-nbd: an NBD (Network Block Device) server library.
//!
//! Place in the data path: client (qemu, fio, nbdcopy, the kernel) --NBD-->
//! **this crate** (protocol only) -> `BlockDevice` (the binary's adapter to
//! the squeeze volume). It knows nothing of compression (STYLE habit 9).
//!
//! Modules, in the order a connection meets them:
//! - `server`: `listener.rs` (TCP and Unix listeners, the accept loop,
//!   one thread per connection, shutdown), `connection.rs` (handshake,
//!   TLS switch, reply writer, in-flight budget), `transmission.rs`
//!   (requests read, dispatched to a shared worker pool, answered),
//!   `queue.rs` (the workers' queue and its write slots);
//! - `access`: the client address allow-list (CIDR), checked on accept;
//! - `handshake`: the fixed newstyle option phase (TLS rules, the export
//!   allow-list);
//! - `tls`: NBD_OPT_STARTTLS with rustls: the TLS handshake and a pump
//!   thread that gives the rest of the connection a plaintext stream;
//! - `request`: request parsing, validation and errno mapping;
//! - `reply`: simple and structured reply encoding;
//! - `device`: the `BlockDevice` trait and the sparse `MemDevice`;
//! - `client_handshake`: the other side, for a client that hands its
//!   socket to the kernel's NBD driver (`squeeze nbd-attach`): fixed
//!   newstyle, NBD_OPT_GO, the export's size and flags;
//! - `proto`: wire constants; `stats`: counters; `printable`: client
//!   strings made safe (cut, escaped) for log lines.
//!
//! ```no_run
//! use std::sync::Arc;
//! use squeeze_nbd::{Export, MemDevice, Server};
//! let server = Server::new(vec![Export {
//!     name: "mem".into(),
//!     description: "scratch".into(),
//!     device: Arc::new(MemDevice::new(1 << 30)),
//! }])?;
//! let stop = server.shutdown_handle();
//! std::thread::spawn(move || { /* on SIGTERM: */ stop.shutdown(); });
//! server.serve_unix("/tmp/mem.sock")?; // returns after shutdown
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod access;
pub mod client_handshake;
pub mod device;
pub mod handshake;
mod printable;
pub mod proto;
mod reply;
pub mod request;
pub mod server;
pub mod stats;
pub mod tls;

pub use access::IpNet;
pub use client_handshake::{negotiate, ExportInfo, NegotiateError};
pub use device::{BlockDevice, MemDevice, MEM_PAGE_BYTES};
pub use handshake::HandshakeError;
pub use request::errno_for;
pub use server::{Export, Listener, Server, ServerConfig, ServerError, ShutdownHandle};
pub use stats::{RequestCounts, ServerStats};
pub use tls::{TlsConfig, TlsError, TlsMode};
