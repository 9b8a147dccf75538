//! `squeeze nbd-attach`: the kernel's NBD client on a `squeeze serve`
//! export, kept connected across a server restart.
//!
//! It does what nbd-client does to set a device up, and then stays: the
//! handshake on each connection (`dial`), the device configured over
//! generic netlink with those sockets, the export's size and flags, a
//! request timeout and a dead-connection timeout (`genl`), and then the
//! supervisor (`supervise`), which hands the device a new socket for each
//! one that dies, so a file system on it sees no I/O error as long as the
//! server is back within the dead-connection timeout, and the server runs
//! with `--restartable` (its answered writes outlive its process: the file
//! system goes on trusting them). SIGTERM or SIGINT
//! disconnects the device; `--disconnect DEVICE` disconnects one from
//! another shell.
//!
//! ```text
//! squeeze serve --restartable --socket /run/vol.sock vol.sqz &
//! squeeze nbd-attach --socket /run/vol.sock --export vol -C 2 /dev/nbd0 &
//! mount /dev/nbd0 /mnt
//! ```

mod dial;
mod genl;
mod supervise;

use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;

use crate::util::human;
use dial::{dial, Endpoint};
use genl::{socket_taken, DeviceConfig, Nbd};
use supervise::{Event, Supervisor};

#[derive(Parser, Debug)]
#[command(
    about = "Attach /dev/nbdN to a squeeze serve export with the kernel's NBD client, and keep it attached across server restarts",
    long_about = "Attach /dev/nbdN to an export with the kernel's NBD client (nbd.ko), \
        configured over generic netlink, and stay in the foreground as its supervisor: \
        when the server goes away (killed, restarted, upgraded) it dials it again with \
        backoff and hands the kernel the new connections (NBD_CMD_RECONFIGURE). Meanwhile \
        the kernel holds the I/O: applications see a pause, not an error, as long as the \
        server is back within --dead-timeout. Run the server with `squeeze serve --restartable`: \
        the file system goes on trusting every write it was answered before the server died, \
        so those must outlive the server process. SIGTERM or SIGINT disconnects the device."
)]
pub struct Args {
    /// The device (/dev/nbd0, nbd0 or 0); default: the first free one.
    #[arg(value_name = "DEVICE")]
    pub device: Option<String>,
    /// The server's Unix socket (`squeeze serve --socket`).
    #[arg(long, value_name = "PATH", conflicts_with = "connect")]
    pub socket: Option<PathBuf>,
    /// The server's TCP address (`squeeze serve --listen`).
    #[arg(long, value_name = "HOST:PORT")]
    pub connect: Option<String>,
    /// The export: the volume file's name without `.sqz`.
    #[arg(short = 'N', long, value_name = "NAME")]
    pub export: Option<String>,
    /// Connections to the server (the kernel spreads requests over its
    /// queues); more than one needs a server that offers multi-conn.
    #[arg(short = 'C', long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub connections: u32,
    /// The device's logical block size in bytes (512, 1024, 2048, 4096).
    #[arg(short = 'b', long, value_name = "BYTES", default_value_t = 4096)]
    pub block_size: u64,
    /// Seconds a request may go unanswered; then the kernel marks its
    /// connection dead and sends it again on a live one (or waits for one).
    #[arg(short = 't', long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// Seconds the kernel holds I/O while every connection is dead; then
    /// it fails the held requests with EIO (a reconnection after that
    /// still revives the device).
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub dead_timeout: u64,
    /// Do the handshake, print what the server offers, attach nothing.
    #[arg(long)]
    pub probe: bool,
    /// Disconnect DEVICE (attached by another nbd-attach or nbd-client).
    #[arg(long, requires = "device", conflicts_with_all = ["socket", "connect", "probe"])]
    pub disconnect: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let index = a.device.as_deref().map(parse_device).transpose()?;
    if a.disconnect {
        let index = index.expect("clap requires DEVICE with --disconnect");
        let nbd = Nbd::open()?;
        nbd.disconnect(index).map_err(|e| {
            anyhow!("{e}: /dev/nbd{index} could not be disconnected (is it connected?)")
        })?;
        noteln!("nbd-attach: /dev/nbd{index} disconnected");
        return Ok(ExitCode::SUCCESS);
    }
    let endpoint = match (&a.socket, &a.connect) {
        (Some(p), None) => Endpoint::Unix(p.clone()),
        (None, Some(t)) => Endpoint::Tcp(t.clone()),
        _ => bail!("name the server: --socket PATH or --connect HOST:PORT"),
    };
    let export = a
        .export
        .clone()
        .ok_or_else(|| anyhow!("name the export: -N NAME (the volume file's name without .sqz)"))?;
    if !a.block_size.is_power_of_two() || !(512..=4096).contains(&a.block_size) {
        bail!(
            "--block-size {}: the kernel takes 512, 1024, 2048 or 4096",
            a.block_size
        );
    }

