//! Paging the sector map: when the map uses more RAM than its cache
//! (`OpenOptions::map_cache`), chunks page out (`SectorMap::evict`: a
//! clock with a second chance); the checkpoint chain already holds them as
//! the last checkpoint saw them, so paging out writes nothing, and a chunk
//! that changed since keeps its changed entries in memory (its overlay).
//! A lookup that meets a paged-out chunk reads it back from the pieces of
//! the chain it is in (`chain_index`: a few KiB per piece, each group of
//! runs checked by a CRC) and installs it, its overlay laid over it.
//!
//! A lookup under the state's read lock (`with_map`: every read, and
//! nearly every fault of a store whose map is over its cache) reads the
//! chunk back under that read lock, so other lookups go on meanwhile: the
//! chain cannot change while it is held (a checkpoint names a new chain
//! under the write lock, and frees only segments of the chain before the
//! previous one). It then takes the write lock to install the chunk, which
//! the map allows only if the chunk is still paged out in the same pieces
//! of the same chain (`map::page_in`: a checkpoint may have been named in
//! between); otherwise the lookup faults again, and after
//! [`STALE_FAULTS_MAX`] such tries reads under the write lock. Nothing can
//! page the chunk out again before the caller uses it (`with_map`
//! downgrades the lock it installed with). A fault under the write lock
//! (`with_map_mut`: installing records, recovery) reads there, I/O
//! included. Each fault costs one read of a few KiB per piece.
//!
//! A chunk read back that does not match what was paged out (a group's
//! CRC, its mapped sectors or runs) is corruption of the volume's
//! metadata: the lookup fails and the volume turns read-only.

use crate::chain_index::ChainIndex;
use crate::counters::Counter;
use crate::error::{Accounting, EngineError, Internal, Result};
use crate::map::page_in::{Fault, LoadedChunk};
use crate::map::paging::Paged;
use crate::space::SegmentId;
use crate::state::map_state::MapState;
use crate::state::Inner;
use crate::storage::Storage;
use parking_lot::RwLockWriteGuard;
use squeeze_format::{segment_offset, FormatError, CHUNK_ENTRIES};
use std::sync::atomic::Ordering;

/// Chunks the clock may look at to make room for one chunk paged in (so a
/// fault on a map whose chunks all changed does not walk all of them: the
/// map then stays over its cache until the next checkpoint). Never more
/// than one turn: a chunk paged in for the same operation just before
/// keeps its second chance.
const FAULT_LOOKS: usize = 256;

/// Faults of one lookup whose read back was made stale by a checkpoint
/// named meanwhile before the lookup reads under the write lock (so that
/// checkpoints in a row cannot starve it).
const STALE_FAULTS_MAX: u32 = 4;

/// Turns of the clock over the resident chunks when trimming the map to
/// its cache (after a checkpoint, an open, or a new cache size): the
/// first turn may only take chunks' second chances.
const TRIM_TURNS: usize = 2;

/// Where a chain's bytes are read from: the backing store, the chain
/// laid over its segments.
#[derive(Clone, Copy)]
pub(crate) struct ChainBytes<'a> {
    pub storage: &'a dyn Storage,
    pub seg_size: u64,
}

impl ChainBytes<'_> {
    /// Reads bytes `at..at + out.len()` of the chain laid over `segments`.
    pub fn read(&self, segments: &[SegmentId], mut at: u64, mut out: &mut [u8]) -> Result<()> {
        while !out.is_empty() {
            let k = (at / self.seg_size) as usize;
            let within = at % self.seg_size;
            let n = ((self.seg_size - within) as usize).min(out.len());
            let Some(&seg) = segments.get(k) else {
                return Err(EngineError::Internal(Internal::ChainBytePastEnd {
                    at,
                    segments: segments.len(),
                }));
            };
            let (now, rest) = out.split_at_mut(n);
            self.storage
                .read_at(now, segment_offset(self.seg_size, seg) + within)
                .map_err(EngineError::from_storage)?;
            out = rest;
            at += n as u64;
        }
        Ok(())
    }
}

