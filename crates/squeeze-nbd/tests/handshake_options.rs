//! The option phase, driven byte by byte: LIST, INFO (export, name,
//! description, block size), unknown export, unknown option, STARTTLS,
//! STRUCTURED_REPLY, meta contexts, EXPORT_NAME (with and without zero
//! padding), ABORT, and the empty name selecting the first export.

mod common;

use std::io::Write;
use std::sync::Arc;

use common::*;
use squeeze_nbd::MemDevice;

fn two_exports() -> TestServer {
    TestServer::start(vec![
        export("first", Arc::new(MemDevice::new(1 << 20))),
        export("ro", Arc::new(MemDevice::new(2 << 20).with_read_only(true))),
    ])
}

#[test]
fn list_info_and_errors() {
    let srv = two_exports();
    let mut c = srv.client();
    c.start();

    c.send_option(OPT_LIST, &[]);
    let r = c.opt_replies();
    assert_eq!(r.len(), 3);
    let names: Vec<String> = r[..2]
        .iter()
        .map(|x| {
            assert_eq!(x.kind, REP_SERVER);
            let n = be32(&x.data) as usize;
            String::from_utf8(x.data[4..4 + n].to_vec()).unwrap()
        })
        .collect();
    assert_eq!(names, ["first", "ro"]);
    assert_eq!(r[2].kind, REP_ACK);

    c.send_option(OPT_LIST, b"junk");
    assert_eq!(c.opt_replies()[0].kind, REP_ERR_INVALID);

    // INFO on the read-only export, asking for name, description, block size.
    c.send_option(
        OPT_INFO,
        &go_payload("ro", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
    );
    let r = c.opt_replies();
    assert!(r.iter().all(|x| x.opt == OPT_INFO));
    assert_eq!(r.last().unwrap().kind, REP_ACK);
    let info = |t: u16| {
        r.iter()
            .find(|x| x.kind == REP_INFO && be16(&x.data) == t)
            .unwrap_or_else(|| panic!("info {t} missing"))
            .data[2..]
            .to_vec()
    };
    let e = info(INFO_EXPORT);
    assert_eq!(be64(&e), 2 << 20);
    let flags = be16(&e[8..]);
    for f in [
        FLAG_HAS_FLAGS,
        FLAG_READ_ONLY,
        FLAG_SEND_FLUSH,
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_SEND_WRITE_ZEROES,
        FLAG_SEND_FAST_ZERO,
        FLAG_CAN_MULTI_CONN,
    ] {
        assert_eq!(flags & f, f, "flag {f:#x} missing from {flags:#x}");
    }
    assert_eq!(flags & FLAG_SEND_DF, 0, "DF only with structured replies");
    assert_eq!(info(INFO_NAME), b"ro");
    assert_eq!(info(INFO_DESCRIPTION), b"test export ro");
    let bs = info(INFO_BLOCK_SIZE);
    assert_eq!(
        (be32(&bs), be32(&bs[4..]), be32(&bs[8..])),
        (1, 4096, 32 << 20)
    );

    // Errors the protocol lets the server answer.
    c.send_option(OPT_INFO, &go_payload("nope", &[]));
    assert_eq!(c.opt_replies()[0].kind, REP_ERR_UNKNOWN);
    c.send_option(OPT_GO, &[0, 0, 0, 9, b'x']);
    assert_eq!(c.opt_replies()[0].kind, REP_ERR_INVALID);
    c.send_option(0x4242, b"whatever");
    assert_eq!(c.opt_replies()[0].kind, REP_ERR_UNSUP);
    c.send_option(OPT_STARTTLS, &[]);
    assert_eq!(c.opt_replies()[0].kind, REP_ERR_UNSUP);
    c.send_option(OPT_STRUCTURED_REPLY, b"x");
    assert_eq!(c.opt_replies()[0].kind, REP_ERR_INVALID);
    // SET_META_CONTEXT before STRUCTURED_REPLY is invalid.
    c.send_option(
        OPT_SET_META_CONTEXT,
        &meta_payload("", &["base:allocation"]),
    );
    assert_eq!(c.opt_replies()[0].kind, REP_ERR_INVALID);

    // LIST_META_CONTEXT: all, by namespace, unknown.
    for (queries, expect) in [(&[][..], 1), (&["base:"][..], 1), (&["other:thing"][..], 0)] {
        c.send_option(OPT_LIST_META_CONTEXT, &meta_payload("first", queries));
        let r = c.opt_replies();
        assert_eq!(r.len(), expect + 1);
        if expect == 1 {
            assert_eq!(r[0].kind, REP_META_CONTEXT);
            assert_eq!(&r[0].data[4..], META_BASE_ALLOCATION.as_bytes());
        }
    }

    // ABORT: ACK, then the server closes.
    c.send_option(OPT_ABORT, &[]);
    assert_eq!(c.opt_reply().kind, REP_ACK);
    assert!(c.is_closed_by_server());
}

#[test]
fn go_with_structured_replies_and_meta_context() {
    let srv = two_exports();
    let mut c = srv.client();
    c.start();
    c.send_option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.opt_replies()[0].kind, REP_ACK);
    c.send_option(
        OPT_SET_META_CONTEXT,
        &meta_payload("", &["nope:x", "base:allocation"]),
    );
    let r = c.opt_replies();
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].kind, REP_META_CONTEXT);
    assert_eq!(be32(&r[0].data), META_BASE_ALLOCATION_ID);
    // Empty name: the first export.
    c.send_option(OPT_GO, &go_payload("", &[]));
    let r = c.opt_replies();
    let e = r
        .iter()
        .find(|x| x.kind == REP_INFO && be16(&x.data) == INFO_EXPORT)
        .unwrap();
    assert_eq!(be64(&e.data[2..]), 1 << 20);
    assert_eq!(
        be16(&e.data[10..]) & (FLAG_SEND_DF | FLAG_READ_ONLY),
        FLAG_SEND_DF
    );
    // Transmission works: block status on a fresh device is one hole.
    c.send_request(CMD_BLOCK_STATUS, 0, 5, 0, 1 << 20, &[]);
    let Reply::Chunk(ch) = c.reply(None) else {
        panic!("block status needs a chunk")
    };
    assert_eq!(
        (ch.kind, ch.cookie, ch.flags),
        (REPLY_TYPE_BLOCK_STATUS, 5, REPLY_FLAG_DONE)
    );
    assert_eq!(be32(&ch.payload), META_BASE_ALLOCATION_ID);
    assert_eq!(
        (be32(&ch.payload[4..]), be32(&ch.payload[8..])),
        (1 << 20, STATE_HOLE | STATE_ZERO)
    );
    c.disconnect();
}

