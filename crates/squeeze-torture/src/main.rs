//! `squeeze-torture`: SIGKILL `squeeze serve` at random moments under a
//! writer of known content, restart, verify every sector; repeat.
//!
//! ```text
//! squeeze-torture [--cycles N] [--seed S] [--compact] [--bin PATH] ...
//! ```

use squeeze_torture::{run, Options};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: squeeze-torture [options]
  --cycles N         crash cycles (default 100)
  --seed S           seed (default: from the clock; printed)
  --compact          between some cycles stop the server, run squeeze check and
                     squeeze compact (sometimes SIGKILLed part way)
  --dedup            a third of the aligned writes copy other sectors' content
                     (duplicates within and across cycles); the volume is
                     created with --dedup idle, set live to inline
                     for every other cycle, and --compact runs
                     compact --dedup; --idle-percent defaults to 30, so
                     idle passes run and are killed
  --bin PATH         the squeeze binary (default: $SQUEEZE_BIN, else squeeze
                     beside this executable, else squeeze on PATH)
  --size BYTES       logical volume size (default 67108864)
  --segment-size S   segment size for squeeze create (default 1M)
  --min-ms MS        shortest writing phase per cycle (default 50)
  --max-ms MS        longest writing phase per cycle (default 500)
  --long-percent P   percentage of cycles writing 600-1500 ms instead, so the
                     background cleaner and checkpoints run (default 15)
  --idle-percent P   percentage of cycles whose clients then go quiet for
                     1.2-2.5 s before the kill, so the idle server merges and
                     cleans at full speed when killed (default 10)
  --max-conns N      connections per cycle: 1..=N (default 3)
  --max-inflight N   requests in flight per connection: 1..=N (default 16)
  --saturated-engine serve with --simulate-saturated-engine: every write is
                     compressed below the target codec, so idle cycles
                     upgrade (use with a higher --idle-percent)
  --wait-for-upgrade until the run's first idle upgrade shows in the
                     server's stats, an idle phase waits for one (up to
                     60 s) before the kill, whatever the machine's speed
  --prewrite         serve with --prewrite: small flushes write zeros past
                     the log head first
  --map-cache SIZE   serve with --map-cache SIZE (64K pages the map of a
                     64 MiB volume out to its checkpoint chain)
  --workdir DIR      where the temp work dir goes (default: system temp)
  --keep             keep the work dir on success (always kept on failure)
  -q, --quiet        no per-cycle lines";

fn default_bin() -> PathBuf {
    if let Some(b) = std::env::var_os("SQUEEZE_BIN") {
        return PathBuf::from(b);
    }
    if let Ok(me) = std::env::current_exe() {
        let beside = me.with_file_name("squeeze");
        if beside.exists() {
            return beside;
        }
    }
    PathBuf::from("squeeze")
}

fn parse_args() -> Result<Options, String> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let mut o = Options::new(default_bin(), seed, 100);
    o.verbose = true;
    let mut args = std::env::args().skip(1);
    let mut idle_given = false;
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |s: String| s.parse::<u64>().map_err(|e| format!("{s}: {e}"));
        match a.as_str() {
            "--cycles" => o.cycles = num(val("--cycles")?)?,
            "--seed" => o.seed = num(val("--seed")?)?,
            "--compact" => o.compact = true,
            "--dedup" => o.dedup = true,
            "--saturated-engine" => o.saturated_engine = true,
            "--wait-for-upgrade" => o.wait_for_upgrade = true,
            "--prewrite" => o.prewrite = true,
            "--map-cache" => o.map_cache = Some(val("--map-cache")?),
            "--bin" => o.bin = PathBuf::from(val("--bin")?),
            "--size" => o.size = num(val("--size")?)?,
            "--segment-size" => o.segment_size = val("--segment-size")?,
            "--min-ms" => o.min_ms = num(val("--min-ms")?)?,
            "--max-ms" => o.max_ms = num(val("--max-ms")?)?,
            "--long-percent" => o.long_percent = num(val("--long-percent")?)?,
            "--idle-percent" => {
                o.idle_percent = num(val("--idle-percent")?)?;
                idle_given = true;
            }
            "--max-conns" => o.max_conns = num(val("--max-conns")?)?,
            "--max-inflight" => o.max_inflight = num(val("--max-inflight")?)?,
            "--workdir" => o.workdir = Some(PathBuf::from(val("--workdir")?)),
            "--keep" => o.keep = true,
            "-q" | "--quiet" => o.verbose = false,
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if o.dedup && !idle_given {
        o.idle_percent = 30;
    }
    if o.size < 16 << 20 || !o.size.is_multiple_of(4096) {
        return Err("--size must be a multiple of 4096 and at least 16 MiB".into());
    }
    Ok(o)
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("squeeze-torture: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "squeeze-torture: seed {} cycles {} bin {}{}",
        o.seed,
        o.cycles,
        o.bin.display(),
        if o.compact {
            " (with check/compact)"
        } else {
            ""
        }
    );
    if o.dedup {
        eprintln!("squeeze-torture: with duplicated data, dedup mode idle and inline by turns");
    }
    match run(&o, &mut |l| eprintln!("{l}")) {
        Ok(t) => {
            println!("squeeze-torture: seed {} passed: {t}", o.seed);
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("{f}");
            ExitCode::FAILURE
        }
    }
}
