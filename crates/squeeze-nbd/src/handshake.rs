//! The fixed newstyle handshake: greeting, client flags, then options until
//! the client picks an export (NBD_OPT_GO or NBD_OPT_EXPORT_NAME), aborts,
//! or breaks the protocol.
//!
//! Place in the data path: runs on the connection's reader thread before
//! any request; produces a `Negotiated` that fixes, for the life of the
//! connection, the export, whether structured replies are on, and whether
//! `base:allocation` is selected. Invariants: every option payload is read
//! in full before replying (the stream stays in sync), no option payload
//! longer than `OPTION_BYTES_MAX` is buffered, at most `OPTIONS_MAX`
//! options are served; anything the protocol lets us answer with an
//! NBD_REP_ERR_* is answered, anything else (bad magic, unknown client
//! flags, an absurd length, a truncated stream) is a `HandshakeError`
//! that closes this connection only.
//!
//! TLS rules (NBD proto.md, "TLS support"): with TLS required, every option
//! but STARTTLS and ABORT before TLS gets NBD_REP_ERR_TLS_REQD and
//! NBD_OPT_EXPORT_NAME closes the connection; STARTTLS without TLS
//! configured gets NBD_REP_ERR_UNSUP, a second one NBD_REP_ERR_INVALID.
//! After STARTTLS the option phase starts afresh (no greeting, no state
//! kept). Exports off the allow-list are neither listed nor selectable:
//! they answer as unknown exports do.

use std::io::{self, Read, Write};

use crate::printable;
use crate::proto::*;
use crate::server::Export;
use crate::tls::TlsMode;

/// Why a handshake ended without a usable connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The client sent bytes the protocol does not allow.
    #[error("protocol violation during handshake: {0}")]
    Protocol(String),
    /// The socket failed or the client went away mid-message.
    #[error("i/o error during handshake: {0}")]
    Io(#[from] io::Error),
}

/// What the handshake decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Negotiated {
    pub export_index: usize,
    pub structured: bool,
    pub base_allocation: bool,
}

/// How the option phase ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Enter transmission with this export.
    Transmission(Negotiated),
    /// The client sent NBD_OPT_ABORT (or closed cleanly between options).
    Aborted,
    /// NBD_OPT_STARTTLS was acknowledged (and flushed): run the TLS
    /// handshake, then `options` again over TLS.
    StartTls,
}

/// What a connection may see and must do: fixed for the server's life.
pub(crate) struct Policy<'a> {
    pub exports: &'a [Export],
    /// Per export: whether the allow-list lets clients see and select it.
    pub visible: &'a [bool],
    /// TLS offered (`None`: STARTTLS is answered NBD_REP_ERR_UNSUP).
    pub tls: Option<TlsMode>,
}

/// What the option phase carries across STARTTLS.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Session {
    /// The client set NBD_FLAG_C_NO_ZEROES.
    pub no_zeroes: bool,
    /// TLS is up on this connection.
    pub tls_active: bool,
}

/// Transmission flags for an export on a connection.
pub(crate) fn transmission_flags(export: &Export, structured: bool) -> u16 {
    let mut f = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_FAST_ZERO
        | FLAG_CAN_MULTI_CONN;
    if structured {
        // Every READ reply is a single chunk, so DF is trivially honoured.
        f |= FLAG_SEND_DF;
    }
    if export.device.is_read_only() {
        f |= FLAG_READ_ONLY;
    }
    f
}

/// The preferred block size advertised: the device's, if it is a power of
/// two in [512, BLOCK_SIZE_MAX], else 4096.
pub(crate) fn preferred_block_size(export: &Export) -> u32 {
    let p = export.device.preferred_block_size();
    if p.is_power_of_two() && (512..=BLOCK_SIZE_MAX).contains(&p) {
        p
    } else {
        4096
    }
}

