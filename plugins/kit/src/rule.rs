//! Policy routing rules via rtnetlink.

use crate::error::Result;
use crate::netlink::consts::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use crate::netlink::msg::{attr_string, MsgWriter};
use crate::netlink::rtnl::*;
use crate::netlink::RouteSocket;
use ipnet::IpNet;
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
    /// `fib_rule_hdr` (action "to table") + FRA_PRIORITY, FRA_TABLE, then
    /// the selectors present: FRA_SRC, FRA_DST, FRA_IIFNAME, FRA_PROTOCOL,
    /// FRA_SUPPRESS_PREFIXLEN.
    pub(crate) fn write(&self, w: &mut MsgWriter) {
        FibRuleHdr {
            family: family_of(self.v6),
            dst_len: self.to.map_or(0, |t| t.prefix_len()),
            src_len: self.from.map_or(0, |f| f.prefix_len()),
            table: u8::try_from(self.table).unwrap_or(RT_TABLE_UNSPEC),
            action: FR_ACT_TO_TBL,
            ..FibRuleHdr::default()
        }
        .write(w);
        w.attr_ne_u32(FRA_PRIORITY, self.priority);
        w.attr_ne_u32(FRA_TABLE, self.table);
        if let Some(f) = self.from {
            addr_attr(w, FRA_SRC, f.trunc().addr());
        }
        if let Some(t) = self.to {
            addr_attr(w, FRA_DST, t.trunc().addr());
        }
        if let Some(i) = &self.iif {
            w.attr_str(FRA_IIFNAME, i);
        }
        if self.protocol != 0 {
            w.attr(FRA_PROTOCOL, &[self.protocol]);
        }
        if let Some(n) = self.suppress_prefixlen {
            w.attr_ne_u32(FRA_SUPPRESS_PREFIXLEN, n);
        }
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
        RTM_NEWRULE,
        NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        &format!("add rule {}", r.describe()),
        |w| r.write(w),
    )
    .map(|_| ())
}

/// Ok(false) when already gone.
pub fn del(sock: &mut RouteSocket, r: &RuleSpec) -> Result<bool> {
    match sock.request(
        RTM_DELRULE,
        NLM_F_ACK,
        &format!("delete rule {}", r.describe()),
        |w| r.write(w),
    ) {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// One row of a rule dump; `None` for families other than IPv4/IPv6.
pub(crate) fn spec_of(payload: &[u8]) -> std::result::Result<Option<RuleSpec>, String> {
    let (h, attrs) = FibRuleHdr::parse(payload)?;
    let Some(v6) = is_v6(h.family) else {
        return Ok(None);
    };
    let net = |name: &'static str, len: u8| {
        move |b: &[u8]| addr_of(v6, b, name).map(|a| IpNet::new(a, len))
    };
    Ok(Some(RuleSpec {
        v6,
        priority: opt(&attrs, FRA_PRIORITY, |b| u32_of(b, "FRA_PRIORITY"))?.unwrap_or(0),
        // A prefix length the address cannot have selects nothing we know.
        from: opt(&attrs, FRA_SRC, net("FRA_SRC", h.src_len))?.and_then(|n| n.ok()),
        to: opt(&attrs, FRA_DST, net("FRA_DST", h.dst_len))?.and_then(|n| n.ok()),
        iif: attrs.get(FRA_IIFNAME).map(attr_string),
        table: opt(&attrs, FRA_TABLE, |b| u32_of(b, "FRA_TABLE"))?.unwrap_or(u32::from(h.table)),
        protocol: opt(&attrs, FRA_PROTOCOL, |b| u8_of(b, "FRA_PROTOCOL"))?.unwrap_or(0),
        // The kernel reports "no suppression" as u32::MAX.
        suppress_prefixlen: opt(&attrs, FRA_SUPPRESS_PREFIXLEN, |b| {
            u32_of(b, "FRA_SUPPRESS_PREFIXLEN")
        })?
        .filter(|n| *n != u32::MAX),
    }))
}

pub fn list(sock: &mut RouteSocket, v6: bool) -> Result<Vec<RuleSpec>> {
    let header = FibRuleHdr {
        family: family_of(v6),
        action: FR_ACT_UNSPEC,
        ..FibRuleHdr::default()
    };
    sock.rows(
        RTM_GETRULE,
        NLM_F_DUMP,
        RTM_NEWRULE,
        "list rules",
        |w| header.write(w),
        spec_of,
    )
}
