//! Out-of-range requests get errors, not data loss, and the connection
//! stays usable: a write past the end -> ENOSPC (as nbdkit answers), a read
//! or trim past the end -> EINVAL; qemu-io reports the failure too.

mod common;

use common::*;

#[test]
fn out_of_range_requests_fail_cleanly() {
    let w = Workdir::new();
    w.create("16M", &[]);
    let srv = Serve::start(&w, &[]);
    let end = 16 * MIB;
    let mut c = srv.client(true);
    assert_eq!(c.size, end);
    assert_eq!(c.write(end - 4096, &[0x42u8; 4096]), 0);
    assert_eq!(c.write(end - 2048, &[1u8; 4096]), ENOSPC);
    assert_eq!(c.write(end, &[1u8; 512]), ENOSPC);
    assert_eq!(c.read(end - 512, 1024), Err(EINVAL));
    assert_eq!(c.read(u64::MAX - 511, 512), Err(EINVAL));
    assert_eq!(c.cmd(CMD_TRIM, 0, end - 4096, 8192, &[]), EINVAL);
    let wz = c.cmd(CMD_WRITE_ZEROES, 0, end, 4096, &[]);
    assert!(
        wz == ENOSPC || wz == EINVAL,
        "write-zeroes past the end: {wz}"
    );
    // Nothing past the end was applied, the connection still works.
    assert_eq!(c.read(end - 4096, 4096).unwrap(), vec![0x42u8; 4096]);
    c.disconnect();

    if have_tool("qemu-io") {
        let (_, out) = qemu_io(&srv.uri(), &["write -P 1 16M 4k"]);
        assert!(out.contains("failed"), "{out}");
        let (_, out) = qemu_io(&srv.uri(), &["read -P 0x42 16380k 4k"]);
        assert!(!out.contains("failed"), "{out}");
    }
    srv.stop();
}
