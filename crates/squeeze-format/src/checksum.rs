//! CRC-32C (Castagnoli), hardware accelerated where the CPU has it. Every
//! on-disk structure is protected by one.
//!
//! Computed by the crc-fast crate: folding with (V)PCLMULQDQ and the CPU's
//! crc32 instruction, chosen at run time, with a portable fallback. Every
//! volume before it was written with the crc32c crate; the tests below
//! hold the two to the same values.

use crc_fast::{CrcAlgorithm, Digest};

/// CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// Continues a CRC-32C over more bytes: `crc32c_append(crc32c(a), b)` is
/// `crc32c(a ++ b)`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    // The running state is the finished value before its final inversion.
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn the_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// The values the crc32c crate gave every earlier volume, at every
    /// length around the implementations' block sizes and at odd offsets.
    #[test]
    fn equals_what_earlier_volumes_were_written_with() {
        let data = bytes(300_000, 7);
        let mut lens: Vec<usize> = (0..=600).collect();
        lens.extend([
            1023, 1024, 1025, 4095, 4096, 4097, 13_000, 32_768, 65_536, 131_072, 299_000,
        ]);
        for len in lens {
            for at in [0, 1, 3, 8, 61] {
                let d = &data[at..at + len];
                assert_eq!(crc32c(d), crc32c::crc32c(d), "{len} bytes at {at}");
            }
        }
    }

    #[test]
    fn appending_continues_the_crc() {
        let data = bytes(70_000, 11);
        for split in [0, 1, 7, 64, 100, 4096, 40_000, 70_000] {
            let (a, b) = data.split_at(split);
            assert_eq!(
                crc32c_append(crc32c(a), b),
                crc32c(&data),
                "split at {split}"
            );
            assert_eq!(
                crc32c_append(crc32c(a), b),
                crc32c::crc32c_append(crc32c::crc32c(a), b)
            );
        }
        // Seeded chains, as squeeze-wal and the checkpoints use them.
        assert_eq!(
            crc32c_append(0x1234_5678, b"abc"),
            crc32c::crc32c_append(0x1234_5678, b"abc")
        );
        assert_eq!(crc32c_append(0, b""), 0);
    }
}
