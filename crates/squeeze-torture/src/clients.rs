//! The NBD clients of one cycle: per connection a sender that draws
//! requests from its seeded stream (writes with and without FUA, aligned
//! and unaligned, of three kinds of content; TRIM, WRITE_ZEROES, FLUSH and
//! READ) and registers them in the model before they go, and a receiver
//! that applies the replies (acks, flush marks, live READ checks); `drive`
//! runs them for the plan's time and SIGKILLs the server under them.

use crate::content::{fill, Kind, SECTOR};
use crate::model::Model;
use crate::nbd::{self, Conn};
use crate::options::{Options, Plan};
use crate::proc::Server;
use crate::report::{Counters, Totals};
use crate::rng::Rng;
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// One request the server has not answered yet.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Write {
        id: u64,
        first: u64,
        last: u64,
        fua: bool,
    },
    Read {
        offset: u64,
        len: u64,
        first: u64,
        last: u64,
    },
    Flush {
        mark: u64,
    },
}

#[derive(Default)]
pub(crate) struct ConnState {
    pub(crate) inflight: HashMap<u64, Op>,
    pub(crate) dead: bool,
}

pub(crate) struct Shared {
    pub(crate) model: Model,
    pub(crate) conns: Vec<ConnState>,
    pub(crate) next_id: u64,
    pub(crate) next_cookie: u64,
    pub(crate) stop: bool,
    pub(crate) failures: Vec<String>,
    pub(crate) t: Totals,
}

pub(crate) struct Sync {
    pub(crate) s: Mutex<Shared>,
    pub(crate) cv: Condvar,
}

