//! Routes via rtnetlink.

use crate::error::{ParseError, Result};
use crate::netlink::consts::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE};
use crate::netlink::msg::MsgWriter;
use crate::netlink::rtnl::*;
use crate::netlink::RouteSocket;
use ipnet::IpNet;
use serde::Serialize;
use std::net::IpAddr;

/// Route protocol number podgate tags its routes with (`ip route ... proto 94`),
/// so its routes can be told apart from everyone else's.
pub const RTPROT_PODGATE: u8 = 94;
pub const TABLE_MAIN: u32 = 254;
pub const TABLE_LOCAL: u32 = 255;
/// The `default` table (253), looked up last by the kernel's own rules.
pub const TABLE_DEFAULT: u32 = 253;

/// A route's (or rule's) protocol, `RTPROT_*`: the byte the kernel stores,
/// shown by its iproute2 name (`/usr/share/iproute2/rt_protos`) and podgate's
/// own (94), else by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteProtocol(pub u8);

impl RouteProtocol {
    pub const UNSPEC: RouteProtocol = RouteProtocol(0);
    pub const KERNEL: RouteProtocol = RouteProtocol(2);
    pub const BOOT: RouteProtocol = RouteProtocol(3);
    pub const STATIC: RouteProtocol = RouteProtocol(4);
    pub const DHCP: RouteProtocol = RouteProtocol(16);
    pub const PODGATE: RouteProtocol = RouteProtocol(RTPROT_PODGATE);

    /// Names as iproute2 knows them, plus podgate's own.
    const NAMES: [(u8, &'static str); 21] = [
        (0, "unspec"),
        (1, "redirect"),
        (2, "kernel"),
        (3, "boot"),
        (4, "static"),
        (8, "gated"),
        (9, "ra"),
        (10, "mrt"),
        (11, "zebra"),
        (12, "bird"),
        (13, "dnrouted"),
        (14, "xorp"),
        (15, "ntk"),
        (16, "dhcp"),
        (42, "babel"),
        (RTPROT_PODGATE, "podgate"),
        (186, "bgp"),
        (187, "isis"),
        (188, "ospf"),
        (189, "rip"),
        (192, "eigrp"),
    ];

    pub fn name(self) -> Option<&'static str> {
        name_of(&Self::NAMES, self.0)
    }

    /// A number (0-255) or a known name.
    pub fn parse(s: &str) -> Option<RouteProtocol> {
        s.parse::<u8>()
            .ok()
            .or_else(|| number_of(&Self::NAMES, s))
            .map(RouteProtocol)
    }
}

impl std::fmt::Display for RouteProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "{}", self.0),
        }
    }
}

/// A route's scope, `RT_SCOPE_*`, shown as `ip route` shows it (universe is
/// "global"), else by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteScope(pub u8);

impl RouteScope {
    pub const UNIVERSE: RouteScope = RouteScope(0);
    pub const SITE: RouteScope = RouteScope(200);
    pub const LINK: RouteScope = RouteScope(253);
    pub const HOST: RouteScope = RouteScope(254);
    pub const NOWHERE: RouteScope = RouteScope(255);

    const NAMES: [(u8, &'static str); 5] = [
        (0, "global"),
        (200, "site"),
        (253, "link"),
        (254, "host"),
        (255, "nowhere"),
    ];

    pub fn name(self) -> Option<&'static str> {
        name_of(&Self::NAMES, self.0)
    }
}

impl std::fmt::Display for RouteScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "{}", self.0),
        }
    }
}

/// A route's type, `RTN_*`. Types the kernel does not define show as
/// "unspec" (as the helper always printed them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteType(pub u8);

impl RouteType {
    pub const UNSPEC: RouteType = RouteType(0);
    pub const UNICAST: RouteType = RouteType(1);
    pub const LOCAL: RouteType = RouteType(2);
    pub const BROADCAST: RouteType = RouteType(3);
    pub const ANYCAST: RouteType = RouteType(4);
    pub const MULTICAST: RouteType = RouteType(5);
    pub const BLACKHOLE: RouteType = RouteType(6);
    pub const UNREACHABLE: RouteType = RouteType(7);
    pub const PROHIBIT: RouteType = RouteType(8);
    pub const THROW: RouteType = RouteType(9);
    pub const NAT: RouteType = RouteType(10);

    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "unicast",
            2 => "local",
            3 => "broadcast",
            4 => "anycast",
            5 => "multicast",
            6 => "blackhole",
            7 => "unreachable",
            8 => "prohibit",
            9 => "throw",
            10 => "nat",
            _ => "unspec",
        }
    }
}

