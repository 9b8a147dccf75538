//! Reads log bytes by position through a window of the volume: records are
//! small and the engine decompresses whole blobs, so one volume read of a
//! window serves many records. Positions map to the record area modulo its
//! size; a read never crosses the area's end (records never do).

use crate::error::Result;
use crate::header::Header;
use squeeze_engine::Volume;

/// Bytes of the area one volume read brings in.
pub const WINDOW_BYTES: u64 = 1 << 20;

pub struct Reader<'a> {
    vol: &'a Volume,
    area_start: u64,
    area_bytes: u64,
    /// Area offset of `buf[0]`.
    at: u64,
    buf: Vec<u8>,
}

impl<'a> Reader<'a> {
    pub fn new(vol: &'a Volume, h: &Header) -> Reader<'a> {
        Reader {
            vol,
            area_start: h.area_start,
            area_bytes: h.area_bytes,
            at: 0,
            buf: Vec::new(),
        }
    }

    /// The area offset of log position `pos`.
    pub fn offset(&self, pos: u64) -> u64 {
        pos % self.area_bytes
    }

    /// Bytes left in the area after position `pos`.
    pub fn room_after(&self, pos: u64) -> u64 {
        self.area_bytes - self.offset(pos)
    }

    /// `len` bytes at log position `pos`; `None` if they would cross the
    /// area's end.
    pub fn bytes(&mut self, pos: u64, len: usize) -> Result<Option<&[u8]>> {
        let off = self.offset(pos);
        if off + len as u64 > self.area_bytes {
            return Ok(None);
        }
        let have = off >= self.at && off + len as u64 <= self.at + self.buf.len() as u64;
        if !have {
            let start = off / WINDOW_BYTES * WINDOW_BYTES;
            let end = (off + len as u64)
                .max(start + WINDOW_BYTES)
                .min(self.area_bytes);
            self.buf.resize((end - start) as usize, 0);
            self.vol.read(self.area_start + start, &mut self.buf)?;
            self.at = start;
        }
        let from = (off - self.at) as usize;
        Ok(Some(&self.buf[from..from + len]))
    }
}
