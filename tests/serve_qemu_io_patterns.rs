//! qemu-io against `squeeze serve`: write / read / discard / write-zeroes
//! patterns (aligned and unaligned, async, FUA) verified with `read -P`,
//! then verified again on a fresh connection and after a server restart.

mod common;

use common::*;

#[test]
fn qemu_io_patterns_read_back() {
    if !have_tool("qemu-io") {
        return;
    }
    let w = Workdir::new();
    let srv = Serve::start(&w, &[]);
    let uri = srv.uri();
    qemu_io_ok(
        &uri,
        &[
            "write -P 0xab 0 4M",
            "read -P 0xab 0 4M",
            "write -P 0x11 12345 77777",
            "read -P 0x11 12345 77777",
            "read -P 0xab 0 12345",
            "read -P 0xab 90122 4104182",
            "discard 1M 1M",
            "read -P 0 1M 1M",
            "read -P 0xab 2M 2M",
            "write -z -u 2M 1M",
            "read -P 0 2M 1M",
            "write -z 3M 512k",
            "read -P 0 3M 512k",
            "read -P 0xab 3584k 512k",
            "aio_write -P 0x22 8M 1M",
            "aio_write -P 0x33 9M 1M",
            "aio_flush",
            "read -P 0x22 8M 1M",
            "read -P 0x33 9M 1M",
            "write -f -P 0x44 1020M 4M",
            "read -P 0x44 1020M 4M",
            "write -P 0x55 511 1",
            "read -P 0x55 511 1",
            "read -P 0xab 0 511",
            "read -P 0xab 512 1024",
            "flush",
        ],
    );
    // A new connection sees the same bytes.
    let verify = [
        "read -P 0xab 0 511",
        "read -P 0x55 511 1",
        "read -P 0xab 512 11833",
        "read -P 0xab 90122 958454",
        "read -P 0x11 12345 77777",
        "read -P 0 1M 2560k",
        "read -P 0xab 3584k 512k",
        "read -P 0x22 8M 1M",
        "read -P 0x33 9M 1M",
        "read -P 0 10M 1010M",
        "read -P 0x44 1020M 4M",
    ];
    qemu_io_ok(&uri, &verify);
    srv.stop();
    // And so does a restarted server (the flush made it durable).
    let srv = Serve::start(&w, &[]);
    qemu_io_ok(&srv.uri(), &verify);
    srv.stop();
}
