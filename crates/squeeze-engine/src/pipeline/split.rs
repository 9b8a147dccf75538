//! Stage 1 of the write path: cut a sector-aligned buffer into runs of
//! all-zero sectors (they become Zero records: no space, no codec time) and
//! blobs of at most `max_blob_sectors` non-zero sectors. With
//! [`Zeros::Store`] (a write-zeroes with NBD_CMD_FLAG_NO_HOLE) zero sectors
//! are blobs like any other, so the range stays mapped (provisioned).

use squeeze_format::SECTOR_SIZE;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// `sectors` all-zero sectors from `lba`.
    Zero { lba: u64, sectors: u64 },
    /// A blob of `sectors` sectors from `lba`, at byte `start` of the buffer.
    Data {
        lba: u64,
        sectors: u32,
        start: usize,
    },
}

/// What all-zero sectors of a write become.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Zeros {
    /// Holes: unmapped, no space, no codec time.
    #[default]
    Hole,
    /// Stored as data (compressed like any blob): the sectors stay mapped,
    /// which is what "provisioned" means on a compressing thin volume.
    Store,
}

/// Splits `buf` (whole sectors starting at `lba`).
pub fn split(buf: &[u8], lba: u64, max_blob_sectors: u32, zeros: Zeros) -> Vec<Piece> {
    assert!(buf.len().is_multiple_of(SECTOR_SIZE) && max_blob_sectors >= 1);
    let n = buf.len() / SECTOR_SIZE;
    let mut pieces = Vec::new();
    let sector_is_zero = |s: &[u8]| zeros == Zeros::Hole && sector_is_zero(s);
    let mut i = 0;
    while i < n {
        let zero = sector_is_zero(&buf[i * SECTOR_SIZE..(i + 1) * SECTOR_SIZE]);
        let mut j = i + 1;
        if zero {
            while j < n && sector_is_zero(&buf[j * SECTOR_SIZE..(j + 1) * SECTOR_SIZE]) {
                j += 1;
            }
            pieces.push(Piece::Zero {
                lba: lba + i as u64,
                sectors: (j - i) as u64,
            });
        } else {
            while j < n
                && j - i < max_blob_sectors as usize
                && !sector_is_zero(&buf[j * SECTOR_SIZE..(j + 1) * SECTOR_SIZE])
            {
                j += 1;
            }
            pieces.push(Piece::Data {
                lba: lba + i as u64,
                sectors: (j - i) as u32,
                start: i * SECTOR_SIZE,
            });
        }
        i = j;
    }
    pieces
}

/// Zero test without allocation; stops at the first non-zero 64-byte block.
#[inline]
pub fn sector_is_zero(s: &[u8]) -> bool {
    let mut acc = 0u64;
    for c in s.chunks_exact(64) {
        let mut a = 0u64;
        for w in c.chunks_exact(8) {
            a |= u64::from_ne_bytes(w.try_into().expect("8 bytes"));
        }
        acc |= a;
        if acc != 0 {
            return false;
        }
    }
    s.chunks_exact(64).remainder().iter().all(|&b| b == 0) && acc == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_runs_and_blobs() {
        let mut buf = vec![0u8; 10 * SECTOR_SIZE];
        for s in [2usize, 3, 4, 5, 6, 9] {
            buf[s * SECTOR_SIZE + 100] = 1;
        }
        let p = split(&buf, 100, 3, Zeros::Hole);
        assert_eq!(
            p,
            vec![
                Piece::Zero {
                    lba: 100,
                    sectors: 2
                },
                Piece::Data {
                    lba: 102,
                    sectors: 3,
                    start: 2 * SECTOR_SIZE
                },
                Piece::Data {
                    lba: 105,
                    sectors: 2,
                    start: 5 * SECTOR_SIZE
                },
                Piece::Zero {
                    lba: 107,
                    sectors: 2
                },
                Piece::Data {
                    lba: 109,
                    sectors: 1,
                    start: 9 * SECTOR_SIZE
                },
            ]
        );
        assert!(sector_is_zero(&[0; 100]));
        assert!(!sector_is_zero(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
        let mut s = vec![0u8; SECTOR_SIZE];
        assert!(sector_is_zero(&s));
        s[SECTOR_SIZE - 1] = 1;
        assert!(!sector_is_zero(&s));
    }
}