/// Reads chunk `c` back from the pieces of `chain` that hold it: its runs
/// in each, applied in chain order.
pub(crate) fn read_back(
    src: ChainBytes,
    chain: &ChainIndex,
    c: u64,
    pieces: &[u16],
) -> Result<LoadedChunk> {
    let lo = c * CHUNK_ENTRIES as u64;
    let hi = lo + CHUNK_ENTRIES as u64;
    let mut chunk = LoadedChunk::new(c);
    let mut buf = Vec::new();
    for &k in pieces {
        let Some(p) = chain.pieces.get(usize::from(k)) else {
            return Err(EngineError::Internal(Internal::PieceOutsideChain {
                chunk: c,
                piece: k,
                pieces: chain.pieces.len(),
            }));
        };
        let g = p.groups_touching(lo, hi);
        if g.is_empty() {
            continue;
        }
        let (at, len) = p.span(&g);
        buf.resize(len, 0);
        src.read(&chain.segments, at, &mut buf)?;
        p.check(&g, &buf).map_err(|group| {
            EngineError::Metadata(FormatError::Invalid {
                what: "checkpoint chain",
                why: format!(
                    "runs {} on of piece {k} (read back for map chunk {c}) fail their CRC",
                    group * crate::chain_index::GROUP_RUNS
                ),
            })
        })?;
        crate::chain_index::runs_touching(&buf, lo, hi, |r| chunk.apply(r));
    }
    Ok(chunk)
}

/// Pages a map in and out of its chain: at run time for a volume
/// (`paging`), and while recovery loads the map, before there is one.
pub(crate) struct Pager<'a> {
    pub src: ChainBytes<'a>,
    /// Bytes of RAM the map may use.
    pub cache: u64,
    /// Only chunks below this one page out (recovery: the chunks the
    /// piece it loads has passed by).
    pub below: u64,
    /// Chunks paged in and out so far.
    pub faults: u64,
    pub evictions: u64,
}

impl<'a> Pager<'a> {
    pub fn new(src: ChainBytes<'a>, cache: u64) -> Pager<'a> {
        Pager {
            src,
            cache,
            below: u64::MAX,
            faults: 0,
            evictions: 0,
        }
    }

    /// Pages chunk `c` in (nothing when it is not paged out); makes room
    /// first. A chunk read back that does not match what was paged out is
    /// a metadata error.
    pub fn page_in(&mut self, st: &mut MapState, c: u64) -> Result<()> {
        let Some(pieces) = st.map.paged_pieces(c) else {
            return Ok(());
        };
        let Some(chain) = st.chain.as_ref() else {
            return Err(EngineError::Internal(Internal::PagedWithoutChain {
                chunk: c,
            }));
        };
        let loaded = read_back(self.src, chain, c, &pieces)?;
        let looks = FAULT_LOOKS.min(st.map.resident_count());
        let out = st.map.evict(self.cache, looks, self.below);
        st.map
            .install(c, loaded)
            .map_err(EngineError::ChainMismatch)?;
        self.faults += 1;
        self.evictions += out.chunks;
        Ok(())
    }

    /// Installs what fault `f` read back (`loaded`, outside the write
    /// lock), when it is still current; makes room first. Returns false,
    /// installing nothing, when a checkpoint named meanwhile made it stale.
    pub fn install_read(
        &mut self,
        st: &mut MapState,
        f: &Fault,
        loaded: LoadedChunk,
    ) -> Result<bool> {
        if !st.map.fault_current(f) {
            return Ok(false);
        }
        let looks = FAULT_LOOKS.min(st.map.resident_count());
        let out = st.map.evict(self.cache, looks, self.below);
        self.evictions += out.chunks;
        let done = st
            .map
            .install_fault(f, loaded)
            .map_err(EngineError::ChainMismatch)?;
        debug_assert!(done, "eviction pages nothing in");
        self.faults += 1;
        Ok(true)
    }

    /// Runs `f` on the state, paging in each chunk it meets paged out and
    /// running it again.
    pub fn with_map_mut<T>(
        &mut self,
        st: &mut MapState,
        mut f: impl FnMut(&mut MapState) -> Result<T, Paged>,
    ) -> Result<T> {
        loop {
            match f(st) {
                Ok(v) => return Ok(v),
                Err(Paged(c)) => self.page_in(st, c)?,
            }
        }
    }

    /// Pages chunks out until the map fits its cache (or nothing more can
    /// go).
    pub fn page_out(&mut self, st: &mut MapState) {
        if st.chain.is_none() || st.map.memory_bytes() <= self.cache {
            return;
        }
        let looks = TRIM_TURNS * st.map.resident_count();
        self.evictions += st.map.evict(self.cache, looks, self.below).chunks;
    }
}

/// Bytes of RAM the map may use.
pub(crate) fn map_cache(inner: &Inner) -> u64 {
    inner.map_cache.load(Ordering::Relaxed)
}

fn chain_bytes(inner: &Inner) -> ChainBytes<'_> {
    ChainBytes {
        storage: &*inner.storage,
        seg_size: inner.seg_size,
    }
}

