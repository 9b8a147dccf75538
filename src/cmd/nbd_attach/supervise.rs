//! The supervisor `squeeze nbd-attach` becomes once the device is up: it
//! keeps one descriptor of every socket the driver holds, notices when one
//! is dead, dials the server again with backoff and hands the driver the
//! new socket (NBD_CMD_RECONFIGURE), until SIGTERM/SIGINT, on which it
//! disconnects the device.
//!
//! Invariants:
//! - `sockets` has one descriptor for each of the device's connections,
//!   naming the socket the driver holds in that slot (the slots
//!   themselves are the driver's: it fills the first dead one).
//! - A connection is dead exactly when its socket is shut down: the driver
//!   shuts a socket down as it marks it dead, and a server that went away
//!   closed it; either way our descriptor polls POLLHUP or POLLRDHUP. So
//!   the number of our descriptors that poll so is the number of dead
//!   slots (or about to be: the driver's receiver sees the same close).
//! - A replacement counts only once the driver took it (`socket_taken`);
//!   one it dropped (its slot was not yet marked dead) is dialled again
//!   at the next pass.
//! - The export must keep its size: a server that comes back with another
//!   size is not handed to the device (it is retried, and logged).
//!
//! What wakes it: NBD_CMD_LINK_DEAD for its device (genl::watch_link_dead),
//! a signal, or its own poll interval (`POLL_INTERVAL`), which also covers
//! a lost event.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use squeeze_nbd::ExportInfo;

use super::dial::{dial, DialError, Endpoint};
use super::genl::{socket_taken, Nbd};

/// How often the sockets are polled when nothing else wakes the loop.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The first wait after a failed reconnection, doubled after each failure.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait between two reconnection attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);
const _: () = assert!(BACKOFF_MIN.as_millis() < BACKOFF_MAX.as_millis());

/// What wakes the supervisor besides its poll interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The driver marked one of the device's connections dead.
    LinkDead,
    /// SIGTERM or SIGINT: disconnect and exit.
    Stop,
}

pub struct Supervisor {
    pub nbd: Nbd,
    pub index: u32,
    pub endpoint: Endpoint,
    pub export: String,
    /// What the first handshake said; every reconnection must agree on the size.
    pub info: ExportInfo,
    /// One descriptor per connection of the device (see the invariants).
    pub sockets: Vec<OwnedFd>,
    pub events: Receiver<Event>,
}

impl Supervisor {
    /// Runs until a stop event; then disconnects the device.
    pub fn run(mut self) -> Result<()> {
        let device = format!("/dev/nbd{}", self.index);
        let mut backoff = BACKOFF_MIN;
        let mut next_attempt = Instant::now();
        let mut outage_since: Option<Instant> = None;
        let mut last_error = String::new();
        loop {
            let dead: Vec<usize> = (0..self.sockets.len())
                .filter(|&i| is_shut(&self.sockets[i]))
                .collect();
            if !dead.is_empty() {
                let since = *outage_since.get_or_insert_with(|| {
                    noteln!(
                        "nbd-attach: {device}: {} of {} connections lost; reconnecting to {}",
                        dead.len(),
                        self.sockets.len(),
                        self.endpoint
                    );
                    Instant::now()
                });
                if Instant::now() >= next_attempt {
                    match self.replace(&dead) {
                        Ok(()) => {
                            backoff = BACKOFF_MIN;
                            last_error.clear();
                            if (0..self.sockets.len()).all(|i| !is_shut(&self.sockets[i])) {
                                noteln!(
                                    "nbd-attach: {device}: reconnected, {} connections live, {:.1} s after the loss",
                                    self.sockets.len(),
                                    since.elapsed().as_secs_f64()
                                );
                                outage_since = None;
                            }
                        }
                        Err(e) => {
                            let text = format!("{e:#}");
                            if text != last_error {
                                noteln!(
                                    "nbd-attach: {device}: reconnection failed (retrying): {text}"
                                );
                                last_error = text;
                            }
                            next_attempt = Instant::now() + backoff;
                            backoff = (backoff * 2).min(BACKOFF_MAX);
                        }
                    }
                }
            }
            let dead_now = (0..self.sockets.len()).any(|i| is_shut(&self.sockets[i]));
            let wait = if dead_now {
                next_attempt
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(20))
            } else {
                POLL_INTERVAL
            };
            match self.events.recv_timeout(wait) {
                Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(Event::LinkDead) => {
                    tracing::debug!(device, "NBD_CMD_LINK_DEAD");
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
        noteln!("nbd-attach: {device}: disconnecting");
        self.nbd.disconnect(self.index)?;
        Ok(())
    }

    /// Dials a replacement for each dead connection in `dead` (indexes into
    /// `sockets`) and hands it to the driver; stops at the first failure.
    fn replace(&mut self, dead: &[usize]) -> Result<()> {
        for &i in dead {
            let (socket, info) = match dial(&self.endpoint, &self.export) {
                Ok(d) => d,
                Err(e @ DialError::Connect { .. }) => bail!(e),
                Err(e) if e.is_refusal() => {
                    bail!("{e} (the server is back but refuses the export)")
                }
                Err(e) => bail!(e),
            };
            if info.size_bytes != self.info.size_bytes {
                bail!(
                    "export {:?} is now {} bytes, not the device's {}: not reconnected",
                    self.export,
                    info.size_bytes,
                    self.info.size_bytes
                );
            }
            match self.nbd.reconnect(self.index, socket.as_fd()) {
                Ok(()) => {}
                Err(e) if e.errno == libc::EINVAL => {
                    bail!(
                        "{e}: /dev/nbd{} is no longer configured (disconnected by someone else?)",
                        self.index
                    )
                }
                Err(e) => bail!(e),
            }
            if !socket_taken(socket.as_fd())? {
                bail!("the driver has not marked the connection dead yet");
            }
            // Our descriptor of the dead socket goes; the driver already
            // dropped its own reference when it took the new one.
            self.sockets[i] = socket;
        }
        Ok(())
    }
}

/// Whether `socket` is shut down or its peer has gone (without reading it:
/// the driver owns its data).
pub fn is_shut(socket: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_socket_is_shut_when_its_peer_goes_or_it_is_shut_down() {
        let (a, b) = UnixStream::pair().unwrap();
        let (c, _d) = UnixStream::pair().unwrap();
        let a = OwnedFd::from(a);
        let c_fd = OwnedFd::from(c.try_clone().unwrap());
        assert!(!is_shut(&a));
        assert!(!is_shut(&c_fd));
        drop(b); // the server went away
        assert!(is_shut(&a));
        c.shutdown(std::net::Shutdown::Both).unwrap(); // the driver marked it dead
        assert!(is_shut(&c_fd));
    }

    #[test]
    fn data_waiting_is_not_a_shut_socket() {
        use std::io::Write;
        let (a, mut b) = UnixStream::pair().unwrap();
        b.write_all(b"reply").unwrap();
        assert!(!is_shut(&OwnedFd::from(a)));
    }
}
