//! Flush marks: the durable record of what the clients' flushes made
//! durable, so that recovery can tell a torn tail of writes nobody was
//! promised (passed over) from flushed records that are gone (damage,
//! reported). Sixteen 4 KiB slots after the superblocks, written in turn
//! (slot = count % 16) after each fdatasync of a client flush, through the
//! page cache and without a sync of their own: a mark survives the
//! process's death at once and a power cut from the next fdatasync on, and
//! a mark only ever claims an fdatasync that had returned.
//!
//! ```text
//! byte  0  magic        [8]  "SQZFLUSH"
//!       8  version      u32  1
//!      12  reserved     u32  0
//!      16  uuid         [16] the volume's
//!      32  count        u64  marks written over the volume's life; slot = count % 16
//!      40  epoch_seq    u64  the first seq of this open of the volume
//!      48  flushed_seq  u64  every record with epoch_seq <= seq < flushed_seq
//!                            was durable when this mark was written
//!      56  flushed_end  u64  the log head then (just past record
//!                            flushed_seq - 1): the file reaches at least here
//!      64  crc          u32  CRC-32C of bytes 0..64
//!      68  reserved     u32  0; the rest of the slot is zero
//! ```

use crate::layout::{FLUSH_MARK_SLOTS, FLUSH_MARK_SLOT_SIZE, FLUSH_MARK_START};
use crate::le::{get_u32, get_u64, put_u32, put_u64};
use crate::{checksum, FormatError};

pub const FLUSH_MARK_MAGIC: [u8; 8] = *b"SQZFLUSH";
/// The flush mark layout this build writes and reads.
pub const FLUSH_MARK_VERSION: u32 = 1;
/// Bytes of a mark that carry anything (the rest of its slot is zero).
pub const FLUSH_MARK_LEN: usize = 72;

/// What one mark says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushMark {
    pub uuid: [u8; 16],
    pub count: u64,
    pub epoch_seq: u64,
    pub flushed_seq: u64,
    pub flushed_end: u64,
}

impl FlushMark {
    /// Byte offset of this mark's slot in the backing file.
    pub fn offset(&self) -> u64 {
        slot_offset(self.count % FLUSH_MARK_SLOTS)
    }

    pub fn encode(&self) -> [u8; FLUSH_MARK_LEN] {
        let mut b = [0u8; FLUSH_MARK_LEN];
        b[0..8].copy_from_slice(&FLUSH_MARK_MAGIC);
        put_u32(&mut b, 8, FLUSH_MARK_VERSION);
        b[16..32].copy_from_slice(&self.uuid);
        put_u64(&mut b, 32, self.count);
        put_u64(&mut b, 40, self.epoch_seq);
        put_u64(&mut b, 48, self.flushed_seq);
        put_u64(&mut b, 56, self.flushed_end);
        let crc = checksum::crc32c(&b[..64]);
        put_u32(&mut b, 64, crc);
        b
    }

    /// Decodes a mark from the first bytes of a slot. An all-zero slot
    /// (never written) is `BadMagic`, as is anything else that is not a
    /// mark.
    pub fn decode(b: &[u8]) -> Result<FlushMark, FormatError> {
        if b.len() < FLUSH_MARK_LEN {
            return Err(FormatError::Truncated {
                what: "flush mark",
                need: FLUSH_MARK_LEN,
                have: b.len(),
            });
        }
        if b[0..8] != FLUSH_MARK_MAGIC {
            return Err(FormatError::BadMagic { what: "flush mark" });
        }
        let expected = get_u32(b, 64);
        let got = checksum::crc32c(&b[..64]);
        if expected != got {
            return Err(FormatError::ChecksumMismatch {
                what: "flush mark",
                expected,
                got,
            });
        }
        let version = get_u32(b, 8);
        if version != FLUSH_MARK_VERSION {
            return Err(FormatError::UnsupportedVersion {
                found: version,
                supported: FLUSH_MARK_VERSION,
            });
        }
        let m = FlushMark {
            uuid: b[16..32].try_into().expect("16 bytes"),
            count: get_u64(b, 32),
            epoch_seq: get_u64(b, 40),
            flushed_seq: get_u64(b, 48),
            flushed_end: get_u64(b, 56),
        };
        if get_u32(b, 12) != 0 || get_u32(b, 68) != 0 || m.flushed_seq < m.epoch_seq {
            return Err(FormatError::Invalid {
                what: "flush mark",
                why: "reserved bits set or flushed seq below its epoch".into(),
            });
        }
        Ok(m)
    }

