//! `Volume::resize` and `Volume::set_max_physical` on a volume in use: a
//! larger size at once, a smaller one only over an unmapped tail; a lower
//! cap only while nothing past it is in use; each change durable (both
//! superblock slots) and kept across a reopen, and a power cut at any of
//! its writes leaves the old or the new value with every flushed byte.

mod common;
use common::*;
use squeeze_engine::error::Invalid;
use squeeze_engine::{EngineError, SimFaults, SimStorage, Volume};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

#[test]
fn grow_then_shrink_over_an_unmapped_tail() {
    let (s, v) = sim_volume(8 * MIB, None);
    let a = data(&mut rng(1), 3, MIB as usize);
    v.write(7 * MIB, &a, false).unwrap();
    assert!(matches!(
        v.write(8 * MIB, &a, false),
        Err(EngineError::OutOfRange { .. })
    ));
    v.resize(16 * MIB).unwrap();
    assert_eq!(v.size(), 16 * MIB);
    v.write(15 * MIB, &a, false).unwrap();
    // A record across the coming end, whose tail part is trimmed below:
    // after the shrink its head must survive a crash (replay would refuse
    // the whole record as past the end).
    let b = data(&mut rng(4), 3, 128 << 10);
    v.write(12 * MIB - (64 << 10), &b, false).unwrap();
    v.flush().unwrap();
    // Mapped past the new end: refused, naming the first mapped byte.
    let e = v.resize(12 * MIB).unwrap_err().to_string();
    assert!(e.contains(&format!("byte {}", 12 * MIB)), "{e}");
    assert_eq!(v.size(), 16 * MIB);
    // Trimmed, the tail goes.
    v.trim(12 * MIB, 4 * MIB, false).unwrap();
    v.resize(12 * MIB).unwrap();
    assert!(matches!(
        v.read(12 * MIB, &mut [0u8; 4096]),
        Err(EngineError::OutOfRange { .. })
    ));
    // Bad sizes.
    assert!(matches!(
        v.resize(0),
        Err(EngineError::Invalid(Invalid::SizeNotAligned { bytes: 0 }))
    ));
    assert!(matches!(
        v.resize(MIB + 1),
        Err(EngineError::Invalid(Invalid::SizeNotAligned { .. }))
    ));
    // Killed before any checkpoint after the shrink: the chain still holds
    // the tail's runs (mapped in an older piece, unmapped in a later one),
    // past the new end; the volume opens all the same.
    v.flush().unwrap();
    let img = Arc::new(s.kill());
    drop(v);
    let v = reopen(&img);
    assert_eq!(v.size(), 12 * MIB);
    let mut got = vec![0u8; MIB as usize];
    v.read(7 * MIB, &mut got).unwrap();
    assert!(got == a);
    let mut head = vec![0u8; 64 << 10];
    v.read(12 * MIB - (64 << 10), &mut head).unwrap();
    assert!(
        head[..] == b[..64 << 10],
        "the record across the new end lost its head"
    );
    assert!(squeeze_engine::check::check(&v, |_, _| {}).is_clean());
}

#[test]
fn the_cap_moves_but_not_below_what_is_in_use() {
    let s = Arc::new(SimStorage::new());
    let mut o = small_opts(64 * MIB);
    o.max_physical = 8 * MIB;
    Volume::create(s.clone(), &o).unwrap().close().unwrap();
    let v = reopen(&s);
    // Fill until the cap refuses: incompressible data.
    let (_, full) = write_until_error(&v, &mut rng(2), 0, 64 * MIB);
    assert!(matches!(full, EngineError::NoSpace(_)), "{full}");
    let d = data(&mut rng(3), 1, 4 * MIB as usize);
    // Lower than what is in use: refused, nothing changes.
    let e = v.set_max_physical(4 * MIB).unwrap_err().to_string();
    assert!(e.contains("in use"), "{e}");
    assert_eq!(v.superblock().max_physical, 8 * MIB);
    // Raised: writes go on.
    v.set_max_physical(32 * MIB).unwrap();
    v.write(40 * MIB, &d, false).unwrap();
    v.flush().unwrap();
    // No cap at all, and back to one above what is used.
    v.set_max_physical(0).unwrap();
    v.set_max_physical(48 * MIB).unwrap();
    assert!(matches!(
        v.set_max_physical(MIB),
        Err(EngineError::Invalid(_))
    ));
    v.close().unwrap();
    let v = reopen(&s);
    assert_eq!(v.superblock().max_physical, 48 * MIB);
    let mut got = vec![0u8; d.len()];
    v.read(40 * MIB, &mut got).unwrap();
    assert!(got == d);
    assert!(squeeze_engine::check::check(&v, |_, _| {}).is_clean());
}

