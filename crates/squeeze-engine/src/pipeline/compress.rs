//! Stage 3: run the blobs the policy lets through the compression engine as
//! one batch (so a CPU pool works on them in parallel, and an offload engine
//! gets them together), and decide per blob what gets stored.

use super::policy::{output_limit, plan, ActivePolicy, Hint, Plan};
use super::split::Piece;
use squeeze_codec::{Algorithm, CompressEngine, Job, JobOutput, JobResult};
use squeeze_format::{CodecId, SECTOR_SIZE};
use std::sync::Arc;

/// How a blob ended up stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The policy stored it raw without trying (mode none, below min_blob).
    NotTried,
    /// Stored compressed.
    Compressed,
    /// Compressed above the required ratio: stored raw.
    Rejected,
    /// The heuristic judged it hopeless: stored raw, no codec time spent.
    Skipped,
    /// The ladder's raw rung (the cores saturated, room to hold it,
    /// `pipeline::burst`): stored raw, for the idle upgrade to compress.
    Deferred,
}

#[derive(Debug)]
pub enum Payload {
    /// Bytes `start..start+len` of the input buffer, uncompressed; behind
    /// a chunk table when `chunks` says so (format 5: `Chunks::sectors`
    /// per chunk, each checked on its own).
    Raw {
        start: usize,
        chunks: Option<Chunks>,
    },
    Compressed {
        codec: CodecId,
        /// The whole payload (a chunked one starts with its table).
        data: Vec<u8>,
        /// The record's payload CRC if the engine computed it with the
        /// output (always, for a chunked payload: its table's).
        crc: Option<u32>,
        /// 0: one frame; else the sectors of each chunk.
        chunk_sectors: u32,
        /// A block payload (format 6, `squeeze_format::zstd_block`).
        block: bool,
    },
}

/// The chunk table of a raw payload and its CRC-32C (the record's payload
/// CRC).
#[derive(Debug)]
pub struct Chunks {
    pub sectors: u32,
    pub table: Vec<u8>,
    pub crc: u32,
}

/// An item's payload as its record carries it: `table` (empty unless
/// chunked) then `body`.
#[derive(Clone, Copy, Debug)]
pub struct Stored<'a> {
    pub codec: CodecId,
    /// 0: one frame; else the sectors of each chunk.
    pub chunk_sectors: u32,
    /// A block payload (format 6, `squeeze_format::zstd_block`).
    pub block: bool,
    pub table: &'a [u8],
    pub body: &'a [u8],
}

