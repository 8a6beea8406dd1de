//! Policy routing rules via rtnetlink.

use crate::error::Result;
use crate::netlink::RouteSocket;
use ipnet::IpNet;
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::route::RouteProtocol;
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use serde::Serialize;

/// A policy rule to add, delete or match. Serialized only to show a plan
/// (as [`crate::route::RouteSpec`]); never read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleSpec {
    pub v6: bool,
    pub priority: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<IpNet>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<IpNet>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    pub table: u32,
    pub protocol: u8,
    /// `suppress_prefixlength N`: ignore routes of prefix length <= N found
    /// by this rule's lookup (e.g. 31: only /32 host routes count).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suppress_prefixlen: Option<u32>,
}

impl RuleSpec {
    fn message(&self) -> RuleMessage {
        let mut m = RuleMessage::default();
        m.header.family = if self.v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        m.header.action = RuleAction::ToTable;
        m.header.table = if self.table < 256 {
            self.table as u8
        } else {
            0
        };
        m.attributes.push(RuleAttribute::Priority(self.priority));
        m.attributes.push(RuleAttribute::Table(self.table));
        if let Some(f) = self.from {
            m.header.src_len = f.prefix_len();
            m.attributes.push(RuleAttribute::Source(f.trunc().addr()));
        }
        if let Some(t) = self.to {
            m.header.dst_len = t.prefix_len();
            m.attributes
                .push(RuleAttribute::Destination(t.trunc().addr()));
        }
        if let Some(i) = &self.iif {
            m.attributes.push(RuleAttribute::Iifname(i.clone()));
        }
        if self.protocol != 0 {
            m.attributes
                .push(RuleAttribute::Protocol(RouteProtocol::from(self.protocol)));
        }
        if let Some(n) = self.suppress_prefixlen {
            m.attributes.push(RuleAttribute::SuppressPrefixLen(n));
        }
        m
    }

    pub fn describe(&self) -> String {
        let mut s = format!("{}:", self.priority);
        match self.from {
            Some(f) => s += &format!(" from {f}"),
            None => s += " from all",
        }
        if let Some(t) = self.to {
            s += &format!(" to {t}");
        }
        if let Some(i) = &self.iif {
            s += &format!(" iif {i}");
        }
        s += &format!(" lookup {}", self.table);
        if let Some(n) = self.suppress_prefixlen {
            s += &format!(" suppress_prefixlength {n}");
        }
        s
    }

    /// Same selector and target (protocol is informational).
    pub fn matches(&self, other: &RuleSpec) -> bool {
        self.v6 == other.v6
            && self.priority == other.priority
            && self.from.map(|n| n.trunc()) == other.from.map(|n| n.trunc())
            && self.to.map(|n| n.trunc()) == other.to.map(|n| n.trunc())
            && self.iif == other.iif
            && self.table == other.table
            && self.suppress_prefixlen.unwrap_or(u32::MAX)
                == other.suppress_prefixlen.unwrap_or(u32::MAX)
    }
}

pub fn add(sock: &mut RouteSocket, r: &RuleSpec) -> Result<()> {
    sock.request(
        RouteNetlinkMessage::NewRule(r.message()),
        NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        &format!("add rule {}", r.describe()),
    )
    .map(|_| ())
}

/// Ok(false) when already gone.
pub fn del(sock: &mut RouteSocket, r: &RuleSpec) -> Result<bool> {
    match sock.request(
        RouteNetlinkMessage::DelRule(r.message()),
        NLM_F_ACK,
        &format!("delete rule {}", r.describe()),
    ) {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

fn spec_of(m: &RuleMessage) -> Option<RuleSpec> {
    let v6 = match m.header.family {
        AddressFamily::Inet => false,
        AddressFamily::Inet6 => true,
        _ => return None,
    };
    let mut r = RuleSpec {
        v6,
        priority: 0,
        from: None,
        to: None,
        iif: None,
        table: u32::from(m.header.table),
        protocol: 0,
        suppress_prefixlen: None,
    };
    for a in &m.attributes {
        match a {
            RuleAttribute::Priority(p) => r.priority = *p,
            RuleAttribute::Table(t) => r.table = *t,
            RuleAttribute::Source(ip) => {
                r.from = IpNet::new(*ip, m.header.src_len).ok();
            }
            RuleAttribute::Destination(ip) => r.to = IpNet::new(*ip, m.header.dst_len).ok(),
            RuleAttribute::Iifname(i) => r.iif = Some(i.clone()),
            RuleAttribute::Protocol(p) => r.protocol = u8::from(*p),
            // The kernel reports "no suppression" as u32::MAX.
            RuleAttribute::SuppressPrefixLen(n) if *n != u32::MAX => {
                r.suppress_prefixlen = Some(*n)
            }
            _ => {}
        }
    }
    Some(r)
}

pub fn list(sock: &mut RouteSocket, v6: bool) -> Result<Vec<RuleSpec>> {
    let mut m = RuleMessage::default();
    m.header.family = if v6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    let rows = sock.request(RouteNetlinkMessage::GetRule(m), NLM_F_DUMP, "list rules")?;
    Ok(rows
        .iter()
        .filter_map(|r| match r {
            RouteNetlinkMessage::NewRule(m) => spec_of(m),
            _ => None,
        })
        .collect())
}
