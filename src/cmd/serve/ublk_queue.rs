//! One ublk queue of `squeeze serve --ublk`: the queue's thread takes the
//! kernel's requests off its io_uring and hands each to a worker, which runs
//! it on the device adapter (`device::VolumeDevice`, the same one NBD and
//! FUSE use) and posts the result back; the queue's thread commits it to
//! the kernel. The engine's calls block (a write compresses, a flush
//! waits for the disk), so they never run on the queue's thread.
//!
//! What the kernel sends and what it becomes:
//!
//! | ublk op | adapter | answered |
//! |---|---|---|
//! | READ | `read_at` | when done |
//! | WRITE (FUA: durable when answered) | `write_at` | after a write-out (FUA: when done) |
//! | FLUSH | `flush` | when done |
//! | DISCARD | `trim` | after a write-out |
//! | WRITE_ZEROES (NOUNMAP: keep it provisioned) | `write_zeroes` | after a write-out |
//! | anything else | EOPNOTSUPP | at once |
//!
//! Writes are answered only once their bytes are out of this process:
//! a server SIGKILLed and restarted gets back from the kernel only the
//! requests it had not answered, and the file system above trusts the
//! rest (`ublk.rs`, "Surviving our own crash"). The volume stages its log
//! in the write-behind pool (this process's memory) and writes it with
//! O_DIRECT; so a worker hands a finished write back as *held*, and the
//! queue's thread keeps the held writes until a write-out covers them
//! (`VolumeDevice::write_out`: the pool's staged bytes to the file, no
//! fdatasync), which it runs on a worker, one at a time per queue: the
//! writes that finish during one make the next one's batch, so a write-out
//! is one O_DIRECT write for many requests. (Before, the volumes of a ublk
//! server wrote through the page cache, which cost more CPU per GiB: a copy
//! into the page cache and its writeback, and a 4 KiB random read paid the
//! backing file's readahead; docs/benchmarks.md, "Block device paths in the
//! test guest". `SQUEEZE_IO=buffered` still does that, and then a write-out
//! has nothing to do.)
//!
//! Invariants:
//! - A tag's buffer is touched by at most one thread at a time: the kernel
//!   hands the tag to this queue, the queue's thread lends the buffer to
//!   one worker, and gets it back (with the result) before it commits the
//!   tag to the kernel again.
//! - The buffers outlive every job: the queue's thread waits for all the
//!   jobs it lent out before it returns and the buffers are freed.
//! - Requests in flight are bounded by the queue depth (one job per tag).
//! - A held write is answered only by the write-out that started after it
//!   was held (or with its error); at most one write-out per queue runs.
//!
//! Workers sleep on a condvar queue (`JobQueue`), not a channel. The
//! wake-up: each queue keeps one read of an eventfd in its io_uring (a
//! "target I/O" in libublk's terms, tag `EVENTFD_TAG`); a worker sends its
//! result on the queue's channel and bumps the eventfd (unless a bump is
//! already pending: `Wake`), the read completes, and the queue's thread
//! commits every result waiting on the channel.

