//! The control law the adaptive codec ([`super::adapt`]) runs on each of
//! its signals: a state machine with hysteresis that turns samples of one
//! signal (the engine's backlog per worker, or the machine's busy CPU
//! share) into a rung of a ladder, 0 the slowest. The law itself (down
//! after a sustained high, up after a hold that doubles on failed probes,
//! nothing between the thresholds) is described in `adapt`'s module text
//! and docs/ARCHITECTURE.md, "Adaptive write codec"; it knows rung numbers
//! only, not codecs.
//!
//! Invariants: the rung is in `0..rungs`; `up_at` < `down_at`; the up-hold
//! stays in `up_hold_min_ns..=up_hold_max_ns`.

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
/// ladder's fastest (lz4), and a third below them, storing raw, while the
/// floor is raw and the volume has room for it ([`super::burst`]; the
/// same thresholds and holds take it from lz4 to raw: on the W3 tar the
/// cores stay saturated at lz4). When the cores are short, the level between
/// saves too little (zstd:1 costs about three quarters of zstd:3's CPU on
/// the W3 tar, lz4 half; in W1 at zstd:1 the cores stayed busy and a
/// three-rung law never reached lz4). Down once the share has been at
/// least 95% for 100 ms, that is, for one whole reading window (a client,
/// the server and the compressor competing for the cores: W1 through NBD
/// keeps this 2-core machine's median window 100% busy at zstd:3). A
/// reading is already its window's mean, so the smoothing's 10 ms time
/// constant leaves each window's own share to decide: with 100 ms and a
/// 200 ms hold (sessions 16-24) a burst after an idle spell took 0.7-0.8 s
/// to reach raw (the first reading covers the idle spell), half of W3's
/// 1.5 s copy on a quiet machine, at lz4's speed or less; up once
/// it has been at most 75% for the up-hold (1 s at first, up to 10 s after
/// failed probes). Writers up to three quarters of what the target
/// sustains keep it; at 0.8-0.85x the cores are 85-92% busy and the law
/// steps down for part of the run (docs/benchmarks-history.md, "CPU headroom").
pub const HEADROOM_LAW: Law = Law {
    tau_ns: 10 * MS,
    down_at: 0.95,
    down_hold_ns: 100 * MS,
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
    /// Up steps the caller vetoed ([`LawState::sample_gated`]).
    vetoes: u64,
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
            vetoes: 0,
        }
    }

    pub fn rung(&self) -> usize {
        self.rung
    }

    /// Rung changes so far.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Up steps vetoed so far (each sample that would have stepped).
    pub fn vetoes(&self) -> u64 {
        self.vetoes
    }

    /// The current up-hold.
    pub fn up_hold_ns(&self) -> u64 {
        self.up_hold_ns
    }

    /// The number of rungs the law may use now: the CPU law's raw rung
    /// comes and goes with the floor setting and the volume's room
    /// ([`super::burst`]). Fewer rungs than the law stands on is a step
    /// up to the new last one (at `now_ns`); more is a new rung below,
    /// reached as any other (a whole down-hold from the current one).
    pub fn set_rungs(&mut self, now_ns: u64, rungs: usize) {
        assert!(rungs >= 1);
        if rungs > self.rungs {
            // A hold under way counts from now for the new rung.
            if let Some((since, from)) = self.high_since.as_mut() {
                *since = now_ns;
                *from = self.load.unwrap_or(*from);
            }
        }
        self.rungs = rungs;
        if self.rung >= rungs {
            // Not a probe: the rung below went away, the load did not drop.
            self.last_up = false;
            self.step(now_ns, rungs - 1);
        }
    }

    /// The number of rungs the law uses now.
    pub fn rungs(&self) -> usize {
        self.rungs
    }

    /// Feeds one sample (`backlog` raw bytes per worker at `now_ns`, which
    /// never goes back) and returns the rung for the batch about to go.
    pub fn sample(&mut self, now_ns: u64, backlog: f64) -> usize {
        self.sample_gated(now_ns, backlog, true)
    }

    /// [`LawState::sample`], with up steps allowed only while `up_ok` (the
    /// caller's prediction that the slower rung would not saturate what
    /// the law watches: `super::cost`). A vetoed up step is not a probe:
    /// the low spell goes on, and the step (one rung) comes with the first
    /// sample that allows it.
    pub fn sample_gated(&mut self, now_ns: u64, backlog: f64, up_ok: bool) -> usize {
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
            let mut since = *self.low_since.get_or_insert(start);
            if !up_ok {
                // Vetoed: the spell qualifies for one step, not for as many
                // as it lasted up-holds (those are for a quiet spell).
                if self.rung > 0 && now_ns - since >= self.up_hold_ns {
                    self.vetoes += 1;
                }
                since = since.max(now_ns.saturating_sub(self.up_hold_ns));
                self.low_since = Some(since);
            } else if self.rung > 0 && now_ns - since >= self.up_hold_ns {
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

    /// One more rung down at once, right after a down step, when the
    /// caller predicts the rung just taken would saturate too (`super::cost`):
    /// a burst goes from the target to raw in one window instead of two.
    /// Nothing when the law is on its last rung.
    pub fn skip_down(&mut self, now_ns: u64) {
        if self.rung + 1 < self.rungs {
            self.last_up = false;
            self.relaxed_ns = now_ns;
            self.step(now_ns, self.rung + 1);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The CPU law with the raw rung: the target, lz4, raw.
    const TARGET: usize = 0;
    const LZ4: usize = 1;
    const RAW: usize = 2;

    #[test]
    fn saturated_at_lz4_steps_down_to_raw_and_stays() {
        // The W3 burst: cores saturated at the target and at lz4, and
        // still at raw (the client takes what raw frees).
        let mut st = LawState::new(HEADROOM_LAW, 3);
        let per_rung = run_cpu(&mut st, 0, 200, &[0.99, 0.99, 0.97]);
        assert_eq!(per_rung[RAW], 0, "not before two down-holds");
        let per_rung = run_cpu(&mut st, 200, 600, &[0.99, 0.99, 0.97]);
        assert_eq!(st.rung(), RAW, "{per_rung:?}");
        assert_eq!(st.changes(), 2);
        // A minute more of the burst: raw throughout, no probe of lz4 (the
        // cores never go below the up threshold).
        let per_rung = run_cpu(&mut st, 800, 60_000, &[0.99, 0.99, 0.97]);
        assert_eq!(per_rung[RAW], 600);
        assert_eq!(st.changes(), 2);
        // The burst ends: back to the target at the first reading after a
        // quiet spell of two up-holds.
        assert_eq!(
            st.sample(60_800 * MS + 2 * HEADROOM_LAW.up_hold_min_ns, 0.05),
            TARGET
        );
    }

    #[test]
    fn a_burst_after_an_idle_spell_reaches_raw_within_two_windows() {
        // W3 through NBD on a quiet machine: a 1.1 s copy after a minute
        // of nothing. The first reading of the burst covers the idle
        // minute (low); each later window is saturated at the target and
        // at lz4. Every window at lz4 or above is a window of the copy at
        // lz4's speed or less, so the law must act on each saturated
        // window at once: raw from the third reading on.
        let mut st = LawState::new(HEADROOM_LAW, 3);
        run_cpu(&mut st, 0, 10_000, &[0.3; 3]);
        assert_eq!(st.sample(70_000 * MS, 0.02), TARGET, "the idle minute");
        assert_eq!(st.sample(70_100 * MS, 0.99), LZ4);
        assert_eq!(st.sample(70_200 * MS, 0.99), RAW);
        // One saturated window in a quiet stream is one rung for an
        // up-hold, not two.
        let mut st = LawState::new(HEADROOM_LAW, 3);
        run_cpu(&mut st, 0, 10_000, &[0.3; 3]);
        assert_eq!(st.sample(10_000 * MS, 0.99), LZ4);
        assert_eq!(st.sample(10_100 * MS, 0.3), LZ4);
        let per_rung = run_cpu(&mut st, 10_200, 5_000, &[0.3; 3]);
        assert_eq!(per_rung[RAW], 0, "{per_rung:?}");
        assert_eq!(st.rung(), TARGET);
    }

    #[test]
    fn a_writer_lz4_satisfies_never_stores_raw() {
        // Saturated at the target, 85% busy at lz4: the law stays at lz4
        // (between the thresholds) and the raw rung is never taken.
        let mut st = LawState::new(HEADROOM_LAW, 3);
        let per_rung = run_cpu(&mut st, 0, 120_000, &[0.99, 0.85, 0.5]);
        assert_eq!(per_rung[RAW], 0, "{per_rung:?}");
        assert!(per_rung[LZ4] >= 1195, "{per_rung:?}");
        assert_eq!(st.changes(), 1);
    }

    #[test]
    fn a_rate_raw_satisfies_probes_lz4_rarely() {
        // Saturated at lz4, 60% busy at raw: each probe of lz4 saturates
        // the cores again; probes come at most once per up-hold, which
        // doubles up to 10 s, and never up to the target in one step.
        let mut st = LawState::new(HEADROOM_LAW, 3);
        let per_rung = run_cpu(&mut st, 0, 120_000, &[0.99, 0.99, 0.6]);
        let total: u64 = per_rung.iter().sum();
        assert!(per_rung[RAW] as f64 > 0.9 * total as f64, "{per_rung:?}");
        assert!(per_rung[TARGET] <= 2, "{per_rung:?}");
        assert_eq!(st.up_hold_ns(), HEADROOM_LAW.up_hold_max_ns);
        assert!(st.changes() <= 2 + 2 * 5 + 2 * 12, "{}", st.changes());
    }

    #[test]
    fn the_raw_rung_going_away_is_one_step_to_lz4() {
        // At raw when the room runs out (or the floor is set to lz4): lz4
        // at once, and the saturated cores cannot take the law below it.
        let mut st = LawState::new(HEADROOM_LAW, 3);
        run_cpu(&mut st, 0, 1_000, &[0.99; 3]);
        assert_eq!(st.rung(), RAW);
        st.set_rungs(1_000 * MS, 2);
        assert_eq!(st.rung(), LZ4);
        assert_eq!(st.changes(), 3);
        let per_rung = run_cpu(&mut st, 1_000, 60_000, &[0.99; 2]);
        assert_eq!(per_rung, vec![0, 600]);
        assert_eq!(st.changes(), 3, "no probe of the target while saturated");
        // The room comes back: raw after a whole down-hold at lz4.
        st.set_rungs(61_000 * MS, 3);
        assert_eq!(st.rung(), LZ4);
        assert_eq!(st.sample(61_050 * MS, 0.99), LZ4);
        assert_eq!(st.sample(61_100 * MS, 0.99), RAW);
        // Fewer rungs than the law stands on never goes below rung 0.
        st.set_rungs(61_400 * MS, 1);
        assert_eq!(st.rung(), TARGET);
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

    #[test]
    fn a_vetoed_up_step_waits_for_the_first_sample_that_allows_it() {
        // At raw, the cores at 60%: the law would probe lz4 after the
        // up-hold; the caller's prediction forbids it for 5 s.
        let mut st = LawState::new(HEADROOM_LAW, 3);
        run_cpu(&mut st, 0, 1_000, &[0.99; 3]);
        assert_eq!(st.rung(), RAW);
        let changes = st.changes();
        for t in (1_000..6_000).step_by(100) {
            assert_eq!(st.sample_gated(t * MS, 0.6, false), RAW);
        }
        assert_eq!(st.changes(), changes, "no probe while vetoed");
        // Vetoed from the first sample a whole up-hold into the spell.
        assert!((39..=41).contains(&st.vetoes()), "{}", st.vetoes());
        // Allowed: the low spell counted all along, so the step is at once
        // (and one rung only: the readings were short windows).
        assert_eq!(st.sample_gated(6_000 * MS, 0.6, true), LZ4);
        // The veto holds nothing else: down steps go on as before.
        let mut st = LawState::new(HEADROOM_LAW, 3);
        assert_eq!(st.sample_gated(0, 0.99, false), TARGET);
        assert_eq!(st.sample_gated(100 * MS, 0.99, false), LZ4);
    }

    #[test]
    fn a_skip_goes_one_more_rung_down_at_once() {
        let mut st = LawState::new(HEADROOM_LAW, 3);
        st.sample(0, 0.99);
        assert_eq!(st.sample(100 * MS, 0.99), LZ4);
        st.skip_down(100 * MS);
        assert_eq!(st.rung(), RAW);
        assert_eq!(st.changes(), 2);
        // Nothing below the last rung.
        st.skip_down(200 * MS);
        assert_eq!(st.rung(), RAW);
        assert_eq!(st.changes(), 2);
        // Not a failed probe: the up-hold is where it was.
        assert_eq!(st.up_hold_ns(), HEADROOM_LAW.up_hold_min_ns);
    }
}
