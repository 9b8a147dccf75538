//! Transmission: reading a negotiated connection's requests, dispatching
//! them to the workers, running them on the device and answering.
//!
//! Threads. Each connection has one reader thread (`listener.rs` starts
//! it): after the handshake it runs `serve`, which reads requests,
//! validates them (`request.rs`) and answers rejections itself; a READ of
//! up to `INLINE_READ_MAX` it answers itself too when the device can
//! without waiting (`read_inline`); other valid requests go, as `Job`s,
//! to the worker pool shared by the whole server (`queue.rs`). Workers
//! call the `BlockDevice` and send the reply through the connection's
//! writer (`Conn::send`, connection.rs), so replies leave in completion
//! order, not request order.
//!
//! Invariants: a WRITE payload is always consumed (read, or skipped when
//! over the maximum block size) before the request is judged, so the
//! stream stays in sync; one too long even to skip closes the connection
//! (`request::payload_of`). Every request judged (dispatched, answered by
//! the reader or rejected) is admitted to the connection's in-flight
//! budget first and released by its reply.

use std::io::{self, BufRead, BufReader, Read};
use std::sync::Arc;

use super::connection::{protocol_violation, Conn, Shared};
use super::queue::{JobQueue, Queued};
use super::stream::Stream;
use crate::handshake::Negotiated;
use crate::proto::*;
use crate::reply;
use crate::request::{self, Command, Payload, RequestContext};
use crate::stats::Counters;

/// A validated request on its way to a worker.
pub(crate) struct Job {
    conn: Arc<Conn>,
    cookie: u64,
    command: Command,
    payload: Vec<u8>,
    cost_bytes: u64,
}

impl Queued for Job {
    /// A WRITE: CPU-bound in a compressing device, limited by the
    /// queue's write slots (`BlockDevice::max_concurrent_writes`).
    fn is_write(&self) -> bool {
        matches!(self.command, Command::Write { .. })
    }
}

/// Transmission on a negotiated connection, until it ends (DISC, end of
/// stream, a violation, a dead socket or shutdown); returns once every
/// dispatched request has been answered and the socket is closed.
pub(crate) fn serve(
    shared: &Shared,
    jobs: &JobQueue<Job>,
    id: u64,
    mut reader: BufReader<Stream>,
    writer: Stream,
    negotiated: Negotiated,
    peer: &str,
) {
    let conn = Arc::new(Conn::new(shared, id, writer, &negotiated));
    requests(shared, jobs, &conn, &mut reader, negotiated, peer);
    conn.finish();
}

/// Starts `count` worker threads running the jobs of `jobs` until it is
/// closed and drained.
pub(crate) fn spawn_workers(jobs: &Arc<JobQueue<Job>>, count: usize) -> io::Result<()> {
    for i in 0..count {
        let q = Arc::clone(jobs);
        std::thread::Builder::new()
            .name(format!("nbd-worker-{i}"))
            .spawn(move || {
                while let Some(job) = q.pop() {
                    let write = job.is_write();
                    run_job(job);
                    if write {
                        q.write_done();
                    }
                }
            })?;
    }
    Ok(())
}

