//! A log record, version 2: a 6- to 13-byte header and the payload. What
//! the reader of the chain already knows (the log's id, the record's seq,
//! its epoch) is not stored: it seeds the CRC, so a record checks only
//! where it is the record the chain expects. I/O-free encode/decode.
//!
//! ```text
//! 0   flags u8
//!       bits 0-1  bytes of `len` less one (0, 1, 2: 1 to 3 bytes)
//!       bit 2     FIRST: the first record of its commit group (its seq is
//!                 the group's); `seq8` follows `len`
//!       bit 3     EPOCH: the first record an open writes; `epoch` follows
//!                 (only with FIRST)
//!       bits 4-6  zero
//!       bit 7     one: zeros (a sparse sector's tail, a dense log past
//!                 its end) are never a record
//! 1   crc u32     CRC32C of the seed (log_id u64, seq u64, epoch u32, LE),
//!                 then byte 0 and every byte from 5 to the payload's end
//! 5   len         payload bytes, little-endian, 1 to 3 bytes
//!     seq8 u8     FIRST only: the seq's low 8 bits
//!     epoch u32   EPOCH only: the epoch
//!     payload
//! ```
//!
//! A record's epoch when EPOCH is clear is the epoch of the record before it
//! in the chain (or, for the log's first live record, the header's
//! `start_epoch`): each open writes its records consecutively, and its
//! first one stores the epoch. A sparse 128-byte commit's header is 7 bytes
//! (FIRST); the records after the first in a group, 6. (Why 7: a sparse
//! commit's sector is one zstd block in the engine's format 6, its header
//! bytes literals; at 128 bytes of payload a 7-byte header keeps the engine
//! record at 112 bytes, an 8-byte one takes it to 128: `examples/
//! commit_bytes.rs`.)
//!
//! Why this is as safe as version 1 (whose header stored the log id, seq,
//! group and epoch, checked them, then the CRC): recovery looks for record
//! `seq` of epoch `e` (e = the previous record's, or a stored one no older
//! than it and no newer than the header's) at the places the writer could
//! have put it, and takes a record there only if its CRC, seeded with this
//! log's id, `seq` and `e`, matches. A record of another log, of another
//! seq (a later record of a torn group, a record of an earlier lap of the
//! ring) or of an older epoch (a torn group's leftover that a newer epoch's
//! records have reached) has a different seed: its CRC fails as surely as
//! version 1's field comparisons would have refused it, but for the chance
//! of a CRC32C collision (2^-32 per record looked at; zeros, where the
//! chain most often looks past its end, are refused by the flags' marker
//! bit, as version 1's magic refused them). The group is implied
//! by FIRST (a record not FIRST belongs to the group of the record before
//! it). The probe for records of later groups (`probe.rs`), which does not
//! know their seqs, reads FIRST records only: a group holds at most 255
//! records (`GROUP_RECORDS_MAX`), so the first record of the group
//! after the end's has a seq within 255 above the end's, which `seq8`
//! names; it tries each epoch the log has had since the end's record.

use crate::record::PAYLOAD_MAX;

pub const FLAG_LEN_BYTES: u8 = 0b11;
pub const FLAG_FIRST: u8 = 1 << 2;
pub const FLAG_EPOCH: u8 = 1 << 3;
pub const FLAG_RECORD: u8 = 1 << 7;
const FLAGS_KNOWN: u8 = FLAG_LEN_BYTES | FLAG_FIRST | FLAG_EPOCH | FLAG_RECORD;
/// The shortest header: flags, CRC, a one-byte length.
pub const HEADER_BYTES_MIN: usize = 6;
/// The longest: a three-byte length, seq8, epoch.
pub const HEADER_BYTES_MAX: usize = 5 + 3 + 1 + 4;
const _: () = assert!(PAYLOAD_MAX < 1 << 24);
/// Most records one commit group carries (the writer's limit, for every
/// version): the probe for later groups (`probe.rs`) counts on the group
/// after any record's starting within 255 seqs of it, which `seq8` names.
pub const GROUP_RECORDS_MAX: usize = 255;

/// A decoded header (what the record stores; the rest is implied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeaderV2 {
    pub len: u32,
    /// FIRST: the seq's low 8 bits.
    pub first: Option<u8>,
    /// EPOCH: the stored epoch.
    pub epoch: Option<u32>,
}

