//! The accept loop the control socket and the metrics listener share:
//! one client at a time, its reads under a timeout, until the server stops
//! (it sets `stop`, then connects once to wake the loop out of accept()).

use std::io;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A connection whose reads can time out.
pub(super) trait Conn {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
}

impl Conn for UnixStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }
}

impl Conn for TcpStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }
}

/// Hands each client of `incoming` to `answer`, one at a time, with reads
/// timing out after `read_timeout`; returns at the first connection after
/// `stop` is set. A failed accept is passed over.
pub(super) fn one_at_a_time<C: Conn>(
    incoming: impl Iterator<Item = io::Result<C>>,
    stop: &AtomicBool,
    read_timeout: Duration,
    mut answer: impl FnMut(&mut C),
) {
    for conn in incoming {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut c) = conn else { continue };
        let _ = c.set_read_timeout(Some(read_timeout));
        answer(&mut c);
    }
}
