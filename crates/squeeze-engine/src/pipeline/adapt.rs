//! Stage 2b: the adaptive write codec. The policy's algorithm stays the
//! target; a write batch may be compressed with a faster rung of a ladder
//! under it (zstd:3 -> zstd:1 -> lz4) when the compression
//! engine cannot keep up, so client writes do not queue behind compression
//! they could have skipped, or when the machine's cores are busy, so the
//! compressor does not take CPU the client could have used. The
//! maintenance thread later rewrites such bytes with the target
//! (`space::cleaner::upgrade_pass`).
//!
//! The control law (docs/ARCHITECTURE.md, "Adaptive write codec"), run
//! once per batch before it is submitted:
//!
//! - Signal: the engine's backlog ([`CompressEngine::backlog_bytes`], raw
//!   bytes submitted and not yet started) per worker thread, smoothed by
//!   an exponential moving average with time constant [`Law::tau_ns`]. A
//!   client that the engine keeps up with finds the queue (nearly) empty
//!   whenever it submits: the signal stays low.
//! - Down (faster codec) one rung once the backlog, smoothed and as
//!   sampled, has stayed at or above `down_at` for `down_hold_ns` (a
//!   sustained overload, not one burst meeting another: one sample below
//!   starts the hold again).
//! - Up (slower codec) one rung once it has stayed at or below `up_at`
//!   for the current up-hold.
//! - Hysteresis: `up_at` < `down_at`, and between them nothing changes.
//!   A queue that is already draining (the smoothed backlog below what it
//!   was when the hold began) is not a reason to step further down.
//! - No oscillation: a down step within `bounce_ns` of an up step means the
//!   probe failed (the faster rung was needed): the up-hold doubles, up to
//!   `up_hold_max_ns`. Every up-hold plus `bounce_ns` without a down step (a
//!   probe had its chance and held) halves it back towards
//!   `up_hold_min_ns`. A client between two rungs' speeds therefore
//!   changes rung at most once per `up_hold_max_ns` or so, in steady state.
//!
//! - A second law, when the volume has a CPU source
//!   ([`super::headroom`]): the same state machine on the machine's busy
//!   share, averaged over each reading's window ([`HEADROOM_LAW`]), with two
//!   rungs: the target and the ladder's fastest; and with it trials of
//!   the fastest rung between the two laws' thresholds ([`super::trial`]).
//!   Each keeps its own rung; a batch gets the fastest of them.
//!
//! Invariants: the rung is in `0..ladder.len()`; rung 0 is the target;
//! with adaptation off, or an engine that reports no backlog and no CPU
//! source, every batch gets the target.

use super::headroom::BusySource;
use super::trial::{Trial, TRIAL_DEFAULT};
use parking_lot::Mutex;
use squeeze_codec::{Algorithm, CompressEngine};
use squeeze_format::CodecId;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The rungs under `target`, fastest last: the target, its codec's
/// fastest level (if the target is slower) and lz4 (if the target is not
/// lz4 already). Storing raw is not a rung: lz4 still stores the W3 tar at
/// about 2.1:1 at several hundred MB/s per core, and raw records would
/// cost the device more than twice the bytes while the ratio in a burst
/// fell to 1 (measured: docs/benchmarks-history.md, issue 16). A target of none or
/// lz4 has no ladder.
pub fn ladder(target: Algorithm) -> Vec<Algorithm> {
    let mut rungs = vec![target];
    if target.codec == CodecId::None {
        return rungs;
    }
    let fastest_level = match target.codec {
        CodecId::Zstd => Some(1),
        CodecId::Deflate => Some(1),
        CodecId::Lz4 | CodecId::Snappy | CodecId::None => None,
    };
    if let Some(l) = fastest_level {
        if target.effective_level() > l {
            rungs.push(Algorithm::new(target.codec, l));
        }
    }
    if target.codec != CodecId::Lz4 {
        rungs.push(Algorithm::new(CodecId::Lz4, 0));
    }
    rungs
}

/// True when a record of `codec` may hold bytes written below `target`
/// (the ladder's rungs of another codec; raw records are not counted:
/// incompressible data is raw at any rung).
pub fn below_target_codec(codec: CodecId, target: Algorithm) -> bool {
    codec != target.codec
        && codec != CodecId::None
        && ladder(target).iter().any(|a| a.codec == codec)
}

