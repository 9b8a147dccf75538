//! Dedup mode idle (docs/DEDUP.md): the mode and index budget are kept in
//! the superblock and survive a reopen; with mode off the idle pass does
//! nothing; with mode idle it runs a step at a time, stops between windows
//! and resumes from its cursor (kept by checkpoints, so across a reopen
//! too), runs again only after enough new writes; and the maintenance
//! thread runs it by itself once clients are idle. Clients read the same
//! bytes throughout.

mod common;
use common::*;
use squeeze_engine::dedup::IdleStep;
use squeeze_engine::{
    DedupMode, DedupSettings, OpenOptions, SettingsChange, SimStorage, Volume, SECTOR_SIZE,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const S: u64 = SECTOR_SIZE as u64;

fn read(v: &Volume, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    v.read(at, &mut b).unwrap();
    b
}

fn idle(index_mib: u32) -> SettingsChange {
    SettingsChange {
        dedup: Some(DedupSettings {
            mode: DedupMode::Idle,
            index_mib,
        }),
        ..Default::default()
    }
}

/// A 1 MiB content at 0, 8 MiB and 16 MiB of a 32 MiB volume, flushed.
fn with_copies(v: &Volume) -> Vec<u8> {
    let mut r = rng(7);
    let size = v.size() as usize;
    let mut model = vec![0u8; size];
    let a = data(&mut r, 3, 1 << 20);
    for at in [0usize, 8 << 20, 16 << 20] {
        v.write(at as u64, &a, false).unwrap();
        model[at..at + a.len()].copy_from_slice(&a);
    }
    v.flush().unwrap();
    model
}

#[test]
fn mode_off_does_nothing_and_the_settings_survive_a_reopen() {
    let (s, v) = sim_volume(32 << 20, None);
    assert_eq!(v.dedup_settings(), DedupSettings::default());
    let model = with_copies(&v);
    assert!(matches!(
        v.dedup_idle_step(u64::MAX).unwrap(),
        IdleStep::Nothing
    ));
    assert_eq!(v.stats().dedup_linked_sectors, 0);
    assert_eq!(v.stats().dedup_mode, "off");
    v.set_settings(idle(64)).unwrap();
    let st = v.stats();
    assert_eq!(st.dedup_mode, "idle");
    assert_eq!(st.dedup_index_bytes, 64 << 20);
    v.close().unwrap();
    let v = reopen(&s);
    assert_eq!(
        v.dedup_settings(),
        DedupSettings {
            mode: DedupMode::Idle,
            index_mib: 64
        }
    );
    assert_eq!(v.superblock().dedup.mode, DedupMode::Idle);
    assert!(read(&v, 0, model.len()) == model);
    // Back to off: nothing runs.
    v.set_settings(SettingsChange {
        dedup: Some(DedupSettings::default()),
        ..Default::default()
    })
    .unwrap();
    assert!(matches!(
        v.dedup_idle_step(u64::MAX).unwrap(),
        IdleStep::Nothing
    ));
    v.close().unwrap();
    assert_eq!(reopen(&s).dedup_settings().mode, DedupMode::Off);
}

#[test]
fn the_idle_pass_stops_between_windows_resumes_from_its_cursor_and_waits_for_new_writes() {
    let (s, v) = sim_volume(32 << 20, None);
    let model = with_copies(&v);
    v.set_settings(idle(0)).unwrap();
    // One window, then another: the cursor moves on from where it stopped.
    let IdleStep::Stopped { at: first } = v.dedup_idle_step(1).unwrap() else {
        panic!("one window of a 32 MiB volume is not the whole pass");
    };
    assert!(first > 0);
    assert_eq!(v.stats().dedup_idle_cursor, first);
    let IdleStep::Stopped { at: second } = v.dedup_idle_step(1).unwrap() else {
        panic!("two windows are not the whole pass");
    };
    assert!(
        second > first,
        "{second} after {first}: resumed from LBA 0?"
    );
    // The cursor outlives the volume's run: a checkpoint keeps it.
    v.close().unwrap();
    let v = reopen(&s);
    assert_eq!(v.stats().dedup_idle_cursor, second);
    let mut linked = 0;
    let rep = loop {
        match v.dedup_idle_step(u64::MAX).unwrap() {
            IdleStep::Stopped { at } => assert!(at > second),
            IdleStep::Finished(rep) => break rep,
            IdleStep::Nothing => panic!("a pass under way is not finished"),
        }
    };
    linked += rep.sectors_linked;
    // The copies at 8 and 16 MiB lie past the cursor: shared (the one at 0
    // was read before the reopen, into an index that is gone; the copy
    // at 16 MiB finds the one at 8 MiB).
    assert!(linked >= 256, "{rep:?}");
    let st = v.stats();
    assert_eq!(st.dedup_idle_passes, 1);
    assert_eq!(st.dedup_idle_cursor, 0);
    assert_eq!(st.dedup_idle_linked_sectors, linked);
    assert!(st.dedup_saved_bytes >= 256 * S);
    assert!(read(&v, 0, model.len()) == model);
    v.verify_accounting().unwrap();
    // Nothing written since: no pass.
    assert!(matches!(
        v.dedup_idle_step(u64::MAX).unwrap(),
        IdleStep::Nothing
    ));
    // A little written (under a quarter of the mapped bytes): still none.
    v.write(20 << 20, &vec![7u8; 4096], false).unwrap();
    assert!(matches!(
        v.dedup_idle_step(u64::MAX).unwrap(),
        IdleStep::Nothing
    ));
    // A copy of the first MiB again, elsewhere: a pass, which shares it.
    let a = model[..1 << 20].to_vec();
    v.write(24 << 20, &a, false).unwrap();
    let rep = loop {
        match v.dedup_idle_step(u64::MAX).unwrap() {
            IdleStep::Stopped { .. } => {}
            IdleStep::Finished(rep) => break rep,
            IdleStep::Nothing => panic!("a MiB written over 3 mapped: a pass is due"),
        }
    };
    assert!(rep.sectors_linked >= 256, "{rep:?}");
    assert_eq!(v.stats().dedup_idle_passes, 2);
    assert!(read(&v, 24 << 20, 1 << 20) == a);
    v.verify_accounting().unwrap();
}

#[test]
fn the_maintenance_thread_deduplicates_an_idle_volume_in_mode_idle() {
    let s = Arc::new(SimStorage::new());
    let mut o = small_opts(32 << 20);
    o.dedup = DedupSettings {
        mode: DedupMode::Idle,
        index_mib: 16,
    };
    let open = OpenOptions {
        background: true,
        ..Default::default()
    };
    let v = Volume::create_with(s.clone(), &o, open).unwrap();
    let model = with_copies(&v);
    // Clients away: within a few seconds (idle after 1 s) a pass has run.
    let t0 = Instant::now();
    while v.stats().dedup_idle_passes == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no idle pass in 60 s: {:?}",
            v.stats().dedup_idle_linked_sectors
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = v.stats();
    assert!(st.dedup_idle_linked_sectors >= 2 * 256, "{st:?}");
    assert_eq!(st.dedup_references, 3 * 256);
    assert!(read(&v, 0, model.len()) == model);
    v.close().unwrap();
    let v = reopen(&s);
    assert!(read(&v, 0, model.len()) == model);
    assert_eq!(v.stats().dedup_idle_passes, 1);
}
