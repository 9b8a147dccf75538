//! The kernel's NBD driver over generic netlink (family "nbd",
//! include/uapi/linux/nbd-netlink.h), through the `neli` crate: connect a
//! device to sockets, hand it fresh sockets, disconnect it, and hear of its
//! dead connections (NBD_CMD_LINK_DEAD on the "nbd_mc_group" group).
//!
//! What the driver does with these (drivers/block/nbd.c, Linux 6.12):
//! - CONNECT takes the sockets (one kernel reference each: the caller may
//!   keep its own descriptors, which then name the same sockets), the size,
//!   the block size, the server's transmission flags (flush, FUA, trim,
//!   write-zeroes become queue limits), a request timeout (after it a
//!   request is requeued and its connection marked dead) and a
//!   dead-connection timeout (how long a request waits for a live
//!   connection when all are dead, before it fails with EIO).
//! - A connection is marked dead when its socket fails (the server closed
//!   it) or a request on it times out; marking it dead shuts the socket
//!   down (SHUT_RDWR: the caller's descriptor sees POLLHUP) and multicasts
//!   NBD_CMD_LINK_DEAD with the device's index.
//! - RECONFIGURE with sockets puts each into the first dead slot; a socket
//!   that finds no dead slot is dropped, and the command still succeeds.
//!   A taken socket gets the request timeout as its SO_SNDTIMEO, which is
//!   how `socket_taken` tells the two apart.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use neli::{
    consts::{genl::NlAttrType, nl::NlmF, socket::NlFamily},
    err::RouterError,
    genl::{AttrTypeBuilder, Genlmsghdr, GenlmsghdrBuilder, Nlattr, NlattrBuilder},
    neli_enum,
    nl::NlPayload,
    router::synchronous::{NlRouter, NlRouterReceiverHandle},
    types::{Buffer, GenlBuffer},
    utils::Groups,
};

const FAMILY: &str = "nbd";
const MULTICAST_GROUP: &str = "nbd_mc_group";
const VERSION: u8 = 1;

/// NBD_CMD_* (nbd-netlink.h).
#[neli_enum(serialized_type = "u8")]
pub enum NbdCmd {
    Unspec = 0,
    Connect = 1,
    Disconnect = 2,
    Reconfigure = 3,
    LinkDead = 4,
    Status = 5,
}
impl neli::consts::genl::Cmd for NbdCmd {}

/// NBD_ATTR_* (nbd-netlink.h): u32 index, u64 sizes and timeouts (seconds),
/// u64 flags, nested sockets.
#[neli_enum(serialized_type = "u16")]
pub enum NbdAttr {
    Unspec = 0,
    Index = 1,
    SizeBytes = 2,
    BlockSizeBytes = 3,
    Timeout = 4,
    ServerFlags = 5,
    ClientFlags = 6,
    Sockets = 7,
    DeadConnTimeout = 8,
    DeviceList = 9,
}
impl NlAttrType for NbdAttr {}

/// NBD_SOCK_ITEM inside NBD_ATTR_SOCKETS, NBD_SOCK_FD (u32) inside it.
#[neli_enum(serialized_type = "u16")]
pub enum NbdSockAttr {
    Unspec = 0,
    Item = 1,
}
impl NlAttrType for NbdSockAttr {}
#[neli_enum(serialized_type = "u16")]
pub enum NbdSockItemAttr {
    Unspec = 0,
    Fd = 1,
}
impl NlAttrType for NbdSockItemAttr {}

type Message = Genlmsghdr<NbdCmd, NbdAttr>;

/// What CONNECT needs besides the sockets.
#[derive(Debug, Clone, Copy)]
pub struct DeviceConfig {
    /// /dev/nbdN's N, or `None` for the first free device.
    pub index: Option<u32>,
    pub size_bytes: u64,
    pub block_size_bytes: u64,
    /// The server's NBD_FLAG_* transmission flags, as the handshake gave them.
    pub server_flags: u16,
    pub request_timeout: Duration,
    pub dead_connection_timeout: Duration,
}

/// A generic netlink socket bound to the nbd family.
pub struct Nbd {
    router: NlRouter,
    family: u16,
}

/// An errno from the driver, with the command it answered.
#[derive(Debug, thiserror::Error)]
#[error("{command}: {}", io::Error::from_raw_os_error(*errno))]
pub struct KernelError {
    pub command: &'static str,
    pub errno: i32,
}

