//! One connection around transmission: the handshake, the switch to TLS,
//! and the state its reader and the workers share once it is negotiated
//! (`Conn`: the reply writer and the in-flight budget).
//!
//! Place in the data path: the connection thread (`listener.rs`) runs
//! `negotiate` on the accepted socket, then `transmission::serve`, which
//! sets up a `Conn` for the requests.
//!
//! Limits (STYLE habit 10): per connection, at most
//! `in_flight_bytes_max` bytes of READ/WRITE payload and
//! `in_flight_requests_max` requests are dispatched and not yet written
//! back (`Conn::admit`, `Conn::release`); the reader blocks until a
//! written reply frees room (a single request larger than the byte budget
//! is admitted alone). Handshakes time out after `handshake_timeout`, a
//! client that stops reading replies after `send_timeout`.
//!
//! Replies: workers write a reply under the connection's write mutex, so
//! replies leave in completion order, not request order (the protocol
//! matches them by cookie). A worker that finds the mutex taken queues
//! its reply for the holder to write, so a client that reads slowly ties
//! up at most one worker.
//!
//! The front door, here: `allowed_exports` hides the other exports in the
//! handshake; with `tls`, a client's NBD_OPT_STARTTLS moves the rest of
//! its connection onto a TLS pump (`tls.rs`): everything after runs on the
//! pump's plaintext end exactly as on a socket, and the connection thread
//! joins the pump before the connection counts as closed.

