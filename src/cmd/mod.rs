//! One module per subcommand. Subcommands do not import each other: what
//! two of them share lives below them, in the crate root (`policy_args`,
//! `control_client`, `machine`, `svg`, `util`).

pub mod bench;
pub mod chart;
pub mod check;
pub mod compact;
pub mod create;
pub mod export;
pub mod import;
pub mod info;
pub mod kv;
pub mod nbd_attach;
pub mod resize;
pub mod scan;
pub mod serve;
pub mod set;
pub mod stats;
pub mod tco;
pub mod wal;