impl Nbd {
    /// Opens the socket and resolves the family; loads the nbd module once
    /// (`modprobe nbd`) when the family is missing.
    pub fn open() -> Result<Nbd> {
        let (router, _) = NlRouter::connect(NlFamily::Generic, None, Groups::empty())
            .map_err(|e| anyhow!("cannot open a generic netlink socket: {e}"))?;
        let family = match router.resolve_genl_family(FAMILY) {
            Ok(f) => f,
            Err(_) => {
                let modprobe = std::process::Command::new("modprobe").arg("nbd").output();
                router.resolve_genl_family(FAMILY).map_err(|_| {
                    let tried = match modprobe {
                        Ok(o) if o.status.success() => "modprobe nbd ran".to_string(),
                        Ok(o) => format!("modprobe nbd: {}", String::from_utf8_lossy(&o.stderr).trim()),
                        Err(e) => format!("modprobe nbd: {e}"),
                    };
                    anyhow!(
                        "the kernel has no nbd driver (no generic netlink family \"nbd\"; {tried}): \
                         load it with `modprobe nbd` (package linux-modules-extra or the kernel's own modules)"
                    )
                })?
            }
        };
        Ok(Nbd { router, family })
    }

    /// NBD_CMD_CONNECT: the device takes `sockets`; returns its index.
    pub fn connect(
        &self,
        config: &DeviceConfig,
        sockets: &[BorrowedFd<'_>],
    ) -> Result<u32, KernelError> {
        let mut attrs = vec![
            attr(NbdAttr::SizeBytes, config.size_bytes),
            attr(NbdAttr::BlockSizeBytes, config.block_size_bytes),
            attr(NbdAttr::ServerFlags, u64::from(config.server_flags)),
            attr(NbdAttr::Timeout, config.request_timeout.as_secs().max(1)),
            attr(
                NbdAttr::DeadConnTimeout,
                config.dead_connection_timeout.as_secs(),
            ),
            // No client flags: the device is neither destroyed on
            // disconnect nor disconnected when its last opener closes it.
            attr(NbdAttr::ClientFlags, 0u64),
            sockets_attr(sockets),
        ];
        if let Some(i) = config.index {
            attrs.push(attr(NbdAttr::Index, i));
        }
        let replies = self.command("NBD_CMD_CONNECT", NbdCmd::Connect, attrs)?;
        replies
            .iter()
            .find_map(|m| {
                m.attrs()
                    .get_attr_handle()
                    .get_attr_payload_as::<u32>(NbdAttr::Index)
                    .ok()
            })
            .or(config.index)
            .ok_or(KernelError {
                command: "NBD_CMD_CONNECT (no index in the reply)",
                errno: libc::EPROTO,
            })
    }

    /// NBD_CMD_RECONFIGURE with one socket: the device puts it in a dead
    /// slot if it has one (see `socket_taken`).
    pub fn reconnect(&self, index: u32, socket: BorrowedFd<'_>) -> Result<(), KernelError> {
        let attrs = vec![attr(NbdAttr::Index, index), sockets_attr(&[socket])];
        self.command("NBD_CMD_RECONFIGURE", NbdCmd::Reconfigure, attrs)
            .map(drop)
    }

    /// NBD_CMD_DISCONNECT: NBD_CMD_DISC to the server on every connection,
    /// the sockets shut down; the device is unconfigured once its last
    /// opener (a mounted file system) lets go.
    pub fn disconnect(&self, index: u32) -> Result<(), KernelError> {
        self.command(
            "NBD_CMD_DISCONNECT",
            NbdCmd::Disconnect,
            vec![attr(NbdAttr::Index, index)],
        )
        .map(drop)
    }

    fn command(
        &self,
        name: &'static str,
        cmd: NbdCmd,
        attrs: Vec<Nlattr<NbdAttr, Buffer>>,
    ) -> Result<Vec<Message>, KernelError> {
        let to_error = |errno: i32| KernelError {
            command: name,
            errno,
        };
        let msg = GenlmsghdrBuilder::<NbdCmd, NbdAttr>::default()
            .cmd(cmd)
            .version(VERSION)
            .attrs(attrs.into_iter().collect::<GenlBuffer<_, _>>())
            .build()
            .map_err(|_| to_error(libc::EINVAL))?;
        let recv: NlRouterReceiverHandle<u16, Message> = self
            .router
            .send(self.family, NlmF::ACK, NlPayload::Payload(msg))
            .map_err(|e| to_error(router_errno(&e)))?;
        let mut replies = Vec::new();
        for m in recv {
            match m {
                Ok(m) => {
                    if let Some(p) = m.get_payload() {
                        replies.push(p.clone());
                    }
                }
                Err(e) => return Err(to_error(router_errno(&e))),
            }
        }
        Ok(replies)
    }
}

/// The errno a router error carries: the kernel's (negated in the
/// message), or EIO for a local failure.
fn router_errno<T, P>(e: &RouterError<T, P>) -> i32 {
    match e {
        RouterError::Nlmsgerr(m) => m.error().abs(),
        _ => libc::EIO,
    }
}

fn attr<P: neli::Size + neli::ToBytes>(kind: NbdAttr, payload: P) -> Nlattr<NbdAttr, Buffer> {
    NlattrBuilder::default()
        .nla_type(
            AttrTypeBuilder::default()
                .nla_type(kind)
                .build()
                .expect("type set"),
        )
        .nla_payload(payload)
        .build()
        .expect("type and payload set")
}

/// NBD_ATTR_SOCKETS { NBD_SOCK_ITEM { NBD_SOCK_FD fd } ... }.
fn sockets_attr(sockets: &[BorrowedFd<'_>]) -> Nlattr<NbdAttr, Buffer> {
    let mut list = attr(NbdAttr::Sockets, Vec::<u8>::new());
    for s in sockets {
        let fd = NlattrBuilder::default()
            .nla_type(
                AttrTypeBuilder::default()
                    .nla_type(NbdSockItemAttr::Fd)
                    .build()
                    .expect("type set"),
            )
            .nla_payload(s.as_raw_fd() as u32)
            .build()
            .expect("type and payload set");
        let item = NlattrBuilder::default()
            .nla_type(
                AttrTypeBuilder::default()
                    .nla_type(NbdSockAttr::Item)
                    .build()
                    .expect("type set"),
            )
            .nla_payload(Vec::<u8>::new())
            .build()
            .expect("type and payload set")
            .nest(&fd)
            .expect("a u32 serializes");
        list = list.nest(&item).expect("a nested attribute serializes");
    }
    list
}

/// Whether the driver took `socket` (CONNECT or RECONFIGURE): it sets a
/// taken socket's send timeout to the request timeout; a socket it dropped
/// keeps the 0 it was made with.
pub fn socket_taken(socket: BorrowedFd<'_>) -> io::Result<bool> {
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `tv`, a timeval.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&mut tv as *mut libc::timeval).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(tv.tv_sec != 0 || tv.tv_usec != 0)
}

/// NBD_CMD_LINK_DEAD events: a thread that joins "nbd_mc_group" and calls
/// `on_dead(index)` for each; it ends when `on_dead` returns false.
pub fn watch_link_dead(mut on_dead: impl FnMut(u32) -> bool + Send + 'static) -> Result<()> {
    let (router, mut events) = NlRouter::connect(NlFamily::Generic, None, Groups::empty())
        .map_err(|e| anyhow!("cannot open a generic netlink socket: {e}"))?;
    let group = router
        .resolve_nl_mcast_group(FAMILY, MULTICAST_GROUP)
        .map_err(|e| anyhow!("no multicast group {MULTICAST_GROUP:?} in family {FAMILY:?}: {e}"))?;
    if let Err(e) = router.add_mcast_membership(Groups::new_groups(&[group])) {
        bail!("cannot join the nbd multicast group: {e}");
    }
    std::thread::Builder::new()
        .name("nbd-link-dead".into())
        .spawn(move || {
            let _router = router; // its thread feeds `events`
            while let Some(m) = events.next_typed::<u16, Message>() {
                let Ok(m) = m else { continue };
                let Some(p) = m.get_payload() else { continue };
                if *p.cmd() != NbdCmd::LinkDead {
                    continue;
                }
                let index = p
                    .attrs()
                    .get_attr_handle()
                    .get_attr_payload_as::<u32>(NbdAttr::Index);
                if let Ok(index) = index {
                    if !on_dead(index) {
                        return;
                    }
                }
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use neli::ToBytes;
    use std::io::Cursor;

    /// The nested socket list as the driver parses it: NBD_ATTR_SOCKETS
    /// (7, nested) holding NBD_SOCK_ITEM (1, nested) holding NBD_SOCK_FD
    /// (1) = the descriptor, native-endian u32, each 4-byte aligned.
    #[test]
    fn sockets_nest_as_the_driver_expects() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = f.as_raw_fd() as u32;
        let a = sockets_attr(&[std::os::fd::AsFd::as_fd(&f)]);
        let mut c = Cursor::new(Vec::new());
        a.to_bytes(&mut c).unwrap();
        let b = c.into_inner();
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        assert_eq!(u16_at(0) as usize, 4 + 4 + 4 + 4); // len
        assert_eq!(u16_at(2), 7 | 1 << 15); // NBD_ATTR_SOCKETS, nested
        assert_eq!(u16_at(4), 4 + 8); // item len
        assert_eq!(u16_at(6), 1 | 1 << 15); // NBD_SOCK_ITEM, nested
        assert_eq!(u16_at(8), 8); // fd attr len
        assert_eq!(u16_at(10), 1); // NBD_SOCK_FD
        assert_eq!(u32::from_ne_bytes(b[12..16].try_into().unwrap()), fd);
    }

    #[test]
    fn a_fresh_socket_is_not_taken() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(!socket_taken(std::os::fd::AsFd::as_fd(&a)).unwrap());
    }
}