/// Bytes of `len` in a header.
fn len_bytes(len: u32) -> usize {
    match len {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        _ => 3,
    }
}

/// The CRC's seed: what a record does not store.
fn seed(log_id: u64, seq: u64, epoch: u32) -> u32 {
    let mut s = [0u8; 20];
    s[0..8].copy_from_slice(&log_id.to_le_bytes());
    s[8..16].copy_from_slice(&seq.to_le_bytes());
    s[16..20].copy_from_slice(&epoch.to_le_bytes());
    crc32c::crc32c(&s)
}

/// The CRC of a whole record `b` (header and payload) as record `seq` of
/// epoch `epoch` of log `log_id`.
fn crc_of(b: &[u8], log_id: u64, seq: u64, epoch: u32) -> u32 {
    let c = crc32c::crc32c_append(seed(log_id, seq, epoch), &b[..1]);
    crc32c::crc32c_append(c, &b[5..])
}

impl RecordHeaderV2 {
    /// The header of a record of `len` bytes: FIRST of its group or not,
    /// storing `epoch` if it is the first record its open writes.
    pub fn new(len: u32, seq: u64, epoch: u32, first: bool, store_epoch: bool) -> RecordHeaderV2 {
        assert!(len as usize <= PAYLOAD_MAX);
        assert!(
            first || !store_epoch,
            "an open's first record starts a group"
        );
        RecordHeaderV2 {
            len,
            first: first.then_some(seq as u8),
            epoch: store_epoch.then_some(epoch),
        }
    }

    /// Bytes of this header.
    pub fn header_bytes(&self) -> usize {
        5 + len_bytes(self.len)
            + usize::from(self.first.is_some())
            + if self.epoch.is_some() { 4 } else { 0 }
    }

    pub fn record_bytes(&self) -> u64 {
        (self.header_bytes() + self.len as usize) as u64
    }

    /// Bytes of the header that starts with `flags`, or `None` if `flags`
    /// is not a version 2 record's.
    pub fn header_bytes_of(flags: u8) -> Option<usize> {
        let lb = usize::from(flags & FLAG_LEN_BYTES) + 1;
        let valid = flags & !FLAGS_KNOWN == 0
            && flags & FLAG_RECORD != 0
            && lb <= 3
            && (flags & FLAG_EPOCH == 0 || flags & FLAG_FIRST != 0);
        valid.then(|| {
            5 + lb
                + usize::from(flags & FLAG_FIRST != 0)
                + if flags & FLAG_EPOCH != 0 { 4 } else { 0 }
        })
    }

    /// Appends the encoded record (header and payload) of record `seq` of
    /// epoch `epoch` of log `log_id` to `out`.
    pub fn encode_into(
        &self,
        log_id: u64,
        seq: u64,
        epoch: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) {
        assert_eq!(payload.len(), self.len as usize);
        assert!(self.epoch.is_none_or(|e| e == epoch));
        assert!(self.first.is_none_or(|s| s == seq as u8));
        let start = out.len();
        let lb = len_bytes(self.len);
        let mut flags = FLAG_RECORD | (lb - 1) as u8;
        if self.first.is_some() {
            flags |= FLAG_FIRST;
        }
        if self.epoch.is_some() {
            flags |= FLAG_EPOCH;
        }
        out.push(flags);
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.len.to_le_bytes()[..lb]);
        if let Some(s) = self.first {
            out.push(s);
        }
        if let Some(e) = self.epoch {
            out.extend_from_slice(&e.to_le_bytes());
        }
        debug_assert_eq!(out.len() - start, self.header_bytes());
        out.extend_from_slice(payload);
        let crc = crc_of(&out[start..], log_id, seq, epoch);
        out[start + 1..start + 5].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes a header from `b` (at least its `header_bytes_of` bytes);
    /// `None` if it is not a version 2 record's header.
    pub fn decode(b: &[u8]) -> Option<RecordHeaderV2> {
        let flags = *b.first()?;
        let n = RecordHeaderV2::header_bytes_of(flags)?;
        if b.len() < n {
            return None;
        }
        let lb = usize::from(flags & FLAG_LEN_BYTES) + 1;
        let mut l = [0u8; 4];
        l[..lb].copy_from_slice(&b[5..5 + lb]);
        let len = u32::from_le_bytes(l);
        // The shortest encoding only: one record, one byte string.
        if len as usize > PAYLOAD_MAX || len_bytes(len) != lb {
            return None;
        }
        let mut at = 5 + lb;
        let first = (flags & FLAG_FIRST != 0).then(|| {
            at += 1;
            b[at - 1]
        });
        let epoch = (flags & FLAG_EPOCH != 0).then(|| {
            at += 4;
            u32::from_le_bytes(b[at - 4..at].try_into().expect("4"))
        });
        Some(RecordHeaderV2 { len, first, epoch })
    }
}

