//! Reading and writing the two superblock slots. A write goes to the slot
//! the new generation selects and is synced before it counts; reading takes
//! the valid slot with the highest generation.

use crate::error::{EngineError, NotAVolume, Result};
use crate::storage::Storage;
use squeeze_format::{FormatError, Superblock, DATA_START, SUPERBLOCK_SIZE};

/// Both slots as read.
pub struct Slots {
    /// The newest valid superblock.
    pub sb: Superblock,
    /// The other slot, when it is valid too.
    pub other: Option<Superblock>,
    /// Why the other slot cannot be trusted, when it was written once and
    /// is now unreadable, zeroed or another volume's: the newest generation
    /// may be the one lost, so nothing `sb` says beyond its checkpoint
    /// (such as the clean flag) can be trusted. None when it is valid, or
    /// was never written (a volume whose only superblock write so far is
    /// the one `create` made).
    pub damage: Option<String>,
}

impl Slots {
    /// The slots as read, the damage (if any) said in the log.
    fn found(sb: Superblock, other: Option<Superblock>, damage: Option<String>) -> Slots {
        if let Some(d) = &damage {
            tracing::warn!("{d}");
        }
        Slots { sb, other, damage }
    }
}

/// Reads both slots; fails only when neither is valid. The slots are
/// written alternately (slot = generation % 2), so a valid slot of
/// generation 2 or more means the other was written too: a zero slot beside
/// it is damage, not a fresh volume.
pub fn read_slots(storage: &dyn Storage) -> Result<Slots> {
    let len = storage.len()?;
    let mut buf = vec![0u8; 2 * SUPERBLOCK_SIZE];
    if len < 2 * SUPERBLOCK_SIZE as u64 {
        if len >= SUPERBLOCK_SIZE as u64 {
            storage.read_at(&mut buf[..SUPERBLOCK_SIZE], 0)?;
            if Superblock::decode(&buf[..SUPERBLOCK_SIZE]).is_ok() {
                return Err(EngineError::Metadata(FormatError::Invalid {
                    what: "volume file",
                    why: format!(
                        "it was cut short to {len} bytes: the second superblock slot and \
                         every segment are gone"
                    ),
                }));
            }
        }
        return Err(EngineError::NotAVolume(NotAVolume::ShortFile { len }));
    }
    storage.read_at(&mut buf, 0)?;
    let slot_bytes = |slot: usize| &buf[slot * SUPERBLOCK_SIZE..(slot + 1) * SUPERBLOCK_SIZE];
    let zeroed = |slot: usize| slot_bytes(slot).iter().all(|&b| b == 0);
    let a = Superblock::decode(slot_bytes(0));
    let b = Superblock::decode(slot_bytes(1));
    match (a, b) {
        (Ok(a), Ok(b)) => {
            let (sb, other) = if a.generation >= b.generation {
                (a, b)
            } else {
                (b, a)
            };
            let damage = (sb.uuid != other.uuid).then(|| {
                format!(
                    "superblock slot {} belongs to another volume (generation {}); slot {} \
                     (generation {}) was used",
                    other.slot(),
                    other.generation,
                    sb.slot(),
                    sb.generation
                )
            });
            Ok(Slots::found(sb, Some(other), damage))
        }
        (Ok(sb), Err(e)) | (Err(e), Ok(sb)) => {
            let bad_slot = 1 - sb.slot() as usize;
            let damage = if zeroed(bad_slot) {
                (sb.generation >= 2).then(|| {
                    format!(
                        "superblock slot {bad_slot} is all zeros, but slot {} has generation \
                         {}, so both were written: the newest superblock may be the one lost; \
                         opened from slot {} and replayed the log after its checkpoint",
                        sb.slot(),
                        sb.generation,
                        sb.slot()
                    )
                })
            } else {
                Some(format!(
                    "superblock slot {bad_slot} is unreadable ({e}); opened from slot {} \
                     (generation {}) and replayed the log after its checkpoint",
                    sb.slot(),
                    sb.generation
                ))
            };
            Ok(Slots::found(sb, None, damage))
        }
        (Err(a), Err(b)) => Err(match (a, b) {
            (e @ FormatError::UnsupportedVersion { .. }, _)
            | (_, e @ FormatError::UnsupportedVersion { .. }) => EngineError::Metadata(e),
            _ if zeroed(0) && zeroed(1) && len > DATA_START => {
                EngineError::Metadata(FormatError::Invalid {
                    what: "superblock",
                    why: format!(
                        "both slots are damaged (all zeros), though the file holds {} bytes \
                         past them",
                        len - 2 * SUPERBLOCK_SIZE as u64
                    ),
                })
            }
            (FormatError::BadMagic { .. }, FormatError::BadMagic { .. }) => {
                EngineError::NotAVolume(NotAVolume::BadMagic)
            }
            (e, _) => EngineError::Metadata(FormatError::Invalid {
                what: "superblock",
                why: format!("both slots are damaged (slot 0: {e})"),
            }),
        }),
    }
}

/// Writes `sb` with the next generation to its slot and syncs.
pub fn write(storage: &dyn Storage, sb: &mut Superblock) -> Result<()> {
    sb.generation += 1;
    let bytes = sb.encode();
    storage.write_at(&bytes, sb.slot() * SUPERBLOCK_SIZE as u64)?;
    storage.sync()?;
    Ok(())
}
