//! Two connections (CAN_MULTI_CONN): writes on one, a flush on the other;
//! the data is visible to both and to a third client (qemu-io), and the
//! flush made it durable: it survives SIGKILL of the server and a restart.

mod common;

use common::*;

#[test]
fn write_on_one_connection_flush_on_other() {
    let w = Workdir::new();
    let mut srv = Serve::start(&w, &[]);
    let mut a = srv.client(true);
    let mut b = srv.client(false);
    assert_ne!(a.flags & FLAG_CAN_MULTI_CONN, 0, "flags {:#x}", a.flags);
    assert_ne!(b.flags & FLAG_SEND_FLUSH, 0, "flags {:#x}", b.flags);

    let d1 = mixed_data(3 << 20, 1);
    let d2 = random_data(1 << 20, 2);
    assert_eq!(a.write(0, &d1), 0);
    assert_eq!(a.write(100 * MIB + 7, &d2), 0);
    assert_eq!(b.flush(), 0);
    assert_eq!(b.read(0, d1.len() as u32).unwrap(), d1);
    assert_eq!(a.read(0, d1.len() as u32).unwrap(), d1);
    assert_eq!(b.read(100 * MIB + 7, d2.len() as u32).unwrap(), d2);
    assert_eq!(a.read(100 * MIB + 7, d2.len() as u32).unwrap(), d2);

    // B overwrites part of A's range; A sees it at once.
    assert_eq!(b.write(MIB, &vec![0x77u8; 4096]), 0);
    assert_eq!(a.read(MIB, 4096).unwrap(), vec![0x77u8; 4096]);
    assert_eq!(a.flush(), 0);

    if have_tool("qemu-io") {
        qemu_io_ok(&srv.uri(), &["read -P 0x77 1M 4k"]);
    }

    // The flushes are durable: crash the server (no shutdown path at all).
    let st = srv.signal_and_wait(libc::SIGKILL, std::time::Duration::from_secs(10));
    assert!(st.is_some(), "SIGKILL did not end the server");
    drop(a);
    drop(b);
    let _ = std::fs::remove_file(w.socket());
    let srv = Serve::start(&w, &[]);
    let mut c = srv.client(true);
    let mut want = d1.clone();
    want[MIB as usize..MIB as usize + 4096].fill(0x77);
    assert_eq!(c.read(0, want.len() as u32).unwrap(), want);
    assert_eq!(c.read(100 * MIB + 7, d2.len() as u32).unwrap(), d2);
    c.disconnect();
    srv.stop();
}
