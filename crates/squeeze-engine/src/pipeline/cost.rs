//! Stage 2b's cost model: what each rung of the codec ladder costs the
//! machine's cores at the client's rate, so the CPU law ([`super::adapt`])
//! does not take a rung that would saturate the cores again.
//!
//! Two things are kept:
//! - per compressing rung, CPU nanoseconds per client byte, a moving
//!   average over the client batches written with it (zero sectors and
//!   blobs the heuristic left raw count as bytes: they are the client's,
//!   and cost the codec next to nothing);
//! - since the last CPU reading, the compression CPU spent on client
//!   batches (whatever rungs they had).
//!
//! At each CPU reading (busy share `busy` over a window of `window_ns`,
//! `bytes` written by the client in it, `cores` cores), the busy share a
//! rung `r` would have had over the same window at the same rate:
//!
//!   predicted(r) = max(0, busy - spent / (window_ns x cores))
//!                  + bytes x cost(r) / (window_ns x cores)
//!
//! Only measured costs predict: a rung never used by a client batch has
//! no prediction, and the law decides alone, as it did before the model.
//! (An estimate from another rung's cost, lz4 at half of zstd:3's, was
//! tried: on fio's data lz4 costs a quarter, so the estimate vetoed the
//! probes of a writer at 0.75x of the zstd:3 ceiling that lz4 would have
//! served, and the skip that had jumped lz4 kept it from ever being
//! measured: 11-48% of that writer's bytes at the target against 94%.)
//!
//! Invariants: costs are finite and non-negative; the window accumulator
//! is emptied by each reading; raw (the rung after the compressing ones)
//! costs nothing.

/// Weight of a new batch in a rung's moving average.
const ALPHA: f64 = 0.125;

/// The model's state (see the module text), for a ladder of `rungs`
/// compressing rungs, the target first.
#[derive(Clone, Debug)]
pub struct CostModel {
    /// CPU ns per client byte, per rung (None: never measured).
    cost: Vec<Option<f64>>,
    /// Compression CPU ns spent on client batches since the last reading.
    spent_ns: u64,
}

/// What the last reading's window showed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// The busy share without the window's own compression.
    pub base: f64,
    /// Client bytes per ns of CPU capacity (bytes / (window_ns x cores)).
    pub load: f64,
}

impl CostModel {
    pub fn new(rungs: usize) -> CostModel {
        assert!(rungs >= 1);
        CostModel {
            cost: vec![None; rungs],
            spent_ns: 0,
        }
    }

    /// A client batch of `bytes` compressed with `rung` in `cpu_ns`. A
    /// rung outside the compressing ones (raw) costs nothing to record.
    pub fn record(&mut self, rung: usize, bytes: u64, cpu_ns: u64) {
        if bytes == 0 || rung >= self.cost.len() {
            return;
        }
        self.spent_ns = self.spent_ns.saturating_add(cpu_ns);
        let c = cpu_ns as f64 / bytes as f64;
        let avg = self.cost[rung].map_or(c, |prev| prev + ALPHA * (c - prev));
        self.cost[rung] = Some(avg);
    }

    /// The cost of `rung` per client byte as measured; raw costs nothing;
    /// None for a compressing rung never measured.
    pub fn cost(&self, rung: usize) -> Option<f64> {
        match self.cost.get(rung) {
            Some(c) => *c,
            None => Some(0.0),
        }
    }

    /// Ends the window of a CPU reading: `busy` over `window_ns` on
    /// `cores`, with `bytes` written by the client in it.
    pub fn reading(&mut self, busy: f64, window_ns: u64, cores: f64, bytes: u64) -> Window {
        let capacity = window_ns.max(1) as f64 * cores.max(1.0);
        let spent = std::mem::take(&mut self.spent_ns) as f64;
        Window {
            base: (busy - spent / capacity).max(0.0),
            load: bytes as f64 / capacity,
        }
    }

    /// The busy share `rung` would have had over `w` (None: no cost known).
    pub fn predict(&self, w: Window, rung: usize) -> Option<f64> {
        self.cost(rung).map(|c| w.base + w.load * c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_rung_costs_what_its_batches_cost() {
        let mut m = CostModel::new(2);
        assert_eq!(m.cost(0), None);
        assert_eq!(m.cost(1), None);
        assert_eq!(m.cost(2), Some(0.0), "raw costs nothing");
        m.record(0, 1 << 20, 3 << 20);
        assert_eq!(m.cost(0), Some(3.0));
        // The fastest, never measured: no cost, whatever the target's.
        assert_eq!(m.cost(1), None);
        // Measured: its own, averaged.
        m.record(1, 1 << 20, 1 << 20);
        assert_eq!(m.cost(1), Some(1.0));
        m.record(1, 1 << 20, 9 << 20);
        assert_eq!(m.cost(1), Some(1.0 + ALPHA * 8.0));
        // Raw batches and empty ones change nothing.
        m.record(2, 1 << 20, 0);
        m.record(0, 0, 5);
        assert_eq!(m.cost(0), Some(3.0));
    }

    #[test]
    fn a_window_predicts_each_rung_at_the_clients_rate() {
        let mut m = CostModel::new(2);
        // lz4 measured at 1 ns a byte; then 100 ms on 2 cores at the
        // target: 40 ms of compression in it, 20 MB written, the cores 90%
        // busy.
        m.record(1, 1_000_000, MS);
        let _ = m.reading(0.0, 100 * MS, 2.0, 0);
        m.record(0, 20_000_000, 40 * MS);
        let w = m.reading(0.9, 100 * MS, 2.0, 20_000_000);
        // Without the window's compression: 0.9 - 0.04 / 0.2.
        assert!((w.base - 0.7).abs() < 1e-9, "{w:?}");
        // The target again: what was seen.
        assert!((m.predict(w, 0).unwrap() - 0.9).abs() < 1e-9);
        // The fastest at half the cost: 0.7 + 0.1.
        assert!(
            (m.predict(w, 1).unwrap() - 0.8).abs() < 1e-9,
            "{:?}",
            m.predict(w, 1)
        );
        // Raw: the base alone.
        assert!((m.predict(w, 2).unwrap() - 0.7).abs() < 1e-9);
        // The window's compression was taken: the next one starts empty.
        let w = m.reading(0.5, 100 * MS, 2.0, 0);
        assert_eq!(
            w,
            Window {
                base: 0.5,
                load: 0.0
            }
        );
        // Nothing measured: no prediction for a compressing rung.
        let m = CostModel::new(2);
        assert_eq!(m.predict(w, 0), None);
        assert_eq!(m.predict(w, 2), Some(0.5));
    }
}
