//! The crash loop: start `squeeze serve`, drive it, SIGKILL it while
//! requests are in flight, restart it (recovery), read every sector back
//! and check it against the model; repeat on the same volume.

use crate::content::{fill, Kind, SECTOR};
use crate::model::{Model, VerifyCounts};
use crate::nbd::{self, Conn};
use crate::proc::{self, Server};
use crate::rng::Rng;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `squeeze` binary.
    pub bin: PathBuf,
    pub seed: u64,
    pub cycles: u64,
    /// Logical size of the volume (bytes).
    pub size: u64,
    /// `--segment-size` of the volume (small, so the cleaner and
    /// checkpoints have work).
    pub segment_size: String,
    /// Writing time per cycle is uniform in this range (ms).
    pub min_ms: u64,
    pub max_ms: u64,
    /// Percentage of cycles that write for 600-1500 ms instead, so the
    /// server's maintenance thread (first pass after 500 ms) cleans and
    /// checkpoints while being driven, and is killed in the middle of it.
    pub long_percent: u64,
    /// Percentage of cycles whose clients stop sending after the writing
    /// phase and stay connected and quiet for 1.2-2.5 s before the kill:
    /// the server is then idle (after 1 s) and merges fragmented windows
    /// and cleans at full speed, and is killed in the middle of it.
    pub idle_percent: u64,
    /// Connections per cycle: 1..=max_conns.
    pub max_conns: u64,
    /// Requests in flight per connection: 1..=max_inflight.
    pub max_inflight: u64,
    /// Between some cycles stop the server (SIGKILL or SIGTERM), run
    /// `squeeze check`, run `squeeze compact` (sometimes SIGKILLed part
    /// way), then restart and verify.
    pub compact: bool,
    /// Start the server with `--simulate-saturated-engine`: every write
    /// batch is compressed below the volume's target codec, so the idle
    /// phases (`idle_percent`) run upgrades and kills land inside them.
    pub saturated_engine: bool,
    /// Start the server with `--prewrite`: small flushes pre-write zeros
    /// past the log head, so kills land between zeros and records.
    pub prewrite: bool,
    /// Start the server with `--map-cache SIZE`: a small cache pages the
    /// sector map out to the checkpoint chain, so kills land while chunks
    /// are read back and while bases read them.
    pub map_cache: Option<String>,
    /// Where the work directory goes (default: the system temp dir).
    pub workdir: Option<PathBuf>,
    /// Keep the work directory even on success.
    pub keep: bool,
    /// Print a line per cycle.
    pub verbose: bool,
}

impl Options {
    pub fn new(bin: PathBuf, seed: u64, cycles: u64) -> Options {
        Options {
            bin,
            seed,
            cycles,
            size: 64 << 20,
            segment_size: "1M".into(),
            min_ms: 50,
            max_ms: 500,
            long_percent: 15,
            idle_percent: 10,
            max_conns: 3,
            max_inflight: 16,
            compact: false,
            saturated_engine: false,
            prewrite: false,
            map_cache: None,
            workdir: None,
            keep: false,
            verbose: false,
        }
    }

    /// The command line that replays this run up to and including `cycle`.
    pub fn replay_command(&self, cycle: u64) -> String {
        let mut c = format!(
            "squeeze-torture --seed {} --cycles {} --size {} --segment-size {} --min-ms {} --max-ms {} --long-percent {} --idle-percent {} --max-conns {} --max-inflight {}",
            self.seed,
            cycle + 1,
            self.size,
            self.segment_size,
            self.min_ms,
            self.max_ms,
            self.long_percent,
            self.idle_percent,
            self.max_conns,
            self.max_inflight
        );
        if self.compact {
            c.push_str(" --compact");
        }
        if self.saturated_engine {
            c.push_str(" --saturated-engine");
        }
        if self.prewrite {
            c.push_str(" --prewrite");
        }
        if let Some(m) = &self.map_cache {
            c.push_str(&format!(" --map-cache {m}"));
        }
        c
    }
}

