//! What a torture run is told: its options (one seed decides everything
//! random, so a failure names the command that replays it), and the random
//! choices each cycle draws from them (`Plan`).

use crate::rng::Rng;
use std::path::PathBuf;

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
    /// Deduplication under the kills: a third of the aligned writes copy
    /// what the model says some sectors hold now (often a range written
    /// lately, in this cycle or an earlier one) to other sectors, so the
    /// volume holds real duplicates; the volume is created with `--dedup
    /// idle` (the server deduplicates in its idle phases, and is killed in
    /// the middle of it), every other cycle runs in dedup mode inline (set
    /// live: copies linked as they are written, killed mid-write), and
    /// `compact` runs `compact --dedup`.
    pub dedup: bool,
    /// Start the server with `--simulate-saturated-engine`: every write
    /// batch is compressed below the volume's target codec, so the idle
    /// phases (`idle_percent`) run upgrades and kills land inside them.
    pub saturated_engine: bool,
    /// Until the first idle upgrade of the run has shown in the server's
    /// stats, an idle phase lasts until one has (up to
    /// `UPGRADE_WAIT_MAX`), not just its planned 1.2-2.5 s: a slow or
    /// loaded machine still kills the server after an upgrade at least
    /// once, so a test that needs one does not depend on the machine's
    /// speed. The kills after it keep their planned timing.
    pub wait_for_upgrade: bool,
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
            dedup: false,
            saturated_engine: false,
            wait_for_upgrade: false,
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
        if self.wait_for_upgrade {
            c.push_str(" --wait-for-upgrade");
        }
        if self.compact {
            c.push_str(" --compact");
        }
        if self.dedup {
            c.push_str(" --dedup");
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

/// The random choices of one cycle.
pub(crate) struct Plan {
    pub(crate) conns: u64,
    pub(crate) inflight: u64,
    pub(crate) write_ms: u64,
    /// Quiet time after the writing phase, before the kill.
    pub(crate) idle_ms: Option<u64>,
    pub(crate) go: Vec<bool>,
    /// Stop, check and compact after this cycle's verify.
    pub(crate) compact: bool,
    pub(crate) clean_stop: bool,
    pub(crate) check: bool,
    /// Kill `squeeze compact` after this many ms (None: let it finish).
    pub(crate) kill_compact_ms: Option<u64>,
}

impl Plan {
    pub(crate) fn new(o: &Options, cycle: u64) -> Plan {
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
