//! Stage 2b's second signal: the machine's CPU headroom. The adaptive
//! codec ([`super::adapt`]) steps down its ladder when the compression
//! engine falls behind (its backlog); on a machine whose cores the client,
//! the server and the compressor share, the engine never falls behind
//! (everything slows down together) while the compressor takes CPU the
//! client could have used. This signal sees that case: the share of the
//! whole machine's CPU time that was busy, read from the kernel.
//!
//! Invariants: a reading covers the time since the previous reading that
//! returned a value, and lies in `0.0..=1.0`; readings come at most once per
//! `min_interval` (the kernel counts in ticks of 1-10 ms: much shorter
//! windows are noise); a source that cannot be read returns None, and the codec
//! then follows the backlog alone.

use parking_lot::Mutex;
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Where the adaptive codec learns how busy the machine's CPUs are.
pub trait BusySource: Send + Sync {
    /// The busy share (0.0..=1.0) of the machine's CPU time since the
    /// previous reading that returned a value; None when less than the
    /// source's interval has passed since then, or it cannot be read.
    fn busy(&self) -> Option<f64>;

    /// How many cores the busy share is a share of (the cost model's
    /// scale, `super::cost`): this process's available parallelism unless
    /// the source knows better.
    fn cores(&self) -> f64 {
        std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
    }
}

/// The shortest window [`ProcStat`] reads over.
/// (The kernel counts CPU time in ticks of its USER_HZ, 10 ms here: 100 ms
/// of 2 cores is 20 ticks, a 5% step; 50 ms windows read 0.8, 0.9 or 1.0
/// under the same load.)
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// CPU time of the whole machine, in the kernel's ticks, split into what
/// another runnable task at normal priority could not have had (busy) and
/// what it could (idle, waiting for I/O, and niced tasks, which the
/// scheduler gives way to a normal one almost entirely).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTicks {
    pub busy: u64,
    pub free: u64,
}

/// Parses the aggregate `cpu` line of /proc/stat (proc(5): user nice
/// system idle iowait irq softirq steal guest guest_nice; guest time is
/// already inside user and nice). Steal counts as busy: a hypervisor's
/// other guests took it, it was not ours to use.
pub fn parse_cpu_line(line: &str) -> Option<CpuTicks> {
    let mut f = line.split_ascii_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let (user, nice, system, idle, iowait) = (at(0), at(1), at(2), at(3), at(4));
    let (irq, softirq, steal) = (at(5), at(6), at(7));
    Some(CpuTicks {
        busy: user + system + irq + softirq + steal,
        free: idle + iowait + nice,
    })
}

/// The machine's busy share from /proc/stat's first line.
pub struct ProcStat {
    path: PathBuf,
    min_interval: Duration,
    /// The per-CPU lines at open: the cores the aggregate line adds up.
    cores: f64,
    /// The previous reading that returned a value (or the first, at open).
    last: Mutex<(Instant, CpuTicks)>,
}

impl ProcStat {
    /// A source on /proc/stat, or the reason it cannot be read here.
    pub fn open() -> std::io::Result<ProcStat> {
        ProcStat::at("/proc/stat".into(), MIN_INTERVAL)
    }

    /// [`ProcStat::open`] as a volume's CPU source
    /// (`OpenOptions::adapt_cpu`): one per volume, since a reading covers
    /// the time since that source's previous one.
    pub fn source() -> std::io::Result<std::sync::Arc<dyn BusySource>> {
        Ok(std::sync::Arc::new(ProcStat::open()?))
    }

    /// A source on a file in /proc/stat's format (tests).
    pub fn at(path: PathBuf, min_interval: Duration) -> std::io::Result<ProcStat> {
        let first = read_first_line(&path)?;
        let ticks = parse_cpu_line(&first).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: no aggregate cpu line", path.display()),
            )
        })?;
        let per_cpu = std::fs::read_to_string(&path)?
            .lines()
            .filter(|l| {
                l.strip_prefix("cpu")
                    .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
            })
            .count();
        Ok(ProcStat {
            path,
            min_interval,
            cores: per_cpu.max(1) as f64,
            last: Mutex::new((Instant::now(), ticks)),
        })
    }
}

