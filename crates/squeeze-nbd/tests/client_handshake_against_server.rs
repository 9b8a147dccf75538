//! `client_handshake::negotiate` against this crate's own server: the size
//! and flags it learns are the export's, the stream is left at the start of
//! the transmission phase (a request right after it is answered), and every
//! refusal is a typed error that names the export.

mod common;

use common::*;
use squeeze_nbd::{negotiate, NegotiateError, ServerConfig};

const SIZE_BYTES: u64 = 3 << 30;

#[test]
fn go_learns_size_and_flags_and_leaves_the_stream_at_transmission() {
    let (srv, dev) = TestServer::mem(SIZE_BYTES);
    let mut s = srv.connect();
    let info = negotiate(&mut s, "mem").expect("handshake");
    assert_eq!(info.size_bytes, SIZE_BYTES);
    let want =
        FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES;
    assert_eq!(
        info.transmission_flags & want,
        want,
        "flags {:#x}",
        info.transmission_flags
    );
    assert_ne!(info.transmission_flags & FLAG_CAN_MULTI_CONN, 0);
    assert_eq!(info.transmission_flags & FLAG_READ_ONLY, 0);
    let bs = info
        .block_sizes
        .expect("the server sends NBD_INFO_BLOCK_SIZE");
    assert_eq!(
        (bs.minimum_bytes, bs.maximum_bytes),
        (BLOCK_SIZE_MIN, BLOCK_SIZE_MAX)
    );
    assert!(
        info.flag_names().contains("flush fua trim write-zeroes"),
        "{}",
        info.flag_names()
    );

    // The transmission phase, as the kernel would speak it: a write, then a
    // read of it back, with simple replies.
    let mut c = Client { s };
    assert_eq!(c.write(8192, &[0x5a; 4096]), 0);
    assert_eq!(c.read(8192, 4096).unwrap(), vec![0x5a; 4096]);
    drop(dev);
}

#[test]
fn an_unknown_export_is_refused_by_name() {
    let (srv, _dev) = TestServer::mem(1 << 20);
    let mut s = srv.connect();
    match negotiate(&mut s, "nope") {
        Err(NegotiateError::Refused { export, reason, .. }) => {
            assert_eq!(export, "nope");
            assert!(reason.contains("NBD_REP_ERR_UNKNOWN"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The connection is still in the option phase: a second try works.
    negotiate_again_on(&mut s, "mem");
}

/// After a refusal the server waits for another option: a GO for a known
/// export on the same stream succeeds (without a second greeting).
fn negotiate_again_on(s: &mut std::os::unix::net::UnixStream, name: &str) {
    use std::io::{Read, Write};
    let mut go = (name.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(name.as_bytes());
    go.extend_from_slice(&0u16.to_be_bytes());
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&OPT_GO.to_be_bytes());
    m.extend_from_slice(&(go.len() as u32).to_be_bytes());
    m.extend_from_slice(&go);
    s.write_all(&m).unwrap();
    let mut last = 0;
    while last != REP_ACK {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        last = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut d = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        s.read_exact(&mut d).unwrap();
        assert_eq!(last & (1 << 31), 0, "error reply {last:#x}");
    }
}

#[test]
fn an_export_off_the_allow_list_is_refused() {
    let config = ServerConfig {
        allowed_exports: Some(vec!["a".into()]),
        ..ServerConfig::default()
    };
    let dev = std::sync::Arc::new(squeeze_nbd::MemDevice::new(1 << 20));
    let srv = TestServer::start_with(vec![export("a", dev.clone()), export("b", dev)], config);
    let err = negotiate(&mut srv.connect(), "b").unwrap_err();
    assert!(matches!(err, NegotiateError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("\"b\""), "{err}");
    assert_eq!(
        negotiate(&mut srv.connect(), "a").unwrap().size_bytes,
        1 << 20
    );
}

#[test]
fn not_an_nbd_server_is_named() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-nbd.sock");
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    });
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let err = negotiate(&mut s, "x").unwrap_err();
    assert!(matches!(err, NegotiateError::NotNbd { .. }), "{err}");
    t.join().unwrap();
}