    /// The newest valid mark of volume `uuid` among the slots' bytes
    /// (`FLUSH_MARK_SLOTS` slots of `FLUSH_MARK_SLOT_SIZE` bytes from
    /// `FLUSH_MARK_START`): the one that claims the most. Another volume's
    /// marks and damaged slots are passed over.
    pub fn newest(area: &[u8], uuid: &[u8; 16]) -> Option<FlushMark> {
        (0..FLUSH_MARK_SLOTS as usize)
            .filter_map(|s| area.get(s * FLUSH_MARK_SLOT_SIZE..))
            .filter_map(|b| FlushMark::decode(b).ok())
            .filter(|m| &m.uuid == uuid && !m.is_placeholder())
            .max_by_key(|m| (m.flushed_seq, m.count))
    }

    /// What `create` writes to slot `slot` (since session 30): a mark of
    /// the volume that claims nothing (flushed_seq 0, which no real mark
    /// has: a real one is written only once its flushed seq passed its
    /// epoch, at least 1). With every slot holding one, a slot of zeros is
    /// damage, never a slot not written yet.
    pub fn placeholder(uuid: [u8; 16], slot: u64) -> FlushMark {
        FlushMark {
            uuid,
            count: slot,
            epoch_seq: 0,
            flushed_seq: 0,
            flushed_end: 0,
        }
    }

    /// A placeholder: it claims nothing.
    pub fn is_placeholder(&self) -> bool {
        self.flushed_seq == 0
    }

    /// The slots among the slots' bytes of volume `uuid` that are damaged:
    /// bytes that are neither zeros nor a mark (this volume's, another's,
    /// or one of another version), or zeros where every slot is known to
    /// have been written (a placeholder of the volume is left in some slot,
    /// or a mark of it counts 32 or more: every slot then held one long
    /// ago). A mark is written in one piece inside the first sector of its
    /// own page, so a crash leaves a slot old or new, never torn (sector
    /// writes are atomic); a damaged slot may have held the newest mark.
    /// A volume made before placeholders that wrote fewer than 32 marks
    /// cannot tell a zeroed slot from one not written yet.
    pub fn damaged_slots(area: &[u8], uuid: &[u8; 16]) -> Vec<u64> {
        let slot = |s: u64| {
            let at = s as usize * FLUSH_MARK_SLOT_SIZE;
            &area[at.min(area.len())..(at + FLUSH_MARK_LEN).min(area.len())]
        };
        let all_written = (0..FLUSH_MARK_SLOTS)
            .filter_map(|s| FlushMark::decode(slot(s)).ok())
            .any(|m| &m.uuid == uuid && (m.is_placeholder() || m.count >= 2 * FLUSH_MARK_SLOTS));
        (0..FLUSH_MARK_SLOTS)
            .filter(|&s| {
                let b = slot(s);
                if b.iter().all(|&x| x == 0) {
                    return all_written;
                }
                !matches!(
                    FlushMark::decode(b),
                    Ok(_) | Err(FormatError::UnsupportedVersion { .. })
                )
            })
            .collect()
    }
}

