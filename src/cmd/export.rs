//! `squeeze export PATH DST [--length N]`: copy a volume out. Holes in the
//! volume stay holes when DST is a regular file; a block device gets zeros
//! written.

use crate::util::{human, open_volume_read_only, parse_size, progress};
use anyhow::{bail, Context, Result};
use std::fs::OpenOptions;
use std::io::IsTerminal;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

const CHUNK: u64 = 4 << 20;

#[derive(clap::Args)]
pub struct Args {
    pub path: PathBuf,
    /// Destination file (created or truncated) or block device.
    pub dst: PathBuf,
    /// Stop after this many bytes.
    #[arg(long, value_parser = parse_size)]
    pub length: Option<u64>,
    /// Export a volume that lost flushed data (`squeeze check` names what),
    /// with what survives: the sectors of the lost records hold older data.
    #[arg(long)]
    pub accept_loss: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let vol = open_volume_read_only(&a.path, a.accept_loss)?;
    if !vol.damage().is_empty() {
        eprintln!("squeeze export: WARNING: {}", vol.damage());
    }
    let len = a.length.unwrap_or(vol.size());
    if len > vol.size() {
        bail!("--length {} exceeds the volume size {}", len, vol.size());
    }
    let is_block = std::fs::metadata(&a.dst)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false);
    let dst = OpenOptions::new()
        .write(true)
        .create(!is_block)
        .truncate(!is_block)
        .open(&a.dst)
        .with_context(|| format!("cannot open {}", a.dst.display()))?;
    if !is_block {
        dst.set_len(len)?;
    }
    let pb = progress(len, "exporting");
    if !std::io::stderr().is_terminal() {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let t0 = Instant::now();
    let mut buf = vec![0u8; CHUNK as usize];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(CHUNK) as usize;
        let holes = vol.block_status(at, n as u64, 1)?;
        let all_hole = holes.len() == 1 && holes[0].1 && holes[0].0 == n as u64;
        if !all_hole || is_block {
            vol.read(at, &mut buf[..n])
                .with_context(|| format!("reading the volume at {at}"))?;
            if is_block || buf[..n].iter().any(|&b| b != 0) {
                dst.write_all_at(&buf[..n], at)
                    .with_context(|| format!("writing {} at {at}", a.dst.display()))?;
            }
        }
        at += n as u64;
        pb.set_position(at);
    }
    dst.sync_all()?;
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let st = vol.stats();
    outln!(
        "exported {} in {:.2} s: {:.1} MB/s; volume ratio {:.3} ({} stored for {} mapped)",
        human(len),
        secs,
        len as f64 / secs / 1e6,
        st.compression_ratio,
        human(st.stored_bytes),
        human(st.mapped_bytes)
    );
    Ok(ExitCode::SUCCESS)
}
