//! Deterministic synthetic data for tests and `squeeze bench`.
//!
//! [`fio_like`] reproduces fio's `buffer_compress_percentage` with
//! `buffer_compress_chunk`: every chunk of `chunk` bytes is
//! `(100 - pct)%` random bytes followed by `pct%` zeros, so an LZ codec
//! shrinks it to about `(100 - pct)%`. Same arguments, same bytes: the
//! generator is a seeded SplitMix64, filling eight bytes per step.

/// SplitMix64: tiny, fast, and good enough for benchmark payloads.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut words = buf.chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = words.into_remainder();
        let last = self.next_u64().to_le_bytes();
        tail.copy_from_slice(&last[..tail.len()]);
    }
}

/// `len` bytes like fio's `buffer_compress_percentage=compress_percentage`
/// with `buffer_compress_chunk=chunk` (0 = one chunk for the whole buffer):
/// each chunk starts with `(100 - pct)%` random bytes, the rest zeros.
/// `compress_percentage` above 100 is treated as 100.
pub fn fio_like(len: usize, compress_percentage: u32, chunk: usize, seed: u64) -> Vec<u8> {
    let pct = compress_percentage.min(100) as usize;
    let chunk = if chunk == 0 { len.max(1) } else { chunk };
    let mut rng = SplitMix64::new(seed);
    let mut buf = vec![0u8; len];
    for c in buf.chunks_mut(chunk) {
        let random_len = c.len() * (100 - pct) / 100;
        rng.fill(&mut c[..random_len]);
    }
    buf
}

/// `len` random bytes (incompressible).
pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    SplitMix64::new(seed).fill(&mut buf);
    buf
}

/// `len` bytes of English-like text: random words from a small vocabulary
/// with spaces, punctuation and newlines (compresses about 2:1 with lz4).
pub fn text(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: [&str; 48] = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "a",
        "is",
        "that",
        "for",
        "it",
        "as",
        "was",
        "with",
        "be",
        "by",
        "on",
        "not",
        "he",
        "this",
        "are",
        "or",
        "his",
        "from",
        "at",
        "which",
        "but",
        "have",
        "an",
        "had",
        "they",
        "you",
        "were",
        "their",
        "one",
        "all",
        "we",
        "can",
        "her",
        "has",
        "there",
        "been",
        "storage",
        "block",
        "compression",
        "extent",
        "segment",
        "volume",
        "log",
    ];
    let mut rng = SplitMix64::new(seed);
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        let r = rng.next_u64();
        out.extend_from_slice(WORDS[(r % WORDS.len() as u64) as usize].as_bytes());
        out.push(match (r >> 32) % 16 {
            0 => b'.',
            1 => b',',
            2 => b'\n',
            _ => b' ',
        });
    }
    out.truncate(len);
    out
}
