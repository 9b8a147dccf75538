//! The store: keys hashed (XXH64 with the store's seed) straight onto
//! buckets, one 4 KiB sector each, on a thin volume; nothing per key in
//! memory.
//!
//! A key's chain: its home bucket `xxh64(key, seed) % buckets`, then the
//! buckets after it (wrapping) while the one before carries the spill
//! flag, at most `probe_max` buckets. `get` returns the first copy of the
//! key along the chain.
//!
//! Crash consistency without a log: every change is a rewrite of one
//! bucket, one sector, which the engine stores as one record, atomic
//! across a crash (docs/RELIABILITY.md, "Atomic writes"). Where an
//! operation changes two buckets, the change that must come first is
//! flushed before the second is written:
//! - a new key that finds its bucket full sets the bucket's spill flag,
//!   flushes, then writes the next bucket (a record past a bucket is never
//!   durable before the flag that leads to it);
//! - an update that no longer fits its bucket writes the new copy
//!   elsewhere, flushes, then removes the old one;
//! - copies a crash left behind (after the first, so never read) are
//!   removed, and flushed, before the first copy is changed.
//!
//! A put or delete is durable once a later `flush` returns.
//!
//! Concurrency: operations on keys whose chains may overlap serialize on
//! striped locks over the `probe_max` buckets from the home, taken in
//! ascending stripe order.

use crate::bucket::{Bucket, RECORDS_MAX, RECORD_OVERHEAD};
use crate::error::{KvError, Result};
use crate::header::StoreHeader;
use parking_lot::{Mutex, MutexGuard};
use squeeze_engine::Volume;
use squeeze_format::SECTOR_SIZE;
use std::sync::Arc;

const SECTOR: u64 = SECTOR_SIZE as u64;
/// Longest key.
pub const KEY_MAX: usize = 1024;
/// Key and value bytes one record holds at most.
pub const RECORD_MAX: usize = RECORDS_MAX - RECORD_OVERHEAD;
/// Default chain length.
pub const PROBE_MAX_DEFAULT: u32 = 16;
/// Buckets per key a store is sized with by default (`squeeze kv bench`,
/// squeeze-ycsb): four 400-byte records to a 4 KiB bucket, which share its
/// record header and compression frame (docs/KV.md).
pub const BUCKETS_PER_KEY_DEFAULT: f64 = 0.25;
const STRIPES: usize = 4096;

/// How to create a store.
#[derive(Clone, Copy, Debug)]
pub struct CreateStore {
    /// Buckets (default: every sector of the volume after the header).
    pub buckets: Option<u64>,
    pub seed: u64,
    pub probe_max: u32,
}

impl Default for CreateStore {
    fn default() -> Self {
        CreateStore {
            buckets: None,
            seed: 0,
            probe_max: PROBE_MAX_DEFAULT,
        }
    }
}

/// What the opener expects of a store (refused if it differs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Expect {
    pub buckets: Option<u64>,
    pub seed: Option<u64>,
}

pub struct Store {
    vol: Arc<Volume>,
    h: StoreHeader,
    stripes: Vec<Mutex<()>>,
}

/// The buckets of a chain read so far: (index, bucket).
type Chain = Vec<(u64, Bucket)>;

impl Store {
    /// Creates a store on `vol`, which must be empty.
    pub fn create(vol: Arc<Volume>, c: CreateStore) -> Result<Store> {
        let sectors = vol.size() / SECTOR;
        if sectors < 2 {
            return Err(KvError::Invalid(
                "the volume has no room for buckets".into(),
            ));
        }
        let buckets = c.buckets.unwrap_or(sectors - 1);
        if buckets == 0 || buckets > sectors - 1 {
            return Err(KvError::Invalid(format!(
                "{buckets} buckets do not fit a volume of {sectors} sectors (one is the header)"
            )));
        }
        if c.probe_max == 0 || u64::from(c.probe_max) > buckets {
            return Err(KvError::Invalid(format!(
                "probe_max {} must be 1..={buckets}",
                c.probe_max
            )));
        }
        if vol
            .block_status(0, vol.size(), 2)?
            .iter()
            .any(|&(_, hole)| !hole)
        {
            return Err(KvError::Invalid(
                "the volume is not empty (a store is created on an empty volume only)".into(),
            ));
        }
        let h = StoreHeader {
            buckets,
            seed: c.seed,
            probe_max: c.probe_max,
        };
        vol.write(0, &h.encode(), true)?;
        Ok(Store::with(vol, h))
    }

