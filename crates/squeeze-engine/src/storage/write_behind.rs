//! Write-behind staging for the backing file: log appends are copied into a
//! small pool of aligned chunk buffers (1 MiB each by default) and reach the
//! file as whole chunks written with O_DIRECT, so they bypass the page cache.
//!
//! Why: written through the page cache, every MiB of log costs 256 fresh
//! page-cache pages. On a virtual machine whose host has reclaimed free guest
//! memory, each of those is a hypervisor fault, and writes ran at half the
//! device's speed (docs/benchmarks-history.md). The pool's buffers are allocated once
//! and reused, and a 1 MiB direct write converts ext4's unwritten extents
//! once per MiB instead of once per record.
//!
//! The Storage contract still holds:
//! - a completed write is visible to every later read: reads overlay the
//!   staged bytes on what the file holds;
//! - nothing is durable before `sync`, which writes every staged byte not yet
//!   in the file (whole 4 KiB blocks, direct) and then the caller fdatasyncs;
//! - a punched range reads as zeros: staged bytes inside it are dropped.
//!
//! A chunk leaves the pool when every byte of it has been written (the
//! writer that completes it writes it out), or when the pool is full and it
//! is the least recently used (its staged bytes are written first). Bytes of
//! a chunk that nobody staged are whatever the file holds; when a block must
//! be written whole and part of it was never staged, that part is read from
//! the file first, so the block goes back with the same bytes there.
//! Rewriting bytes that are already durable with the same values is safe
//! even if the write tears.

use super::aligned::AlignedBuf;
use super::Fetch;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

// Also named here (`space::prewrite`): the alignment the pool writes in.
pub use super::aligned::BLOCK;

/// What staging needs of the file under it.
pub trait Disk {
    /// Reads through the page cache; any alignment; past the end is zeros.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// As `read_at`, for bytes not expected to be read again soon.
    fn read_stream(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_at(buf, offset)
    }
    /// As `Storage::read_cached`: only from the page cache, else
    /// `WouldBlock`. The default: never cached.
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let _ = (buf, offset);
        Err(super::not_cached())
    }
    /// Reads as `fetch` says.
    fn fetch(&self, buf: &mut [u8], offset: u64, fetch: Fetch) -> io::Result<()> {
        match fetch {
            Fetch::Wait => self.read_at(buf, offset),
            Fetch::Stream => self.read_stream(buf, offset),
            Fetch::Cached => self.read_cached(buf, offset),
        }
    }
    /// Writes `BLOCK`-aligned bytes from a `BLOCK`-aligned buffer, bypassing
    /// the page cache.
    fn write_direct(&self, data: &[u8], offset: u64) -> io::Result<()>;
}

/// Sorted, disjoint, non-adjacent byte ranges inside one chunk.
#[derive(Default, Debug)]
struct Ranges(Vec<(usize, usize)>);

impl Ranges {
    fn insert(&mut self, start: usize, end: usize) {
        let v = &mut self.0;
        // First range that ends at or after `start` (touching ones merge).
        let i = v.partition_point(|&(_, e)| e < start);
        let mut j = i;
        let (mut s, mut e) = (start, end);
        while j < v.len() && v[j].0 <= e {
            s = s.min(v[j].0);
            e = e.max(v[j].1);
            j += 1;
        }
        v.splice(i..j, [(s, e)]);
    }

    fn remove(&mut self, start: usize, end: usize) {
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(s, e) in &self.0 {
            if e <= start || s >= end {
                out.push((s, e));
                continue;
            }
            if s < start {
                out.push((s, start));
            }
            if e > end {
                out.push((end, e));
            }
        }
        self.0 = out;
    }

    fn covers(&self, start: usize, end: usize) -> bool {
        self.0.iter().any(|&(s, e)| s <= start && e >= end)
    }

