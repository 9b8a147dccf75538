//! Reading and writing the two superblock slots. A write goes to the slot
//! the new generation selects and is synced before it counts; reading takes
//! the valid slot with the highest generation.

use crate::error::{EngineError, Result};
use crate::storage::Storage;
use squeeze_format::{FormatError, Superblock, SUPERBLOCK_SIZE};

/// Both slots as read.
pub struct Slots {
    /// The newest valid superblock.
    pub sb: Superblock,
    /// The other slot, when it is valid too.
    pub other: Option<Superblock>,
    /// False when the other slot was written once and is now unreadable:
    /// the newest generation may be lost, so nothing it said (such as the
    /// clean flag) can be trusted beyond the checkpoint it names.
    pub other_intact: bool,
}

/// Reads both slots; fails only when neither is valid.
pub fn read_slots(storage: &dyn Storage) -> Result<Slots> {
    let len = storage.len()?;
    if len < 2 * SUPERBLOCK_SIZE as u64 {
        return Err(EngineError::NotAVolume(format!(
            "the file is {len} bytes, shorter than the superblock area"
        )));
    }
    let mut buf = vec![0u8; 2 * SUPERBLOCK_SIZE];
    storage.read_at(&mut buf, 0)?;
    let a = Superblock::decode(&buf[..SUPERBLOCK_SIZE]);
    let b = Superblock::decode(&buf[SUPERBLOCK_SIZE..]);
    let never_written = |slot: usize| {
        buf[slot * SUPERBLOCK_SIZE..(slot + 1) * SUPERBLOCK_SIZE]
            .iter()
            .all(|&b| b == 0)
    };
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(if a.generation >= b.generation {
            Slots {
                sb: a,
                other: Some(b),
                other_intact: true,
            }
        } else {
            Slots {
                sb: b,
                other: Some(a),
                other_intact: true,
            }
        }),
        (Ok(sb), Err(e)) | (Err(e), Ok(sb)) => {
            let bad_slot = 1 - sb.slot() as usize;
            let other_intact = never_written(bad_slot);
            if !other_intact {
                tracing::warn!(
                    "superblock slot {bad_slot} is unreadable ({e}); using slot {} and replaying the log",
                    sb.slot()
                );
            }
            Ok(Slots {
                sb,
                other: None,
                other_intact,
            })
        }
        (Err(a), Err(b)) => Err(match (a, b) {
            (e @ FormatError::UnsupportedVersion { .. }, _)
            | (_, e @ FormatError::UnsupportedVersion { .. }) => EngineError::Metadata(e),
            (FormatError::BadMagic { .. }, FormatError::BadMagic { .. }) => {
                EngineError::NotAVolume("no squeeze superblock (bad magic)".into())
            }
            (e, _) => EngineError::Metadata(e),
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