use super::device::VolumeDevice;
use super::ublk_stats::UblkCounters;
use crossbeam_channel::Sender;
use libublk::helpers::IoBuf;
use libublk::io::{BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::sys;
use libublk::{BufDesc, UblkIORes};
use parking_lot::{Condvar, Mutex};
use squeeze_nbd::BlockDevice;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The tag of the eventfd read in user data (not a request tag: those are
/// below the queue depth, at most `UBLK_MAX_QUEUE_DEPTH`).
const EVENTFD_TAG: u16 = u16::MAX;

/// A request lent to a worker.
pub(super) struct Job {
    tag: u16,
    iod: sys::ublksrv_io_desc,
    buf: BufPtr,
    done: Sender<Done>,
    wake: Arc<Wake>,
}

/// The write-out of a queue's held writes (see `Done::Held`), on a worker.
struct WriteOut {
    batch: Vec<(u16, i32)>,
    done: Sender<Done>,
    wake: Arc<Wake>,
}

/// What a worker hands back to the queue's thread.
enum Done {
    /// Commit this result to the kernel.
    Answer(u16, i32),
    /// A write that is done but whose bytes may still be in this process's
    /// memory: the queue's thread holds it until a write-out covers it.
    Held(u16, i32),
    /// The write-out the queue's thread started is over (its batch came
    /// back as answers).
    WrittenOut,
}

/// What a worker runs.
enum Work {
    Request(Job),
    WriteOut(WriteOut),
}

/// A queue's wake-up: the eventfd its ring reads, and whether a bump is
/// already on its way (then a worker's result rides on it: one eventfd
/// write and one ring completion for every result that finished while the
/// queue's thread was away, not one each).
pub(super) struct Wake {
    fd: OwnedFd,
    pending: AtomicBool,
}

impl Wake {
    /// After a result was sent: bumps the eventfd unless a bump is pending.
    fn bump(&self) {
        if self.pending.swap(true, Ordering::SeqCst) {
            return;
        }
        let one: u64 = 1;
        // SAFETY: an 8-byte write from a live u64 to an eventfd we hold.
        let w = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        debug_assert_eq!(w, 8);
    }

    /// Before the queue's thread takes the results: a result sent after
    /// this bumps again.
    fn rearm(&self) {
        self.pending.store(false, Ordering::SeqCst);
    }
}

/// A tag's buffer, lent to one worker (see the invariants above).
struct BufPtr {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is used by one thread at a time (the invariants above).
unsafe impl Send for BufPtr {}

/// Requests waiting for a worker of one pool: a FIFO that idle workers
/// sleep on. A condvar, not a channel: crossbeam's receivers spin and
/// yield before they sleep, and with a pool of idle workers each request
/// paid for that (in the emulated test guest, 4 KiB reads spent four times
/// FUSE's user time per request in the workers).
struct JobQueue {
    state: Mutex<JobQueueState>,
    ready: Condvar,
}

struct JobQueueState {
    jobs: VecDeque<Work>,
    /// Set once every `Workers` clone is gone: the workers end.
    closed: bool,
}

impl JobQueue {
    fn new() -> Arc<JobQueue> {
        Arc::new(JobQueue {
            state: Mutex::new(JobQueueState {
                jobs: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
        })
    }

    /// Queues `job` for a worker; gives it back when the pool has closed.
    fn push(&self, job: Work) -> Result<(), Work> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(job);
        }
        st.jobs.push_back(job);
        drop(st);
        self.ready.notify_one();
        Ok(())
    }

    /// The next job, waiting for one; None once the pool has closed and
    /// nothing is left.
    fn pop(&self) -> Option<Work> {
        let mut st = self.state.lock();
        loop {
            if let Some(job) = st.jobs.pop_front() {
                return Some(job);
            }
            if st.closed {
                return None;
            }
            self.ready.wait(&mut st);
        }
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.ready.notify_all();
    }
}

/// The two pools of a device; dropping the last `Workers` clone closes
/// them.
struct Pools {
    writes: Arc<JobQueue>,
    others: Arc<JobQueue>,
}

impl Drop for Pools {
    fn drop(&mut self) {
        self.writes.close();
        self.others.close();
    }
}

/// The workers of one device: WRITE requests on their own threads (as many
/// as the volume declares it runs at once: they are CPU-bound), everything
/// else on others (reads mostly wait for the device).
#[derive(Clone)]
pub(super) struct Workers {
    pools: Arc<Pools>,
}

impl Workers {
    /// Starts `write_threads` + `other_threads` workers on `dev`; they end
    /// when every `Workers` clone is dropped.
    pub(super) fn start(
        name: &str,
        dev: &Arc<VolumeDevice>,
        counters: &Arc<UblkCounters>,
        write_threads: usize,
        other_threads: usize,
    ) -> std::io::Result<Workers> {
        let pools = Pools {
            writes: JobQueue::new(),
            others: JobQueue::new(),
        };
        for (q, n, kind) in [
            (&pools.writes, write_threads, "w"),
            (&pools.others, other_threads, "r"),
        ] {
            for i in 0..n.max(1) {
                let q = q.clone();
                let dev = dev.clone();
                let counters = counters.clone();
                std::thread::Builder::new()
                    .name(format!("sqz-ublk-{name}-{kind}{i}"))
                    .spawn(move || {
                        while let Some(work) = q.pop() {
                            match work {
                                Work::Request(job) => run_job(&dev, &counters, job),
                                Work::WriteOut(w) => run_write_out(&dev, &counters, w),
                            }
                        }
                    })?;
            }
        }
        Ok(Workers {
            pools: Arc::new(pools),
        })
    }
}

/// Runs one request on the adapter and posts its result to its queue.
fn run_job(dev: &VolumeDevice, counters: &UblkCounters, job: Job) {
    // SAFETY: the queue's thread lent this buffer to this job alone and
    // keeps it alive until the result is back (the invariants above).
    let buf = unsafe { std::slice::from_raw_parts_mut(job.buf.ptr, job.buf.len) };
    let res = execute(dev, counters, &job.iod, buf);
    if res < 0 {
        counters.errors.fetch_add(1, Ordering::Relaxed);
    }
    let done = if res >= 0 && answered_after_write_out(&job.iod) {
        Done::Held(job.tag, res)
    } else {
        Done::Answer(job.tag, res)
    };
    // The queue's thread waits for every job it lent: the channel is open.
    let _ = job.done.send(done);
    job.wake.bump();
}

/// Writes the volume's staged log out (`VolumeDevice::write_out`) and
/// hands the batch back as answers (each an error if that failed).
fn run_write_out(dev: &VolumeDevice, counters: &UblkCounters, w: WriteOut) {
    let r = dev.write_out();
    if let Err(e) = &r {
        tracing::warn!("ublk write-out failed: {e}");
    }
    for (tag, res) in w.batch {
        let res = match &r {
            Ok(()) => res,
            Err(e) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                errno(e)
            }
        };
        let _ = w.done.send(Done::Answer(tag, res));
    }
    let _ = w.done.send(Done::WrittenOut);
    w.wake.bump();
}

/// Whether a request that succeeded is answered only once a write-out
/// covers it: the kernel re-issues to a restarted server only the requests
/// not yet answered, so an answered write must outlive our SIGKILL
/// (`ublk.rs`, "Surviving our own crash"), and the volume's write-behind
/// pool holds written log in this process's memory until it is written
/// out. WRITE, DISCARD and WRITE_ZEROES append to the log; a FUA one is
/// durable already.
fn answered_after_write_out(iod: &sys::ublksrv_io_desc) -> bool {
    let op = iod.op_flags & 0xff;
    let logs = matches!(
        op,
        sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_OP_DISCARD | sys::UBLK_IO_OP_WRITE_ZEROES
    );
    logs && iod.op_flags & sys::UBLK_IO_F_FUA == 0
}

fn errno(e: &std::io::Error) -> i32 {
    -e.raw_os_error().unwrap_or(libc::EIO)
}

/// One request on the adapter: the bytes done (READ, WRITE), 0 (the
/// others) or a negative errno. The kernel's fields are checked before use:
/// they never panic the server.
pub(super) fn execute(
    dev: &VolumeDevice,
    counters: &UblkCounters,
    iod: &sys::ublksrv_io_desc,
    buf: &mut [u8],
) -> i32 {
    let op = iod.op_flags & 0xff;
    if op == sys::UBLK_IO_OP_FLUSH {
        // A flush has no range (its sector is not set: the kernel's flush
        // request is not the one the file system sent).
        counters.flushes.fetch_add(1, Ordering::Relaxed);
        return dev.flush().map_or_else(|e| errno(&e), |()| 0);
    }
    let offset = iod.start_sector.saturating_mul(512);
    let len = u64::from(iod.nr_sectors) * 512;
    if offset.saturating_add(len) > dev.size() {
        tracing::warn!(op, offset, len, "ublk request beyond the device");
        return -libc::EINVAL;
    }
    let fua = iod.op_flags & sys::UBLK_IO_F_FUA != 0;
    let data_len = || usize::try_from(len).ok().filter(|&n| n <= buf.len());
    let r = match op {
        sys::UBLK_IO_OP_READ => {
            let Some(n) = data_len() else {
                return -libc::EINVAL;
            };
            counters.reads.fetch_add(1, Ordering::Relaxed);
            counters.bytes_read.fetch_add(len, Ordering::Relaxed);
            dev.read_at(offset, &mut buf[..n]).map(|()| n as i32)
        }
        sys::UBLK_IO_OP_WRITE => {
            let Some(n) = data_len() else {
                return -libc::EINVAL;
            };
            counters.writes.fetch_add(1, Ordering::Relaxed);
            counters.bytes_written.fetch_add(len, Ordering::Relaxed);
            dev.write_at(offset, &buf[..n], fua).map(|()| n as i32)
        }
        sys::UBLK_IO_OP_DISCARD => {
            counters.discards.fetch_add(1, Ordering::Relaxed);
            dev.trim(offset, len, fua).map(|()| 0)
        }
        sys::UBLK_IO_OP_WRITE_ZEROES => {
            counters.write_zeroes.fetch_add(1, Ordering::Relaxed);
            let may_trim = iod.op_flags & sys::UBLK_IO_F_NOUNMAP == 0;
            dev.write_zeroes(offset, len, may_trim, fua).map(|()| 0)
        }
        _ => return -libc::EOPNOTSUPP,
    };
    r.unwrap_or_else(|e| {
        tracing::warn!(op, offset, len, "ublk request failed: {e}");
        errno(&e)
    })
}

/// Serves queue `qid` of `dev` until the device stops (the queue's thread,
/// started by libublk's `run_target`).
pub(super) fn serve_queue(qid: u16, dev: &UblkDev, workers: &Workers) {
    if let Err(e) = serve_queue_inner(qid, dev, workers) {
        tracing::error!(qid, "ublk queue failed: {e}");
        noteln!("squeeze serve: ublk queue {qid} failed: {e}");
    }
}

fn serve_queue_inner(qid: u16, dev: &UblkDev, workers: &Workers) -> anyhow::Result<()> {
    let bufs = std::rc::Rc::new(dev.alloc_queue_io_bufs());
    // SAFETY: eventfd with integer arguments; the fd is owned below.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let wake = Arc::new(Wake {
        // SAFETY: a fresh fd nothing else owns.
        fd: unsafe { OwnedFd::from_raw_fd(efd) },
        pending: AtomicBool::new(false),
    });
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<Done>();
    // The eventfd read's target. Leaked (8 bytes a queue): the last read
    // stays in the ring, which may outlive this function.
    let counter_ptr: *mut u64 = Box::into_raw(Box::new(0u64));
    let read_eventfd = move |q: &UblkQueue| {
        let sqe = io_uring::opcode::Read::new(
            io_uring::types::Fd(efd),
            counter_ptr.cast::<u8>(),
            std::mem::size_of::<u64>() as u32,
        )
        .build()
        .user_data(UblkIOCtx::build_user_data(EVENTFD_TAG, 0, 0, true));
        q.ublk_submit_sqe_sync(sqe)
    };

    let queue = UblkQueue::new(qid, dev)
        .map_err(|e| anyhow::anyhow!("queue {qid}: {e}"))?
        .submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs)))
        .map_err(|e| anyhow::anyhow!("queue {qid}: fetch commands: {e}"))?;
    read_eventfd(&queue).map_err(|e| anyhow::anyhow!("queue {qid}: eventfd read: {e}"))?;

    let mut lent = 0usize;
    // Writes done but not yet written out, and whether a write-out is on a
    // worker (one at a time: the writes that finish meanwhile make the
    // next one's batch).
    let mut held: Vec<(u16, i32)> = Vec::new();
    let mut writing_out = false;
    let handler_bufs = bufs.clone();
    queue.wait_and_handle_io(|q, tag, ctx| {
        if ctx.is_tgt_io() {
            // Workers finished: commit their results, wait for the next.
            wake.rearm();
            let commit = |tag: u16, res: i32| {
                let buf = BufDesc::Slice(handler_bufs[usize::from(tag)].as_slice());
                if let Err(e) = q.complete_io_cmd_unified(tag, buf, Ok(UblkIORes::Result(res))) {
                    tracing::error!(qid, tag, "ublk commit failed: {e}");
                }
            };
            for done in done_rx.try_iter() {
                match done {
                    Done::Answer(tag, res) => {
                        lent -= 1;
                        commit(tag, res);
                    }
                    Done::Held(tag, res) => held.push((tag, res)),
                    Done::WrittenOut => writing_out = false,
                }
            }
            if !writing_out && !held.is_empty() {
                let w = WriteOut {
                    batch: std::mem::take(&mut held),
                    done: done_tx.clone(),
                    wake: wake.clone(),
                };
                writing_out = true;
                if let Err(Work::WriteOut(w)) = workers.pools.others.push(Work::WriteOut(w)) {
                    // The workers are gone (cannot happen while the device runs).
                    writing_out = false;
                    for (tag, _) in w.batch {
                        lent -= 1;
                        commit(tag, -libc::EIO);
                    }
                }
            }
            if let Err(e) = read_eventfd(q) {
                tracing::error!(qid, "ublk eventfd read: {e}");
            }
            return;
        }
        let iod = *q.get_iod(tag);
        let io_buf: &IoBuf<u8> = &handler_bufs[usize::from(tag)];
        let job = Job {
            tag,
            iod,
            buf: BufPtr {
                ptr: io_buf.as_mut_ptr(),
                len: io_buf.len(),
            },
            done: done_tx.clone(),
            wake: wake.clone(),
        };
        let pool = if iod.op_flags & 0xff == sys::UBLK_IO_OP_WRITE {
            &workers.pools.writes
        } else {
            &workers.pools.others
        };
        lent += 1;
        if let Err(Work::Request(job)) = pool.push(Work::Request(job)) {
            // The workers are gone (cannot happen while the device runs).
            lent -= 1;
            let buf = BufDesc::Slice(handler_bufs[usize::from(job.tag)].as_slice());
            let _ = q.complete_io_cmd_unified(job.tag, buf, Ok(UblkIORes::Result(-libc::EIO)));
        }
    });
    // The queue is down. Jobs still out write into `bufs`: wait for them.
    // Writes held for a write-out are done with their buffers (their log is
    // written out when the volume closes).
    lent -= held.len();
    while lent > 0 {
        match done_rx.recv() {
            Err(_) => break,
            Ok(Done::Answer(..) | Done::Held(..)) => lent -= 1,
            Ok(Done::WrittenOut) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::create_volume;
    use squeeze_engine::CreateOptions;

    fn iod(op: u32, flags: u32, sector: u64, sectors: u32) -> sys::ublksrv_io_desc {
        sys::ublksrv_io_desc {
            op_flags: op | flags,
            nr_sectors: sectors,
            start_sector: sector,
            addr: 0,
        }
    }

    /// Every op the kernel sends maps to the adapter: a write reads back,
    /// a flush with the garbage sector the kernel's flush request carries
    /// succeeds (it has no range), discard and write-zeroes read back
    /// zeros, a range past the end and an unknown op are errors, not
    /// panics.
    #[test]
    fn each_ublk_op_reaches_the_adapter() {
        let dir = std::env::temp_dir().join(format!("sqz-ublk-ops-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.sqz");
        let _ = std::fs::remove_file(&path);
        let vol = create_volume(&path, &CreateOptions::new(16 << 20)).unwrap();
        let dev = VolumeDevice { vol };
        let c = UblkCounters::default();
        let mut buf = vec![0u8; 64 << 10];
        let data: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();

        buf.copy_from_slice(&data);
        let w = iod(sys::UBLK_IO_OP_WRITE, sys::UBLK_IO_F_FUA, 8, 128);
        assert_eq!(execute(&dev, &c, &w, &mut buf), 64 << 10);
        buf.fill(0);
        let r = iod(sys::UBLK_IO_OP_READ, 0, 8, 128);
        assert_eq!(execute(&dev, &c, &r, &mut buf), 64 << 10);
        assert_eq!(buf, data);

        let f = iod(sys::UBLK_IO_OP_FLUSH, 0, u64::MAX, 0);
        assert_eq!(execute(&dev, &c, &f, &mut buf), 0);

        let d = iod(sys::UBLK_IO_OP_DISCARD, 0, 8, 64);
        assert_eq!(execute(&dev, &c, &d, &mut buf), 0);
        let z = iod(sys::UBLK_IO_OP_WRITE_ZEROES, sys::UBLK_IO_F_NOUNMAP, 72, 64);
        assert_eq!(execute(&dev, &c, &z, &mut buf), 0);
        assert_eq!(execute(&dev, &c, &r, &mut buf), 64 << 10);
        assert!(buf.iter().all(|&b| b == 0));

        let past = iod(sys::UBLK_IO_OP_READ, 0, (16 << 20) / 512 - 8, 16);
        assert_eq!(execute(&dev, &c, &past, &mut buf), -libc::EINVAL);
        let big = iod(sys::UBLK_IO_OP_WRITE, 0, 0, 256);
        assert_eq!(execute(&dev, &c, &big, &mut buf), -libc::EINVAL);
        let same = iod(sys::UBLK_IO_OP_WRITE_SAME, 0, 0, 8);
        assert_eq!(execute(&dev, &c, &same, &mut buf), -libc::EOPNOTSUPP);

        assert_eq!(c.flushes.load(Ordering::Relaxed), 1);
        assert_eq!(c.discards.load(Ordering::Relaxed), 1);
        assert_eq!(c.write_zeroes.load(Ordering::Relaxed), 1);
        drop(dev);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn wake() -> Arc<Wake> {
        // SAFETY: eventfd with integer arguments; the fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        Arc::new(Wake {
            // SAFETY: a fresh fd nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            pending: AtomicBool::new(false),
        })
    }

    /// Only requests that append to the log and are not durable already
    /// wait for a write-out before they are answered.
    #[test]
    fn only_log_appends_without_fua_wait_for_a_write_out() {
        use sys::*;
        let held = |op, flags| answered_after_write_out(&iod(op, flags, 0, 8));
        assert!(held(UBLK_IO_OP_WRITE, 0));
        assert!(held(UBLK_IO_OP_DISCARD, 0));
        assert!(held(UBLK_IO_OP_WRITE_ZEROES, UBLK_IO_F_NOUNMAP));
        assert!(!held(UBLK_IO_OP_WRITE, UBLK_IO_F_FUA));
        assert!(!held(UBLK_IO_OP_READ, 0));
        assert!(!held(UBLK_IO_OP_FLUSH, 0));
    }

    /// A write-out answers its whole batch, in order, then says it is over;
    /// the eventfd is bumped once for all of it.
    #[test]
    fn a_write_out_answers_its_batch() {
        let dir = std::env::temp_dir().join(format!("sqz-ublk-wo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.sqz");
        let _ = std::fs::remove_file(&path);
        let vol = create_volume(&path, &CreateOptions::new(16 << 20)).unwrap();
        let dev = VolumeDevice { vol };
        let c = UblkCounters::default();
        let mut buf = vec![7u8; 8192];
        assert_eq!(
            execute(&dev, &c, &iod(sys::UBLK_IO_OP_WRITE, 0, 0, 16), &mut buf),
            8192
        );
        let (tx, rx) = crossbeam_channel::unbounded();
        let w = wake();
        run_write_out(
            &dev,
            &c,
            WriteOut {
                batch: vec![(3, 8192), (1, 0)],
                done: tx,
                wake: w.clone(),
            },
        );
        let got: Vec<String> = rx
            .try_iter()
            .map(|d| match d {
                Done::Answer(t, r) => format!("answer {t} {r}"),
                Done::Held(t, r) => format!("held {t} {r}"),
                Done::WrittenOut => "over".into(),
            })
            .collect();
        assert_eq!(got, ["answer 3 8192", "answer 1 0", "over"]);
        assert!(w.pending.load(Ordering::SeqCst));
        w.rearm();
        drop(dev);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Workers sleep on the queue until a job comes; closing it ends them
    /// and refuses later jobs.
    #[test]
    fn a_closed_job_queue_ends_its_workers() {
        let q = JobQueue::new();
        let worker = {
            let q = q.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                while q.pop().is_some() {
                    n += 1;
                }
                n
            })
        };
        let (tx, _rx) = crossbeam_channel::unbounded();
        let w = wake();
        let job = || {
            Work::WriteOut(WriteOut {
                batch: Vec::new(),
                done: tx.clone(),
                wake: w.clone(),
            })
        };
        assert!(q.push(job()).is_ok());
        assert!(q.push(job()).is_ok());
        q.close();
        assert_eq!(worker.join().unwrap(), 2);
        assert!(q.push(job()).is_err());
    }
}
