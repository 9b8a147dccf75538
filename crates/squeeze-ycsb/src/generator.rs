//! YCSB's request generators, as its core package defines them
//! (`site.ycsb.generator`): the zipfian generator of Gray et al. ("Quickly
//! Generating Billion-Record Synthetic Databases", SIGMOD 1994) with
//! YCSB's constant 0.99, the scrambled zipfian that spreads the popular
//! items over the key space, the skewed-latest generator of workload D,
//! and the FNV-1 64-bit hash YCSB uses to scramble and to name keys.

use rand::Rng;

/// YCSB's `ZIPFIAN_CONSTANT`.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// The item space of YCSB's scrambled zipfian (`ITEM_COUNT`) ...
const SCRAMBLED_ITEMS: u64 = 10_000_000_000;
/// ... and its zeta, precomputed by YCSB (`ZETAN`) since summing ten
/// billion terms at start-up would take minutes.
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// YCSB's `Utils.fnvhash64`: FNV-1 over the 8 bytes of `v`, low byte
/// first, made non-negative as Java's `Math.abs` of a long would.
pub fn fnvhash64(mut v: u64) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for _ in 0..8 {
        let octet = v & 0xff;
        v >>= 8;
        h ^= octet;
        h = h.wrapping_mul(1_099_511_628_211);
    }
    (h as i64).unsigned_abs()
}

/// The key of record number `n`: YCSB's `buildKeyName` with hashed insert
/// order (its default), so consecutive inserts do not land side by side in
/// an ordered store.
pub fn key_name(n: u64) -> String {
    format!("user{}", fnvhash64(n))
}

/// `sum_{i=st}^{n-1} 1 / (i+1)^theta` added to `initial`: the generalized
/// harmonic number, extended from `st` items to `n`.
fn zeta(st: u64, n: u64, theta: f64, initial: f64) -> f64 {
    (st..n).fold(initial, |s, i| s + 1.0 / ((i + 1) as f64).powf(theta))
}

/// Zipfian over `[base, base + items)`: item `base` is the most popular.
/// The item count may grow (workload D's latest generator does); zeta is
/// then extended incrementally, as YCSB does.
#[derive(Clone, Debug)]
pub struct Zipfian {
    base: u64,
    items: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    zeta2: f64,
    eta: f64,
    /// Item count `zetan` was computed for.
    count_for_zeta: u64,
}

impl Zipfian {
    /// Over `[min, max]`, computing zeta (O(items) once).
    pub fn new(min: u64, max: u64) -> Zipfian {
        let items = max - min + 1;
        Self::with_zetan(
            min,
            items,
            zeta(0, items, ZIPFIAN_CONSTANT, 0.0),
            ZIPFIAN_CONSTANT,
        )
    }

    fn with_zetan(base: u64, items: u64, zetan: f64, theta: f64) -> Zipfian {
        let zeta2 = zeta(0, 2, theta, 0.0);
        let mut z = Zipfian {
            base,
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            zeta2,
            eta: 0.0,
            count_for_zeta: items,
        };
        z.eta = z.eta_for(items);
        z
    }

    fn eta_for(&self, items: u64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }

    /// The next item, drawn from the first `items` items (at least the
    /// count the generator was made with).
    pub fn next_of(&mut self, rng: &mut impl Rng, items: u64) -> u64 {
        if items > self.count_for_zeta {
            self.zetan = zeta(self.count_for_zeta, items, self.theta, self.zetan);
            self.count_for_zeta = items;
            self.eta = self.eta_for(items);
        }
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        let v = (items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        self.base + v.min(items - 1)
    }

    pub fn next(&mut self, rng: &mut impl Rng) -> u64 {
        self.next_of(rng, self.items)
    }
}

/// YCSB's `ScrambledZipfianGenerator`: zipfian popularity, but the popular
/// items are scattered over `[min, max]` by a hash instead of clustered at
/// its start.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: u64,
    items: u64,
    z: Zipfian,
}

impl ScrambledZipfian {
    pub fn new(min: u64, max: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            min,
            items: max - min + 1,
            z: Zipfian::with_zetan(0, SCRAMBLED_ITEMS, SCRAMBLED_ZETAN, ZIPFIAN_CONSTANT),
        }
    }

    pub fn next(&mut self, rng: &mut impl Rng) -> u64 {
        self.min + fnvhash64(self.z.next(rng)) % self.items
    }
}

