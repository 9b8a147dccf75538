//! Hostile clients: garbage bytes, truncated and malformed handshakes, bad
//! magic, oversized lengths, unknown commands and a disconnect in the middle
//! of a WRITE payload. Each bad connection is closed (or answered with an
//! error); the server stays up and keeps serving a well-behaved client that
//! is connected all along, and new clients.

mod common;

use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn raw(srv: &Serve) -> UnixStream {
    let s = UnixStream::connect(&srv.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Reads until the server closes the connection (bounded by the timeout).
fn drain_until_closed(s: &mut UnixStream) {
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn check_good(good: &mut Client, data: &[u8]) {
    assert_eq!(good.read(0, data.len() as u32).unwrap(), data);
}

#[test]
fn hostile_clients_do_not_take_the_server_down() {
    let w = Workdir::new();
    let mut srv = Serve::start(&w, &[]);
    let data = mixed_data(256 << 10, 5);
    let mut good = srv.client(true);
    assert_eq!(good.write(0, &data), 0);

    // 1. Garbage instead of client flags.
    let mut s = raw(&srv);
    let _ = s.write_all(b"\xde\xad\xbe\xef garbage \x00\xff\x13\x37");
    drain_until_closed(&mut s);
    check_good(&mut good, &data);

    // 2. Truncated handshake: two bytes of flags, then hang up.
    let mut s = raw(&srv);
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&[0, 0]).unwrap();
    drop(s);
    check_good(&mut good, &data);

    // 3. Bad option magic.
    let mut c = Client::connect(&srv.socket);
    let _ = c.read_n(18);
    c.s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    c.s.write_all(&[0x42; 16]).unwrap();
    drain_until_closed(&mut c.s);
    check_good(&mut good, &data);

    // 4. An option claiming 4 GiB of payload.
    let mut c = Client::connect(&srv.socket);
    let _ = c.read_n(18);
    c.s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&u32::MAX.to_be_bytes());
    c.s.write_all(&b).unwrap();
    drain_until_closed(&mut c.s);
    check_good(&mut good, &data);

    // 5. Unknown command after a good handshake: an error reply, the
    //    connection may live on; then a bad request magic closes it.
    let mut c = srv.client(false);
    c.send_request(0x1234, 0, 77, 0, 0);
    let (errno, cookie, _) = c.reply(0);
    assert_eq!((errno != 0, cookie), (true, 77));
    c.s.write_all(&[0xffu8; 28]).unwrap();
    assert!(c.is_closed_by_server());
    check_good(&mut good, &data);

    // 6. A WRITE claiming 1 GiB of payload.
    let mut c = srv.client(false);
    c.send_request(CMD_WRITE, 0, 78, 0, 1 << 30);
    let _ = c.s.write_all(&[0u8; 4096]);
    drain_until_closed(&mut c.s);
    check_good(&mut good, &data);

    // 7. Disconnect in the middle of a WRITE payload.
    let mut c = srv.client(true);
    c.send_request(CMD_WRITE, 0, 79, 0, 1 << 20);
    c.s.write_all(&vec![0xeeu8; 300 << 10]).unwrap();
    drop(c);
    // 8. A header cut short.
    let mut c = srv.client(true);
    c.s.write_all(&REQUEST_MAGIC.to_be_bytes()).unwrap();
    drop(c);
    std::thread::sleep(Duration::from_millis(200));
    // The half-sent write never reached the volume.
    check_good(&mut good, &data);

    assert!(srv.is_running(), "server died:\n{}", srv.log_text());
    if have_tool("qemu-io") {
        qemu_io_ok(&srv.uri(), &["write -P 0x9a 1M 1M", "read -P 0x9a 1M 1M"]);
    }
    let mut fresh = srv.client(true);
    check_good(&mut fresh, &data);
    fresh.disconnect();
    good.disconnect();
    let log = srv.log_text();
    assert!(
        log.to_lowercase().contains("protocol") || log.contains("WARN") || log.contains("INFO"),
        "{log}"
    );
    srv.stop();
}
