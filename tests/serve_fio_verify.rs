//! fio with `ioengine=nbd` and `verify=crc32c`: 128 KiB sequential writes
//! and 4 KiB random writes at iodepth 32 (compressible buffers), each read
//! back and checked.

mod common;

use common::*;

fn fio(w: &Workdir, srv: &Serve, name: &str, rw: &str, bs: &str, size: &str) {
    let out = run(timed("fio")
        .current_dir(w.dir.path())
        .arg(format!("--name={name}"))
        .arg("--ioengine=nbd")
        .arg(format!("--uri={}", srv.uri()))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg("--iodepth=32")
        .arg(format!("--size={size}"))
        .arg("--buffer_compress_percentage=60")
        .arg("--buffer_compress_chunk=4k")
        .arg("--refill_buffers")
        .arg("--verify=crc32c")
        .arg("--verify_fatal=1")
        .arg("--do_verify=1")
        .arg("--verify_state_save=0")
        .arg("--output-format=terse"));
    assert!(!out.contains("verify:"), "{out}");
}

#[test]
fn fio_nbd_verified_seq_and_random_writes() {
    if !have_tool("fio") {
        return;
    }
    let w = Workdir::new();
    let srv = Serve::start(&w, &[]);
    fio(&w, &srv, "seqwrite", "write", "128k", "64m");
    fio(&w, &srv, "randwrite", "randwrite", "4k", "16m");
    let st = live_stats(&srv);
    let written = st["bytes_written"].as_u64().unwrap();
    let read = st["bytes_read"].as_u64().unwrap();
    assert!(written >= 80 * MIB, "{st}");
    assert!(read >= 80 * MIB, "verification reads: {st}");
    assert_eq!(st["checksum_errors"], 0, "{st}");
    srv.stop();
}