/// YCSB's `SkewedLatestGenerator`: the most recently inserted records are
/// the most popular (zipfian over the distance from the newest).
#[derive(Clone, Debug)]
pub struct SkewedLatest {
    z: Zipfian,
}

impl SkewedLatest {
    /// `records`: the records present when the run starts.
    pub fn new(records: u64) -> SkewedLatest {
        SkewedLatest {
            z: Zipfian::new(0, records - 1),
        }
    }

    /// A record among the first `present` (all acknowledged inserts).
    pub fn next(&mut self, rng: &mut impl Rng, present: u64) -> u64 {
        let max = present - 1;
        max - self.z.next_of(rng, present)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn fnv_matches_ycsb() {
        // FNV-1 64 of eight zero bytes, as YCSB's loop computes it.
        let mut h: u64 = 0xCBF2_9CE4_8422_2325;
        for _ in 0..8 {
            h = h.wrapping_mul(1_099_511_628_211);
        }
        assert_eq!(fnvhash64(0), (h as i64).unsigned_abs());
        assert_ne!(fnvhash64(1), fnvhash64(2));
        assert!(key_name(7).starts_with("user"));
    }

    #[test]
    fn the_precomputed_zeta_is_the_sum_it_names() {
        // The first terms dominate; check the constant against a direct sum
        // of a prefix plus an integral bound of the rest.
        let n = 1_000_000u64;
        let head = zeta(0, n, ZIPFIAN_CONSTANT, 0.0);
        let s = 1.0 - ZIPFIAN_CONSTANT;
        let tail = ((SCRAMBLED_ITEMS as f64).powf(s) - (n as f64).powf(s)) / s;
        assert!(
            (head + tail - SCRAMBLED_ZETAN).abs() < 0.01,
            "{head} + {tail}"
        );
    }

    /// Zipfian with theta 0.99 over 1000 items: item 0 takes about
    /// 1/zeta(1000) of the draws (13%), and the top 10 about 39%.
    #[test]
    fn zipfian_is_skewed_as_theta_says() {
        let mut r = StdRng::seed_from_u64(1);
        let mut z = Zipfian::new(0, 999);
        let n = 200_000;
        let mut counts = vec![0u64; 1000];
        for _ in 0..n {
            counts[z.next(&mut r) as usize] += 1;
        }
        let zn = zeta(0, 1000, ZIPFIAN_CONSTANT, 0.0);
        let p0 = counts[0] as f64 / n as f64;
        assert!(
            (p0 - 1.0 / zn).abs() < 0.01,
            "p0 {p0}, expected {}",
            1.0 / zn
        );
        let top10: u64 = counts[..10].iter().sum();
        let expect: f64 = (0..10)
            .map(|i| 1.0 / ((i + 1) as f64).powf(0.99) / zn)
            .sum();
        assert!((top10 as f64 / n as f64 - expect).abs() < 0.02);
        assert!(counts[500] < counts[5]);
    }

    #[test]
    fn scrambled_zipfian_stays_in_range_and_scatters_the_popular() {
        let mut r = StdRng::seed_from_u64(2);
        let mut z = ScrambledZipfian::new(100, 1099);
        let mut counts = vec![0u64; 1000];
        for _ in 0..100_000 {
            let v = z.next(&mut r);
            assert!((100..1100).contains(&v));
            counts[(v - 100) as usize] += 1;
        }
        let hottest = (0..1000).max_by_key(|&i| counts[i]).unwrap();
        // Skewed: the hottest item far above the mean of 100 ...
        assert!(counts[hottest] > 1000, "{}", counts[hottest]);
        // ... and not simply the first item of the range.
        assert_ne!(hottest, 0);
    }

    #[test]
    fn latest_prefers_the_newest_and_follows_growth() {
        let mut r = StdRng::seed_from_u64(3);
        let mut l = SkewedLatest::new(1000);
        let mut newest = 0;
        for _ in 0..10_000 {
            let v = l.next(&mut r, 1000);
            assert!(v < 1000);
            newest += u64::from(v == 999);
        }
        assert!(newest > 1000, "{newest}");
        for present in 1000..1100 {
            assert!(l.next(&mut r, present) < present);
        }
    }
}
