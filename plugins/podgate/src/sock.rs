//! The socket calls the probes need, over `nix` (no `unsafe` here), with
//! `io::Error`s so the probes' wording of errno stays the standard one.
//! Every fd is an `OwnedFd` (closed on drop).

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    self, sockopt, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrStorage,
};
use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

pub use nix::poll::PollFlags as Events;
pub use nix::sys::socket::{SockProtocol as Protocol, SockType as Type};

pub fn domain_of(a: IpAddr) -> AddressFamily {
    if a.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

/// `socket(2)` with CLOEXEC (and NONBLOCK when asked).
pub fn socket(
    domain: AddressFamily,
    ty: SockType,
    proto: Option<SockProtocol>,
    nonblock: bool,
) -> io::Result<OwnedFd> {
    let mut flags = SockFlag::SOCK_CLOEXEC;
    if nonblock {
        flags |= SockFlag::SOCK_NONBLOCK;
    }
    Ok(socket::socket(domain, ty, flags, proto)?)
}

pub fn bind(fd: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
    Ok(socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?)
}

/// `connect(2)`; on a non-blocking socket Err(EINPROGRESS) means "pending".
pub fn connect(fd: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
    Ok(socket::connect(
        fd.as_raw_fd(),
        &SockaddrStorage::from(addr),
    )?)
}

pub fn send_to(fd: &OwnedFd, buf: &[u8], addr: SocketAddr) -> io::Result<usize> {
    let to = SockaddrStorage::from(addr);
    Ok(socket::sendto(fd.as_raw_fd(), buf, &to, MsgFlags::empty())?)
}

pub fn send(fd: &OwnedFd, buf: &[u8]) -> io::Result<usize> {
    Ok(socket::send(fd.as_raw_fd(), buf, MsgFlags::empty())?)
}

fn socket_addr(ss: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = ss.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*v4)));
    }
    ss.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(SocketAddrV6::new(v6.ip(), v6.port(), 0, v6.scope_id())))
}

/// One datagram from a non-blocking socket (WouldBlock when none is queued)
/// and where it came from.
pub fn recv_from(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, Option<SocketAddr>)> {
    let (n, from) = socket::recvfrom::<SockaddrStorage>(fd.as_raw_fd(), buf)?;
    Ok((n, from.as_ref().and_then(socket_addr)))
}

/// Wait until `events` (POLLIN/POLLOUT) or `timeout`; Ok(false) on timeout.
pub fn wait(fd: &OwnedFd, events: PollFlags, timeout: Duration) -> io::Result<bool> {
    let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    loop {
        let mut fds = [PollFd::new(fd.as_fd(), events)];
        match nix::poll::poll(&mut fds, ms) {
            Ok(n) => return Ok(n > 0),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The pending error of a socket (`SO_ERROR`), 0 when none.
pub fn so_error(fd: &OwnedFd) -> io::Result<i32> {
    Ok(socket::getsockopt(fd, sockopt::SocketError)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn datagrams_round_trip_with_their_source() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = peer.local_addr().unwrap();
        let fd = socket(domain_of(to.ip()), Type::Datagram, None, true).unwrap();
        bind(&fd, "127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(send_to(&fd, b"ping", to).unwrap(), 4);
        let mut buf = [0u8; 16];
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"ping");
        peer.send_to(b"pong", from).unwrap();
        assert!(wait(&fd, Events::POLLIN, Duration::from_secs(5)).unwrap());
        let (n, src) = recv_from(&fd, &mut buf).unwrap();
        assert_eq!((&buf[..n], src), (&b"pong"[..], Some(to)));
        let e = recv_from(&fd, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(so_error(&fd).unwrap(), 0);
    }
}
