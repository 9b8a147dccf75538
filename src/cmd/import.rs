//! `squeeze import SRC PATH`: copy a file or block device into a volume from
//! offset 0. Holes in a sparse source are skipped (SEEK_DATA/SEEK_HOLE) and
//! zero regions become holes in the volume. Creates the volume, sized to the
//! source, when PATH does not exist.

use crate::policy_args::PolicyArgs;
use crate::util::{create_volume, human, open_volume, progress};
use anyhow::{bail, Context, Result};
use squeeze_codec::process::cpu_seconds as process_cpu_seconds;
use squeeze_engine::{default_policy, CreateOptions};
use std::fs::File;
use std::io::IsTerminal;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// Bytes per write request.
const CHUNK: usize = 4 << 20;

#[derive(clap::Args)]
pub struct Args {
    /// Source file or block device.
    pub src: PathBuf,
    /// Destination volume (created, sized to the source, if missing).
    pub path: PathBuf,
    /// Policy for a volume created by this import.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Writer threads (requests in flight).
    #[arg(long, default_value_t = 4)]
    pub jobs: usize,
}

pub fn source_len(f: &File) -> Result<u64> {
    let m = f.metadata()?;
    if m.is_file() {
        return Ok(m.len());
    }
    // Block devices report 0 in metadata: seek to the end.
    // SAFETY: lseek on an fd we own.
    let end = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_END) };
    if end < 0 {
        bail!(
            "cannot determine the size: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(end as u64)
}

/// Data regions of a file, via SEEK_DATA/SEEK_HOLE (whole file if unsupported).
pub fn data_regions(f: &File, len: u64) -> Vec<(u64, u64)> {
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut at: i64 = 0;
    while (at as u64) < len {
        // SAFETY: lseek on an fd we own.
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                break; // no more data
            }
            return vec![(0, len)];
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let hole = if hole < 0 { len as i64 } else { hole };
        out.push((data as u64, (hole as u64).min(len)));
        at = hole;
    }
    out
}

pub fn run(a: Args) -> Result<ExitCode> {
    let src = File::open(&a.src).with_context(|| format!("cannot open {}", a.src.display()))?;
    let len = source_len(&src)?;
    let vol = if a.path.exists() {
        if a.policy.algorithm.is_some() || a.policy.mode.is_some() {
            bail!("policy options apply to a new volume; use `squeeze set` on an existing one");
        }
        open_volume(&a.path, true)?
    } else {
        let size = len.div_ceil(1 << 20).max(1) << 20;
        let mut o = CreateOptions::new(size);
        o.policy = a.policy.apply(default_policy())?;
        create_volume(&a.path, &o)?
    };
    if len > vol.size() {
        bail!(
            "{} is {} but the volume holds only {}",
            a.src.display(),
            human(len),
            human(vol.size())
        );
    }
    let before = vol.stats();
    let regions = data_regions(&src, len);
    let data_len: u64 = regions.iter().map(|(s, e)| e - s).sum();
    let pb = progress(data_len, "importing");
    if !std::io::stderr().is_terminal() {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let t0 = Instant::now();
    let cpu0 = process_cpu_seconds();
    let vol = Arc::new(vol);
    let (tx, rx) = crossbeam_channel::bounded::<(u64, Vec<u8>)>(a.jobs.max(1) * 2);
    let writers: Vec<_> = (0..a.jobs.max(1))
        .map(|_| {
            let rx = rx.clone();
            let vol = vol.clone();
            let pb = pb.clone();
            std::thread::spawn(move || -> Result<()> {
                for (off, buf) in rx {
                    vol.write(off, &buf, false)?;
                    pb.inc(buf.len() as u64);
                }
                Ok(())
            })
        })
        .collect();
    drop(rx);
    let mut read_err = None;
    'outer: for (start, end) in regions {
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(CHUNK - (at % CHUNK as u64) as usize);
            let mut buf = vec![0u8; n];
            if let Err(e) = src.read_exact_at(&mut buf, at) {
                read_err = Some(anyhow::anyhow!("reading {} at {at}: {e}", a.src.display()));
                break 'outer;
            }
            if tx.send((at, buf)).is_err() {
                break 'outer; // a writer failed; its error is reported below
            }
            at += n as u64;
        }
    }
    drop(tx);
    for w in writers {
        w.join().expect("writer thread")?;
    }
    if let Some(e) = read_err {
        return Err(e);
    }
    vol.flush()?;
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu0;
    let vol = Arc::try_unwrap(vol).ok().expect("writers joined");
    let st = vol.stats();
    vol.close()?;
    let written = st.log_bytes_written - before.log_bytes_written;
    outln!(
        "imported {} ({} of data) in {:.2} s: {:.1} MB/s in, {:.1} MB/s to the backing file, {:.2} CPU s",
        human(len),
        human(data_len),
        secs,
        data_len as f64 / secs / 1e6,
        written as f64 / secs / 1e6,
        cpu
    );
    outln!(
        "volume: {} mapped, {} stored, ratio {:.3}, {} on disk",
        human(st.mapped_bytes),
        human(st.stored_bytes),
        st.compression_ratio,
        human(st.physical_bytes)
    );
    Ok(ExitCode::SUCCESS)
}
