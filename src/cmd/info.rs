//! `squeeze info PATH [--json]`: format version, uuid, settings, layout.

use crate::util::{hex, human, open_volume_read_only};
use anyhow::Result;
use squeeze_format::{DATA_START, FORMAT_VERSION};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    pub path: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let vol = open_volume_read_only(&a.path)?;
    let sb = vol.superblock();
    let st = vol.stats();
    let p = sb.policy;
    let info = serde_json::json!({
        "path": a.path.display().to_string(),
        "format_version": FORMAT_VERSION,
        "uuid": hex(&sb.uuid),
        "created_unix": sb.created_unix,
        "logical_size": sb.logical_size,
        "sector_size": squeeze_format::SECTOR_SIZE,
        "segment_size": sb.segment_size,
        "data_start": DATA_START,
        "max_physical": sb.max_physical,
        "superblock_generation": sb.generation,
        "clean": sb.clean,
        "checkpoint_bytes": sb.checkpoint.len,
        "checkpoint_segments": sb.checkpoint.segments,
        "segments_in_file": st.segments_total,
        "segments_free": st.segments_free,
        "policy": {
            "algorithm": super::alg_name(p.codec, p.level),
            "mode": p.mode.name(),
            "required_ratio": f64::from(p.required_ratio_ppm) / 1e6,
            "min_blob_size": p.min_blob,
            "max_blob_size": p.max_blob,
            "recompress": super::alg_name(p.recompress_codec, p.recompress_level),
        }
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("volume          {}", a.path.display());
    println!("format version  {FORMAT_VERSION}");
    println!("uuid            {}", hex(&sb.uuid));
    println!(
        "logical size    {} ({} bytes)",
        human(sb.logical_size),
        sb.logical_size
    );
    println!("sector size     {}", squeeze_format::SECTOR_SIZE);
    println!(
        "layout          superblocks at 0 and 4 KiB, segments of {} from {}",
        human(u64::from(sb.segment_size)),
        human(DATA_START)
    );
    println!(
        "segments        {} in file, {} free",
        st.segments_total, st.segments_free
    );
    println!(
        "max physical    {}",
        if sb.max_physical == 0 {
            "unlimited".to_string()
        } else {
            human(sb.max_physical)
        }
    );
    println!(
        "checkpoint      {} in segments {:?} (superblock generation {}, {})",
        human(sb.checkpoint.len),
        sb.checkpoint.segments,
        sb.generation,
        if sb.clean {
            "clean"
        } else {
            "not closed cleanly"
        }
    );
    println!("algorithm       {}", super::alg_name(p.codec, p.level));
    println!("mode            {}", p.mode.name());
    println!("required ratio  {}", f64::from(p.required_ratio_ppm) / 1e6);
    println!("min blob size   {}", human(u64::from(p.min_blob)));
    println!("max blob size   {}", human(u64::from(p.max_blob)));
    println!(
        "recompress      {}",
        super::alg_name(p.recompress_codec, p.recompress_level)
    );
    Ok(ExitCode::SUCCESS)
}
