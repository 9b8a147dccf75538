//! Server counters: updated with relaxed atomics by the accept loops,
//! connection readers and workers; read at any time as a `ServerStats`
//! snapshot (each field is exact, the set is not one atomic cut).
//!
//! Invariants: `connections_open <= connections_total`;
//! `requests_in_flight` counts requests admitted (dispatched to workers,
//! or answered by the reader itself: `reads_inline`) and not yet replied
//! to; `bytes_read`/`bytes_written` count payload bytes of
//! successful READs/WRITEs only.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::proto::*;

/// Requests received, by command (valid or not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub read: u64,
    pub write: u64,
    pub flush: u64,
    pub trim: u64,
    pub write_zeroes: u64,
    pub block_status: u64,
    pub disc: u64,
    /// Unknown or unsupported command types.
    pub other: u64,
}

impl RequestCounts {
    /// All requests.
    pub fn total(&self) -> u64 {
        self.read
            + self.write
            + self.flush
            + self.trim
            + self.write_zeroes
            + self.block_status
            + self.disc
            + self.other
    }
}

/// A snapshot of the server's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub connections_open: u64,
    pub connections_total: u64,
    pub requests: RequestCounts,
    pub requests_in_flight: u64,
    /// Payload bytes returned by successful READs.
    pub bytes_read: u64,
    /// READs answered by the connection's reader itself, without a worker
    /// (`BlockDevice::try_read_cached`).
    pub reads_inline: u64,
    /// Payload bytes accepted by successful WRITEs.
    pub bytes_written: u64,
    /// Requests answered with an error (rejected or failed in the device).
    pub errors: u64,
    /// Connections closed for a protocol violation.
    pub protocol_errors: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    requests: [AtomicU64; 8],
    pub requests_in_flight: AtomicU64,
    pub bytes_read: AtomicU64,
    pub reads_inline: AtomicU64,
    pub bytes_written: AtomicU64,
    pub errors: AtomicU64,
    pub protocol_errors: AtomicU64,
}

impl Counters {
    pub(crate) fn count_request(&self, cmd: u16) {
        let slot = match cmd {
            CMD_READ => 0,
            CMD_WRITE => 1,
            CMD_FLUSH => 2,
            CMD_TRIM => 3,
            CMD_WRITE_ZEROES => 4,
            CMD_BLOCK_STATUS => 5,
            CMD_DISC => 6,
            _ => 7,
        };
        self.requests[slot].fetch_add(1, Relaxed);
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub(crate) fn sub(counter: &AtomicU64, n: u64) {
        counter.fetch_sub(n, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ServerStats {
        let r = |i: usize| self.requests[i].load(Relaxed);
        ServerStats {
            connections_open: self.connections_open.load(Relaxed),
            connections_total: self.connections_total.load(Relaxed),
            requests: RequestCounts {
                read: r(0),
                write: r(1),
                flush: r(2),
                trim: r(3),
                write_zeroes: r(4),
                block_status: r(5),
                disc: r(6),
                other: r(7),
            },
            requests_in_flight: self.requests_in_flight.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            reads_inline: self.reads_inline.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            errors: self.errors.load(Relaxed),
            protocol_errors: self.protocol_errors.load(Relaxed),
        }
    }
}
