//! Transmission-phase replies, encoded into one buffer each so a worker
//! writes a whole reply with one `write_all` under the connection's write
//! mutex (replies of one connection never interleave, but may go out in
//! any order).
//!
//! Simple replies: 16-byte header, then READ data. Structured replies
//! (only once NBD_OPT_STRUCTURED_REPLY was acked): a READ gets one
//! OFFSET_DATA chunk, or one OFFSET_HOLE chunk when the whole range reads
//! as zeros; BLOCK_STATUS gets one BLOCK_STATUS chunk; every error is an
//! ERROR chunk; success of other commands is a simple reply, which the
//! protocol allows. Every structured reply here is a single chunk with
//! NBD_REPLY_FLAG_DONE set.

use crate::proto::*;

/// A simple reply without payload: success (`errno == 0`) or an error.
pub(crate) fn simple(cookie: u64, errno: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(SIMPLE_REPLY_BYTES);
    b.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&errno.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b
}

fn chunk_header(b: &mut Vec<u8>, cookie: u64, kind: u16, payload_len: u32) {
    b.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&payload_len.to_be_bytes());
}

/// An error reply: an ERROR chunk when structured replies were negotiated,
/// else a simple reply carrying the errno. `errno` must be non-zero.
pub(crate) fn error(structured: bool, cookie: u64, errno: u32, message: &str) -> Vec<u8> {
    assert!(errno != 0, "an error reply needs an errno");
    if !structured {
        return simple(cookie, errno);
    }
    let msg = &message.as_bytes()[..message.len().min(STRING_BYTES_MAX as usize)];
    let mut b = Vec::with_capacity(STRUCTURED_HEADER_BYTES + 6 + msg.len());
    chunk_header(&mut b, cookie, REPLY_TYPE_ERROR, 6 + msg.len() as u32);
    b.extend_from_slice(&errno.to_be_bytes());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// A READ reply built in place: the header is reserved up front so the
/// device reads straight into the buffer that goes to the socket.
pub(crate) struct ReadReply {
    buf: Vec<u8>,
    header_bytes: usize,
}

impl ReadReply {
    pub(crate) fn new(structured: bool, cookie: u64, offset: u64, len: u32) -> ReadReply {
        let header_bytes = if structured {
            STRUCTURED_HEADER_BYTES + 8
        } else {
            SIMPLE_REPLY_BYTES
        };
        let mut buf = Vec::with_capacity(header_bytes + len as usize);
        if structured {
            chunk_header(&mut buf, cookie, REPLY_TYPE_OFFSET_DATA, 8 + len);
            buf.extend_from_slice(&offset.to_be_bytes());
        } else {
            buf.extend_from_slice(&simple(cookie, 0));
        }
        debug_assert_eq!(buf.len(), header_bytes);
        buf.resize(header_bytes + len as usize, 0);
        ReadReply { buf, header_bytes }
    }

    /// The data area the device fills.
    pub(crate) fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.header_bytes..]
    }

    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// A READ reply saying the whole range reads as zeros.
pub(crate) fn offset_hole(cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(STRUCTURED_HEADER_BYTES + 12);
    chunk_header(&mut b, cookie, REPLY_TYPE_OFFSET_HOLE, 12);
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// A BLOCK_STATUS reply for one context: descriptors (length, flags).
pub(crate) fn block_status(cookie: u64, context_id: u32, extents: &[(u32, u32)]) -> Vec<u8> {
    let payload_len = 4 + 8 * extents.len();
    let mut b = Vec::with_capacity(STRUCTURED_HEADER_BYTES + payload_len);
    chunk_header(&mut b, cookie, REPLY_TYPE_BLOCK_STATUS, payload_len as u32);
    b.extend_from_slice(&context_id.to_be_bytes());
    for &(len, flags) in extents {
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
    }
    b
}

/// Turn a device's `(length, is_hole_and_zero)` extents into wire
/// descriptors for a request of `len` bytes: zero-length extents dropped,
/// neighbours with equal flags merged, lengths clipped to the request and
/// to u32, one descriptor if `req_one`. Never empty: a device that
/// reported nothing gets one "allocated" descriptor covering the request.
pub(crate) fn block_status_extents(
    device_extents: &[(u64, bool)],
    len: u64,
    req_one: bool,
) -> Vec<(u32, u32)> {
    // Largest descriptor length, kept a multiple of 4 KiB.
    const DESCRIPTOR_BYTES_MAX: u64 = u32::MAX as u64 & !4095;
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut covered: u64 = 0;
    for &(ext_len, hole) in device_extents {
        if covered >= len {
            break;
        }
        let n = ext_len.min(len - covered).min(DESCRIPTOR_BYTES_MAX);
        if n == 0 {
            continue;
        }
        let flags = if hole { STATE_HOLE | STATE_ZERO } else { 0 };
        match out.last_mut() {
            Some((l, f)) if *f == flags && u64::from(*l) + n <= DESCRIPTOR_BYTES_MAX => {
                *l += n as u32
            }
            _ => out.push((n as u32, flags)),
        }
        covered += n;
        if n < ext_len {
            break; // clipped to u32: the client will ask again.
        }
    }
    if out.is_empty() {
        out.push((len.min(DESCRIPTOR_BYTES_MAX) as u32, 0));
    }
    if req_one {
        out.truncate(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_are_merged_clipped_and_never_empty() {
        assert_eq!(
            block_status_extents(
                &[(4096, true), (0, false), (4096, true), (8192, false)],
                10000,
                false
            ),
            vec![(8192, 3), (1808, 0)]
        );
        assert_eq!(
            block_status_extents(&[(4096, true), (4096, false)], 8192, true),
            vec![(4096, 3)]
        );
        assert_eq!(block_status_extents(&[], 512, false), vec![(512, 0)]);
    }

    #[test]
    fn encodings() {
        let s = simple(0x0102, 22);
        assert_eq!(s.len(), 16);
        assert_eq!(&s[4..8], &22u32.to_be_bytes());
        let e = error(true, 9, 5, "boom");
        assert_eq!(e.len(), 20 + 6 + 4);
        assert_eq!(&e[6..8], &REPLY_TYPE_ERROR.to_be_bytes());
        let mut r = ReadReply::new(true, 1, 4096, 3);
        r.data_mut().copy_from_slice(b"abc");
        let r = r.into_bytes();
        assert_eq!(&r[16..20], &11u32.to_be_bytes());
        assert_eq!(&r[28..], b"abc");
    }
}
