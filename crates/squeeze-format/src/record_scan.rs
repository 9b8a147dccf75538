//! The record walk of the log: every record of a buffer of log bytes, as
//! the cleaner walks a segment and recovery probes bytes after a gap.

use crate::layout::{RECORD_ALIGN, RECORD_HEADER_SIZE, SHORT_HEADER_SIZE};
use crate::record::RecordHeader;

/// How a [`RecordScan`] goes on after a record it yielded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stride {
    /// Past the record: a walk over a segment's records (the cleaner).
    Record,
    /// To the next aligned offset: a probe for valid records among bytes
    /// that may hold torn or stale ones (recovery after a gap).
    Probe,
}

/// One record a [`RecordScan`] found: its offset in the buffer, its header
/// and its payload (not yet checked against the payload CRC).
#[derive(Clone, Copy, Debug)]
pub struct ScannedRecord<'a> {
    pub offset: usize,
    pub header: RecordHeader,
    pub payload: &'a [u8],
}

/// The records in a buffer of log bytes: at each [`RECORD_ALIGN`]ed offset,
/// a header of either form that decodes (magic, header CRC), is of the
/// volume `uuid` and whose record ends inside the buffer is yielded; other
/// bytes are passed over at the next aligned offset. The one record walk of
/// the engine's cleaner and recovery.
pub struct RecordScan<'a> {
    buf: &'a [u8],
    uuid: [u8; 16],
    stride: Stride,
    off: usize,
}

impl<'a> RecordScan<'a> {
    /// Scans `buf` from its start (which must be record-aligned in the log).
    pub fn new(buf: &'a [u8], uuid: [u8; 16], stride: Stride) -> RecordScan<'a> {
        RecordScan {
            buf,
            uuid,
            stride,
            off: 0,
        }
    }
}

impl<'a> Iterator for RecordScan<'a> {
    type Item = ScannedRecord<'a>;

    fn next(&mut self) -> Option<ScannedRecord<'a>> {
        let align = RECORD_ALIGN as usize;
        while self.off + SHORT_HEADER_SIZE <= self.buf.len() {
            let at = self.off;
            let end = (at + RECORD_HEADER_SIZE).min(self.buf.len());
            if let Ok(h) = RecordHeader::decode(&self.buf[at..end], &self.uuid) {
                let len = h.record_len() as usize;
                if h.uuid == self.uuid && at + len <= self.buf.len() {
                    self.off += match self.stride {
                        Stride::Record => len,
                        Stride::Probe => align,
                    };
                    let p = at + h.header_len();
                    return Some(ScannedRecord {
                        offset: at,
                        header: h,
                        payload: &self.buf[p..p + h.stored_len as usize],
                    });
                }
            }
            self.off += align;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{HeaderForm, RecordKind};
    use crate::CodecId;

    /// The bytes of a one-sector extent record of volume `uuid` carrying
    /// `payload`, its header in `form`, padded to the next record.
    fn extent(uuid: [u8; 16], lba: u64, seq: u64, form: HeaderForm, payload: &[u8]) -> Vec<u8> {
        let h = RecordHeader {
            kind: RecordKind::Extent,
            codec: CodecId::Lz4,
            seq,
            uuid,
            lba,
            sectors: 1,
            stored_len: payload.len() as u32,
            aux: 0,
            payload_crc: crate::checksum::crc32c(payload),
            chunk_sectors: 0,
            block: false,
            form,
        };
        let mut b = vec![0u8; h.record_len() as usize];
        h.encode(&mut b);
        b[h.header_len()..h.header_len() + payload.len()].copy_from_slice(payload);
        b
    }

    #[test]
    fn record_scan_walks_records_and_passes_over_other_bytes() {
        let uuid = [7u8; 16];
        let rec = |lba, seq, payload: &[u8]| extent(uuid, lba, seq, HeaderForm::Full, payload);
        let mut buf = rec(1, 10, &[1u8; 40]);
        buf.extend_from_slice(&[0xa5u8; 48]); // garbage, three aligned slots
        let second = buf.len();
        buf.extend(rec(2, 11, &[2u8; 100]));
        let mut other = rec(3, 12, &[3u8; 8]);
        other[8] ^= 0xff; // a damaged header
        buf.extend(other);
        let walk: Vec<_> = RecordScan::new(&buf, uuid, Stride::Record).collect();
        assert_eq!(walk.len(), 2);
        assert_eq!((walk[0].offset, walk[0].header.lba), (0, 1));
        assert_eq!(walk[0].payload, &[1u8; 40][..]);
        assert_eq!((walk[1].offset, walk[1].header.lba), (second, 2));
        // Another volume's records are not ours.
        assert_eq!(RecordScan::new(&buf, [8u8; 16], Stride::Record).count(), 0);
        // A record cut by the end of the buffer is not yielded.
        assert_eq!(
            RecordScan::new(&buf[..second + 70], uuid, Stride::Probe).count(),
            1
        );
    }

    #[test]
    fn record_scan_reads_both_forms_side_by_side() {
        let uuid = [7u8; 16];
        let rec = |lba, form, payload: &[u8]| extent(uuid, lba, lba + 100, form, payload);
        let mut buf = rec(1, HeaderForm::Short, &[1u8; 5]);
        buf.extend(rec(2, HeaderForm::Full, &[2u8; 40]));
        buf.extend(rec(3, HeaderForm::Short, &[3u8; 16]));
        let walk: Vec<_> = RecordScan::new(&buf, uuid, Stride::Record).collect();
        let got: Vec<_> = walk
            .iter()
            .map(|r| (r.offset, r.header.lba, r.payload.len()))
            .collect();
        assert_eq!(got, vec![(0, 1, 5), (48, 2, 40), (160, 3, 16)]);
        assert_eq!(RecordScan::new(&buf, uuid, Stride::Probe).count(), 3);
        // A short record is another volume's when its uuid differs.
        assert_eq!(RecordScan::new(&buf, [8u8; 16], Stride::Record).count(), 0);
        // The last 48 bytes alone: a short record whole at the end.
        assert_eq!(RecordScan::new(&buf[160..], uuid, Stride::Probe).count(), 1);
    }
}
