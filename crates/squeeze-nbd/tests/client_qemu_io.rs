//! qemu-io against the server: write/read/discard/write-zeroes patterns
//! with read-back verification (`read -P`), over a Unix socket.

mod common;

use common::*;

#[test]
fn qemu_io_patterns() {
    if !have_tool("qemu-io") {
        return;
    }
    let (srv, dev) = TestServer::mem(64 << 20);
    let cmds = [
        "write -P 0xab 0 4M",
        "read -P 0xab 0 4M",
        "write -P 0x11 12345 77777",
        "read -P 0x11 12345 77777",
        "read -P 0xab 0 12345",
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
        "write -f -P 0x44 60M 4M",
        "read -P 0x44 60M 4M",
        "flush",
    ];
    let mut cmd = timed("qemu-io");
    cmd.arg("-f").arg("raw");
    for c in cmds {
        cmd.arg("-c").arg(c);
    }
    cmd.arg(srv.uri());
    let out = run(&mut cmd);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(!out.to_lowercase().contains("error"), "{out}");
    // Discard and zero-with-unmap freed pages; zero without unmap kept them.
    // Allocated: 0..1M, 3M..4M (0xab, then zeros kept), 8M..10M, 60M..64M.
    assert_eq!(dev.allocated_bytes(), (1 + 1 + 2 + 4) << 20, "{out}");
    let st = srv.server.stats();
    assert!(
        st.requests.trim >= 1 || st.requests.write_zeroes >= 2,
        "{st:?}"
    );
    assert!(st.requests.flush >= 1, "{st:?}");
    assert_eq!(st.errors, 0, "{st:?}");
}
