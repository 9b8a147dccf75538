//! A small NBD client written from the protocol document
//! (NetworkBlockDevice/nbd `doc/proto.md`), independent of squeeze-nbd so
//! that a shared misreading of the spec cannot hide: fixed newstyle
//! handshake with NBD_OPT_GO or NBD_OPT_EXPORT_NAME, then simple replies
//! only.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_GO: u32 = 7;
pub const REP_ACK: u32 = 1;
pub const REP_INFO: u32 = 3;
pub const INFO_EXPORT: u16 = 0;

pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_FLAG_FUA: u16 = 1;

pub fn command_name(cmd: u16) -> &'static str {
    match cmd {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        _ => "?",
    }
}

fn proto(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_array<const N: usize>(s: &mut impl Read) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// One connection in transmission phase.
pub struct Conn {
    pub stream: UnixStream,
    pub size: u64,
    pub flags: u16,
}

/// One simple reply header.
#[derive(Debug, Clone, Copy)]
pub struct Reply {
    pub errno: u32,
    pub cookie: u64,
}

impl Conn {
    /// Connects and negotiates the default export (empty name) with
    /// NBD_OPT_GO (`go`) or NBD_OPT_EXPORT_NAME.
    pub fn connect(socket: &Path, go: bool) -> io::Result<Conn> {
        let mut s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        let g: [u8; 18] = read_array(&mut s)?;
        if u64::from_be_bytes(g[0..8].try_into().unwrap()) != NBDMAGIC
            || u64::from_be_bytes(g[8..16].try_into().unwrap()) != IHAVEOPT
        {
            return Err(proto(format!("bad greeting {g:02x?}")));
        }
        let hflags = u16::from_be_bytes([g[16], g[17]]);
        if hflags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(proto("server is not fixed newstyle".into()));
        }
        let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
        let cflags = u32::from(FLAG_FIXED_NEWSTYLE) | if no_zeroes { 2 } else { 0 };
        s.write_all(&cflags.to_be_bytes())?;
        let mut opt = IHAVEOPT.to_be_bytes().to_vec();
        if !go {
            opt.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
            opt.extend_from_slice(&0u32.to_be_bytes());
            s.write_all(&opt)?;
            let r: [u8; 10] = read_array(&mut s)?;
            if !no_zeroes {
                let _: [u8; 124] = read_array(&mut s)?;
            }
            let size = u64::from_be_bytes(r[0..8].try_into().unwrap());
            let flags = u16::from_be_bytes([r[8], r[9]]);
            return Ok(Conn {
                stream: s,
                size,
                flags,
            });
        }
        opt.extend_from_slice(&OPT_GO.to_be_bytes());
        // name length 0, empty name, no information requests
        opt.extend_from_slice(&6u32.to_be_bytes());
        opt.extend_from_slice(&0u32.to_be_bytes());
        opt.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&opt)?;
        let mut export = None;
        loop {
            let h: [u8; 20] = read_array(&mut s)?;
            if u64::from_be_bytes(h[0..8].try_into().unwrap()) != OPT_REPLY_MAGIC {
                return Err(proto(format!("bad option reply {h:02x?}")));
            }
            let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
            if len > 1 << 16 {
                return Err(proto(format!("option reply of {len} bytes")));
            }
            let mut data = vec![0u8; len];
            s.read_exact(&mut data)?;
            match kind {
                REP_ACK => break,
                REP_INFO if len >= 12 && u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT => {
                    export = Some((
                        u64::from_be_bytes(data[2..10].try_into().unwrap()),
                        u16::from_be_bytes([data[10], data[11]]),
                    ));
                }
                REP_INFO => {}
                k => return Err(proto(format!("NBD_OPT_GO refused: reply {k:#x}"))),
            }
        }
        let (size, flags) = export.ok_or_else(|| proto("no NBD_INFO_EXPORT".into()))?;
        Ok(Conn {
            stream: s,
            size,
            flags,
        })
    }

    /// The 28-byte request header.
    pub fn header(cmd: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&flags.to_be_bytes());
        b[6..8].copy_from_slice(&cmd.to_be_bytes());
        b[8..16].copy_from_slice(&cookie.to_be_bytes());
        b[16..24].copy_from_slice(&offset.to_be_bytes());
        b[24..28].copy_from_slice(&len.to_be_bytes());
        b
    }

    /// Reads one simple reply header from `s`.
    pub fn read_reply(s: &mut impl Read) -> io::Result<Reply> {
        let h: [u8; 16] = read_array(s)?;
        let magic = u32::from_be_bytes(h[0..4].try_into().unwrap());
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(proto(format!("bad reply magic {magic:#x}")));
        }
        Ok(Reply {
            errno: u32::from_be_bytes(h[4..8].try_into().unwrap()),
            cookie: u64::from_be_bytes(h[8..16].try_into().unwrap()),
        })
    }

    fn expect(&mut self, cookie: u64, what: &str) -> io::Result<()> {
        let r = Conn::read_reply(&mut self.stream)?;
        if r.cookie != cookie {
            return Err(proto(format!(
                "{what}: reply for cookie {} instead of {cookie}",
                r.cookie
            )));
        }
        if r.errno != 0 {
            return Err(io::Error::other(format!("{what}: errno {}", r.errno)));
        }
        Ok(())
    }

    /// Synchronous READ.
    pub fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let h = Conn::header(CMD_READ, 0, 1, offset, buf.len() as u32);
        self.stream.write_all(&h)?;
        self.expect(1, "READ")?;
        self.stream.read_exact(buf)
    }

    /// Synchronous FLUSH.
    pub fn flush(&mut self) -> io::Result<()> {
        self.stream
            .write_all(&Conn::header(CMD_FLUSH, 0, 2, 0, 0))?;
        self.expect(2, "FLUSH")
    }

    /// Synchronous WRITE.
    pub fn write_at(&mut self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        let mut b = Conn::header(CMD_WRITE, flags, 3, offset, data.len() as u32).to_vec();
        b.extend_from_slice(data);
        self.stream.write_all(&b)?;
        self.expect(3, "WRITE")
    }

    /// NBD_CMD_DISC, then waits for the server to close.
    pub fn disconnect(mut self) -> io::Result<()> {
        self.stream.write_all(&Conn::header(CMD_DISC, 0, 4, 0, 0))?;
        let mut rest = Vec::new();
        let _ = self.stream.read_to_end(&mut rest);
        if !rest.is_empty() {
            return Err(proto(format!("{} bytes after DISC", rest.len())));
        }
        Ok(())
    }
}