impl Stored<'_> {
    /// Bytes of the payload.
    pub fn len(&self) -> usize {
        self.table.len() + self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One piece of the write, ready to append.
#[derive(Debug)]
pub enum Item {
    Zero {
        lba: u64,
        sectors: u64,
    },
    Blob {
        lba: u64,
        sectors: u32,
        payload: Payload,
        outcome: Outcome,
        /// Written with a faster rung than the policy's target (the
        /// adaptive codec under load): the upgrade rewrites it when idle.
        below_target: bool,
    },
    /// The cleaner's copy of (part of) the extent record at byte `from`.
    Moved {
        lba: u64,
        sectors: u32,
        codec: CodecId,
        /// The whole payload (a chunked one starts with its table).
        payload: Vec<u8>,
        /// 0: one frame; else the sectors of each chunk.
        chunk_sectors: u32,
        /// A block payload (format 6, `squeeze_format::zstd_block`).
        block: bool,
        /// The payload's CRC when known (the moved record's, checked; a
        /// chunked payload's table CRC).
        crc: Option<u32>,
        from: u64,
        recompressed: bool,
        /// Copied as it was from a segment that holds bytes written below
        /// the target: the upgrade may still have to rewrite it.
        below_target: bool,
        /// Compressed, and not with the policy's idle level (or copied as
        /// it was from a segment with such bytes): the idle squeeze
        /// (`space::squeeze`) may still rewrite it.
        unsqueezed: bool,
    },
    /// Deduplication: client sectors `lba..lba + sectors` share hidden
    /// addresses from `target` (a Link record, no payload).
    Link {
        lba: u64,
        sectors: u32,
        target: u64,
    },
}

impl Item {
    /// The payload its record carries (empty for a zero item).
    pub fn payload<'a>(&'a self, buf: &'a [u8]) -> Stored<'a> {
        let whole = |codec, chunk_sectors, block, body| Stored {
            codec,
            chunk_sectors,
            block,
            table: &[],
            body,
        };
        match self {
            Item::Blob {
                sectors,
                payload: Payload::Raw { start, chunks },
                ..
            } => Stored {
                codec: CodecId::None,
                chunk_sectors: chunks.as_ref().map_or(0, |c| c.sectors),
                block: false,
                table: chunks.as_ref().map_or(&[][..], |c| &c.table),
                body: &buf[*start..*start + *sectors as usize * SECTOR_SIZE],
            },
            Item::Blob {
                payload:
                    Payload::Compressed {
                        codec,
                        data,
                        chunk_sectors,
                        block,
                        ..
                    },
                ..
            } => whole(*codec, *chunk_sectors, *block, data),
            Item::Moved {
                codec,
                payload,
                chunk_sectors,
                block,
                ..
            } => whole(*codec, *chunk_sectors, *block, payload),
            Item::Zero { .. } | Item::Link { .. } => whole(CodecId::None, 0, false, &[]),
        }
    }

    /// The record's payload CRC, if it is already known (always for a
    /// chunked payload: its table's).
    pub fn known_crc(&self) -> Option<u32> {
        match self {
            Item::Blob {
                payload: Payload::Compressed { crc, .. },
                ..
            } => *crc,
            Item::Blob {
                payload: Payload::Raw { chunks, .. },
                ..
            } => chunks.as_ref().map(|c| c.crc),
            Item::Moved { crc, .. } => *crc,
            Item::Zero { .. } | Item::Link { .. } => None,
        }
    }
}

/// Encodes the pieces of `buf` with `alg`: the policy's target, or for
/// client writes under load a rung of the ladder under it
/// ([`ActivePolicy::write_algorithm`]); `blocks`: small zstd frames may
/// become block payloads (the volume is in format 6). Returns the items and
/// the CPU nanoseconds the codec spent.
///
/// The engine's jobs need an owned input: `shared`, when given, is a buffer
/// that `buf` is the bytes `base..base + buf.len()` of, handed to the jobs
/// without a copy; otherwise `buf` is copied once for all the jobs.
///
/// A single blob (a small write) is compressed by `compress_batch`, which
/// for the CPU pool runs it on this thread: no handoff. A batch of several
/// goes wholly to the engine and this thread only waits: a job run on the
/// writer cost more than on a worker, since the writer's own work between
/// jobs (splitting, copying records into the log, the map) evicts its
/// codec's tables from the core's cache. Measured with perf over
/// `squeeze bench` passes (docs/benchmarks-history.md, session 5): the engine's
/// codec time fell from 1.04 to 0.90-0.98 of the raw codec's on the same
/// blobs, and the engine's whole CPU per GiB from 1.18-1.19 to 1.04-1.16
/// times raw's (four runs against two).
pub fn encode(
    engine: &dyn CompressEngine,
    policy: &ActivePolicy,
    (alg, blocks): (Algorithm, bool),
    hint: Hint,
    buf: &[u8],
    shared: Option<(&Arc<Vec<u8>>, usize)>,
    pieces: &[Piece],
) -> (Vec<Item>, u64) {
    let below_target = alg != policy.algorithm;
    let chunk_sectors = policy.policy.read_chunk_sectors();
    let (mut items, jobs, job_items) = prepare(policy, hint, buf, shared, pieces, blocks);
    let (mut items, cpu_ns) = if alg.codec == CodecId::None {
        // The bottom rung: what the target would have compressed goes raw.
        for &i in &job_items {
            if let Item::Blob {
                below_target: b,
                outcome,
                ..
            } = &mut items[i]
            {
                *b = below_target;
                if below_target {
                    *outcome = Outcome::Deferred;
                }
            }
        }
        (items, 0)
    } else {
        let results = match jobs.len() {
            0 => Vec::new(),
            1 => engine.compress_batch(alg, jobs),
            _ => engine.submit_and_wait(alg, jobs),
        };
        collect(
            items,
            &job_items,
            results,
            alg.codec,
            chunk_sectors,
            below_target,
        )
    };
    chunk_raw_blobs(&mut items, buf, chunk_sectors);
    (items, cpu_ns)
}

/// Gives every raw blob of more than `chunk_sectors` sectors its chunk
/// table (none when `chunk_sectors` is 0), so its small reads check one
/// chunk, as a compressed blob's do.
fn chunk_raw_blobs(items: &mut [Item], buf: &[u8], chunk_sectors: u32) {
    if chunk_sectors == 0 {
        return;
    }
    for it in items {
        if let Item::Blob {
            sectors,
            payload: Payload::Raw { start, chunks },
            ..
        } = it
        {
            if *sectors > chunk_sectors {
                let raw = &buf[*start..*start + *sectors as usize * SECTOR_SIZE];
                let (table, crc) = squeeze_format::chunks::raw_table(raw, chunk_sectors);
                *chunks = Some(Chunks {
                    sectors: chunk_sectors,
                    table,
                    crc,
                });
            }
        }
    }
}

/// The items of `pieces` (blobs as Raw for now), the jobs for the blobs the
/// policy sends to the codec, and which item each job is for.
fn prepare(
    policy: &ActivePolicy,
    hint: Hint,
    buf: &[u8],
    shared: Option<(&Arc<Vec<u8>>, usize)>,
    pieces: &[Piece],
    blocks: bool,
) -> (Vec<Item>, Vec<Job>, Vec<usize>) {
    debug_assert!(shared.is_none_or(|(a, base)| a.get(base..base + buf.len()) == Some(buf)));
    let mut items = Vec::with_capacity(pieces.len());
    let mut jobs = Vec::new();
    let mut job_items = Vec::new();
    let mut input: Option<(Arc<Vec<u8>>, usize)> = None;
    for p in pieces {
        match *p {
            Piece::Zero { lba, sectors } => items.push(Item::Zero { lba, sectors }),
            Piece::Data {
                lba,
                sectors,
                start,
            } => {
                let len = sectors as usize * SECTOR_SIZE;
                let chunk = policy.policy.read_chunk as usize;
                let pl = plan(policy, hint, len);
                if let Plan::Compress { heuristic } = pl {
                    let (input, base) = input
                        .get_or_insert_with(|| match shared {
                            Some((a, base)) => (Arc::clone(a), base),
                            None => (Arc::new(buf.to_vec()), 0),
                        })
                        .clone();
                    jobs.push(Job {
                        input,
                        range: base + start..base + start + len,
                        limit: output_limit(&policy.policy, len),
                        skip_if_incompressible: heuristic,
                        // The record's payload checksum, taken where the
                        // output is still in cache.
                        checksum: true,
                        // Blobs of more than one chunk are chunked.
                        chunk_bytes: if len > chunk { chunk } else { 0 },
                        block: blocks,
                    });
                    job_items.push(items.len());
                }
                items.push(Item::Blob {
                    lba,
                    sectors,
                    payload: Payload::Raw {
                        start,
                        chunks: None,
                    },
                    outcome: Outcome::NotTried,
                    below_target: false,
                });
            }
        }
    }
    (items, jobs, job_items)
}

/// Puts the engine's results into the items; returns them and the codec's
/// CPU nanoseconds.
fn collect(
    mut items: Vec<Item>,
    job_items: &[usize],
    results: Vec<JobResult>,
    codec: CodecId,
    chunk_sectors: u32,
    below_target: bool,
) -> (Vec<Item>, u64) {
    let mut cpu_ns = 0;
    for (r, &i) in results.into_iter().zip(job_items) {
        cpu_ns += r.cpu_ns;
        let Item::Blob {
            sectors,
            payload,
            outcome,
            below_target: b,
            ..
        } = &mut items[i]
        else {
            unreachable!("job for a zero piece");
        };
        // A blob the heuristic skipped would be raw with the target too.
        *b = below_target && !matches!(r.output, JobOutput::Skipped);
        match r.output {
            JobOutput::Compressed(data) => {
                *payload = Payload::Compressed {
                    codec,
                    data,
                    crc: r.output_crc32c,
                    chunk_sectors: if chunk_sectors != 0 && *sectors > chunk_sectors {
                        chunk_sectors
                    } else {
                        0
                    },
                    block: r.block,
                };
                *outcome = Outcome::Compressed;
            }
            JobOutput::TooBig => *outcome = Outcome::Rejected,
            JobOutput::Skipped => *outcome = Outcome::Skipped,
        }
    }
    (items, cpu_ns)
}
