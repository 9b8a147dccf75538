//! Reading and writing the two superblock slots. A write goes to the slot
//! the new generation selects and is synced before it counts; reading takes
//! the valid slot with the highest generation.

use crate::error::{EngineError, Result};
use crate::storage::Storage;
use squeeze_format::{FormatError, Superblock, SUPERBLOCK_SIZE};

/// Reads the newest valid superblock.
pub fn read(storage: &dyn Storage) -> Result<Superblock> {
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
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(if a.generation >= b.generation { a } else { b }),
        (Ok(sb), Err(e)) | (Err(e), Ok(sb)) => {
            if !matches!(e, FormatError::BadMagic { .. }) || sb.generation > 0 {
                tracing::warn!("one superblock slot is unreadable ({e}); using the other");
            }
            Ok(sb)
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
