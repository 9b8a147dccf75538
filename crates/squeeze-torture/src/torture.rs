//! The crash loop: start `squeeze serve`, drive it, SIGKILL it while
//! requests are in flight, restart it (recovery), read every sector back
//! and check it against the model; repeat on the same volume.

use crate::clients::{drive, Shared, Sync};
use crate::model::{Model, VerifyCounts};
use crate::nbd::{self, Conn};
use crate::options::{Options, Plan};
use crate::proc::{self, Server};
use crate::report::{Counters, Failure, Totals};
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

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
            OsStr::new("--dedup"),
            OsStr::new(if o.dedup { "idle" } else { "off" }),
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
        // --dedup: every other cycle in dedup mode inline (set live, over
        // the control socket), the others in mode idle.
        let inline = o.dedup && cycle % 2 == 1;
        if o.dedup {
            set_dedup_live(o, &vol, &log, if inline { "inline" } else { "idle" })?;
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
            g.t.dedup_idle_passes += after[7].saturating_sub(before[7]);
            g.t.dedup_idle_linked_sectors += after[8].saturating_sub(before[8]);
            // Sampled just before the kill: a pass was under way.
            if after[9] > 0 {
                g.t.kills_in_dedup_passes += 1;
            }
            g.t.inline_cycles += u64::from(inline);
            g.t.dedup_inline_linked_sectors += after[10].saturating_sub(before[10]);
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
        n("dedup_idle_passes"),
        n("dedup_idle_linked_sectors"),
        n("dedup_idle_cursor"),
        n("dedup_inline_linked_sectors"),
    ])
}

/// `squeeze set CTL --dedup MODE` on the running server.
fn set_dedup_live(o: &Options, vol: &Path, log: &Path, mode: &str) -> Result<(), String> {
    let ctl = vol.with_extension("ctl");
    let st = proc::run(
        &o.bin,
        &[
            OsStr::new("set"),
            ctl.as_os_str(),
            OsStr::new("--dedup"),
            OsStr::new(mode),
        ],
        log,
    )?;
    if !st.success() {
        return Err(format!(
            "squeeze set --dedup {mode} failed ({st}):
{}",
            proc::tail(log, 10)
        ));
    }
    Ok(())
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
    let mut args = vec![OsStr::new("compact"), vol.as_os_str()];
    if o.dedup {
        args.push(OsStr::new("--dedup"));
    }
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