fn read_first_line(path: &std::path::Path) -> std::io::Result<String> {
    // The aggregate line is about 100 bytes; one small read is enough and
    // spares parsing the rest (per-CPU lines, interrupts).
    let mut buf = [0u8; 512];
    let n = std::fs::File::open(path)?.read(&mut buf)?;
    let text = String::from_utf8_lossy(&buf[..n]);
    Ok(text.lines().next().unwrap_or("").to_string())
}

impl BusySource for ProcStat {
    fn busy(&self) -> Option<f64> {
        let mut last = self.last.try_lock()?;
        let now = Instant::now();
        if now.duration_since(last.0) < self.min_interval {
            return None;
        }
        let ticks = parse_cpu_line(&read_first_line(&self.path).ok()?)?;
        let prev = last.1;
        let busy = ticks.busy.saturating_sub(prev.busy);
        let total = busy + ticks.free.saturating_sub(prev.free);
        if total == 0 {
            // No tick counted yet: the next reading covers this window too.
            return None;
        }
        *last = (now, ticks);
        Some(busy as f64 / total as f64)
    }

    fn cores(&self) -> f64 {
        self.cores
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_aggregate_line() {
        let t = parse_cpu_line("cpu  100 7 50 1000 20 3 4 5 0 0").unwrap();
        assert_eq!(t.busy, 100 + 50 + 3 + 4 + 5);
        assert_eq!(t.free, 1000 + 20 + 7);
        // Old kernels have fewer fields.
        let t = parse_cpu_line("cpu 1 2 3 4 5").unwrap();
        assert_eq!(t, CpuTicks { busy: 4, free: 11 });
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(parse_cpu_line("cpu 1 2 x 4 5"), None);
        assert_eq!(parse_cpu_line("cpu 1 2 3"), None);
        assert_eq!(parse_cpu_line(""), None);
    }

    #[test]
    fn reads_shares_between_readings() {
        let dir = std::env::temp_dir().join(format!("squeeze-headroom-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("stat");
        let write = |busy: u64, idle: u64| {
            std::fs::write(
                &f,
                format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n"),
            )
            .unwrap()
        };
        write(1000, 1000);
        let s = ProcStat::at(f.clone(), Duration::ZERO).unwrap();
        assert_eq!(s.cores(), 1.0, "one per-CPU line");
        write(1090, 1010);
        assert_eq!(s.busy(), Some(0.9));
        // Nothing counted since: no reading, and the next one covers both.
        assert_eq!(s.busy(), None);
        write(1090, 1110);
        assert_eq!(s.busy(), Some(0.0));
        // Too soon for a source with an interval.
        let slow = ProcStat::at(f.clone(), Duration::from_secs(3600)).unwrap();
        write(2000, 2000);
        assert_eq!(slow.busy(), None);
        // A file that is not /proc/stat is refused by name.
        std::fs::write(&f, "intr 1 2 3\n").unwrap();
        let e = ProcStat::at(f.clone(), Duration::ZERO).err().unwrap();
        assert!(e.to_string().contains("no aggregate cpu line"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_this_machine() {
        let s = match ProcStat::open() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("SKIPPED: /proc/stat unreadable here: {e}");
                return;
            }
        };
        std::thread::sleep(MIN_INTERVAL + Duration::from_millis(50));
        // Spin a little so the window has ticks in it.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            std::hint::spin_loop();
        }
        let b = s.busy().expect("a reading after the interval");
        assert!((0.0..=1.0).contains(&b), "{b}");
        // Its cores: as many as /proc/stat has per-CPU lines, at least the
        // ones this process may run on.
        let lines = std::fs::read_to_string("/proc/stat").unwrap();
        let n = lines
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count();
        assert_eq!(s.cores(), n as f64);
        assert!(s.cores() >= std::thread::available_parallelism().unwrap().get() as f64);
    }
}
