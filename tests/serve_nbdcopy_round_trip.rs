//! nbdcopy round trip: a real file into the export, the export back out
//! to a file, byte for byte equal (and the tail past the data reads as zeros).

mod common;

use common::*;

#[test]
fn nbdcopy_file_to_export_and_back() {
    if !have_tool("nbdcopy") {
        return;
    }
    let w = Workdir::new();
    let src = w.path("src.bin");
    let len = real_file(&src, 20 << 20);
    w.create("32M", &[]);
    let srv = Serve::start(&w, &[]);
    let uri = srv.uri();
    run(timed("nbdcopy").arg("--flush").arg(&src).arg(&uri));
    let dst = w.path("dst.bin");
    std::fs::File::create(&dst).unwrap();
    run(timed("nbdcopy").arg(&uri).arg(&dst));
    let a = std::fs::read(&src).unwrap();
    let b = std::fs::read(&dst).unwrap();
    assert_eq!(b.len() as u64, 32 * MIB);
    assert!(a == b[..len], "copied data differs from the source");
    assert!(b[len..].iter().all(|&x| x == 0), "tail is not zero");
    srv.stop();
}
