//! The parts of a record: its own types for what ADD changes, converted
//! one way from the planner's and the kit's (frozen with the format).

use crate::config::RoutingMode;
use crate::plan::SysctlSetting;
use crate::routing::{MainSwap as PlanSwap, RoutingPlan};
use ipnet::IpNet;
use podgate_kit::nft;
use podgate_kit::route::RouteSpec;
use podgate_kit::rule::{RuleAction, RuleSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A sysctl in the pod netns: the value podgate writes and, when podgate
/// changed it, the value it found (read before writing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sysctl {
    pub name: String,
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Masquerade {
    pub source: IpNet,
    pub oifname: String,
}

/// Which SYNs an MSS clamp rule rewrites (record format of
/// [`podgate_kit::nft::MssDirection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MssDirection {
    FromPool,
    ToPool,
}

/// What the MSS is lowered to: `"pmtu"` or `{"fixed": N}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MssValue {
    Pmtu,
    Fixed(u16),
}

/// One MSS clamp rule in the `forward` chain of [`crate::record::Record::nft_table`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MssClamp {
    pub pool: IpNet,
    pub ifname: String,
    pub direction: MssDirection,
    pub mss: MssValue,
}

impl From<&nft::MssRule> for MssClamp {
    fn from(r: &nft::MssRule) -> MssClamp {
        MssClamp {
            pool: r.pool,
            ifname: r.ifname.clone(),
            direction: match r.direction {
                nft::MssDirection::FromPool => MssDirection::FromPool,
                nft::MssDirection::ToPool => MssDirection::ToPool,
            },
            mss: match r.mss {
                nft::MssValue::Pmtu => MssValue::Pmtu,
                nft::MssValue::Fixed(v) => MssValue::Fixed(v),
            },
        }
    }
}

impl MssClamp {
    pub fn rule(&self) -> nft::MssRule {
        nft::MssRule {
            pool: self.pool,
            ifname: self.ifname.clone(),
            direction: match self.direction {
                MssDirection::FromPool => nft::MssDirection::FromPool,
                MssDirection::ToPool => nft::MssDirection::ToPool,
            },
            mss: match self.mss {
                MssValue::Pmtu => nft::MssValue::Pmtu,
                MssValue::Fixed(v) => nft::MssValue::Fixed(v),
            },
        }
    }
}

/// A route (node, pod, or a per-pod table), as the record stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oif: Option<u32>,
    #[serde(default = "main_table")]
    pub table: u32,
    #[serde(default)]
    pub protocol: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
    #[serde(default)]
    pub onlink: bool,
    #[serde(default)]
    pub link_scope: bool,
}

fn main_table() -> u32 {
    podgate_kit::route::TABLE_MAIN
}

impl From<&RouteSpec> for Route {
    fn from(r: &RouteSpec) -> Route {
        Route {
            dst: r.dst,
            gateway: r.gateway,
            oif: r.oif,
            table: r.table,
            protocol: r.protocol,
            metric: r.metric,
            onlink: r.onlink,
            link_scope: r.link_scope,
        }
    }
}

impl Route {
    pub fn spec(&self) -> RouteSpec {
        RouteSpec {
            dst: self.dst,
            gateway: self.gateway,
            oif: self.oif,
            table: self.table,
            protocol: self.protocol,
            metric: self.metric,
            onlink: self.onlink,
            link_scope: self.link_scope,
        }
    }
}

/// A policy routing rule, as the record stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub v6: bool,
    pub priority: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    pub table: u32,
    #[serde(default)]
    pub protocol: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppress_prefixlen: Option<u32>,
    /// Version 2: `ipproto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_proto: Option<u8>,
    /// Version 2: what a match does; absent, a lookup of `table`.
    #[serde(default, skip_serializing_if = "Action::is_lookup")]
    pub action: Action,
}

/// What a rule does on a match (record format of [`RuleAction`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    #[default]
    Lookup,
    Blackhole,
    /// An action number podgate does not write itself.
    Other(u8),
}

impl Action {
    pub fn is_lookup(&self) -> bool {
        *self == Action::Lookup
    }
}

impl From<RuleAction> for Action {
    fn from(a: RuleAction) -> Action {
        match a {
            RuleAction::Lookup => Action::Lookup,
            RuleAction::Blackhole => Action::Blackhole,
            RuleAction::Other(n) => Action::Other(n),
        }
    }
}

impl From<Action> for RuleAction {
    fn from(a: Action) -> RuleAction {
        match a {
            Action::Lookup => RuleAction::Lookup,
            Action::Blackhole => RuleAction::Blackhole,
            Action::Other(n) => RuleAction::Other(n),
        }
    }
}

impl From<&RuleSpec> for Rule {
    fn from(r: &RuleSpec) -> Rule {
        Rule {
            v6: r.v6,
            priority: r.priority,
            from: r.from,
            to: r.to,
            iif: r.iif.clone(),
            table: r.table,
            protocol: r.protocol,
            suppress_prefixlen: r.suppress_prefixlen,
            ip_proto: r.ip_proto,
            action: r.action.into(),
        }
    }
}

