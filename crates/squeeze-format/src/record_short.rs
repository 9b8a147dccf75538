//! The short record header (format 4 and later; its layout is in
//! `record.rs`'s module text): the uuid not stored but first in the CRC,
//! the LBA and the moved record's offset / 16 in 40 bits, sectors,
//! stored_len, codec, kind and chunk code in one 32-bit word. Encoding and
//! decoding of that form; `record.rs` chooses it and checks bounds.

use crate::layout::{RECORD_ALIGN, SHORT_HEADER_SIZE, SHORT_MAX_SECTORS};
use crate::le::{get_u32, get_u64, put_u32, put_u64};
use crate::record::{
    chunk_sectors_of, HeaderForm, RecordHeader, RecordKind, SHORT_MAGIC, SHORT_STORED_MAX,
    SHORT_U40_MAX,
};
use crate::zstd_block::BLOCK_CODE;
use crate::{checksum, CodecId, FormatError};

impl RecordHeader {
    pub(crate) fn encode_short(&self, b: &mut [u8]) {
        assert_eq!(
            HeaderForm::choose(
                true,
                self.kind,
                self.lba,
                self.sectors,
                self.stored_len,
                self.aux
            ),
            HeaderForm::Short,
            "a record that does not fit a short header"
        );
        let kind_bit = u32::from(self.kind == RecordKind::Relocate);
        let fields = (self.sectors - 1)
            | (self.stored_len << 5)
            | (u32::from(self.codec as u8) << 23)
            | (kind_bit << 26)
            | (self.chunk_code() << 27);
        b[0..2].copy_from_slice(&SHORT_MAGIC);
        put_u32(b, 2, fields);
        put_u64(b, 6, self.seq);
        put_u40(b, 14, self.lba);
        put_u40(b, 19, self.aux / RECORD_ALIGN);
        put_u32(b, 24, self.payload_crc);
        let crc = short_crc(&self.uuid, &b[..28]);
        put_u32(b, 28, crc);
    }

    pub(crate) fn decode_short(b: &[u8], uuid: &[u8; 16]) -> Result<RecordHeader, FormatError> {
        if b.len() < SHORT_HEADER_SIZE {
            return Err(FormatError::Truncated {
                what: "record header",
                need: SHORT_HEADER_SIZE,
                have: b.len(),
            });
        }
        let expected = get_u32(b, 28);
        let got = short_crc(uuid, &b[..28]);
        if expected != got {
            return Err(FormatError::ChecksumMismatch {
                what: "record header",
                expected,
                got,
            });
        }
        let fields = get_u32(b, 2);
        if fields >> 30 != 0 {
            return Err(FormatError::Invalid {
                what: "record",
                why: "reserved bits set in a short header".into(),
            });
        }
        let h = RecordHeader {
            kind: if fields >> 26 & 1 == 0 {
                RecordKind::Extent
            } else {
                RecordKind::Relocate
            },
            codec: CodecId::from_u8((fields >> 23 & 7) as u8)?,
            seq: get_u64(b, 6),
            uuid: *uuid,
            lba: get_u40(b, 14),
            sectors: (fields & 31) + 1,
            stored_len: fields >> 5 & SHORT_STORED_MAX,
            aux: get_u40(b, 19) * RECORD_ALIGN,
            payload_crc: get_u32(b, 24),
            chunk_sectors: chunk_sectors_of(fields >> 27 & 7)?,
            block: fields >> 27 & 7 == BLOCK_CODE,
            form: HeaderForm::Short,
        };
        h.check_bounds()?;
        // What `HeaderForm::choose` never writes in the short form.
        let why = if h.lba + u64::from(h.sectors) > SHORT_MAX_SECTORS {
            "short header's sectors pass 2^40"
        } else if h.kind == RecordKind::Extent && h.aux != 0 {
            "short extent header with an aux field"
        } else {
            return Ok(h);
        };
        Err(FormatError::Invalid {
            what: "record",
            why: why.into(),
        })
    }
}

/// A short header's CRC: the volume's uuid, then the header's bytes.
pub(crate) fn short_crc(uuid: &[u8; 16], bytes: &[u8]) -> u32 {
    checksum::crc32c_append(checksum::crc32c(uuid), bytes)
}

fn put_u40(b: &mut [u8], at: usize, v: u64) {
    debug_assert!(v <= SHORT_U40_MAX);
    b[at..at + 5].copy_from_slice(&v.to_le_bytes()[..5]);
}

fn get_u40(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..5].copy_from_slice(&b[at..at + 5]);
    u64::from_le_bytes(v)
}
