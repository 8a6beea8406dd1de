//! ICMP echo from inside a netns over a raw socket (root), falling back to an
//! unprivileged ping socket. Replies are matched on identifier, sequence and
//! source; ICMP errors quoting our request are reported as unreachable.

use super::{random_u16, rtt_ms, send_error, Outcome};
use crate::sock;
use nix::sys::socket::AddressFamily;
use podgate_kit::netns::NetNs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

const PAYLOAD: &[u8] = b"podgate-diagnose";
const SEQ: u16 = 1;

/// Internet checksum (RFC 1071).
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        let hi = u32::from(c.first().copied().unwrap_or(0));
        let lo = u32::from(c.get(1).copied().unwrap_or(0));
        sum += (hi << 8) | lo;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An echo request (type 8 for IPv4, 128 for IPv6; the kernel fills the
/// ICMPv6 checksum).
pub fn echo_request(v6: bool, id: u16, seq: u16) -> Vec<u8> {
    let mut p = vec![if v6 { 128 } else { 8 }, 0, 0, 0];
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(PAYLOAD);
    if !v6 {
        let c = checksum(&p).to_be_bytes();
        if let Some(slot) = p.get_mut(2..4) {
            slot.copy_from_slice(&c);
        }
    }
    p
}

/// What a received ICMP message means for our request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Reply,
    Error { kind: u8, code: u8 },
    Other,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Classify an ICMP message (starting at the ICMP header). `match_id` is off
/// for ping sockets, where the kernel picks the identifier.
pub fn classify(icmp: &[u8], v6: bool, id: u16, seq: u16, match_id: bool, dst: IpAddr) -> Seen {
    let (Some(&kind), Some(&code)) = (icmp.first(), icmp.get(1)) else {
        return Seen::Other;
    };
    let ours = |b: &[u8], at: usize| {
        (!match_id || be16(b, at + 4) == Some(id)) && be16(b, at + 6) == Some(seq)
    };
    let (reply, errors, request) = if v6 {
        (129u8, [1u8, 3u8], 128u8)
    } else {
        (0u8, [3u8, 11u8], 8u8)
    };
    if kind == reply {
        return if ours(icmp, 0) {
            Seen::Reply
        } else {
            Seen::Other
        };
    }
    if !errors.contains(&kind) {
        return Seen::Other;
    }
    // The error quotes our packet: its IP header, then (at least) 8 bytes of ICMP.
    let Some(inner) = icmp.get(8..) else {
        return Seen::Other;
    };
    let (inner_dst, at) = if v6 {
        let Some(d) = inner.get(24..40) else {
            return Seen::Other;
        };
        let mut a = [0u8; 16];
        a.copy_from_slice(d);
        if inner.get(6) != Some(&58) {
            return Seen::Other;
        }
        (IpAddr::V6(Ipv6Addr::from(a)), 40)
    } else {
        let ihl = usize::from(inner.first().copied().unwrap_or(0) & 0x0f) * 4;
        let Some(d) = inner.get(16..20).and_then(|d| <[u8; 4]>::try_from(d).ok()) else {
            return Seen::Other;
        };
        if inner.get(9) != Some(&1) {
            return Seen::Other;
        }
        (IpAddr::V4(Ipv4Addr::from(d)), ihl)
    };
    if inner_dst == dst && inner.get(at) == Some(&request) && ours(inner, at) {
        Seen::Error { kind, code }
    } else {
        Seen::Other
    }
}

fn error_text(v6: bool, kind: u8, code: u8, from: Option<IpAddr>) -> String {
    let what = match (v6, kind, code) {
        (false, 3, 0) | (true, 1, 0) => "network unreachable",
        (false, 3, 1) | (true, 1, 3) => "host unreachable",
        (false, 3, 3) | (true, 1, 4) => "port unreachable",
        (false, 3, 9 | 10 | 13) | (true, 1, 1) => "administratively prohibited",
        (false, 11, _) | (true, 3, _) => "time exceeded (routing loop?)",
        _ => "destination unreachable",
    };
    match from {
        Some(f) => format!("{what} (ICMP type {kind} code {code} from {f})"),
        None => format!("{what} (ICMP type {kind} code {code})"),
    }
}

fn open(ns: &NetNs, v6: bool) -> Result<(OwnedFd, bool), String> {
    let (dom, proto) = if v6 {
        (AddressFamily::Inet6, sock::Protocol::IcmpV6)
    } else {
        (AddressFamily::Inet, sock::Protocol::Icmp)
    };
    let made = ns.run(
        || match sock::socket(dom, sock::Type::Raw, Some(proto), true) {
            Ok(fd) => Ok((fd, true)),
            Err(_) => {
                sock::socket(dom, sock::Type::Datagram, Some(proto), true).map(|fd| (fd, false))
            }
        },
    );
    match made {
        Ok(Ok(x)) => Ok(x),
        Ok(Err(e)) => Err(format!(
            "no ICMP socket (raw needs CAP_NET_RAW; ping sockets need net.ipv4.ping_group_range): {e}"
        )),
        Err(e) => Err(e.to_string()),
    }
}

pub fn echo(ns: &NetNs, dst: IpAddr, bind: Option<IpAddr>, timeout: Duration) -> Outcome {
    let v6 = dst.is_ipv6();
    let (fd, raw) = match open(ns, v6) {
        Ok(x) => x,
        Err(detail) => return Outcome::Error { detail },
    };
    if let Err(outcome) = super::bind_to(&fd, bind, dst) {
        return outcome;
    }
    let id = random_u16();
    let pkt = echo_request(v6, id, SEQ);
    let start = Instant::now();
    if let Err(e) = sock::send_to(&fd, &pkt, SocketAddr::new(dst, 0)) {
        return send_error(&e, dst);
    }
    let deadline = start + timeout;
    let mut buf = vec![0u8; 2048];
    loop {
        if let Err(outcome) = super::await_readable(&fd, deadline, timeout) {
            return outcome;
        }
        loop {
            let (n, from) = match sock::recv_from(&fd, &mut buf) {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return send_error(&e, dst),
            };
            let msg = buf.get(..n).unwrap_or_default();
            // Raw IPv4 sockets deliver the IP header too.
            let icmp = if raw && !v6 {
                let ihl = usize::from(msg.first().copied().unwrap_or(0) & 0x0f) * 4;
                msg.get(ihl..).unwrap_or_default()
            } else {
                msg
            };
            let from_ip = from.map(|f| f.ip());
            match classify(icmp, v6, id, SEQ, raw, dst) {
                Seen::Reply if from_ip == Some(dst) => {
                    return Outcome::Answered {
                        rtt_ms: rtt_ms(start.elapsed()),
                        detail: String::new(),
                    }
                }
                Seen::Error { kind, code } => {
                    return Outcome::Unreachable {
                        detail: error_text(v6, kind, code, from_ip),
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_a_request_verifies() {
        let p = echo_request(false, 0x1234, 1);
        assert_eq!(checksum(&p), 0);
        assert_eq!(p[0], 8);
        assert_eq!(echo_request(true, 1, 1)[0], 128);
    }

    #[test]
    fn classify_replies_and_quoted_errors() {
        let dst: IpAddr = "10.22.0.3".parse().unwrap();
        let mut reply = echo_request(false, 7, 1);
        reply[0] = 0;
        assert_eq!(classify(&reply, false, 7, 1, true, dst), Seen::Reply);
        assert_eq!(classify(&reply, false, 8, 1, true, dst), Seen::Other);
        assert_eq!(classify(&reply, false, 8, 1, false, dst), Seen::Reply);

        // host unreachable quoting IP(20 bytes, proto 1, dst) + our request
        let mut err = vec![3u8, 1, 0, 0, 0, 0, 0, 0];
        let mut ip = vec![0x45u8, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0, 10, 22, 0, 9];
        ip.extend_from_slice(&[10, 22, 0, 3]);
        err.extend_from_slice(&ip);
        err.extend_from_slice(&echo_request(false, 7, 1));
        assert_eq!(
            classify(&err, false, 7, 1, true, dst),
            Seen::Error { kind: 3, code: 1 }
        );
        let other: IpAddr = "10.22.0.4".parse().unwrap();
        assert_eq!(classify(&err, false, 7, 1, true, other), Seen::Other);
    }
}
