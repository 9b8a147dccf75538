//! Stage 2b's floor: the ladder's rung below lz4, storing a client batch
//! raw (codec none) while the machine's cores are saturated even at lz4,
//! and only while the volume has the room to hold the burst uncompressed.
//! The idle upgrade (`space::upgrade`) later rewrites such bytes with the
//! target, as it does lz4's.
//!
//! The room rule, asked once per batch while the CPU law wants the raw
//! rung (docs/ARCHITECTURE.md, "Adaptive write codec"):
//!
//! - `free`: the bytes client data can still take ([`crate::stats`]'s
//!   `free_physical`: the segments under `--max-physical` that are free,
//!   less those kept for checkpoints and the cleaner, and no more than the
//!   backing file system's free space, so a thin-provisioned backing
//!   device bounds it too). `pending`: raw bytes stored raw by this rung
//!   and not yet upgraded (they occupy room until the upgrade).
//! - Open while `pending < share x (free + pending)`: a burst never takes
//!   more than `share` of the room the volume had before it began (free
//!   plus what the burst took), so the upgrade afterwards, and other
//!   writers, always find the rest.
//! - Once `pending` reaches that allowance the rule closes (the CPU law
//!   falls back to lz4) and reopens only when `pending` is at most
//!   `reopen` x the allowance (the upgrade or overwrites brought it down):
//!   no flapping between raw and lz4 at the allowance's edge.
//!
//! Invariants: `0 < reopen < 1`, `0 < share < 1`; the rule is a pure
//! function of its readings and its one bit of state (open or closed).

use std::fmt;

/// The lowest rung the CPU law may take under a compressing target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BurstFloor {
    /// Store raw when the cores are saturated at lz4 and the volume has
    /// room ([`RawRoom`]): bursts at the raw file's speed, the ratio
    /// restored by the idle upgrade.
    #[default]
    Raw,
    /// lz4, as before the raw rung: the ratio stays lz4's during bursts.
    Lz4,
}

impl BurstFloor {
    pub fn as_str(self) -> &'static str {
        match self {
            BurstFloor::Raw => "raw",
            BurstFloor::Lz4 => "lz4",
        }
    }

    /// "raw" or "lz4" (as `squeeze serve --burst-floor` takes it).
    pub fn parse(s: &str) -> Option<BurstFloor> {
        match s {
            "raw" | "none" => Some(BurstFloor::Raw),
            "lz4" => Some(BurstFloor::Lz4),
            _ => None,
        }
    }
}

impl fmt::Display for BurstFloor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the room rule reads (see the module text).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoomReading {
    /// Bytes client data can still take.
    pub free_bytes: u64,
    /// Raw bytes stored by the raw rung and not yet upgraded.
    pub pending_raw_bytes: u64,
}

/// The room rule's constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoomRule {
    pub share: f64,
    pub reopen: f64,
}

/// Defaults: a quarter of the room (a volume with 4 GiB free takes a
/// 1 GiB burst raw, which the upgrade shrinks back to ~0.4 GiB at the W3
/// tar's 2.7:1); reopen at half the allowance.
pub const ROOM_DEFAULT: RoomRule = RoomRule {
    share: 0.25,
    reopen: 0.5,
};

const _: () = assert!(ROOM_DEFAULT.share > 0.0 && ROOM_DEFAULT.share < 1.0);
const _: () = assert!(ROOM_DEFAULT.reopen > 0.0 && ROOM_DEFAULT.reopen < 1.0);

/// The room rule's state.
#[derive(Clone, Debug)]
pub struct RawRoom {
    rule: RoomRule,
    open: bool,
}

impl RawRoom {
    pub fn new(rule: RoomRule) -> RawRoom {
        assert!(rule.share > 0.0 && rule.share < 1.0);
        assert!(rule.reopen > 0.0 && rule.reopen < 1.0);
        RawRoom { rule, open: true }
    }

