//! `squeeze set PATH [policy]`: change the policy for future writes (as
//! `ceph osd pool set` does); data already written keeps its codec.

use super::PolicyArgs;
use crate::util::open_volume;
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    pub path: PathBuf,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let vol = open_volume(&a.path, false)?;
    let p = a.policy.apply(vol.policy())?;
    vol.set_policy(p)?;
    vol.close()?;
    outln!(
        "{}: algorithm {} mode {} required_ratio {} min_blob {} max_blob {} recompress {}",
        a.path.display(),
        super::alg_name(p.codec, p.level),
        p.mode.name(),
        f64::from(p.required_ratio_ppm) / 1e6,
        p.min_blob,
        p.max_blob,
        super::alg_name(p.recompress_codec, p.recompress_level)
    );
    Ok(ExitCode::SUCCESS)
}
