//! Loading the sector map at open from the checkpoint the superblock
//! names, with the segments' usage.
//!
//! A chain (format 2 and later) is read piece by piece in windows of
//! [`WINDOW`] bytes, never whole (`PieceDecoder` checks each piece as its
//! bytes come, its CRC at the end); each run is applied as it comes and
//! indexed for paging (`chain_index`). The map pages out to the chain as it
//! loads: beyond the cache, chunks the piece being read has passed by (its
//! runs come in LBA order, so it will not touch them again) go, and a delta
//! that reaches a paged-out chunk pages it back in. So RAM while a volume
//! opens is its map cache and a window, whatever the size of the map.
//! Usage is kept in step run by run: a delta's run takes off what it
//! replaces, so nothing walks the whole map again.
//!
//! A format 1 stream is read whole and keeps the map in memory until the
//! first checkpoint writes a base (format 1 is read, no longer written).

use crate::chain_index::{ChainIndex, IndexBuilder};
use crate::error::{EngineError, Internal, Result};
use crate::map::paging::Paged;
use crate::map::SectorMap;
use crate::meta::pager::Pager;
use crate::space::Usage;
use crate::state::log_state::{max_segments, segment_of};
use crate::state::map_state::{account_run, MapState};
use crate::storage::Storage;
use squeeze_format::checkpoint::decode::ChainOrder;
use squeeze_format::checkpoint::MapRun;
use squeeze_format::checkpoint_v1::CheckpointReader;
use squeeze_format::{
    checksum, FormatError, MapEntry, PieceDecoder, PieceKind, SegmentNote, Superblock,
    CHUNK_ENTRIES, DATA_START, SHARED_BASE,
};

/// Bytes of the chain read at a time.
const WINDOW: u64 = 1 << 20;
/// Runs applied between two looks at the map's size.
const RUNS_BETWEEN_TRIMS: usize = 1024;

/// Bytes of a chain's base and deltas; format 1's single stream counts as
/// a base that cannot take deltas.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChainShape {
    pub base_bytes: u64,
    pub delta_bytes: u64,
    pub deltas: u64,
    pub takes_deltas: bool,
}

/// What a checkpoint holds besides the map.
pub(super) struct CheckpointPosition {
    pub generation: u64,
    pub next_seq: u64,
    pub head_offset: u64,
    pub counters: Vec<u64>,
    /// Segments' below-target notes (none before format 3).
    pub notes: Vec<SegmentNote>,
}

/// The map and usage loaded, and where the checkpoint left the log.
pub(super) struct Loaded {
    pub state: MapState,
    pub position: CheckpointPosition,
    pub shape: ChainShape,
    /// Most RAM the map used while it loaded.
    pub peak_bytes: u64,
    /// The end of the furthest record any run of the checkpoint names (a
    /// run a later piece replaced included: the file never shrinks, so it
    /// was at least this long once, and is unless it was cut).
    pub max_record_end: u64,
}

pub(super) fn bad_checkpoint(why: String) -> EngineError {
    EngineError::Metadata(FormatError::Invalid {
        what: "checkpoint",
        why,
    })
}

/// Loads the map the checkpoint of `sb` holds, paging it out beyond the
/// cache of `pager` (format 2 and later).
pub(super) fn load(storage: &dyn Storage, sb: &Superblock, pager: &mut Pager) -> Result<Loaded> {
    let seg = u64::from(sb.segment_size);
    if sb.checkpoint.len > seg * sb.checkpoint.segments.len() as u64 {
        return Err(EngineError::Metadata(FormatError::Invalid {
            what: "superblock",
            why: "checkpoint longer than its segments".into(),
        }));
    }
    let mut state = MapState {
        map: SectorMap::new(),
        usage: Usage::default(),
        shared: Default::default(),
        chain: None,
    };
    let (position, shape, peak_bytes, max_record_end) = if sb.version == 1 {
        let stream = read_v1(storage, sb)?;
        let (position, max_end) = load_v1(&stream, sb, &mut state)?;
        let shape = ChainShape {
            base_bytes: stream.len() as u64,
            ..ChainShape::default()
        };
        let peak = state.map.memory_bytes();
        (position, shape, peak, max_end)
    } else {
        state.chain = Some(ChainIndex {
            segments: sb.checkpoint.segments.clone(),
            pieces: Vec::new(),
        });
        load_chain(sb, &mut state, pager)?
    };
    // Nothing is mapped past the volume's end but hidden addresses.
    pager.below = u64::MAX;
    let past = pager.with_map_mut(&mut state, |st| {
        st.map.next_mapped(sb.sectors(), SHARED_BASE)
    })?;
    if let Some(lba) = past {
        return Err(bad_checkpoint(format!(
            "sector {lba} mapped beyond the volume's {} sectors",
            sb.sectors()
        )));
    }
    Ok(Loaded {
        state,
        position,
        shape,
        peak_bytes,
        max_record_end,
    })
}

