//! Group commit: many threads append at once; every record comes back once,
//! in seq order, with its payload; the leader writes several records per
//! flush; a reopen finds them all and appends after them.

mod common;
use common::*;
use squeeze_wal::{Layout, Wal};
use std::collections::HashMap;
use std::sync::Arc;

fn run(layout: Layout) {
    let (disk, vol) = sim_volume(256 << 20);
    let wal = Arc::new(Wal::create(vol.clone(), layout).unwrap());
    let threads: u32 = 8;
    let per: u64 = 200;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                let mut r = rng(t as u64);
                let mut mine = Vec::new();
                for n in 0..per {
                    let len = [20usize, 128, 700, 5000][(n % 4) as usize];
                    let p = payload(&mut r, t, n, len);
                    let lsn = wal.append(&p).unwrap();
                    mine.push((lsn, p));
                }
                mine
            })
        })
        .collect();
    let mut acked = HashMap::new();
    for h in handles {
        for (lsn, p) in h.join().unwrap() {
            assert!(acked.insert(lsn.seq, (lsn, p)).is_none(), "seq given twice");
        }
    }
    let st = wal.stats();
    assert_eq!(st.records, u64::from(threads) * per);
    assert!(
        st.groups < st.records,
        "{layout:?}: {} groups for {} records: no group commit",
        st.groups,
        st.records
    );
    let mut seen = 0u64;
    wal.read_all(|lsn, p| {
        let (l, want) = &acked[&lsn.seq];
        assert_eq!(*l, lsn);
        assert_eq!(want.as_slice(), p);
        assert_eq!(lsn.seq, seen);
        seen += 1;
    })
    .unwrap();
    assert_eq!(seen, u64::from(threads) * per);
    drop(wal);
    // A clean reopen finds everything; the next record follows.
    Arc::try_unwrap(vol).ok().unwrap().close().unwrap();
    let vol = open_volume(&disk).unwrap();
    let (wal, got) = open_log(&vol, layout).unwrap();
    assert_eq!(got.len(), (u64::from(threads) * per) as usize);
    for (lsn, p) in &got {
        assert_eq!(acked[&lsn.seq].1, *p);
    }
    let lsn = wal.append(b"after reopen").unwrap();
    assert_eq!(lsn.seq, u64::from(threads) * per);
    if layout == Layout::Sparse {
        assert_eq!(lsn.pos % 4096, 0, "a sparse commit starts a sector");
    }
}

#[test]
fn dense_group_commit() {
    run(Layout::Dense);
}

#[test]
fn sparse_group_commit() {
    run(Layout::Sparse);
}

#[test]
fn layouts_place_commits_as_documented() {
    for layout in LAYOUTS {
        let (_d, vol) = sim_volume(16 << 20);
        let wal = Wal::create(vol, layout).unwrap();
        let a = wal.append(&[7u8; 100]).unwrap();
        let b = wal.append(&[8u8; 100]).unwrap();
        assert_eq!(a.pos, 0);
        match layout {
            // 100 bytes behind 11 of header (v2: FIRST, the epoch stored).
            Layout::Dense => assert_eq!(b.pos, 111, "dense packs records"),
            Layout::Sparse => assert_eq!(b.pos, 4096, "sparse starts a new sector"),
        }
        // Dense rewrites the tail sector: both commits wrote sector 0.
        let st = wal.stats();
        assert_eq!(st.volume_bytes, 8192);
    }
}
