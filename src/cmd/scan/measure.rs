//! Running every codec configuration over the sampled pieces: compressed
//! bytes and single-core CPU time, per data type, codec and blob size.
//!
//! A blob is stored compressed when the codec's output fits in the blob's
//! own length (`compress(blob, dst, blob.len())` returns `Some(n)`), else
//! raw: the ratio is `raw bytes / stored bytes` over all blobs, exactly
//! what a caller gets by running the codec on the same blobs. Blobs are cut
//! from each piece from its start (`piece.chunks(blob_size)`).
//!
//! Speeds are per core: each (type, codec, blob size) task runs on one
//! thread and is timed with that thread's CPU clock around the whole batch
//! (one clock read per batch, not per blob), so other load on the machine
//! and the number of worker threads do not change them. Every compressed
//! blob is decompressed (timed) and compared with its source (untimed).

use super::detect::DataType;
use anyhow::{bail, Result};
use squeeze_codec::{looks_incompressible, new_compressor, thread_cpu_ns, Algorithm, CodecId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

pub const BLOB_SIZES: [usize; 4] = [4 << 10, 16 << 10, 64 << 10, 128 << 10];

/// One configuration `scan` measures: an algorithm, and for deflate
/// whether ISA-L (the engine volumes use for deflate:1..=3 when present)
/// or libdeflate runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub alg: Algorithm,
    pub isal: bool,
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.alg)?;
        if self.isal {
            f.write_str(" (isa-l)")?;
        }
        Ok(())
    }
}

/// The configurations `scan` measures, in report order (deflate:1 and 3
/// also on ISA-L when the build has it, beside libdeflate).
pub fn algorithms() -> Vec<Config> {
    let lib = |alg| Config { alg, isal: false };
    let mut v = vec![
        lib(Algorithm::new(CodecId::Lz4, 0)),
        lib(Algorithm::new(CodecId::Zstd, 1)),
        lib(Algorithm::new(CodecId::Zstd, 3)),
        lib(Algorithm::new(CodecId::Zstd, 9)),
        lib(Algorithm::new(CodecId::Snappy, 0)),
        lib(Algorithm::new(CodecId::Deflate, 1)),
        lib(Algorithm::new(CodecId::Deflate, 6)),
    ];
    if squeeze_codec::isal::available() {
        for level in [1, 3] {
            v.push(Config {
                alg: Algorithm::new(CodecId::Deflate, level),
                isal: true,
            });
        }
    }
    v
}

/// Sums for one (type, codec, blob size).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cell {
    pub raw: u64,
    pub stored: u64,
    pub blobs: u64,
    pub blobs_compressed: u64,
    /// Raw bytes of the blobs stored compressed (what decompression makes).
    pub raw_decompressed: u64,
    pub compress_ns: u64,
    pub decompress_ns: u64,
}

impl Cell {
    fn add(&mut self, o: &Cell) {
        self.raw += o.raw;
        self.stored += o.stored;
        self.blobs += o.blobs;
        self.blobs_compressed += o.blobs_compressed;
        self.raw_decompressed += o.raw_decompressed;
        self.compress_ns += o.compress_ns;
        self.decompress_ns += o.decompress_ns;
    }
}

/// Everything measured for one data type.
#[derive(Debug, Default)]
pub struct Group {
    pub bytes: u64,
    pub pieces: u64,
    pub formats: BTreeMap<&'static str, u64>,
    /// Per blob size: (blobs, blobs the incompressibility heuristic flags).
    pub heuristic: [(u64, u64); BLOB_SIZES.len()],
    /// `cells[alg][size]`.
    pub cells: Vec<[Cell; BLOB_SIZES.len()]>,
}

impl Group {
    fn new(n_algs: usize) -> Self {
        Group {
            cells: vec![[Cell::default(); BLOB_SIZES.len()]; n_algs],
            ..Default::default()
        }
    }
}

/// Accumulates pieces and measures them a batch at a time.
pub struct Measurer {
    algs: Vec<Config>,
    threads: usize,
    batch: Vec<(DataType, &'static str, Vec<u8>)>,
    batch_bytes: usize,
    pub groups: BTreeMap<DataType, Group>,
}

const BATCH_BYTES: usize = 8 << 20;

impl Measurer {
    pub fn new(threads: usize) -> Self {
        Measurer {
            algs: algorithms(),
            threads: threads.max(1),
            batch: Vec::new(),
            batch_bytes: 0,
            groups: BTreeMap::new(),
        }
    }