/// True if `b` (a whole record: header and payload) is record `seq` of
/// epoch `epoch` of log `log_id`: its CRC matches that seed.
pub fn verify(b: &[u8], log_id: u64, seq: u64, epoch: u32) -> bool {
    let want = u32::from_le_bytes(b[1..5].try_into().expect("4"));
    crc_of(b, log_id, seq, epoch) == want
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(h: RecordHeaderV2, seq: u64, epoch: u32, p: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        h.encode_into(7, seq, epoch, p, &mut b);
        b
    }

    #[test]
    fn sizes() {
        assert_eq!(
            RecordHeaderV2::new(128, 9, 2, false, false).header_bytes(),
            6
        );
        assert_eq!(
            RecordHeaderV2::new(128, 9, 2, true, false).header_bytes(),
            7
        );
        assert_eq!(
            RecordHeaderV2::new(128, 9, 2, true, true).header_bytes(),
            11
        );
        assert_eq!(
            RecordHeaderV2::new(300, 9, 2, false, false).header_bytes(),
            7
        );
        let max = RecordHeaderV2::new(PAYLOAD_MAX as u32, 9, 2, true, true);
        assert_eq!(max.header_bytes(), HEADER_BYTES_MAX);
    }

    #[test]
    fn round_trip_and_damage() {
        for (first, store) in [(false, false), (true, false), (true, true)] {
            let h = RecordHeaderV2::new(3, 0x105, 0x102, first, store);
            let b = enc(h, 0x105, 0x102, b"abc");
            assert_eq!(b.len() as u64, h.record_bytes());
            assert_eq!(RecordHeaderV2::decode(&b), Some(h));
            assert!(verify(&b, 7, 0x105, 0x102));
            for i in 0..b.len() {
                for bit in 0..8 {
                    let mut bad = b.clone();
                    bad[i] ^= 1 << bit;
                    let ok = RecordHeaderV2::decode(&bad).is_some_and(|x| x == h)
                        && verify(&bad, 7, 0x105, 0x102);
                    assert!(!ok, "flip of bit {bit} of byte {i} not detected");
                }
            }
        }
    }

    #[test]
    fn what_is_implied_is_checked() {
        let h = RecordHeaderV2::new(3, 5, 2, true, false);
        let b = enc(h, 5, 2, b"abc");
        assert!(verify(&b, 7, 5, 2));
        assert!(!verify(&b, 8, 5, 2), "another log's record");
        assert!(!verify(&b, 7, 6, 2), "another seq");
        assert!(
            !verify(&b, 7, 5 + (1 << 8), 2),
            "the same seq8, another seq"
        );
        assert!(!verify(&b, 7, 5, 1), "an older epoch");
        assert!(!verify(&b, 7, 5, 3), "a newer epoch");
    }

    #[test]
    fn unknown_flags_and_long_lengths_are_not_records() {
        let b = enc(RecordHeaderV2::new(3, 5, 2, false, false), 5, 2, b"abc");
        for f in [0u8, 0x04, 0x94, 0x83, FLAG_RECORD | FLAG_EPOCH] {
            let mut bad = b.clone();
            bad[0] = f;
            assert_eq!(RecordHeaderV2::decode(&bad), None, "flags {f:#x}");
        }
        // A length of 3 in two bytes: not the shortest encoding.
        let mut long = vec![0x81u8, 0, 0, 0, 0, 3, 0];
        long.extend_from_slice(b"abc");
        assert_eq!(RecordHeaderV2::decode(&long), None);
        // Zeros: no record, not even an empty one with a zero CRC.
        assert_eq!(RecordHeaderV2::decode(&[0u8; 16]), None);
        assert_eq!(RecordHeaderV2::header_bytes_of(0), None);
    }
}
