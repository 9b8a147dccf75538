//! Stage 2b's third rule: a trial of the faster codec. Between "the cores
//! have room" and "the cores are saturated" (the CPU law's 75-95%) the
//! busy share cannot tell a client that compression slows down (Ceph's
//! OSD pipeline on squeeze: 85% busy, 460-494 MB/s at zstd:3 and 555 at
//! lz4) from one that writes at a rate it chose (fio at 0.8x of the zstd:3
//! ceiling: 85-92% busy, and no faster at lz4). So the codec asks by
//! experiment: while the cores stay busy, it measures the client's write
//! rate over a window at the target, then over a window at the ladder's
//! fastest rung, and keeps the faster codec only if the client wrote at
//! least `gain` times as fast with it.
//!
//! The rule, fed one reading per CPU window (`now`, the busy share, the
//! client bytes written so far):
//! - Watching (target): once the cores have been at least `busy_at` busy
//!   for a whole `window_ns` and no trial is due later, that window's rate
//!   is the baseline and a trial starts (fast).
//! - Trying (fast) for `window_ns`: kept if its rate is at least `gain` x
//!   the baseline (Holding, the back-off reset); else back to the target,
//!   and the next trial waits a back-off that doubles each time, from
//!   `backoff_min_ns` to `backoff_max_ns`.
//! - Holding (fast) for `hold_ns`; then the reverse trial: the last window
//!   at fast is the baseline, a window at the target follows, and the
//!   target stays only if the client lost less than `gain` with it (else
//!   Holding again).
//! - Cores below `quiet_at` (the client went quiet or slowed) end any phase:
//!   back to watching at the target.
//!
//! Invariants: at most one window at the fast rung per back-off while
//! trials fail, so a client at a rate of its own choosing loses at most
//! `window_ns / backoff` of its bytes to the faster codec (below target,
//! upgraded when idle); time never goes back.

/// The rule's constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrialRule {
    pub busy_at: f64,
    pub quiet_at: f64,
    pub window_ns: u64,
    pub gain: f64,
    pub backoff_min_ns: u64,
    pub backoff_max_ns: u64,
    pub hold_ns: u64,
}

const MS: u64 = 1_000_000;

/// Defaults: trials from 80% busy (a writer at half the zstd:3 ceiling
/// keeps this machine about 60% busy, and never sees one); 500 ms windows
/// (five CPU readings); a 10% gain, above the 2-5% window-to-window spread
/// of a steady client here; back-off 10 s doubling to 160 s.
pub const TRIAL_DEFAULT: TrialRule = TrialRule {
    busy_at: 0.80,
    quiet_at: 0.60,
    window_ns: 500 * MS,
    gain: 1.10,
    backoff_min_ns: 10_000 * MS,
    backoff_max_ns: 160_000 * MS,
    hold_ns: 10_000 * MS,
};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// At the target; busy since (time, bytes) or not.
    Watching { busy_since: Option<(u64, u64)> },
    /// At fast since (time, bytes), against the target's rate.
    Trying { since: (u64, u64), base: f64 },
    /// At fast until; the current window's start, and the rate of the
    /// last whole window.
    Holding {
        until: u64,
        window: (u64, u64),
        last: f64,
    },
    /// At the target since (time, bytes), against fast's rate.
    Reversing { since: (u64, u64), base: f64 },
}

/// The rule's state.
#[derive(Clone, Debug)]
pub struct Trial {
    rule: TrialRule,
    phase: Phase,
    next_trial_ns: u64,
    backoff_ns: u64,
    trials: u64,
    kept: u64,
}

impl Trial {
    pub fn new(rule: TrialRule) -> Trial {
        Trial {
            rule,
            phase: Phase::Watching { busy_since: None },
            next_trial_ns: 0,
            backoff_ns: rule.backoff_min_ns,
            trials: 0,
            kept: 0,
        }
    }

    /// True while the faster codec is on (a trial or a hold).
    pub fn fast(&self) -> bool {
        matches!(self.phase, Phase::Trying { .. } | Phase::Holding { .. })
    }

    /// Trials started, and kept.
    pub fn trials(&self) -> (u64, u64) {
        (self.trials, self.kept)
    }

    /// Back to watching at the target (the CPU law has taken the fast rung
    /// itself: a window measured then is not the target's).
    pub fn reset(&mut self) {
        self.phase = Phase::Watching { busy_since: None };
    }

