//! rtnetlink's wire format, exactly as much of it as the kit uses: the fixed
//! headers of routes (`struct rtmsg`, `linux/rtnetlink.h`), rules (`struct
//! fib_rule_hdr`, `linux/fib_rules.h`), links (`struct ifinfomsg`,
//! `linux/rtnetlink.h`) and addresses (`struct ifaddrmsg`, `linux/if_addr.h`),
//! and the numbers of the attributes read or written. Requests are written
//! with the shared [`MsgWriter`]; answers are read header first, then only the
//! attributes asked for ([`Attrs`] skips everything else by its length: link
//! stats, af_spec, link info, route metrics and cache info are never decoded).
//! All integers are in host byte order.

use super::msg::{Attrs, MsgWriter};
use crate::error::ParseError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub(crate) const RTM_NEWLINK: u16 = 16;
pub(crate) const RTM_GETLINK: u16 = 18;
pub(crate) const RTM_NEWADDR: u16 = 20;
pub(crate) const RTM_GETADDR: u16 = 22;
pub(crate) const RTM_NEWROUTE: u16 = 24;
pub(crate) const RTM_DELROUTE: u16 = 25;
pub(crate) const RTM_GETROUTE: u16 = 26;
pub(crate) const RTM_NEWRULE: u16 = 32;
pub(crate) const RTM_DELRULE: u16 = 33;
pub(crate) const RTM_GETRULE: u16 = 34;

pub(crate) const AF_INET: u8 = 2;
pub(crate) const AF_INET6: u8 = 10;

/// `enum rtattr_type_t`.
pub(crate) const RTA_DST: u16 = 1;
pub(crate) const RTA_OIF: u16 = 4;
pub(crate) const RTA_GATEWAY: u16 = 5;
pub(crate) const RTA_PRIORITY: u16 = 6;
pub(crate) const RTA_PREFSRC: u16 = 7;
pub(crate) const RTA_MULTIPATH: u16 = 9;
pub(crate) const RTA_TABLE: u16 = 15;
/// `rtm_table` of a table id that does not fit a byte (RTA_TABLE carries it).
pub(crate) const RT_TABLE_UNSPEC: u8 = 0;
pub(crate) const RTN_UNICAST: u8 = 1;
pub(crate) const RT_SCOPE_UNIVERSE: u8 = 0;
pub(crate) const RT_SCOPE_LINK: u8 = 253;
/// A delete's scope: "no-where" matches a route of any scope.
pub(crate) const RT_SCOPE_NOWHERE: u8 = 255;
/// `rtm_flags`: the gateway is on the link even without a connected route.
pub(crate) const RTNH_F_ONLINK: u32 = 4;

/// `linux/fib_rules.h`.
pub(crate) const FRA_DST: u16 = 1;
pub(crate) const FRA_SRC: u16 = 2;
pub(crate) const FRA_IIFNAME: u16 = 3;
pub(crate) const FRA_PRIORITY: u16 = 6;
pub(crate) const FRA_SUPPRESS_PREFIXLEN: u16 = 14;
pub(crate) const FRA_TABLE: u16 = 15;
pub(crate) const FRA_PROTOCOL: u16 = 21;
pub(crate) const FRA_GOTO: u16 = 4;
pub(crate) const FRA_FWMARK: u16 = 10;
pub(crate) const FRA_FLOW: u16 = 11;
pub(crate) const FRA_TUN_ID: u16 = 12;
pub(crate) const FRA_SUPPRESS_IFGROUP: u16 = 13;
pub(crate) const FRA_FWMASK: u16 = 16;
pub(crate) const FRA_OIFNAME: u16 = 17;
pub(crate) const FRA_PAD: u16 = 18;
pub(crate) const FRA_L3MDEV: u16 = 19;
pub(crate) const FRA_UID_RANGE: u16 = 20;
pub(crate) const FRA_IP_PROTO: u16 = 22;
pub(crate) const FRA_SPORT_RANGE: u16 = 23;
pub(crate) const FRA_DPORT_RANGE: u16 = 24;
pub(crate) const FRA_SPORT_MASK: u16 = 28;
pub(crate) const FRA_DPORT_MASK: u16 = 29;
pub(crate) const FR_ACT_UNSPEC: u8 = 0;
pub(crate) const FR_ACT_TO_TBL: u8 = 1;
pub(crate) const FR_ACT_GOTO: u8 = 2;
pub(crate) const FR_ACT_NOP: u8 = 3;
pub(crate) const FR_ACT_BLACKHOLE: u8 = 6;
pub(crate) const FR_ACT_UNREACHABLE: u8 = 7;
pub(crate) const FR_ACT_PROHIBIT: u8 = 8;
/// `fib_rule_hdr.flags`: `not`, the selectors inverted.
pub(crate) const FIB_RULE_INVERT: u32 = 2;

