//! Transmission-phase requests: parse the 28-byte header, decide what to
//! do with a WRITE payload, validate the request against the export and the
//! negotiated options, and map device `io::Error`s to NBD errnos.
//!
//! Place in the data path: socket -> `server` reader thread -> **request**
//! (parse + validate) -> worker -> `BlockDevice`. Invariant: a request that
//! `validate` accepts is in range (`offset + len <= size`, `len > 0`), has
//! only the flags its command allows, and for READ/WRITE is no longer than
//! `BLOCK_SIZE_MAX`; the device never sees anything else. A rejected
//! request becomes an errno reply, never a dropped connection; only a
//! broken stream (bad magic, truncation, an unskippable payload) closes it.

use std::io;

use crate::proto::*;

/// A request header as it came off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestHeader {
    pub flags: u16,
    pub cmd: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Decode a request header; `None` if the magic is wrong (the stream is
/// out of sync and the connection must close).
pub(crate) fn parse_header(b: &[u8; REQUEST_HEADER_BYTES]) -> Option<RequestHeader> {
    let magic = u32::from_be_bytes(b[0..4].try_into().unwrap());
    if magic != REQUEST_MAGIC {
        return None;
    }
    Some(RequestHeader {
        flags: u16::from_be_bytes(b[4..6].try_into().unwrap()),
        cmd: u16::from_be_bytes(b[6..8].try_into().unwrap()),
        cookie: u64::from_be_bytes(b[8..16].try_into().unwrap()),
        offset: u64::from_be_bytes(b[16..24].try_into().unwrap()),
        length: u32::from_be_bytes(b[24..28].try_into().unwrap()),
    })
}

/// What the reader must do with the bytes that follow a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Payload {
    /// No payload follows.
    None,
    /// A WRITE payload of this many bytes follows; read it.
    Read(usize),
    /// A WRITE payload too long to serve but short enough to skip.
    Discard(u64),
    /// A WRITE payload too long even to skip: close the connection.
    Unskippable,
}

/// Decide how to consume the payload of `h`, before validating it: the
/// stream must stay in sync whatever the verdict on the request.
pub(crate) fn payload_of(h: &RequestHeader) -> Payload {
    if h.cmd != CMD_WRITE {
        return Payload::None;
    }
    let len = u64::from(h.length);
    if len <= u64::from(BLOCK_SIZE_MAX) {
        Payload::Read(h.length as usize)
    } else if len <= WRITE_DISCARD_BYTES_MAX {
        Payload::Discard(len)
    } else {
        Payload::Unskippable
    }
}

/// What the connection negotiated and what the export can do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestContext {
    pub size: u64,
    pub read_only: bool,
    pub structured: bool,
    pub base_allocation: bool,
    pub can_fast_zero: bool,
}

/// A validated request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u64,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    },
    BlockStatus {
        offset: u64,
        len: u64,
        req_one: bool,
    },
    Disc,
}

/// A request refused before reaching the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub errno: u32,
    pub why: &'static str,
}

fn reject(errno: u32, why: &'static str) -> Rejection {
    Rejection { errno, why }
}