/// The control law's constants (see the module text).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Law {
    /// Smoothing time constant of the backlog signal.
    pub tau_ns: u64,
    /// Step down when the smoothed backlog per worker stays at or above
    /// this many raw bytes ...
    pub down_at: f64,
    /// ... for this long.
    pub down_hold_ns: u64,
    /// Step up when it stays at or below this many bytes ...
    pub up_at: f64,
    /// ... for the up-hold, which starts here ...
    pub up_hold_min_ns: u64,
    /// ... doubles on every failed probe, up to here.
    pub up_hold_max_ns: u64,
    /// A down step this soon after an up step is a failed probe.
    pub bounce_ns: u64,
    /// Each sample is an average over the time since the previous one (the
    /// CPU's busy share), not a point reading (the backlog): a hold then
    /// counts from the previous sample, and a high share is not a queue
    /// that may be draining already.
    pub averaged: bool,
}

const MS: u64 = 1_000_000;

/// Defaults: with 128 KiB blobs and ~350 MB/s of zstd:3 per core, 512 KiB
/// queued per worker is ~1.5 ms of work waiting; 64 KiB is half a blob.
pub const LAW_DEFAULT: Law = Law {
    tau_ns: 10 * MS,
    down_at: 512.0 * 1024.0,
    down_hold_ns: 20 * MS,
    up_at: 64.0 * 1024.0,
    up_hold_min_ns: 200 * MS,
    up_hold_max_ns: 5_000 * MS,
    bounce_ns: 1_000 * MS,
    averaged: false,
};

/// The law on the machine's CPU busy share ([`super::headroom`]), read
/// over windows of at least 100 ms. It has two rungs, the target and the
/// ladder's fastest (lz4): when the cores are short, the level between
/// saves too little (zstd:1 costs about three quarters of zstd:3's CPU on
/// the W3 tar, lz4 half; in W1 at zstd:1 the cores stayed busy and a
/// three-rung law never reached lz4). Down once the share, smoothed with
/// a 100 ms time constant, has been at least 95% for 200 ms (a client,
/// the server and the compressor competing for the cores: W1 through NBD
/// keeps this 2-core machine's median window 100% busy at zstd:3); up once
/// it has been at most 75% for the up-hold (1 s at first, up to 10 s after
/// failed probes). Writers up to three quarters of what the target
/// sustains keep it; at 0.8-0.85x the cores are 85-92% busy and the law
/// steps down for part of the run (docs/benchmarks-history.md, "CPU headroom").
pub const HEADROOM_LAW: Law = Law {
    tau_ns: 100 * MS,
    down_at: 0.95,
    down_hold_ns: 200 * MS,
    up_at: 0.75,
    up_hold_min_ns: 1_000 * MS,
    up_hold_max_ns: 10_000 * MS,
    bounce_ns: 3_000 * MS,
    averaged: true,
};

const _: () = assert!(LAW_DEFAULT.up_at < LAW_DEFAULT.down_at);
const _: () = assert!(LAW_DEFAULT.up_hold_min_ns <= LAW_DEFAULT.up_hold_max_ns);
const _: () = assert!(HEADROOM_LAW.up_at < HEADROOM_LAW.down_at);
const _: () = assert!(HEADROOM_LAW.up_hold_min_ns <= HEADROOM_LAW.up_hold_max_ns);

/// The controller's state: where it stands on the ladder and why.
#[derive(Clone, Debug)]
pub struct LawState {
    law: Law,
    rungs: usize,
    rung: usize,
    /// Smoothed backlog per worker, bytes; None before the first sample.
    load: Option<f64>,
    last_ns: u64,
    /// Since when the load has been high (with the smoothed load then) /
    /// low (None: it is not).
    high_since: Option<(u64, f64)>,
    low_since: Option<u64>,
    changed_ns: u64,
    up_hold_ns: u64,
    /// The last change was an up step (a probe of the slower rung).
    last_up: bool,
    /// When the up-hold was last doubled, halved or a down step taken.
    relaxed_ns: u64,
    changes: u64,
}

