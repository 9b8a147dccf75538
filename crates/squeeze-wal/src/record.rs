//! A log record: a 40-byte header and the payload, checksummed together.
//! I/O-free encode/decode.
//!
//! ```text
//! 0   magic u32 "SWR1"
//! 4   crc u32        CRC32C of bytes 8..40 and the payload
//! 8   log_id u64     the log's id (header): a record of another log is not ours
//! 16  seq u64        consecutive from 0 over the log's life
//! 24  group u64      seq of the first record of its commit group
//! 32  epoch u32      the open that wrote it (header epoch at the time)
//! 36  len u32        payload bytes
//! 40  payload
//! ```
//!
//! Dense logs pack records back to back; sparse logs start every commit
//! group on a new sector. A record never crosses the end of the record
//! area: one that would starts at the area's beginning instead (the log
//! wraps; positions keep growing, area offset = position % area_bytes).

pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SWR1");
pub const RECORD_HEADER_BYTES: usize = 40;
/// The largest payload a record carries.
pub const PAYLOAD_MAX: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub log_id: u64,
    pub seq: u64,
    pub group: u64,
    pub epoch: u32,
    pub len: u32,
}

impl RecordHeader {
    pub fn record_bytes(&self) -> u64 {
        RECORD_HEADER_BYTES as u64 + u64::from(self.len)
    }

    /// Appends the encoded record (header and payload) to `out`.
    pub fn encode_into(&self, payload: &[u8], out: &mut Vec<u8>) {
        assert_eq!(payload.len(), self.len as usize);
        let start = out.len();
        out.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.log_id.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.group.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(payload);
        let crc = crc32c::crc32c(&out[start + 8..]);
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes a header whose magic matches (the CRC needs the payload:
    /// [`verify`]); `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<RecordHeader> {
        if b.len() < RECORD_HEADER_BYTES || b[0..4] != RECORD_MAGIC.to_le_bytes() {
            return None;
        }
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
        let h = RecordHeader {
            log_id: u64_at(8),
            seq: u64_at(16),
            group: u64_at(24),
            epoch: u32_at(32),
            len: u32_at(36),
        };
        (h.len as usize <= PAYLOAD_MAX && h.group <= h.seq).then_some(h)
    }
}

/// True if `b` (header and payload, `RECORD_HEADER_BYTES + len` bytes)
/// carries a matching CRC.
pub fn verify(b: &[u8]) -> bool {
    let want = u32::from_le_bytes(b[4..8].try_into().expect("4"));
    crc32c::crc32c(&b[8..]) == want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let h = RecordHeader {
            log_id: 5,
            seq: 10,
            group: 9,
            epoch: 2,
            len: 3,
        };
        let mut b = Vec::new();
        h.encode_into(b"abc", &mut b);
        assert_eq!(b.len(), 43);
        assert_eq!(RecordHeader::decode(&b), Some(h));
        assert!(verify(&b));
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            let ok = RecordHeader::decode(&bad).is_some_and(|x| x == h) && verify(&bad);
            assert!(!ok, "flip at byte {i} not detected");
        }
    }
}