impl Rule {
    pub fn spec(&self) -> RuleSpec {
        RuleSpec {
            v6: self.v6,
            priority: self.priority,
            from: self.from,
            to: self.to,
            iif: self.iif.clone(),
            table: self.table,
            protocol: self.protocol,
            suppress_prefixlen: self.suppress_prefixlen,
            ip_proto: self.ip_proto,
            action: self.action.into(),
        }
    }

    /// Needs record version 2 (a field version 1 does not have).
    pub fn needs_v2(&self) -> bool {
        self.ip_proto.is_some() || !self.action.is_lookup()
    }
}

/// A main-table route to a strict pod's address: the primary's and
/// podgate's replacement (version 2, for the addresses after the first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MainSwap {
    pub original: Route,
    pub replacement: Route,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Strict,
    Standard,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSysctl {
    pub name: String,
    pub value: String,
}

impl From<&SysctlSetting> for NodeSysctl {
    fn from(s: &SysctlSetting) -> NodeSysctl {
        NodeSysctl {
            name: s.name.clone(),
            value: s.value.clone(),
        }
    }
}

impl NodeSysctl {
    pub fn setting(&self) -> SysctlSetting {
        SysctlSetting {
            name: self.name.clone(),
            value: self.value.clone(),
        }
    }
}

/// The node side of a routing boundary: a table of its own, rules, and (strict)
/// the main-table route to the pod replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Routing {
    pub mode: Mode,
    pub uplink: String,
    pub gateway: IpAddr,
    pub table: u32,
    pub pod_ip: IpNet,
    pub host_if: String,
    #[serde(default)]
    pub table_routes: Vec<Route>,
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_original: Option<Route>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_replacement: Option<Route>,
    /// Version 2: the main-table swaps of a strict pod's further addresses
    /// (the first is `mainOriginal`/`mainReplacement`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_mains: Vec<MainSwap>,
    #[serde(default)]
    pub node_sysctls: Vec<NodeSysctl>,
    /// strict: sysctls of the pod's host-side interface (proxy ARP for the
    /// pod's gateway).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_if_sysctls: Vec<NodeSysctl>,
    /// strict: what `host_if_sysctls` held before ADD wrote them (only those
    /// it changed), read before the pending record is written.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_if_previous: BTreeMap<String, String>,
}

impl From<&RoutingPlan> for Routing {
    fn from(p: &RoutingPlan) -> Routing {
        Routing {
            mode: match p.mode {
                RoutingMode::Strict => Mode::Strict,
                RoutingMode::Standard => Mode::Standard,
            },
            uplink: p.uplink.clone(),
            gateway: p.gateway,
            table: p.table,
            pod_ip: p.pod_ip,
            host_if: p.host_if.clone(),
            table_routes: p.table_routes.iter().map(Route::from).collect(),
            rules: p.rules.iter().map(Rule::from).collect(),
            main_original: p.mains.first().map(|m| Route::from(&m.original)),
            main_replacement: p.mains.first().map(|m| Route::from(&m.replacement)),
            extra_mains: p
                .mains
                .iter()
                .skip(1)
                .map(|m| MainSwap {
                    original: Route::from(&m.original),
                    replacement: Route::from(&m.replacement),
                })
                .collect(),
            node_sysctls: p.node_sysctls.iter().map(NodeSysctl::from).collect(),
            host_if_sysctls: p.host_if_sysctls.iter().map(NodeSysctl::from).collect(),
            host_if_previous: p.host_if_previous.clone(),
        }
    }
}

impl Routing {
    /// Every main-table swap, the first one first.
    fn mains(&self) -> Vec<PlanSwap> {
        let first = match (&self.main_original, &self.main_replacement) {
            (Some(o), Some(r)) => Some(MainSwap {
                original: o.clone(),
                replacement: r.clone(),
            }),
            _ => None,
        };
        first
            .iter()
            .chain(&self.extra_mains)
            .map(|m| PlanSwap {
                original: m.original.spec(),
                replacement: m.replacement.spec(),
            })
            .collect()
    }

    /// Needs record version 2 (a field version 1 does not have).
    pub fn needs_v2(&self) -> bool {
        !self.extra_mains.is_empty() || self.rules.iter().any(Rule::needs_v2)
    }

    /// The kit-level plan the routing module applies and removes.
    pub fn plan(&self) -> RoutingPlan {
        RoutingPlan {
            mode: match self.mode {
                Mode::Strict => RoutingMode::Strict,
                Mode::Standard => RoutingMode::Standard,
            },
            uplink: self.uplink.clone(),
            gateway: self.gateway,
            table: self.table,
            pod_ip: self.pod_ip,
            host_if: self.host_if.clone(),
            table_routes: self.table_routes.iter().map(Route::spec).collect(),
            rules: self.rules.iter().map(Rule::spec).collect(),
            mains: self.mains(),
            node_sysctls: self.node_sysctls.iter().map(NodeSysctl::setting).collect(),
            host_if_sysctls: self
                .host_if_sysctls
                .iter()
                .map(NodeSysctl::setting)
                .collect(),
            host_if_previous: self.host_if_previous.clone(),
        }
    }
}
