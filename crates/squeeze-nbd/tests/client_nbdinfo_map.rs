//! `nbdinfo` sees the export, and `nbdinfo --map` reports holes after a
//! trim and after a hole-allowed zero write.

mod common;

use common::*;

/// (offset, length, type) rows of `nbdinfo --map`.
fn map(srv: &TestServer) -> Vec<(u64, u64, u32)> {
    let out = run(timed("nbdinfo").arg("--map").arg(srv.uri()));
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn nbdinfo_map_shows_holes() {
    if !have_tool("nbdinfo") {
        return;
    }
    const MIB: u64 = 1 << 20;
    let (srv, _dev) = TestServer::mem(8 * MIB);

    let info = run(timed("nbdinfo").arg(srv.uri()));
    assert!(info.contains("export-size: 8388608"), "{info}");
    assert!(info.contains("can_multi_conn: true"), "{info}");

    assert_eq!(map(&srv), vec![(0, 8 * MIB, 3)]);

    let mut c = srv.client();
    c.handshake("mem", true, true);
    let data = vec![0x5cu8; 4 * MIB as usize];
    for i in 0..2 {
        assert_eq!(c.write(i * 4 * MIB, &data), 0);
    }
    assert_eq!(map(&srv), vec![(0, 8 * MIB, 0)]);
    assert_eq!(c.cmd(CMD_TRIM, 0, MIB, MIB as u32, &[]), 0);
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 5 * MIB, MIB as u32, &[]), 0);
    assert_eq!(
        c.cmd(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 7 * MIB, MIB as u32, &[]),
        0
    );
    c.disconnect();
    assert_eq!(
        map(&srv),
        vec![
            (0, MIB, 0),
            (MIB, MIB, 3),
            (2 * MIB, 3 * MIB, 0),
            (5 * MIB, MIB, 3),
            (6 * MIB, 2 * MIB, 0),
        ]
    );
}
