//! What a server is made of: its exports and its tunables. Plain data;
//! `Server::with_config` (listener.rs) checks it.
//!
//! Limits (STYLE habit 10): every tunable bounds something in flight;
//! `IN_FLIGHT_BYTES_MAX_DEFAULT` admits at least one request of the
//! maximum block size.

use std::sync::Arc;
use std::time::Duration;

use crate::access::IpNet;
use crate::device::BlockDevice;
use crate::proto::BLOCK_SIZE_MAX;
use crate::tls::TlsConfig;

/// One export: a named device.
pub struct Export {
    pub name: String,
    pub description: String,
    pub device: Arc<dyn BlockDevice>,
}

/// Tunables, each a limit on something in flight.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Worker threads shared by all connections: requests executed at
    /// once. Default 8 per core, at least 16: reads mostly wait for the
    /// device, and on 2 cores 4 of them read fio's W1 from the device at
    /// 788 MB/s where 8 reached 900-1026.
    pub workers: usize,
    /// Of those, WRITE requests executed at once (the queue's write
    /// slots), overriding what the devices declare. `None` (the default):
    /// the smallest `BlockDevice::max_concurrent_writes` of the exports
    /// (the slots are shared by the whole server), at most `workers`; for
    /// devices that declare nothing, every worker may write.
    pub write_workers: Option<usize>,
    /// Per connection: READ/WRITE payload bytes dispatched and unanswered.
    pub in_flight_bytes_max: u64,
    /// Per connection: requests dispatched and unanswered.
    pub in_flight_requests_max: u32,
    /// Connections served at once; more are closed on accept.
    pub connections_max: usize,
    /// Time a client has for each read during the handshake.
    pub handshake_timeout: Option<Duration>,
    /// Time a reply write may block on a client that does not read;
    /// after it the connection is closed.
    pub send_timeout: Option<Duration>,
    /// With structured replies, answer a READ of an all-hole range with
    /// OFFSET_HOLE (`BlockDevice::read_or_hole`: one lookup with the read
    /// where the device provides it).
    pub read_holes: bool,
    /// A READ of up to 32 KiB is first tried on the connection's reader
    /// thread (`BlockDevice::try_read_cached`), sparing the hand-off to a
    /// worker and back when the device needs no wait. A connection's reads
    /// answered so run one at a time: off (`serve --no-inline-reads`), a
    /// single connection's cached small reads spread over the workers
    /// again, which a host with many idle cores may prefer.
    pub inline_reads: bool,
    /// TLS (NBD_OPT_STARTTLS) offered or required; `None`: plaintext only.
    pub tls: Option<TlsConfig>,
    /// Export allow-list: only these exports are listed and selectable
    /// (the empty name selects the first of them); `None`: all.
    pub allowed_exports: Option<Vec<String>>,
    /// Client address allow-list for TCP listeners, checked on accept;
    /// `None`: any address. Unix socket clients are always allowed.
    pub allowed_peers: Option<Vec<IpNet>>,
}

/// Default per-connection in-flight payload budget.
pub const IN_FLIGHT_BYTES_MAX_DEFAULT: u64 = 64 << 20;
const _: () = assert!(IN_FLIGHT_BYTES_MAX_DEFAULT >= BLOCK_SIZE_MAX as u64);

impl Default for ServerConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        ServerConfig {
            workers: (cores * 8).clamp(16, 256),
            write_workers: None,
            in_flight_bytes_max: IN_FLIGHT_BYTES_MAX_DEFAULT,
            in_flight_requests_max: 512,
            connections_max: 256,
            handshake_timeout: Some(Duration::from_secs(60)),
            send_timeout: Some(Duration::from_secs(60)),
            read_holes: true,
            inline_reads: true,
            tls: None,
            allowed_exports: None,
            allowed_peers: None,
        }
    }
}

impl ServerConfig {
    /// WRITE requests run at once over `exports`: `write_workers` if set,
    /// else the smallest number any export's device declares; at least
    /// one, at most `workers`.
    pub(crate) fn write_slots(&self, exports: &[Export]) -> usize {
        let wanted = self.write_workers.unwrap_or_else(|| {
            exports
                .iter()
                .map(|e| e.device.max_concurrent_writes())
                .min()
                .unwrap_or(usize::MAX)
        });
        wanted.clamp(1, self.workers.max(1))
    }
}
