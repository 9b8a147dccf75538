//! The adaptive codec's raw rung in the engine (`pipeline::burst`): with
//! the cores saturated (as the test's CPU source says) client writes step
//! from the target to lz4 and then to raw, counted as stored raw; the
//! upgrade then brings them to the target's ratio; the room rule bounds
//! how much goes raw under `--max-physical`; the old floor (lz4) never
//! stores raw.

mod common;
use common::*;
use squeeze_codec::CpuPool;
use squeeze_engine::pipeline::adapt::Why;
use squeeze_engine::pipeline::burst::BurstFloor;
use squeeze_engine::{OpenOptions, SimStorage, Volume};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

const MIB: usize = 1 << 20;

/// A volume on the default policy (zstd:3), 4 MiB segments, `cap` bytes of
/// --max-physical (0: none), an idle two-thread pool, cores `busy`.
fn volume(busy: f64, cap: u64, floor: BurstFloor) -> Volume {
    let s = Arc::new(SimStorage::new());
    let mut o = small_opts(256 * MIB as u64);
    o.segment_size = 4 << 20;
    o.max_physical = cap;
    Volume::create(s.clone(), &o).unwrap().close().unwrap();
    Volume::open(
        s,
        OpenOptions {
            engine: Some(Arc::new(CpuPool::new(2))),
            adapt_cpu: Some(Arc::new(Busy(busy, Default::default()))),
            burst_floor: floor,
            ..Default::default()
        },
    )
    .unwrap()
}

/// A writer of 1 MiB blocks of fio-like data (about 2.5:1 with zstd:3)
/// over the first `span` MiB, with the model of what each MiB holds.
struct Writer {
    datas: Vec<Vec<u8>>,
    model: BTreeMap<u64, usize>,
    k: usize,
    span: usize,
}

impl Writer {
    fn new(span: usize) -> Writer {
        Writer {
            datas: (0..8)
                .map(|k| squeeze_codec::testdata::fio_like(MIB, 60, 4096, k))
                .collect(),
            model: BTreeMap::new(),
            k: 0,
            span,
        }
    }

    fn write(&mut self, v: &Volume) {
        let off = (self.k % self.span * MIB) as u64;
        v.write(off, &self.datas[self.k % 8], false).unwrap();
        self.model.insert(off, self.k % 8);
        self.k += 1;
    }

    /// Writes until the last batch got `alg` (at most 30 s).
    fn until(&mut self, v: &Volume, alg: &str) {
        let t = Instant::now();
        while v.stats().write_algorithm != alg {
            assert!(
                t.elapsed().as_secs() < 30,
                "never reached {alg}: {:?}",
                v.stats()
            );
            for _ in 0..4 {
                self.write(v);
            }
        }
    }

    fn check(&self, v: &Volume) {
        for (off, d) in &self.model {
            let mut got = vec![0u8; MIB];
            v.read(*off, &mut got).unwrap();
            assert!(got == self.datas[*d], "MiB at {off} differs");
        }
    }
}

#[test]
fn saturated_cores_store_raw_and_the_upgrade_restores_the_target() {
    let v = volume(0.99, 0, BurstFloor::Raw);
    let mut w = Writer::new(200);
    // The target, then lz4 after the CPU law's hold, then raw after
    // another.
    w.until(&v, "lz4");
    w.until(&v, "none");
    for _ in 0..16 {
        w.write(&v);
    }
    let st = v.stats();
    assert_eq!(st.write_algorithm_why, Some(Why::Cpu), "{st:?}");
    assert_eq!(st.burst_floor, "raw");
    assert!(st.burst_raw_room_open, "{st:?}");
    assert!(st.burst_raw_bytes >= 16 * MIB as u64, "{st:?}");
    assert!(st.burst_raw_pending_bytes >= 16 * MIB as u64, "{st:?}");
    assert!(st.bytes_per_algorithm["none"] >= 16 * MIB as u64, "{st:?}");
    assert!(st.below_target_bytes >= st.burst_raw_bytes, "{st:?}");
    assert_eq!(st.burst_raw_upgraded_bytes, 0);
    w.check(&v);
    // The upgrade brings every such byte to the target: nothing pending,
    // and the volume stores what zstd:3 alone would (the same data on a
    // volume whose cores were idle).
    v.flush().unwrap();
    while v.upgrade_pass().unwrap().is_some() {}
    v.checkpoint().unwrap();
    let st = v.stats();
    assert_eq!(st.below_target_pending_bytes, 0, "{st:?}");
    assert_eq!(st.burst_raw_pending_bytes, 0, "{st:?}");
    assert!(st.burst_raw_upgraded_bytes >= 16 * MIB as u64, "{st:?}");
    w.check(&v);
    let idle = volume(0.1, 0, BurstFloor::Raw);
    for (&off, &d) in &w.model {
        idle.write(off, &w.datas[d], false).unwrap();
    }
    let base = idle.stats();
    assert_eq!(base.burst_raw_bytes, 0);
    assert_eq!(base.mapped_bytes, st.mapped_bytes);
    assert!(
        st.stored_bytes as f64 <= 1.02 * base.stored_bytes as f64,
        "upgraded {} against the target's {}",
        st.stored_bytes,
        base.stored_bytes
    );
    v.close().unwrap();
    idle.close().unwrap();
}

