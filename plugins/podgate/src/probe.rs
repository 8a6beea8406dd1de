//! Probes from inside a netns: ICMP echo, TCP connect, a UDP DNS query.
//! Each socket is created on a thread that joined the netns (`NetNs::run`), so
//! it stays bound to that netns; it is then driven from the caller's thread.
//! Only the address given is contacted, once, with a short timeout.

pub mod dns;
pub mod icmp;
pub mod tcp;

use crate::sock;
use podgate_kit::netns::NetNs;
use serde::Serialize;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::time::Duration;

/// What one probe saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum Outcome {
    /// Echo reply, TCP handshake, DNS answer with records.
    #[serde(rename_all = "camelCase")]
    Answered { rtt_ms: f64, detail: String },
    /// The host answered "no" (TCP RST, ICMP port unreachable): the path works.
    Refused { detail: String },
    /// A DNS server answered, but with an error or no records.
    BadAnswer { detail: String },
    /// A router or the local stack said no (ICMP unreachable, no route, EPERM).
    Unreachable { detail: String },
    /// Nothing came back before the timeout.
    #[serde(rename_all = "camelCase")]
    Silent { timeout_ms: u64 },
    /// The probe could not be made (socket error, bad bind address).
    Error { detail: String },
}

impl Outcome {
    /// Something on the far side answered (whatever it said).
    pub fn reached(&self) -> bool {
        matches!(
            self,
            Outcome::Answered { .. } | Outcome::Refused { .. } | Outcome::BadAnswer { .. }
        )
    }

    pub fn silent(timeout: Duration) -> Outcome {
        Outcome::Silent {
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Outcome::Answered { rtt_ms, detail } if detail.is_empty() => {
                format!("answered in {rtt_ms:.2} ms")
            }
            Outcome::Answered { rtt_ms, detail } => {
                format!("answered in {rtt_ms:.2} ms ({detail})")
            }
            Outcome::Refused { detail } => format!("refused: {detail}"),
            Outcome::BadAnswer { detail } => format!("answered: {detail}"),
            Outcome::Unreachable { detail } => format!("unreachable: {detail}"),
            Outcome::Silent { timeout_ms } => format!("silent (no answer in {timeout_ms} ms)"),
            Outcome::Error { detail } => format!("not probed: {detail}"),
        }
    }
}

/// Block until `fd` has something to read before `deadline`. `Err` carries
/// the outcome to report instead: silent after `timeout`, or a poll error.
pub(crate) fn await_readable(
    fd: &std::os::fd::OwnedFd,
    deadline: std::time::Instant,
    timeout: Duration,
) -> Result<(), Outcome> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return Err(Outcome::silent(timeout));
    }
    match crate::sock::wait(fd, crate::sock::Events::POLLIN, left) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Outcome::silent(timeout)),
        Err(e) => Err(Outcome::Error {
            detail: format!("poll: {e}"),
        }),
    }
}

pub(crate) fn rtt_ms(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// What a failed send/connect means for the probe.
/// A non-blocking socket of `ty` for `dst`, made inside `ns` (so it routes
/// there) and bound to `bind` when given.
pub(crate) fn open_socket(
    ns: &NetNs,
    dst: IpAddr,
    ty: sock::Type,
    bind: Option<IpAddr>,
) -> Result<OwnedFd, Outcome> {
    let fd = match ns.run(|| sock::socket(sock::domain_of(dst), ty, None, true)) {
        Ok(Ok(fd)) => fd,
        Ok(Err(e)) => {
            return Err(Outcome::Error {
                detail: format!("socket: {e}"),
            })
        }
        Err(e) => {
            return Err(Outcome::Error {
                detail: e.to_string(),
            })
        }
    };
    bind_to(&fd, bind, dst)?;
    Ok(fd)
}

/// Bind to `bind` (a source address) when given.
pub(crate) fn bind_to(fd: &OwnedFd, bind: Option<IpAddr>, dst: IpAddr) -> Result<(), Outcome> {
    if let Some(b) = bind {
        sock::bind(fd, SocketAddr::new(b, 0)).map_err(|e| send_error(&e, dst))?;
    }
    Ok(())
}

pub(crate) fn send_error(e: &io::Error, dst: IpAddr) -> Outcome {
    match e.raw_os_error() {
        Some(libc::ENETUNREACH) => Outcome::Unreachable {
            detail: format!("no route to {dst} in this netns"),
        },
        Some(libc::EHOSTUNREACH) => Outcome::Unreachable {
            detail: format!("host {dst} unreachable"),
        },
        Some(libc::EPERM) | Some(libc::EACCES) => Outcome::Unreachable {
            detail: "the local firewall refused to send (EPERM)".into(),
        },
        Some(libc::EADDRNOTAVAIL) => Outcome::Error {
            detail: "the source address is not an address of this netns".into(),
        },
        _ => Outcome::Error {
            detail: e.to_string(),
        },
    }
}

/// A request ID that differs per run (kernel CSPRNG, else the clock).
pub(crate) fn random_u16() -> u16 {
    use std::io::Read;
    let mut b = [0u8; 2];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u16::from_ne_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ std::process::id()) as u16
}
