//! Tests of the adaptive codec ([`super`]): the laws together, the floor,
//! the cost model's skip and veto, deferred compression.

use super::*;

fn alg(s: &str) -> Algorithm {
    Algorithm::parse(s).unwrap()
}

#[test]
fn ladders() {
    assert_eq!(
        ladder(alg("zstd:3")),
        vec![alg("zstd:3"), alg("zstd:1"), alg("lz4")]
    );
    assert_eq!(ladder(alg("zstd:1")), vec![alg("zstd:1"), alg("lz4")]);
    // zstd's default level in squeeze is 1: no zstd:1 rung under it.
    assert_eq!(ladder(alg("zstd")), vec![alg("zstd"), alg("lz4")]);
    assert_eq!(
        ladder(alg("deflate:6")),
        vec![alg("deflate:6"), alg("deflate:1"), alg("lz4")]
    );
    assert_eq!(ladder(alg("lz4")), vec![alg("lz4")]);
    assert_eq!(ladder(alg("snappy")), vec![alg("snappy"), alg("lz4")]);
    assert_eq!(ladder(alg("none")), vec![alg("none")]);
}

/// A busy source that answers what it is told.
struct Fixed(Mutex<Option<f64>>);
impl BusySource for Fixed {
    fn busy(&self) -> Option<f64> {
        *self.0.lock()
    }
}

