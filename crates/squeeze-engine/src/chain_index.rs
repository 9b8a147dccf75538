//! Where the runs of the checkpoint chain lie, so that the map can page a
//! chunk out and read it back (`meta::pager`) without reading whole pieces.
//!
//! Each piece's runs are sorted by LBA; the index keeps, for every group
//! of [`GROUP_RUNS`] consecutive runs, the LBA of its first run and the
//! CRC-32C of its encoded bytes (the piece's own CRC covers the whole
//! piece, which a partial read cannot check). 16 bytes per 256 runs: about
//! 0.06 bytes of RAM per run of the chain.
//!
//! The index is built as a piece is written or read (`IndexBuilder`, fed
//! the runs the writer encodes or recovery decodes, `meta::load`), and
//! describes the chain the superblock names; pieces are numbered from 0
//! (the base) in chain order, as the map's chunks record them.

use crate::space::SegmentId;
use squeeze_format::checkpoint::{decode_run, encode_run, MapRun, RUN_BYTES};
use squeeze_format::checksum;
use std::ops::Range;

/// Runs per indexed group: a chunk read back reads at least one group per
/// piece it is in (5 KiB). 256 rather than 128 since session 29: at 128
/// the index of squeeze-kv's 5 M-record store held 0.4 MB (heaptrack);
/// at 512, with a 600 KiB map cache at 1 M records, workload A ran at
/// 45-46 k ops/s against 128's 48-50 k (faults read and check more).
pub const GROUP_RUNS: usize = 256;

/// One piece's runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PieceIndex {
    /// Chain byte offset of the piece's first run.
    pub runs_at: u64,
    pub runs: u64,
    /// First LBA and CRC-32C of each group of runs.
    groups: Vec<(u64, u32)>,
}

impl PieceIndex {
    /// Indexes encoded runs whose first byte is at chain offset `runs_at`.
    #[cfg(test)]
    pub fn from_bytes(runs_at: u64, bytes: &[u8]) -> PieceIndex {
        let mut b = IndexBuilder::new(runs_at);
        for c in bytes.chunks_exact(RUN_BYTES) {
            b.push(&decode_run(c));
        }
        b.finish()
    }

    /// The groups that may hold runs touching sectors `lo..hi`.
    pub fn groups_touching(&self, lo: u64, hi: u64) -> Range<usize> {
        // The run before the first one at or after `lo` may reach into it.
        let from = self.groups.partition_point(|g| g.0 < lo).saturating_sub(1);
        let to = self.groups.partition_point(|g| g.0 < hi);
        from..to.max(from)
    }

    /// Chain byte range of groups `g`, and their CRCs.
    pub fn span(&self, g: &Range<usize>) -> (u64, usize) {
        let first = g.start as u64 * GROUP_RUNS as u64;
        let end = (g.end as u64 * GROUP_RUNS as u64).min(self.runs);
        (
            self.runs_at + first * RUN_BYTES as u64,
            ((end - first) as usize) * RUN_BYTES,
        )
    }

    /// Checks the bytes of groups `g` (as `span` placed them) against
    /// their CRCs: Err names the first group that does not match.
    pub fn check(&self, g: &Range<usize>, bytes: &[u8]) -> Result<(), usize> {
        for (k, part) in g.clone().zip(bytes.chunks(GROUP_RUNS * RUN_BYTES)) {
            if checksum::crc32c(part) != self.groups[k].1 {
                return Err(k);
            }
        }
        Ok(())
    }

    /// Checks the bytes of groups `g` (as `span` placed them) and returns
    /// their runs, or the group whose CRC does not match.
    #[cfg(test)]
    pub fn decode(&self, g: &Range<usize>, bytes: &[u8]) -> Result<Vec<MapRun>, usize> {
        self.check(g, bytes)?;
        Ok(bytes.chunks_exact(RUN_BYTES).map(decode_run).collect())
    }

    /// Bytes of RAM the index of this piece uses.
    pub fn memory_bytes(&self) -> u64 {
        (self.groups.capacity() * 16) as u64
    }
}