/// Runs `f` with a pager of this volume's map, then counts what it
/// paged; any error turns the volume read-only (the chain is the
/// volume's metadata).
fn paging<T>(inner: &Inner, f: impl FnOnce(&mut Pager) -> Result<T>) -> Result<T> {
    let mut p = Pager::new(chain_bytes(inner), map_cache(inner));
    let r = f(&mut p);
    inner.counters.add(Counter::MapFaults, p.faults);
    inner.counters.add(Counter::MapEvictions, p.evictions);
    r.inspect_err(|e| inner.poison(e))
}

/// `read_back` from this volume's chain.
pub(crate) fn read_back_chunk(
    inner: &Inner,
    chain: &ChainIndex,
    c: u64,
    pieces: &[u16],
) -> Result<LoadedChunk> {
    read_back(chain_bytes(inner), chain, c, pieces).inspect_err(|e| inner.poison(e))
}

/// Pages chunk `c` in (nothing when it is not paged out), under the
/// caller's write lock; makes room first.
pub(crate) fn page_in(inner: &Inner, st: &mut MapState, c: u64) -> Result<()> {
    paging(inner, |p| p.page_in(st, c))
}

/// Chunk `c` read back under the caller's read lock, with what the read
/// took (None when it is not paged out, or there is no chain: the write
/// lock's `page_in` then says so).
fn read_under(inner: &Inner, st: &MapState, c: u64) -> Result<Option<(Fault, LoadedChunk)>> {
    let (Some(f), Some(chain)) = (st.map.fault(c), st.chain.as_ref()) else {
        return Ok(None);
    };
    let loaded = read_back_chunk(inner, chain, c, &f.pieces)?;
    Ok(Some((f, loaded)))
}

/// [`with_map`] for a caller that must not wait: None when the map's lock
/// is taken (or wanted) by a writer, or when `f` needs a chunk that is
/// paged out; nothing is paged in.
pub(crate) fn with_resident_map<T>(
    inner: &Inner,
    mut f: impl FnMut(&MapState) -> Result<T, Paged>,
) -> Option<T> {
    let st = inner.state.try_read()?;
    f(&st).ok()
}

/// Runs `f` on the state under the read lock, paging in each chunk it
/// meets paged out (read back under the read lock, installed under the
/// write lock) and running it again.
pub(crate) fn with_map<T>(
    inner: &Inner,
    mut f: impl FnMut(&MapState) -> Result<T, Paged>,
) -> Result<T> {
    let mut st = inner.state.read();
    let mut stale = 0;
    loop {
        match f(&st) {
            Ok(v) => return Ok(v),
            Err(Paged(c)) => {
                let read = if stale < STALE_FAULTS_MAX {
                    read_under(inner, &st, c)?
                } else {
                    None
                };
                drop(st);
                let mut w = inner.state.write();
                match read {
                    Some((fault, loaded)) => {
                        if !paging(inner, |p| p.install_read(&mut w, &fault, loaded))? {
                            stale += 1;
                        }
                    }
                    None => page_in(inner, &mut w, c)?,
                }
                st = RwLockWriteGuard::downgrade(w);
            }
        }
    }
}