#[test]
fn the_faster_rung_of_the_two_laws_wins_and_says_why() {
    let idle_engine = squeeze_codec::CpuPool::new(1);
    let src = Arc::new(Fixed(Mutex::new(Some(0.99))));
    let a = AdaptiveCodec::new(
        alg("zstd:3"),
        AdaptConfig {
            law: LAW_DEFAULT,
            cpu: Some(src.clone()),
            defer: false,
            floor: BurstFloor::Raw,
        },
    );
    // A full volume: no room for the raw rung.
    let full = || RoomReading::default();
    assert_eq!(a.current(), alg("zstd:3"));
    assert_eq!(a.why(), Why::Target);
    let t = Instant::now();
    // Straight from the target to the ladder's fastest: zstd:1 never.
    loop {
        let got = a.choose(&idle_engine, 0, &full);
        if got == alg("lz4") {
            break;
        }
        assert_eq!(got, alg("zstd:3"));
        assert!(t.elapsed().as_secs() < 10, "never stepped down");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(a.why(), Why::Cpu);
    assert_eq!(a.cpu_busy(), Some(0.99));
    // No reading: the rung holds.
    *src.0.lock() = None;
    assert_eq!(a.choose(&idle_engine, 0, &full), alg("lz4"));
    assert!(!a.raw_room_open());
    // Without a CPU source only the backlog counts: an idle engine
    // gets the target, and nothing is read.
    let b = AdaptiveCodec::new(alg("zstd:3"), AdaptConfig::backlog(LAW_DEFAULT));
    assert_eq!(b.choose(&idle_engine, 0, &full), alg("zstd:3"));
    assert_eq!(b.cpu_busy(), None);
    assert_eq!(b.why(), Why::Target);
}

/// Calls `choose` every 10 ms until it returns `want` (at most 10 s).
fn until(a: &AdaptiveCodec, room: &dyn Fn() -> RoomReading, want: Algorithm) {
    let idle_engine = squeeze_codec::CpuPool::new(1);
    let t = Instant::now();
    while a.choose(&idle_engine, 0, room) != want {
        assert!(t.elapsed().as_secs() < 10, "never reached {want}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn saturated_cores_with_room_store_raw_below_lz4() {
    let src = Arc::new(Fixed(Mutex::new(Some(0.99))));
    let config = AdaptConfig {
        cpu: Some(src.clone()),
        ..AdaptConfig::backlog(LAW_DEFAULT)
    };
    let a = AdaptiveCodec::new(alg("zstd:3"), config.clone());
    assert!(a.has_raw_rung());
    let room = Mutex::new(RoomReading {
        free_bytes: 1 << 30,
        pending_raw_bytes: 0,
    });
    let read = || *room.lock();
    // The target, lz4, then raw: zstd:1 never, lz4 on the way.
    until(&a, &read, alg("lz4"));
    until(&a, &read, alg("none"));
    assert_eq!(a.why(), Why::Cpu);
    assert_eq!(a.current(), alg("none"));
    // The burst takes its quarter: lz4 from the next batch, and it
    // stays lz4 while the pending bytes are above half the allowance.
    *room.lock() = RoomReading {
        free_bytes: 768 << 20,
        pending_raw_bytes: 256 << 20,
    };
    let idle_engine = squeeze_codec::CpuPool::new(1);
    assert_eq!(a.choose(&idle_engine, 0, &read), alg("lz4"));
    assert!(!a.raw_room_open());
    *room.lock() = RoomReading {
        free_bytes: 800 << 20,
        pending_raw_bytes: 200 << 20,
    };
    for _ in 0..20 {
        assert_eq!(a.choose(&idle_engine, 0, &read), alg("lz4"));
    }
    // The upgrade brought the pending bytes down: raw again.
    *room.lock() = RoomReading {
        free_bytes: 900 << 20,
        pending_raw_bytes: 100 << 20,
    };
    until(&a, &read, alg("none"));
    // The old floor, set while at raw: lz4 from the next batch on,
    // whatever the room.
    a.set_floor(BurstFloor::Lz4);
    assert!(!a.has_raw_rung());
    for _ in 0..20 {
        assert_eq!(a.choose(&idle_engine, 0, &read), alg("lz4"));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // An lz4 target's raw rung is right under it.
    let b = AdaptiveCodec::new(alg("lz4"), config.clone());
    until(&b, &read, alg("none"));
    // And a target of none has none under it.
    let c = AdaptiveCodec::new(alg("none"), config);
    assert!(!c.has_raw_rung());
    for _ in 0..30 {
        assert_eq!(c.choose(&idle_engine, 0, &read), alg("none"));
        assert_eq!(c.why(), Why::Target);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A busy source on 2 cores that answers what it is told.
struct Two(Mutex<f64>);
impl BusySource for Two {
    fn busy(&self) -> Option<f64> {
        Some(*self.0.lock())
    }
    fn cores(&self) -> f64 {
        2.0
    }
}

/// Calls `choose` every 10 ms, the client writing `rate` bytes per ns
/// of the clock, until `done` says so (at most `secs`); returns every
/// algorithm chosen.
fn drive(
    a: &AdaptiveCodec,
    room: &dyn Fn() -> RoomReading,
    rate: f64,
    written: &mut u64,
    secs: u64,
    done: &dyn Fn(Algorithm) -> bool,
) -> Vec<Algorithm> {
    let idle_engine = squeeze_codec::CpuPool::new(1);
    let t = Instant::now();
    let start = *written;
    let mut got = Vec::new();
    loop {
        *written = start + (t.elapsed().as_nanos() as f64 * rate) as u64;
        let alg = a.choose(&idle_engine, *written, room);
        got.push(alg);
        if done(alg) || t.elapsed().as_secs() >= secs {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A zstd:3 target on [`Two`] cores read 99% busy, with room for raw.
fn on_two_saturated_cores() -> (Arc<Two>, AdaptiveCodec) {
    let src = Arc::new(Two(Mutex::new(0.99)));
    let config = AdaptConfig {
        cpu: Some(src.clone()),
        ..AdaptConfig::backlog(LAW_DEFAULT)
    };
    (src, AdaptiveCodec::new(alg("zstd:3"), config))
}

/// A terabyte free and nothing pending: the raw rung is always open.
const ROOM: fn() -> RoomReading = || RoomReading {
    free_bytes: 1 << 40,
    pending_raw_bytes: 0,
};

#[test]
fn the_cost_model_skips_lz4_and_vetoes_probes_bound_to_fail() {
    let (src, a) = on_two_saturated_cores();
    // Measured by earlier batches: the target costs 5 ns a byte, lz4 2.5.
    a.record(alg("zstd:3"), 1 << 20, 5 << 20);
    a.record(alg("lz4"), 1 << 20, 5 << 19);
    // A client at 1 GB/s on 2 saturated cores: lz4 would take 1.25
    // cores of the 2 by itself, so from the target straight to raw.
    let mut written = 0;
    let got = drive(&a, &ROOM, 1.0, &mut written, 10, &|g| g == alg("none"));
    assert_eq!(got.last(), Some(&alg("none")), "never stored raw");
    assert!(!got.contains(&alg("lz4")), "{got:?}");
    assert_eq!(a.skipped_rungs(), 1);
    assert_eq!(a.why(), Why::Cpu);
    // At raw the cores are 60% busy, below the law's up threshold, but
    // lz4 at the client's rate would saturate them: no probe, for
    // longer than the law's up-hold.
    *src.0.lock() = 0.6;
    let hold = HEADROOM_LAW.up_hold_min_ns.div_ceil(1_000_000_000) + 1;
    let got = drive(&a, &ROOM, 1.0, &mut written, hold, &|g| g != alg("none"));
    assert!(got.iter().all(|&g| g == alg("none")), "{got:?}");
    assert!(a.vetoed_probes() > 0);
    // The client stops: lz4 fits now, and the probe comes.
    let got = drive(&a, &ROOM, 0.0, &mut written, 10, &|g| g != alg("none"));
    assert_eq!(got.last(), Some(&alg("lz4")), "{got:?}");
}

#[test]
fn without_a_measured_cost_the_law_goes_through_lz4_and_probes() {
    // lz4 never measured (only the target was): no prediction for it, the
    // law alone (as before the model): the target, lz4, raw; then a probe
    // of lz4 after the hold, however expensive the target is.
    let (src, a) = on_two_saturated_cores();
    a.record(alg("zstd:3"), 1 << 20, 50 << 20);
    let mut written = 0;
    let got = drive(&a, &ROOM, 1.0, &mut written, 10, &|g| g == alg("none"));
    assert!(got.contains(&alg("lz4")), "{got:?}");
    assert_eq!(got.last(), Some(&alg("none")));
    *src.0.lock() = 0.6;
    let got = drive(&a, &ROOM, 1.0, &mut written, 10, &|g| g != alg("none"));
    assert_eq!(got.last(), Some(&alg("lz4")), "{got:?}");
    assert_eq!((a.skipped_rungs(), a.vetoed_probes()), (0, 0));
}

#[test]
fn deferred_compression_takes_the_fastest_rung_whatever_the_signals() {
    // An idle engine and idle cores: the laws would give the target.
    let idle_engine = squeeze_codec::CpuPool::new(1);
    let src = Arc::new(Fixed(Mutex::new(Some(0.0))));
    let a = AdaptiveCodec::new(
        alg("zstd:3"),
        AdaptConfig {
            law: LAW_DEFAULT,
            cpu: Some(src),
            defer: true,
            floor: BurstFloor::Raw,
        },
    );
    for _ in 0..3 {
        assert_eq!(a.choose(&idle_engine, 0, &RoomReading::default), alg("lz4"));
        assert_eq!(a.why(), Why::Deferred);
        assert_eq!(a.current(), alg("lz4"));
    }
    // An lz4 target has no rung under it: it is its own.
    let b = AdaptiveCodec::new(
        alg("lz4"),
        AdaptConfig {
            defer: true,
            ..AdaptConfig::backlog(LAW_DEFAULT)
        },
    );
    assert_eq!(b.choose(&idle_engine, 0, &RoomReading::default), alg("lz4"));
    assert_eq!(b.why(), Why::Target);
}