    /// Opens the store on `vol`; refuses a volume that is not a store, or
    /// a store whose bucket count or seed differs from `expect`.
    pub fn open(vol: Arc<Volume>, expect: Expect) -> Result<Store> {
        let mut b = vec![0u8; SECTOR_SIZE];
        vol.read(0, &mut b)?;
        let h = StoreHeader::decode(&b)?;
        if let Some(w) = expect.buckets.filter(|&w| w != h.buckets) {
            return Err(KvError::Mismatch {
                what: "bucket count",
                found: h.buckets,
                wanted: w,
            });
        }
        if let Some(w) = expect.seed.filter(|&w| w != h.seed) {
            return Err(KvError::Mismatch {
                what: "hash seed",
                found: h.seed,
                wanted: w,
            });
        }
        if (h.buckets + 1) * SECTOR > vol.size() {
            return Err(KvError::NotAStore(format!(
                "{} buckets do not fit the volume of {} bytes",
                h.buckets,
                vol.size()
            )));
        }
        Ok(Store::with(vol, h))
    }

    fn with(vol: Arc<Volume>, h: StoreHeader) -> Store {
        Store {
            vol,
            h,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    pub fn header(&self) -> StoreHeader {
        self.h
    }

    pub fn volume(&self) -> &Arc<Volume> {
        &self.vol
    }

    /// The home bucket of `key`.
    pub fn home(&self, key: &[u8]) -> u64 {
        xxhash_rust::xxh64::xxh64(key, self.h.seed) % self.h.buckets
    }

    fn check_key(key: &[u8]) -> Result<()> {
        if key.is_empty() {
            return Err(KvError::Invalid("empty key".into()));
        }
        if key.len() > KEY_MAX {
            return Err(KvError::TooLarge {
                what: "key",
                len: key.len(),
                why: format!("keys hold at most {KEY_MAX} bytes"),
            });
        }
        Ok(())
    }

    /// Locks every stripe the chain from `home` may touch.
    fn lock(&self, home: u64) -> Vec<MutexGuard<'_, ()>> {
        let mut ids: Vec<usize> = (0..u64::from(self.h.probe_max))
            .map(|i| ((home + i) % self.h.buckets) as usize % STRIPES)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().map(|i| self.stripes[i].lock()).collect()
    }

    fn read_bucket(&self, i: u64) -> Result<Bucket> {
        let mut b = vec![0u8; SECTOR_SIZE];
        self.vol.read((1 + i) * SECTOR, &mut b)?;
        Bucket::decode(&b).map_err(|why| KvError::CorruptBucket { bucket: i, why })
    }

    fn write_bucket(&self, i: u64, b: &Bucket) -> Result<()> {
        let at = (1 + i) * SECTOR;
        if b.is_empty() {
            self.vol.trim(at, SECTOR, false)?;
        } else {
            self.vol.write(at, &b.encode(), false)?;
        }
        Ok(())
    }

    /// Reads the chain from `home`: every bucket up to the first without
    /// spill, at most probe_max.
    fn chain(&self, home: u64) -> Result<Chain> {
        let mut c = Vec::new();
        for k in 0..u64::from(self.h.probe_max) {
            let i = (home + k) % self.h.buckets;
            let b = self.read_bucket(i)?;
            let spill = b.spill;
            c.push((i, b));
            if !spill {
                break;
            }
        }
        Ok(c)
    }

    /// The value of `key`, if any.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Self::check_key(key)?;
        let home = self.home(key);
        let _g = self.lock(home);
        for k in 0..u64::from(self.h.probe_max) {
            let i = (home + k) % self.h.buckets;
            let b = self.read_bucket(i)?;
            if let Some(j) = b.find(key) {
                return Ok(Some(b.records[j].1.clone()));
            }
            if !b.spill {
                break;
            }
        }
        Ok(None)
    }

