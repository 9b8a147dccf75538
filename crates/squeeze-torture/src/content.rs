//! Deterministic write content. Every byte is a function of (seed, write
//! id, absolute offset, kind), so the model never stores payloads, and
//! every 512-byte-aligned position a write covers carries a 16-byte stamp
//! naming the write, so a wrong sector can be traced to the write(s) whose
//! bytes it holds.

use crate::rng::mix;

/// The engine's sector; the unit the model tracks.
pub const SECTOR: u64 = 4096;
/// Stamps sit at every multiple of this absolute offset.
pub const STAMP_EVERY: u64 = 512;
pub const STAMP_MAGIC: &[u8; 4] = b"SQZT";
const STAMP_BYTES: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Pseudo-random bytes: the compressor gives up (stored raw).
    Random,
    /// Text-like lines: compresses several times.
    Text,
    /// All zeros: the engine stores a zero record, not data.
    Zero,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Random => "random",
            Kind::Text => "text",
            Kind::Zero => "zero",
        }
    }
}

const WORDS: [&str; 16] = [
    "squeeze ", "extent ", "segment ", "cleaner ", "flush ", "replay ", "sector ", "torture ",
    "crash ", "durable ", "record ", "volume ", "journal ", "bytes ", "zstd ", "lz4 ",
];

fn put_hex(out: &mut [u8; 64], pos: &mut usize, mut v: u64) {
    let mut digits = [0u8; 16];
    let mut n = 0;
    loop {
        digits[n] = b"0123456789abcdef"[(v & 15) as usize];
        n += 1;
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    while n > 0 && *pos < 63 {
        n -= 1;
        out[*pos] = digits[n];
        *pos += 1;
    }
}

/// The 64-byte text line at absolute line number `line` of write `id`.
fn text_line(seed: u64, id: u64, line: u64) -> [u8; 64] {
    let mut out = [b' '; 64];
    let mut pos = 0;
    put_hex(&mut out, &mut pos, id);
    out[pos] = b':';
    pos += 1;
    put_hex(&mut out, &mut pos, line);
    pos += 1;
    let mut h = mix(seed ^ mix(id) ^ (line >> 3));
    while pos < 63 {
        let w = WORDS[(h & 15) as usize].as_bytes();
        h = h.rotate_right(4);
        let n = w.len().min(63 - pos);
        out[pos..pos + n].copy_from_slice(&w[..n]);
        pos += n;
    }
    out[63] = b'\n';
    out
}

/// Fills `buf` with the content write `id` of `kind` puts at `offset`.
pub fn fill(buf: &mut [u8], seed: u64, id: u64, offset: u64, kind: Kind) {
    match kind {
        Kind::Zero => buf.fill(0),
        Kind::Random => {
            let key = mix(seed ^ 0xabcd) ^ mix(id.wrapping_mul(0x9e37_79b9));
            let end = offset + buf.len() as u64;
            let mut word = offset >> 3;
            while word << 3 < end {
                let bytes = mix(key ^ word).to_le_bytes();
                let from = (word << 3).max(offset);
                let to = ((word << 3) + 8).min(end);
                buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(
                    &bytes[(from - (word << 3)) as usize..(to - (word << 3)) as usize],
                );
                word += 1;
            }
        }
        Kind::Text => {
            let end = offset + buf.len() as u64;
            let mut line = offset / 64;
            while line * 64 < end {
                let l = text_line(seed, id, line);
                let from = (line * 64).max(offset);
                let to = (line * 64 + 64).min(end);
                buf[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&l[(from - line * 64) as usize..(to - line * 64) as usize]);
                line += 1;
            }
        }
    }
    if kind == Kind::Zero {
        return;
    }
    let end = offset + buf.len() as u64;
    let mut at = offset.div_ceil(STAMP_EVERY) * STAMP_EVERY;
    while at + STAMP_BYTES <= end {
        let i = (at - offset) as usize;
        buf[i..i + 4].copy_from_slice(STAMP_MAGIC);
        buf[i + 4..i + 12].copy_from_slice(&id.to_le_bytes());
        buf[i + 12..i + 16].copy_from_slice(&((at / STAMP_EVERY) as u32).to_le_bytes());
        at += STAMP_EVERY;
    }
}

/// The write ids whose stamps appear in `data` (read at absolute `offset`,
/// a multiple of `STAMP_EVERY`), each with the count of its stamps; a
/// stamp whose position field is wrong is reported with id `u64::MAX`.
pub fn stamps(data: &[u8], offset: u64) -> Vec<(u64, usize)> {
    let mut found: Vec<(u64, usize)> = Vec::new();
    for (k, chunk) in data.chunks(STAMP_EVERY as usize).enumerate() {
        if chunk.len() < 16 || &chunk[..4] != STAMP_MAGIC {
            continue;
        }
        let mut id = u64::from_le_bytes(chunk[4..12].try_into().unwrap());
        let pos = u32::from_le_bytes(chunk[12..16].try_into().unwrap());
        if u64::from(pos) != offset / STAMP_EVERY + k as u64 {
            id = u64::MAX;
        }
        match found.iter_mut().find(|(i, _)| *i == id) {
            Some(e) => e.1 += 1,
            None => found.push((id, 1)),
        }
    }
    found
}

/// A 64-bit fingerprint of one sector's bytes.
pub fn hash(data: &[u8]) -> u64 {
    let mut h = 0x736f_6d65_7073_6575u64 ^ data.len() as u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap()))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    mix(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_a_function_of_position() {
        for kind in [Kind::Random, Kind::Text] {
            let mut whole = vec![0u8; 20000];
            fill(&mut whole, 1, 9, 1000, kind);
            let mut part = vec![0u8; 777];
            fill(&mut part, 1, 9, 5003, kind);
            assert_eq!(&whole[4003..4780], &part[..], "{kind:?}");
            let st = stamps(&whole[24..24 + 4096], 1024);
            assert_eq!(st, vec![(9, 8)]);
        }
    }

    #[test]
    fn text_compresses_and_random_does_not_repeat() {
        let mut t = vec![0u8; 4096];
        fill(&mut t, 1, 2, 0, Kind::Text);
        assert!(
            t.iter()
                .filter(|b| b.is_ascii_graphic() || **b == b' ')
                .count()
                > 3900
        );
        let mut r = vec![0u8; 4096];
        fill(&mut r, 1, 2, 0, Kind::Random);
        let mut r2 = vec![0u8; 4096];
        fill(&mut r2, 1, 3, 0, Kind::Random);
        assert_ne!(hash(&r), hash(&r2));
        assert_ne!(hash(&r), hash(&[0u8; 4096]));
    }
}
