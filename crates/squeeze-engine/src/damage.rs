//! What opening a volume found damaged, as recovery reports it: a
//! superblock slot it could not use, flushed log records it could not find
//! (told apart from a torn tail of unflushed writes by the flush marks,
//! `squeeze_format::flush_mark`), and a file shorter than the records its
//! map names.
//!
//! Two kinds: damage recovery *repaired* (a superblock slot: the other slot
//! and the log after its checkpoint hold everything) and *loss* (records a
//! flush had made durable are gone, or the file was cut). A volume with
//! loss does not open unless the caller accepts it
//! (`OpenOptions::accept_loss`): sectors written by the lost records would
//! read back older data, and nothing can name them all.

use serde::Serialize;
use std::fmt;

/// Flushed records recovery could not find: seqs `[first_seq, end_seq)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LostRecords {
    pub first_seq: u64,
    /// Exclusive.
    pub end_seq: u64,
    /// Byte offset in the backing file where replay met the damage (the
    /// first byte that was not the record it expected).
    pub log_offset: u64,
    /// Sectors known to be in the lost records: a record whose header
    /// survived but whose payload did not (first LBA, sectors). Records
    /// whose headers are gone cannot be named: their sectors read back as
    /// they were at the checkpoint, or as written by a later record.
    pub lbas: Vec<(u64, u32)>,
}

/// The backing file ends before a record the map or the log names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Truncation {
    pub file_len: u64,
    /// The file must reach at least this far: the end of the furthest
    /// record named, or the log head at the newest flush mark.
    pub needed: u64,
}

/// Everything opening the volume found damaged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryDamage {
    /// A superblock slot that could not be used, and what was done
    /// instead (repaired: the volume opened from the other slot).
    pub superblock: Option<String>,
    /// Flushed records that are gone.
    pub lost: Vec<LostRecords>,
    /// The file was cut short.
    pub truncated: Option<Truncation>,
    /// The newest flush mark read (None: no mark of this volume, so a
    /// missing tail could not be told from unflushed writes).
    pub flushed_seq: Option<u64>,
    /// Flush mark slots found damaged (neither zeros nor a mark).
    pub damaged_marks: Option<DamagedMarks>,
}

/// Flush mark slots that hold neither zeros nor a mark. Any of them may
/// have held the newest mark, so after a crash replay cannot tell flushed
/// records that are gone from a tail of unflushed writes: loss, as a
/// missing record below a mark is (the session-30 fuzz input: the newest
/// mark overwritten and the file cut short served older data as if
/// nothing had been flushed). After a clean close nothing needed them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DamagedMarks {
    pub slots: Vec<u64>,
    /// The volume was not closed cleanly: its log was replayed.
    pub after_crash: bool,
}

impl RecoveryDamage {
    /// Nothing damaged.
    pub fn is_empty(&self) -> bool {
        self.superblock.is_none() && self.damaged_marks.is_none() && !self.is_loss()
    }

    /// Flushed data is gone (as opposed to a superblock slot repaired from
    /// the other).
    pub fn is_loss(&self) -> bool {
        !self.lost.is_empty()
            || self.truncated.is_some()
            || self.damaged_marks.as_ref().is_some_and(|m| m.after_crash)
    }

    /// Records lost, counted by seq.
    pub fn lost_records(&self) -> u64 {
        self.lost.iter().map(|l| l.end_seq - l.first_seq).sum()
    }
}

impl fmt::Display for RecoveryDamage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(s) = &self.superblock {
            parts.push(s.clone());
        }
        if let Some(m) = &self.damaged_marks {
            let slots: Vec<String> = m.slots.iter().map(u64::to_string).collect();
            parts.push(if m.after_crash {
                format!(
                    "flush mark slot(s) {} damaged (neither zeros nor a mark): one may have \
                     claimed records the log no longer holds, so flushed writes may be missing \
                     without being named (replayed up to the newest intact mark{})",
                    slots.join(", "),
                    self.flushed_seq
                        .map_or(String::new(), |s| format!(", seq {s}"))
                )
            } else {
                format!(
                    "flush mark slot(s) {} damaged (neither zeros nor a mark); the volume \
                     was closed cleanly, so nothing needed them",
                    slots.join(", ")
                )
            });
        }
        if let Some(t) = &self.truncated {
            parts.push(format!(
                "the file is {} bytes but its records reach byte {} or further: it was cut short by {} bytes or more",
                t.file_len,
                t.needed,
                t.needed - t.file_len
            ));
        }
        for l in &self.lost {
            let mut s = format!(
                "flushed log records {}..{} ({} records) are missing or damaged at byte {} of the file",
                l.first_seq,
                l.end_seq,
                l.end_seq - l.first_seq,
                l.log_offset
            );
            if l.lbas.is_empty() {
                s += " (their sectors cannot be named)";
            } else {
                let names: Vec<String> = l
                    .lbas
                    .iter()
                    .map(|&(lba, n)| format!("LBA {}..={}", lba, lba + u64::from(n) - 1))
                    .collect();
                s += &format!(" (they held {})", names.join(", "));
            }
            parts.push(s);
        }
        write!(f, "{}", parts.join("; "))
    }
}