/// Validate `h` against `ctx`. The order of checks is nbdkit's
/// `validate_request` (command, flags, range, capability) but for the
/// length, checked before the range: a READ or WRITE over the advertised
/// maximum block size is EINVAL wherever it points, as the NBD spec's
/// block size constraints ask (a WRITE past the end of the export is
/// otherwise ENOSPC).
pub(crate) fn validate(h: &RequestHeader, ctx: &RequestContext) -> Result<Command, Rejection> {
    let allowed_flags = match h.cmd {
        CMD_READ => {
            if ctx.structured {
                CMD_FLAG_DF
            } else {
                0
            }
        }
        CMD_WRITE => CMD_FLAG_FUA,
        CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        CMD_FLUSH | CMD_DISC => 0,
        _ => return Err(reject(EINVAL, "unknown command")),
    };
    if h.flags & !allowed_flags != 0 {
        return Err(reject(EINVAL, "flag not allowed for this command"));
    }
    let fua = h.flags & CMD_FLAG_FUA != 0;
    let len = u64::from(h.length);
    match h.cmd {
        CMD_FLUSH => {
            if h.offset != 0 || h.length != 0 {
                return Err(reject(EINVAL, "flush with non-zero offset or length"));
            }
            return Ok(Command::Flush);
        }
        CMD_DISC => return Ok(Command::Disc),
        _ => {}
    }
    let is_write = h.cmd == CMD_WRITE || h.cmd == CMD_WRITE_ZEROES;
    if len == 0 {
        return Err(reject(EINVAL, "zero length"));
    }
    if (h.cmd == CMD_READ || h.cmd == CMD_WRITE) && h.length > BLOCK_SIZE_MAX {
        return Err(reject(EINVAL, "length over the maximum block size"));
    }
    let in_range = h.offset.checked_add(len).is_some_and(|end| end <= ctx.size);
    if !in_range {
        return Err(if is_write {
            reject(ENOSPC, "write beyond the end of the export")
        } else {
            reject(EINVAL, "offset and length out of range")
        });
    }
    if ctx.read_only && matches!(h.cmd, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES) {
        return Err(reject(EPERM, "export is read-only"));
    }
    Ok(match h.cmd {
        CMD_READ => Command::Read {
            offset: h.offset,
            len: h.length,
        },
        CMD_WRITE => Command::Write {
            offset: h.offset,
            len: h.length,
            fua,
        },
        CMD_TRIM => Command::Trim {
            offset: h.offset,
            len,
            fua,
        },
        CMD_WRITE_ZEROES => {
            if h.flags & CMD_FLAG_FAST_ZERO != 0 && !ctx.can_fast_zero {
                return Err(reject(ENOTSUP, "fast zero not supported"));
            }
            Command::WriteZeroes {
                offset: h.offset,
                len,
                may_trim: h.flags & CMD_FLAG_NO_HOLE == 0,
                fua,
            }
        }
        CMD_BLOCK_STATUS => {
            if !ctx.structured || !ctx.base_allocation {
                return Err(reject(
                    EINVAL,
                    "block status without a negotiated meta context",
                ));
            }
            Command::BlockStatus {
                offset: h.offset,
                len,
                req_one: h.flags & CMD_FLAG_REQ_ONE != 0,
            }
        }
        _ => unreachable!("command checked above"),
    })
}

