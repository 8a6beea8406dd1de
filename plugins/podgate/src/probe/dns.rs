//! One DNS question over UDP from inside a netns, and the wire format for it
//! (query building and answer parsing are pure and tested here).

use super::{random_u16, rtt_ms, send_error, Outcome};
use crate::sock;
use podgate_kit::netns::NetNs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;

/// A recursive query for `name` (type A or AAAA).
pub fn query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>, String> {
    let mut q = Vec::with_capacity(32 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    let name = name.trim_end_matches('.');
    if name.is_empty() || name.len() > 253 {
        return Err(format!("{name:?} is not a DNS name"));
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("{name:?}: empty or over-long label"));
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    Ok(q)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub rcode: u8,
    pub addrs: Vec<IpAddr>,
    /// Records of other types (CNAME chain, ...).
    pub others: usize,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Skip a (possibly compressed) name; the offset after it.
fn skip_name(b: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *b.get(at)?;
        if len & 0xc0 == 0xc0 {
            return Some(at + 2);
        }
        if len == 0 {
            return Some(at + 1);
        }
        at += 1 + usize::from(len);
    }
}

/// Parse an answer to query `id`; None if it is not one.
pub fn parse(b: &[u8], id: u16) -> Option<Answer> {
    if be16(b, 0)? != id || b.get(2)? & 0x80 == 0 {
        return None;
    }
    let rcode = b.get(3)? & 0x0f;
    let qd = be16(b, 4)?;
    let an = be16(b, 6)?;
    let mut at = 12;
    for _ in 0..qd {
        at = skip_name(b, at)? + 4;
    }
    let mut ans = Answer {
        rcode,
        addrs: Vec::new(),
        others: 0,
    };
    for _ in 0..an {
        at = skip_name(b, at)?;
        let ty = be16(b, at)?;
        let len = usize::from(be16(b, at + 8)?);
        let data = b.get(at + 10..at + 10 + len)?;
        match (ty, len) {
            (TYPE_A, 4) => ans
                .addrs
                .push(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(data).ok()?))),
            (TYPE_AAAA, 16) => ans
                .addrs
                .push(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(data).ok()?))),
            _ => ans.others += 1,
        }
        at += 10 + len;
    }
    Some(ans)
}

pub fn rcode_name(r: u8) -> &'static str {
    match r {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        _ => "error",
    }
}

/// The first `nameserver` of a resolv.conf text.
pub fn nameserver_of(resolv: &str) -> Option<IpAddr> {
    resolv.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some("nameserver"))
            .then(|| it.next())
            .flatten()
            .and_then(|a| a.split('%').next())
            .and_then(|a| a.parse().ok())
    })
}

/// Largest `resolv.conf` read (glibc reads a few KiB of it).
const MAX_RESOLV_CONF: u64 = 64 << 10;

/// The first `nameserver` of the file at `path`: None when it does not
/// exist or names none; an error when it is not a regular file of at
/// most 64 KiB (a FIFO, `/dev/zero`: never read, so `--dns` cannot hang
/// or fill memory on a pod's file) or, without `follow`, is a link (in a
/// pod's root an absolute link would resolve in the node's).
pub fn nameserver_in(path: &Path, follow: bool) -> Result<Option<IpAddr>, std::io::Error> {
    match podgate_kit::dir::read_regular(path, MAX_RESOLV_CONF, follow) {
        Ok(b) => Ok(nameserver_of(&String::from_utf8_lossy(&b))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn ask(
    ns: &NetNs,
    server: SocketAddr,
    name: &str,
    bind: Option<IpAddr>,
    timeout: Duration,
) -> Outcome {
    let id = random_u16();
    let q = match query(id, name, TYPE_A) {
        Ok(q) => q,
        Err(detail) => return Outcome::Error { detail },
    };
    let fd = match super::open_socket(ns, server.ip(), sock::Type::Datagram, bind) {
        Ok(fd) => fd,
        Err(outcome) => return outcome,
    };
    if let Err(e) = sock::connect(&fd, server) {
        return send_error(&e, server.ip());
    }
    let start = Instant::now();
    if let Err(e) = sock::send(&fd, &q) {
        return send_error(&e, server.ip());
    }
    let deadline = start + timeout;
    let mut buf = vec![0u8; 4096];
    loop {
        if let Err(outcome) = super::await_readable(&fd, deadline, timeout) {
            return outcome;
        }
        let n = match sock::recv_from(&fd, &mut buf) {
            Ok((n, _)) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                return Outcome::Refused {
                    detail: format!("port unreachable: nothing serves DNS on {server}"),
                }
            }
            Err(e) => return send_error(&e, server.ip()),
        };
        let Some(a) = parse(buf.get(..n).unwrap_or_default(), id) else {
            continue;
        };
        if a.rcode != 0 {
            return Outcome::BadAnswer {
                detail: format!("{name}: {}", rcode_name(a.rcode)),
            };
        }
        if a.addrs.is_empty() {
            return Outcome::BadAnswer {
                detail: format!("{name}: no A record"),
            };
        }
        let list: Vec<String> = a.addrs.iter().map(ToString::to_string).collect();
        return Outcome::Answered {
            rtt_ms: rtt_ms(start.elapsed()),
            detail: format!("{name} -> {}", list.join(", ")),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_answer_round_trip() {
        let q = query(0xbeef, "kube-dns.kube-system.svc.cluster.local.", TYPE_A).unwrap();
        assert_eq!(&q[..2], &[0xbe, 0xef]);
        assert_eq!(q[12], 8);
        // Answer: the query with QR set, ANCOUNT 1, a compressed-name A record.
        let mut a = q.clone();
        a[2] |= 0x80;
        a[7] = 1;
        a.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 96, 0, 10]);
        let got = parse(&a, 0xbeef).unwrap();
        assert_eq!(got.rcode, 0);
        assert_eq!(got.addrs, vec!["10.96.0.10".parse::<IpAddr>().unwrap()]);
        assert!(parse(&a, 0xbeee).is_none());
        let mut nx = q;
        nx[2] |= 0x80;
        nx[3] = 3;
        assert_eq!(parse(&nx, 0xbeef).unwrap().rcode, 3);
        assert!(query(1, "", TYPE_A).is_err());
        assert!(query(1, &"a".repeat(64), TYPE_A).is_err());
    }

    #[test]
    fn the_first_nameserver_of_resolv_conf_is_probed() {
        let r = "search default.svc.cluster.local\nnameserver 10.96.0.10\nnameserver 1.1.1.1\n";
        assert_eq!(nameserver_of(r), "10.96.0.10".parse().ok());
        assert_eq!(nameserver_of("# none\n"), None);
    }
}
