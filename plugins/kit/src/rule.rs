//! Policy routing rules via rtnetlink.

use crate::error::{ParseError, Result};
use crate::netlink::consts::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use crate::netlink::msg::{attr_string, Attrs, MsgWriter};
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
    /// `ipproto N`: only packets whose IP header names this protocol.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_proto: Option<u8>,
    /// What a match does: look up `table`, or drop the packet.
    #[serde(skip_serializing_if = "RuleAction::is_lookup")]
    pub action: RuleAction,
}

/// What a matching rule does (`fib_rule_hdr.action`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RuleAction {
    /// `lookup <table>` (`FR_ACT_TO_TBL`): a route found there ends the walk.
    #[default]
    Lookup,
    /// `blackhole` (`FR_ACT_BLACKHOLE`): the packet is dropped; no table.
    Blackhole,
    /// Any other action a listing shows (goto, nop, unreachable, prohibit).
    Other(u8),
}

/// `FR_ACT_UNREACHABLE`, `FR_ACT_PROHIBIT`: like blackhole, they end the
/// walk with the packet refused.
const REFUSING: [u8; 2] = [7, 8];

impl RuleAction {
    pub fn is_lookup(&self) -> bool {
        *self == RuleAction::Lookup
    }

    /// A match ends the walk with the packet dropped or refused: no table
    /// is looked up, nothing is delivered or forwarded.
    pub fn drops(self) -> bool {
        match self {
            RuleAction::Blackhole => true,
            RuleAction::Other(a) => REFUSING.contains(&a),
            RuleAction::Lookup => false,
        }
    }

    fn code(self) -> u8 {
        match self {
            RuleAction::Lookup => FR_ACT_TO_TBL,
            RuleAction::Blackhole => FR_ACT_BLACKHOLE,
            RuleAction::Other(a) => a,
        }
    }

    fn of(code: u8) -> RuleAction {
        match code {
            FR_ACT_TO_TBL => RuleAction::Lookup,
            FR_ACT_BLACKHOLE => RuleAction::Blackhole,
            a => RuleAction::Other(a),
        }
    }
}

impl Default for RuleSpec {
    /// `0: from all lookup 0` of IPv4: a base for `..` in literals.
    fn default() -> RuleSpec {
        RuleSpec {
            v6: false,
            priority: 0,
            from: None,
            to: None,
            iif: None,
            table: 0,
            protocol: 0,
            suppress_prefixlen: None,
            ip_proto: None,
            action: RuleAction::Lookup,
        }
    }
}