/// The NBD errno for a device error: InvalidInput -> EINVAL, a full device
/// -> ENOSPC, read-only or permission -> EPERM, Unsupported -> ENOTSUP,
/// anything else (checksum failures included) -> EIO.
pub fn errno_for(e: &io::Error) -> u32 {
    if let Some(raw) = e.raw_os_error() {
        if raw == libc::ENOSPC || raw == libc::EDQUOT {
            return ENOSPC;
        }
    }
    match e.kind() {
        io::ErrorKind::InvalidInput => EINVAL,
        io::ErrorKind::StorageFull => ENOSPC,
        io::ErrorKind::ReadOnlyFilesystem | io::ErrorKind::PermissionDenied => EPERM,
        io::ErrorKind::Unsupported => ENOTSUP,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> RequestContext {
        RequestContext {
            size: 1 << 20,
            read_only: false,
            structured: true,
            base_allocation: true,
            can_fast_zero: false,
        }
    }

    fn h(cmd: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            cmd,
            cookie: 7,
            offset,
            length,
        }
    }

    #[test]
    fn range_and_length_checks() {
        let c = ctx();
        assert!(validate(&h(CMD_READ, 0, 0, 4096), &c).is_ok());
        assert_eq!(
            validate(&h(CMD_READ, 0, 1 << 20, 1), &c).unwrap_err().errno,
            EINVAL
        );
        assert_eq!(
            validate(&h(CMD_WRITE, 0, 1 << 20, 1), &c)
                .unwrap_err()
                .errno,
            ENOSPC
        );
        assert_eq!(
            validate(&h(CMD_WRITE_ZEROES, 0, u64::MAX, 1), &c)
                .unwrap_err()
                .errno,
            ENOSPC
        );
        assert_eq!(
            validate(&h(CMD_TRIM, 0, 0, 0), &c).unwrap_err().errno,
            EINVAL
        );
        // Over the maximum block size is EINVAL, even past the end.
        assert_eq!(
            validate(&h(CMD_WRITE, 0, 0, BLOCK_SIZE_MAX + 1), &c)
                .unwrap_err()
                .errno,
            EINVAL
        );
        let big = RequestContext { size: 1 << 40, ..c };
        assert_eq!(
            validate(&h(CMD_READ, 0, 0, BLOCK_SIZE_MAX + 1), &big)
                .unwrap_err()
                .errno,
            EINVAL
        );
        assert!(validate(&h(CMD_TRIM, 0, 0, BLOCK_SIZE_MAX + 1), &big).is_ok());
    }

    #[test]
    fn flags_and_commands() {
        let c = ctx();
        assert_eq!(validate(&h(99, 0, 0, 1), &c).unwrap_err().errno, EINVAL);
        assert_eq!(
            validate(&h(CMD_CACHE, 0, 0, 1), &c).unwrap_err().errno,
            EINVAL
        );
        assert_eq!(
            validate(&h(CMD_READ, CMD_FLAG_FUA, 0, 1), &c)
                .unwrap_err()
                .errno,
            EINVAL
        );
        assert_eq!(
            validate(&h(CMD_WRITE, 1 << 9, 0, 1), &c).unwrap_err().errno,
            EINVAL
        );
        assert_eq!(
            validate(&h(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 1), &c)
                .unwrap_err()
                .errno,
            ENOTSUP
        );
        assert_eq!(
            validate(
                &h(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE | CMD_FLAG_FUA, 0, 8),
                &c
            ),
            Ok(Command::WriteZeroes {
                offset: 0,
                len: 8,
                may_trim: false,
                fua: true
            })
        );
        assert_eq!(
            validate(&h(CMD_FLUSH, 0, 1, 0), &c).unwrap_err().errno,
            EINVAL
        );
        let ro = RequestContext {
            read_only: true,
            ..c
        };
        assert_eq!(
            validate(&h(CMD_TRIM, 0, 0, 1), &ro).unwrap_err().errno,
            EPERM
        );
        let simple = RequestContext {
            structured: false,
            ..c
        };
        assert_eq!(
            validate(&h(CMD_BLOCK_STATUS, 0, 0, 1), &simple)
                .unwrap_err()
                .errno,
            EINVAL
        );
        assert_eq!(
            validate(&h(CMD_READ, CMD_FLAG_DF, 0, 1), &simple)
                .unwrap_err()
                .errno,
            EINVAL
        );
    }

    #[test]
    fn write_payloads() {
        assert_eq!(payload_of(&h(CMD_WRITE, 0, 0, 10)), Payload::Read(10));
        assert_eq!(
            payload_of(&h(CMD_WRITE, 0, 0, BLOCK_SIZE_MAX + 1)),
            Payload::Discard(u64::from(BLOCK_SIZE_MAX) + 1)
        );
        assert_eq!(
            payload_of(&h(CMD_WRITE, 0, 0, u32::MAX)),
            Payload::Unskippable
        );
        assert_eq!(payload_of(&h(CMD_READ, 0, 0, u32::MAX)), Payload::None);
    }

    #[test]
    fn errno_mapping() {
        use io::ErrorKind as K;
        assert_eq!(errno_for(&io::Error::from(K::InvalidInput)), EINVAL);
        assert_eq!(errno_for(&io::Error::from(K::StorageFull)), ENOSPC);
        assert_eq!(
            errno_for(&io::Error::from_raw_os_error(libc::ENOSPC)),
            ENOSPC
        );
        assert_eq!(errno_for(&io::Error::from(K::PermissionDenied)), EPERM);
        assert_eq!(errno_for(&io::Error::from(K::ReadOnlyFilesystem)), EPERM);
        assert_eq!(errno_for(&io::Error::from(K::Unsupported)), ENOTSUP);
        assert_eq!(errno_for(&io::Error::new(K::InvalidData, "checksum")), EIO);
        assert_eq!(errno_for(&io::Error::other("x")), EIO);
    }

    /// Random headers: validation never panics, and whatever it accepts
    /// is inside the export and within the limits the device relies on.
    #[test]
    fn random_headers_accepted_only_when_valid() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for i in 0..200_000u32 {
            let mut b = [0u8; REQUEST_HEADER_BYTES];
            for x in b.iter_mut() {
                *x = next() as u8;
            }
            b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            // Bias towards plausible values so every branch is reached.
            b[6] = 0;
            b[7] %= 10;
            if i % 2 == 0 {
                b[4] = 0;
                b[5] &= 0x1f;
                b[16..21].fill(0);
                b[24..26].fill(0);
            }
            let h = parse_header(&b).unwrap();
            let c = RequestContext {
                size: 1 << 28,
                read_only: i % 5 == 0,
                structured: i % 3 != 0,
                base_allocation: i % 7 != 0,
                can_fast_zero: i % 11 != 0,
            };
            let _ = payload_of(&h);
            let (offset, len) = match validate(&h, &c) {
                Err(r) => {
                    assert!([EINVAL, ENOSPC, EPERM, ENOTSUP].contains(&r.errno));
                    continue;
                }
                Ok(Command::Flush | Command::Disc) => continue,
                Ok(Command::Read { offset, len }) | Ok(Command::Write { offset, len, .. }) => {
                    assert!(len <= BLOCK_SIZE_MAX);
                    (offset, u64::from(len))
                }
                Ok(Command::Trim { offset, len, .. })
                | Ok(Command::WriteZeroes { offset, len, .. })
                | Ok(Command::BlockStatus { offset, len, .. }) => (offset, len),
            };
            assert!(len > 0 && offset + len <= c.size, "{h:?}");
            if c.read_only {
                assert!(matches!(
                    validate(&h, &c),
                    Ok(Command::Read { .. } | Command::BlockStatus { .. })
                ));
            }
        }
    }
}