/// Calls `f` with the runs in `bytes` (a piece's runs, checked) that touch
/// sectors `lo..hi`, in LBA order. A piece's runs are sorted and disjoint,
/// so their ends ascend too: the first is found by a binary search, and
/// the runs outside are not decoded (a chunk read back touches about a
/// fifth of the groups it reads).
pub fn runs_touching(bytes: &[u8], lo: u64, hi: u64, mut f: impl FnMut(MapRun)) {
    let n = bytes.len() / RUN_BYTES;
    let at = |k: usize| &bytes[k * RUN_BYTES..(k + 1) * RUN_BYTES];
    let end = |k: usize| {
        let r = decode_run(at(k));
        r.lba.saturating_add(u64::from(r.sectors))
    };
    let (mut a, mut b) = (0, n);
    while a < b {
        let m = (a + b) / 2;
        if end(m) <= lo {
            a = m + 1;
        } else {
            b = m;
        }
    }
    for k in a..n {
        let r = decode_run(at(k));
        if r.lba >= hi {
            break;
        }
        if r.lba.saturating_add(u64::from(r.sectors)) > lo {
            f(r);
        }
    }
}

/// Indexes a piece's runs as they are encoded.
pub struct IndexBuilder {
    index: PieceIndex,
    crc: u32,
}

impl IndexBuilder {
    pub fn new(runs_at: u64) -> IndexBuilder {
        IndexBuilder {
            index: PieceIndex {
                runs_at,
                ..PieceIndex::default()
            },
            crc: 0,
        }
    }

    pub fn push(&mut self, r: &MapRun) {
        let b = encode_run(r);
        let ix = &mut self.index;
        if ix.runs.is_multiple_of(GROUP_RUNS as u64) {
            if let Some(g) = ix.groups.last_mut() {
                g.1 = self.crc;
            }
            ix.groups.push((r.lba, 0));
            self.crc = checksum::crc32c(&b);
        } else {
            self.crc = checksum::crc32c_append(self.crc, &b);
        }
        ix.runs += 1;
    }

    pub fn finish(mut self) -> PieceIndex {
        if let Some(g) = self.index.groups.last_mut() {
            g.1 = self.crc;
        }
        self.index.groups.shrink_to_fit();
        self.index
    }
}

/// The chain the superblock names: its segments and its pieces' indexes.
#[derive(Clone, Debug, Default)]
pub struct ChainIndex {
    pub segments: Vec<SegmentId>,
    pub pieces: Vec<PieceIndex>,
}

impl ChainIndex {
    pub fn memory_bytes(&self) -> u64 {
        self.pieces
            .iter()
            .map(|p| p.memory_bytes() + 48)
            .sum::<u64>()
            + self.segments.capacity() as u64 * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use squeeze_format::MapEntry;

    fn run(lba: u64, sectors: u32) -> MapRun {
        MapRun {
            lba,
            sectors,
            first: MapEntry::new(1 << 20, 0, 32, 32 * 4096 + 64),
        }
    }

    /// Every run touching a range lies in the groups the index names, and
    /// the bytes of those groups decode to those runs.
    #[test]
    fn groups_hold_the_runs_that_touch_a_range() {
        let runs: Vec<MapRun> = (0..1000u64).map(|k| run(k * 40, 32)).collect();
        let bytes: Vec<u8> = runs.iter().flat_map(encode_run).collect();
        let ix = PieceIndex::from_bytes(4096, &bytes);
        let mut b = IndexBuilder::new(4096);
        runs.iter().for_each(|r| b.push(r));
        assert_eq!(b.finish(), ix);
        for (lo, hi) in [
            (0, 1),
            (39, 41),
            (5110, 5130),
            (10_000, 20_000),
            (39_990, 50_000),
        ] {
            let g = ix.groups_touching(lo, hi);
            let (at, len) = ix.span(&g);
            let from = (at - 4096) as usize;
            let got = ix.decode(&g, &bytes[from..from + len]).unwrap();
            let want: Vec<MapRun> = runs
                .iter()
                .filter(|r| r.lba < hi && r.end() > lo)
                .copied()
                .collect();
            for r in &want {
                assert!(got.contains(r), "{lo}..{hi}: {r:?} missing");
            }
        }
        let g = ix.groups_touching(0, 1);
        let (at, len) = ix.span(&g);
        let mut bad = bytes[(at - 4096) as usize..][..len].to_vec();
        bad[7] ^= 1;
        assert_eq!(ix.decode(&g, &bad), Err(0));
        assert!(ix.groups_touching(50_000, 60_000).len() <= 1);
    }
}
