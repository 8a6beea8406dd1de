//! UDP sockets bound to the IKE ports (500, 4500) on the node, from
//! `/proc/thread-self/net/udp{,6}` (the calling thread's netns). For the
//! report only: a bound IKE port says an IKE daemon runs, not that it works.

use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

pub const IKE_PORTS: [u16; 2] = [500, 4500];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UdpSocket {
    pub local: SocketAddr,
    pub uid: u32,
    pub inode: u64,
}

/// UDP sockets bound to port 500 or 4500 (IPv4 and IPv6). A missing table
/// (IPv6 disabled) counts as empty.
pub fn ike_sockets() -> std::io::Result<Vec<UdpSocket>> {
    let mut out = Vec::new();
    for table in ["udp", "udp6"] {
        let path = Path::new("/proc/thread-self/net").join(table);
        match std::fs::read_to_string(&path) {
            Ok(text) => out.extend(
                parse_proc_udp(&text)
                    .into_iter()
                    .filter(|s| IKE_PORTS.contains(&s.local.port())),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Parse the table format of `/proc/net/udp` and `/proc/net/udp6`; lines that
/// do not parse are skipped.
pub fn parse_proc_udp(text: &str) -> Vec<UdpSocket> {
    text.lines().skip(1).filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<UdpSocket> {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
    let f: Vec<&str> = line.split_whitespace().collect();
    let (addr, port) = f.get(1)?.split_once(':')?;
    Some(UdpSocket {
        local: SocketAddr::new(parse_addr(addr)?, u16::from_str_radix(port, 16).ok()?),
        uid: f.get(7)?.parse().ok()?,
        inode: f.get(9)?.parse().ok()?,
    })
}

/// The kernel prints each 32-bit word of the address in host byte order.
fn parse_addr(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut b = [0u8; 16];
            for (i, chunk) in b.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
#[cfg(target_endian = "little")]
mod tests {
    use super::*;

    #[test]
    fn parses_v4_and_v6_tables() {
        let v4 = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
  105: 00000000:01F4 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 31337 2 0000000000000000 0\n\
  106: 0100007F:1194 00000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 4242 2 0000000000000000 0\n\
  107: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 0\n\
  garbage line\n";
        let s = parse_proc_udp(v4);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].local, "0.0.0.0:500".parse().unwrap());
        assert_eq!(s[0].inode, 31337);
        assert_eq!(s[1].local, "127.0.0.1:4500".parse().unwrap());
        assert_eq!(s[1].uid, 101);
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
  1: 00000000000000000000000001000000:01F4 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 777 2 0000000000000000 0\n\
  2: 000080FE00000000FF020000AA0000FE:1194 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 778 2 0000000000000000 0\n";
        let s = parse_proc_udp(v6);
        assert_eq!(s[0].local, "[::1]:500".parse().unwrap());
        assert_eq!(s[1].local, "[fe80::2ff:fe00:aa]:4500".parse().unwrap());
    }

    #[test]
    fn reads_live_tables() {
        // Whatever is bound here, reading must work.
        assert!(ike_sockets().is_ok());
    }
}
