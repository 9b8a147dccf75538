//! Block payloads (format 6): a zstd record whose chunk code is
//! [`BLOCK_CODE`] stores only the body of one compressed zstd block
//! (RFC 8878, 3.1.1.3), whose content is the extent's raw bytes up to its
//! last non-zero one; the raw bytes after it are zeros. The frame around
//! the block is implied, so a reader rebuilds it in front of the body and
//! decodes an ordinary frame:
//!
//! ```text
//! byte 0  magic              u32  0xFD2FB528
//!      4  frame descriptor   u8   0: no content size, no checksum, no
//!                                 dictionary, not single-segment
//!      5  window descriptor  u8   the extent's raw length rounded up to a
//!                                 power of two: (log2 - 10) << 3
//!      6  block header       u24  last block (bit 0), compressed (bits
//!                                 1..3 = 2), size = the record's stored_len
//!                                 (bits 3..24)
//!      9  the payload
//! ```
//!
//! What this saves against a frame of the whole extent (format 1 to 5):
//! the 9 bytes, the frame's content size (1 to 4 bytes) and the coding of
//! the zero tail (a sequence, about 3 bytes): 14 bytes on a sector that
//! holds a 128-byte commit of squeeze-wal (docs/benchmarks.md, "Sparse
//! WAL").
//!
//! Invariant: the payload is a block of one frame only; a writer whose
//! compressor made anything else (several blocks, a raw or RLE block, a
//! frame header of other fields, a larger window) writes a frame with
//! chunk code 0 instead ([`body_of_frame`] tells).

use crate::layout::{MAX_BLOB_SECTORS, SECTOR_SIZE};

/// The chunk code (record header) of a block payload.
pub const BLOCK_CODE: u32 = 6;
/// Bytes of the implied frame and block headers.
pub const IMPLIED_BYTES: usize = 9;
/// The zstd frame magic.
const MAGIC: u32 = 0xFD2F_B528;
/// Largest raw length a block payload decodes to (a zstd block holds at
/// most 128 KiB).
pub const MAX_RAW_BYTES: usize = 128 << 10;
const _: () = assert!(MAX_BLOB_SECTORS as usize * SECTOR_SIZE <= MAX_RAW_BYTES);

/// The window descriptor implied for an extent of `raw_len` bytes.
fn window_descriptor(raw_len: usize) -> u8 {
    let log = raw_len.next_power_of_two().max(1 << 10).trailing_zeros();
    ((log - 10) << 3) as u8
}

/// The frame and block headers a block payload of `body_len` bytes, for an
/// extent of `raw_len` bytes, decodes behind.
pub fn implied_header(raw_len: usize, body_len: usize) -> [u8; IMPLIED_BYTES] {
    assert!(raw_len <= MAX_RAW_BYTES && body_len < 1 << 21);
    let mut h = [0u8; IMPLIED_BYTES];
    h[..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4] = 0;
    h[5] = window_descriptor(raw_len);
    let block = 1 | (2 << 1) | ((body_len as u32) << 3);
    h[6..9].copy_from_slice(&block.to_le_bytes()[..3]);
    h
}

/// The block payload of `frame`, a zstd frame of (a prefix of) an extent
/// of `raw_len` bytes, if the frame is exactly [`implied_header`] (its
/// window at most the implied one) followed by its one block.
pub fn body_of_frame(frame: &[u8], raw_len: usize) -> Option<&[u8]> {
    if frame.len() <= IMPLIED_BYTES || raw_len > MAX_RAW_BYTES {
        return None;
    }
    let body = &frame[IMPLIED_BYTES..];
    let want = implied_header(raw_len, body.len());
    let ok = frame[..5] == want[..5] && frame[5] <= want[5] && frame[6..9] == want[6..9];
    ok.then_some(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implied_header_fields() {
        let h = implied_header(4096, 100);
        assert_eq!(h[..4], [0x28, 0xb5, 0x2f, 0xfd]);
        assert_eq!((h[4], h[5]), (0, 2 << 3));
        assert_eq!(u32::from_le_bytes([h[6], h[7], h[8], 0]), 1 | 4 | 100 << 3);
        assert_eq!(implied_header(3 * 4096, 1)[5], 4 << 3);
        assert_eq!(implied_header(MAX_RAW_BYTES, 1)[5], 7 << 3);
    }

    #[test]
    fn a_frame_is_a_body_only_with_the_implied_fields() {
        let mut f = implied_header(4096, 3).to_vec();
        f.extend_from_slice(&[1, 2, 3]);
        assert_eq!(body_of_frame(&f, 4096), Some(&[1u8, 2, 3][..]));
        // A smaller window than implied is fine; a larger one is not.
        f[5] = 0;
        assert!(body_of_frame(&f, 4096).is_some());
        f[5] = 3 << 3;
        assert!(body_of_frame(&f, 4096).is_none());
        f[5] = 2 << 3;
        for (at, bit) in [(0, 1), (4, 0x20), (4, 0x40), (6, 1), (6, 2), (6, 8)] {
            let mut g = f.clone();
            g[at] ^= bit;
            assert!(body_of_frame(&g, 4096).is_none(), "byte {at} bit {bit}");
        }
        // Bytes after the block: a second block, not ours.
        let mut g = f.clone();
        g.push(0);
        assert!(body_of_frame(&g, 4096).is_none());
        assert!(body_of_frame(&f[..9], 4096).is_none());
    }
}
