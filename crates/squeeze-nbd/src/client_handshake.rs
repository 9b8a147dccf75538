//! The client side of the fixed newstyle handshake: what a program that
//! hands a socket to the kernel's NBD driver (`squeeze nbd-attach`) must do
//! before the kernel takes over the transmission phase.
//!
//! Place: runs on a freshly connected stream, before the socket is given
//! away; the kernel then speaks the transmission phase on it (simple
//! replies only: no structured replies, no meta contexts are negotiated).
//! Sequence: greeting (NBDMAGIC, IHAVEOPT, handshake flags), client flags,
//! NBD_OPT_GO naming the export (asking for NBD_INFO_BLOCK_SIZE), replies
//! until NBD_REP_ACK. A server that does not know NBD_OPT_GO
//! (NBD_REP_ERR_UNSUP) is asked again with NBD_OPT_EXPORT_NAME.
//!
//! Invariants: no reply payload longer than `OPTION_BYTES_MAX` is buffered;
//! every byte from the server is checked, and a wrong one is a typed
//! `NegotiateError`, never a panic; on success the stream is positioned at
//! the start of the transmission phase (nothing of it has been read).

use std::io::{self, Read, Write};

use crate::printable;
use crate::proto::*;

/// What the server said about the export: all the kernel needs to
/// configure a device for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    /// The export's size in bytes.
    pub size_bytes: u64,
    /// NBD_FLAG_* transmission flags (FLAG_SEND_FLUSH, FLAG_SEND_TRIM, ...).
    pub transmission_flags: u16,
    /// NBD_INFO_BLOCK_SIZE (minimum, preferred, maximum), when sent.
    pub block_sizes: Option<BlockSizes>,
}

/// NBD_INFO_BLOCK_SIZE: the server's block size constraints, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    pub minimum_bytes: u32,
    pub preferred_bytes: u32,
    pub maximum_bytes: u32,
}

impl ExportInfo {
    /// The transmission flags as words, for logs: "flush fua trim ...".
    pub fn flag_names(&self) -> String {
        const NAMES: [(u16, &str); 8] = [
            (FLAG_READ_ONLY, "read-only"),
            (FLAG_SEND_FLUSH, "flush"),
            (FLAG_SEND_FUA, "fua"),
            (FLAG_SEND_TRIM, "trim"),
            (FLAG_SEND_WRITE_ZEROES, "write-zeroes"),
            (FLAG_SEND_DF, "df"),
            (FLAG_CAN_MULTI_CONN, "multi-conn"),
            (FLAG_SEND_FAST_ZERO, "fast-zero"),
        ];
        let names: Vec<&str> = NAMES
            .iter()
            .filter(|(bit, _)| self.transmission_flags & bit != 0)
            .map(|&(_, n)| n)
            .collect();
        names.join(" ")
    }
}

/// Why the handshake did not end in the transmission phase.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NegotiateError {
    /// The socket failed or the server closed it mid-handshake.
    #[error("i/o error during the NBD handshake: {0}")]
    Io(#[from] io::Error),
    /// The first 8 bytes are not "NBDMAGIC": not an NBD server.
    #[error("not an NBD server (greeting {magic:#018x}, expected NBDMAGIC)")]
    NotNbd { magic: u64 },
    /// An oldstyle server (no option phase, no export names).
    #[error("the server speaks the oldstyle NBD handshake, which has no export names")]
    Oldstyle,
    /// The server lacks NBD_FLAG_FIXED_NEWSTYLE.
    #[error("the server does not offer the fixed newstyle handshake (flags {flags:#06x})")]
    NotFixedNewstyle { flags: u16 },
    /// The server requires TLS before it names exports.
    #[error("the server requires TLS (NBD_REP_ERR_TLS_REQD); nbd-attach does not speak TLS")]
    TlsRequired,
    /// The server refused the export: unknown, not allowed, or invalid.
    #[error("the server refused export {export:?}: {reason}{}", if message.is_empty() { String::new() } else { format!(" ({message})") })]
    Refused {
        export: String,
        /// The NBD_REP_ERR_* reply, in words.
        reason: &'static str,
        /// The server's message, quoted, cut and escaped for printing
        /// (empty when it sent none).
        message: String,
    },
    /// The server broke the protocol.
    #[error("NBD protocol error from the server: {0}")]
    Protocol(String),
}