impl Sync {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Shared> {
        self.s.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long an idle phase waits for the run's first upgrade
/// (`Options::wait_for_upgrade`).
const UPGRADE_WAIT_MAX: Duration = Duration::from_secs(60);

/// Polls the server's stats until its upgraded bytes grow past `first`
/// (the idle phase's start: the first segment an idle upgrade rewrote),
/// or `UPGRADE_WAIT_MAX` passes (then
/// the run's totals say no upgrade ran, for the caller to judge).
fn wait_for_upgrade(sample: &dyn Fn() -> Result<Counters, String>, first: &Counters) {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < UPGRADE_WAIT_MAX {
        match sample() {
            Ok(c) if c[6] > first[6] => return,
            Ok(_) => std::thread::sleep(Duration::from_millis(200)),
            Err(_) => return,
        }
    }
}

/// Runs the writers for the plan's time, SIGKILLs the server and collects
/// the threads. Returns the number of requests in flight at the kill.
pub(crate) fn drive(
    sync: &Sync,
    o: &Options,
    cycle: u64,
    plan: &Plan,
    conns: Vec<Conn>,
    server: &mut Server,
    sample: &dyn Fn() -> Result<Counters, String>,
) -> Result<(u64, Counters), String> {
    {
        let mut g = sync.lock();
        g.stop = false;
        g.failures.clear();
        g.conns = (0..conns.len()).map(|_| ConnState::default()).collect();
    }
    let (inflight_at_kill, counters) =
        std::thread::scope(|s| -> Result<(u64, Counters), String> {
            for (i, c) in conns.into_iter().enumerate() {
                let rx = c
                    .stream
                    .try_clone()
                    .map_err(|e| format!("cloning socket: {e}"))?;
                let rng = Rng::derive(o.seed, cycle, i as u64);
                let tx = c.stream;
                let limit = plan.inflight;
                let dedup = o.dedup;
                s.spawn(move || sender(sync, i, tx, rng, limit, o.seed, dedup));
                s.spawn(move || receiver(sync, i, rx));
            }
            std::thread::sleep(Duration::from_millis(plan.write_ms));
            if let Some(idle) = plan.idle_ms {
                // Senders stop; receivers take the last replies; the
                // server goes idle and merges and cleans until the kill.
                sync.lock().stop = true;
                sync.cv.notify_all();
                let first = (o.wait_for_upgrade && sync.lock().t.upgraded_bytes == 0)
                    .then(sample)
                    .and_then(Result::ok);
                std::thread::sleep(Duration::from_millis(idle));
                if let Some(first) = first {
                    wait_for_upgrade(sample, &first);
                }
            }
            let counters = sample();
            let (n, died) = {
                let g = sync.lock();
                let n: usize = g.conns.iter().map(|c| c.inflight.len()).sum();
                (n as u64, g.conns.iter().any(|c| c.dead))
            };
            let exited = server.try_wait();
            server.kill();
            {
                let mut g = sync.lock();
                g.stop = true;
            }
            sync.cv.notify_all();
            if let Some(st) = exited {
                return Err(format!(
                    "squeeze serve died on its own ({st}) while being driven"
                ));
            }
            let counters = counters?;
            if died {
                let g = sync.lock();
                if g.failures.is_empty() {
                    return Err("a connection was closed by the server while being driven".into());
                }
            }
            Ok((n, counters))
        })?;
    let g = sync.lock();
    if !g.failures.is_empty() {
        return Err(g.failures.join("\n"));
    }
    Ok((inflight_at_kill, counters))
}

/// Picks `[offset, offset+len)` for a request.
fn pick_range(r: &mut Rng, size: u64, big: u64) -> (u64, u64, bool) {
    // Half the requests go to the first eighth: overwrites make garbage
    // for the cleaner.
    let region = if r.percent(50) { size / 8 } else { size };
    if r.percent(75) {
        let sectors = if r.percent(5) {
            r.between(1, big / SECTOR)
        } else {
            r.between(1, 64)
        };
        let len = sectors * SECTOR;
        let off = r.below((region - len) / SECTOR + 1) * SECTOR;
        (off, len, false)
    } else {
        let len = r.between(1, 48 << 10);
        (r.below(region - len + 1), len, true)
    }
}

/// Aligned ranges this sender wrote lately: the sources `--dedup`'s copies
/// prefer (content that is not all zeros).
const RECENT: usize = 32;

fn sender(
    sync: &Sync,
    conn: usize,
    mut tx: std::os::unix::net::UnixStream,
    mut r: Rng,
    limit: u64,
    seed: u64,
    dedup: bool,
) {
    let size = sync.lock().model.latest.len() as u64;
    let mut buf = Vec::new();
    let mut recent: Vec<u64> = Vec::new();
    loop {
        // Choose under the lock, fill outside it, register, send.
        let dice = r.below(100);
        let (cmd, fua) = match dice {
            0..55 => (nbd::CMD_WRITE, false),
            55..65 => (nbd::CMD_WRITE, true),
            65..75 => (nbd::CMD_READ, false),
            75..83 => (nbd::CMD_FLUSH, false),
            83..92 => (nbd::CMD_TRIM, r.percent(10)),
            _ => (nbd::CMD_WRITE_ZEROES, r.percent(10)),
        };
        let kind = match r.below(100) {
            0..45 => Kind::Random,
            45..90 => Kind::Text,
            _ => Kind::Zero,
        };
        let big = if cmd == nbd::CMD_WRITE {
            1 << 20
        } else {
            4 << 20
        };
        // --dedup: a third of the aligned writes copy other sectors.
        let copy = dedup && cmd == nbd::CMD_WRITE && r.percent(33);
        let mut g = sync.lock();
        let mut tries = 0;
        let (offset, len, unaligned) = loop {
            if g.stop || g.conns[conn].dead {
                return;
            }
            if (g.conns[conn].inflight.len() as u64) < limit {
                if cmd == nbd::CMD_FLUSH {
                    break (0, 0, false);
                }
                let (off, len, un) = pick_range(&mut r, size, big);
                let (first, last) = Model::span(off, len);
                if g.model.try_reserve(first, last) {
                    break (off, len, un);
                }
                tries += 1;
                if tries < 8 {
                    continue;
                }
            }
            tries = 0;
            g = sync
                .cv
                .wait_timeout(g, Duration::from_millis(2))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        let cookie = g.next_cookie;
        g.next_cookie += 1;
        let (first, last) = Model::span(offset, len);
        let op = match cmd {
            nbd::CMD_FLUSH => {
                g.t.flushes += 1;
                Op::Flush {
                    mark: g.model.flush_mark(),
                }
            }
            nbd::CMD_READ => {
                g.t.reads += 1;
                Op::Read {
                    offset,
                    len,
                    first,
                    last,
                }
            }
            _ => {
                let id = g.next_id;
                g.next_id += 1;
                let note = format!(
                    "{} {}{} of {len} bytes at {offset} on connection {conn}",
                    nbd::command_name(cmd),
                    if cmd == nbd::CMD_WRITE {
                        kind.name()
                    } else {
                        ""
                    },
                    if fua { " FUA" } else { "" }
                );
                // The source of a copy: a range this sender wrote lately
                // (in this cycle), else anywhere (content of earlier
                // cycles too); sector-aligned, so the copy's sectors are
                // the source's.
                let src = (copy && !unaligned).then(|| {
                    let from = if !recent.is_empty() && r.percent(70) {
                        recent[r.below(recent.len() as u64) as usize]
                    } else {
                        r.below(size / SECTOR) * SECTOR
                    };
                    from.min(size - len) / SECTOR * SECTOR
                });
                let note = match src {
                    Some(s) => format!("{note} (a copy of the bytes at {s})"),
                    None => note,
                };
                g.model.notes.insert(id, note);
                match cmd {
                    nbd::CMD_WRITE => {
                        g.t.writes += 1;
                        g.t.copy_writes += u64::from(src.is_some());
                        g.t.fua_writes += u64::from(fua);
                        g.t.unaligned_writes += u64::from(unaligned);
                        g.t.bytes_written += len;
                    }
                    nbd::CMD_TRIM => g.t.trims += 1,
                    _ => g.t.write_zeroes += 1,
                }
                buf.resize(len as usize, 0);
                if let Some(s) = src {
                    // What the model says those sectors hold now (an
                    // unfinished write's bytes, maybe: any bytes do).
                    buf.copy_from_slice(&g.model.latest[s as usize..(s + len) as usize]);
                } else {
                    drop(g);
                    let k = if cmd == nbd::CMD_WRITE {
                        kind
                    } else {
                        Kind::Zero
                    };
                    fill(&mut buf, seed, id, offset, k);
                    g = sync.lock();
                }
                if dedup && cmd == nbd::CMD_WRITE && !unaligned && kind != Kind::Zero {
                    if recent.len() == RECENT {
                        recent.remove(0);
                    }
                    recent.push(offset);
                }
                g.model.apply_write(id, offset, &buf);
                Op::Write {
                    id,
                    first,
                    last,
                    fua,
                }
            }
        };
        g.conns[conn].inflight.insert(cookie, op);
        drop(g);
        let flags = if fua { nbd::CMD_FLAG_FUA } else { 0 };
        let h = Conn::header(cmd, flags, cookie, offset, len as u32);
        let sent = if cmd == nbd::CMD_WRITE {
            tx.write_all(&h).and_then(|()| tx.write_all(&buf))
        } else {
            tx.write_all(&h)
        };
        if sent.is_err() {
            return;
        }
    }
}

fn receiver(sync: &Sync, conn: usize, mut rx: std::os::unix::net::UnixStream) {
    let mut data = Vec::new();
    while let Ok(rep) = Conn::read_reply(&mut rx) {
        let op = sync.lock().conns[conn].inflight.remove(&rep.cookie);
        let Some(op) = op else {
            let mut g = sync.lock();
            g.failures.push(format!(
                "connection {conn}: reply for unknown cookie {}",
                rep.cookie
            ));
            break;
        };
        if let Op::Read { len, .. } = op {
            if rep.errno == 0 {
                data.resize(len as usize, 0);
                if std::io::Read::read_exact(&mut rx, &mut data).is_err() {
                    break;
                }
            }
        }
        let mut g = sync.lock();
        if rep.errno != 0 {
            g.failures.push(format!(
                "connection {conn}: {op:?} failed with errno {}",
                rep.errno
            ));
        }
        match op {
            Op::Write {
                id,
                first,
                last,
                fua,
                ..
            } => {
                g.model.release(first, last);
                if rep.errno == 0 {
                    g.model.acked_write(id, first, last, fua);
                }
            }
            Op::Read {
                offset,
                len,
                first,
                last,
            } => {
                if rep.errno == 0 {
                    let want = &g.model.latest[offset as usize..(offset + len) as usize];
                    if want != &data[..] {
                        let at = want
                            .iter()
                            .zip(&data)
                            .position(|(a, b)| a != b)
                            .unwrap_or(0);
                        let msg = format!(
                            "connection {conn}: live READ of {len} bytes at {offset} differs from what was written, first at byte {}",
                            offset + at as u64
                        );
                        g.failures.push(msg);
                    }
                }
                g.model.release(first, last);
            }
            Op::Flush { mark } => {
                if rep.errno == 0 {
                    g.model.flushed(mark);
                }
            }
        }
        drop(g);
        sync.cv.notify_all();
    }
    sync.lock().conns[conn].dead = true;
    sync.cv.notify_all();
}
