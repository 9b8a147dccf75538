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
//! - The floor ([`super::burst`]): under a compressing target the CPU law
//!   has one more rung, storing raw (codec none), while the floor is raw
//!   (the default; [`BurstFloor::Lz4`] keeps the old floor) and the
//!   volume has room for the burst uncompressed ([`RawRoom`], asked while
//!   the CPU law stands below the target). When the room runs out the rung
//!   goes away: lz4 again. The backlog's law and the trials never store
//!   raw (the engine has nothing to be behind on at raw).
//! - The cost model ([`super::cost`]): at each CPU reading, the busy share
//!   each rung would have had at the client's rate. The CPU law's up step
//!   (a probe) is vetoed while the rung above would reach its down
//!   threshold (a probe bound to fail: W3's copy at raw keeps the cores
//!   60-70% busy, and lz4 at its rate would take them past 100%); a down
//!   step from the target to the fastest rung goes on to raw at once when
//!   the fastest would saturate the cores too. Only measured costs
//!   predict.
//!
//! Invariants: the rung is in `0..=ladder.len()`, `ladder.len()` being the
//! raw rung; rung 0 is the target; with adaptation off, or an engine that
//! reports no backlog and no CPU source, every batch gets the target; a
//! batch is stored raw only when the CPU law is on its raw rung, which it
//! has only while the floor is raw and the room rule is open.

use super::burst::{BurstFloor, RawRoom, RoomReading, ROOM_DEFAULT};
use super::cost::CostModel;
use super::headroom::BusySource;
use super::law::{LawState, HEADROOM_LAW};
use super::trial::{Trial, TRIAL_DEFAULT};
use parking_lot::Mutex;
use squeeze_codec::{Algorithm, CompressEngine};
use squeeze_format::CodecId;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

// The law a volume is opened with, named where callers have always found it.
pub use super::law::{Law, LAW_DEFAULT};

/// The compressing rungs under `target`, fastest last: the target, its
/// codec's fastest level (if the target is slower) and lz4 (if the target
/// is not lz4 already). A target of none or lz4 has no compressing rung
/// under it. Storing raw is the CPU law's rung under these, bounded by
/// the volume's room ([`super::burst`]; issue 16 had measured raw records
/// costing the device more than twice lz4's bytes in a burst, which is
/// why it is bounded and undone by the idle upgrade).
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
    /// The CPU law's lowest rung (settable later: [`AdaptiveCodec::set_floor`]).
    pub floor: BurstFloor,
}

impl AdaptConfig {
    /// The backlog's law alone.
    pub fn backlog(law: Law) -> AdaptConfig {
        AdaptConfig {
            law,
            cpu: None,
            defer: false,
            floor: BurstFloor::default(),
        }
    }
}

impl std::fmt::Debug for AdaptConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdaptConfig")
            .field("law", &self.law)
            .field("cpu", &self.cpu.is_some())
            .field("defer", &self.defer)
            .field("floor", &self.floor)
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
    /// Whether the raw rung may be taken (`super::burst`).
    room: RawRoom,
    /// The previous CPU reading: when, and the client bytes written then.
    last_reading: Option<(u64, u64)>,
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
    /// The last rung chosen (for writers that find the state busy) and why;
    /// `rungs.len()` is the raw rung.
    rung: AtomicUsize,
    /// The floor in force (`BurstFloor as u8`).
    floor: AtomicU8,
    /// The room rule was open at its last reading.
    room_open: AtomicBool,
    why: AtomicU8,
    /// The last busy share read, f64 bits (NaN: none yet).
    busy: AtomicU64,
    /// What the rungs cost the cores (`super::cost`); its own lock, since
    /// every client batch records into it.
    cost: Mutex<CostModel>,
    /// Up steps of the CPU law the cost model vetoed, and rungs it skipped.
    vetoed: AtomicU64,
    skipped: AtomicU64,
    epoch: Instant,
}

impl AdaptiveCodec {
    pub fn new(target: Algorithm, config: AdaptConfig) -> AdaptiveCodec {
        let rungs = ladder(target);
        let floor = config.floor;
        let state = Mutex::new(Laws {
            backlog: LawState::new(config.law, rungs.len()),
            // Two rungs for the CPU law: the target and the ladder's
            // fastest (see `HEADROOM_LAW`); the raw rung is added while
            // it may be taken (`choose`).
            cpu: config
                .cpu
                .as_ref()
                .map(|_| LawState::new(HEADROOM_LAW, rungs.len().min(2))),
            trial: (config.cpu.is_some() && rungs.len() > 1).then(|| Trial::new(TRIAL_DEFAULT)),
            room: RawRoom::new(ROOM_DEFAULT),
            last_reading: None,
        });
        AdaptiveCodec {
            config,
            state,
            rung: AtomicUsize::new(0),
            floor: AtomicU8::new(floor as u8),
            room_open: AtomicBool::new(true),
            why: AtomicU8::new(Why::Target as u8),
            busy: AtomicU64::new(f64::NAN.to_bits()),
            cost: Mutex::new(CostModel::new(rungs.len())),
            vetoed: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            rungs,
            epoch: Instant::now(),
        }
    }

    /// A client batch of `bytes` written with `alg` took `cpu_ns` of
    /// compression (the cost model's measure; raw and rungs not on this
    /// ladder record nothing).
    pub fn record(&self, alg: Algorithm, bytes: u64, cpu_ns: u64) {
        if let Some(rung) = self.rungs.iter().position(|&a| a == alg) {
            self.cost.lock().record(rung, bytes, cpu_ns);
        }
    }