#[test]
fn export_name_with_and_without_zero_padding() {
    let srv = two_exports();
    // Old-style client: no NO_ZEROES, so 124 zero bytes follow.
    let mut c = srv.client();
    assert_eq!(c.greeting(), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    c.s.write_all(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
    c.send_option(OPT_EXPORT_NAME, b"ro");
    let r = c.read_n(8 + 2 + 124);
    assert_eq!(be64(&r), 2 << 20);
    assert_eq!(be16(&r[8..]) & FLAG_READ_ONLY, FLAG_READ_ONLY);
    assert!(r[10..].iter().all(|&b| b == 0));
    assert_eq!(c.write(0, b"nope"), EPERM);
    assert_eq!(c.read(0, 4).unwrap(), vec![0; 4]);
    c.disconnect();

    // NO_ZEROES honoured: the next bytes are the reply to our first request.
    let mut c = srv.client();
    c.start();
    c.send_option(OPT_EXPORT_NAME, b"first");
    let r = c.read_n(10);
    assert_eq!(be64(&r), 1 << 20);
    assert_eq!(c.write(0, b"abcd"), 0);
    assert_eq!(c.read(0, 4).unwrap(), b"abcd");
    c.disconnect();

    // Unknown export via EXPORT_NAME: the only answer is to close.
    let mut c = srv.client();
    c.start();
    c.send_option(OPT_EXPORT_NAME, b"missing");
    assert!(c.is_closed_by_server());
    assert!(srv.server.stats().protocol_errors >= 1);
}
