//! Thin, checked wrappers over the socket calls the probes need (libc), so
//! the probes stay readable. Every fd is an `OwnedFd` (closed on drop).

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

pub fn domain_of(a: IpAddr) -> libc::c_int {
    if a.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    }
}

/// `socket(2)` with CLOEXEC (and NONBLOCK when asked).
pub fn socket(
    domain: libc::c_int,
    ty: libc::c_int,
    proto: libc::c_int,
    nonblock: bool,
) -> io::Result<OwnedFd> {
    let mut ty = ty | libc::SOCK_CLOEXEC;
    if nonblock {
        ty |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: plain syscall; the fd returned is owned by us from here on.
    let fd = check(unsafe { libc::socket(domain, ty, proto) })?;
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn to_raw(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn from_raw(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                sin.sin_addr.s_addr.to_ne_bytes().into(),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                sin6.sin6_addr.s6_addr.into(),
                u16::from_be(sin6.sin6_port),
                0,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

pub fn bind(fd: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
    let (ss, len) = to_raw(addr);
    // SAFETY: valid fd, address and length from to_raw.
    check(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    })?;
    Ok(())
}

/// `connect(2)`; on a non-blocking socket Err(EINPROGRESS) means "pending".
pub fn connect(fd: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
    let (ss, len) = to_raw(addr);
    // SAFETY: valid fd, address and length from to_raw.
    check(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    })?;
    Ok(())
}

pub fn send_to(fd: &OwnedFd, buf: &[u8], addr: SocketAddr) -> io::Result<usize> {
    let (ss, len) = to_raw(addr);
    // SAFETY: buf is valid for buf.len() bytes; address from to_raw.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            0,
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

pub fn send(fd: &OwnedFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            0,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

pub fn recv_from(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, Option<SocketAddr>)> {
    // SAFETY: sockaddr_storage is plain old data.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: buf valid for its length; ss/len describe a valid storage.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            libc::MSG_DONTWAIT,
            &mut ss as *mut _ as *mut libc::sockaddr,
            &mut len,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((n as usize, from_raw(&ss)))
}

/// Wait until `events` (POLLIN/POLLOUT) or `timeout`; Ok(false) on timeout.
pub fn wait(fd: &OwnedFd, events: libc::c_short, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    loop {
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut p, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(rc > 0);
    }
}

/// The pending error of a socket (`SO_ERROR`), 0 when none.
pub fn so_error(fd: &OwnedFd) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v/len describe a valid int buffer.
    check(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(v)
}