    /// Raw bytes a burst may hold at this reading (pending included).
    pub fn allowance(&self, r: RoomReading) -> u64 {
        let room = r.free_bytes.saturating_add(r.pending_raw_bytes);
        (room as f64 * self.rule.share) as u64
    }

    /// Whether the next batch may be stored raw.
    pub fn allows(&mut self, r: RoomReading) -> bool {
        let allowance = self.allowance(r);
        let fits = r.pending_raw_bytes < allowance;
        if !fits {
            self.open = false;
        } else if !self.open {
            self.open = (r.pending_raw_bytes as f64) <= self.rule.reopen * allowance as f64;
        }
        self.open
    }

    /// The state after the last reading.
    pub fn is_open(&self) -> bool {
        self.open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn at(free_bytes: u64, pending_raw_bytes: u64) -> RoomReading {
        RoomReading {
            free_bytes,
            pending_raw_bytes,
        }
    }

    #[test]
    fn a_burst_takes_a_quarter_of_the_room_it_found() {
        // 8 GiB free: a burst writes raw 4 MiB batches, each taking its
        // bytes (plus headers, ignored here) from the free room.
        let mut room = RawRoom::new(ROOM_DEFAULT);
        let (mut free, mut pending) = (8 * GIB, 0);
        while room.allows(at(free, pending)) {
            free -= 4 * MIB;
            pending += 4 * MIB;
        }
        assert_eq!(pending, 2 * GIB, "a quarter of the 8 GiB, to the batch");
        assert_eq!(free, 6 * GIB);
        // Closed, it stays closed while the burst goes on at lz4 (the
        // room shrinks further), ...
        for _ in 0..100 {
            free -= 2 * MIB;
            assert!(!room.allows(at(free, pending)));
        }
        // ... and the upgrade's first segments do not reopen it: only at
        // half the allowance.
        let mut reopened_at = None;
        while pending > 0 {
            pending -= 32 * MIB;
            free += 20 * MIB;
            if room.allows(at(free, pending)) {
                reopened_at = Some(pending);
                break;
            }
        }
        let p = reopened_at.expect("reopens as the upgrade goes on");
        assert!(p as f64 <= 0.5 * 0.25 * (free + p) as f64, "{p} {free}");
        assert!(p > GIB / 2, "{p}");
    }

    #[test]
    fn no_room_no_raw() {
        let mut room = RawRoom::new(ROOM_DEFAULT);
        assert!(!room.allows(at(0, 0)));
        assert!(!room.is_open());
        // A full volume stays closed, however long.
        for _ in 0..10 {
            assert!(!room.allows(at(0, 0)));
        }
        // Room again (trimmed, cap raised): open.
        assert!(room.allows(at(GIB, 0)));
        assert_eq!(room.allowance(at(GIB, 0)), GIB / 4);
    }

    #[test]
    fn a_cap_bounds_the_burst() {
        // --max-physical leaves 800 MiB: a burst of 1 GiB gets 200 MiB
        // raw, the rest lz4 (at 2:1).
        let mut room = RawRoom::new(ROOM_DEFAULT);
        let (mut free, mut pending, mut lz4) = (800 * MIB, 0, 0);
        for _ in 0..1024 {
            if room.allows(at(free, pending)) {
                free -= MIB;
                pending += MIB;
            } else {
                free -= MIB / 2;
                lz4 += MIB;
            }
        }
        assert_eq!(pending, 200 * MIB);
        assert_eq!(lz4, 824 * MIB);
    }

    #[test]
    fn floors_parse() {
        assert_eq!(BurstFloor::parse("raw"), Some(BurstFloor::Raw));
        assert_eq!(BurstFloor::parse("none"), Some(BurstFloor::Raw));
        assert_eq!(BurstFloor::parse("lz4"), Some(BurstFloor::Lz4));
        assert_eq!(BurstFloor::parse("zstd"), None);
        assert_eq!(BurstFloor::default().to_string(), "raw");
    }
}