/// A failed run: where, and what was wrong.
#[derive(Debug)]
pub struct Failure {
    pub seed: u64,
    pub cycle: u64,
    pub message: String,
    pub replay: String,
    pub workdir: Option<PathBuf>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "squeeze-torture FAILED at seed {} cycle {}:",
            self.seed, self.cycle
        )?;
        writeln!(f, "{}", self.message)?;
        writeln!(
            f,
            "replay (same operation stream; timing differs): {}",
            self.replay
        )?;
        if let Some(d) = &self.workdir {
            writeln!(f, "work dir kept (volume, serve.log): {}", d.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

/// What a run did.
#[derive(Default, Debug, Clone)]
pub struct Totals {
    pub cycles: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub unaligned_writes: u64,
    pub bytes_written: u64,
    pub reads: u64,
    pub flushes: u64,
    pub trims: u64,
    pub write_zeroes: u64,
    pub connections: u64,
    /// Requests sent but not answered when the server was killed.
    pub in_flight_at_kill: u64,
    pub kills: u64,
    pub clean_stops: u64,
    pub compacts: u64,
    pub compacts_killed: u64,
    pub checks: u64,
    pub verify: VerifyCounts,
    /// The volume's own counters (`squeeze stats`), summed over the server
    /// runs (each sampled after the start and just before the SIGKILL):
    /// checkpoints written, segments reclaimed, bytes the cleaner moved,
    /// log bytes written, bytes the idle merger rewrote.
    pub checkpoints: u64,
    pub segments_reclaimed: u64,
    pub cleaner_bytes_moved: u64,
    pub log_bytes_written: u64,
    pub merged_bytes: u64,
    /// Raw bytes written below the target codec, and raw bytes the idle
    /// upgrade rewrote with it (with `saturated_engine`).
    pub below_target_bytes: u64,
    pub upgraded_bytes: u64,
    /// Idle cycles whose server had upgraded bytes before its SIGKILL (the
    /// kill then lands during or right after an upgrade pass).
    pub kills_after_upgrades: u64,
    pub seconds: f64,
}

impl fmt::Display for Totals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cycles in {:.1} s: {} SIGKILLs with {} requests in flight, {} connections; {} writes ({} FUA, {} unaligned, {:.1} MiB), {} reads, {} flushes, {} trims, {} write-zeroes; {} clean stops, {} compacts ({} killed), {} checks; after the crashes: {} sectors at their latest content, {} at an intermediate one, {} rolled back to durable; {} of these lost an acknowledged unflushed write; volume: {} checkpoints, {} segments reclaimed, cleaner moved {:.1} MiB, merger rewrote {:.1} MiB, log {:.1} MiB; {:.1} MiB written below the target codec, {:.1} MiB upgraded, {} idle kills after upgrades",
            self.cycles,
            self.seconds,
            self.kills,
            self.in_flight_at_kill,
            self.connections,
            self.writes,
            self.fua_writes,
            self.unaligned_writes,
            self.bytes_written as f64 / (1u64 << 20) as f64,
            self.reads,
            self.flushes,
            self.trims,
            self.write_zeroes,
            self.clean_stops,
            self.compacts,
            self.compacts_killed,
            self.checks,
            self.verify.latest,
            self.verify.intermediate,
            self.verify.rolled_back,
            self.verify.lost_acked_unflushed,
            self.checkpoints,
            self.segments_reclaimed,
            self.cleaner_bytes_moved as f64 / (1u64 << 20) as f64,
            self.merged_bytes as f64 / (1u64 << 20) as f64,
            self.log_bytes_written as f64 / (1u64 << 20) as f64,
            self.below_target_bytes as f64 / (1u64 << 20) as f64,
            self.upgraded_bytes as f64 / (1u64 << 20) as f64,
            self.kills_after_upgrades
        )
    }
}

