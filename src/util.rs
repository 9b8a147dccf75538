//! Helpers shared by the subcommands: sizes, creating and opening volumes,
//! progress.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use squeeze_engine::{CreateOptions, FileStorage, OpenOptions, Volume};
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;

/// `println!` for a command's output. A reader that has gone (`squeeze
/// stats vol | head`) ends the process as it ends `cat`: killed by SIGPIPE
/// (status 141 in a shell), without a message; any other write error
/// (a full disk) is one error line and status 1. Commands print only once
/// their work is done, their volumes closed (or opened read-only) and
/// their temporary files removed, so ending here loses nothing but the
/// rest of the output. `serve` logs to stderr and prints nothing here.
macro_rules! outln {
    () => {
        $crate::util::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::util::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` for a long-running command (`serve`): a stderr that cannot
/// be written (`squeeze serve 2>&1 | head`, once head has exited) loses
/// the line instead of panicking the thread that printed it.
macro_rules! noteln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Writes to stdout; see `outln!`.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        stdout_failed(&e)
    }
}

fn stdout_failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // SAFETY: restores SIGPIPE's default action (the Rust runtime
        // ignores it) and raises it in this thread, which ends the process.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::raise(libc::SIGPIPE);
        }
        std::process::exit(141);
    }
    eprintln!("squeeze: error: writing to stdout: {e}");
    std::process::exit(1);
}

/// An error and its causes, as anyhow's `{:#}` prints them ("context:
/// cause: ..."), except that a cause the text before already ends with is
/// not said again: the libraries' errors name their source in their own
/// message too (squeeze-kv's "volume: no space left: ..." over the
/// engine's "no space left: ..."), which `{:#}` would repeat.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.is_empty() {
            out = s;
        } else if !(s.is_empty() || out == s || out.ends_with(&format!(": {s}"))) {
            out.push_str(": ");
            out.push_str(&s);
        }
    }
    out
}

/// The log goes to stderr: coloured on a terminal (unless NO_COLOR is set),
/// plain text otherwise (a log file, a pipe, journald), so a log file holds
/// no ANSI escape codes.
pub fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(
            std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
}

/// Parses "64G", "1T", "4K", "128KiB", "1.5G" or plain bytes (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        "P" | "PB" | "PIB" => 1 << 50,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    let n: f64 = num.parse().map_err(|_| format!("not a size: {s:?}"))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(format!("not a size: {s:?}"));
    }
    let v = n * mult as f64;
    // 2^64 (u64::MAX as f64) itself does not fit either.
    if v >= u64::MAX as f64 {
        return Err(format!("size too large: {s:?}"));
    }
    Ok(v as u64)
}

/// Formats bytes in binary units.
pub fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", units[u])
    }
}

/// A benchmark's `--dir`, checked before any work: an existing directory
/// (the bench makes its temporary volumes there and removes them; it
/// creates no directory a typo named).
pub fn bench_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => anyhow::bail!("--dir {}: not a directory", dir.display()),
        Err(e) => anyhow::bail!(
            "--dir {}: {e} (give an existing directory for the temporary volumes)",
            dir.display()
        ),
    }
}

/// Creates a volume file; removes the file again if creation fails.
pub fn create_volume(path: &Path, opts: &CreateOptions) -> Result<Volume> {
    let storage =
        FileStorage::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    match Volume::create(Arc::new(storage), opts) {
        Ok(v) => Ok(v),
        Err(e) => {
            let _ = std::fs::remove_file(path);
            Err(e).with_context(|| format!("cannot create volume {}", path.display()))
        }
    }
}

/// Opens a volume file for reading and writing.
///
/// Offline tools (import, compact, set) always write with the policy's
/// codec: no client waits on them, so the adaptive codec has nothing to
/// save and its bytes would wait for an upgrade.
pub fn open_volume(path: &Path, background: bool) -> Result<Volume> {
    open_volume_with(
        path,
        OpenOptions {
            background,
            no_adapt: true,
            ..Default::default()
        },
    )
}