fn requests(
    shared: &Shared,
    jobs: &JobQueue<Job>,
    conn: &Arc<Conn>,
    r: &mut BufReader<Stream>,
    negotiated: Negotiated,
    peer: &str,
) {
    let id = conn.id;
    let ctx = RequestContext {
        size: conn.device.size(),
        read_only: conn.device.is_read_only(),
        structured: negotiated.structured,
        base_allocation: negotiated.base_allocation,
        can_fast_zero: conn.device.can_fast_zero(),
    };
    let mut after_large_write = false;
    loop {
        if shared.is_shutting_down() || conn.is_broken() {
            return;
        }
        let mut hb = [0u8; REQUEST_HEADER_BYTES];
        // After a large write, the next request is likely one too: its
        // header is read alone, so that its payload is not pulled into the
        // reader's buffer (and copied out again) with it.
        let header = if after_large_write && r.buffer().is_empty() {
            read_or_eof(r.get_mut(), &mut hb)
        } else {
            read_or_eof(r, &mut hb)
        };
        match header {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(conn = id, "client closed without NBD_CMD_DISC");
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                if !shared.is_shutting_down() {
                    protocol_violation(shared, id, peer, "truncated request header");
                }
                return;
            }
            Err(e) => {
                tracing::info!(conn = id, error = %e, "connection lost");
                return;
            }
        }
        let Some(h) = request::parse_header(&hb) else {
            protocol_violation(shared, id, peer, "bad request magic");
            return;
        };
        shared.counters.count_request(h.cmd);
        tracing::trace!(
            conn = id,
            cmd = command_name(h.cmd),
            offset = h.offset,
            len = h.length,
            "request"
        );
        let mut payload = Vec::new();
        match request::payload_of(&h) {
            Payload::None => after_large_write = false,
            Payload::Read(n) => match read_payload(r, &mut payload, n) {
                Ok(()) => after_large_write = n >= LARGE_WRITE,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    protocol_violation(shared, id, peer, "truncated write payload");
                    return;
                }
                Err(e) => {
                    tracing::info!(conn = id, error = %e, "connection lost");
                    return;
                }
            },
            Payload::Discard(n) => match io::copy(&mut r.take(n), &mut io::sink()) {
                Ok(got) if got == n => {}
                _ => {
                    protocol_violation(shared, id, peer, "truncated oversized write payload");
                    return;
                }
            },
            Payload::Unskippable => {
                protocol_violation(
                    shared,
                    id,
                    peer,
                    &format!("write of {} bytes, too long to skip", h.length),
                );
                return;
            }
        }
        let command = match request::validate(&h, &ctx) {
            Ok(c) => c,
            Err(rej) => {
                Counters::add(&shared.counters.errors, 1);
                tracing::debug!(
                    conn = id,
                    cmd = command_name(h.cmd),
                    offset = h.offset,
                    len = h.length,
                    errno = rej.errno,
                    why = rej.why,
                    "request rejected"
                );
                // Admitted like any request, so that a DISC right behind
                // it does not close the socket with its reply still queued.
                conn.admit(0);
                conn.send(
                    reply::error(conn.structured, h.cookie, rej.errno, rej.why),
                    Some(0),
                );
                continue;
            }
        };
        if command == Command::Disc {
            return;
        }
        let cost_bytes = match command {
            Command::Read { len, .. } | Command::Write { len, .. } => u64::from(len),
            _ => 0,
        };
        // Admitted before it is tried on the spot too: its reply may wait
        // in the queue of a worker that is writing, and `Conn::finish`
        // closes the socket only once every admitted reply is out.
        conn.admit(cost_bytes);
        if let Command::Read { offset, len } = command {
            if len <= INLINE_READ_MAX && conn.inline_reads {
                if let Some(reply) = read_inline(conn, h.cookie, offset, len) {
                    conn.send(reply, Some(cost_bytes));
                    continue;
                }
            }
        }
        let job = Job {
            conn: Arc::clone(conn),
            cookie: h.cookie,
            command,
            payload,
            cost_bytes,
        };
        if let Err(job) = jobs.push(job) {
            // Workers gone: cannot happen while the server lives; answer anyway.
            conn.send(
                reply::error(conn.structured, job.cookie, ESHUTDOWN, "server stopping"),
                Some(job.cost_bytes),
            );
        }
    }
}

/// Read exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream
/// before the first byte.
fn read_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads at most this long are first tried on the connection's reader
/// thread (`read_inline`): below the engine's stream reads (64 KiB), so
/// what is tried is a page-cache read and a chunk's decode.
const INLINE_READ_MAX: u32 = 32 << 10;

/// Answers a READ on the reader thread if the device can without waiting
/// (`BlockDevice::try_read_cached`): no hand-off to a worker and back, two
/// thread switches a read (17% of the server's time in 4 KiB random reads,
/// docs/benchmarks.md). None: the device would wait; a worker reads.
fn read_inline(conn: &Conn, cookie: u64, offset: u64, len: u32) -> Option<Vec<u8>> {
    let mut r = reply::ReadReply::new(conn.structured, cookie, offset, len);
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        conn.device.try_read_cached(offset, r.data_mut())
    }));
    let res = match res {
        Ok(res) => res?,
        Err(_) => Err(io::Error::other("device panicked")),
    };
    Counters::add(&conn.counters.reads_inline, 1);
    Some(read_reply(conn, r, cookie, offset, len, res))
}