#[test]
fn the_room_rule_bounds_the_burst_under_a_cap() {
    // 96 MiB of cap: a quarter of the room goes raw, the rest of the
    // burst lz4; the volume never runs out of room.
    let cap = 96 * MIB as u64;
    let v = volume(0.99, cap, BurstFloor::Raw);
    let room_before = v.stats().free_physical_bytes;
    let mut w = Writer::new(48);
    w.until(&v, "lz4");
    w.until(&v, "none");
    let t = Instant::now();
    while v.stats().write_algorithm == "none" {
        assert!(t.elapsed().as_secs() < 30, "raw forever: {:?}", v.stats());
        w.write(&v);
    }
    let st = v.stats();
    assert_eq!(st.write_algorithm, "lz4", "{st:?}");
    assert!(!st.burst_raw_room_open, "{st:?}");
    // At most a quarter of the room, plus the batch that crossed it.
    assert!(
        st.burst_raw_pending_bytes <= room_before / 4 + MIB as u64,
        "{} raw of {room_before}",
        st.burst_raw_pending_bytes
    );
    // (How much of it depends on the room left when the law reached raw:
    // the exact rule is `pipeline::burst`'s unit tests'.)
    assert!(st.burst_raw_pending_bytes > 0, "{st:?}");
    // The burst goes on at lz4: no more raw, writes still succeed.
    let raw = st.burst_raw_bytes;
    for _ in 0..32 {
        w.write(&v);
    }
    let st = v.stats();
    assert_eq!(st.burst_raw_bytes, raw, "{st:?}");
    assert_eq!(st.write_algorithm, "lz4");
    w.check(&v);
    v.close().unwrap();
}

#[test]
fn the_lz4_floor_never_stores_raw_and_can_be_set_on_an_open_volume() {
    let v = volume(0.99, 0, BurstFloor::Lz4);
    let mut w = Writer::new(64);
    w.until(&v, "lz4");
    // Well past two down-holds of saturated cores.
    let t = Instant::now();
    while t.elapsed().as_millis() < 800 {
        w.write(&v);
    }
    let st = v.stats();
    assert_eq!(st.write_algorithm, "lz4", "{st:?}");
    assert_eq!(st.burst_floor, "lz4");
    assert_eq!(st.burst_raw_bytes, 0, "{st:?}");
    assert_eq!(st.bytes_per_algorithm["none"], 0, "{st:?}");
    // Raw allowed now: raw after the law's hold; lz4 again from the next
    // batch once the old floor is back.
    assert_eq!(v.set_burst_floor(BurstFloor::Raw), Some(BurstFloor::Raw));
    w.until(&v, "none");
    assert_eq!(v.set_burst_floor(BurstFloor::Lz4), Some(BurstFloor::Lz4));
    w.write(&v);
    let st = v.stats();
    assert_eq!(st.write_algorithm, "lz4", "{st:?}");
    let raw = st.burst_raw_bytes;
    for _ in 0..16 {
        w.write(&v);
    }
    assert_eq!(v.stats().burst_raw_bytes, raw);
    w.check(&v);
    v.close().unwrap();
}