impl LawState {
    pub fn new(law: Law, rungs: usize) -> LawState {
        assert!(rungs >= 1 && law.up_at < law.down_at);
        LawState {
            law,
            rungs,
            rung: 0,
            load: None,
            last_ns: 0,
            high_since: None,
            low_since: None,
            changed_ns: 0,
            up_hold_ns: law.up_hold_min_ns,
            last_up: false,
            relaxed_ns: 0,
            changes: 0,
        }
    }

    pub fn rung(&self) -> usize {
        self.rung
    }

    /// Rung changes so far.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The current up-hold.
    pub fn up_hold_ns(&self) -> u64 {
        self.up_hold_ns
    }

    /// Feeds one sample (`backlog` raw bytes per worker at `now_ns`, which
    /// never goes back) and returns the rung for the batch about to go.
    pub fn sample(&mut self, now_ns: u64, backlog: f64) -> usize {
        let law = self.law;
        // Where a hold that starts with this sample counts from.
        let start = match (law.averaged, self.load) {
            (true, Some(_)) => self.last_ns,
            _ => now_ns,
        };
        let load = match self.load {
            None => backlog,
            Some(prev) => {
                let dt = now_ns.saturating_sub(self.last_ns) as f64;
                let alpha = 1.0 - (-dt / law.tau_ns as f64).exp();
                prev + alpha * (backlog - prev)
            }
        };
        self.load = Some(load);
        self.last_ns = now_ns;
        if now_ns.saturating_sub(self.relaxed_ns) >= self.up_hold_ns + law.bounce_ns {
            // No down step for a while: probes may come sooner again.
            self.up_hold_ns = (self.up_hold_ns / 2).max(law.up_hold_min_ns);
            self.relaxed_ns = now_ns;
        }
        // A point reading must be high itself as well as its average (one
        // low sample is a queue that emptied); an averaged reading is
        // already a window's mean, and the smoothed one decides.
        if load >= law.down_at && (law.averaged || backlog >= law.down_at) {
            self.low_since = None;
            let (since, from) = *self.high_since.get_or_insert((start, load));
            // Down only while the backlog is not draining already (the
            // last step down may just not have shown its effect yet).
            let rising = law.averaged || load >= from;
            if self.rung + 1 < self.rungs && now_ns - since >= law.down_hold_ns && rising {
                if self.last_up && now_ns - self.changed_ns < law.bounce_ns {
                    // The probe failed: the faster rung was needed.
                    self.up_hold_ns = (self.up_hold_ns * 2).min(law.up_hold_max_ns);
                }
                self.relaxed_ns = now_ns;
                self.last_up = false;
                self.step(now_ns, self.rung + 1);
            }
        } else if load <= law.up_at {
            self.high_since = None;
            let since = *self.low_since.get_or_insert(start);
            if self.rung > 0 && now_ns - since >= self.up_hold_ns {
                // An averaged reading after a quiet spell covers several
                // up-holds: as many rungs up (the first write after an
                // idle minute gets the target, not one rung of it).
                let by = if law.averaged {
                    usize::try_from((now_ns - since) / self.up_hold_ns.max(1)).unwrap_or(usize::MAX)
                } else {
                    1
                };
                self.last_up = true;
                self.step(now_ns, self.rung - by.min(self.rung));
            }
        } else {
            // Between the thresholds: hold.
            self.high_since = None;
            self.low_since = None;
        }
        self.rung
    }

    fn step(&mut self, now_ns: u64, rung: usize) {
        self.rung = rung;
        self.changed_ns = now_ns;
        self.changes += 1;
        // A new rung must prove itself over a whole hold again.
        self.high_since = None;
        self.low_since = None;
    }
}

/// What a volume adapts to: the backlog's law always, and the machine's
/// CPU busy share when a source is given (`squeeze serve` gives
/// [`super::headroom::ProcStat`]; an embedded volume has none unless its
/// owner asks).
#[derive(Clone)]
pub struct AdaptConfig {
    pub law: Law,
    pub cpu: Option<Arc<dyn BusySource>>,
    /// Deferred compression: every client batch takes the ladder's fastest
    /// rung, and the idle upgrade and `compact` bring it to the target
    /// (the laws are not consulted). For a store embedded in its clients'
    /// process (squeeze-kv), whose every operation waits on its own
    /// compression while the cores stay below the CPU law's threshold.
    pub defer: bool,
}

