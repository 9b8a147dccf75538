//! One ublk queue of `squeeze serve --ublk`: the queue's thread takes the
//! kernel's requests off its io_uring and hands each to a worker, which runs
//! it on the device adapter (`device::VolumeDevice`, the same one NBD and
//! FUSE use) and posts the result back; the queue's thread commits it to
//! the kernel. The engine's calls block (a write compresses, a flush
//! waits for the disk), so they never run on the queue's thread.
//!
//! What the kernel sends and what it becomes:
//!
//! | ublk op | adapter |
//! |---|---|
//! | READ | `read_at` |
//! | WRITE (FUA: durable when answered) | `write_at` |
//! | FLUSH | `flush` |
//! | DISCARD | `trim` |
//! | WRITE_ZEROES (NOUNMAP: keep it provisioned) | `write_zeroes` |
//! | anything else | EOPNOTSUPP |
//!
//! Invariants:
//! - A tag's buffer is touched by at most one thread at a time: the kernel
//!   hands the tag to this queue, the queue's thread lends the buffer to
//!   one worker, and gets it back (with the result) before it commits the
//!   tag to the kernel again.
//! - The buffers outlive every job: the queue's thread waits for all the
//!   jobs it lent out before it returns and the buffers are freed.
//! - Requests in flight are bounded by the queue depth (one job per tag).
//!
//! The wake-up: each queue keeps one read of an eventfd in its io_uring (a
//! "target I/O" in libublk's terms, tag `EVENTFD_TAG`); a worker sends its
//! result on the queue's channel and bumps the eventfd, the read completes,
//! and the queue's thread commits every result waiting on the channel.

use super::device::VolumeDevice;
use super::ublk_stats::UblkCounters;
use crossbeam_channel::{Receiver, Sender};
use libublk::helpers::IoBuf;
use libublk::io::{BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::sys;
use libublk::{BufDesc, UblkIORes};
use squeeze_nbd::BlockDevice;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The tag of the eventfd read in user data (not a request tag: those are
/// below the queue depth, at most `UBLK_MAX_QUEUE_DEPTH`).
const EVENTFD_TAG: u16 = u16::MAX;

/// A request lent to a worker.
pub(super) struct Job {
    tag: u16,
    iod: sys::ublksrv_io_desc,
    buf: BufPtr,
    done: Sender<(u16, i32)>,
    wake: Arc<OwnedFd>,
}

/// A tag's buffer, lent to one worker (see the invariants above).
struct BufPtr {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is used by one thread at a time (the invariants above).
unsafe impl Send for BufPtr {}

/// The workers of one device: WRITE requests on their own threads (as many
/// as the volume declares it runs at once: they are CPU-bound), everything
/// else on others (reads mostly wait for the device).
#[derive(Clone)]
pub(super) struct Workers {
    writes: Sender<Job>,
    others: Sender<Job>,
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
        let (writes, wr) = crossbeam_channel::unbounded::<Job>();
        let (others, or) = crossbeam_channel::unbounded::<Job>();
        for (rx, n, kind) in [(wr, write_threads, "w"), (or, other_threads, "r")] {
            for i in 0..n.max(1) {
                let rx: Receiver<Job> = rx.clone();
                let dev = dev.clone();
                let counters = counters.clone();
                std::thread::Builder::new()
                    .name(format!("sqz-ublk-{name}-{kind}{i}"))
                    .spawn(move || {
                        for job in rx {
                            run_job(&dev, &counters, job);
                        }
                    })?;
            }
        }
        Ok(Workers { writes, others })
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
    // The queue's thread waits for every job it lent: the channel is open.
    let _ = job.done.send((job.tag, res));
    let one: u64 = 1;
    // SAFETY: an 8-byte write from a live u64 to an eventfd we hold.
    let w = unsafe {
        libc::write(
            job.wake.as_raw_fd(),
            (&one as *const u64).cast(),
            std::mem::size_of::<u64>(),
        )
    };
    debug_assert_eq!(w, 8);
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
    // SAFETY: a fresh fd nothing else owns.
    let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<(u16, i32)>();
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
    let handler_bufs = bufs.clone();
    queue.wait_and_handle_io(|q, tag, ctx| {
        if ctx.is_tgt_io() {
            // Workers finished: commit their results, wait for the next.
            for (tag, res) in done_rx.try_iter() {
                lent -= 1;
                let buf = BufDesc::Slice(handler_bufs[usize::from(tag)].as_slice());
                if let Err(e) = q.complete_io_cmd_unified(tag, buf, Ok(UblkIORes::Result(res))) {
                    tracing::error!(qid, tag, "ublk commit failed: {e}");
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
            &workers.writes
        } else {
            &workers.others
        };
        lent += 1;
        if let Err(e) = pool.send(job) {
            // The workers are gone (cannot happen while the device runs).
            lent -= 1;
            let job = e.into_inner();
            let buf = BufDesc::Slice(handler_bufs[usize::from(job.tag)].as_slice());
            let _ = q.complete_io_cmd_unified(job.tag, buf, Ok(UblkIORes::Result(-libc::EIO)));
        }
    });
    // The queue is down. Jobs still out write into `bufs`: wait for them.
    while lent > 0 {
        if done_rx.recv().is_err() {
            break;
        }
        lent -= 1;
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
}