/// Byte offset of flush mark slot `slot`.
pub fn slot_offset(slot: u64) -> u64 {
    FLUSH_MARK_START + slot * FLUSH_MARK_SLOT_SIZE as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(count: u64, flushed: u64) -> FlushMark {
        FlushMark {
            uuid: [7; 16],
            count,
            epoch_seq: 10,
            flushed_seq: flushed,
            flushed_end: 1 << 30,
        }
    }

    #[test]
    fn round_trip_and_every_flipped_bit_is_refused() {
        let m = mark(5, 99);
        let b = m.encode();
        assert_eq!(FlushMark::decode(&b), Ok(m));
        for byte in 0..FLUSH_MARK_LEN {
            for bit in 0..8 {
                let mut c = b;
                c[byte] ^= 1 << bit;
                assert!(FlushMark::decode(&c).is_err(), "byte {byte} bit {bit}");
            }
        }
        assert!(FlushMark::decode(&[0u8; FLUSH_MARK_LEN]).is_err());
        assert!(FlushMark::decode(&b[..FLUSH_MARK_LEN - 1]).is_err());
    }

    #[test]
    fn newest_takes_the_highest_claim_of_this_volume() {
        let mut area = vec![0u8; FLUSH_MARK_SLOTS as usize * FLUSH_MARK_SLOT_SIZE];
        assert_eq!(FlushMark::newest(&area, &[7; 16]), None);
        let (a, b) = (mark(4, 50), mark(5, 60));
        let put = |area: &mut Vec<u8>, m: &FlushMark| {
            let at = (m.offset() - FLUSH_MARK_START) as usize;
            area[at..at + FLUSH_MARK_LEN].copy_from_slice(&m.encode());
        };
        put(&mut area, &a);
        put(&mut area, &b);
        assert_eq!(FlushMark::newest(&area, &[7; 16]), Some(b));
        assert_eq!(FlushMark::newest(&area, &[8; 16]), None);
        assert!(FlushMark::damaged_slots(&area, &[7; 16]).is_empty());
        // The newest slot damaged: the older mark still answers, and the
        // slot is named as damaged (it may have claimed more).
        let at = (b.offset() - FLUSH_MARK_START) as usize;
        area[at + 40] ^= 1;
        assert_eq!(FlushMark::newest(&area, &[7; 16]), Some(a));
        assert_eq!(FlushMark::damaged_slots(&area, &[7; 16]), vec![5]);
        // Bytes past the mark in its page do not matter; a slot of
        // garbage does.
        area[at + 40] ^= 1;
        area[at + FLUSH_MARK_LEN + 100] = 0xa5;
        assert!(FlushMark::damaged_slots(&area, &[7; 16]).is_empty());
        area[9 * FLUSH_MARK_SLOT_SIZE + 3] = 1;
        assert_eq!(FlushMark::damaged_slots(&area, &[7; 16]), vec![9]);
    }

    /// Placeholders claim nothing and are never the newest; once a slot
    /// holds one, a zeroed slot is damage (else it may be one not written
    /// yet), as it is once a mark counts 32.
    #[test]
    fn with_placeholders_a_zeroed_slot_is_damage() {
        let u = [7; 16];
        let mut area = vec![0u8; FLUSH_MARK_SLOTS as usize * FLUSH_MARK_SLOT_SIZE];
        let put = |area: &mut Vec<u8>, slot: u64, m: &FlushMark| {
            let at = slot as usize * FLUSH_MARK_SLOT_SIZE;
            area[at..at + FLUSH_MARK_LEN].copy_from_slice(&m.encode());
        };
        // Fewer than 32 marks and no placeholder: zeros are not damage.
        put(&mut area, 1, &mark(1, 60));
        assert!(FlushMark::damaged_slots(&area, &u).is_empty());
        for s in 0..FLUSH_MARK_SLOTS {
            if s != 1 {
                put(&mut area, s, &FlushMark::placeholder(u, s));
            }
        }
        assert!(FlushMark::placeholder(u, 3).is_placeholder());
        assert_eq!(FlushMark::newest(&area, &u), Some(mark(1, 60)));
        assert!(FlushMark::damaged_slots(&area, &u).is_empty());
        // Another volume's placeholders say nothing of this one's slots.
        assert!(FlushMark::damaged_slots(&area, &[8; 16]).is_empty());
        // The newest mark zeroed: damage, and no mark answers.
        area[FLUSH_MARK_SLOT_SIZE..FLUSH_MARK_SLOT_SIZE + 256].fill(0);
        assert_eq!(FlushMark::newest(&area, &u), None);
        assert_eq!(FlushMark::damaged_slots(&area, &u), vec![1]);
        // Without placeholders, a mark counting 32 says the same.
        let mut area = vec![0u8; FLUSH_MARK_SLOTS as usize * FLUSH_MARK_SLOT_SIZE];
        put(&mut area, 0, &mark(32, 90));
        assert_eq!(FlushMark::damaged_slots(&area, &u).len(), 15);
    }
}
