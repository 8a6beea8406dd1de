//! Routes via rtnetlink.

use crate::error::Result;
use crate::netlink::RouteSocket;
use ipnet::IpNet;
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Route protocol number podgate tags its routes with (`ip route ... proto 94`),
/// so its routes can be told apart from everyone else's.
pub const RTPROT_PODGATE: u8 = 94;
pub const TABLE_MAIN: u32 = 254;
pub const TABLE_LOCAL: u32 = 255;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Output interface index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oif: Option<u32>,
    #[serde(default = "main_table")]
    pub table: u32,
    #[serde(default)]
    pub protocol: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
    /// `onlink`: the gateway is reachable on `oif` without a connected route.
    #[serde(default)]
    pub onlink: bool,
    /// Link scope (a directly connected route, no gateway).
    #[serde(default)]
    pub link_scope: bool,
}

fn main_table() -> u32 {
    TABLE_MAIN
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

    fn message(&self) -> RouteMessage {
        let mut m = RouteMessage::default();
        let family = family_of(self.dst.addr());
        m.header.address_family = family;
        m.header.destination_prefix_length = self.dst.prefix_len();
        m.header.table = if self.table < 256 {
            self.table as u8
        } else {
            RouteHeader::RT_TABLE_UNSPEC
        };
        m.header.protocol = RouteProtocol::from(self.protocol);
        m.header.scope = if self.link_scope {
            RouteScope::Link
        } else {
            RouteScope::Universe
        };
        m.header.kind = RouteType::Unicast;
        if self.onlink {
            m.header.flags = RouteFlags::Onlink;
        }
        if self.dst.prefix_len() > 0 {
            m.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(
                    self.dst.addr(),
                )));
        }
        if let Some(gw) = self.gateway {
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        if let Some(oif) = self.oif {
            m.attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(metric) = self.metric {
            m.attributes.push(RouteAttribute::Priority(metric));
        }
        m.attributes.push(RouteAttribute::Table(self.table));
        m
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

fn family_of(a: IpAddr) -> AddressFamily {
    match a {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
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
}

fn addr_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn entry_of(m: &RouteMessage) -> Option<RouteEntry> {
    let v4 = match m.header.address_family {
        AddressFamily::Inet => true,
        AddressFamily::Inet6 => false,
        _ => return None,
    };
    let mut e = RouteEntry {
        dst: IpNet::new(
            if v4 {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u8; 16])
            },
            0,
        )
        .ok()?,
        gateway: None,
        oif: None,
        table: u32::from(m.header.table),
        protocol: u8::from(m.header.protocol),
        metric: None,
        scope: u8::from(m.header.scope),
        kind: u8::from(m.header.kind),
        prefsrc: None,
    };
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => {
                e.dst = IpNet::new(addr_of(d)?, m.header.destination_prefix_length).ok()?
            }
            RouteAttribute::Gateway(g) => e.gateway = addr_of(g),
            RouteAttribute::Oif(i) => e.oif = Some(*i),
            RouteAttribute::Table(t) => e.table = *t,
            RouteAttribute::Priority(p) => e.metric = Some(*p),
            RouteAttribute::PrefSource(p) => e.prefsrc = addr_of(p),
            _ => {}
        }
    }
    Some(e)
}

/// Add a route; `replace` overwrites an existing one with the same key.
pub fn add(sock: &mut RouteSocket, r: &RouteSpec, replace: bool) -> Result<()> {
    let flags = NLM_F_ACK | NLM_F_CREATE | if replace { NLM_F_REPLACE } else { NLM_F_EXCL };
    sock.request(
        RouteNetlinkMessage::NewRoute(r.message()),
        flags,
        &format!("add route {}", r.describe()),
    )
    .map(|_| ())
}

/// Delete a route. Ok(false) when it was already gone.
pub fn del(sock: &mut RouteSocket, r: &RouteSpec) -> Result<bool> {
    let mut m = r.message();
    // Deleting by key: leave scope to the kernel ("no-where" matches any).
    m.header.scope = RouteScope::NoWhere;
    match sock.request(
        RouteNetlinkMessage::DelRoute(m),
        NLM_F_ACK,
        &format!("delete route {}", r.describe()),
    ) {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// All routes of `v4`/`v6` in every table (filter afterwards).
pub fn list(sock: &mut RouteSocket, v6: bool) -> Result<Vec<RouteEntry>> {
    let mut m = RouteMessage::default();
    m.header.address_family = if v6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    let rows = sock.request(RouteNetlinkMessage::GetRoute(m), NLM_F_DUMP, "list routes")?;
    Ok(rows
        .iter()
        .filter_map(|r| match r {
            RouteNetlinkMessage::NewRoute(m) => entry_of(m),
            _ => None,
        })
        .collect())
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
            link_scope: e.scope == u8::from(RouteScope::Link),
        }
    }
}