    /// The CPU law's up steps that the cost model vetoed so far.
    pub fn vetoed_probes(&self) -> u64 {
        self.vetoed.load(Ordering::Relaxed)
    }

    /// The rungs the cost model skipped on the way down so far.
    pub fn skipped_rungs(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// The configuration, with the floor in force now.
    pub fn config(&self) -> AdaptConfig {
        AdaptConfig {
            floor: self.floor(),
            ..self.config.clone()
        }
    }

    pub fn law(&self) -> Law {
        self.config.law
    }

    pub fn rungs(&self) -> &[Algorithm] {
        &self.rungs
    }

    /// The rung the last batch got.
    pub fn current(&self) -> Algorithm {
        self.algorithm_of(self.rung.load(Ordering::Relaxed))
    }

    fn algorithm_of(&self, rung: usize) -> Algorithm {
        match self.rungs.get(rung) {
            Some(&a) => a,
            None => Algorithm::new(CodecId::None, 0),
        }
    }

    /// The CPU law's lowest rung in force.
    pub fn floor(&self) -> BurstFloor {
        if self.floor.load(Ordering::Relaxed) == BurstFloor::Lz4 as u8 {
            BurstFloor::Lz4
        } else {
            BurstFloor::Raw
        }
    }

    /// Sets the CPU law's lowest rung for the batches to come (a volume at
    /// raw with `Lz4` takes lz4 from its next batch on).
    pub fn set_floor(&self, floor: BurstFloor) {
        self.floor.store(floor as u8, Ordering::Relaxed);
    }

    /// True when this codec can store raw at all: a compressing target, a
    /// CPU signal, and the raw floor.
    pub fn has_raw_rung(&self) -> bool {
        self.config.cpu.is_some()
            && self.rungs[0].codec != CodecId::None
            && self.floor() == BurstFloor::Raw
    }

    /// The room rule's state at its last reading (true before any).
    pub fn raw_room_open(&self) -> bool {
        self.room_open.load(Ordering::Relaxed)
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
    /// `written` client bytes written so far (the trials' measure); `room`
    /// reads the volume's room for the raw rung, called only while the
    /// CPU law stands below the target. One writer samples at a time; the
    /// others take the rung it chose.
    pub fn choose(
        &self,
        engine: &dyn CompressEngine,
        written: u64,
        room: &dyn Fn() -> RoomReading,
    ) -> Algorithm {
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
                let raw_ok = self.has_raw_rung();
                let Laws {
                    cpu,
                    trial,
                    room: rule,
                    last_reading,
                    ..
                } = &mut *st;
                // The window this reading covers, for the cost model.
                let window = match reading {
                    Some(b) => {
                        let prev = last_reading.replace((now, written));
                        let cores = self.config.cpu.as_ref().map_or(1.0, |c| c.cores());
                        let mut m = self.cost.lock();
                        let w = m.reading(
                            b,
                            now.saturating_sub(prev.map_or(now, |p| p.0)),
                            cores,
                            written.saturating_sub(prev.map_or(written, |p| p.1)),
                        );
                        prev.map(|_| (w, m.clone()))
                    }
                    None => None,
                };
                // The CPU law's compressing rungs; the next is raw.
                let compressing = self.rungs.len().min(2);
                let by_cpu = match cpu.as_mut() {
                    Some(law) => {
                        // The raw rung is there while the floor is raw and
                        // the room rule open; the room is read only once
                        // the cores are busy already.
                        let open = raw_ok
                            && if law.rung() == 0 {
                                rule.is_open()
                            } else {
                                rule.allows(room())
                            };
                        self.room_open.store(rule.is_open(), Ordering::Relaxed);
                        law.set_rungs(now, compressing + usize::from(open));
                        // The ladder's rung for each of the CPU law's.
                        let on_ladder = |c: usize| match c {
                            0 => 0,
                            c if c >= compressing => self.rungs.len(),
                            _ => self.rungs.len() - 1,
                        };
                        let saturates = |c: usize| {
                            window.as_ref().is_some_and(|(w, m)| {
                                m.predict(*w, on_ladder(c))
                                    .is_some_and(|p| p >= HEADROOM_LAW.down_at)
                            })
                        };
                        match reading {
                            Some(b) => {
                                let before = law.rung();
                                let up_ok = before == 0 || !saturates(before - 1);
                                let vetoes = law.vetoes();
                                let r = law.sample_gated(now, b, up_ok);
                                self.vetoed
                                    .fetch_add(law.vetoes() - vetoes, Ordering::Relaxed);
                                // From the target, lz4 is taken only when its
                                // measured cost would leave the cores room at
                                // the client's rate.
                                if before == 0
                                    && r == 1
                                    && compressing == 2
                                    && law.rungs() == 3
                                    && saturates(1)
                                {
                                    law.skip_down(now);
                                    self.skipped.fetch_add(1, Ordering::Relaxed);
                                }
                                law.rung()
                            }
                            None => law.rung(),
                        }
                    }
                    None => 0,
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
                // ladder's last; its rung after the compressing ones is
                // raw (`rungs.len()`).
                let last = self.rungs.len() - 1;
                let by_cpu = match by_cpu {
                    0 => 0,
                    r if r >= compressing => self.rungs.len(),
                    _ => last,
                };
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
        self.algorithm_of(rung)
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
#[path = "adapt_tests.rs"]
mod tests;