impl RuleSpec {
    /// `fib_rule_hdr` (the action) + FRA_PRIORITY, FRA_TABLE (a lookup),
    /// then the selectors present: FRA_SRC, FRA_DST, FRA_IIFNAME,
    /// FRA_PROTOCOL, FRA_SUPPRESS_PREFIXLEN, FRA_IP_PROTO.
    pub(crate) fn write(&self, w: &mut MsgWriter) {
        let lookup = self.action.is_lookup();
        FibRuleHdr {
            family: family_of(self.v6),
            dst_len: self.to.map_or(0, |t| t.prefix_len()),
            src_len: self.from.map_or(0, |f| f.prefix_len()),
            table: if lookup {
                u8::try_from(self.table).unwrap_or(RT_TABLE_UNSPEC)
            } else {
                RT_TABLE_UNSPEC
            },
            action: self.action.code(),
            ..FibRuleHdr::default()
        }
        .write(w);
        w.attr_ne_u32(FRA_PRIORITY, self.priority);
        if lookup {
            w.attr_ne_u32(FRA_TABLE, self.table);
        }
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
        if let Some(p) = self.ip_proto {
            w.attr(FRA_IP_PROTO, &[p]);
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
        if let Some(p) = self.ip_proto {
            s += &format!(" ipproto {p}");
        }
        match self.action {
            RuleAction::Lookup => s += &format!(" lookup {}", self.table),
            RuleAction::Blackhole => s += " blackhole",
            RuleAction::Other(a) => s += &format!(" action {a} table {}", self.table),
        }
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
            && self.ip_proto == other.ip_proto
            && self.action == other.action
    }

    /// Whether the kernel, asked by [`del`] to delete `self`, may take
    /// `other` instead. It compares only what the request carries (the
    /// action, the preference, a lookup's table, and the selectors `self`
    /// has: a source or destination of prefix length 0 is none) and
    /// deletes the first rule that agrees, so a selector `self` lacks
    /// matches any of `other`'s, as does every field a [`RuleSpec`] cannot
    /// carry (fwmark, oif, tos, `not`, ...: [`ListedRule`]). A caller
    /// deleting one listed rule makes sure no other is taken.
    pub fn delete_takes(&self, other: &RuleSpec) -> bool {
        let net = |mine: Option<IpNet>, theirs: Option<IpNet>| match mine {
            Some(m) if m.prefix_len() > 0 => theirs.map(|n| n.trunc()) == Some(m.trunc()),
            _ => true,
        };
        fn given<T: PartialEq>(mine: &Option<T>, theirs: &Option<T>) -> bool {
            mine.is_none() || mine == theirs
        }
        self.v6 == other.v6
            && self.action == other.action
            && self.priority == other.priority
            && (!self.action.is_lookup() || self.table == 0 || self.table == other.table)
            && net(self.from, other.from)
            && net(self.to, other.to)
            && given(&self.iif, &other.iif)
            && (self.protocol == 0 || self.protocol == other.protocol)
            && given(&self.suppress_prefixlen, &other.suppress_prefixlen)
            && given(&self.ip_proto, &other.ip_proto)
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

/// A rule as the kernel lists it: what [`RuleSpec`] holds (its ipproto
/// and action among them), and the rest of its selectors, so that a caller
/// matching a rule on every field never takes a rule it cannot name
/// (`fwmark 0x10 lookup 100`) for one it can (`from all lookup 100`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedRule {
    #[serde(flatten)]
    pub spec: RuleSpec,
    /// `not`: the rule applies where its selectors do not match.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub invert: bool,
    /// Selectors [`RuleSpec`] has no field for, as `ip rule` words
    /// (`fwmark 0x10/0xff`, `oif eth1`, `tos 0x10`, `uidrange 0-999`, ...;
    /// `attribute N` for one this code does not know).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<String>,
    /// The rule a `goto` action jumps to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goto: Option<u32>,
}

impl ListedRule {
    /// Nothing beyond what [`RuleSpec`] holds, and a `lookup` rule.
    pub fn is_plain(&self) -> bool {
        !self.invert && self.selectors.is_empty() && self.spec.action.is_lookup()
    }

    /// The action as `ip rule` words when it is not "look up the table"
    /// (`blackhole`, `goto 200`, ...).
    pub fn action(&self) -> Option<String> {
        Some(match self.spec.action {
            RuleAction::Lookup => return None,
            RuleAction::Blackhole => "blackhole".into(),
            RuleAction::Other(FR_ACT_GOTO) => match self.goto {
                Some(t) => format!("goto {t}"),
                None => "goto".into(),
            },
            RuleAction::Other(FR_ACT_NOP) => "nop".into(),
            RuleAction::Other(FR_ACT_UNREACHABLE) => "unreachable".into(),
            RuleAction::Other(FR_ACT_PROHIBIT) => "prohibit".into(),
            RuleAction::Other(a) => format!("action {a}"),
        })
    }
}

/// One row of a rule dump; `None` for families other than IPv4/IPv6.
#[cfg(test)]
pub(crate) fn spec_of(payload: &[u8]) -> std::result::Result<Option<RuleSpec>, ParseError> {
    Ok(listed_of(payload)?.map(|l| l.spec))
}

/// One row of a rule dump, every field; `None` for families other than
/// IPv4/IPv6.
pub(crate) fn listed_of(payload: &[u8]) -> std::result::Result<Option<ListedRule>, ParseError> {
    let (h, attrs) = FibRuleHdr::parse(payload)?;
    let Some(v6) = is_v6(h.family) else {
        return Ok(None);
    };
    let net = |name: &'static str, len: u8| {
        move |b: &[u8]| addr_of(v6, b, name).map(|a| IpNet::new(a, len))
    };
    let spec = RuleSpec {
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
        ip_proto: opt(&attrs, FRA_IP_PROTO, |b| u8_of(b, "FRA_IP_PROTO"))?.filter(|p| *p != 0),
        action: RuleAction::of(h.action),
    };
    Ok(Some(ListedRule {
        spec,
        invert: h.flags & FIB_RULE_INVERT != 0,
        selectors: other_selectors(&h, &attrs)?,
        goto: opt(&attrs, FRA_GOTO, |b| u32_of(b, "FRA_GOTO"))?,
    }))
}

/// `tos` and every selector attribute [`RuleSpec`] does not hold, as `ip
/// rule` words.
fn other_selectors(
    h: &FibRuleHdr,
    attrs: &Attrs<'_>,
) -> std::result::Result<Vec<String>, ParseError> {
    let mut out = Vec::new();
    if h.tos != 0 {
        out.push(format!("tos {:#x}", h.tos));
    }
    let mark = opt(attrs, FRA_FWMARK, |b| u32_of(b, "FRA_FWMARK"))?;
    let mask = opt(attrs, FRA_FWMASK, |b| u32_of(b, "FRA_FWMASK"))?;
    if mark.is_some() || mask.is_some_and(|m| m != 0) {
        out.push(format!(
            "fwmark {:#x}/{:#x}",
            mark.unwrap_or(0),
            mask.unwrap_or(u32::MAX)
        ));
    }
    let u16_of = |b: &[u8], name| bytes_of(b, name).map(u16::from_ne_bytes);
    let range = |b: &[u8], name: &'static str| -> std::result::Result<String, ParseError> {
        match b {
            [a0, a1, b0, b1] => Ok(format!(
                "{}-{}",
                u16::from_ne_bytes([*a0, *a1]),
                u16::from_ne_bytes([*b0, *b1])
            )),
            [a0, a1, a2, a3, b0, b1, b2, b3] => Ok(format!(
                "{}-{}",
                u32::from_ne_bytes([*a0, *a1, *a2, *a3]),
                u32::from_ne_bytes([*b0, *b1, *b2, *b3])
            )),
            _ => Err(ParseError::RangeLength { name, got: b.len() }),
        }
    };
    for (ty, b) in attrs.iter() {
        let word = match ty {
            // What RuleSpec holds, the action's, and padding.
            FRA_DST
            | FRA_SRC
            | FRA_IIFNAME
            | FRA_PRIORITY
            | FRA_TABLE
            | FRA_PROTOCOL
            | FRA_SUPPRESS_PREFIXLEN
            | FRA_IP_PROTO
            | FRA_GOTO
            | FRA_FWMARK
            | FRA_FWMASK
            | FRA_PAD
            | 0 => None,
            FRA_OIFNAME => Some(format!("oif {}", attr_string(b))),
            FRA_FLOW => Some(format!("realms {:#x}", u32_of(b, "FRA_FLOW")?)),
            FRA_TUN_ID => Some(format!(
                "tun_id {}",
                bytes_of(b, "FRA_TUN_ID").map(u64::from_be_bytes)?
            )),
            FRA_SUPPRESS_IFGROUP => Some(u32_of(b, "FRA_SUPPRESS_IFGROUP")?)
                .filter(|g| *g != u32::MAX)
                .map(|g| format!("suppress_ifgroup {g}")),
            FRA_L3MDEV => (u8_of(b, "FRA_L3MDEV")? != 0).then(|| "l3mdev".to_string()),
            FRA_UID_RANGE => Some(format!("uidrange {}", range(b, "FRA_UID_RANGE")?)),
            FRA_SPORT_RANGE => Some(format!("sport {}", range(b, "FRA_SPORT_RANGE")?)),
            FRA_DPORT_RANGE => Some(format!("dport {}", range(b, "FRA_DPORT_RANGE")?)),
            FRA_SPORT_MASK => Some(format!("sport_mask {:#x}", u16_of(b, "FRA_SPORT_MASK")?)),
            FRA_DPORT_MASK => Some(format!("dport_mask {:#x}", u16_of(b, "FRA_DPORT_MASK")?)),
            other => Some(format!("attribute {other}")),
        };
        out.extend(word);
    }
    Ok(out)
}

/// The rules of `v4`/`v6` with every field ([`ListedRule`]).
pub fn list_all_fields(sock: &mut RouteSocket, v6: bool) -> Result<Vec<ListedRule>> {
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
        listed_of,
    )
}

/// The rules of `v4`/`v6` as [`RuleSpec`]s (what a rule podgate adds holds).
pub fn list(sock: &mut RouteSocket, v6: bool) -> Result<Vec<RuleSpec>> {
    Ok(list_all_fields(sock, v6)?
        .into_iter()
        .map(|l| l.spec)
        .collect())
}
