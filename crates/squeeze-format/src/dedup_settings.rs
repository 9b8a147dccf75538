//! A volume's deduplication settings (format 7, docs/DEDUP.md): its mode
//! and the idle pass's index budget, stored in the superblock's tail
//! (`superblock.rs`, bytes 4080..4092) beside the policy and the cap.
//!
//! ```text
//! byte 4080  dedup mode       u8   0 off, 1 idle, 2 inline
//!      4081  reserved         [3]  0
//!      4084  dedup index MiB  u32  the idle pass's index budget, 0 = the
//!                                  default (DEFAULT_INDEX_MIB)
//!      4088  reserved         u32  0
//! ```
//!
//! Before format 7 those bytes may hold checkpoint segment ids: a volume
//! in an older version has the default settings and keeps them until a
//! checkpoint has made it 7.
//!
//! Mode 2 (inline) came after mode 1 within format 7, without a version
//! bump: nothing in the log depends on the mode. A binary built before it
//! finds mode 2 an unknown mode and refuses the slot ("invalid
//! superblock: unknown dedup mode 2"); with both slots refused it does
//! not open the volume (docs/FORMAT.md, the superblock table).

use crate::le::{get_u32, put_u32};
use crate::FormatError;

/// Where the settings start in a superblock slot.
pub const DEDUP_SETTINGS_OFFSET: usize = 4080;
/// The idle pass's index budget when none is set (MiB): about 4.6 million
/// fingerprints, 18 GiB of data remembered at once (docs/DEDUP.md, Budget).
pub const DEFAULT_INDEX_MIB: u32 = 256;
/// The largest index budget a volume may ask for (MiB): 1 TiB.
pub const MAX_INDEX_MIB: u32 = 1 << 20;

/// When the volume deduplicates by itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum DedupMode {
    /// Only when asked (`squeeze compact --dedup`); the default.
    #[default]
    Off = 0,
    /// The maintenance thread runs the pass while clients are idle.
    Idle = 1,
    /// Each written sector is looked up in an index of recent content
    /// and linked instead of stored when it is found again
    /// (`squeeze_engine::dedup::inline`); the idle pass runs as well.
    Inline = 2,
}

impl DedupMode {
    pub const ALL: [DedupMode; 3] = [DedupMode::Off, DedupMode::Idle, DedupMode::Inline];

    pub fn name(self) -> &'static str {
        match self {
            DedupMode::Off => "off",
            DedupMode::Idle => "idle",
            DedupMode::Inline => "inline",
        }
    }

    /// The mode a user named, or why not.
    pub fn parse(s: &str) -> Result<DedupMode, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown dedup mode {s:?}: use off, idle or inline"))
    }

    /// Whether the maintenance thread runs the idle pass.
    pub fn idle_pass(self) -> bool {
        matches!(self, DedupMode::Idle | DedupMode::Inline)
    }

    fn from_u8(v: u8) -> Result<DedupMode, FormatError> {
        Self::ALL
            .into_iter()
            .find(|m| *m as u8 == v)
            .ok_or_else(|| FormatError::Invalid {
                what: "superblock",
                why: format!("unknown dedup mode {v}"),
            })
    }
}

/// The settings as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DedupSettings {
    pub mode: DedupMode,
    /// The idle pass's index budget in MiB; 0 = `DEFAULT_INDEX_MIB`.
    pub index_mib: u32,
}

impl DedupSettings {
    /// The index budget in bytes, the default resolved.
    pub fn index_bytes(&self) -> u64 {
        let mib = if self.index_mib == 0 {
            DEFAULT_INDEX_MIB
        } else {
            self.index_mib
        };
        u64::from(mib) << 20
    }

    pub fn validate(&self) -> Result<(), FormatError> {
        if self.index_mib > MAX_INDEX_MIB {
            return Err(FormatError::Invalid {
                what: "dedup settings",
                why: format!(
                    "index budget {} MiB over the largest, {MAX_INDEX_MIB} MiB",
                    self.index_mib
                ),
            });
        }
        Ok(())
    }

    /// Writes the settings into a superblock slot `b`.
    pub(crate) fn encode(&self, b: &mut [u8]) {
        let o = DEDUP_SETTINGS_OFFSET;
        b[o..o + 12].fill(0);
        b[o] = self.mode as u8;
        put_u32(b, o + 4, self.index_mib);
    }

    /// Reads them from a format 7 superblock slot `b`.
    pub(crate) fn decode(b: &[u8]) -> Result<DedupSettings, FormatError> {
        let o = DEDUP_SETTINGS_OFFSET;
        if b[o + 1..o + 4].iter().any(|&x| x != 0) || get_u32(b, o + 8) != 0 {
            return Err(FormatError::Invalid {
                what: "superblock",
                why: "reserved bytes of the dedup settings are not zero".into(),
            });
        }
        let s = DedupSettings {
            mode: DedupMode::from_u8(b[o])?,
            index_mib: get_u32(b, o + 4),
        };
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for m in DedupMode::ALL {
            assert_eq!(DedupMode::parse(m.name()), Ok(m));
            assert_eq!(DedupMode::from_u8(m as u8), Ok(m));
        }
        assert_eq!(DedupMode::parse("inline"), Ok(DedupMode::Inline));
        assert!(DedupMode::parse("sometimes")
            .unwrap_err()
            .contains("unknown"));
    }

    #[test]
    fn settings_round_trip_and_bad_bytes_are_refused() {
        let mut b = vec![0u8; 4096];
        let s = DedupSettings {
            mode: DedupMode::Idle,
            index_mib: 64,
        };
        s.encode(&mut b);
        assert_eq!(DedupSettings::decode(&b), Ok(s));
        assert_eq!(s.index_bytes(), 64 << 20);
        assert_eq!(DedupSettings::default().index_bytes(), 256 << 20);
        b[DEDUP_SETTINGS_OFFSET] = 2;
        assert_eq!(DedupSettings::decode(&b).unwrap().mode, DedupMode::Inline);
        // A mode this build does not know refuses the slot, as mode 2 does
        // in a build before inline.
        b[DEDUP_SETTINGS_OFFSET] = 3;
        let e = DedupSettings::decode(&b).unwrap_err().to_string();
        assert!(e.contains("unknown dedup mode 3"), "{e}");
        b[DEDUP_SETTINGS_OFFSET] = 1;
        b[DEDUP_SETTINGS_OFFSET + 2] = 1;
        assert!(DedupSettings::decode(&b).is_err());
        b[DEDUP_SETTINGS_OFFSET + 2] = 0;
        put_u32(&mut b, DEDUP_SETTINGS_OFFSET + 4, MAX_INDEX_MIB + 1);
        assert!(DedupSettings::decode(&b).is_err());
    }
}
