//! The server: listeners, connections, the shared worker pool, shutdown.
//!
//! One file per concept, each depending only on those listed before it:
//! - `config`: what a server is made of (`Export`s) and its tunables
//!   (`ServerConfig`), plain data;
//! - `stream`: a connected socket of either kind (`Stream`);
//! - `queue`: the workers' job queue and its write slots (`JobQueue`);
//! - `connection`: one connection's life before and around transmission:
//!   the handshake, the switch to TLS, the reply writer and the in-flight
//!   budget (`negotiate`, `Conn`);
//! - `transmission`: reading requests, dispatching them to the workers,
//!   running them on the device and answering (`serve`, `Job`);
//! - `listener`: binding (TCP, Unix), the accept loop, the address
//!   allow-list, the connection limit, one thread per connection, and
//!   shutdown (`Listener`, `Server`, `ShutdownHandle`).
//!
//! A protocol violation (bad magic, truncated stream, an unskippable
//! payload, a bad handshake) closes that connection only, logged at warn.

mod config;
mod connection;
mod listener;
mod queue;
mod stream;
mod transmission;

pub use config::{Export, ServerConfig, IN_FLIGHT_BYTES_MAX_DEFAULT};
pub use listener::{Listener, Server, ServerError, ShutdownHandle};
pub(crate) use stream::Stream;
