//! nbd-tester-client's "integrityhuge" against squeeze: a client that
//! negotiates no block sizes (NBD_OPT_EXPORT_NAME, simple replies) sends
//! READs and WRITEs of 33-49 MB. The NBD spec lets a server enforce a
//! maximum block size such a client never saw, provided it errors the
//! requests over it cleanly: each is answered EINVAL (a WRITE's payload
//! read and dropped first, so the stream stays in sync), wherever it
//! points, and the connection goes on. A WRITE whose payload is too large
//! even to skip (over 64 MiB) closes the connection without a reply, as the
//! spec allows for a payload large enough to be a denial of service; no
//! length under 2^25 is treated so. The maximum advertised in
//! NBD_INFO_BLOCK_SIZE, requested or not, is 2^25.

mod common;

use std::sync::Arc;

use common::*;
use squeeze_nbd::MemDevice;

const MIB: u32 = 1 << 20;

/// Handshake with NBD_OPT_EXPORT_NAME: no block size negotiation, simple
/// replies. Returns the export size.
fn export_name_handshake(c: &mut Client, name: &str) -> u64 {
    c.start();
    c.send_option(OPT_EXPORT_NAME, name.as_bytes());
    let reply = c.read_n(10); // size, flags; no zeroes (NO_ZEROES)
    be64(&reply)
}

/// A request over the maximum is answered EINVAL with a simple reply and
/// no data; the connection stays in sync (the next request is answered).
fn refused_then_in_sync(c: &mut Client, offset: u64, len: u32) {
    c.send_request(CMD_READ, 0, 1, offset, len, &[]);
    match c.reply(None) {
        Reply::Simple { errno, cookie } => assert_eq!((errno, cookie), (EINVAL, 1), "READ {len}"),
        Reply::Chunk(_) => panic!("structured reply never negotiated"),
    }
    let payload = vec![0xa5u8; len as usize];
    c.send_request(CMD_WRITE, 0, 2, offset, len, &payload);
    match c.reply(None) {
        Reply::Simple { errno, cookie } => {
            assert_eq!((errno, cookie), (EINVAL, 2), "WRITE {len}")
        }
        Reply::Chunk(_) => panic!("structured reply never negotiated"),
    }
    assert_eq!(c.write(4096, b"in sync"), 0);
    assert_eq!(c.read(4096, 7).unwrap(), b"in sync");
}

#[test]
fn integrityhuge_requests_are_einval_and_the_connection_goes_on() {
    let big = Arc::new(MemDevice::new(1 << 30));
    let small = Arc::new(MemDevice::new(1 << 20));
    let srv = TestServer::start(vec![export("big", big.clone()), export("small", small)]);

    let mut c = srv.client();
    assert_eq!(export_name_handshake(&mut c, "big"), 1 << 30);
    for len in [BLOCK_SIZE_MAX + 1, 33 * MIB, 41 * MIB, 49 * MIB] {
        refused_then_in_sync(&mut c, 0, len);
    }
    // The maximum itself is served.
    let max = vec![0x5au8; BLOCK_SIZE_MAX as usize];
    assert_eq!(c.write(0, &max), 0);
    assert_eq!(c.read(0, BLOCK_SIZE_MAX).unwrap(), max);
    assert_eq!(big.allocated_bytes(), u64::from(BLOCK_SIZE_MAX));
    c.disconnect();

    // On an export smaller than the request: EINVAL too (the length is
    // wrong whatever the offset), not ENOSPC.
    let mut c = srv.client();
    assert_eq!(export_name_handshake(&mut c, "small"), 1 << 20);
    refused_then_in_sync(&mut c, 0, 33 * MIB);
    c.disconnect();

    // Too long even to skip: closed without a reply; the server goes on.
    let mut c = srv.client();
    export_name_handshake(&mut c, "big");
    c.send_request(CMD_WRITE, 0, 3, 0, 64 * MIB + 1, &[]);
    assert!(c.is_closed_by_server());
    let mut c = srv.client();
    export_name_handshake(&mut c, "big");
    assert_eq!(c.read(0, 2).unwrap(), [0x5a, 0x5a]);
    c.disconnect();
}

#[test]
fn the_maximum_block_size_is_advertised_unasked() {
    let (srv, _dev) = TestServer::mem(1 << 30);
    let mut c = srv.client();
    c.start();
    // NBD_OPT_GO asking for no information at all.
    c.send_option(OPT_GO, &go_payload("mem", &[]));
    let replies = c.opt_replies();
    let bs = replies
        .iter()
        .find(|r| r.kind == REP_INFO && be16(&r.data) == INFO_BLOCK_SIZE)
        .expect("NBD_INFO_BLOCK_SIZE sent unasked");
    assert_eq!(bs.data.len(), 14);
    assert_eq!(
        (
            be32(&bs.data[2..]),
            be32(&bs.data[6..]),
            be32(&bs.data[10..])
        ),
        (1, 4096, 1 << 25),
        "minimum, preferred, maximum"
    );
    assert_eq!(replies.last().unwrap().kind, REP_ACK);
}
