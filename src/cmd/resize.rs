//! `squeeze resize PATH|SOCKET [--volume NAME] --size SIZE`: change a
//! volume's logical size, on a volume file or, through its control socket,
//! on a running server. Growing always works; shrinking only when nothing
//! is mapped past the new end (trim the tail first). NBD has no way to tell
//! a connected client: new connections see the new size (a kernel client
//! reconnects; a loop device on `serve --fuse-dir`'s file picks it up with
//! `losetup -c`).

use crate::control_client::{control_call, is_socket, ControlRequest};
use crate::util::{human, open_volume, parse_size};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A volume file, or a running server's control socket.
    pub path: PathBuf,
    /// With a control socket: the export to resize (needed when the server
    /// serves several).
    #[arg(long, value_name = "NAME")]
    pub volume: Option<String>,
    /// The new logical size (a multiple of 4 KiB; suffixes K, M, G, T).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: u64,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (name, size) = if is_socket(&a.path) {
        let v = control_call(
            &a.path,
            &ControlRequest {
                op: "resize".into(),
                volume: a.volume.clone(),
                size: Some(a.size),
                ..Default::default()
            },
        )?;
        (
            v["volume"].as_str().unwrap_or("?").to_string(),
            v["size"].as_u64().unwrap_or(0),
        )
    } else {
        if a.volume.is_some() {
            bail!("--volume names an export of a running server: PATH is a volume file");
        }
        let vol = open_volume(&a.path, false)?;
        vol.resize(a.size)?;
        let size = vol.size();
        vol.close()?;
        (a.path.display().to_string(), size)
    };
    outln!("{name}: logical size {} ({size} bytes)", human(size));
    Ok(ExitCode::SUCCESS)
}