/// The export a client names, if the allow-list lets it see it; the empty
/// name selects the first visible export.
fn find_export(p: &Policy<'_>, name: &[u8]) -> Option<usize> {
    if name.is_empty() {
        return p.visible.iter().position(|v| *v);
    }
    p.exports
        .iter()
        .zip(p.visible)
        .position(|(e, v)| *v && e.name.as_bytes() == name)
}

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn opt_reply<W: Write>(w: &mut W, opt: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b)
}

fn opt_error<W: Write>(w: &mut W, opt: u32, kind: u32, message: &str) -> io::Result<()> {
    tracing::debug!(opt, kind = kind & !(1 << 31), message, "option refused");
    opt_reply(w, opt, kind, message.as_bytes())
}

/// Splits a length-prefixed string off the front of `data`.
fn take_string<'a>(data: &mut &'a [u8]) -> Option<&'a [u8]> {
    if data.len() < 4 {
        return None;
    }
    let n = be_u32(data) as usize;
    if n > STRING_BYTES_MAX as usize || data.len() - 4 < n {
        return None;
    }
    let s = &data[4..4 + n];
    *data = &data[4 + n..];
    Some(s)
}

/// Parsed NBD_OPT_GO / NBD_OPT_INFO payload.
fn parse_go(mut data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let name = take_string(&mut data)?;
    if data.len() < 2 {
        return None;
    }
    let n = be_u16(data) as usize;
    data = &data[2..];
    if data.len() != 2 * n {
        return None;
    }
    Some((name, data.chunks_exact(2).map(be_u16).collect()))
}

/// Parsed NBD_OPT_{LIST,SET}_META_CONTEXT payload.
fn parse_meta(mut data: &[u8]) -> Option<(&[u8], Vec<&[u8]>)> {
    let name = take_string(&mut data)?;
    if data.len() < 4 {
        return None;
    }
    let n = be_u32(data) as usize;
    data = &data[4..];
    let mut queries = Vec::new();
    for _ in 0..n {
        queries.push(take_string(&mut data)?);
    }
    if !data.is_empty() {
        return None;
    }
    Some((name, queries))
}

/// Run the whole handshake on a fresh connection: every export visible,
/// no TLS (what the unit tests and fuzzers drive).
#[cfg(test)]
pub(crate) fn negotiate<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    exports: &[Export],
) -> Result<Outcome, HandshakeError> {
    let visible = vec![true; exports.len()];
    let policy = Policy {
        exports,
        visible: &visible,
        tls: None,
    };
    let session = greet(r, w)?;
    options(r, w, &policy, session)
}

/// The greeting and the client's flags.
pub(crate) fn greet<R: Read, W: Write>(r: &mut R, w: &mut W) -> Result<Session, HandshakeError> {
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&NBDMAGIC.to_be_bytes());
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.write_all(&greeting)?;
    w.flush()?;

    let mut b4 = [0u8; 4];
    r.read_exact(&mut b4)?;
    let client_flags = u32::from_be_bytes(b4);
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(HandshakeError::Protocol(format!(
            "unknown client flags {client_flags:#x}"
        )));
    }
    Ok(Session {
        no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
        tls_active: false,
    })
}

