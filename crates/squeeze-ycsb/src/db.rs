//! The stores a run drives, behind one interface: squeeze-kv on a thin
//! squeeze volume, and (with the `rocksdb` feature) RocksDB.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub trait Db: Sync {
    /// A short name for reports ("squeeze-kv", "rocksdb-lz4", ...).
    fn name(&self) -> String;
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()>;
    /// Makes every write before it durable.
    fn sync(&self) -> Result<()>;
    /// Brings the store to its most compact state (RocksDB: a manual
    /// compaction of the whole key range; squeeze: `compact`, cleaning
    /// every segment with a dead byte).
    fn compact(&self) -> Result<()>;
    /// Bytes the store occupies on the host's disk (`du`).
    fn physical_bytes(&self) -> Result<u64>;
    /// Store-specific figures for the report.
    fn details(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}

/// What `du` counts for `p`: allocated blocks of every file below it.
pub fn du(p: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).with_context(|| format!("cannot stat {}", p.display()))?;
    if !m.is_dir() {
        return Ok(m.blocks() * 512);
    }
    let mut sum = 0;
    for e in std::fs::read_dir(p)? {
        sum += du(&e?.path())?;
    }
    Ok(sum)
}

/// squeeze-kv on a thin volume file `DIR/kv.sqz`.
pub struct KvDb {
    // Dropped first: the volume closes (flush, final checkpoint) when its
    // last reference goes.
    store: squeeze_kv::Store,
    vol: Arc<squeeze_engine::Volume>,
    path: PathBuf,
    name: String,
}

impl KvDb {
    /// A new store with `buckets` buckets (a 4 KiB sector each) on a new
    /// volume with the default policy and the maintenance thread running,
    /// as `squeeze kv create` makes it, with `v`; `name` labels its reports.
    pub fn create(
        dir: &Path,
        buckets: u64,
        name: &str,
        v: squeeze_kv::VolumeOptions,
    ) -> Result<KvDb> {
        let path = dir.join("kv.sqz");
        if path.exists() {
            bail!("{} exists: give an empty directory", path.display());
        }
        let vol = squeeze_kv::create_volume_with(&path, buckets, v)?;
        let store = squeeze_kv::Store::create(
            vol.clone(),
            squeeze_kv::CreateStore {
                buckets: Some(buckets),
                ..Default::default()
            },
        )?;
        Ok(KvDb {
            store,
            vol,
            path,
            name: name.to_string(),
        })
    }

    fn store(&self) -> &squeeze_kv::Store {
        &self.store
    }
}

impl Db for KvDb {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.store().get(key)?)
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        Ok(self.store().put(key, value)?)
    }

    fn sync(&self) -> Result<()> {
        Ok(self.store().flush()?)
    }

    fn compact(&self) -> Result<()> {
        self.store().flush()?;
        self.vol.compact(|_, _| {})?;
        Ok(())
    }

    fn physical_bytes(&self) -> Result<u64> {
        du(&self.path)
    }

    fn details(&self) -> serde_json::Value {
        let s = self.vol.stats();
        serde_json::json!({
            "logical_bytes": s.logical_size,
            "mapped_bytes": s.mapped_bytes,
            "stored_bytes": s.stored_bytes,
            "allocated_bytes": s.allocated_bytes,
            "garbage_bytes": s.garbage_bytes,
            "checkpoint_base_bytes": s.checkpoint_base_bytes,
            "checkpoint_delta_bytes": s.checkpoint_delta_bytes,
            "compression_ratio": s.compression_ratio,
            "checkpoints": s.checkpoints,
            "map_memory_bytes": s.map_memory_bytes,
            "map_cache_bytes": s.map_cache_bytes,
            "map_chunks": s.map_chunks,
            "map_paged_chunks": s.map_paged_chunks,
            "map_faults": s.map_faults,
            "map_evictions": s.map_evictions,
            "buckets": self.store().header().buckets,
        })
    }
}

/// How RocksDB compresses its blocks: the seed's three configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RocksCompression {
    None,
    Lz4,
    /// lz4 on every level but the bottommost, zstd there.
    Lz4Zstd,
}

impl std::str::FromStr for RocksCompression {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "none" => RocksCompression::None,
            "lz4" => RocksCompression::Lz4,
            "lz4-zstd" | "lz4+zstd" => RocksCompression::Lz4Zstd,
            _ => bail!("unknown RocksDB compression {s:?} (none, lz4, lz4-zstd)"),
        })
    }
}

impl RocksCompression {
    pub fn label(self) -> &'static str {
        match self {
            RocksCompression::None => "none",
            RocksCompression::Lz4 => "lz4",
            RocksCompression::Lz4Zstd => "lz4-zstd",
        }
    }
}

#[cfg(feature = "rocksdb")]
pub use rocks::RocksDb;

#[cfg(feature = "rocksdb")]
mod rocks {
    use super::{du, Db, RocksCompression};
    use anyhow::Result;
    use rocksdb::{DBCompressionType, Options, WriteOptions, DB};
    use std::path::{Path, PathBuf};

    /// RocksDB with its default options but for compression and the
    /// background jobs (one per core), the WAL on, writes not synced one by
    /// one: `sync` syncs the WAL, on the cadence the run sets for both
    /// stores.
    pub struct RocksDb {
        db: DB,
        path: PathBuf,
        compression: RocksCompression,
        wo: WriteOptions,
    }

    impl RocksDb {
        pub fn create(dir: &Path, compression: RocksCompression) -> Result<RocksDb> {
            let path = dir.join("rocksdb");
            let mut o = Options::default();
            o.create_if_missing(true);
            o.set_error_if_exists(true);
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as i32);
            o.increase_parallelism(cores);
            o.set_max_background_jobs(cores);
            match compression {
                RocksCompression::None => o.set_compression_type(DBCompressionType::None),
                RocksCompression::Lz4 => o.set_compression_type(DBCompressionType::Lz4),
                RocksCompression::Lz4Zstd => {
                    o.set_compression_type(DBCompressionType::Lz4);
                    o.set_bottommost_compression_type(DBCompressionType::Zstd);
                }
            }
            let db = DB::open(&o, &path)?;
            let mut wo = WriteOptions::default();
            wo.set_sync(false);
            Ok(RocksDb {
                db,
                path,
                compression,
                wo,
            })
        }
    }

    impl Db for RocksDb {
        fn name(&self) -> String {
            format!("rocksdb-{}", self.compression.label())
        }

        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
            Ok(self.db.get(key)?)
        }

        fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
            Ok(self.db.put_opt(key, value, &self.wo)?)
        }

        fn sync(&self) -> Result<()> {
            Ok(self.db.flush_wal(true)?)
        }

        fn compact(&self) -> Result<()> {
            self.db.flush()?;
            self.db.compact_range(None::<&[u8]>, None::<&[u8]>);
            Ok(())
        }

        fn physical_bytes(&self) -> Result<u64> {
            du(&self.path)
        }

        fn details(&self) -> serde_json::Value {
            let p = |k: &str| self.db.property_int_value(k).ok().flatten();
            serde_json::json!({
                "live_sst_bytes": p("rocksdb.live-sst-files-size"),
                "block_cache_bytes": p("rocksdb.block-cache-usage"),
                "memtable_bytes": p("rocksdb.cur-size-all-mem-tables"),
                "table_readers_bytes": p("rocksdb.estimate-table-readers-mem"),
            })
        }
    }
}