    pub fn algs(&self) -> &[Config] {
        &self.algs
    }

    /// Adds one piece of type `kind`; measures when a batch is full.
    pub fn add(&mut self, kind: DataType, format: &'static str, piece: Vec<u8>) -> Result<()> {
        self.batch_bytes += piece.len();
        self.batch.push((kind, format, piece));
        if self.batch_bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Measures the pending pieces.
    pub fn flush(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        let mut by_type: BTreeMap<DataType, Vec<&[u8]>> = BTreeMap::new();
        for (kind, format, piece) in &batch {
            let g = self
                .groups
                .entry(*kind)
                .or_insert_with(|| Group::new(self.algs.len()));
            g.bytes += piece.len() as u64;
            g.pieces += 1;
            *g.formats.entry(format).or_default() += 1;
            for (s, &bs) in BLOB_SIZES.iter().enumerate() {
                for blob in piece.chunks(bs) {
                    g.heuristic[s].0 += 1;
                    g.heuristic[s].1 += u64::from(looks_incompressible(blob));
                }
            }
            by_type.entry(*kind).or_default().push(piece);
        }
        let tasks: Vec<(DataType, usize, usize)> = by_type
            .keys()
            .flat_map(|&t| {
                (0..self.algs.len())
                    .flat_map(move |a| (0..BLOB_SIZES.len()).map(move |s| (t, a, s)))
            })
            .collect();
        let next = AtomicUsize::new(0);
        let algs = &self.algs;
        let results: Vec<Result<Vec<(usize, Cell)>>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..self.threads.min(tasks.len()))
                .map(|_| {
                    sc.spawn(|| -> Result<Vec<(usize, Cell)>> {
                        let mut done = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(&(t, a, s)) = tasks.get(i) else {
                                return Ok(done);
                            };
                            done.push((i, measure(algs[a], BLOB_SIZES[s], &by_type[&t])?));
                        }
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("scan worker panicked"))
                .collect()
        });
        for r in results {
            for (i, cell) in r? {
                let (t, a, s) = tasks[i];
                self.groups.get_mut(&t).expect("group").cells[a][s].add(&cell);
            }
        }
        Ok(())
    }
}

/// Compresses every blob of `pieces` with `cfg` on this thread, then
/// decompresses the compressed ones (libdeflate for both deflate
/// configurations); checks the round trip.
pub fn measure(cfg: Config, blob_size: usize, pieces: &[&[u8]]) -> Result<Cell> {
    let alg = cfg.alg;
    let blobs: Vec<&[u8]> = pieces.iter().flat_map(|p| p.chunks(blob_size)).collect();
    let mut outs: Vec<Vec<u8>> = blobs.iter().map(|b| Vec::with_capacity(b.len())).collect();
    let mut sizes: Vec<Option<usize>> = vec![None; blobs.len()];
    let mut comp = if cfg.isal {
        squeeze_codec::isal::try_new_compressor(alg)?
    } else {
        new_compressor(alg)
    };
    let t0 = thread_cpu_ns();
    for ((blob, out), size) in blobs.iter().zip(outs.iter_mut()).zip(sizes.iter_mut()) {
        *size = comp.compress(blob, out, blob.len())?;
    }
    let compress_ns = thread_cpu_ns().saturating_sub(t0);
    let mut cell = Cell {
        compress_ns,
        ..Default::default()
    };
    let mut scratch = vec![0u8; blob_size];
    let t1 = thread_cpu_ns();
    for ((blob, out), size) in blobs.iter().zip(&outs).zip(&sizes) {
        if size.is_some() {
            squeeze_codec::decompress(alg.codec, out, &mut scratch[..blob.len()])?;
        }
    }
    cell.decompress_ns = thread_cpu_ns().saturating_sub(t1);
    for ((blob, out), size) in blobs.iter().zip(&outs).zip(&sizes) {
        cell.raw += blob.len() as u64;
        cell.blobs += 1;
        match size {
            Some(n) => {
                cell.stored += *n as u64;
                cell.blobs_compressed += 1;
                cell.raw_decompressed += blob.len() as u64;
                squeeze_codec::decompress(alg.codec, out, &mut scratch[..blob.len()])?;
                if scratch[..blob.len()] != **blob {
                    bail!("{cfg} round trip changed a {blob_size}-byte blob");
                }
            }
            None => cell.stored += blob.len() as u64,
        }
    }
    Ok(cell)
}
