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
use super::law::{LawState, HEADROOM_LAW};
use super::trial::{Trial, TRIAL_DEFAULT};
use parking_lot::Mutex;
use squeeze_codec::{Algorithm, CompressEngine};
use squeeze_format::CodecId;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

// The law a volume is opened with, named where callers have always found it.
pub use super::law::{Law, LAW_DEFAULT};

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
