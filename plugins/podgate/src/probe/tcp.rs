//! TCP connect probe: a handshake or a RST both prove the path works.

use super::{rtt_ms, send_error, Outcome};
use crate::sock;
use podgate_kit::netns::NetNs;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

pub fn connect(ns: &NetNs, dst: SocketAddr, bind: Option<IpAddr>, timeout: Duration) -> Outcome {
    let fd = match super::open_socket(ns, dst.ip(), sock::Type::Stream, bind) {
        Ok(fd) => fd,
        Err(outcome) => return outcome,
    };
    let start = Instant::now();
    match sock::connect(&fd, dst) {
        Ok(()) => {
            return Outcome::Answered {
                rtt_ms: rtt_ms(start.elapsed()),
                detail: format!("tcp port {} open", dst.port()),
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return connect_error(&e, dst),
    }
    match sock::wait(&fd, sock::Events::POLLOUT, timeout) {
        Ok(false) => Outcome::silent(timeout),
        Err(e) => Outcome::Error {
            detail: format!("poll: {e}"),
        },
        Ok(true) => match sock::so_error(&fd) {
            Ok(0) => Outcome::Answered {
                rtt_ms: rtt_ms(start.elapsed()),
                detail: format!("tcp port {} open", dst.port()),
            },
            Ok(errno) => connect_error(&std::io::Error::from_raw_os_error(errno), dst),
            Err(e) => Outcome::Error {
                detail: format!("SO_ERROR: {e}"),
            },
        },
    }
}

fn connect_error(e: &std::io::Error, dst: SocketAddr) -> Outcome {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => Outcome::Refused {
            detail: format!(
                "connection refused on port {}: {} is reachable, nothing listens there",
                dst.port(),
                dst.ip()
            ),
        },
        Some(libc::ETIMEDOUT) => Outcome::Silent { timeout_ms: 0 },
        _ => send_error(e, dst.ip()),
    }
}
