//! `squeeze info PATH [--json]`: format version, uuid, settings, layout.

use crate::dedup_args::{dedup_json, dedup_text};
use crate::policy_args::{alg_name, policy_json};
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
    let vol = open_volume_read_only(&a.path, true)?;
    let file_len = std::fs::metadata(&a.path)?.len();
    let sb = vol.superblock();
    let st = vol.stats();
    let p = sb.policy;
    let info = serde_json::json!({
        "path": a.path.display().to_string(),
        "format_version": sb.version,
        "checkpoint_base_bytes": st.checkpoint_base_bytes,
        "checkpoint_deltas": st.checkpoint_deltas,
        "checkpoint_delta_bytes": st.checkpoint_delta_bytes,
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
        "file_bytes": file_len,
        "truncated": vol.damage().truncated,
        "damage": (!vol.damage().is_empty()).then(|| vol.damage().to_string()),
        "policy": policy_json(&p),
        "dedup": dedup_json(&sb.dedup)
    });
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!("volume          {}", a.path.display());
    if sb.version < FORMAT_VERSION {
        outln!(
            "format version  {} (the first checkpoint upgrades it to {FORMAT_VERSION})",
            sb.version
        );
    } else {
        outln!("format version  {}", sb.version);
    }
    outln!("uuid            {}", hex(&sb.uuid));
    outln!(
        "logical size    {} ({} bytes)",
        human(sb.logical_size),
        sb.logical_size
    );
    outln!("sector size     {}", squeeze_format::SECTOR_SIZE);
    outln!(
        "layout          superblocks at 0 and 4 KiB, segments of {} from {}",
        human(u64::from(sb.segment_size)),
        human(DATA_START)
    );
    outln!(
        "segments        {} in file, {} free",
        st.segments_total,
        st.segments_free
    );
    match vol.damage().truncated {
        Some(t) => outln!(
            "file            {} bytes: CUT SHORT, its records reach byte {} ({} missing)",
            t.file_len,
            t.needed,
            human(t.needed - t.file_len)
        ),
        None => outln!("file            {} bytes", file_len),
    }
    if !vol.damage().is_empty() {
        outln!(
            "DAMAGED         {} (`squeeze check` names it)",
            vol.damage()
        );
    }
    outln!(
        "max physical    {}",
        if sb.max_physical == 0 {
            "unlimited".to_string()
        } else {
            human(sb.max_physical)
        }
    );
    outln!(
        "checkpoint      {}: a base of {} and {} deltas ({}), in segments {:?} (superblock generation {}, {})",
        human(sb.checkpoint.len),
        human(st.checkpoint_base_bytes),
        st.checkpoint_deltas,
        human(st.checkpoint_delta_bytes),
        sb.checkpoint.segments,
        sb.generation,
        if sb.clean {
            "clean"
        } else {
            "not closed cleanly"
        }
    );
    outln!("algorithm       {}", alg_name(p.codec, p.level));
    outln!("mode            {}", p.mode.name());
    outln!("required ratio  {}", f64::from(p.required_ratio_ppm) / 1e6);
    outln!("min blob size   {}", human(u64::from(p.min_blob)));
    outln!("max blob size   {}", human(u64::from(p.max_blob)));
    let idle = p.recompress_codec == p.codec
        && p.recompress_codec != squeeze_format::CodecId::None
        && p.recompress_level != p.level;
    outln!(
        "recompress      {}{}",
        alg_name(p.recompress_codec, p.recompress_level),
        if idle { " (idle squeeze)" } else { "" }
    );
    if p.read_chunk == 0 {
        outln!("read chunk      none (one frame a blob)");
    } else {
        outln!("read chunk      {}", human(u64::from(p.read_chunk)));
    }
    outln!("dedup           {}", dedup_text(&sb.dedup));
    Ok(ExitCode::SUCCESS)
}
