//! `squeeze create PATH --size SIZE [policy] [--dedup off|idle|inline]
//! [--dedup-index MIB]`: a new, empty, thin volume.

use crate::dedup_args::{dedup_text, DedupArgs};
use crate::policy_args::{alg_name, PolicyArgs};
use crate::util::{create_volume, hex, human, parse_size};
use anyhow::Result;
use squeeze_engine::{default_policy, CreateOptions, DedupSettings};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// The backing file to create (must not exist).
    pub path: PathBuf,
    /// Logical size (64G, 1T, ...); may exceed the free disk: thin.
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Log segment size: the unit of allocation and cleaning.
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    pub segment_size: u64,
    /// Cap the backing file's physical size; writes fail with ENOSPC at the cap.
    #[arg(long, value_parser = parse_size)]
    pub max_physical: Option<u64>,
    #[command(flatten)]
    pub dedup: DedupArgs,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let opts = CreateOptions {
        logical_size: a.size,
        segment_size: a.segment_size,
        max_physical: a.max_physical.unwrap_or(0),
        policy: a.policy.apply(default_policy())?,
        dedup: a.dedup.apply(DedupSettings::default())?,
    };
    let vol = create_volume(&a.path, &opts)?;
    let sb = vol.superblock();
    vol.close()?;
    outln!(
        "created {} ({} logical, uuid {}, {} {}, dedup {})",
        a.path.display(),
        human(sb.logical_size),
        hex(&sb.uuid),
        alg_name(sb.policy.codec, sb.policy.level),
        sb.policy.mode.name(),
        dedup_text(&sb.dedup)
    );
    Ok(ExitCode::SUCCESS)
}