/// `with_map` for a caller that holds the write lock.
pub(crate) fn with_map_mut<T>(
    inner: &Inner,
    st: &mut MapState,
    f: impl FnMut(&mut MapState) -> Result<T, Paged>,
) -> Result<T> {
    paging(inner, |p| p.with_map_mut(st, f))
}

/// Pages chunks out until the map fits its cache (or nothing more can
/// go), under the caller's write lock.
pub(crate) fn page_out(inner: &Inner, st: &mut MapState) {
    let _ = paging(inner, |p| {
        p.page_out(st);
        Ok(())
    });
}

/// `page_out` under the state's write lock (after an open, and when the
/// cache is set).
pub(crate) fn trim_map(inner: &Inner) {
    if inner.state.read().map.memory_bytes() > map_cache(inner) {
        page_out(inner, &mut inner.state.write());
    }
}

/// True when the map uses more RAM than its cache.
pub(crate) fn map_over_cache(inner: &Inner) -> bool {
    inner.state.read().map.memory_bytes() > map_cache(inner)
}

/// The mapped entries of chunk `c`, resident or read back from the chain
/// (not installed: walking the whole map does not churn the cache).
fn entries_of(
    inner: &Inner,
    st: &MapState,
    c: u64,
) -> Result<Vec<(u64, squeeze_format::MapEntry)>> {
    match (st.map.paged_pieces(c), st.chain.as_ref()) {
        (None, _) => st
            .map
            .chunk_entries(c)
            .map_err(|p| inner.internal(Internal::PagedTwice { chunk: p.0 })),
        (Some(pieces), Some(chain)) => {
            let back = read_back_chunk(inner, chain, c, &pieces)?;
            Ok(st.map.with_overlay(c, back).entries())
        }
        (Some(_), None) => Err(inner.internal(Internal::PagedWithoutChain { chunk: c })),
    }
}

/// Calls `f` with the mapped entries of each chunk in LBA order, under the
/// state's read lock taken anew for each chunk (`check`: the map may change
/// between chunks).
pub(crate) fn for_each_chunk(
    inner: &Inner,
    mut f: impl FnMut(u64, &[(u64, squeeze_format::MapEntry)]),
) -> Result<()> {
    let mut c = 0u64;
    loop {
        let (k, entries) = {
            let st = inner.state.read();
            let Some(k) = st.map.next_chunk(c) else {
                return Ok(());
            };
            (k, entries_of(inner, &st, k)?)
        };
        f(k, &entries);
        c = k + 1;
    }
}

/// `for_each_chunk` under one hold of the caller's lock: the whole map at
/// one moment (`Volume::verify_accounting`).
pub(crate) fn for_each_chunk_locked(
    inner: &Inner,
    st: &MapState,
    mut f: impl FnMut(u64, &[(u64, squeeze_format::MapEntry)]),
) -> Result<()> {
    let mut c = 0u64;
    while let Some(k) = st.map.next_chunk(c) {
        f(k, &entries_of(inner, st, k)?);
        c = k + 1;
    }
    Ok(())
}

/// Checks that the chain holds what each resident chunk that could page out
/// holds (`Volume::verify_accounting`): reads each back and compares.
pub(crate) fn verify_pages(inner: &Inner) -> std::result::Result<(), Accounting> {
    let st = inner.state.read();
    let Some(chain) = st.chain.as_ref() else {
        return Ok(());
    };
    for (c, pieces) in st.map.clean_chunks() {
        let back = read_back_chunk(inner, chain, c, &pieces)?;
        let here = st
            .map
            .chunk_entries(c)
            .map_err(|p| Accounting::ChunkPaged { chunk: p.0 })?;
        if back.entries() != here {
            return Err(Accounting::ChainDiffers { chunk: c, pieces });
        }
    }
    Ok(())
}