    let (first, info) = dial(&endpoint, &export).context("the handshake with the server")?;
    let describe = format!(
        "export {export:?} on {endpoint}: {} ({} bytes), flags: {}",
        human(info.size_bytes),
        info.size_bytes,
        info.flag_names()
    );
    if a.probe {
        outln!("{describe}");
        if let Some(b) = info.block_sizes {
            outln!(
                "block sizes: minimum {}, preferred {}, maximum {}",
                b.minimum_bytes,
                b.preferred_bytes,
                b.maximum_bytes
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if info.size_bytes % a.block_size != 0 {
        bail!(
            "the export's size ({} bytes) is not a multiple of the block size {}",
            info.size_bytes,
            a.block_size
        );
    }
    if a.connections > 1 && info.transmission_flags & squeeze_nbd::proto::FLAG_CAN_MULTI_CONN == 0 {
        bail!(
            "-C {}: the server does not offer multi-conn for {export:?}: use -C 1",
            a.connections
        );
    }
    let mut sockets = vec![first];
    for _ in 1..a.connections {
        sockets.push(dial(&endpoint, &export).context("a further connection")?.0);
    }

    let nbd = Nbd::open()?;
    // The event watcher first, so no NBD_CMD_LINK_DEAD is missed.
    let (events_tx, events) = crossbeam_channel::unbounded();
    let want = index;
    let tx = events_tx.clone();
    let device_index = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(-1));
    let watched = device_index.clone();
    genl::watch_link_dead(move |i| {
        let mine = watched.load(std::sync::atomic::Ordering::Relaxed);
        if mine < 0 || i64::from(i) == mine {
            return tx.send(Event::LinkDead).is_ok();
        }
        true
    })?;
    let config = DeviceConfig {
        index: want,
        size_bytes: info.size_bytes,
        block_size_bytes: a.block_size,
        server_flags: info.transmission_flags,
        request_timeout: Duration::from_secs(a.timeout),
        dead_connection_timeout: Duration::from_secs(a.dead_timeout),
    };
    let fds: Vec<BorrowedFd<'_>> = sockets.iter().map(|s| s.as_fd()).collect();
    let index = nbd.connect(&config, &fds).map_err(|e| match (e.errno, want) {
        (libc::EBUSY, Some(i)) => anyhow!(
            "{e}: /dev/nbd{i} is in use (connected already): disconnect it first \
             (`squeeze nbd-attach --disconnect /dev/nbd{i}` or `nbd-client -d /dev/nbd{i}`), or name another device"
        ),
        (libc::EPERM, _) => anyhow!("{e}: configuring an NBD device needs CAP_SYS_ADMIN (run as root)"),
        _ => anyhow!(e),
    })?;
    device_index.store(i64::from(index), std::sync::atomic::Ordering::Relaxed);
    for (i, s) in sockets.iter().enumerate() {
        if !socket_taken(s.as_fd())? {
            tracing::warn!(
                connection = i,
                "the driver did not set SO_SNDTIMEO on a socket it was given"
            );
        }
    }
    noteln!(
        "nbd-attach: /dev/nbd{index} connected: {describe}; {} connection(s), block size {}, \
         request timeout {} s, dead-connection timeout {} s",
        a.connections,
        a.block_size,
        a.timeout,
        a.dead_timeout
    );

    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                let _ = events_tx.send(Event::Stop);
            }
        })?;
    Supervisor {
        nbd,
        index,
        endpoint,
        export,
        info,
        sockets,
        events,
    }
    .run()?;
    noteln!("nbd-attach: /dev/nbd{index} disconnected");
    Ok(ExitCode::SUCCESS)
}

/// `/dev/nbd3`, `nbd3` or `3` -> 3.
fn parse_device(s: &str) -> Result<u32> {
    let n = s.strip_prefix("/dev/").unwrap_or(s);
    let n = n.strip_prefix("nbd").unwrap_or(n);
    n.parse()
        .map_err(|_| anyhow!("{s:?} is not an NBD device (/dev/nbdN, nbdN or N)"))
}

#[cfg(test)]
mod tests {
    use super::parse_device;

    #[test]
    fn devices_are_named_three_ways() {
        assert_eq!(parse_device("/dev/nbd3").unwrap(), 3);
        assert_eq!(parse_device("nbd12").unwrap(), 12);
        assert_eq!(parse_device("0").unwrap(), 0);
        assert!(parse_device("/dev/sda").is_err());
        assert!(parse_device("/dev/nbd0p1").is_err());
    }
}
