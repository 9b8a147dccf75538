//! A tiny deterministic generator (SplitMix64), so that a seed names the
//! same operation stream on every machine and every toolchain.

/// The SplitMix64 finaliser: a good 64-bit mixing function.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(mix(seed ^ 0x5151_5eed_0000_0001))
    }

    /// An independent stream for (seed, a, b): e.g. (seed, cycle, connection).
    pub fn derive(seed: u64, a: u64, b: u64) -> Rng {
        Rng::new(mix(seed) ^ mix(a.wrapping_add(0x1234_5678)).rotate_left(17) ^ mix(!b))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| Rng::derive(7, 1, 2).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            Rng::derive(7, 1, 2).next_u64(),
            Rng::derive(7, 2, 1).next_u64()
        );
        let mut r = Rng::new(3);
        for _ in 0..1000 {
            let v = r.between(5, 9);
            assert!((5..=9).contains(&v));
        }
    }
}