/// The reply to a READ whose device call gave `res` (`Ok(hole)`).
fn read_reply(
    conn: &Conn,
    r: reply::ReadReply,
    cookie: u64,
    offset: u64,
    len: u32,
    res: io::Result<bool>,
) -> Vec<u8> {
    match res {
        Ok(hole) => {
            Counters::add(&conn.counters.bytes_read, u64::from(len));
            if hole && conn.structured && conn.read_holes {
                reply::offset_hole(cookie, offset, len)
            } else {
                r.into_bytes()
            }
        }
        Err(e) => failed(conn, cookie, "read", e),
    }
}

/// The error reply to a request whose device call (`what`) failed with
/// `e`, counted and logged.
fn failed(conn: &Conn, cookie: u64, what: &str, e: io::Error) -> Vec<u8> {
    let errno = request::errno_for(&e);
    Counters::add(&conn.counters.errors, 1);
    tracing::warn!(conn = conn.id, error = %e, errno, "{what} failed");
    reply::error(conn.structured, cookie, errno, what)
}

/// Run one request on the device and send its reply (worker side).
fn run_job(mut job: Job) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| execute(&mut job)));
    let conn = &job.conn;
    let bytes = match result {
        Ok(bytes) => bytes,
        Err(_) => {
            tracing::error!(conn = conn.id, "device panicked; answering EIO");
            Counters::add(&conn.counters.errors, 1);
            reply::error(conn.structured, job.cookie, EIO, "internal error")
        }
    };
    conn.send(bytes, Some(job.cost_bytes));
}

fn execute(job: &mut Job) -> Vec<u8> {
    let conn = &job.conn;
    let dev = &*conn.device;
    let cookie = job.cookie;
    let done = |r: io::Result<()>, what: &str| match r {
        Ok(()) => reply::simple(cookie, 0),
        Err(e) => failed(conn, cookie, what, e),
    };
    match job.command {
        Command::Read { offset, len } => {
            let mut r = reply::ReadReply::new(conn.structured, cookie, offset, len);
            // With structured replies, one device call reads and tells
            // whether the range is all hole (answered with OFFSET_HOLE).
            let res = if conn.structured && conn.read_holes {
                dev.read_or_hole(offset, r.data_mut())
            } else {
                dev.read_at(offset, r.data_mut()).map(|()| false)
            };
            read_reply(conn, r, cookie, offset, len, res)
        }
        Command::Write { offset, len, fua } => {
            debug_assert_eq!(job.payload.len(), len as usize);
            let r = dev.write_owned(offset, std::mem::take(&mut job.payload), fua);
            if r.is_ok() {
                Counters::add(&conn.counters.bytes_written, u64::from(len));
            }
            done(r, "write")
        }
        Command::Flush => done(dev.flush(), "flush"),
        Command::Trim { offset, len, fua } => done(dev.trim(offset, len, fua), "trim"),
        Command::WriteZeroes {
            offset,
            len,
            may_trim,
            fua,
        } => done(dev.write_zeroes(offset, len, may_trim, fua), "write_zeroes"),
        Command::BlockStatus {
            offset,
            len,
            req_one,
        } => match dev.block_status(offset, len) {
            Ok(ext) => reply::block_status(
                cookie,
                META_BASE_ALLOCATION_ID,
                &reply::block_status_extents(&ext, len, req_one),
            ),
            Err(e) => failed(conn, cookie, "block_status", e),
        },
        Command::Disc => unreachable!("DISC is handled by the reader"),
    }
}

/// A write payload at least this large is read from the socket straight
/// into its own buffer (`read_payload`), and so is the header after it.
const LARGE_WRITE: usize = 32 << 10;

/// Reads a write's `n` bytes of payload into `out` (empty): what the reader
/// already holds, then the rest straight from the socket into `out`'s spare
/// capacity (no zero-fill of up to 32 MiB, no copy through the reader's
/// buffer: each was a tenth of the server's CPU in a sequential write).
fn read_payload(r: &mut BufReader<Stream>, out: &mut Vec<u8>, n: usize) -> io::Result<()> {
    out.reserve_exact(n);
    let held = r.buffer();
    let k = held.len().min(n);
    out.extend_from_slice(&held[..k]);
    r.consume(k);
    while out.len() < n {
        let want = n - out.len();
        let got = r
            .get_mut()
            .read_uninit(&mut out.spare_capacity_mut()[..want])?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // SAFETY: read_uninit initialised `got` bytes of the spare
        // capacity, right after the initialised ones.
        unsafe { out.set_len(out.len() + got) };
    }
    Ok(())
}