use std::collections::VecDeque;
use std::io::{BufReader, BufWriter, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::config::{Export, ServerConfig};
use super::stream::Stream;
use crate::device::BlockDevice;
use crate::handshake::{self, HandshakeError, Negotiated, Outcome, Policy};
use crate::stats::Counters;
use crate::tls;

/// Bytes the connection's reader takes from the socket at a time: small
/// requests (a header, a 4 KiB payload) come dozens per read. Large write
/// payloads bypass it (`transmission::read_payload`).
const READ_BUFFER: usize = 128 << 10;

/// What every connection of a server shares, fixed for the server's life
/// (but the shutdown flag).
pub(crate) struct Shared {
    pub exports: Vec<Export>,
    /// Per export: on the allow-list (all true without one).
    pub visible: Vec<bool>,
    pub config: ServerConfig,
    pub counters: Arc<Counters>,
    pub shutting_down: AtomicBool,
}

impl Shared {
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

pub(crate) fn protocol_violation(shared: &Shared, id: u64, peer: &str, what: &str) {
    Counters::add(&shared.counters.protocol_errors, 1);
    tracing::warn!(conn = id, %peer, "protocol violation: {what}; closing connection");
}

fn handshake_failed(shared: &Shared, id: u64, peer: &str, e: HandshakeError) {
    match e {
        HandshakeError::Protocol(what) => protocol_violation(shared, id, peer, &what),
        HandshakeError::Io(e) => {
            if !shared.is_shutting_down() {
                protocol_violation(shared, id, peer, &format!("handshake cut short: {e}"));
            }
        }
    }
}

/// Runs the option phase (and TLS, if the client asks for it) on `stream`;
/// on success returns the streams to use in transmission. A TLS pump
/// started here is left in `pump` for the caller to join once the
/// connection is done.
pub(crate) fn negotiate(
    shared: &Shared,
    id: u64,
    stream: Stream,
    peer: &str,
    pump: &mut Option<tls::PumpHandle>,
) -> Option<(BufReader<Stream>, Stream, Negotiated)> {
    let policy = Policy {
        exports: &shared.exports,
        visible: &shared.visible,
        tls: shared.config.tls.as_ref().map(|t| t.mode()),
    };
    let mut stream = stream;
    let mut session = None;
    loop {
        let writer = match stream.try_clone() {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(conn = id, error = %e, "cannot clone socket");
                return None;
            }
        };
        if stream
            .set_read_timeout(shared.config.handshake_timeout)
            .is_err()
            || stream
                .set_write_timeout(shared.config.send_timeout)
                .is_err()
        {
            return None;
        }
        let mut reader = BufReader::with_capacity(READ_BUFFER, stream);
        let mut bw = BufWriter::new(writer);
        let s = match session {
            Some(s) => s,
            None => match handshake::greet(&mut reader, &mut bw) {
                Ok(s) => s,
                Err(e) => {
                    handshake_failed(shared, id, peer, e);
                    return None;
                }
            },
        };
        let negotiated = match handshake::options(&mut reader, &mut bw, &policy, s) {
            Ok(Outcome::Transmission(n)) => n,
            Ok(Outcome::Aborted) => {
                tracing::debug!(conn = id, "client ended the handshake");
                return None;
            }
            Ok(Outcome::StartTls) => {
                let Some(config) = shared.config.tls.as_ref() else {
                    unreachable!("STARTTLS acknowledged without TLS configured");
                };
                // The ACK is flushed; bytes read past it are TLS records.
                let buffered = reader.buffer().to_vec();
                drop(bw);
                let raw = reader.into_inner();
                match tls::accept(raw, &buffered, config, shared.config.send_timeout, id) {
                    Ok((plain, p)) => {
                        *pump = Some(p);
                        stream = plain;
                        session = Some(handshake::Session {
                            tls_active: true,
                            ..s
                        });
                        continue;
                    }
                    Err(e) => {
                        if !shared.is_shutting_down() {
                            protocol_violation(
                                shared,
                                id,
                                peer,
                                &format!("TLS handshake failed: {e}"),
                            );
                        }
                        return None;
                    }
                }
            }
            Err(e) => {
                handshake_failed(shared, id, peer, e);
                return None;
            }
        };
        let writer = match bw.into_inner() {
            Ok(w) => w,
            Err(e) => {
                tracing::info!(conn = id, error = %e.error(), "cannot finish handshake");
                return None;
            }
        };
        if reader.get_ref().set_read_timeout(None).is_err() {
            return None;
        }
        let export = &shared.exports[negotiated.export_index];
        tracing::info!(
            conn = id,
            export = %export.name,
            structured = negotiated.structured,
            base_allocation = negotiated.base_allocation,
            tls = s.tls_active,
            "transmission started"
        );
        return Some((reader, writer, negotiated));
    }
}

/// State of one negotiated connection shared between its reader and the
/// workers.
pub(crate) struct Conn {
    pub id: u64,
    pub device: Arc<dyn BlockDevice>,
    pub structured: bool,
    pub read_holes: bool,
    /// `ServerConfig::inline_reads`.
    pub inline_reads: bool,
    pub counters: Arc<Counters>,
    writer: Mutex<Stream>,
    /// Replies waiting for the writer, with the in-flight cost each frees.
    pending: Mutex<VecDeque<(Vec<u8>, Option<u64>)>>,
    broken: AtomicBool,
    in_flight: Mutex<InFlight>,
    room: Condvar,
    in_flight_bytes_max: u64,
    in_flight_requests_max: u32,
}

#[derive(Default)]
struct InFlight {
    bytes: u64,
    requests: u32,
}

impl Conn {
    /// The connection `negotiated` on `shared`'s exports, replying on
    /// `writer`, with the configured in-flight budget.
    pub(crate) fn new(shared: &Shared, id: u64, writer: Stream, negotiated: &Negotiated) -> Conn {
        let export = &shared.exports[negotiated.export_index];
        Conn {
            id,
            device: Arc::clone(&export.device),
            structured: negotiated.structured,
            read_holes: shared.config.read_holes,
            inline_reads: shared.config.inline_reads,
            counters: Arc::clone(&shared.counters),
            writer: Mutex::new(writer),
            pending: Mutex::new(VecDeque::new()),
            broken: AtomicBool::new(false),
            in_flight: Mutex::new(InFlight::default()),
            room: Condvar::new(),
            in_flight_bytes_max: shared.config.in_flight_bytes_max,
            in_flight_requests_max: shared.config.in_flight_requests_max,
        }
    }

    /// A reply could not be written: the connection is dead.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Queue one whole reply and, unless another thread is already
    /// writing to this socket, write out everything queued. At most one
    /// thread per connection blocks on the socket; the others return at
    /// once. `cost_bytes` (for admitted requests) is released when the
    /// reply has been written or dropped, so queued replies count against
    /// the in-flight budget. After a write error (or a client that stops
    /// reading for `send_timeout`) the connection is dead: later replies
    /// are dropped and the reader is woken by the shutdown.
    pub(crate) fn send(&self, bytes: Vec<u8>, cost_bytes: Option<u64>) {
        self.pending.lock().push_back((bytes, cost_bytes));
        loop {
            let Some(mut w) = self.writer.try_lock() else {
                return; // the holder drains our reply too
            };
            loop {
                let Some((b, cost)) = self.pending.lock().pop_front() else {
                    break;
                };
                if !self.broken.load(Ordering::Relaxed) {
                    if let Err(e) = w.write_all(&b) {
                        self.broken.store(true, Ordering::Relaxed);
                        tracing::info!(conn = self.id, error = %e, "cannot send reply; closing connection");
                        w.shutdown(Shutdown::Both);
                    }
                }
                if let Some(c) = cost {
                    self.release(c);
                }
            }
            drop(w);
            // A reply queued after our last pop but before the unlock
            // found the lock taken: go round again for it.
            if self.pending.lock().is_empty() {
                return;
            }
        }
    }

    /// Waits for room in the in-flight budget, then counts a request of
    /// `cost_bytes` payload bytes in it.
    pub(crate) fn admit(&self, cost_bytes: u64) {
        let mut f = self.in_flight.lock();
        while f.requests > 0
            && (f.requests >= self.in_flight_requests_max
                || f.bytes + cost_bytes > self.in_flight_bytes_max)
        {
            self.room.wait(&mut f);
        }
        f.bytes += cost_bytes;
        f.requests += 1;
        Counters::add(&self.counters.requests_in_flight, 1);
    }

    fn release(&self, cost_bytes: u64) {
        let mut f = self.in_flight.lock();
        assert!(
            f.requests > 0 && f.bytes >= cost_bytes,
            "in-flight accounting underflow"
        );
        f.bytes -= cost_bytes;
        f.requests -= 1;
        Counters::sub(&self.counters.requests_in_flight, 1);
        self.room.notify_all();
    }

    /// DISC, end of stream, violation or shutdown: wait until every
    /// dispatched request has been answered, then close the socket.
    pub(crate) fn finish(&self) {
        let mut f = self.in_flight.lock();
        while f.requests > 0 {
            self.room.wait(&mut f);
        }
        drop(f);
        self.writer.lock().shutdown(Shutdown::Both);
    }
}
