//! What this process has used so far, for the benchmarks that report CPU
//! seconds per GiB and peak memory beside their throughput (`squeeze bench`,
//! `squeeze import`, `squeeze kv bench`, squeeze-ycsb). Thread CPU time, for
//! per-batch codec speeds, is `cputime`.

/// CPU seconds (user + system, every thread) this process has used; 0 if
/// getrusage fails.
pub fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct we pass.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } != 0 {
        return 0.0;
    }
    // SAFETY: initialised by getrusage on success.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Peak resident memory of this process (VmHWM), in bytes; 0 where
/// /proc/self/status does not say.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_running_process_has_used_cpu_and_memory() {
        let busy: u64 = (0..2_000_000u64).map(|i| i ^ (i >> 3)).sum();
        assert!(busy > 0);
        assert!(super::cpu_seconds() > 0.0);
        assert!(super::peak_rss() > 1 << 20);
    }
}