    /// Feeds one reading; returns whether the next batches take the
    /// faster codec.
    pub fn sample(&mut self, now: u64, busy: f64, written: u64) -> bool {
        let r = self.rule;
        let rate =
            |(t, b): (u64, u64)| (written.saturating_sub(b)) as f64 / (now - t).max(1) as f64;
        if busy < r.quiet_at {
            self.phase = Phase::Watching { busy_since: None };
            return false;
        }
        self.phase = match self.phase {
            Phase::Watching { busy_since } => {
                if busy < r.busy_at {
                    Phase::Watching { busy_since: None }
                } else {
                    let since = busy_since.unwrap_or((now, written));
                    // A window without client bytes has no rate to beat.
                    if now - since.0 >= r.window_ns
                        && now >= self.next_trial_ns
                        && rate(since) > 0.0
                    {
                        self.trials += 1;
                        Phase::Trying {
                            since: (now, written),
                            base: rate(since),
                        }
                    } else {
                        Phase::Watching {
                            busy_since: Some(since),
                        }
                    }
                }
            }
            Phase::Trying { since, base } if now - since.0 >= r.window_ns => {
                if rate(since) >= r.gain * base {
                    self.kept += 1;
                    self.backoff_ns = r.backoff_min_ns;
                    Phase::Holding {
                        until: now + r.hold_ns,
                        window: (now, written),
                        last: rate(since),
                    }
                } else {
                    self.next_trial_ns = now + self.backoff_ns;
                    self.backoff_ns = (self.backoff_ns * 2).min(r.backoff_max_ns);
                    Phase::Watching { busy_since: None }
                }
            }
            Phase::Holding {
                until,
                window,
                last,
            } => {
                let (window, last) = if now - window.0 >= r.window_ns {
                    ((now, written), rate(window))
                } else {
                    (window, last)
                };
                if now >= until {
                    Phase::Reversing {
                        since: (now, written),
                        base: last,
                    }
                } else {
                    Phase::Holding {
                        until,
                        window,
                        last,
                    }
                }
            }
            Phase::Reversing { since, base } if now - since.0 >= r.window_ns => {
                if rate(since) * r.gain >= base {
                    // The client lost less than the gain at the target.
                    Phase::Watching { busy_since: None }
                } else {
                    Phase::Holding {
                        until: now + r.hold_ns,
                        window: (now, written),
                        last: base,
                    }
                }
            }
            p => p,
        };
        self.fast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client whose rate (bytes per ns) depends on the codec; one
    /// reading every 100 ms for `ms`, with the cores `busy`. Returns the
    /// bytes written at fast and in all.
    fn run(
        t: &mut Trial,
        at: &mut u64,
        written: &mut u64,
        ms: u64,
        rate: [f64; 2],
        busy: f64,
    ) -> (f64, f64) {
        let (mut fast, mut all) = (0.0, 0.0);
        for _ in 0..ms / 100 {
            let f = t.fast();
            let bytes = rate[usize::from(f)] * 100.0 * MS as f64;
            *written += bytes as u64;
            *at += 100 * MS;
            all += bytes;
            if f {
                fast += bytes;
            }
            t.sample(*at, busy, *written);
        }
        (fast, all)
    }

    #[test]
    fn a_client_faster_with_the_fast_codec_keeps_it() {
        // 460 MB/s at the target, 555 at fast (Ceph's OSD here), 85% busy.
        let mut t = Trial::new(TRIAL_DEFAULT);
        let (mut at, mut w) = (0, 0);
        let (fast, all) = run(&mut t, &mut at, &mut w, 60_000, [0.46, 0.555], 0.85);
        assert!(t.fast());
        assert!(fast > 0.9 * all, "{fast} of {all}");
        // Reverse trials every hold confirm it: each one a window at the
        // target.
        let (trials, kept) = t.trials();
        assert_eq!((trials, kept), (1, 1));
    }

    #[test]
    fn a_client_at_its_own_rate_loses_little_and_less_and_less() {
        // The same rate at either codec (fio --rate), 88% busy.
        let mut t = Trial::new(TRIAL_DEFAULT);
        let (mut at, mut w) = (0, 0);
        let (fast, all) = run(&mut t, &mut at, &mut w, 600_000, [0.7, 0.7], 0.88);
        assert!(!t.fast());
        // Trials at 0.5, 11, 31, 71, 151, 311 (then every 160 s) s: 7 in
        // ten minutes, 500 ms each.
        let (trials, kept) = t.trials();
        assert_eq!(kept, 0);
        assert!(trials <= 8, "{trials}");
        assert!(fast <= 0.01 * all, "{fast} of {all}");
        // In its first three seconds a trial costs a sixth of its bytes.
        let mut t = Trial::new(TRIAL_DEFAULT);
        let (mut at, mut w) = (0, 0);
        let (fast, all) = run(&mut t, &mut at, &mut w, 3_000, [0.7, 0.7], 0.88);
        assert!(fast <= all / 6.0 + 1.0, "{fast} of {all}");
    }

    #[test]
    fn cores_with_room_see_no_trial_and_a_quiet_client_ends_one() {
        let mut t = Trial::new(TRIAL_DEFAULT);
        let (mut at, mut w) = (0, 0);
        run(&mut t, &mut at, &mut w, 60_000, [0.4, 0.6], 0.7);
        assert_eq!(t.trials(), (0, 0));
        run(&mut t, &mut at, &mut w, 2_000, [0.4, 0.6], 0.9);
        assert!(t.fast());
        run(&mut t, &mut at, &mut w, 200, [0.0, 0.0], 0.1);
        assert!(!t.fast());
        // The CPU law taking the fast rung itself ends a trial too.
        run(&mut t, &mut at, &mut w, 2_000, [0.4, 0.6], 0.9);
        assert!(t.fast());
        t.reset();
        assert!(!t.fast());
    }

    #[test]
    fn the_target_comes_back_when_it_stops_costing() {
        // Faster at fast first; then the client turns rate-limited: the
        // reverse trial after the hold finds the target as fast.
        let mut t = Trial::new(TRIAL_DEFAULT);
        let (mut at, mut w) = (0, 0);
        run(&mut t, &mut at, &mut w, 2_000, [0.46, 0.555], 0.85);
        assert!(t.fast());
        run(&mut t, &mut at, &mut w, 12_000, [0.3, 0.3], 0.85);
        assert!(!t.fast());
    }
}
