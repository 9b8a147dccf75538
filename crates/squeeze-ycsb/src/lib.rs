//! squeeze-ycsb: YCSB's core workloads, one seeded operation stream fed to
//! squeeze-kv and to RocksDB (issue 17's comparison, as the KallaxDB seed
//! ran it). The driver is a library so its generators are tested with the
//! workspace; the `squeeze-ycsb` binary runs one store per process.

pub mod db;
pub mod generator;
pub mod runner;
pub mod workload;