impl std::fmt::Display for RouteType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn name_of(names: &[(u8, &'static str)], n: u8) -> Option<&'static str> {
    names.iter().find(|(k, _)| *k == n).map(|(_, v)| *v)
}

fn number_of(names: &[(u8, &'static str)], s: &str) -> Option<u8> {
    names.iter().find(|(_, v)| *v == s).map(|(k, _)| *k)
}

/// A route to add, delete or look for. Serialized only to show a plan (the
/// router's debug log); what is kept on disk is the router's record, a
/// format of its own, so this type is never read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    pub dst: IpNet,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Output interface index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oif: Option<u32>,
    pub table: u32,
    pub protocol: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
    /// `onlink`: the gateway is reachable on `oif` without a connected route.
    pub onlink: bool,
    /// Link scope (a directly connected route, no gateway).
    pub link_scope: bool,
}

impl RouteSpec {
    pub fn new(dst: IpNet) -> RouteSpec {
        RouteSpec {
            dst: dst.trunc(),
            gateway: None,
            oif: None,
            table: TABLE_MAIN,
            protocol: 0,
            metric: None,
            onlink: false,
            link_scope: false,
        }
    }

    /// `rtmsg` + RTA_DST (unless a default route), RTA_GATEWAY, RTA_OIF,
    /// RTA_PRIORITY, RTA_TABLE (always: ids above 255 fit only there).
    pub(crate) fn write(&self, w: &mut MsgWriter, scope: u8) {
        RtMsg {
            family: family_of(self.dst.addr().is_ipv6()),
            dst_len: self.dst.prefix_len(),
            table: u8::try_from(self.table).unwrap_or(RT_TABLE_UNSPEC),
            protocol: self.protocol,
            scope,
            kind: RTN_UNICAST,
            flags: if self.onlink { RTNH_F_ONLINK } else { 0 },
            ..RtMsg::default()
        }
        .write(w);
        if self.dst.prefix_len() > 0 {
            addr_attr(w, RTA_DST, self.dst.addr());
        }
        if let Some(gw) = self.gateway {
            addr_attr(w, RTA_GATEWAY, gw);
        }
        if let Some(oif) = self.oif {
            w.attr_ne_u32(RTA_OIF, oif);
        }
        if let Some(metric) = self.metric {
            w.attr_ne_u32(RTA_PRIORITY, metric);
        }
        w.attr_ne_u32(RTA_TABLE, self.table);
    }

    pub(crate) fn scope(&self) -> u8 {
        if self.link_scope {
            RT_SCOPE_LINK
        } else {
            RT_SCOPE_UNIVERSE
        }
    }

    pub fn describe(&self) -> String {
        let mut s = self.dst.to_string();
        if let Some(gw) = self.gateway {
            s += &format!(" via {gw}");
        }
        if let Some(oif) = self.oif {
            s += &format!(" oif {oif}");
        }
        if self.table != TABLE_MAIN {
            s += &format!(" table {}", self.table);
        }
        if self.onlink {
            s += " onlink";
        }
        s
    }
}

/// A route as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteEntry {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: u32,
    pub protocol: u8,
    pub metric: Option<u32>,
    pub scope: u8,
    pub kind: u8,
    pub prefsrc: Option<IpAddr>,
    /// The gateways of a multipath route's next hops (`RTA_MULTIPATH`;
    /// `gateway` is then None). A route through a nexthop object
    /// (`RTA_NH_ID`) lists its gateways in neither.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub multipath: Vec<IpAddr>,
}

impl RouteEntry {
    /// Every gateway the route names: its own and its next hops'.
    pub fn gateways(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.gateway.iter().chain(&self.multipath).copied()
    }

    pub fn route_protocol(&self) -> RouteProtocol {
        RouteProtocol(self.protocol)
    }

    pub fn route_scope(&self) -> RouteScope {
        RouteScope(self.scope)
    }

    pub fn route_type(&self) -> RouteType {
        RouteType(self.kind)
    }
}

/// One row of a route dump; `None` for families other than IPv4/IPv6.
pub(crate) fn entry_of(payload: &[u8]) -> std::result::Result<Option<RouteEntry>, ParseError> {
    let (h, attrs) = RtMsg::parse(payload)?;
    let Some(v6) = is_v6(h.family) else {
        return Ok(None);
    };
    let any = if v6 {
        IpAddr::from([0u8; 16])
    } else {
        IpAddr::from([0u8; 4])
    };
    let dst = match opt(&attrs, RTA_DST, |b| addr_of(v6, b, "RTA_DST"))? {
        Some(d) => IpNet::new(d, h.dst_len).map_err(|_| ParseError::PrefixLength {
            len: h.dst_len,
            addr: d,
        })?,
        // A default route carries no RTA_DST.
        None => IpNet::new(any, 0).map_err(|_| ParseError::PrefixLength { len: 0, addr: any })?,
    };
    Ok(Some(RouteEntry {
        dst,
        gateway: opt(&attrs, RTA_GATEWAY, |b| addr_of(v6, b, "RTA_GATEWAY"))?,
        oif: opt(&attrs, RTA_OIF, |b| u32_of(b, "RTA_OIF"))?,
        table: opt(&attrs, RTA_TABLE, |b| u32_of(b, "RTA_TABLE"))?.unwrap_or(u32::from(h.table)),
        protocol: h.protocol,
        metric: opt(&attrs, RTA_PRIORITY, |b| u32_of(b, "RTA_PRIORITY"))?,
        scope: h.scope,
        kind: h.kind,
        prefsrc: opt(&attrs, RTA_PREFSRC, |b| addr_of(v6, b, "RTA_PREFSRC"))?,
        multipath: opt(&attrs, RTA_MULTIPATH, |b| multipath_gateways(v6, b))?.unwrap_or_default(),
    }))
}

/// The gateways in an `RTA_MULTIPATH` attribute: next hops one after the
/// other, each a `struct rtnexthop` (its length with its attributes, u16;
/// flags, hops, u8; ifindex, i32) and then its attributes, `RTA_GATEWAY`
/// among them, padded to 4 bytes.
fn multipath_gateways(v6: bool, mut b: &[u8]) -> std::result::Result<Vec<IpAddr>, ParseError> {
    const RTNH_LEN: usize = 8;
    let mut out = Vec::new();
    while let [l0, l1, ..] = b {
        let len = usize::from(u16::from_ne_bytes([*l0, *l1]));
        let attrs = b
            .get(RTNH_LEN..len)
            .ok_or(ParseError::NextHopBounds(len))
            .and_then(|a| {
                crate::netlink::msg::Attrs::parse(a).map_err(|e| ParseError::Multipath(Box::new(e)))
            })?;
        out.extend(opt(&attrs, RTA_GATEWAY, |g| {
            addr_of(v6, g, "RTA_MULTIPATH gateway")
        })?);
        b = b
            .get(crate::netlink::msg::align4(len)..)
            .unwrap_or_default();
    }
    Ok(out)
}

/// Add a route; `replace` overwrites an existing one with the same key.
pub fn add(sock: &mut RouteSocket, r: &RouteSpec, replace: bool) -> Result<()> {
    let flags = NLM_F_ACK | NLM_F_CREATE | if replace { NLM_F_REPLACE } else { NLM_F_EXCL };
    sock.request(
        RTM_NEWROUTE,
        flags,
        &format!("add route {}", r.describe()),
        |w| r.write(w, r.scope()),
    )
    .map(|_| ())
}

/// Delete a route. Ok(false) when it was already gone.
pub fn del(sock: &mut RouteSocket, r: &RouteSpec) -> Result<bool> {
    // Deleting by key: leave scope to the kernel ("no-where" matches any).
    match sock.request(
        RTM_DELROUTE,
        NLM_F_ACK,
        &format!("delete route {}", r.describe()),
        |w| r.write(w, RT_SCOPE_NOWHERE),
    ) {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// All routes of `v4`/`v6` in every table (filter afterwards).
pub fn list(sock: &mut RouteSocket, v6: bool) -> Result<Vec<RouteEntry>> {
    let header = RtMsg {
        family: family_of(v6),
        ..RtMsg::default()
    };
    sock.rows(
        RTM_GETROUTE,
        NLM_F_DUMP,
        RTM_NEWROUTE,
        "list routes",
        |w| header.write(w),
        entry_of,
    )
}

/// The routes of `v4`/`v6` in `table` alone. The route socket asks the
/// kernel to honour dump filters (`NETLINK_GET_STRICT_CHK`, Linux 4.20 and
/// later), so only that table is walked (a node's local table holds a route
/// for every address, thousands with kube-proxy in IPVS mode); rows of
/// other tables, from a kernel that ignores the filter, are dropped here.
/// A table without a route of the family (the kernel's ENOENT): none.
pub fn list_table(sock: &mut RouteSocket, v6: bool, table: u32) -> Result<Vec<RouteEntry>> {
    let rows = sock.rows(
        RTM_GETROUTE,
        NLM_F_DUMP,
        RTM_NEWROUTE,
        "list routes",
        |w| write_table_dump(w, v6, table),
        entry_of,
    );
    match rows {
        Ok(mut rows) => {
            rows.retain(|e| e.table == table);
            Ok(rows)
        }
        // A table that holds no route of the family does not exist.
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The body of a route dump of `table` alone.
pub(crate) fn write_table_dump(w: &mut MsgWriter, v6: bool, table: u32) {
    let header = RtMsg {
        family: family_of(v6),
        // Ids above 255 fit only in RTA_TABLE, which overrides the header.
        table: u8::try_from(table).unwrap_or(RT_TABLE_UNSPEC),
        ..RtMsg::default()
    };
    header.write(w);
    w.attr_ne_u32(RTA_TABLE, table);
}

/// Routes of both families.
pub fn list_all(sock: &mut RouteSocket) -> Result<Vec<RouteEntry>> {
    let mut v = list(sock, false)?;
    v.extend(list(sock, true)?);
    Ok(v)
}

/// Does a route equal to `r` (dst, table, gateway, oif) exist?
pub fn find<'a>(entries: &'a [RouteEntry], r: &RouteSpec) -> Option<&'a RouteEntry> {
    entries.iter().find(|e| {
        e.dst == r.dst.trunc()
            && e.table == r.table
            && (r.gateway.is_none() || e.gateway == r.gateway)
            && (r.oif.is_none() || e.oif == r.oif)
    })
}

impl From<&RouteEntry> for RouteSpec {
    fn from(e: &RouteEntry) -> RouteSpec {
        RouteSpec {
            dst: e.dst,
            gateway: e.gateway,
            oif: e.oif,
            table: e.table,
            protocol: e.protocol,
            metric: e.metric,
            onlink: false,
            link_scope: e.route_scope() == RouteScope::LINK,
        }
    }
}

/// The entry the kernel lists for a route added from this spec: unicast, no
/// preferred source, link scope when asked for.
impl From<&RouteSpec> for RouteEntry {
    fn from(spec: &RouteSpec) -> RouteEntry {
        let scope = if spec.link_scope {
            RouteScope::LINK
        } else {
            RouteScope::UNIVERSE
        };
        RouteEntry {
            dst: spec.dst,
            gateway: spec.gateway,
            oif: spec.oif,
            table: spec.table,
            protocol: spec.protocol,
            metric: spec.metric,
            scope: scope.0,
            kind: RouteType::UNICAST.0,
            prefsrc: None,
            multipath: Vec::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn numbers_show_by_name() {
        assert_eq!(RouteProtocol::PODGATE.to_string(), "podgate");
        assert_eq!(RouteProtocol::KERNEL.to_string(), "kernel");
        assert_eq!(RouteProtocol(77).to_string(), "77");
        assert_eq!(RouteProtocol::parse("static"), Some(RouteProtocol::STATIC));
        assert_eq!(RouteProtocol::parse("94"), Some(RouteProtocol::PODGATE));
        assert_eq!(RouteProtocol::parse("nope"), None);
        assert_eq!(RouteScope::UNIVERSE.to_string(), "global");
        assert_eq!(RouteScope::LINK.to_string(), "link");
        assert_eq!(RouteScope(7).to_string(), "7");
        assert_eq!(RouteType::LOCAL.to_string(), "local");
        assert_eq!(RouteType(42).to_string(), "unspec");
        // The typed values are the kernel's bytes (libc's copy of the UAPI).
        assert_eq!(RouteScope::UNIVERSE.0, libc::RT_SCOPE_UNIVERSE);
        assert_eq!(RouteScope::SITE.0, libc::RT_SCOPE_SITE);
        assert_eq!(RouteScope::LINK.0, libc::RT_SCOPE_LINK);
        assert_eq!(RouteScope::HOST.0, libc::RT_SCOPE_HOST);
        assert_eq!(RouteScope::NOWHERE.0, libc::RT_SCOPE_NOWHERE);
        assert_eq!(RouteType::UNICAST.0, libc::RTN_UNICAST);
        assert_eq!(RouteType::LOCAL.0, libc::RTN_LOCAL);
        assert_eq!(RouteType::BLACKHOLE.0, libc::RTN_BLACKHOLE);
        assert_eq!(RouteType::NAT.0, libc::RTN_NAT);
        assert_eq!(RouteProtocol::BOOT.0, libc::RTPROT_BOOT);
        assert_eq!(RouteProtocol::STATIC.0, libc::RTPROT_STATIC);
        assert_eq!(TABLE_MAIN, u32::from(libc::RT_TABLE_MAIN));
        assert_eq!(TABLE_LOCAL, u32::from(libc::RT_TABLE_LOCAL));
    }
}
