//! Damage after a crash, as a user meets it: 64 MiB of base64 text written
//! with `nbdcopy --flush` into a real `squeeze serve`, the server killed
//! with SIGKILL, then the kinds of damage a failing disk, a bad copy or a
//! stray `dd` leaves. Every case must read back intact through `squeeze
//! export`, or be reported: `check` exits non-zero naming the loss, and
//! `export`/`serve` refuse the volume unless `--accept-loss`.

mod common;

use common::*;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

const DATA: usize = 64 << 20;

/// Base64 text of random bytes, 76 columns (what `base64` prints).
fn base64_text(len: usize, seed: u64) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let raw = random_data(len, seed);
    let mut out = Vec::with_capacity(len + len / 76);
    for (i, b) in raw.iter().enumerate() {
        if out.len() >= len {
            break;
        }
        out.push(A[(*b & 63) as usize]);
        if i % 76 == 75 && out.len() < len {
            out.push(b'\n');
        }
    }
    out.truncate(len);
    out
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
}

/// `squeeze check` and `squeeze export` on a damaged copy: (check's exit
/// code and output, export's bytes or its error).
fn check_and_export(
    w: &Workdir,
    vol: &Path,
    accept: bool,
) -> (i32, String, Result<Vec<u8>, String>) {
    let out = squeeze().arg("check").arg(vol).output().unwrap();
    let check_code = out.status.code().unwrap_or(-1);
    let check_out =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let dst = w.path("out.raw");
    let _ = std::fs::remove_file(&dst);
    let mut cmd = squeeze();
    cmd.arg("export").arg(vol).arg(&dst);
    if accept {
        cmd.arg("--accept-loss");
    }
    let (ok, text) = run_any(&mut cmd);
    let exported = if ok {
        Ok(std::fs::read(&dst).unwrap())
    } else {
        Err(text)
    };
    (check_code, check_out, exported)
}

#[test]
fn damage_after_a_crash_is_intact_or_reported() {
    if !have_tool("nbdcopy") {
        return;
    }
    let w = Workdir::new();
    let text = base64_text(DATA, 34);
    let src = w.path("data.txt");
    std::fs::write(&src, &text).unwrap();
    w.create("128M", &["--segment-size", "1M"]);
    let mut srv = Serve::start(&w, &[]);
    run(timed("nbdcopy").arg("--flush").arg(&src).arg(srv.uri()));
    srv.signal_and_wait(libc::SIGKILL, Duration::from_secs(10))
        .expect("killed");
    let crashed = w.path("crashed.sqz");
    copy(&w.volume(), &crashed);
    let intact = |bytes: &[u8]| bytes.len() >= DATA && bytes[..DATA] == text[..];

    // Undamaged: check passes, export is intact.
    let (code, out, exp) = check_and_export(&w, &crashed, false);
    assert_eq!(code, 0, "{out}");
    assert!(intact(&exp.unwrap()));

    let len = std::fs::metadata(&crashed).unwrap().len();
    let damage = |name: &str, f: &dyn Fn(&mut std::fs::File)| -> std::path::PathBuf {
        let p = w.path(name);
        copy(&crashed, &p);
        let mut file = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f(&mut file);
        p
    };
    let put = |file: &mut std::fs::File, at: u64, bytes: &[u8]| {
        file.seek(SeekFrom::Start(at)).unwrap();
        file.write_all(bytes).unwrap();
    };

    // The newest superblock slot (4096..8192) zeroed, and filled with
    // random bytes: the older slot opens it, intact; check reports the slot.
    for (name, bytes) in [
        ("sb_zero.sqz", vec![0u8; 4096]),
        ("sb_random.sqz", random_data(4096, 9)),
    ] {
        let p = damage(name, &|f| put(f, 4096, &bytes));
        let (code, out, exp) = check_and_export(&w, &p, false);
        assert_eq!(code, 1, "{name}: check must report the slot:\n{out}");
        assert!(out.contains("SUPERBLOCK DAMAGED"), "{name}:\n{out}");
        assert!(intact(&exp.expect("export")), "{name}: export differs");
    }

    // A flush mark slot (8192.., sixteen of 4 KiB) filled with random
    // bytes after the crash: it may have held the newest mark, so the log's
    // end can no longer be told from unflushed writes: reported, refused;
    // accepted, the data (all here) exports.
    let p = damage("mark.sqz", &|f| put(f, 8192, &random_data(4096, 11)));
    let (code, out, exp) = check_and_export(&w, &p, false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FLUSH MARKS DAMAGED: slot(s) 0"), "{out}");
    let err = exp.expect_err("export of a volume whose marks are damaged");
    assert!(
        err.contains("flush mark slot") && err.contains("--accept-loss"),
        "{err}"
    );
    let (_, _, exp) = check_and_export(&w, &p, true);
    assert!(
        intact(&exp.expect("export --accept-loss")),
        "mark.sqz: export differs"
    );

    // 4 KiB of random bytes in the middle of the log: reported, refused.
    let mid = (len / 2) / 4096 * 4096;
    let p = damage("mid.sqz", &|f| put(f, mid, &random_data(4096, 10)));
    let (code, out, exp) = check_and_export(&w, &p, false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("LOST FLUSHED RECORDS"), "{out}");
    let err = exp.expect_err("export of a volume that lost flushed data");
    assert!(
        err.contains("lost flushed data") && err.contains("--accept-loss"),
        "{err}"
    );
    // Accepted, export goes on with what survives (and says so).
    let (_, _, exp) = check_and_export(&w, &p, true);
    assert_eq!(exp.expect("export --accept-loss").len(), 128 << 20);

    // Cut short at the start of the segment (1 MiB) where the log ends, and
    // inside its last record. (The file itself may run on past the log:
    // space allocated ahead of the head, which holds nothing.)
    let bytes = std::fs::read(&crashed).unwrap();
    let data_end = bytes.iter().rposition(|&b| b != 0).unwrap() as u64 + 1;
    let seg_start = (data_end - 1) / MIB * MIB;
    for (name, at) in [
        ("trunc_seg.sqz", seg_start),
        ("trunc_rec.sqz", data_end - 1000),
    ] {
        let p = damage(name, &|f| f.set_len(at).unwrap());
        let (code, out, exp) = check_and_export(&w, &p, false);
        assert_eq!(code, 1, "{name}:\n{out}");
        assert!(out.contains("TRUNCATED"), "{name}:\n{out}");
        assert!(exp.is_err(), "{name}: exported a cut volume");
        let (ok, info) = run_any(squeeze().arg("info").arg(&p));
        assert!(
            ok && info.contains("CUT SHORT"),
            "{name}: info says\n{info}"
        );
    }

    // serve refuses it too, naming the way out; with --accept-loss it
    // serves what survives, and stats count the loss.
    let w2 = Workdir::new();
    let vol = w2.volume();
    copy(&p, &vol);
    let (ok, text) = run_any(
        squeeze()
            .arg("serve")
            .arg("--socket")
            .arg(w2.socket())
            .arg(&vol),
    );
    assert!(!ok && text.contains("--accept-loss"), "{text}");
    let srv = Serve::start(&w2, &["--accept-loss"]);
    let stats = run(squeeze().arg("stats").arg("--json").arg(&srv.control));
    let all: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let v = all.as_object().unwrap().values().next().unwrap();
    assert!(v["lost_flushed_records"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(v["damaged_opens"].as_u64(), Some(1), "{stats}");
    srv.stop();
    // The loss is permanent now: check is clean, the counter stays.
    let (code, out, _) = check_and_export(&w, &vol, false);
    assert_eq!(code, 0, "{out}");
}