/// `linux/if_link.h`, `linux/if_addr.h`.
pub(crate) const IFLA_IFNAME: u16 = 3;
pub(crate) const IFA_ADDRESS: u16 = 1;
pub(crate) const IFA_LOCAL: u16 = 2;

/// The 12-byte header `rtmsg` and `fib_rule_hdr` share (the kernel keeps
/// the rule header in the route header's shape): eight one-byte fields, then
/// 32-bit flags. Route and rule headers name the bytes.
struct Head12 {
    bytes: [u8; 8],
    flags: u32,
}

impl Head12 {
    fn write(&self, w: &mut MsgWriter) {
        w.buf.extend_from_slice(&self.bytes);
        w.buf.extend_from_slice(&self.flags.to_ne_bytes());
    }

    /// The header and the attributes that follow it (`what` names it in errors).
    fn parse<'a>(payload: &'a [u8], what: &'static str) -> Result<(Head12, Attrs<'a>), ParseError> {
        let (h, rest) = fixed::<12>(payload, what)?;
        let [b0, b1, b2, b3, b4, b5, b6, b7, f0, f1, f2, f3] = h;
        let head = Head12 {
            bytes: [b0, b1, b2, b3, b4, b5, b6, b7],
            flags: u32::from_ne_bytes([f0, f1, f2, f3]),
        };
        Ok((head, attrs(rest, what)?))
    }
}

/// `struct rtmsg`, the header of every route message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RtMsg {
    pub(crate) family: u8,
    pub(crate) dst_len: u8,
    pub(crate) src_len: u8,
    pub(crate) tos: u8,
    pub(crate) table: u8,
    pub(crate) protocol: u8,
    pub(crate) scope: u8,
    pub(crate) kind: u8,
    pub(crate) flags: u32,
}

impl RtMsg {
    pub(crate) fn write(&self, w: &mut MsgWriter) {
        let m = self;
        let bytes = [
            m.family, m.dst_len, m.src_len, m.tos, m.table, m.protocol, m.scope, m.kind,
        ];
        Head12 {
            bytes,
            flags: m.flags,
        }
        .write(w);
    }

    /// The header and the attributes that follow it.
    pub(crate) fn parse(payload: &[u8]) -> Result<(RtMsg, Attrs<'_>), ParseError> {
        let (Head12 { bytes, flags }, attrs) = Head12::parse(payload, "rtmsg")?;
        let [family, dst_len, src_len, tos, table, protocol, scope, kind] = bytes;
        let m = RtMsg {
            family,
            dst_len,
            src_len,
            tos,
            table,
            protocol,
            scope,
            kind,
            flags,
        };
        Ok((m, attrs))
    }
}

/// `struct fib_rule_hdr`, the header of every rule message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FibRuleHdr {
    pub(crate) family: u8,
    pub(crate) dst_len: u8,
    pub(crate) src_len: u8,
    pub(crate) tos: u8,
    pub(crate) table: u8,
    pub(crate) action: u8,
    pub(crate) flags: u32,
}

impl FibRuleHdr {
    pub(crate) fn write(&self, w: &mut MsgWriter) {
        let h = self;
        // Bytes 5 and 6 are res1 and res2.
        let bytes = [
            h.family, h.dst_len, h.src_len, h.tos, h.table, 0, 0, h.action,
        ];
        Head12 {
            bytes,
            flags: h.flags,
        }
        .write(w);
    }

    pub(crate) fn parse(payload: &[u8]) -> Result<(FibRuleHdr, Attrs<'_>), ParseError> {
        let (Head12 { bytes, flags }, attrs) = Head12::parse(payload, "fib_rule_hdr")?;
        let [family, dst_len, src_len, tos, table, _res1, _res2, action] = bytes;
        let h = FibRuleHdr {
            family,
            dst_len,
            src_len,
            tos,
            table,
            action,
            flags,
        };
        Ok((h, attrs))
    }
}

/// `struct ifinfomsg` (16 bytes); the kit only ever asks with an empty one
/// and reads the index back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct IfInfoMsg {
    pub(crate) family: u8,
    pub(crate) index: u32,
}

impl IfInfoMsg {
    const LEN: usize = 16;

    pub(crate) fn write(&self, w: &mut MsgWriter) {
        w.buf.extend_from_slice(&[self.family, 0]);
        w.buf.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
        w.buf.extend_from_slice(&self.index.to_ne_bytes());
        w.buf.extend_from_slice(&0u32.to_ne_bytes()); // ifi_flags
        w.buf.extend_from_slice(&0u32.to_ne_bytes()); // ifi_change
    }

    pub(crate) fn parse(payload: &[u8]) -> Result<(IfInfoMsg, Attrs<'_>), ParseError> {
        let (h, rest) = fixed::<{ IfInfoMsg::LEN }>(payload, "ifinfomsg")?;
        let [family, _, _, _, i0, i1, i2, i3, ..] = h;
        let m = IfInfoMsg {
            family,
            index: u32::from_ne_bytes([i0, i1, i2, i3]),
        };
        Ok((m, attrs(rest, "ifinfomsg")?))
    }
}