/// Runs the handshake for `export` on `stream` (a Unix or TCP socket just
/// connected). On success the stream is at the start of the transmission
/// phase.
pub fn negotiate<S: Read + Write>(
    stream: &mut S,
    export: &str,
) -> Result<ExportInfo, NegotiateError> {
    if export.len() > STRING_BYTES_MAX as usize {
        return Err(NegotiateError::Protocol(format!(
            "export name of {} bytes is longer than the protocol's {STRING_BYTES_MAX}",
            export.len()
        )));
    }
    let magic = read_u64(stream)?;
    if magic != NBDMAGIC {
        return Err(NegotiateError::NotNbd { magic });
    }
    let style = read_u64(stream)?;
    if style != IHAVEOPT {
        return Err(NegotiateError::Oldstyle);
    }
    let flags = read_u16(stream)?;
    if flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(NegotiateError::NotFixedNewstyle { flags });
    }
    let no_zeroes = flags & FLAG_NO_ZEROES != 0;
    let client_flags = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
    stream.write_all(&client_flags.to_be_bytes())?;

    // NBD_OPT_GO: the name, then one information request (block sizes).
    let mut go = Vec::with_capacity(export.len() + 8);
    go.extend_from_slice(&(export.len() as u32).to_be_bytes());
    go.extend_from_slice(export.as_bytes());
    go.extend_from_slice(&1u16.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(stream, OPT_GO, &go)?;

    let mut info: Option<(u64, u16)> = None;
    let mut block_sizes = None;
    loop {
        let (reply, data) = read_reply(stream, OPT_GO)?;
        match reply {
            REP_INFO => {
                if data.len() < 2 {
                    return Err(NegotiateError::Protocol(
                        "NBD_REP_INFO shorter than its type".into(),
                    ));
                }
                match u16::from_be_bytes([data[0], data[1]]) {
                    INFO_EXPORT if data.len() == 12 => {
                        let size = u64::from_be_bytes(data[2..10].try_into().expect("8 bytes"));
                        let flags = u16::from_be_bytes([data[10], data[11]]);
                        info = Some((size, flags));
                    }
                    INFO_BLOCK_SIZE if data.len() == 14 => {
                        let word = |i: usize| {
                            u32::from_be_bytes(data[i..i + 4].try_into().expect("4 bytes"))
                        };
                        block_sizes = Some(BlockSizes {
                            minimum_bytes: word(2),
                            preferred_bytes: word(6),
                            maximum_bytes: word(10),
                        });
                    }
                    INFO_EXPORT | INFO_BLOCK_SIZE => {
                        return Err(NegotiateError::Protocol(format!(
                            "NBD_REP_INFO of {} bytes has the wrong length for its type",
                            data.len()
                        )));
                    }
                    _ => {} // NBD_INFO_NAME, NBD_INFO_DESCRIPTION, future types: not needed
                }
            }
            REP_ACK => {
                let Some((size_bytes, transmission_flags)) = info else {
                    return Err(NegotiateError::Protocol(
                        "NBD_REP_ACK to NBD_OPT_GO without NBD_INFO_EXPORT".into(),
                    ));
                };
                return Ok(ExportInfo {
                    size_bytes,
                    transmission_flags,
                    block_sizes,
                });
            }
            REP_ERR_UNSUP => return export_name(stream, export, no_zeroes),
            REP_ERR_TLS_REQD => return Err(NegotiateError::TlsRequired),
            r if r & (1 << 31) != 0 => return Err(refused(export, r, &data)),
            r => {
                return Err(NegotiateError::Protocol(format!(
                    "unexpected reply {r:#x} to NBD_OPT_GO"
                )))
            }
        }
    }
}

/// The pre-NBD_OPT_GO way: NBD_OPT_EXPORT_NAME, answered with the size and
/// flags (and 124 zero bytes unless NBD_FLAG_NO_ZEROES), or a closed
/// connection for an unknown export.
fn export_name<S: Read + Write>(
    stream: &mut S,
    export: &str,
    no_zeroes: bool,
) -> Result<ExportInfo, NegotiateError> {
    send_option(stream, OPT_EXPORT_NAME, export.as_bytes())?;
    let size_bytes = match read_u64(stream) {
        Ok(s) => s,
        Err(NegotiateError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(NegotiateError::Refused {
                export: export.to_string(),
                reason: "the server closed the connection at NBD_OPT_EXPORT_NAME",
                message: String::new(),
            })
        }
        Err(e) => return Err(e),
    };
    let transmission_flags = read_u16(stream)?;
    if !no_zeroes {
        let mut zeroes = [0u8; 124];
        stream.read_exact(&mut zeroes)?;
    }
    Ok(ExportInfo {
        size_bytes,
        transmission_flags,
        block_sizes: None,
    })
}

fn refused(export: &str, reply: u32, data: &[u8]) -> NegotiateError {
    let reason = match reply {
        REP_ERR_UNKNOWN => "no such export (NBD_REP_ERR_UNKNOWN)",
        REP_ERR_POLICY => "not allowed by the server's policy (NBD_REP_ERR_POLICY)",
        REP_ERR_INVALID => "invalid request (NBD_REP_ERR_INVALID)",
        REP_ERR_TOO_BIG => "request too big (NBD_REP_ERR_TOO_BIG)",
        _ => "an error reply",
    };
    NegotiateError::Refused {
        export: export.to_string(),
        reason,
        message: if data.is_empty() {
            String::new()
        } else {
            printable::quote(data)
        },
    }
}

fn send_option<W: Write>(w: &mut W, option: u32, data: &[u8]) -> io::Result<()> {
    let mut m = Vec::with_capacity(16 + data.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&option.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    w.write_all(&m)?;
    w.flush()
}

/// One option reply to `option`: its type and payload.
fn read_reply<R: Read>(r: &mut R, option: u32) -> Result<(u32, Vec<u8>), NegotiateError> {
    let magic = read_u64(r)?;
    if magic != OPT_REPLY_MAGIC {
        return Err(NegotiateError::Protocol(format!(
            "option reply magic {magic:#018x}"
        )));
    }
    let echoed = read_u32(r)?;
    if echoed != option {
        return Err(NegotiateError::Protocol(format!(
            "reply names option {echoed}, not the {option} sent"
        )));
    }
    let reply = read_u32(r)?;
    let len = read_u32(r)?;
    if len > OPTION_BYTES_MAX {
        return Err(NegotiateError::Protocol(format!(
            "option reply of {len} bytes (at most {OPTION_BYTES_MAX} accepted)"
        )));
    }
    let mut data = vec![0u8; len as usize];
    r.read_exact(&mut data)?;
    Ok((reply, data))
}

fn read_u64<R: Read>(r: &mut R) -> Result<u64, NegotiateError> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn read_u32<R: Read>(r: &mut R) -> Result<u32, NegotiateError> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u16<R: Read>(r: &mut R) -> Result<u16, NegotiateError> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}
