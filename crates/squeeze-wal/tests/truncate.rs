//! Truncation gives the space back: the consumed prefix is trimmed (its
//! sectors unmapped at once, their log space reclaimed by the cleaner),
//! and a reopen starts at the truncation point.

mod common;
use common::*;
use rand::Rng;
use squeeze_wal::Wal;

#[test]
fn truncation_trims_the_prefix_and_the_cleaner_reclaims_it() {
    for layout in LAYOUTS {
        let (_d, vol) = sim_volume(256 << 20);
        let wal = Wal::create(vol.clone(), layout).unwrap();
        let mut r = rng(7);
        let mut lsns = Vec::new();
        for _ in 0..3000 {
            let p: Vec<u8> = (0..2000).map(|_| r.gen()).collect();
            lsns.push(wal.append(&p).unwrap());
        }
        vol.checkpoint().unwrap();
        let before = vol.stats();
        let cut = lsns[2700];
        let trimmed = wal.truncate(cut).unwrap();
        assert!(trimmed >= cut.pos - 4096, "{layout:?}: trimmed {trimmed}");
        let after = vol.stats();
        let freed = before.mapped_bytes - after.mapped_bytes;
        assert!(
            freed >= cut.pos / 4096 * 4096 - 4096,
            "{layout:?}: {freed} mapped bytes freed by a truncation of {} bytes",
            cut.pos
        );
        vol.checkpoint().unwrap();
        vol.compact(|_, _| {}).unwrap();
        let cleaned = vol.stats();
        assert!(
            cleaned.stored_bytes * 5 < before.stored_bytes,
            "{layout:?}: stored {} -> {}",
            before.stored_bytes,
            cleaned.stored_bytes
        );
        assert!(
            cleaned.allocated_bytes < before.allocated_bytes / 2,
            "{layout:?}: allocated {} -> {}",
            before.allocated_bytes,
            cleaned.allocated_bytes
        );
        drop(wal);
        let (wal, got) = open_log(&vol, layout).unwrap();
        assert_eq!(got.len(), 300);
        assert_eq!(got[0].0, cut);
        // Truncating everything leaves an empty log that goes on.
        let (_, next) = wal.bounds();
        wal.truncate(next).unwrap();
        drop(wal);
        let (wal, got) = open_log(&vol, layout).unwrap();
        assert!(got.is_empty());
        assert_eq!(wal.append(b"more").unwrap().seq, 3000);
    }
}