    /// Removes the copies after the first (left by a crash), durably.
    fn drop_hidden_copies(&self, key: &[u8], chain: &mut Chain) -> Result<()> {
        let mut first = true;
        let mut changed = false;
        for (i, b) in chain.iter_mut() {
            if let Some(j) = b.find(key) {
                if first {
                    first = false;
                } else {
                    b.records.remove(j);
                    self.write_bucket(*i, b)?;
                    changed = true;
                }
            }
        }
        if changed {
            self.vol.flush()?;
        }
        Ok(())
    }

    /// Stores `value` under `key` (durable after the next flush).
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        Self::check_key(key)?;
        if key.len() + value.len() > RECORD_MAX {
            return Err(KvError::TooLarge {
                what: "key and value",
                len: key.len() + value.len(),
                why: format!("a record holds at most {RECORD_MAX} bytes of key and value"),
            });
        }
        let home = self.home(key);
        let _g = self.lock(home);
        let mut chain = self.chain(home)?;
        self.drop_hidden_copies(key, &mut chain)?;
        let at = chain.iter().position(|(_, b)| b.find(key).is_some());
        if let Some(p) = at {
            let (i, b) = &mut chain[p];
            if b.fits(key, value) {
                let j = b.find(key).expect("found");
                b.records[j].1 = value.to_vec();
                return self.write_bucket(*i, b);
            }
        }
        // A new copy: in the first bucket of the chain with room, extending
        // the chain (spill flags, flushed first) if none has.
        let mut k = 0;
        loop {
            if k == chain.len() {
                if k as u64 == u64::from(self.h.probe_max) {
                    return Err(KvError::Full(format!(
                        "the {} buckets from the key's home bucket {home} are full \
                         (create the store with more buckets)",
                        self.h.probe_max
                    )));
                }
                let (i, b) = chain.last_mut().expect("a chain has a home");
                b.spill = true;
                self.write_bucket(*i, b)?;
                self.vol.flush()?;
                let next = (*i + 1) % self.h.buckets;
                let b = self.read_bucket(next)?;
                chain.push((next, b));
            }
            if Some(k) != at && chain[k].1.fits(key, value) {
                break;
            }
            k += 1;
        }
        let (i, b) = &mut chain[k];
        b.records.push((key.to_vec(), value.to_vec()));
        self.write_bucket(*i, b)?;
        if let Some(p) = at {
            // The old copy goes once the new one is durable.
            self.vol.flush()?;
            let (i, b) = &mut chain[p];
            let j = b.find(key).expect("found");
            b.records.remove(j);
            self.write_bucket(*i, b)?;
        }
        Ok(())
    }

    /// Removes `key`; returns whether it was there (durable after the next
    /// flush).
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        Self::check_key(key)?;
        let home = self.home(key);
        let _g = self.lock(home);
        let mut chain = self.chain(home)?;
        self.drop_hidden_copies(key, &mut chain)?;
        for (i, b) in chain.iter_mut() {
            if let Some(j) = b.find(key) {
                b.records.remove(j);
                self.write_bucket(*i, b)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Makes every put and delete that returned before it durable.
    pub fn flush(&self) -> Result<()> {
        Ok(self.vol.flush()?)
    }

    /// Calls `each` for every bucket's records (a full scan, for checks
    /// and tools); fails on a bucket that does not parse.
    pub fn scan(&self, mut each: impl FnMut(u64, &Bucket)) -> Result<()> {
        let size = (self.h.buckets * SECTOR).min(self.vol.size() - SECTOR);
        let mut at = 0;
        while at < size {
            let runs = self.vol.block_status(SECTOR + at, size - at, 1024)?;
            for (len, hole) in runs {
                if !hole {
                    for s in 0..len / SECTOR {
                        let i = at / SECTOR + s;
                        each(i, &self.read_bucket(i)?);
                    }
                }
                at += len;
            }
        }
        Ok(())
    }
}
