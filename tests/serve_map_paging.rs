//! `squeeze serve --map-cache 64K`: the sector map of a volume whose map
//! is larger than that pages out to the checkpoint chain when the server
//! opens it, and qemu-io's reads and writes page it back in: every pattern
//! written reads back, across a restart, with the paging in `squeeze stats`.

mod common;

use common::*;

/// 3000 distinct 4 KiB-aligned offsets spread over 1 GiB (512 map chunks),
/// each with its own pattern byte.
fn spots() -> Vec<(u64, u8)> {
    let mut seen = std::collections::HashSet::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut v = Vec::new();
    while v.len() < 3000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let block = x % (1 << 18);
        if seen.insert(block) {
            v.push((block * 4096, 1 + (v.len() % 250) as u8));
        }
    }
    v
}

fn io(uri: &str, cmds: &[String]) {
    for part in cmds.chunks(500) {
        let refs: Vec<&str> = part.iter().map(String::as_str).collect();
        qemu_io_ok(uri, &refs);
    }
}

#[test]
fn a_paged_map_serves_qemu_io() {
    if !have_tool("qemu-io") {
        return;
    }
    let w = Workdir::new();
    let spots = spots();
    let srv = Serve::start(&w, &[]);
    let writes: Vec<String> = spots
        .iter()
        .map(|(off, p)| format!("write -P {p} {off} 4k"))
        .collect();
    io(&srv.qemu_uri(), &writes);
    let st = live_stats(&srv);
    assert_eq!(st["map_chunks"].as_u64(), Some(512), "{st}");
    assert_eq!(st["map_paged_chunks"].as_u64(), Some(0), "{st}");
    assert!(st["map_memory_bytes"].as_u64().unwrap() > 64 << 10, "{st}");
    srv.stop();

    // Reopened with a small cache: the map pages out as the volume opens.
    let srv = Serve::start(&w, &["--map-cache", "64K"]);
    let st = live_stats(&srv);
    assert_eq!(st["map_cache_bytes"].as_u64(), Some(64 << 10), "{st}");
    assert!(st["map_paged_chunks"].as_u64().unwrap() > 100, "{st}");
    let reads: Vec<String> = spots
        .iter()
        .map(|(off, p)| format!("read -P {p} {off} 4k"))
        .collect();
    io(&srv.qemu_uri(), &reads);
    // Overwrite half of them over paged-out chunks, read all back.
    let over: Vec<String> = spots
        .iter()
        .step_by(2)
        .map(|(off, p)| format!("write -P {} {off} 4k", p ^ 0xff))
        .collect();
    io(&srv.qemu_uri(), &over);
    let expect: Vec<String> = spots
        .iter()
        .enumerate()
        .map(|(i, (off, p))| {
            let p = if i % 2 == 0 { p ^ 0xff } else { *p };
            format!("read -P {p} {off} 4k")
        })
        .collect();
    io(&srv.qemu_uri(), &expect);
    let st = live_stats(&srv);
    assert!(st["map_faults"].as_u64().unwrap() >= 100, "{st}");
    let text = run(squeeze().arg("stats").arg(&srv.control));
    assert!(text.contains("chunks paged out"), "{text}");
    srv.stop();

    // And once more after the restart.
    let srv = Serve::start(&w, &["--map-cache", "64K"]);
    io(&srv.qemu_uri(), &expect);
    srv.stop();
}

/// A map cache below the smallest is refused by name, before anything
/// opens.
#[test]
fn a_map_cache_below_the_smallest_is_refused() {
    let w = Workdir::new();
    let out = squeeze()
        .args(["serve", "--map-cache", "1K"])
        .arg(w.path("vol.sqz"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("below the smallest map cache, 64.00 KiB"),
        "{err}"
    );
    assert!(!w.path("vol.sqz").exists());
}