/// One request the server has not answered yet.
#[derive(Debug, Clone)]
enum Op {
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
struct ConnState {
    inflight: HashMap<u64, Op>,
    dead: bool,
}

struct Shared {
    model: Model,
    conns: Vec<ConnState>,
    next_id: u64,
    next_cookie: u64,
    stop: bool,
    failures: Vec<String>,
    t: Totals,
}

struct Sync {
    s: Mutex<Shared>,
    cv: Condvar,
}

impl Sync {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.s.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The random choices of one cycle.
struct Plan {
    conns: u64,
    inflight: u64,
    write_ms: u64,
    /// Quiet time after the writing phase, before the kill.
    idle_ms: Option<u64>,
    go: Vec<bool>,
    /// Stop, check and compact after this cycle's verify.
    compact: bool,
    clean_stop: bool,
    check: bool,
    /// Kill `squeeze compact` after this many ms (None: let it finish).
    kill_compact_ms: Option<u64>,
}

impl Plan {
    fn new(o: &Options, cycle: u64) -> Plan {
        let mut r = Rng::derive(o.seed, cycle, u64::MAX);
        let conns = r.between(1, o.max_conns.max(1));
        Plan {
            conns,
            inflight: r.between(1, o.max_inflight.max(1)),
            write_ms: if r.percent(o.long_percent) {
                r.between(600, 1500)
            } else {
                r.between(o.min_ms, o.max_ms.max(o.min_ms))
            },
            go: (0..conns).map(|_| r.percent(70)).collect(),
            compact: o.compact && r.percent(25),
            idle_ms: r.percent(o.idle_percent).then(|| r.between(1200, 2500)),
            clean_stop: r.percent(40),
            check: r.percent(50),
            kill_compact_ms: if r.percent(60) {
                Some(r.between(0, 150))
            } else {
                None
            },
        }
    }
}

/// Runs the torture; `say` gets progress lines.
pub fn run(o: &Options, say: &mut dyn FnMut(&str)) -> Result<Totals, Box<Failure>> {
    let mut b = tempfile::Builder::new();
    b.prefix("squeeze-torture-");
    let dir = match &o.workdir {
        Some(w) => b.tempdir_in(w),
        None => b.tempdir(),
    }
    .map_err(|e| fail(o, 0, format!("temp dir: {e}"), None))?;
    let mut cycle = 0;
    let result = run_in(o, dir.path(), &mut cycle, say);
    match result {
        Ok(t) => {
            if o.keep {
                say(&format!("work dir kept: {}", dir.keep().display()));
            }
            Ok(t)
        }
        Err(msg) => {
            let kept = dir.keep();
            let log = proc::tail(&kept.join("serve.log"), 40);
            let msg = format!("{msg}\n--- last lines of serve.log ---\n{log}");
            Err(fail(o, cycle, msg, Some(kept)))
        }
    }
}

fn fail(o: &Options, cycle: u64, message: String, workdir: Option<PathBuf>) -> Box<Failure> {
    Box::new(Failure {
        seed: o.seed,
        cycle,
        message,
        replay: o.replay_command(cycle),
        workdir,
    })
}

fn run_in(
    o: &Options,
    dir: &Path,
    cycle_out: &mut u64,
    say: &mut dyn FnMut(&str),
) -> Result<Totals, String> {
    let t0 = Instant::now();
    let vol = dir.join("vol.sqz");
    let socket = dir.join("s.sock");
    let log = dir.join("serve.log");
    let size_arg = o.size.to_string();
    let st = proc::run(
        &o.bin,
        &[
            OsStr::new("create"),
            vol.as_os_str(),
            OsStr::new("--size"),
            OsStr::new(&size_arg),
            OsStr::new("--segment-size"),
            OsStr::new(&o.segment_size),
        ],
        &log,
    )?;
    if !st.success() {
        return Err(format!(
            "squeeze create failed ({st}):\n{}",
            proc::tail(&log, 10)
        ));
    }
    let sync = Sync {
        s: Mutex::new(Shared {
            model: Model::new(o.size),
            conns: Vec::new(),
            next_id: 1,
            next_cookie: 1,
            stop: false,
            failures: Vec::new(),
            t: Totals::default(),
        }),
        cv: Condvar::new(),
    };
    let mut server = Server::start(&o.bin, &serve_args(o), &vol, &socket, &log)?;
    for cycle in 0..o.cycles {
        *cycle_out = cycle;
        let plan = Plan::new(o, cycle);
        let mut conns = Vec::new();
        for &go in &plan.go {
            let c = Conn::connect(&socket, go).map_err(|e| format!("connecting: {e}"))?;
            check_export(&c, o.size, plan.conns > 1)?;
            conns.push(c);
        }
        mark_log(&log, &format!("cycle {cycle}: {} connections", plan.conns));
        let before = counters(o, &vol, &log)?;
        let (inflight, after) = drive(&sync, o, cycle, &plan, conns, &mut server, &|| {
            counters(o, &vol, &log)
        })?;
        let summary = {
            let mut g = sync.lock();
            g.t.checkpoints += after[0].saturating_sub(before[0]);
            g.t.segments_reclaimed += after[1].saturating_sub(before[1]);
            g.t.cleaner_bytes_moved += after[2].saturating_sub(before[2]);
            g.t.log_bytes_written += after[3].saturating_sub(before[3]);
            g.t.merged_bytes += after[4].saturating_sub(before[4]);
            g.t.below_target_bytes += after[5].saturating_sub(before[5]);
            let upgraded = after[6].saturating_sub(before[6]);
            g.t.upgraded_bytes += upgraded;
            if upgraded > 0 && plan.idle_ms.is_some() {
                g.t.kills_after_upgrades += 1;
            }
            g.t.kills += 1;
            g.t.in_flight_at_kill += inflight;
            g.t.connections += plan.conns;
            format!(
                "cycle {cycle}: {} conns x {} in flight, {} ms, SIGKILL with {inflight} in flight",
                plan.conns, plan.inflight, plan.write_ms
            )
        };
        mark_log(&log, &format!("cycle {cycle}: SIGKILL"));
        let t1 = Instant::now();
        server = Server::start(&o.bin, &serve_args(o), &vol, &socket, &log)?;
        let restart_ms = t1.elapsed().as_secs_f64() * 1e3;
        let t2 = Instant::now();
        let c = verify(&sync, &socket, o.size, false)
            .map_err(|e| format!("after SIGKILL with {inflight} requests in flight: {e}"))?;
        let verify_ms = t2.elapsed().as_secs_f64() * 1e3;
        if o.verbose {
            say(&format!(
                "{summary}; restart {:.0} ms, verify {:.0} ms: {} latest, {} intermediate, {} rolled back ({} lost acked unflushed)",
                restart_ms, verify_ms, c.latest, c.intermediate, c.rolled_back, c.lost_acked_unflushed
            ));
        }
        if plan.compact {
            let what = offline_step(o, &plan, &sync, &mut server, &vol, &log)?;
            server = Server::start(&o.bin, &serve_args(o), &vol, &socket, &log)?;
            verify(&sync, &socket, o.size, true).map_err(|e| format!("after {what}: {e}"))?;
            if o.verbose {
                say(&format!("cycle {cycle}: {what}; verified exact"));
            }
        }
        sync.lock().t.cycles += 1;
    }
    // A clean stop, a check, and one more exact read back.
    *cycle_out = o.cycles.saturating_sub(1);
    server.terminate()?;
    check_volume(o, &vol, &log)?;
    server = Server::start(&o.bin, &serve_args(o), &vol, &socket, &log)?;
    verify(&sync, &socket, o.size, true).map_err(|e| format!("after the final clean stop: {e}"))?;
    server.terminate()?;
    let mut g = sync.lock();
    g.t.clean_stops += 1;
    g.t.checks += 1;
    g.t.seconds = t0.elapsed().as_secs_f64();
    Ok(g.t.clone())
}

/// Options of every `squeeze serve` this run starts.
/// The server's flags: the smallest garbage budget, so that the cleaner
/// relocates as much as it ever does while the kills land (the budget
/// decides when it cleans, not how).
fn serve_args(o: &Options) -> Vec<&str> {
    let mut a = vec!["--gc-budget", "15"];
    if o.saturated_engine {
        a.push("--simulate-saturated-engine");
    }
    if o.prewrite {
        a.push("--prewrite");
    }
    if let Some(m) = &o.map_cache {
        a.extend(["--map-cache", m.as_str()]);
    }
    a
}

fn mark_log(log: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(log) {
        let _ = writeln!(f, "=== squeeze-torture: {line}");
    }
}

/// checkpoints, segments_reclaimed, cleaner_bytes_moved, log_bytes_written,
/// merged_bytes, below_target_bytes, upgraded_bytes of a running server.
type Counters = [u64; 7];

/// [`Counters`] of the running server (`squeeze stats CTL --json`).
fn counters(o: &Options, vol: &Path, log: &Path) -> Result<Counters, String> {
    let ctl = vol.with_extension("ctl");
    let stats = proc::output(
        &o.bin,
        &[OsStr::new("stats"), ctl.as_os_str(), OsStr::new("--json")],
        log,
    )?;
    let n = |k| proc::json_number(&stats, k).unwrap_or(0.0) as u64;
    Ok([
        n("checkpoints"),
        n("segments_reclaimed"),
        n("cleaner_bytes_moved"),
        n("log_bytes_written"),
        n("merged_bytes"),
        n("below_target_bytes"),
        n("upgraded_bytes"),
    ])
}

fn check_export(c: &Conn, size: u64, multi: bool) -> Result<(), String> {
    if c.size != size {
        return Err(format!("export size {} instead of {size}", c.size));
    }
    let need = nbd::TFLAG_SEND_FLUSH
        | nbd::TFLAG_SEND_FUA
        | nbd::TFLAG_SEND_TRIM
        | nbd::TFLAG_SEND_WRITE_ZEROES
        | if multi { nbd::TFLAG_CAN_MULTI_CONN } else { 0 };
    if c.flags & need != need {
        return Err(format!(
            "transmission flags {:#x} lack {:#x}",
            c.flags,
            need & !c.flags
        ));
    }
    Ok(())
}

fn check_volume(o: &Options, vol: &Path, log: &Path) -> Result<(), String> {
    let st = proc::run(&o.bin, &[OsStr::new("check"), vol.as_os_str()], log)?;
    if !st.success() {
        return Err(format!(
            "squeeze check failed ({st}):\n{}",
            proc::tail(log, 20)
        ));
    }
    Ok(())
}

/// Stops the server (SIGKILL or SIGTERM), maybe checks, then compacts
/// (maybe killing the compaction part way). Returns what it did.
fn offline_step(
    o: &Options,
    plan: &Plan,
    sync: &Sync,
    server: &mut Server,
    vol: &Path,
    log: &Path,
) -> Result<String, String> {
    let mut what = Vec::new();
    if plan.clean_stop {
        server.terminate()?;
        sync.lock().t.clean_stops += 1;
        what.push("SIGTERM".to_string());
    } else {
        server.kill();
        sync.lock().t.kills += 1;
        what.push("idle SIGKILL".to_string());
    }
    if plan.check {
        check_volume(o, vol, log)?;
        sync.lock().t.checks += 1;
        what.push("check".into());
    }
    let args = [OsStr::new("compact"), vol.as_os_str()];
    let (st, killed) = match plan.kill_compact_ms {
        Some(ms) => proc::run_and_kill(&o.bin, &args, log, Duration::from_millis(ms))?,
        None => (proc::run(&o.bin, &args, log)?, false),
    };
    if !killed && !st.success() {
        return Err(format!(
            "squeeze compact failed ({st}):\n{}",
            proc::tail(log, 20)
        ));
    }
    let mut g = sync.lock();
    g.t.compacts += 1;
    if killed {
        g.t.compacts_killed += 1;
        what.push(format!(
            "compact SIGKILLed after {} ms",
            plan.kill_compact_ms.unwrap_or(0)
        ));
    } else {
        what.push("compact".into());
    }
    Ok(what.join(", "))
}

/// Reads the whole volume over a fresh connection, checks it against the
/// model (`exact`: nothing may be pending), then flushes so the image read
/// is the durable base of the next cycle.
fn verify(sync: &Sync, socket: &Path, size: u64, exact: bool) -> Result<VerifyCounts, String> {
    let mut c = Conn::connect(socket, true).map_err(|e| format!("connecting to verify: {e}"))?;
    check_export(&c, size, false)?;
    let mut image = vec![0u8; size as usize];
    for chunk in image.chunks_mut(1 << 20).enumerate() {
        let (i, buf) = chunk;
        c.read_at((i as u64) << 20, buf)
            .map_err(|e| format!("verify READ at {}: {e}", (i as u64) << 20))?;
    }
    let counts = {
        let mut g = sync.lock();
        let c = g.model.verify(&image).map_err(|v| v.join("\n"))?;
        g.t.verify.add(&c);
        c
    };
    if exact && !counts.exact() {
        return Err(format!("expected an exact image, got {counts:?}"));
    }
    c.flush().map_err(|e| format!("FLUSH after verify: {e}"))?;
    c.disconnect()
        .map_err(|e| format!("disconnect after verify: {e}"))?;
    Ok(counts)
}

/// Runs the writers for the plan's time, SIGKILLs the server and collects
/// the threads. Returns the number of requests in flight at the kill.
fn drive(
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
                s.spawn(move || sender(sync, i, tx, rng, limit, o.seed));
                s.spawn(move || receiver(sync, i, rx));
            }
            std::thread::sleep(Duration::from_millis(plan.write_ms));
            if let Some(idle) = plan.idle_ms {
                // Senders stop; receivers take the last replies; the
                // server goes idle and merges and cleans until the kill.
                sync.lock().stop = true;
                sync.cv.notify_all();
                std::thread::sleep(Duration::from_millis(idle));
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

fn sender(
    sync: &Sync,
    conn: usize,
    mut tx: std::os::unix::net::UnixStream,
    mut r: Rng,
    limit: u64,
    seed: u64,
) {
    let size = sync.lock().model.latest.len() as u64;
    let mut buf = Vec::new();
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
                g.model.notes.insert(id, note);
                match cmd {
                    nbd::CMD_WRITE => {
                        g.t.writes += 1;
                        g.t.fua_writes += u64::from(fua);
                        g.t.unaligned_writes += u64::from(unaligned);
                        g.t.bytes_written += len;
                    }
                    nbd::CMD_TRIM => g.t.trims += 1,
                    _ => g.t.write_zeroes += 1,
                }
                drop(g);
                buf.resize(len as usize, 0);
                let k = if cmd == nbd::CMD_WRITE {
                    kind
                } else {
                    Kind::Zero
                };
                fill(&mut buf, seed, id, offset, k);
                g = sync.lock();
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
