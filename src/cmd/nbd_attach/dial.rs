//! One connection to the server, made ready for the kernel: connect (Unix
//! socket or TCP, as `squeeze serve --socket` / `--listen` offer), the
//! handshake (squeeze_nbd::client_handshake), then the socket options
//! the driver expects on a socket it is given.
//!
//! Invariant: a socket returned here has no send or receive timeout (the
//! handshake's are cleared): the driver reads it with the socket's own
//! receive timeout, and `genl::socket_taken` reads the send timeout to
//! learn whether the driver took it.

use std::io;
use std::net::TcpStream;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use squeeze_nbd::{negotiate, ExportInfo, NegotiateError};

/// Where the server listens.
#[derive(Debug, Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// Longest a server may take over each step of the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a connection could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// No server there (yet): connection refused, no socket file, ...
    #[error("cannot connect to {endpoint}: {error}")]
    Connect { endpoint: String, error: io::Error },
    /// The server answered and the handshake failed.
    #[error(transparent)]
    Handshake(#[from] NegotiateError),
}

impl DialError {
    /// Whether the server said no (a retry would get the same answer),
    /// as opposed to the server not being there or going away.
    pub fn is_refusal(&self) -> bool {
        match self {
            DialError::Connect { .. } => false,
            DialError::Handshake(NegotiateError::Io(_)) => false,
            DialError::Handshake(_) => true,
        }
    }
}

/// Connects, negotiates `export`, and returns the socket (ready for the
/// driver) with what the server said about the export.
pub fn dial(endpoint: &Endpoint, export: &str) -> Result<(OwnedFd, ExportInfo), DialError> {
    let connect_error = |error| DialError::Connect {
        endpoint: endpoint.to_string(),
        error,
    };
    match endpoint {
        Endpoint::Unix(path) => {
            let mut s = UnixStream::connect(path).map_err(connect_error)?;
            s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
                .map_err(connect_error)?;
            s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))
                .map_err(connect_error)?;
            let info = negotiate(&mut s, export)?;
            s.set_read_timeout(None).map_err(connect_error)?;
            s.set_write_timeout(None).map_err(connect_error)?;
            Ok((OwnedFd::from(s), info))
        }
        Endpoint::Tcp(addr) => {
            let mut s = TcpStream::connect(addr).map_err(connect_error)?;
            s.set_nodelay(true).map_err(connect_error)?;
            s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
                .map_err(connect_error)?;
            s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))
                .map_err(connect_error)?;
            let info = negotiate(&mut s, export)?;
            s.set_read_timeout(None).map_err(connect_error)?;
            s.set_write_timeout(None).map_err(connect_error)?;
            Ok((OwnedFd::from(s), info))
        }
    }
}