/// Loads a chain: the base, then each delta in order, every piece checked
/// by its own CRC, the last one also against the superblock.
fn load_chain(
    sb: &Superblock,
    st: &mut MapState,
    pager: &mut Pager,
) -> Result<(CheckpointPosition, ChainShape, u64, u64)> {
    let seg_size = u64::from(sb.segment_size);
    let max_segs = max_segments(sb);
    let len = sb.checkpoint.len;
    let segments = &sb.checkpoint.segments;
    let mut shape = ChainShape {
        takes_deltas: true,
        ..ChainShape::default()
    };
    let mut order = ChainOrder::default();
    let mut last = None;
    let mut at = 0u64;
    let mut buf = Vec::new();
    let mut runs: Vec<MapRun> = Vec::new();
    let mut peak = 0u64;
    let mut max_end = 0u64;
    // Trim again only once the map grew past where the last trim left it
    // (chunks that cannot page out are not looked at over and over).
    let slack = (pager.cache / 16).max(16 << 10);
    let mut trim_above = pager.cache;
    while at < len {
        let start = at;
        let k = u16::try_from(st.chain.as_ref().map_or(0, |c| c.pieces.len()))
            .map_err(|_| bad_checkpoint("more than 65535 pieces".into()))?;
        let mut dec = PieceDecoder::new(sb.uuid);
        let mut index = IndexBuilder::new(0);
        let mut kind = None;
        let mut covered = Covered::default();
        loop {
            let want = dec.remaining().min(WINDOW).min(len - at);
            if want == 0 {
                break;
            }
            buf.resize(want as usize, 0);
            pager.src.read(segments, at, &mut buf)?;
            runs.clear();
            dec.feed(&buf, |r| runs.push(r))
                .map_err(EngineError::Metadata)?;
            at += want;
            if kind.is_none() {
                if let Some(h) = dec.head() {
                    order
                        .next(&h.header, start)
                        .map_err(EngineError::Metadata)?;
                    kind = Some(h.header.kind);
                }
            }
            for batch in runs.chunks(RUNS_BETWEEN_TRIMS) {
                for &r in batch {
                    check_run(&r, seg_size, max_segs)?;
                    if r.first.is_direct() {
                        max_end = max_end.max(r.first.record_offset() + r.first.record_len());
                    }
                    index.push(&r);
                    match kind {
                        Some(PieceKind::Base) => {
                            // Chunks before this run's are behind the piece.
                            pager.below = r.lba / CHUNK_ENTRIES as u64;
                            load_base_run(st, r, seg_size);
                        }
                        _ => apply_delta_run(st, pager, r, k, seg_size, &mut covered)?,
                    }
                }
                let now = st.map.memory_bytes();
                peak = peak.max(now);
                if now > trim_above {
                    pager.page_out(st);
                    trim_above = st.map.memory_bytes().max(pager.cache) + slack;
                }
            }
        }
        let head = dec.finish().map_err(EngineError::Metadata)?;
        let mut pi = index.finish();
        pi.runs_at = start + head.runs_offset() as u64;
        st.chain.as_mut().expect("a chain loads").pieces.push(pi);
        // The whole piece is indexed: anything it holds may page out.
        pager.below = u64::MAX;
        match head.header.kind {
            PieceKind::Base => shape.base_bytes = head.len,
            PieceKind::Delta => {
                shape.delta_bytes += head.len;
                shape.deltas += 1;
            }
        }
        last = Some((
            head.crc,
            CheckpointPosition {
                generation: head.header.generation,
                next_seq: head.header.next_seq,
                head_offset: head.header.head_offset,
                counters: head.counters,
                notes: head.notes,
            },
        ));
    }
    let Some((crc, position)) = last else {
        return Err(bad_checkpoint("the chain holds no piece".into()));
    };
    if crc != sb.checkpoint.crc {
        return Err(EngineError::Metadata(FormatError::ChecksumMismatch {
            what: "checkpoint chain's last piece",
            expected: sb.checkpoint.crc,
            got: crc,
        }));
    }
    Ok((position, shape, peak, max_end))
}

/// A run of the base: added to the map (runs come in LBA order) and to
/// its segment's usage.
fn load_base_run(st: &mut MapState, r: MapRun, seg_size: u64) {
    st.map.load_run(r);
    // A run is consecutive sectors of one extent (one record, one segment)
    // or of consecutive hidden addresses.
    account_run(&mut st.usage, &mut st.shared, seg_size, &r, true);
}

/// Sectors of one chunk the runs of the piece being loaded have covered so
/// far (its runs come in LBA order and do not overlap).
#[derive(Default)]
struct Covered {
    chunk: u64,
    sectors: u64,
}

impl Covered {
    /// Adds `n` sectors of chunk `c`; true once they cover it whole.
    fn add(&mut self, c: u64, n: u64) -> bool {
        if c != self.chunk {
            *self = Covered {
                chunk: c,
                sectors: 0,
            };
        }
        self.sectors += n;
        self.sectors == CHUNK_ENTRIES as u64
    }
}