/// `struct ifaddrmsg` (8 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct IfAddrMsg {
    pub(crate) family: u8,
    pub(crate) prefix_len: u8,
    pub(crate) index: u32,
}

impl IfAddrMsg {
    const LEN: usize = 8;

    pub(crate) fn write(&self, w: &mut MsgWriter) {
        w.buf
            .extend_from_slice(&[self.family, self.prefix_len, 0, 0]); // flags, scope
        w.buf.extend_from_slice(&self.index.to_ne_bytes());
    }

    pub(crate) fn parse(payload: &[u8]) -> Result<(IfAddrMsg, Attrs<'_>), ParseError> {
        let (h, rest) = fixed::<{ IfAddrMsg::LEN }>(payload, "ifaddrmsg")?;
        let [family, prefix_len, _flags, _scope, i0, i1, i2, i3] = h;
        let m = IfAddrMsg {
            family,
            prefix_len,
            index: u32::from_ne_bytes([i0, i1, i2, i3]),
        };
        Ok((m, attrs(rest, "ifaddrmsg")?))
    }
}

/// The first `N` bytes of a payload and what follows them (every header
/// here is a multiple of 4 long, so the attributes start right after it).
fn fixed<'a, const N: usize>(
    payload: &'a [u8],
    what: &'static str,
) -> Result<([u8; N], &'a [u8]), ParseError> {
    let head = payload
        .get(..N)
        .and_then(|h| <[u8; N]>::try_from(h).ok())
        .ok_or(ParseError::Truncated {
            what,
            got: payload.len(),
            want: N,
        })?;
    Ok((head, payload.get(N..).unwrap_or_default()))
}

fn attrs<'a>(rest: &'a [u8], what: &'static str) -> Result<Attrs<'a>, ParseError> {
    Attrs::parse(rest).map_err(|e| ParseError::Attributes {
        what,
        source: Box::new(e),
    })
}

/// The address family byte as IPv4 (false) / IPv6 (true); other families
/// (MPLS routes, bridge rules ...) are not ours to read.
pub(crate) fn is_v6(family: u8) -> Option<bool> {
    match family {
        AF_INET => Some(false),
        AF_INET6 => Some(true),
        _ => None,
    }
}

pub(crate) fn family_of(v6: bool) -> u8 {
    if v6 {
        AF_INET6
    } else {
        AF_INET
    }
}

/// The address bytes as the kernel carries them (4 or 16, network order).
pub(crate) fn addr_attr(w: &mut MsgWriter, ty: u16, addr: IpAddr) {
    match addr {
        IpAddr::V4(a) => w.attr(ty, &a.octets()),
        IpAddr::V6(a) => w.attr(ty, &a.octets()),
    }
}

/// An address attribute of a message of family `v6`: exactly 4 or 16 bytes.
pub(crate) fn addr_of(v6: bool, b: &[u8], name: &'static str) -> Result<IpAddr, ParseError> {
    let wrong = |family| ParseError::NotAddress {
        name,
        got: b.len(),
        family,
    };
    if v6 {
        <[u8; 16]>::try_from(b)
            .map(|a| IpAddr::V6(Ipv6Addr::from(a)))
            .map_err(|_| wrong("IPv6"))
    } else {
        <[u8; 4]>::try_from(b)
            .map(|a| IpAddr::V4(Ipv4Addr::from(a)))
            .map_err(|_| wrong("IPv4"))
    }
}

/// An address attribute whose length says its family (an address row's
/// IFA_LOCAL / IFA_ADDRESS).
pub(crate) fn any_addr_of(b: &[u8], name: &'static str) -> Result<IpAddr, ParseError> {
    match b.len() {
        4 => addr_of(false, b, name),
        16 => addr_of(true, b, name),
        got => Err(ParseError::NotAddress {
            name,
            got,
            family: "IP",
        }),
    }
}

/// A fixed-size attribute `name` of `N` bytes.
pub(crate) fn bytes_of<const N: usize>(
    b: &[u8],
    name: &'static str,
) -> Result<[u8; N], ParseError> {
    <[u8; N]>::try_from(b).map_err(|_| ParseError::Length {
        name,
        got: b.len(),
        want: N,
    })
}

pub(crate) fn u32_of(b: &[u8], name: &'static str) -> Result<u32, ParseError> {
    bytes_of(b, name).map(u32::from_ne_bytes)
}

pub(crate) fn u8_of(b: &[u8], name: &'static str) -> Result<u8, ParseError> {
    bytes_of(b, name).map(|[v]| v)
}

/// Attribute `ty` decoded by `f`, if present (last occurrence wins, as in
/// the kernel's own parser).
pub(crate) fn opt<T>(
    attrs: &Attrs<'_>,
    ty: u16,
    f: impl FnOnce(&[u8]) -> Result<T, ParseError>,
) -> Result<Option<T>, ParseError> {
    attrs.get(ty).map(f).transpose()
}
