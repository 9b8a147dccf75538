//! Who holds a file's flock: for the message of a volume that is in use,
//! which names the process (its pid and command line, from /proc/locks
//! and /proc/PID/cmdline) instead of guessing a running `squeeze serve`
//! when a `compact`, an `import` or any other process holds it. Best
//! effort, for the message only: where /proc says nothing (another pid
//! namespace, another kernel), the message says what may hold it.

use std::fs::File;
use std::os::unix::fs::MetadataExt;

/// What holds `file`'s flock, as words for "the volume is in use by ...".
pub(super) fn describe(file: &File) -> String {
    let held = file
        .metadata()
        .ok()
        .and_then(|m| std::fs::read_to_string("/proc/locks").ok().map(|t| (m, t)))
        .map(|(m, locks)| holders(&locks, m.dev(), m.ino()))
        .unwrap_or_default();
    let named: Vec<String> = held
        .iter()
        .filter_map(|&pid| command_line(pid).map(|c| format!("{pid} ({c})")))
        .collect();
    match named.len() {
        0 => "another process (a running `squeeze serve`, or another squeeze command \
              that has it open: compact, import, kv, wal, check, ...)"
            .to_string(),
        1 => format!("process {}", named[0]),
        _ => format!("processes {}", named.join(", ")),
    }
}

/// The pids holding a FLOCK on the file `dev`/`ino` in a /proc/locks text
/// (lines like `1: FLOCK  ADVISORY  WRITE 22146 fe:00:10027264 0 EOF`,
/// device numbers in hex; lines with `->` are waiters, not holders).
fn holders(locks: &str, dev: u64, ino: u64) -> Vec<u32> {
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let mut pids: Vec<u32> = locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [_, "FLOCK", _, _, pid, id, ..] if *id == want => pid.parse().ok(),
                _ => None,
            }
        })
        .filter(|&pid| pid > 0)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// A process's command line, arguments joined by spaces (at most 200
/// characters); None when /proc has no such process.
fn command_line(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    if words.is_empty() {
        return None;
    }
    // The program by its name, not its path.
    let mut words = words;
    if let Some(name) = std::path::Path::new(&words[0]).file_name() {
        words[0] = name.to_string_lossy().into_owned();
    }
    let mut c = words.join(" ");
    if c.chars().count() > 200 {
        c = c.chars().take(200).collect::<String>() + "...";
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_of_one_file() {
        let dev = libc::makedev(0xfe, 0);
        let locks = "1: FLOCK  ADVISORY  WRITE 22146 fe:00:10027264 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 22150 fe:00:10027264 0 EOF\n\
                     2: FLOCK  ADVISORY  READ 300 fe:00:99 0 EOF\n\
                     3: POSIX  ADVISORY  WRITE 301 fe:00:10027264 0 EOF\n\
                     4: FLOCK  ADVISORY  READ 302 fe:01:10027264 0 EOF\n\
                     5: FLOCK  ADVISORY  READ 17 fe:00:10027264 0 EOF\n";
        assert_eq!(holders(locks, dev, 10027264), vec![17, 22146]);
        assert_eq!(holders(locks, dev, 5), Vec::<u32>::new());
    }

    #[test]
    fn this_process_by_its_command_line() {
        let me = std::process::id();
        let c = command_line(me).expect("/proc/self");
        assert!(!c.starts_with('/'), "{c}");
    }
}