/// A run of delta piece `k`, chunk by chunk (an unmapping run may cover
/// terabytes): each chunk it touches is paged in if it was out, loses the
/// usage of what the run replaces, and takes the run's part. A chunk the
/// piece covers whole is in that piece alone (so a chain of many deltas
/// does not leave it untracked: it can still page out).
fn apply_delta_run(
    st: &mut MapState,
    pager: &mut Pager,
    r: MapRun,
    k: u16,
    seg_size: u64,
    covered: &mut Covered,
) -> Result<()> {
    let mut c = r.lba / CHUNK_ENTRIES as u64;
    loop {
        // An unmapping run skips the chunks that map nothing.
        if !r.first.is_mapped() {
            match st.map.next_chunk(c) {
                Some(n) => c = n,
                None => return Ok(()),
            }
        }
        let lo = r.lba.max(c * CHUNK_ENTRIES as u64);
        let hi = r.end().min((c + 1) * CHUNK_ENTRIES as u64);
        if lo >= hi {
            return Ok(());
        }
        let part = MapRun {
            lba: lo,
            sectors: (hi - lo) as u32,
            first: r.entry((lo - r.lba) as u32),
        };
        // Chunks before this one are behind the piece.
        pager.below = c;
        pager.with_map_mut(st, |st| apply_in_chunk(st, part, k, seg_size))?;
        if covered.add(c, hi - lo) {
            st.map.loaded_whole(c, k);
        }
        c += 1;
    }
}

/// The part of a delta's run inside one chunk; refused before anything
/// changes when the chunk is paged out.
fn apply_in_chunk(st: &mut MapState, r: MapRun, k: u16, seg_size: u64) -> Result<(), Paged> {
    let MapState {
        map, usage, shared, ..
    } = st;
    map.runs_in(r.lba, r.end(), |old| {
        account_run(usage, shared, seg_size, &old, false);
    })?;
    map.apply_run(r, Some(k));
    account_run(usage, shared, seg_size, &r, true);
    Ok(())
}

/// Reads a format 1 stream whole and checks its CRC.
fn read_v1(storage: &dyn Storage, sb: &Superblock) -> Result<Vec<u8>> {
    let seg = u64::from(sb.segment_size);
    let mut stream = vec![0u8; sb.checkpoint.len as usize];
    for (k, s) in sb.checkpoint.segments.iter().enumerate() {
        let from = k * seg as usize;
        if from >= stream.len() {
            break;
        }
        let to = (from + seg as usize).min(stream.len());
        storage.read_at(&mut stream[from..to], sb.segment_offset(*s))?;
    }
    let got = checksum::crc32c(&stream);
    if got != sb.checkpoint.crc {
        return Err(EngineError::Metadata(FormatError::ChecksumMismatch {
            what: "checkpoint",
            expected: sb.checkpoint.crc,
            got,
        }));
    }
    Ok(stream)
}

/// Loads the map from a format 1 stream (dense chunks), then the usage;
/// also the end of the furthest record it names.
fn load_v1(stream: &[u8], sb: &Superblock, st: &mut MapState) -> Result<(CheckpointPosition, u64)> {
    let max_segs = max_segments(sb);
    let seg_size = u64::from(sb.segment_size);
    let ck = CheckpointReader::decode(stream, &sb.uuid).map_err(EngineError::Metadata)?;
    for chunk in ck.chunks() {
        let (index, entries) = chunk.map_err(EngineError::Metadata)?;
        for e in entries.iter().filter(|e| e.is_mapped()) {
            check_entry(*e, seg_size, max_segs)?;
        }
        if (index + 1) * CHUNK_ENTRIES as u64 > sb.sectors() + CHUNK_ENTRIES as u64 {
            return Err(bad_checkpoint(format!(
                "map chunk {index} beyond the volume"
            )));
        }
        st.map.load_chunk(index, entries);
    }
    let MapState {
        map, usage, shared, ..
    } = st;
    let mut max_end = 0u64;
    map.for_each_run(
        |c, _| Err(EngineError::Internal(Internal::PagedAtOpen { chunk: c })),
        |r| {
            account_run(usage, shared, seg_size, &r, true);
            max_end = max_end.max(r.first.record_offset() + r.first.record_len());
        },
    )?;
    let position = CheckpointPosition {
        generation: ck.header.generation,
        next_seq: ck.header.next_seq,
        head_offset: ck.header.head_offset,
        counters: ck.counters,
        notes: Vec::new(),
    };
    Ok((position, max_end))
}

/// A map entry points into the segments of the volume.
fn check_entry(e: MapEntry, seg_size: u64, max_segs: u32) -> Result<()> {
    if e.record_offset() < DATA_START
        || segment_of(e.record_offset(), seg_size) >= max_segs
        || e.record_len() == 0
    {
        return Err(bad_checkpoint(format!(
            "map entry {:#x} out of bounds",
            e.0
        )));
    }
    Ok(())
}

/// A run points into the volume's segments. Whether it lies inside the
/// volume is checked on the whole map once the chain is applied (`load`):
/// after a shrink (`Volume::resize`), runs of the chain from before it may
/// lie past the new end, unmapped by a later piece.
fn check_run(r: &MapRun, seg_size: u64, max_segs: u32) -> Result<()> {
    if r.first.is_direct() {
        check_entry(r.first, seg_size, max_segs)?;
    }
    Ok(())
}
