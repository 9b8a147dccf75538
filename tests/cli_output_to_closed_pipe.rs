//! Every subcommand that prints, with stdout a pipe whose reader has gone
//! (`squeeze stats vol | head` once head has exited), ends as Unix tools
//! do: quietly, with status 0 or killed by SIGPIPE (141 in a shell), never
//! with Rust's "failed printing to stdout" panic. Any other write error on
//! stdout (a full disk: /dev/full) is one error line and status 1.

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

/// Runs `cmd` with stdout a pipe whose read end is already closed; returns
/// (exit status, stderr).
fn run_into_closed_pipe(cmd: &mut Command) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = cmd
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The commands that print, each on its own copy of a small volume (some
/// write to it) or on a small file.
fn printing_commands(w: &Workdir) -> Vec<Vec<String>> {
    let vol = w.volume().display().to_string();
    let src = w.path("src.bin");
    std::fs::write(&src, mixed_data(256 << 10, 5)).unwrap();
    let src = src.display().to_string();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        s(&["info", &vol]),
        s(&["info", "--json", &vol]),
        s(&["stats", &vol]),
        s(&["stats", "--json", &vol]),
        s(&["check", &vol]),
        s(&["check", "--json", &vol]),
        s(&[
            "check",
            "--json",
            &w.path("missing.sqz").display().to_string(),
        ]),
        s(&["set", &vol, "--algorithm", "lz4"]),
        s(&["compact", &vol]),
        s(&["compact", "--json", &vol]),
        s(&["import", &src, &vol]),
        s(&[
            "export",
            &vol,
            &w.path("out.bin").display().to_string(),
            "--length",
            "1M",
        ]),
        s(&[
            "create",
            &w.path("new.sqz").display().to_string(),
            "--size",
            "1G",
        ]),
        s(&["scan", "--threads", "1", "--sample-mib", "1", &src]),
        s(&[
            "scan",
            "--json",
            "--threads",
            "1",
            "--sample-mib",
            "1",
            &src,
        ]),
        s(&["tco", "--ratio", "2", "--cpu-s-per-gib", "1"]),
        s(&["tco", "--json", "--ratio", "2", "--cpu-s-per-gib", "1"]),
        s(&["--help"]),
        s(&["stats", "--help"]),
    ]
}

#[test]
fn printing_into_a_closed_pipe_ends_quietly() {
    let w = Workdir::new();
    w.create("64M", &[]);
    let mut failures = Vec::new();
    for args in printing_commands(&w) {
        let (st, stderr) = run_into_closed_pipe(squeeze().args(&args));
        let quiet_end = st.success() || st.signal() == Some(libc::SIGPIPE);
        if !quiet_end || stderr.contains("panicked") || stderr.contains("Broken pipe") {
            failures.push(format!("squeeze {args:?}: {st}\n{stderr}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Nothing was cut short before its work was done: the volume is whole.
    let out = run(squeeze().arg("check").arg(w.volume()));
    assert!(out.contains("ok: no damage found"), "{out}");
}

#[test]
fn a_stdout_that_cannot_be_written_is_one_error_line() {
    let w = Workdir::new();
    w.create("64M", &[]);
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = squeeze()
        .arg("info")
        .arg(w.volume())
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("squeeze: error: writing to stdout"),
        "{stderr}"
    );
}
