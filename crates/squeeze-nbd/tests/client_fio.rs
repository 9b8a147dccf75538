//! fio with `ioengine=nbd` and `verify=crc32c`: 128 KiB sequential writes
//! and 4 KiB random writes at iodepth 32, each verified by reading back.

mod common;

use common::*;

fn fio(srv: &TestServer, name: &str, rw: &str, bs: &str, size: &str) {
    let out = run(timed("fio")
        .arg(format!("--name={name}"))
        .arg("--ioengine=nbd")
        .arg(format!("--uri={}", srv.uri()))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg("--iodepth=32")
        .arg(format!("--size={size}"))
        .arg("--verify=crc32c")
        .arg("--verify_fatal=1")
        .arg("--verify_state_save=0")
        .arg("--do_verify=1")
        .arg("--output-format=terse"));
    assert!(!out.contains("verify:"), "{out}");
}

#[test]
fn fio_verified_writes() {
    if !have_tool("fio") {
        return;
    }
    let (srv, _dev) = TestServer::mem(256 << 20);
    fio(&srv, "seqwrite", "write", "128k", "128m");
    fio(&srv, "randwrite", "randwrite", "4k", "32m");
    let st = srv.server.stats();
    assert_eq!(st.errors, 0, "{st:?}");
    assert!(st.bytes_written >= (128 << 20) + (32 << 20), "{st:?}");
    assert!(st.bytes_read >= (128 << 20), "verification reads: {st:?}");
}
