//! `nbdcopy` round trip: a file into the export and back out, identical,
//! with the zero runs left as holes on the export.

mod common;

use common::*;

#[test]
fn nbdcopy_round_trip() {
    if !have_tool("nbdcopy") {
        return;
    }
    let size = 32usize << 20;
    let (srv, dev) = TestServer::mem(size as u64);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    let data = mixed_data(size, 11);
    std::fs::write(&src, &data).unwrap();

    run(timed("nbdcopy").arg(&src).arg(srv.uri()));
    // nbdcopy skips or zeroes the all-zero quarter instead of writing it.
    assert!(
        dev.allocated_bytes() < size as u64,
        "zeros were written as data"
    );
    std::fs::write(&back, b"").unwrap();
    run(timed("nbdcopy").arg(srv.uri()).arg(&back));
    assert!(std::fs::read(&back).unwrap() == data, "round trip differs");
    let st = srv.server.stats();
    assert_eq!(st.errors, 0, "{st:?}");
    assert!(st.bytes_read > 0 && st.bytes_written > 0, "{st:?}");
}