impl AdaptConfig {
    /// The backlog's law alone.
    pub fn backlog(law: Law) -> AdaptConfig {
        AdaptConfig {
            law,
            cpu: None,
            defer: false,
        }
    }
}

impl std::fmt::Debug for AdaptConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdaptConfig")
            .field("law", &self.law)
            .field("cpu", &self.cpu.is_some())
            .field("defer", &self.defer)
            .finish()
    }
}

/// Why a write batch gets the rung it gets. Serialised as its
/// [`Why::as_str`] name ("target", "cpu", ...); displayed as a phrase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Why {
    /// The target: nothing is short.
    Target,
    /// The compression engine is behind.
    Backlog,
    /// The machine's cores are busy.
    Cpu,
    /// A trial found the client writing faster with the faster codec.
    Trial,
    /// Compression is deferred to the idle upgrade (`AdaptConfig::defer`).
    Deferred,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Target => "target",
            Why::Backlog => "backlog",
            Why::Cpu => "cpu",
            Why::Trial => "trial",
            Why::Deferred => "deferred",
        }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Why::Target => "the target rung",
            Why::Backlog => "the compression threads were behind",
            Why::Cpu => "the cores were busy",
            Why::Trial => "a trial found the client faster with it",
            Why::Deferred => "compression deferred to the idle upgrade",
        })
    }
}

struct Laws {
    backlog: LawState,
    cpu: Option<LawState>,
    /// With the CPU signal: trials of the faster codec between the CPU
    /// law's thresholds (`super::trial`).
    trial: Option<Trial>,
}

/// The adaptive codec of a volume: the ladder under the policy's target
/// and the control laws' state, shared by every writer. Each law (and the
/// trials) keeps its own rung; a batch gets the fastest of them, so each
/// one's promise (no oscillation, the target when its signal is low) holds
/// for the whole.
pub struct AdaptiveCodec {
    config: AdaptConfig,
    rungs: Vec<Algorithm>,
    state: Mutex<Laws>,
    /// The last rung chosen (for writers that find the state busy) and why.
    rung: AtomicUsize,
    why: AtomicU8,
    /// The last busy share read, f64 bits (NaN: none yet).
    busy: AtomicU64,
    epoch: Instant,
}

impl AdaptiveCodec {
    pub fn new(target: Algorithm, config: AdaptConfig) -> AdaptiveCodec {
        let rungs = ladder(target);
        let state = Mutex::new(Laws {
            backlog: LawState::new(config.law, rungs.len()),
            // Two rungs for the CPU law: the target and the ladder's
            // fastest (see `HEADROOM_LAW`).
            cpu: config
                .cpu
                .as_ref()
                .map(|_| LawState::new(HEADROOM_LAW, rungs.len().min(2))),
            trial: (config.cpu.is_some() && rungs.len() > 1).then(|| Trial::new(TRIAL_DEFAULT)),
        });
        AdaptiveCodec {
            config,
            rungs,
            state,
            rung: AtomicUsize::new(0),
            why: AtomicU8::new(Why::Target as u8),
            busy: AtomicU64::new(f64::NAN.to_bits()),
            epoch: Instant::now(),
        }
    }

    pub fn config(&self) -> AdaptConfig {
        self.config.clone()
    }

    pub fn law(&self) -> Law {
        self.config.law
    }

    pub fn rungs(&self) -> &[Algorithm] {
        &self.rungs
    }

    /// The rung the last batch got.
    pub fn current(&self) -> Algorithm {
        self.rungs[self.rung.load(Ordering::Relaxed)]
    }

    /// Why the last batch got its rung.
    pub fn why(&self) -> Why {
        match self.why.load(Ordering::Relaxed) {
            x if x == Why::Backlog as u8 => Why::Backlog,
            x if x == Why::Cpu as u8 => Why::Cpu,
            x if x == Why::Trial as u8 => Why::Trial,
            x if x == Why::Deferred as u8 => Why::Deferred,
            _ => Why::Target,
        }
    }

