//! Hostile and broken clients (issue 3): malformed and truncated
//! handshakes, bad magic, oversized lengths, unknown commands, disconnects
//! mid-request and with requests in flight, random garbage. Each one
//! affects its own connection only: after every case a well-behaved
//! client on another connection is still served, and the server's
//! connection count returns to what it was.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use squeeze_nbd::ServerConfig;

/// A well-behaved client still gets its data through.
fn still_serves(srv: &TestServer, tag: u8) {
    let mut c = srv.client();
    c.handshake("mem", true, true);
    assert_eq!(c.write(u64::from(tag) * 4096, &[tag; 512]), 0);
    assert_eq!(c.read(u64::from(tag) * 4096, 512).unwrap(), vec![tag; 512]);
    c.disconnect();
}

fn wait_for_no_connections(srv: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.server.stats().connections_open != 0 {
        assert!(
            Instant::now() < deadline,
            "connections did not close: {:?}",
            srv.server.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn in_transmission(srv: &TestServer) -> Client {
    let mut c = srv.client();
    c.handshake("mem", true, true);
    c
}

#[test]
fn hostile_handshakes() {
    let (srv, _dev) = TestServer::mem(1 << 20);
    // An idle client holding a connection open does not block others.
    let idle = srv.connect();

    // Connect and hang up at once.
    drop(srv.connect());
    still_serves(&srv, 1);

    // Truncated client flags.
    let mut c = srv.client();
    c.greeting();
    c.s.write_all(&[0, 0]).unwrap();
    drop(c);
    still_serves(&srv, 2);

    // Unknown client flag bits.
    let mut c = srv.client();
    c.greeting();
    c.s.write_all(&0x8000_0001u32.to_be_bytes()).unwrap();
    assert!(c.is_closed_by_server());
    still_serves(&srv, 3);

    // Bad option magic.
    let mut c = srv.client();
    c.start();
    c.s.write_all(&[0xde; 16]).unwrap();
    assert!(c.is_closed_by_server());
    still_serves(&srv, 4);

    // Absurd option length.
    let mut c = srv.client();
    c.start();
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&u32::MAX.to_be_bytes());
    c.s.write_all(&b).unwrap();
    assert!(c.is_closed_by_server());
    still_serves(&srv, 5);

    // Truncated option payload, then hang up.
    let mut c = srv.client();
    c.start();
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&100u32.to_be_bytes());
    b.extend_from_slice(&[0; 10]);
    c.s.write_all(&b).unwrap();
    drop(c);
    still_serves(&srv, 6);

    // Malformed GO payloads get NBD_REP_ERR_INVALID and the session lives.
    let mut c = srv.client();
    c.start();
    for bad in [
        &[][..],
        &[0, 0, 0, 0][..],
        &[0, 0, 0, 0, 0, 5, 0][..],
        &[0xff; 8][..],
    ] {
        c.send_option(OPT_GO, bad);
        assert_eq!(c.opt_replies()[0].kind, REP_ERR_INVALID);
        c.send_option(OPT_SET_META_CONTEXT, bad);
        assert_eq!(c.opt_replies()[0].kind, REP_ERR_INVALID);
    }
    c.send_option(OPT_GO, &go_payload("", &[]));
    assert_eq!(c.opt_replies().last().unwrap().kind, REP_ACK);
    assert_eq!(c.write(0, b"fine"), 0);
    c.disconnect();

    drop(idle);
    wait_for_no_connections(&srv);
    assert!(
        srv.server.stats().protocol_errors >= 5,
        "{:?}",
        srv.server.stats()
    );
}

#[test]
fn hostile_requests() {
    let (srv, _dev) = TestServer::mem(1 << 20);

    // Bad request magic closes the connection.
    let mut c = in_transmission(&srv);
    c.s.write_all(&[0x11; 28]).unwrap();
    assert!(c.is_closed_by_server());
    still_serves(&srv, 1);

    // A WRITE too large even to skip closes the connection.
    let mut c = in_transmission(&srv);
    c.send_request(CMD_WRITE, 0, 1, 0, u32::MAX, &[]);
    assert!(c.is_closed_by_server());
    still_serves(&srv, 2);

    // Oversized READ and unknown commands are errors, not disconnects.
    let mut c = in_transmission(&srv);
    assert_eq!(c.read(0, u32::MAX), Err(EINVAL));
    for cmd in [5u16, 8, 9, 0x7fff, 0xffff] {
        assert_eq!(c.cmd(cmd, 0, 0, 0, &[]), EINVAL);
    }
    assert_eq!(c.cmd(CMD_READ, 0xffff, 0, 1, &[]), EINVAL);
    assert_eq!(c.read(0, 1).unwrap(), vec![0]);
    c.disconnect();

    // Truncated header, then hang up.
    let mut c = in_transmission(&srv);
    c.s.write_all(&Client::request_bytes(CMD_READ, 0, 1, 0, 1)[..13])
        .unwrap();
    drop(c);
    still_serves(&srv, 3);

    // Disconnect in the middle of a WRITE payload.
    let mut c = in_transmission(&srv);
    c.send_request(CMD_WRITE, 0, 1, 0, 4096, &[0xee; 100]);
    drop(c);
    still_serves(&srv, 4);

    // Disconnect with many requests in flight (replies go nowhere).
    let mut c = in_transmission(&srv);
    for i in 0..64 {
        c.send_request(CMD_READ, 0, i, 0, 65536, &[]);
        c.send_request(CMD_WRITE, 0, 1000 + i, 8192, 4096, &[0xcd; 4096]);
    }
    drop(c);
    still_serves(&srv, 5);

    // Random garbage after a good handshake and before any handshake.
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for round in 0..20 {
        let mut garbage = vec![0u8; rng.gen_range(1..4096)];
        rng.fill(&mut garbage[..]);
        let mut c = if round % 2 == 0 {
            in_transmission(&srv)
        } else {
            srv.client()
        };
        let _ = c.s.write_all(&garbage);
        drop(c);
    }
    still_serves(&srv, 6);

    wait_for_no_connections(&srv);
    let st = srv.server.stats();
    assert!(st.protocol_errors >= 4, "{st:?}");
    assert_eq!(st.requests_in_flight, 0);
}

#[test]
fn handshake_timeout_frees_the_connection() {
    let dev = std::sync::Arc::new(squeeze_nbd::MemDevice::new(1 << 20));
    let config = ServerConfig {
        handshake_timeout: Some(Duration::from_millis(200)),
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(vec![export("mem", dev)], config);
    let mut c = srv.client();
    c.greeting();
    // Say nothing: the server gives up.
    assert!(c.is_closed_by_server());
    wait_for_no_connections(&srv);
    still_serves(&srv, 1);
}

#[test]
fn client_that_stops_reading_does_not_starve_others() {
    use squeeze_nbd::BlockDevice;
    let dev = std::sync::Arc::new(squeeze_nbd::MemDevice::new(64 << 20));
    // Data, not holes: READ replies carry the whole megabyte.
    dev.write_at(0, &[0x77; 1 << 20], false).unwrap();
    let config = ServerConfig {
        workers: 2,
        send_timeout: Some(Duration::from_millis(500)),
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(vec![export("mem", dev)], config);
    let mut stuck = in_transmission(&srv);
    // 1 MiB reads whose replies are never read: the socket fills up.
    for i in 0..256 {
        stuck.send_request(CMD_READ, 0, i, 0, 1 << 20, &[]);
    }
    std::thread::sleep(Duration::from_millis(100));
    // Only one worker is tied up; another client is served meanwhile.
    still_serves(&srv, 7);
    // After send_timeout the stuck connection is closed server-side.
    wait_for_no_connections(&srv);
    drop(stuck);
    still_serves(&srv, 8);
}
