//! `squeeze serve --fuse-dir DIR` (src/cmd/serve/fuse.rs): the volume as a
//! file of a FUSE file system, a loop device on it, and real programs on
//! the device: mkfs.ext4 and a mount with real files, fio with
//! verification, blkdiscard reaching the engine as trims, a SIGTERM that
//! unmounts, and a SIGKILL whose dead mount the next server replaces.
//!
//! Needs root, /dev/fuse, fusermount3 (fuse3), losetup and blkdiscard
//! (util-linux), mkfs.ext4 (e2fsprogs) and fio: without them a loud SKIPPED
//! line, or a failure under CI=true.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The tests take loop devices one at a time: `losetup -f` picks the first
/// free device, and two picking at once may race for it.
static LOOPS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether this machine can run the test (root, /dev/fuse, the tools).
fn can_run() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    if !root || !fuse {
        let why = if root {
            "/dev/fuse missing"
        } else {
            "not root"
        };
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{why} and CI=true: the FUSE export tests must run");
        }
        eprintln!("SKIPPED: {why} (the FUSE export needs both)");
        return false;
    }
    ["fusermount3", "losetup", "blkdiscard", "mkfs.ext4", "fio"]
        .iter()
        .all(|t| have_tool(t))
}

/// A loop device on a file, detached (and its mount unmounted) on drop.
struct Loop {
    dev: String,
    mnt: Option<PathBuf>,
}