/// A power cut at each write of a resize (its two superblock writes) and
/// of a cap change: the volume opens with the old or the new value, and
/// what was flushed before reads back.
#[test]
fn a_power_cut_during_a_resize_keeps_the_old_or_the_new_size() {
    for cut in 1..=3 {
        for change in ["grow", "cap"] {
            let (s, v) = sim_volume(8 * MIB, None);
            let a = data(&mut rng(cut), 3, MIB as usize);
            v.write(MIB, &a, false).unwrap();
            v.flush().unwrap();
            s.set_faults(SimFaults {
                crash_at_write: Some(cut),
                ..Default::default()
            });
            let r = match change {
                "grow" => v.resize(32 * MIB),
                _ => v.set_max_physical(64 * MIB),
            };
            let dead = s.is_dead();
            drop(v);
            let img = Arc::new(s.crash(&mut rng(cut)));
            let v = Volume::open(img, Default::default())
                .unwrap_or_else(|e| panic!("{change}, cut at write {cut}: {e}"));
            let (size, cap) = (v.size(), v.superblock().max_physical);
            match change {
                "grow" => assert!(size == 8 * MIB || size == 32 * MIB, "{size}"),
                _ => assert!(cap == 0 || cap == 64 * MIB, "{cap}"),
            }
            if r.is_ok() && !dead {
                match change {
                    "grow" => assert_eq!(size, 32 * MIB, "acknowledged, then lost"),
                    _ => assert_eq!(cap, 64 * MIB, "acknowledged, then lost"),
                }
            }
            let mut got = vec![0u8; MIB as usize];
            v.read(MIB, &mut got).unwrap();
            assert!(got == a, "{change}, cut at write {cut}: flushed data lost");
        }
    }
}

/// Superblock writes beside checkpoints (the cap, the policy and the size
/// changed from one thread while another writes checkpoints): each
/// checkpoint's piece is named by the superblock of the generation it was
/// written with (a cap change between a piece and the superblock write
/// naming it once tripped the engine's check of that), and the volume
/// reopens with every flushed byte and the last settings.
#[test]
fn superblock_writes_beside_checkpoints() {
    let (s, v) = sim_volume(8 * MIB, None);
    let v = Arc::new(v);
    let a = data(&mut rng(9), 3, MIB as usize);
    let writer = {
        let v = v.clone();
        let a = a.clone();
        std::thread::spawn(move || {
            for i in 0..300u64 {
                v.write((i % 8) * MIB, &a[..64 << 10], false).unwrap();
                v.checkpoint().unwrap();
            }
        })
    };
    let cap = 64 * MIB;
    let mut policy = v.policy();
    for i in 0..300u64 {
        v.set_max_physical(if i % 2 == 0 { cap } else { 0 })
            .unwrap();
        policy.level = 1 + (i % 3) as i32;
        v.set_policy(policy).unwrap();
        v.resize((8 + i % 2) * MIB).unwrap();
    }
    writer.join().unwrap();
    v.resize(8 * MIB).unwrap();
    v.flush().unwrap();
    let gen = v.superblock().generation;
    let v = Arc::try_unwrap(v).ok().unwrap();
    v.close().unwrap();
    let v = reopen(&s);
    assert!(v.superblock().generation > gen);
    assert_eq!(v.policy().level, policy.level);
    let mut b = vec![0u8; 64 << 10];
    v.read(0, &mut b).unwrap();
    assert!(b == a[..64 << 10]);
}
