//! YCSB's core workloads (the `workloads/workload[a-f]` files of YCSB):
//! operation mix and request distribution. E (short range scans) is left
//! out: squeeze-kv hashes keys and has no ordered scan.

use crate::generator::{ScrambledZipfian, SkewedLatest};
use anyhow::{bail, Result};
use rand::Rng;

/// How the record of a request is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    Zipfian,
    Latest,
    Uniform,
}

/// One operation of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Update,
    Insert,
    ReadModifyWrite,
}

#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub name: char,
    /// Shares of reads, updates, inserts and read-modify-writes, in percent.
    pub read: u32,
    pub update: u32,
    pub insert: u32,
    pub rmw: u32,
    pub dist: Distribution,
    pub what: &'static str,
}

impl Workload {
    pub fn get(name: char) -> Result<Workload> {
        let w = |read, update, insert, rmw, dist, what| Workload {
            name,
            read,
            update,
            insert,
            rmw,
            dist,
            what,
        };
        Ok(match name.to_ascii_lowercase() {
            'a' => w(50, 50, 0, 0, Distribution::Zipfian, "update heavy"),
            'b' => w(95, 5, 0, 0, Distribution::Zipfian, "read mostly"),
            'c' => w(100, 0, 0, 0, Distribution::Zipfian, "read only"),
            'd' => w(95, 0, 5, 0, Distribution::Latest, "read latest"),
            'f' => w(50, 0, 0, 50, Distribution::Zipfian, "read-modify-write"),
            'e' => bail!("workload E needs ordered range scans, which a hash store does not have"),
            _ => bail!("unknown workload {name:?}: the core workloads are a, b, c, d and f"),
        })
    }

    /// The next operation.
    pub fn op(&self, rng: &mut impl Rng) -> Op {
        let x = rng.gen_range(0..100);
        if x < self.read {
            Op::Read
        } else if x < self.read + self.update {
            Op::Update
        } else if x < self.read + self.update + self.insert {
            Op::Insert
        } else {
            Op::ReadModifyWrite
        }
    }
}

/// Picks the record of a read or update, as the workload's distribution
/// says.
pub enum Chooser {
    Zipfian(ScrambledZipfian),
    Latest(SkewedLatest),
    Uniform(u64),
}

impl Chooser {
    pub fn new(dist: Distribution, records: u64) -> Chooser {
        match dist {
            Distribution::Zipfian => Chooser::Zipfian(ScrambledZipfian::new(0, records - 1)),
            Distribution::Latest => Chooser::Latest(SkewedLatest::new(records)),
            Distribution::Uniform => Chooser::Uniform(records),
        }
    }

    /// A record among the first `present` (the records loaded plus the
    /// inserts acknowledged so far).
    pub fn next(&mut self, rng: &mut impl Rng, present: u64) -> u64 {
        match self {
            // As YCSB: the zipfian key chooser covers the loaded records.
            Chooser::Zipfian(z) => z.next(rng),
            Chooser::Latest(l) => l.next(rng, present),
            Chooser::Uniform(n) => rng.gen_range(0..*n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn the_mixes_are_ycsbs() {
        let mut r = StdRng::seed_from_u64(9);
        for (name, read) in [('a', 50), ('b', 95), ('c', 100), ('d', 95), ('f', 50)] {
            let w = Workload::get(name).unwrap();
            assert_eq!(w.read + w.update + w.insert + w.rmw, 100);
            let reads = (0..100_000).filter(|_| w.op(&mut r) == Op::Read).count();
            assert!(
                (reads as f64 / 1000.0 - read as f64).abs() < 1.0,
                "{name}: {reads}"
            );
        }
        assert!(Workload::get('e').is_err());
        assert!(Workload::get('x').is_err());
    }
}
