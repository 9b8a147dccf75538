//! The scrubber behind `squeeze check`: verifies both superblock slots, the
//! checkpoint (by opening the volume, which also replays the log), the
//! accounting invariants, and every live record (header, payload checksum,
//! decompression), and names each damaged sector by LBA. What the open
//! found (a superblock slot it could not use, flushed log records that are
//! gone, a file cut short: `crate::damage`) is part of the report.

use crate::damage::RecoveryDamage;
use crate::read::read_extent;
use crate::storage::Fetch;
use crate::volume::Volume;
use squeeze_format::map_entry::is_shared;
use squeeze_format::{Superblock, SECTOR_SIZE, SUPERBLOCK_SIZE};

/// A run of damaged sectors and why.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Damage {
    pub first_lba: u64,
    pub sectors: u64,
    pub error: String,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckReport {
    /// Per superblock slot: its generation, or why it is unreadable.
    pub superblock_slots: Vec<String>,
    pub records_checked: u64,
    pub sectors_checked: u64,
    pub accounting: Option<String>,
    pub damaged: Vec<Damage>,
    /// What opening the volume found damaged.
    pub recovery: RecoveryDamage,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.damaged.is_empty() && self.accounting.is_none() && self.recovery.is_empty()
    }
    pub fn damaged_sectors(&self) -> u64 {
        self.damaged.iter().map(|d| d.sectors).sum()
    }
}

/// Adds `sectors` damaged sectors from `lba` to `damaged`, extending the
/// last entry when they follow it with the same error.
fn note_damage(damaged: &mut Vec<Damage>, lba: u64, sectors: u64, error: String) {
    match damaged.last_mut() {
        Some(d) if d.first_lba + d.sectors == lba && d.error == error => d.sectors += sectors,
        _ => damaged.push(Damage {
            first_lba: lba,
            sectors,
            error,
        }),
    }
}

/// Checks an open volume. `progress(done, total)` is called as sectors are
/// verified.
pub fn check(vol: &Volume, mut progress: impl FnMut(u64, u64)) -> CheckReport {
    let inner = &*vol.inner;
    let mut report = CheckReport {
        recovery: vol.damage().clone(),
        ..CheckReport::default()
    };
    let mut buf = vec![0u8; 2 * SUPERBLOCK_SIZE];
    let in_force = inner.sb.lock().clone();
    match inner.storage.read_at(&mut buf, 0) {
        Ok(()) => {
            for slot in 0..2 {
                let b = &buf[slot * SUPERBLOCK_SIZE..(slot + 1) * SUPERBLOCK_SIZE];
                report.superblock_slots.push(match Superblock::decode(b) {
                    Ok(sb) if sb.uuid != in_force.uuid => {
                        format!("another volume's (generation {})", sb.generation)
                    }
                    Ok(sb) => format!("ok (generation {})", sb.generation),
                    // A fresh volume has written one slot so far.
                    Err(_) if b.iter().all(|&x| x == 0) && in_force.generation < 2 => {
                        "never written".to_string()
                    }
                    Err(e) => format!("unreadable: {e}"),
                });
            }
        }
        Err(e) => report.superblock_slots.push(format!("read failed: {e}")),
    }
    report.accounting = vol.verify_accounting().err().map(|e| e.to_string());
    let total = inner.state.read().map.mapped();
    let mut out = vec![0u8; 32 * SECTOR_SIZE];
    let mut shared_refs = 0u64;
    // Chunk by chunk (a paged-out map is read back as it goes).
    let walked = crate::meta::pager::for_each_chunk(inner, |_, entries| {
        let mut i = 0;
        while i < entries.len() {
            let (lba, e) = entries[i];
            if e.is_indirect() {
                // Its content is its hidden address's record, checked
                // where the walk meets that address (below, the damage
                // of a shared record is reported at every LBA sharing it).
                shared_refs += 1;
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < entries.len()
                && j - i < 32
                && entries[j].0 == lba + (j - i) as u64
                && entries[j].1.record_offset() == e.record_offset()
                && entries[j].1.index() == e.index() + (j - i) as u32
            {
                j += 1;
            }
            let n = j - i;
            let res = {
                let _gate = inner.gate.read();
                read_extent(inner, e, lba, &mut out[..n * SECTOR_SIZE], Fetch::Stream)
            };
            if let Err(err) = res {
                if n == 1 {
                    note_damage(&mut report.damaged, lba, 1, err.to_string());
                } else {
                    // Sector by sector: a chunked record (format 5) loses
                    // only the sectors of its damaged chunks. Each run of
                    // failing sectors is one entry, named by its first
                    // sector's error, as a whole run's failure is.
                    let mut failing = false;
                    for k in 0..n {
                        let res = {
                            let _gate = inner.gate.read();
                            let ek = entries[i + k].1;
                            read_extent(
                                inner,
                                ek,
                                lba + k as u64,
                                &mut out[..SECTOR_SIZE],
                                Fetch::Stream,
                            )
                        };
                        let failed = res.is_err();
                        match res {
                            Err(_) if failing => {
                                if let Some(d) = report.damaged.last_mut() {
                                    d.sectors += 1;
                                }
                            }
                            Err(err) => {
                                note_damage(&mut report.damaged, lba + k as u64, 1, err.to_string())
                            }
                            Ok(()) => {}
                        }
                        failing = failed;
                    }
                }
            }
            report.records_checked += 1;
            report.sectors_checked += n as u64;
            i = j;
            progress(report.sectors_checked, total);
        }
    });
    if let Err(e) = walked {
        report
            .accounting
            .get_or_insert_with(|| format!("reading the map: {e}"));
    }
    // Damage at hidden addresses is damage of every client sector that
    // shares them: a second walk names those.
    let hidden: Vec<Damage> = report
        .damaged
        .iter()
        .filter(|d| is_shared(d.first_lba))
        .cloned()
        .collect();
    if shared_refs > 0 && !hidden.is_empty() {
        let mut clients = Vec::new();
        let walked = crate::meta::pager::for_each_chunk(inner, |_, entries| {
            for &(lba, e) in entries {
                let Some(t) = e.target() else { continue };
                if let Some(d) = hidden
                    .iter()
                    .find(|d| (d.first_lba..d.first_lba + d.sectors).contains(&t))
                {
                    let why = format!(
                        "shares the damaged hidden addresses from {:#x}: {}",
                        d.first_lba, d.error
                    );
                    note_damage(&mut clients, lba, 1, why);
                }
            }
        });
        if let Err(e) = walked {
            report
                .accounting
                .get_or_insert_with(|| format!("reading the map: {e}"));
        }
        report.damaged.extend(clients);
    }
    report
}
