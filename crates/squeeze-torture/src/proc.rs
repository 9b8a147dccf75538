//! The `squeeze` binary as child processes: the server (killed with
//! SIGKILL on drop, so a panicking test leaves nothing running) and the
//! offline commands.

use crate::nbd::Conn;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running `squeeze serve`.
pub struct Server {
    child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
}

fn log_file(log: &Path) -> Result<File, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("opening {}: {e}", log.display()))
}

/// The last `n` lines of a log file.
pub fn tail(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Server {
    /// Starts `BIN serve [ARGS] --socket SOCKET VOLUME` and waits until the
    /// socket accepts connections (the volume is opened, and recovered,
    /// first).
    pub fn start(
        bin: &Path,
        args: &[&str],
        volume: &Path,
        socket: &Path,
        log: &Path,
    ) -> Result<Server, String> {
        let out = log_file(log)?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .arg("serve")
            .args(args)
            .arg("--socket")
            .arg(socket)
            .arg(volume)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting {} serve: {e}", bin.display()))?;
        let mut s = Server {
            child: Some(child),
            socket: socket.to_path_buf(),
            log: log.to_path_buf(),
        };
        let t0 = Instant::now();
        loop {
            // A stale socket of the killed server refuses connections until
            // the new server replaces it. Ready = a full handshake works.
            if let Ok(c) = Conn::connect(socket, true) {
                c.disconnect()
                    .map_err(|e| format!("readiness probe: disconnect: {e}"))?;
                return Ok(s);
            }
            if let Some(st) = s.try_wait() {
                return Err(format!(
                    "squeeze serve exited during start ({st}); log:\n{}",
                    tail(log, 30)
                ));
            }
            if t0.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "squeeze serve not listening after 60 s; log:\n{}",
                    tail(log, 30)
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The exit status if the server has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM (clean shutdown: flush, final checkpoint) and wait; an exit
    /// status other than success, or no exit within 60 s, is an error.
    pub fn terminate(&mut self) -> Result<(), String> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: kill(2) on the pid of a child we have not reaped yet.
        unsafe {
            libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
        }
        let t0 = Instant::now();
        loop {
            match c.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(()),
                Ok(Some(st)) => {
                    return Err(format!(
                        "squeeze serve exited {st} after SIGTERM; log:\n{}",
                        tail(&self.log, 30)
                    ))
                }
                Ok(None) if t0.elapsed() > Duration::from_secs(60) => {
                    let _ = c.kill();
                    let _ = c.wait();
                    return Err(format!(
                        "squeeze serve did not exit within 60 s of SIGTERM; log:\n{}",
                        tail(&self.log, 30)
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(format!("waiting for squeeze serve: {e}")),
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `BIN ARGS...` to completion (output appended to `log`); returns
/// its status.
pub fn run(bin: &Path, args: &[&std::ffi::OsStr], log: &Path) -> Result<ExitStatus, String> {
    let out = log_file(log)?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| format!("running {}: {e}", bin.display()))
}

/// Runs `BIN ARGS...` and SIGKILLs it after `after` unless it finished
/// first; returns (status, killed).
pub fn run_and_kill(
    bin: &Path,
    args: &[&std::ffi::OsStr],
    log: &Path,
    after: Duration,
) -> Result<(ExitStatus, bool), String> {
    let out = log_file(log)?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut c = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("running {}: {e}", bin.display()))?;
    let t0 = Instant::now();
    loop {
        if let Some(st) = c.try_wait().map_err(|e| e.to_string())? {
            return Ok((st, false));
        }
        if t0.elapsed() >= after {
            let _ = c.kill();
            let st = c.wait().map_err(|e| e.to_string())?;
            return Ok((st, true));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `BIN ARGS...` and returns its standard output (standard error is
/// appended to `log`); a failure status is an error.
pub fn output(bin: &Path, args: &[&std::ffi::OsStr], log: &Path) -> Result<String, String> {
    let err = log_file(log)?;
    let out = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stderr(err)
        .output()
        .map_err(|e| format!("running {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {args:?} failed ({})",
            bin.display(),
            out.status
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The number after `"key":` in a JSON text (enough for flat counters).
pub fn json_number(text: &str, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\":");
    let at = text.find(&pat)? + pat.len();
    let rest = text[at..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}