    /// The machine's busy share at the last reading (None: no CPU signal,
    /// or no reading yet).
    pub fn cpu_busy(&self) -> Option<f64> {
        let b = f64::from_bits(self.busy.load(Ordering::Relaxed));
        (!b.is_nan()).then_some(b)
    }

    /// The algorithm for the batch about to be submitted to `engine`, with
    /// `written` client bytes written so far (the trials' measure). One
    /// writer samples at a time; the others take the rung it chose.
    pub fn choose(&self, engine: &dyn CompressEngine, written: u64) -> Algorithm {
        if self.config.defer && self.rungs.len() > 1 {
            let last = self.rungs.len() - 1;
            self.rung.store(last, Ordering::Relaxed);
            self.why.store(Why::Deferred as u8, Ordering::Relaxed);
            return self.rungs[last];
        }
        let rung = match self.state.try_lock() {
            Some(mut st) => {
                let backlog = engine.backlog_bytes() as f64 / engine.threads().max(1) as f64;
                let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
                let by_backlog = st.backlog.sample(now, backlog);
                let reading = self.config.cpu.as_ref().and_then(|src| src.busy());
                if let Some(b) = reading {
                    self.busy.store(b.to_bits(), Ordering::Relaxed);
                }
                let Laws { cpu, trial, .. } = &mut *st;
                let by_cpu = match (cpu.as_mut(), reading) {
                    (Some(law), Some(b)) => law.sample(now, b),
                    (Some(law), None) => law.rung(),
                    _ => 0,
                };
                let by_trial = match (trial.as_mut(), reading) {
                    // While the CPU law holds the fast rung, no window is
                    // the target's: trials wait until it lets go.
                    (Some(t), _) if by_cpu > 0 => {
                        t.reset();
                        false
                    }
                    (Some(t), Some(b)) => t.sample(now, b, written),
                    (Some(t), None) => t.fast(),
                    _ => false,
                };
                // The CPU law's rung 1 and a trial's fast rung are the
                // ladder's last.
                let last = self.rungs.len() - 1;
                let by_cpu = if by_cpu > 0 { last } else { 0 };
                let by_trial = if by_trial { last } else { 0 };
                let r = by_backlog.max(by_cpu).max(by_trial);
                let why = if r == 0 {
                    Why::Target
                } else if by_cpu == r {
                    Why::Cpu
                } else if by_trial == r {
                    Why::Trial
                } else {
                    Why::Backlog
                };
                self.rung.store(r, Ordering::Relaxed);
                self.why.store(why as u8, Ordering::Relaxed);
                r
            }
            None => self.rung.load(Ordering::Relaxed),
        };
        self.rungs[rung]
    }
}