impl Loop {
    fn attach(file: &Path) -> Loop {
        let dev = run(Command::new("losetup").args(["-f", "--show"]).arg(file))
            .trim()
            .to_string();
        assert!(dev.starts_with("/dev/loop"), "{dev}");
        Loop { dev, mnt: None }
    }
    fn mount(&mut self, at: &Path, opts: &str) {
        std::fs::create_dir_all(at).unwrap();
        run(Command::new("mount")
            .args(["-o", opts])
            .arg(&self.dev)
            .arg(at));
        self.mnt = Some(at.to_path_buf());
    }
    fn umount(&mut self) {
        if let Some(m) = self.mnt.take() {
            run(Command::new("umount").arg(&m));
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Some(m) = self.mnt.take() {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// Lazily unmounts a FUSE export left behind (a killed server's, or a
/// failing test's) when the test ends.
struct ExportGuard(PathBuf);

impl Drop for ExportGuard {
    fn drop(&mut self) {
        if mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn wait_for_file(p: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !p.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mounted(dir: &Path) -> bool {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(dir.as_str()))
}

fn stats(ctl: &Path) -> serde_json::Value {
    let out = run(squeeze().arg("stats").arg(ctl).arg("--json"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.get("vol").cloned().unwrap_or(v)
}

/// ext4 on the loop device: real files written, read back after the
/// server's SIGTERM (which unmounts the export) and a restart; discards
/// reach the engine; fio verifies on the raw device.
#[test]
fn ext4_and_fio_on_a_loop_device_over_the_fuse_export() {
    if !can_run() {
        return;
    }
    let _one = LOOPS.lock().unwrap_or_else(|e| e.into_inner());
    let w = Workdir::new();
    w.create("1G", &[]);
    let fuse = w.path("fuse");
    let _guard = ExportGuard(fuse.clone());
    let file = fuse.join("vol");
    let mut s = Serve::start(&w, &["--fuse-dir", fuse.to_str().unwrap()]);
    wait_for_file(&file);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 1 << 30);
    assert!(
        s.log_text().contains("losetup -f --show"),
        "{}",
        s.log_text()
    );

    let mut lo = Loop::attach(&file);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&lo.dev));
    let mnt = w.path("mnt");
    lo.mount(&mnt, "rw");
    let src = w.path("real.bin");
    let n = real_file(&src, 48 << 20);
    std::fs::copy(&src, mnt.join("real.bin")).unwrap();
    std::fs::create_dir(mnt.join("dir")).unwrap();
    for i in 0..50u64 {
        std::fs::write(
            mnt.join("dir").join(format!("f{i}")),
            mixed_data(4096 * (i as usize + 1), i),
        )
        .unwrap();
    }
    run(&mut Command::new("sync"));
    lo.umount();
    let st = stats(&s.control);
    assert!(
        st["mapped_bytes"].as_u64().unwrap() >= n as u64,
        "written files not mapped: {st}"
    );
    drop(lo);

    // SIGTERM: the server flushes, unmounts the export and exits cleanly.
    let status = s.signal_and_wait(libc::SIGTERM, Duration::from_secs(30));
    assert!(status.is_some_and(|st| st.success()), "{}", s.log_text());
    assert!(!mounted(&fuse), "the export is still mounted after SIGTERM");

    // Restart: the same files, byte for byte.
    let s = Serve::start(&w, &["--fuse-dir", fuse.to_str().unwrap()]);
    wait_for_file(&file);
    let mut lo = Loop::attach(&file);
    lo.mount(&mnt, "ro");
    assert!(std::fs::read(mnt.join("real.bin")).unwrap() == std::fs::read(&src).unwrap());
    for i in 0..50u64 {
        assert_eq!(
            std::fs::read(mnt.join("dir").join(format!("f{i}"))).unwrap(),
            mixed_data(4096 * (i as usize + 1), i),
            "dir/f{i}"
        );
    }
    lo.umount();

    // A discard of the whole device reaches the engine as trims.
    run(Command::new("blkdiscard").arg(&lo.dev));
    let st = stats(&s.control);
    assert_eq!(st["mapped_bytes"].as_u64().unwrap(), 0, "{st}");

    // fio writes and verifies on the raw device (O_DIRECT on the loop
    // device; the export file itself is opened with FOPEN_DIRECT_IO).
    let out = run(timed("fio").args([
        "--name=verify",
        &format!("--filename={}", lo.dev),
        "--rw=randwrite",
        "--bs=4k-128k",
        "--size=96m",
        "--iodepth=16",
        "--ioengine=libaio",
        "--direct=1",
        "--verify=crc32c",
        "--do_verify=1",
        "--buffer_compress_percentage=50",
        "--refill_buffers",
        "--randrepeat=0",
    ]));
    assert!(!out.contains("verify: bad"), "{out}");
    // A flush of the device (fsync) reaches the engine: it is counted.
    run(Command::new("sync").arg(&lo.dev));
    drop(lo);
    s.stop();
}

/// SIGKILL leaves the export mounted with no server ("Transport endpoint is
/// not connected"); what was flushed before survives, and the next server
/// on the same directory detaches the dead mount and serves again.
#[test]
fn a_killed_server_leaves_a_dead_mount_the_next_one_replaces() {
    if !can_run() {
        return;
    }
    let _one = LOOPS.lock().unwrap_or_else(|e| e.into_inner());
    let w = Workdir::new();
    w.create("256M", &[]);
    let fuse = w.path("fuse");
    let _guard = ExportGuard(fuse.clone());
    let file = fuse.join("vol");
    let mut s = Serve::start(&w, &["--fuse-dir", fuse.to_str().unwrap()]);
    wait_for_file(&file);
    std::fs::write(w.path("data"), mixed_data(8 << 20, 7)).unwrap();
    {
        let lo = Loop::attach(&file);
        // Written through the loop device and flushed (fsync on the device).
        run(Command::new("dd")
            .arg(format!("if={}", w.path("data").display()))
            .arg(format!("of={}", lo.dev))
            .args(["bs=1M", "oflag=direct", "conv=fsync", "status=none"]));
        let _ = s.signal_and_wait(libc::SIGKILL, Duration::from_secs(10));
        // The device now fails: its server is gone.
        let (ok, _) = run_any(Command::new("dd").arg(format!("if={}", lo.dev)).args([
            "of=/dev/null",
            "bs=4k",
            "count=1",
            "iflag=direct",
            "status=none",
        ]));
        assert!(!ok, "a read through the dead export succeeded");
    }
    // The mount stays, with no server behind it: listing it fails.
    assert!(mounted(&fuse), "the dead export is gone already");
    let dead = std::fs::read_dir(&fuse).map(|_| ());
    assert_eq!(
        dead.as_ref().err().and_then(|e| e.raw_os_error()),
        Some(libc::ENOTCONN),
        "the dead mount should answer ENOTCONN: {dead:?}"
    );

    let s = Serve::start(&w, &["--fuse-dir", fuse.to_str().unwrap()]);
    wait_for_file(&file);
    assert!(
        s.log_text().contains("detached the stale FUSE mount"),
        "{}",
        s.log_text()
    );
    let lo = Loop::attach(&file);
    let back = w.path("back");
    run(Command::new("dd")
        .arg(format!("if={}", lo.dev))
        .arg(format!("of={}", back.display()))
        .args(["bs=1M", "count=8", "iflag=direct", "status=none"]));
    assert!(std::fs::read(&back).unwrap() == std::fs::read(w.path("data")).unwrap());
    drop(lo);
    s.stop();
}
