//! `squeeze`: the command-line front end. Each subcommand lives in
//! `cmd/<name>.rs` or `cmd/<name>/`; `cmd/serve/device.rs` holds the one
//! adapter between the NBD layer and the engine (STYLE habit 9).
//! Subcommands do not import each other: what two share lives here, below
//! them (`policy_args`, `control_client`, `machine`, `svg`, `util`).
//!
//! Output goes through `outln!` (util.rs), never `println!`, which panics
//! when stdout is a pipe whose reader has gone (`squeeze stats | head`).
#![deny(clippy::print_stdout)]

#[macro_use]
mod util;
mod cmd;
mod control_client;
mod dedup_args;
mod machine;
mod policy_args;
mod svg;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "squeeze",
    version,
    about = "A software computational-storage drive: an inline-compressing, log-structured block store served over NBD"
)]
struct Cli {
    /// More logging (-v info, -vv debug, -vvv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a volume (thin: the logical size may exceed the free disk).
    Create(cmd::create::Args),
    /// Change the compression policy for future writes, or --max-physical
    /// (a volume file, or a running server's control socket).
    Set(cmd::set::Args),
    /// Change a volume's logical size (a volume file, or a running server's
    /// control socket).
    Resize(cmd::resize::Args),
    /// Show format version, uuid, settings and layout.
    Info(cmd::info::Args),
    /// Show space, compression and CPU statistics.
    Stats(cmd::stats::Args),
    /// Copy a file or block device into a volume from offset 0.
    Import(cmd::import::Args),
    /// Copy a volume out to a file or block device.
    Export(cmd::export::Args),
    /// Verify every live record and the metadata; name damaged LBAs.
    Check(cmd::check::Args),
    /// Measure the engine in-process against the raw codec on the same data.
    Bench(cmd::bench::Args),
    /// Run the cleaner to completion offline and report what it reclaimed.
    Compact(cmd::compact::Args),
    /// Serve volumes over NBD.
    Serve(cmd::serve::Args),
    /// Attach /dev/nbdN to an export with the kernel's NBD client, and
    /// keep it attached across server restarts.
    NbdAttach(cmd::nbd_attach::Args),
    Scan(cmd::scan::Args),
    Tco(cmd::tco::Args),
    Chart(cmd::chart::Args),
    /// A write-ahead log on a volume (dense or sparse); `wal bench`.
    Wal(cmd::wal::Args),
    /// A table-less hash key-value store on a volume; `kv bench`.
    Kv(cmd::kv::Args),
}

/// Keeps large buffers (a request's data, a batch's compressed output) in
/// the heap instead of fresh mmaps: every fresh mapping costs page faults
/// and zeroing on each request, measured at a quarter of the write path's
/// CPU.
fn tune_allocator() {
    // SAFETY: mallopt only adjusts glibc's allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    util::init_logging(cli.verbose);
    let res = match cli.command {
        Command::Create(a) => cmd::create::run(a),
        Command::Set(a) => cmd::set::run(a),
        Command::Resize(a) => cmd::resize::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Stats(a) => cmd::stats::run(a),
        Command::Import(a) => cmd::import::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::NbdAttach(a) => cmd::nbd_attach::run(a),
        Command::Compact(a) => cmd::compact::run(a),
        Command::Scan(a) => cmd::scan::run(a),
        Command::Tco(a) => cmd::tco::run(a),
        Command::Chart(a) => cmd::chart::run(a),
        Command::Wal(a) => cmd::wal::run(a),
        Command::Kv(a) => cmd::kv::run(a),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("squeeze: error: {}", util::error_text(&e));
            ExitCode::FAILURE
        }
    }
}
