//! Thread CPU time, for `squeeze scan`'s per-batch codec speeds (DESIGN
//! principle 9). The per-job `cpu_ns` of the hot path uses the monotonic
//! clock instead: this one is a system call (~0.4 us in a VM).
//!
//! Invariant: the value is this thread's CPU time (user + system), so
//! differences around a job exclude time the thread spent descheduled.

/// This thread's CPU time in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`);
/// 0 if the clock is unavailable.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}