/// Refuses a path that exists but cannot be a volume file, saying what it
/// is, before anything opens it (a control socket's open fails with
/// "No such device or address", a FIFO's blocks). A volume is a regular
/// file (or a block device); a missing path is left to the open's own
/// "No such file" error.
pub fn check_volume_file(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(m) = std::fs::metadata(path) else {
        return Ok(());
    };
    let t = m.file_type();
    if t.is_socket() {
        anyhow::bail!(
            "{} is a Unix socket, not a volume file (a running server's control socket? \
             stats, set and resize take one; the other commands take a volume file no \
             server has open)",
            path.display()
        );
    }
    let what = if t.is_file() || t.is_block_device() {
        return Ok(());
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else {
        "a special file"
    };
    anyhow::bail!("{} is {what}, not a volume file", path.display())
}

/// Opens a volume for writing with the given options.
pub fn open_volume_with(path: &Path, opts: OpenOptions) -> Result<Volume> {
    open_volume_io(path, opts, squeeze_engine::IoMode::from_env())
}

/// `open_volume_with` on the write path `mode` (`serve --ublk` needs the
/// page cache's: it outlives the process).
pub fn open_volume_io(
    path: &Path,
    opts: OpenOptions,
    mode: squeeze_engine::IoMode,
) -> Result<Volume> {
    check_volume_file(path)?;
    let storage = FileStorage::open_with(path, mode)
        .with_context(|| format!("cannot open volume {}", path.display()))?;
    Volume::open(Arc::new(storage), opts).map_err(|e| open_failed(path, e))
}

/// The error of an open that failed, with what to do about lost data.
fn open_failed(path: &Path, e: squeeze_engine::EngineError) -> anyhow::Error {
    let what = format!("cannot open volume {}", path.display());
    if matches!(e, squeeze_engine::EngineError::Damaged(_)) {
        anyhow::anyhow!(
            "{e}. `squeeze check {p}` names the damage; `squeeze serve --accept-loss` (or \
             `squeeze export --accept-loss {p} DST`) opens the volume with what survives (the \
             sectors of the lost records read back older data)",
            p = path.display()
        )
        .context(what)
    } else {
        anyhow::Error::new(e).context(what)
    }
}

/// Opens a volume without writing to it; `accept_loss` opens one that lost
/// flushed data (for commands that report damage rather than serve data).
pub fn open_volume_read_only(path: &Path, accept_loss: bool) -> Result<Volume> {
    open_volume_read_only_locked(path, false, accept_loss)
}

/// Opens a volume without writing to it; with `exclusive_of_writers`, fails
/// while another process has it open for writing.
pub fn open_volume_read_only_locked(
    path: &Path,
    exclusive_of_writers: bool,
    accept_loss: bool,
) -> Result<Volume> {
    check_volume_file(path)?;
    let storage = FileStorage::open_read_only(path)
        .with_context(|| format!("cannot open volume {}", path.display()))?;
    if exclusive_of_writers {
        storage
            .lock_shared()
            .with_context(|| format!("cannot check {}", path.display()))?;
    }
    Volume::open(
        Arc::new(storage),
        OpenOptions {
            read_only: true,
            accept_loss,
            ..Default::default()
        },
    )
    .map_err(|e| open_failed(path, e))
}

pub fn progress(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

pub fn hex(uuid: &[u8; 16]) -> String {
    let h: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_said_once() {
        /// An error that says its source, as thiserror's `"volume: {0}"`.
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "volume: {}", self.0)
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = || std::io::Error::other("no space left: backing store full");
        let e = anyhow::Error::new(Outer(io())).context("cannot load");
        assert_eq!(
            error_text(&e),
            "cannot load: volume: no space left: backing store full"
        );
        assert_eq!(format!("{e:#}").matches("no space left").count(), 2);
        // A cause not in the text before is kept.
        let e = anyhow::Error::new(io()).context("cannot open volume v.sqz");
        assert_eq!(error_text(&e), format!("{e:#}"));
    }

    #[test]
    fn an_engine_error_chain_says_each_cause_once() {
        use squeeze_engine::error::{NoSpace, ReadOnly};
        let first = squeeze_engine::EngineError::Io(std::io::Error::from_raw_os_error(libc::EIO));
        let ro = squeeze_engine::EngineError::ReadOnly(ReadOnly::Failed(first.into()));
        let e = anyhow::Error::new(ro).context("cannot write");
        let text = error_text(&e);
        assert_eq!(text.matches("Input/output error").count(), 1, "{text}");
        assert!(
            text.starts_with("cannot write: volume is read-only after an earlier failure"),
            "{text}"
        );
        let full = squeeze_engine::EngineError::NoSpace(NoSpace::Segments {
            free: 1,
            needed: 2,
            reserve: 3,
        });
        let text = error_text(&anyhow::Error::new(full));
        assert_eq!(
            text,
            "no space left: backing store full: 1 segments free, 2 needed plus 3 kept for \
             checkpoints"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64G").unwrap(), 64 << 30);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("128KiB").unwrap(), 128 << 10);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12X").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(parse_size("16383P").unwrap(), 16383 << 50);
        assert!(parse_size("16384P").is_err());
    }
}