    /// The parts of `[start, end)` not covered.
    fn gaps(&self, start: usize, end: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at = start;
        for &(s, e) in &self.0 {
            if e <= at {
                continue;
            }
            if s >= end {
                break;
            }
            if s > at {
                out.push((at, s));
            }
            at = e;
            if at >= end {
                break;
            }
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    fn iter(&self) -> impl Iterator<Item = &(usize, usize)> {
        self.0.iter()
    }

    fn end(&self) -> usize {
        self.0.last().map_or(0, |r| r.1)
    }
}

/// Fills `out` from `parts` starting at `from` (part index, offset in it);
/// returns where the next byte comes from.
fn gather(parts: &[&[u8]], from: (usize, usize), out: &mut [u8]) -> (usize, usize) {
    let (mut p, mut o) = from;
    let mut k = 0;
    while k < out.len() {
        let src = parts[p];
        let take = (src.len() - o).min(out.len() - k);
        out[k..k + take].copy_from_slice(&src[o..o + take]);
        k += take;
        o += take;
        if o == src.len() {
            p += 1;
            o = 0;
        }
    }
    (p, o)
}

struct ChunkState {
    /// None once the chunk has left the pool: its bytes are in the file.
    buf: Option<AlignedBuf>,
    /// Bytes of `buf` that hold the chunk's current contents.
    valid: Ranges,
    /// Bytes staged since the chunk was last written out.
    dirty: Option<(usize, usize)>,
}

struct Chunk {
    index: u64,
    state: Mutex<ChunkState>,
    last_use: AtomicU64,
    evicting: AtomicBool,
}

#[derive(Default)]
struct Pool {
    chunks: HashMap<u64, Arc<Chunk>>,
    free: Vec<AlignedBuf>,
    allocated: usize,
}

/// A chunk every byte of which has been staged, waiting to be written out.
pub struct Completed(Arc<Chunk>);

/// The staging pool. All methods take the file as a `Disk`.
pub struct WriteBehind {
    chunk: usize,
    capacity: usize,
    pool: Mutex<Pool>,
    clock: AtomicU64,
}

impl WriteBehind {
    /// `chunk` bytes per buffer (a multiple of BLOCK), at most `capacity`
    /// buffers (at least 1).
    pub fn new(chunk: usize, capacity: usize) -> WriteBehind {
        assert!(chunk >= BLOCK && chunk.is_multiple_of(BLOCK) && capacity >= 1);
        WriteBehind {
            chunk,
            capacity,
            pool: Mutex::new(Pool::default()),
            clock: AtomicU64::new(0),
        }
    }

    fn base(&self, index: u64) -> u64 {
        index * self.chunk as u64
    }

    /// Stages `parts`, back to back, at `offset`. Returns the chunks this
    /// write completed: the caller passes each to `write_completed`, at once
    /// or from another thread, so the writer need not wait for the device.
    pub fn write(
        &self,
        disk: &dyn Disk,
        parts: &[&[u8]],
        offset: u64,
    ) -> io::Result<Vec<Completed>> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut completed = Vec::new();
        // Where the next byte comes from: part index, offset in the part.
        let mut from = (0usize, 0usize);
        let mut done = 0usize;
        while done < total {
            let at = offset + done as u64;
            let index = at / self.chunk as u64;
            let within = (at % self.chunk as u64) as usize;
            let n = (self.chunk - within).min(total - done);
            loop {
                let c = self.get_or_stage(disk, index)?;
                let mut st = c.state.lock();
                let Some(buf) = st.buf.as_mut() else {
                    continue; // left the pool meanwhile: stage it again
                };
                from = gather(parts, from, &mut buf[within..within + n]);
                st.valid.insert(within, within + n);
                st.dirty = Some(match st.dirty {
                    None => (within, within + n),
                    Some((s, e)) => (s.min(within), e.max(within + n)),
                });
                c.last_use.store(
                    self.clock.fetch_add(1, Ordering::Relaxed),
                    Ordering::Relaxed,
                );
                if st.valid.covers(0, self.chunk) {
                    drop(st);
                    completed.push(Completed(c));
                }
                break;
            }
            done += n;
        }
        Ok(completed)
    }

    /// Writes out a chunk `write` completed, and takes it out of the pool
    /// if nothing was staged in it meanwhile that is not yet written.
    pub fn write_completed(&self, disk: &dyn Disk, c: Completed) -> io::Result<()> {
        let c = c.0;
        let mut st = c.state.lock();
        if st.buf.is_none() {
            return Ok(()); // evicted or discarded meanwhile
        }
        self.write_dirty(disk, c.index, &mut st)?;
        if st.valid.covers(0, self.chunk) {
            let buf = st.buf.take().expect("staged");
            self.release(&c, buf);
        }
        Ok(())
    }

    /// Reads `buf` at `offset`: the file's bytes (fetched as `fetch` says)
    /// with staged bytes on top.
    pub fn read(
        &self,
        disk: &dyn Disk,
        buf: &mut [u8],
        offset: u64,
        fetch: Fetch,
    ) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let staged = self.staged_in(offset, buf.len() as u64);
        disk.fetch(buf, offset, fetch)?;
        for c in staged {
            let base = self.base(c.index);
            // The part of this chunk the read covers, relative to the chunk.
            let lo = offset.max(base);
            let hi = (offset + buf.len() as u64).min(base + self.chunk as u64);
            let (cs, ce) = ((lo - base) as usize, (hi - base) as usize);
            let out = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
            let st = c.state.lock();
            match st.buf.as_ref() {
                None => {
                    // Written out and gone since the file was read: the file
                    // now has every byte, read them again.
                    let again = if fetch == Fetch::Cached {
                        Fetch::Cached
                    } else {
                        Fetch::Wait
                    };
                    disk.fetch(out, lo, again)?;
                }
                Some(b) => {
                    for &(s, e) in st.valid.iter() {
                        let (s, e) = (s.max(cs), e.min(ce));
                        if s < e {
                            out[s - cs..e - cs].copy_from_slice(&b[s..e]);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes every staged byte not yet in the file. Chunks stay staged
    /// (clean), so later appends to them need no read of the file.
    /// Chunks go in file order (the pool's map has none), so the same
    /// staging gives the same writes: the simulator replays seeds by them.
    pub fn write_out(&self, disk: &dyn Disk) -> io::Result<()> {
        let mut chunks: Vec<Arc<Chunk>> = self.pool.lock().chunks.values().cloned().collect();
        chunks.sort_by_key(|c| c.index);
        for c in chunks {
            let mut st = c.state.lock();
            self.write_dirty(disk, c.index, &mut st)?;
        }
        Ok(())
    }

    /// Drops staged bytes inside `[offset, offset+len)` (about to be
    /// punched out of the file), writing out the rest of those chunks first.
    pub fn discard(&self, disk: &dyn Disk, offset: u64, len: u64) -> io::Result<()> {
        for c in self.staged_in(offset, len) {
            let base = self.base(c.index);
            let lo = (offset.max(base) - base) as usize;
            let hi = ((offset + len).min(base + self.chunk as u64) - base) as usize;
            let mut st = c.state.lock();
            if st.buf.is_none() {
                continue;
            }
            if lo == 0 && hi == self.chunk {
                let buf = st.buf.take().expect("staged");
                st.dirty = None;
                self.release(&c, buf);
                continue;
            }
            self.write_dirty(disk, c.index, &mut st)?;
            st.valid.remove(lo, hi);
        }
        Ok(())
    }

    /// Staged bytes not yet written to the disk (each chunk's dirty span):
    /// what a process kill loses. At most `chunk * capacity`.
    pub fn unwritten_bytes(&self) -> u64 {
        let chunks: Vec<Arc<Chunk>> = self.pool.lock().chunks.values().cloned().collect();
        chunks
            .iter()
            .map(|c| c.state.lock().dirty.map_or(0, |(s, e)| (e - s) as u64))
            .sum()
    }

    /// End of the highest staged byte (0 with nothing staged).
    pub fn staged_end(&self) -> u64 {
        let chunks: Vec<Arc<Chunk>> = self.pool.lock().chunks.values().cloned().collect();
        chunks
            .iter()
            .map(|c| {
                let st = c.state.lock();
                match st.valid.end() {
                    0 => 0,
                    e => self.base(c.index) + e as u64,
                }
            })
            .max()
            .unwrap_or(0)
    }

    /// Chunks staged for any byte of `[offset, offset+len)`.
    fn staged_in(&self, offset: u64, len: u64) -> Vec<Arc<Chunk>> {
        if len == 0 {
            return Vec::new();
        }
        let first = offset / self.chunk as u64;
        let last = (offset + len - 1) / self.chunk as u64;
        let pool = self.pool.lock();
        if pool.chunks.is_empty() {
            return Vec::new();
        }
        if last - first + 1 > pool.chunks.len() as u64 {
            let mut v: Vec<Arc<Chunk>> = pool
                .chunks
                .values()
                .filter(|c| c.index >= first && c.index <= last)
                .cloned()
                .collect();
            v.sort_by_key(|c| c.index);
            return v;
        }
        (first..=last)
            .filter_map(|i| pool.chunks.get(&i).cloned())
            .collect()
    }

    /// Writes the dirty bytes of a staged chunk as whole blocks, filling
    /// bytes of those blocks that were never staged from the file first.
    fn write_dirty(&self, disk: &dyn Disk, index: u64, st: &mut ChunkState) -> io::Result<()> {
        let Some((ds, de)) = st.dirty else {
            return Ok(());
        };
        let Some(buf) = st.buf.as_mut() else {
            return Ok(());
        };
        let base = self.base(index);
        let b0 = ds / BLOCK * BLOCK;
        let b1 = (de.div_ceil(BLOCK) * BLOCK).min(self.chunk);
        for (s, e) in st.valid.gaps(b0, b1) {
            disk.read_at(&mut buf[s..e], base + s as u64)?;
        }
        st.valid.insert(b0, b1);
        disk.write_direct(&buf[b0..b1], base + b0 as u64)?;
        st.dirty = None;
        Ok(())
    }

    /// The staged chunk for `index`, staging a new one if needed (which may
    /// evict the least recently used chunk).
    fn get_or_stage(&self, disk: &dyn Disk, index: u64) -> io::Result<Arc<Chunk>> {
        loop {
            let victim = {
                let mut pool = self.pool.lock();
                if let Some(c) = pool.chunks.get(&index) {
                    return Ok(c.clone());
                }
                let buf = match pool.free.pop() {
                    Some(b) => Some(b),
                    None if pool.allocated < self.capacity => {
                        pool.allocated += 1;
                        Some(take_spare(self.chunk).unwrap_or_else(|| AlignedBuf::new(self.chunk)))
                    }
                    None => None,
                };
                if let Some(buf) = buf {
                    let c = Arc::new(Chunk {
                        index,
                        state: Mutex::new(ChunkState {
                            buf: Some(buf),
                            valid: Ranges::default(),
                            dirty: None,
                        }),
                        last_use: AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed)),
                        evicting: AtomicBool::new(false),
                    });
                    pool.chunks.insert(index, c.clone());
                    return Ok(c);
                }
                let victim = pool
                    .chunks
                    .values()
                    .filter(|c| !c.evicting.load(Ordering::Relaxed))
                    .min_by_key(|c| c.last_use.load(Ordering::Relaxed))
                    .cloned();
                match victim {
                    Some(v) => {
                        v.evicting.store(true, Ordering::Relaxed);
                        v
                    }
                    None => {
                        // Every chunk is being evicted by other threads:
                        // one of them frees a buffer soon.
                        drop(pool);
                        std::thread::yield_now();
                        continue;
                    }
                }
            };
            let mut st = victim.state.lock();
            if let Err(e) = self.write_dirty(disk, victim.index, &mut st) {
                victim.evicting.store(false, Ordering::Relaxed);
                return Err(e);
            }
            if let Some(buf) = st.buf.take() {
                self.release(&victim, buf);
            }
        }
    }

    /// Takes a chunk out of the pool (its bytes are in the file) and keeps
    /// its buffer for the next one. Called with the chunk's state locked.
    fn release(&self, c: &Arc<Chunk>, buf: AlignedBuf) {
        let mut pool = self.pool.lock();
        if pool.chunks.get(&c.index).is_some_and(|x| Arc::ptr_eq(x, c)) {
            pool.chunks.remove(&c.index);
        }
        pool.free.push(buf);
    }
}

/// Buffers of dropped pools, for the next pool to reuse: a process that
/// opens volumes one after another (tests, `squeeze compact`, each run of
/// `squeeze bench`) would otherwise fault in and zero up to 32 MiB of fresh
/// memory per volume (in a VM, a hypervisor fault per page: 1-2% of the
/// first timed 1 GiB `bench` write went to zeroing them, perf). A pool never
/// reads bytes it did not stage, so a reused buffer needs no clearing.
static SPARE: std::sync::Mutex<Vec<AlignedBuf>> = std::sync::Mutex::new(Vec::new());

/// Bytes of buffers SPARE keeps at most (one default pool's worth).
const SPARE_MAX_BYTES: usize = 32 << 20;

fn take_spare(len: usize) -> Option<AlignedBuf> {
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    let i = spare.iter().rposition(|b| b.len() == len)?;
    Some(spare.swap_remove(i))
}

impl Drop for WriteBehind {
    /// Hands the buffers to SPARE (whoever dropped the pool has written out
    /// what it needed: `write_out`).
    fn drop(&mut self) {
        let pool = self.pool.get_mut();
        let mut bufs = std::mem::take(&mut pool.free);
        for c in pool.chunks.values() {
            bufs.extend(c.state.lock().buf.take());
        }
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        let mut held: usize = spare.iter().map(|b| b.len()).sum();
        for b in bufs {
            if held + b.len() <= SPARE_MAX_BYTES {
                held += b.len();
                spare.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// A file in memory that checks the alignment direct I/O demands.
    struct MemDisk(Mutex<Vec<u8>>, AtomicU64);

    impl MemDisk {
        fn new() -> MemDisk {
            MemDisk(Mutex::new(Vec::new()), AtomicU64::new(0))
        }
    }

    impl Disk for MemDisk {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            let v = self.0.lock();
            for (i, b) in buf.iter_mut().enumerate() {
                *b = v.get(offset as usize + i).copied().unwrap_or(0);
            }
            Ok(())
        }
        fn write_direct(&self, data: &[u8], offset: u64) -> io::Result<()> {
            assert_eq!(offset % BLOCK as u64, 0, "unaligned offset");
            assert_eq!(data.len() % BLOCK, 0, "unaligned length");
            assert_eq!(data.as_ptr() as usize % BLOCK, 0, "unaligned buffer");
            self.1.fetch_add(1, Ordering::Relaxed);
            let mut v = self.0.lock();
            let end = offset as usize + data.len();
            if v.len() < end {
                v.resize(end, 0);
            }
            v[offset as usize..end].copy_from_slice(data);
            Ok(())
        }
    }

    /// Stages and at once writes out what the write completed.
    fn put(wb: &WriteBehind, d: &dyn Disk, data: &[u8], offset: u64) {
        // Cut into uneven parts, as records (header, payload, padding) are.
        let cut = data.len() / 3;
        let parts = [&data[..cut], &data[cut..cut], &data[cut..]];
        for c in wb.write(d, &parts, offset).unwrap() {
            wb.write_completed(d, c).unwrap();
        }
    }

    #[test]
    fn ranges_merge_split_and_gaps() {
        let mut r = Ranges::default();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(20, 30);
        assert_eq!(r.0, vec![(10, 40)]);
        r.insert(0, 5);
        r.insert(50, 60);
        assert_eq!(r.gaps(0, 70), vec![(5, 10), (40, 50), (60, 70)]);
        assert_eq!(r.gaps(12, 38), vec![]);
        r.remove(15, 55);
        assert_eq!(r.0, vec![(0, 5), (10, 15), (55, 60)]);
        assert!(r.covers(10, 15) && !r.covers(10, 16));
        assert_eq!(r.end(), 60);
    }

    #[test]
    fn a_dropped_pools_buffers_are_reused_and_their_old_bytes_never_written() {
        // A chunk size no other test uses: SPARE is shared by the process.
        let chunk = 3 * BLOCK;
        let spare_of_len = || {
            SPARE
                .lock()
                .unwrap()
                .iter()
                .filter(|b| b.len() == chunk)
                .count()
        };
        let old = MemDisk::new();
        let wb = WriteBehind::new(chunk, 2);
        // Two full chunks of 0xAA (written out at once), and a third staged.
        put(&wb, &old, &vec![0xAA; 2 * chunk + 100], 0);
        drop(wb);
        assert_eq!(spare_of_len(), 2, "the pool's buffers went to SPARE");
        // A new pool over another file takes them, and stages 100 bytes:
        // the rest of the block comes from the file, not the old bytes.
        let d = MemDisk::new();
        let mut file_bytes = AlignedBuf::new(chunk);
        file_bytes.fill(0x11);
        d.write_direct(&file_bytes, 0).unwrap();
        let wb = WriteBehind::new(chunk, 2);
        put(&wb, &d, &[0x22; 100], 0);
        assert_eq!(spare_of_len(), 1, "one buffer taken");
        let mut b = vec![0u8; chunk];
        wb.read(&d, &mut b, 0, Fetch::Wait).unwrap();
        assert!(b[..100].iter().all(|&x| x == 0x22));
        assert!(b[100..].iter().all(|&x| x == 0x11), "old bytes read back");
        wb.write_out(&d).unwrap();
        let v = d.0.lock();
        assert!(v[..100].iter().all(|&x| x == 0x22));
        assert!(
            v[100..chunk].iter().all(|&x| x == 0x11),
            "old bytes written"
        );
    }

    #[test]
    fn full_chunk_goes_out_in_one_write() {
        let d = MemDisk::new();
        let wb = WriteBehind::new(16 * BLOCK, 4);
        let data: Vec<u8> = (0..16 * BLOCK).map(|i| i as u8).collect();
        for piece in data.chunks(1000).enumerate() {
            put(&wb, &d, piece.1, (piece.0 * 1000) as u64);
        }
        assert_eq!(d.1.load(Ordering::Relaxed), 1, "one direct write");
        assert_eq!(*d.0.lock(), data);
        assert_eq!(wb.staged_end(), 0, "nothing left staged");
    }

    #[test]
    fn sync_writes_partial_blocks_without_clobbering_the_file() {
        let d = MemDisk::new();
        // Old bytes in the file around the staged ones.
        *d.0.lock() = vec![7u8; 3 * BLOCK];
        let wb = WriteBehind::new(4 * BLOCK, 2);
        put(&wb, &d, &[1u8; 100], 5000);
        let mut r = vec![0u8; 3 * BLOCK];
        wb.read(&d, &mut r, 0, Fetch::Wait).unwrap();
        assert_eq!(
            &r[4999..5101],
            &[[7u8].as_slice(), &[1u8; 100], &[7u8]].concat()[..]
        );
        assert_eq!(d.0.lock()[5000], 7, "nothing written before sync");
        wb.write_out(&d).unwrap();
        let f = d.0.lock().clone();
        assert_eq!(f, r, "the file holds the staged bytes and kept its own");
    }

    /// Random writes, reads, syncs and discards against a model, with a pool
    /// small enough that chunks are evicted all the time. After each sync the
    /// file must equal the model byte for byte.
    #[test]
    fn matches_a_model_under_eviction() {
        for seed in 0..40u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let d = MemDisk::new();
            let chunk = 4 * BLOCK;
            let wb = WriteBehind::new(chunk, 1 + (seed as usize % 3));
            let span = 12 * chunk;
            let mut model = vec![0u8; span];
            // Odd seeds write completed chunks out later, as the flusher
            // threads do, in any order.
            let deferred = seed % 2 == 1;
            let mut pending: Vec<Completed> = Vec::new();
            for step in 0..400 {
                if deferred && !pending.is_empty() && rng.gen_range(0..3) == 0 {
                    let i = rng.gen_range(0..pending.len());
                    wb.write_completed(&d, pending.swap_remove(i)).unwrap();
                }
                match rng.gen_range(0..10) {
                    0..=4 => {
                        let len = rng.gen_range(1..2 * chunk);
                        let off = rng.gen_range(0..span - len);
                        let v: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                        if deferred {
                            pending.extend(wb.write(&d, &[&v], off as u64).unwrap());
                        } else {
                            put(&wb, &d, &v, off as u64);
                        }
                        model[off..off + len].copy_from_slice(&v);
                    }
                    5..=7 => {
                        let len = rng.gen_range(1..3 * chunk);
                        let off = rng.gen_range(0..span - len);
                        let mut got = vec![0u8; len];
                        wb.read(
                            &d,
                            &mut got,
                            off as u64,
                            if step % 2 == 0 {
                                Fetch::Stream
                            } else {
                                Fetch::Wait
                            },
                        )
                        .unwrap();
                        assert!(got == model[off..off + len], "seed {seed} step {step}");
                    }
                    8 => {
                        wb.write_out(&d).unwrap();
                        let f = d.0.lock().clone();
                        let n = f.len();
                        assert!(f == model[..n], "seed {seed} step {step}: file after sync");
                        assert!(model[n..].iter().all(|&b| b == 0));
                    }
                    _ => {
                        let off = rng.gen_range(0..span / BLOCK) * BLOCK;
                        let len = rng.gen_range(1..=(span - off) / BLOCK).min(6) * BLOCK;
                        wb.discard(&d, off as u64, len as u64).unwrap();
                        // What punching does to the file.
                        let mut f = d.0.lock();
                        let end = (off + len).min(f.len());
                        if off < end {
                            f[off..end].fill(0);
                        }
                        model[off..off + len].fill(0);
                    }
                }
            }
        }
    }

    /// Many writers on disjoint ranges of the same chunks, readers beside
    /// them: every completed write is visible, and sync puts it all in the
    /// file.
    #[test]
    fn concurrent_writers_and_readers() {
        let d = Arc::new(MemDisk::new());
        let wb = Arc::new(WriteBehind::new(8 * BLOCK, 3));
        let threads = 4;
        let piece = 1500usize;
        let rounds = 200;
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (d, wb) = (d.clone(), wb.clone());
                std::thread::spawn(move || {
                    for r in 0..rounds {
                        let off = ((r * threads + t) * piece) as u64;
                        let v = vec![(t * 31 + r) as u8 | 1; piece];
                        put(&wb, &*d, &v, off);
                        let mut got = vec![0u8; piece];
                        wb.read(
                            &*d,
                            &mut got,
                            off,
                            if r % 2 == 0 {
                                Fetch::Stream
                            } else {
                                Fetch::Wait
                            },
                        )
                        .unwrap();
                        assert_eq!(got, v, "thread {t} round {r}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        wb.write_out(&*d).unwrap();
        let f = d.0.lock().clone();
        for r in 0..rounds {
            for t in 0..threads {
                let off = (r * threads + t) * piece;
                assert!(f[off..off + piece]
                    .iter()
                    .all(|&b| b == (t * 31 + r) as u8 | 1));
            }
        }
    }
}