impl std::fmt::Debug for AdaptiveCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdaptiveCodec")
            .field("rungs", &self.rungs)
            .field("rung", &self.rung.load(Ordering::Relaxed))
            .field("why", &self.why())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alg(s: &str) -> Algorithm {
        Algorithm::parse(s).unwrap()
    }

    #[test]
    fn ladders() {
        assert_eq!(
            ladder(alg("zstd:3")),
            vec![alg("zstd:3"), alg("zstd:1"), alg("lz4")]
        );
        assert_eq!(ladder(alg("zstd:1")), vec![alg("zstd:1"), alg("lz4")]);
        // zstd's default level in squeeze is 1: no zstd:1 rung under it.
        assert_eq!(ladder(alg("zstd")), vec![alg("zstd"), alg("lz4")]);
        assert_eq!(
            ladder(alg("deflate:6")),
            vec![alg("deflate:6"), alg("deflate:1"), alg("lz4")]
        );
        assert_eq!(ladder(alg("lz4")), vec![alg("lz4")]);
        assert_eq!(ladder(alg("snappy")), vec![alg("snappy"), alg("lz4")]);
        assert_eq!(ladder(alg("none")), vec![alg("none")]);
    }

    /// A synthetic plant: a client offering `offered` bytes per ms to an
    /// engine that compresses `speed[rung]` bytes per ms; the backlog is
    /// what has not been compressed yet. One sample per ms for `ms`
    /// milliseconds; returns (bytes written per rung, the law's state,
    /// the largest backlog).
    fn run(
        st: &mut LawState,
        start_ms: u64,
        ms: u64,
        offered: f64,
        speed: &[f64],
        backlog: &mut f64,
    ) -> (Vec<f64>, f64) {
        let mut per_rung = vec![0.0; speed.len()];
        let mut max = 0.0f64;
        for t in start_ms..start_ms + ms {
            let rung = st.sample(t * MS, *backlog);
            *backlog = (*backlog + offered - speed[rung]).max(0.0);
            per_rung[rung] += offered;
            max = max.max(*backlog);
        }
        (per_rung, max)
    }

    const KIB: f64 = 1024.0;
    /// A synthetic ladder of four rungs per worker, bytes per ms (about
    /// 350, 450 and 1500 MB/s, and a last one as fast as a memory copy):
    /// the law knows rung numbers only.
    const SPEED: [f64; 4] = [350.0 * KIB, 450.0 * KIB, 1500.0 * KIB, 1e12];

    #[test]
    fn a_client_the_engine_sustains_gets_the_target() {
        for frac in [0.1, 0.5, 0.9, 0.99] {
            let mut st = LawState::new(LAW_DEFAULT, 4);
            let mut q = 0.0;
            let (per_rung, _) = run(&mut st, 0, 60_000, frac * SPEED[0], &SPEED, &mut q);
            assert_eq!(per_rung[1..].iter().sum::<f64>(), 0.0, "{frac}");
            assert_eq!(st.changes(), 0);
        }
    }

    #[test]
    fn a_client_the_engine_cannot_sustain_gets_a_faster_rung() {
        // Faster than lz4: the law goes to the bottom, and its probes of
        // lz4 fail, less and less often.
        let mut st = LawState::new(LAW_DEFAULT, 4);
        let mut q = 0.0;
        let (per_rung, max) = run(&mut st, 0, 60_000, 2.0 * SPEED[2], &SPEED, &mut q);
        assert_eq!(st.rung(), 3);
        assert_eq!(st.up_hold_ns(), LAW_DEFAULT.up_hold_max_ns);
        assert!(st.changes() <= 3 + 2 * 6 + 2 * 60 / 5, "{}", st.changes());
        assert!(per_rung[3] > 0.98 * per_rung.iter().sum::<f64>());
        assert!(max < 300.0 * 1024.0 * 1024.0, "backlog {max}");
        // Between zstd:1 and lz4: down to lz4, then probes of zstd:1 that
        // fail, fewer and fewer of them.
        let mut st = LawState::new(LAW_DEFAULT, 4);
        let mut q = 0.0;
        let offered = (SPEED[1] + SPEED[2]) / 2.0;
        let (per_rung, max) = run(&mut st, 0, 60_000, offered, &SPEED, &mut q);
        let total: f64 = per_rung.iter().sum();
        assert_eq!(per_rung[3], 0.0, "never needed to store raw");
        assert!(per_rung[2] > 0.9 * total, "{per_rung:?}");
        assert_eq!(st.up_hold_ns(), LAW_DEFAULT.up_hold_max_ns);
        // At most a probe (two changes) per up_hold_max once settled, plus
        // the way there: 1 + log2(5000/200) probes.
        assert!(st.changes() <= 2 + 2 * 6 + 2 * 60 / 5, "{}", st.changes());
        assert!(max < 64.0 * 1024.0 * 1024.0, "backlog {max}");
    }

    #[test]
    fn load_between_the_thresholds_changes_nothing() {
        let mut st = LawState::new(LAW_DEFAULT, 4);
        let mid = (LAW_DEFAULT.up_at + LAW_DEFAULT.down_at) / 2.0;
        for t in 0..10_000 {
            assert_eq!(st.sample(t * MS, mid), 0);
        }
        // Down to rung 1, then the same load holds it there.
        let mut t = 10_000;
        while st.rung() == 0 {
            st.sample(t * MS, 2.0 * LAW_DEFAULT.down_at);
            t += 1;
        }
        for t in t..t + 10_000 {
            assert_eq!(st.sample(t * MS, mid), 1);
        }
        assert_eq!(st.changes(), 1);
    }

    #[test]
    fn a_short_burst_meeting_another_does_not_step_down() {
        let mut st = LawState::new(LAW_DEFAULT, 4);
        // One sample in a hundred finds 4 MiB queued (two writers' batches
        // colliding), sparse samples (a rate-limited writer).
        for t in 0..100_000u64 {
            let b = if t % 100 == 0 {
                4.0 * 1024.0 * 1024.0
            } else {
                0.0
            };
            assert_eq!(st.sample(t * 10 * MS, b), 0, "{t}");
        }
    }

    #[test]
    fn back_to_the_target_after_a_burst() {
        let mut st = LawState::new(LAW_DEFAULT, 4);
        let mut q = 0.0;
        run(&mut st, 0, 2_000, 2.0 * SPEED[2], &SPEED, &mut q);
        assert_eq!(st.rung(), 3);
        // The burst ends: back up one rung per up-hold (at most
        // up_hold_max each), then the target from there on.
        let (per_rung, _) = run(&mut st, 2_000, 20_000, 0.2 * SPEED[0], &SPEED, &mut q);
        assert_eq!(st.rung(), 0);
        let back = 3 * LAW_DEFAULT.up_hold_max_ns / MS;
        assert!(
            per_rung[0] >= (20_000 - back) as f64 / 20_000.0 * per_rung.iter().sum::<f64>(),
            "{per_rung:?}"
        );
        // And the up-hold is back at its minimum after probes that held.
        assert_eq!(st.up_hold_ns(), LAW_DEFAULT.up_hold_min_ns);
    }

    /// The CPU law's plant: a reading every 100 ms of the busy share the
    /// machine shows at the current rung (`busy[rung]`); returns the
    /// readings spent at each rung.
    fn run_cpu(st: &mut LawState, start_ms: u64, ms: u64, busy: &[f64]) -> Vec<u64> {
        let mut per_rung = vec![0u64; busy.len()];
        let mut rung = st.rung();
        for t in (start_ms..start_ms + ms).step_by(100) {
            rung = st.sample(t * MS, busy[rung]);
            per_rung[rung] += 1;
        }
        per_rung
    }

    #[test]
    fn idle_cores_keep_the_target() {
        // Clients at 0.8-0.85x of what zstd:3 sustains (median windows
        // 82-90% busy), and readings between the thresholds: never a
        // change.
        for b in [0.1, 0.5, 0.82, 0.9, 0.93] {
            let mut st = LawState::new(HEADROOM_LAW, 2);
            run_cpu(&mut st, 0, 60_000, &[b; 2]);
            assert_eq!(st.changes(), 0, "{b}");
        }
    }

    #[test]
    fn busy_cores_step_down_within_a_quarter_second_and_stay() {
        let mut st = LawState::new(HEADROOM_LAW, 2);
        // Saturated at both rungs (the client takes what lz4 frees).
        let per_rung = run_cpu(&mut st, 0, 300, &[0.99, 0.96]);
        assert_eq!(st.rung(), 1, "{per_rung:?}");
        let per_rung = run_cpu(&mut st, 250, 60_000, &[0.99, 0.96]);
        assert_eq!(per_rung[0], 0);
        assert_eq!(st.changes(), 1);
        // The burst ends: back to the target after an up-hold.
        run_cpu(&mut st, 60_250, 1_100, &[0.1; 2]);
        assert_eq!(st.rung(), 0);
        assert_eq!(st.changes(), 2);
    }

    #[test]
    fn a_rate_between_the_rungs_probes_rarely() {
        // Saturated at the target, 60% busy at lz4: each up step saturates
        // the cores again. Probes come at most once per up-hold, which
        // doubles up to 10 s.
        let mut st = LawState::new(HEADROOM_LAW, 2);
        let per_rung = run_cpu(&mut st, 0, 120_000, &[0.99, 0.6]);
        let total: u64 = per_rung.iter().sum();
        assert!(per_rung[1] as f64 > 0.95 * total as f64, "{per_rung:?}");
        assert_eq!(st.up_hold_ns(), HEADROOM_LAW.up_hold_max_ns);
        // The way there (1 + log2(10)) and then a probe per 10 s.
        assert!(st.changes() <= 2 * 5 + 2 * 12, "{}", st.changes());
    }

    #[test]
    fn an_averaged_reading_holds_for_the_whole_window() {
        // A writer that samples once per 2 s on cores busy all along: the
        // second reading covers 2 s of saturation and steps down at once.
        let mut st = LawState::new(HEADROOM_LAW, 3);
        assert_eq!(st.sample(0, 0.99), 0);
        assert_eq!(st.sample(2_000 * MS, 0.99), 1);
        assert_eq!(st.sample(4_000 * MS, 0.99), 2);
        // A low reading covers its window too: one reading after a quiet
        // spell of one up-hold is one rung up, of two or more the target.
        assert_eq!(st.sample(4_000 * MS + HEADROOM_LAW.up_hold_min_ns, 0.1), 1);
        assert_eq!(st.sample(60_000 * MS, 0.1), 0);
        let mut st = LawState::new(HEADROOM_LAW, 3);
        st.sample(0, 0.99);
        st.sample(2_000 * MS, 0.99);
        assert_eq!(st.sample(4_000 * MS, 0.99), 2);
        assert_eq!(st.sample(64_000 * MS, 0.1), 0);
    }

    /// A busy source that answers what it is told.
    struct Fixed(Mutex<Option<f64>>);
    impl BusySource for Fixed {
        fn busy(&self) -> Option<f64> {
            *self.0.lock()
        }
    }

    #[test]
    fn the_faster_rung_of_the_two_laws_wins_and_says_why() {
        let idle_engine = squeeze_codec::CpuPool::new(1);
        let src = Arc::new(Fixed(Mutex::new(Some(0.99))));
        let a = AdaptiveCodec::new(
            alg("zstd:3"),
            AdaptConfig {
                law: LAW_DEFAULT,
                cpu: Some(src.clone()),
                defer: false,
            },
        );
        assert_eq!(a.current(), alg("zstd:3"));
        assert_eq!(a.why(), Why::Target);
        let t = Instant::now();
        // Straight from the target to the ladder's fastest: zstd:1 never.
        loop {
            let got = a.choose(&idle_engine, 0);
            if got == alg("lz4") {
                break;
            }
            assert_eq!(got, alg("zstd:3"));
            assert!(t.elapsed().as_secs() < 10, "never stepped down");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(a.why(), Why::Cpu);
        assert_eq!(a.cpu_busy(), Some(0.99));
        // No reading: the rung holds.
        *src.0.lock() = None;
        assert_eq!(a.choose(&idle_engine, 0), alg("lz4"));
        // Without a CPU source only the backlog counts: an idle engine
        // gets the target, and nothing is read.
        let b = AdaptiveCodec::new(alg("zstd:3"), AdaptConfig::backlog(LAW_DEFAULT));
        assert_eq!(b.choose(&idle_engine, 0), alg("zstd:3"));
        assert_eq!(b.cpu_busy(), None);
        assert_eq!(b.why(), Why::Target);
    }

    #[test]
    fn deferred_compression_takes_the_fastest_rung_whatever_the_signals() {
        // An idle engine and idle cores: the laws would give the target.
        let idle_engine = squeeze_codec::CpuPool::new(1);
        let src = Arc::new(Fixed(Mutex::new(Some(0.0))));
        let a = AdaptiveCodec::new(
            alg("zstd:3"),
            AdaptConfig {
                law: LAW_DEFAULT,
                cpu: Some(src),
                defer: true,
            },
        );
        for _ in 0..3 {
            assert_eq!(a.choose(&idle_engine, 0), alg("lz4"));
            assert_eq!(a.why(), Why::Deferred);
            assert_eq!(a.current(), alg("lz4"));
        }
        // An lz4 target has no rung under it: it is its own.
        let b = AdaptiveCodec::new(
            alg("lz4"),
            AdaptConfig {
                defer: true,
                ..AdaptConfig::backlog(LAW_DEFAULT)
            },
        );
        assert_eq!(b.choose(&idle_engine, 0), alg("lz4"));
        assert_eq!(b.why(), Why::Target);
    }
}