/// Options until the client picks an export, aborts, or starts TLS. After
/// TLS, called again with `session.tls_active`: nothing negotiated before
/// TLS (structured replies, meta contexts) carries over.
pub(crate) fn options<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    policy: &Policy<'_>,
    session: Session,
) -> Result<Outcome, HandshakeError> {
    let exports = policy.exports;
    let no_zeroes = session.no_zeroes;
    let tls_required = policy.tls == Some(TlsMode::Require) && !session.tls_active;
    let mut structured = false;
    let mut base_allocation = false;

    for _ in 0..OPTIONS_MAX {
        let mut head = [0u8; 16];
        // A client may hang up between options: not a violation.
        match r.read(&mut head[..1])? {
            0 => return Ok(Outcome::Aborted),
            _ => r.read_exact(&mut head[1..])?,
        }
        let magic = u64::from_be_bytes(head[0..8].try_into().unwrap());
        let opt = be_u32(&head[8..12]);
        let len = be_u32(&head[12..16]);
        if magic != IHAVEOPT {
            return Err(HandshakeError::Protocol(format!(
                "bad option magic {magic:#x}"
            )));
        }
        if len > OPTION_BYTES_MAX {
            return Err(HandshakeError::Protocol(format!(
                "option {opt} with absurd length {len}"
            )));
        }
        let mut data = vec![0u8; len as usize];
        r.read_exact(&mut data)?;
        tracing::trace!(opt, len, "option");

        if tls_required && opt != OPT_STARTTLS && opt != OPT_ABORT {
            if opt == OPT_EXPORT_NAME {
                // No error reply exists for NBD_OPT_EXPORT_NAME: close.
                return Err(HandshakeError::Protocol(
                    "NBD_OPT_EXPORT_NAME before TLS on a server that requires TLS".into(),
                ));
            }
            opt_error(
                w,
                opt,
                REP_ERR_TLS_REQD,
                "TLS required: send NBD_OPT_STARTTLS first",
            )?;
            w.flush()?;
            continue;
        }

        match opt {
            OPT_EXPORT_NAME => {
                let Some(i) = find_export(policy, &data) else {
                    // The protocol has no error reply here: close.
                    return Err(HandshakeError::Protocol(format!(
                        "NBD_OPT_EXPORT_NAME for unknown export {}",
                        printable::quote(&data)
                    )));
                };
                let e = &exports[i];
                let mut b = Vec::with_capacity(10 + 124);
                b.extend_from_slice(&e.device.size().to_be_bytes());
                b.extend_from_slice(&transmission_flags(e, structured).to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                w.write_all(&b)?;
                w.flush()?;
                return Ok(Outcome::Transmission(Negotiated {
                    export_index: i,
                    structured,
                    base_allocation: structured && base_allocation,
                }));
            }
            OPT_ABORT => {
                // Best effort: the client may already have gone.
                let _ = opt_reply(w, opt, REP_ACK, &[]).and_then(|()| w.flush());
                return Ok(Outcome::Aborted);
            }
            OPT_LIST => {
                if len != 0 {
                    opt_error(w, opt, REP_ERR_INVALID, "NBD_OPT_LIST takes no data")?;
                } else {
                    for (e, _) in exports.iter().zip(policy.visible).filter(|(_, v)| **v) {
                        let mut d = Vec::with_capacity(4 + e.name.len() + e.description.len());
                        d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                        d.extend_from_slice(e.name.as_bytes());
                        d.extend_from_slice(e.description.as_bytes());
                        opt_reply(w, opt, REP_SERVER, &d)?;
                    }
                    opt_reply(w, opt, REP_ACK, &[])?;
                }
            }
            OPT_STARTTLS => {
                if len != 0 {
                    opt_error(w, opt, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data")?;
                } else if session.tls_active {
                    opt_error(w, opt, REP_ERR_INVALID, "TLS is already on")?;
                } else if policy.tls.is_none() {
                    opt_error(
                        w,
                        opt,
                        REP_ERR_UNSUP,
                        "TLS is not configured on this server",
                    )?;
                } else {
                    opt_reply(w, opt, REP_ACK, &[])?;
                    w.flush()?;
                    return Ok(Outcome::StartTls);
                }
            }
            OPT_STRUCTURED_REPLY => {
                if len != 0 {
                    opt_error(
                        w,
                        opt,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    )?;
                } else {
                    structured = true;
                    opt_reply(w, opt, REP_ACK, &[])?;
                }
            }
            OPT_INFO | OPT_GO => {
                let Some((name, infos)) = parse_go(&data) else {
                    opt_error(w, opt, REP_ERR_INVALID, "malformed NBD_OPT_INFO/GO payload")?;
                    w.flush()?;
                    continue;
                };
                let Some(i) = find_export(policy, name) else {
                    tracing::debug!(opt, name = %printable::quote(name), "unknown export");
                    opt_error(w, opt, REP_ERR_UNKNOWN, "no such export")?;
                    w.flush()?;
                    continue;
                };
                let e = &exports[i];
                let mut d = Vec::with_capacity(12);
                d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                d.extend_from_slice(&e.device.size().to_be_bytes());
                d.extend_from_slice(&transmission_flags(e, structured).to_be_bytes());
                opt_reply(w, opt, REP_INFO, &d)?;
                if infos.contains(&INFO_NAME) {
                    let mut d = INFO_NAME.to_be_bytes().to_vec();
                    d.extend_from_slice(e.name.as_bytes());
                    opt_reply(w, opt, REP_INFO, &d)?;
                }
                if infos.contains(&INFO_DESCRIPTION) && !e.description.is_empty() {
                    let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
                    d.extend_from_slice(e.description.as_bytes());
                    opt_reply(w, opt, REP_INFO, &d)?;
                }
                // Sent whether asked or not: min 1 imposes nothing.
                let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                d.extend_from_slice(&BLOCK_SIZE_MIN.to_be_bytes());
                d.extend_from_slice(&preferred_block_size(e).to_be_bytes());
                d.extend_from_slice(&BLOCK_SIZE_MAX.to_be_bytes());
                opt_reply(w, opt, REP_INFO, &d)?;
                opt_reply(w, opt, REP_ACK, &[])?;
                if opt == OPT_GO {
                    w.flush()?;
                    return Ok(Outcome::Transmission(Negotiated {
                        export_index: i,
                        structured,
                        base_allocation: structured && base_allocation,
                    }));
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let Some((name, queries)) = parse_meta(&data) else {
                    opt_error(w, opt, REP_ERR_INVALID, "malformed meta context payload")?;
                    w.flush()?;
                    continue;
                };
                if opt == OPT_SET_META_CONTEXT && !structured {
                    opt_error(w, opt, REP_ERR_INVALID, "structured replies not negotiated")?;
                } else if find_export(policy, name).is_none() {
                    opt_error(w, opt, REP_ERR_UNKNOWN, "no such export")?;
                } else {
                    let wanted = if opt == OPT_LIST_META_CONTEXT {
                        queries.is_empty()
                            || queries
                                .iter()
                                .any(|q| *q == b"base:" || *q == META_BASE_ALLOCATION.as_bytes())
                    } else {
                        queries
                            .iter()
                            .any(|q| *q == META_BASE_ALLOCATION.as_bytes())
                    };
                    if opt == OPT_SET_META_CONTEXT {
                        base_allocation = wanted;
                    }
                    if wanted {
                        let id = if opt == OPT_SET_META_CONTEXT {
                            META_BASE_ALLOCATION_ID
                        } else {
                            0
                        };
                        let mut d = id.to_be_bytes().to_vec();
                        d.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
                        opt_reply(w, opt, REP_META_CONTEXT, &d)?;
                    }
                    opt_reply(w, opt, REP_ACK, &[])?;
                }
            }
            _ => {
                opt_error(w, opt, REP_ERR_UNSUP, "option not supported")?;
            }
        }
        w.flush()?;
    }
    Err(HandshakeError::Protocol(format!(
        "more than {OPTIONS_MAX} options without choosing an export"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_and_meta_payloads_parse_strictly() {
        let mut go = 3u32.to_be_bytes().to_vec();
        go.extend_from_slice(b"abc");
        go.extend_from_slice(&1u16.to_be_bytes());
        go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(parse_go(&go), Some((&b"abc"[..], vec![INFO_BLOCK_SIZE])));
        assert_eq!(parse_go(&go[..go.len() - 1]), None);
        assert_eq!(parse_go(&[0xff, 0xff, 0xff, 0xff, 0, 0]), None);

        let mut meta = 0u32.to_be_bytes().to_vec();
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend_from_slice(&15u32.to_be_bytes());
        meta.extend_from_slice(b"base:allocation");
        assert_eq!(
            parse_meta(&meta),
            Some((&b""[..], vec![&b"base:allocation"[..]]))
        );
        meta.push(0);
        assert_eq!(parse_meta(&meta), None);
    }

    /// A client's export name reaches the log (through the error) cut and
    /// escaped: a 5,000-byte name with a newline and an escape sequence
    /// in it makes one short line.
    #[test]
    fn an_unknown_export_name_is_cut_and_escaped_in_the_error() {
        use crate::device::MemDevice;
        use std::sync::Arc;
        let exports = vec![Export {
            name: "a".into(),
            description: String::new(),
            device: Arc::new(MemDevice::new(4096)),
        }];
        let mut name = b"x\n2026-01-01T00:00:00Z WARN forged\x1b[2J".to_vec();
        name.resize(5000, b'A');
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend_from_slice(&IHAVEOPT.to_be_bytes());
        input.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
        input.extend_from_slice(&(name.len() as u32).to_be_bytes());
        input.extend_from_slice(&name);
        let err = negotiate(&mut &input[..], &mut Vec::new(), &exports)
            .unwrap_err()
            .to_string();
        assert!(err.len() < 300, "{} bytes: {err}", err.len());
        assert!(err.ends_with("... (5000 bytes)"), "{err}");
        assert!(
            err.contains("x\\n2026") && err.contains("\\u{1b}[2J"),
            "{err}"
        );
        assert!(!err.chars().any(char::is_control), "{err:?}");
    }

    /// Random and mutated option streams never panic the handshake and
    /// always end (in transmission, an abort, or an error).
    #[test]
    fn random_option_streams_never_panic() {
        use crate::device::MemDevice;
        use std::sync::Arc;
        let exports = vec![Export {
            name: "a".into(),
            description: String::new(),
            device: Arc::new(MemDevice::new(4096)),
        }];
        // A valid prefix to mutate: flags, STRUCTURED_REPLY, SET_META, GO.
        let mut valid = 3u32.to_be_bytes().to_vec();
        let opt = |v: &mut Vec<u8>, o: u32, d: &[u8]| {
            v.extend_from_slice(&IHAVEOPT.to_be_bytes());
            v.extend_from_slice(&o.to_be_bytes());
            v.extend_from_slice(&(d.len() as u32).to_be_bytes());
            v.extend_from_slice(d);
        };
        opt(&mut valid, OPT_STRUCTURED_REPLY, &[]);
        let mut meta = 1u32.to_be_bytes().to_vec();
        meta.extend_from_slice(b"a");
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend_from_slice(&15u32.to_be_bytes());
        meta.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
        opt(&mut valid, OPT_SET_META_CONTEXT, &meta);
        opt(&mut valid, OPT_GO, &[0, 0, 0, 1, b'a', 0, 1, 0, 3]);
        let mut out = Vec::new();
        let got = negotiate(&mut &valid[..], &mut out, &exports).unwrap();
        assert!(matches!(
            got,
            Outcome::Transmission(Negotiated {
                export_index: 0,
                structured: true,
                base_allocation: true
            })
        ));

        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..5000 {
            let mut input = valid.clone();
            match next() % 3 {
                0 => {
                    for _ in 0..1 + next() % 4 {
                        let i = (next() as usize) % input.len();
                        input[i] = next() as u8;
                    }
                }
                1 => input.truncate((next() as usize) % input.len()),
                _ => {
                    input = (0..next() % 200).map(|_| next() as u8).collect();
                }
            }
            let mut out = Vec::new();
            let _ = negotiate(&mut &input[..], &mut out, &exports);
        }
    }
}
