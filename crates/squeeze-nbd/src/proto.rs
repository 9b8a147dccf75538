//! NBD wire constants, in one place, named as in the protocol document
//! (NetworkBlockDevice/nbd `doc/proto.md`). Everything on the wire is
//! big-endian. Nothing here does I/O.

/// "NBDMAGIC": first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation magic, also prefixes every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// NBD_REP_INFO types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Requests and replies.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Size of a (compact) request header.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Size of a simple reply header.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Size of a structured reply chunk header.
pub const STRUCTURED_HEADER_BYTES: usize = 20;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply flags and chunk types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// base:allocation status flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context served.
pub const META_BASE_ALLOCATION: &str = "base:allocation";
/// The id this server gives `base:allocation` on every connection.
pub const META_BASE_ALLOCATION_ID: u32 = 1;

// Errno values on the wire (the protocol fixes them; they match Linux).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// Limits.
/// Advertised minimum block size: any byte alignment is served.
pub const BLOCK_SIZE_MIN: u32 = 1;
/// Advertised maximum block size: the longest READ or WRITE accepted.
pub const BLOCK_SIZE_MAX: u32 = 32 << 20;
/// A WRITE longer than the maximum is read and discarded (to stay in sync
/// with the stream) up to this length; beyond it the connection is closed.
pub const WRITE_DISCARD_BYTES_MAX: u64 = 2 * BLOCK_SIZE_MAX as u64;
/// Longest option payload accepted during the handshake.
pub const OPTION_BYTES_MAX: u32 = 64 << 10;
/// Longest string (export name, description, query) the protocol allows.
pub const STRING_BYTES_MAX: u32 = 4096;
/// Options a client may send before it must pick an export.
pub const OPTIONS_MAX: u32 = 1024;

const _: () = assert!(WRITE_DISCARD_BYTES_MAX >= BLOCK_SIZE_MAX as u64);
const _: () = assert!(OPTION_BYTES_MAX >= 2 * STRING_BYTES_MAX + 16);

/// Human name of a command, for logs and stats.
pub fn command_name(cmd: u16) -> &'static str {
    match cmd {
        CMD_READ => "read",
        CMD_WRITE => "write",
        CMD_DISC => "disc",
        CMD_FLUSH => "flush",
        CMD_TRIM => "trim",
        CMD_CACHE => "cache",
        CMD_WRITE_ZEROES => "write_zeroes",
        CMD_BLOCK_STATUS => "block_status",
        _ => "unknown",
    }
}
