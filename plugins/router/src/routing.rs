//! Strict and standard routing boundaries (policy rules + a table per pod).
//!
//! strict: everything to or from the pod leaves through the uplink and comes
//! back, so an outside security boundary sees same-node and node-to-pod
//! traffic too. standard: only off-node traffic uses the pod's table.
//!
//! Planning only, pure: config + intent + node view → [`RoutingPlan`].
//! Applying, removing and checking a plan is [`crate::apply::boundary`];
//! the node-wide strict state file is [`crate::strict_node`].

use crate::config::{RouterConfig, Routing, RoutingMode, TableChoice};
use crate::model::{overlaps, NodeView, SysctlSetting};
use ipnet::IpNet;
use podgate_cni::CniError;
use podgate_kit::link;
use podgate_kit::nft::SnatFinding;
use podgate_kit::route::{RouteSpec, RTPROT_PODGATE, TABLE_LOCAL, TABLE_MAIN};
use podgate_kit::rule::RuleSpec;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// `routing.exempt`: before the strict rules, so they win.
pub const PRIO_EXEMPT: u32 = 90;
/// Strict rules sit above the local table, which strict mode moves down here.
pub const PRIO_STRICT: u32 = 100;
pub const PRIO_LOCAL_MOVED: u32 = 1000;
/// Standard mode, as AWS's branch-ENI standard mode orders them.
pub const PRIO_STANDARD_TO: u32 = 512;
pub const PRIO_STANDARD_FROM: u32 = 1536;
/// `table: auto` picks the first free table in this range.
pub const TABLE_AUTO: std::ops::RangeInclusive<u32> = 20_000..=29_999;
/// IPVS-mode kube-proxy's dummy interface: strict pods are not compatible.
pub const IPVS_LINK: &str = "kube-ipvs0";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutingPlan {
    pub mode: RoutingMode,
    pub uplink: String,
    pub gateway: IpAddr,
    pub table: u32,
    pub pod_ip: IpNet,
    pub host_if: String,
    pub table_routes: Vec<RouteSpec>,
    pub rules: Vec<RuleSpec>,
    /// strict: the primary's route to the pod, and what replaces it.
    pub main_original: Option<RouteSpec>,
    pub main_replacement: Option<RouteSpec>,
    /// strict: node-wide sysctls (shared by all strict pods).
    pub node_sysctls: Vec<SysctlSetting>,
    /// strict: sysctls of the pod's host-side interface. Proxy ARP answers
    /// the pod's requests for its gateway (see `host_if_sysctls`).
    pub host_if_sysctls: Vec<SysctlSetting>,
    /// strict: what `host_if_sysctls` held before ADD wrote them (only those
    /// it changed). Observed when applied, not planned.
    pub host_if_previous: BTreeMap<String, String>,
}

fn refuse(msg: String) -> CniError {
    CniError::policy(msg)
}

/// Node SNAT that masquerades only marked packets (hostPort hairpin, kube
/// service masquerade) does not touch a pod's own egress; anything else in a
/// nat postrouting chain would.
fn snat_matters(found: &SnatFinding) -> bool {
    !(found.in_chain("KUBE-POSTROUTING") || found.in_chain("CNI-HOSTPORT-MASQ"))
}

pub fn plan(
    cfg: &RouterConfig,
    routing: &Routing,
    key_pod_ips: &[IpNet],
    masquerade_planned: bool,
    view: &NodeView,
    self_key: &podgate_kit::state::Key,
) -> Result<RoutingPlan, CniError> {
    let strict = routing.mode == RoutingMode::Strict;
    if strict && masquerade_planned {
        return Err(refuse(
            "strict routing refused: the profile (or an annotation) asks for masquerade, and a strict pod's egress must never be SNATed".into(),
        ));
    }
    let pod_ip = key_pod_ips
        .iter()
        .find(|n| n.addr().is_ipv4() == routing.gateway.is_ipv4())
        .map(|n| IpNet::new(n.addr(), n.max_prefix_len()))
        .ok_or_else(|| {
            refuse(format!(
                "routing: the pod has no address of the gateway's family ({})",
                routing.gateway
            ))
        })?
        .map_err(|e| refuse(format!("routing: {e}")))?;

    let uplink_index = view
        .links
        .iter()
        .find(|l| l.name == routing.uplink)
        .map(|l| l.index)
        .ok_or_else(|| {
            refuse(format!(
                "routing: uplink {} does not exist on the node",
                routing.uplink
            ))
        })?;

    // The primary's route to the pod: routed primaries (ptp, cloud CNIs)
    // install one host route per pod through the pod's host-side interface.
    let host_route = view
        .routes
        .iter()
        .filter(|r| r.table == TABLE_MAIN && r.gateway.is_none() && r.dst.contains(&pod_ip.addr()))
        .max_by_key(|r| r.dst.prefix_len())
        .ok_or_else(|| {
            refuse(format!(
                "routing: the node has no route to the pod {}",
                pod_ip.addr()
            ))
        })?;
    if host_route.dst.prefix_len() != host_route.dst.max_prefix_len() {
        return Err(refuse(format!(
            "routing refused: {} is reached through the shared subnet {}; strict/standard routing needs a routed primary with one host route per pod (e.g. ptp)",
            pod_ip.addr(),
            host_route.dst
        )));
    }
    let host_index = host_route
        .oif
        .ok_or_else(|| refuse("routing: the pod's host route has no interface".into()))?;
    let host_if = link::name_of(&view.links, host_index)
        .ok_or_else(|| refuse(format!("routing: interface index {host_index} vanished")))?
        .to_string();
    if strict && host_if.contains('.') {
        // Its sysctls could not be named (`net.ipv4.conf.<if>.…` splits on dots).
        return Err(refuse(format!(
            "strict routing refused: the pod's host-side interface {host_if:?} has a '.' in its name"
        )));
    }

    if strict {
        let strict_pods = view
            .claims
            .iter()
            .filter(|c| c.key != *self_key && c.strict)
            .count();
        if strict_pods >= cfg.max_strict_pods {
            return Err(refuse(format!(
                "refused by maxStrictPods: this node already has {strict_pods} strict pods (limit {})",
                cfg.max_strict_pods
            )));
        }
        for e in &routing.exempt {
            if let Some(own) = key_pod_ips.iter().find(|ip| overlaps(&ip.trunc(), e)) {
                return Err(refuse(format!(
                    "refused by routing.exempt: {e} overlaps the pod's own subnet {} (its gateway included)",
                    own.trunc()
                )));
            }
        }
        if let Some(found) = view.node_snat.iter().find(|d| snat_matters(d)) {
            return Err(refuse(format!(
                "strict routing refused: node SNAT would rewrite the pod's egress: {found}"
            )));
        }
    }

    let table = match routing.table {
        TableChoice::Id(t) => {
            if let Some(r) = view
                .claims
                .iter()
                .find(|c| c.key != *self_key && c.table == Some(t))
            {
                return Err(refuse(format!(
                    "routing: table {t} is already used by pod {}",
                    r.key.container_id
                )));
            }
            t
        }
        TableChoice::Auto => {
            let used = |t: u32| {
                view.routes.iter().any(|r| r.table == t)
                    || view.claims.iter().any(|c| c.table == Some(t))
            };
            TABLE_AUTO
                .clone()
                .find(|t| !used(*t))
                .ok_or_else(|| refuse("routing: no free route table in 20000-29999".into()))?
        }
    };

    let v6 = !pod_ip.addr().is_ipv4();
    let mut default = RouteSpec::new(if v6 {
        "::/0".parse().map_err(|_| refuse("bad default".into()))?
    } else {
        "0.0.0.0/0"
            .parse()
            .map_err(|_| refuse("bad default".into()))?
    });
    default.gateway = Some(routing.gateway);
    default.oif = Some(uplink_index);
    default.table = table;
    default.protocol = RTPROT_PODGATE;
    let mut to_pod = RouteSpec::new(pod_ip);
    to_pod.oif = Some(host_index);
    to_pod.table = table;
    to_pod.protocol = RTPROT_PODGATE;
    to_pod.link_scope = true;
    let table_routes = vec![default, to_pod];

    let rule =
        |priority, from: Option<IpNet>, to: Option<IpNet>, iif: Option<&str>, table| RuleSpec {
            v6,
            priority,
            from,
            to,
            iif: iif.map(str::to_string),
            table,
            protocol: RTPROT_PODGATE,
            suppress_prefixlen: None,
        };
    let (rules, main_original, main_replacement, node_sysctls, host_if_sysctls) = if strict {
        let mut original = RouteSpec::from(host_route);
        original.link_scope = true;
        let mut replacement = RouteSpec::new(pod_ip);
        replacement.gateway = Some(routing.gateway);
        replacement.oif = Some(uplink_index);
        replacement.protocol = RTPROT_PODGATE;
        replacement.metric = original.metric;
        let up = &routing.uplink;
        let node_sysctls = node_sysctls(up);
        // Exempt destinations: only the node's own addresses (`lookup
        // local`): one that is not local falls through to the strict rules
        // and crosses the boundary, so an exemption never opens a path off
        // the node. Replies sent from an exempt address go straight back to
        // the pod's veth (the pod's table has its host route).
        let mut rules = Vec::new();
        for e in &routing.exempt {
            let e = e.trunc();
            rules.push(rule(
                PRIO_EXEMPT,
                None,
                Some(e),
                Some(&host_if),
                TABLE_LOCAL,
            ));
            rules.push(rule(PRIO_EXEMPT, Some(e), Some(pod_ip), None, table));
        }
        rules.extend([
            rule(PRIO_STRICT, None, None, Some(&host_if), table),
            rule(PRIO_STRICT, None, Some(pod_ip), Some(up), table),
        ]);
        (
            rules,
            Some(original),
            Some(replacement),
            node_sysctls,
            host_if_sysctls(&host_if),
        )
    } else {
        (
            vec![
                rule(PRIO_STANDARD_TO, None, Some(pod_ip), None, TABLE_MAIN),
                // Same-node pods have host routes (/32, /128) in main: their
                // traffic stays local; everything else uses the pod's table.
                RuleSpec {
                    suppress_prefixlen: Some(u32::from(pod_ip.max_prefix_len()) - 1),
                    ..rule(PRIO_STANDARD_FROM - 1, Some(pod_ip), None, None, TABLE_MAIN)
                },
                rule(PRIO_STANDARD_FROM, Some(pod_ip), None, None, table),
            ],
            None,
            None,
            Vec::new(),
            Vec::new(),
        )
    };
    Ok(RoutingPlan {
        mode: routing.mode,
        uplink: routing.uplink.clone(),
        gateway: routing.gateway,
        table,
        pod_ip,
        host_if,
        table_routes,
        rules,
        main_original,
        main_replacement,
        node_sysctls,
        host_if_sysctls,
        host_if_previous: BTreeMap::new(),
    })
}

/// The node's own settings while a strict pod exists: node-wide, and of the
/// uplink.
fn node_sysctls(up: &str) -> Vec<SysctlSetting> {
    [
        ("net.ipv4.tcp_early_demux".to_string(), "0"),
        ("net.ipv4.udp_early_demux".to_string(), "0"),
        // Node-originated packets come back over the uplink with the
        // node's own source: dropped as martians without accept_local.
        (format!("net.ipv4.conf.{up}.accept_local"), "1"),
        // Replies from other pods arrive on the uplink: strict rp_filter
        // would find their reverse path on a veth and drop them.
        (format!("net.ipv4.conf.{up}.rp_filter"), "2"),
    ]
    .into_iter()
    .map(|(name, value)| SysctlSetting {
        name,
        value: value.to_string(),
    })
    .collect()
}

/// Whether `name` is one of the sysctls a plan writes in the node's own
/// namespace ([`node_sysctls`], [`host_if_sysctls`]), for any one interface
/// (never `all` or `default`, which would change every interface): the only
/// node sysctls the sysctl broker opens for the node agent (adoption, the
/// sweep's restore).
pub fn node_sysctl_allowed(name: &str) -> bool {
    const IF: &str = "IFNAME";
    let given: Vec<&str> = name.split('.').collect();
    node_sysctls(IF)
        .into_iter()
        .chain(host_if_sysctls(IF))
        .any(|t| {
            let want: Vec<&str> = t.name.split('.').collect();
            want.len() == given.len()
                && want.iter().zip(&given).all(|(w, g)| match *w {
                    IF => {
                        (1..16).contains(&g.len())
                            && !matches!(*g, "all" | "default")
                            && g.chars()
                                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                    }
                    _ => w == g,
                })
        })
}

/// The pod's gateway must answer ARP. The node answers an ARP request only
/// when the route lookup for the target, with `iif` = the requesting
/// interface, is local or (proxy ARP) leaves by another interface. Strict
/// rules send every lookup from the host-side interface to the pod's table,
/// whose default route leaves by the uplink: with proxy ARP on, the node
/// answers with the host-side interface's MAC, as Calico does for its
/// `169.254.1.1` gateway. No address of the node becomes reachable locally
/// by this (a `lookup local` exception would open the whole node, kubelet
/// included, past the boundary). `proxy_delay` 0: answer at once instead of
/// after up to 0.8 s.
fn host_if_sysctls(host_if: &str) -> Vec<SysctlSetting> {
    [
        (format!("net.ipv4.conf.{host_if}.proxy_arp"), "1"),
        (format!("net.ipv4.neigh.{host_if}.proxy_delay"), "0"),
    ]
    .into_iter()
    .map(|(name, value)| SysctlSetting {
        name,
        value: value.to_string(),
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_sysctls_a_plan_writes_are_the_only_ones_allowed_in_the_nodes_namespace() {
        for s in node_sysctls("pgup0")
            .iter()
            .chain(&host_if_sysctls("veth12ab34cd"))
        {
            assert!(node_sysctl_allowed(&s.name), "{}", s.name);
        }
        for other in [
            "net.core.bpf_jit_harden",
            "net.core.rmem_max",
            "net.ipv4.ip_forward",
            "net.ipv4.tcp_mem",
            "net.ipv4.conf.all.rp_filter",
            "net.ipv4.conf.default.accept_local",
            "net.ipv4.conf.eth0.forwarding",
            "net.ipv4.neigh.default.proxy_delay",
            "net.ipv4.conf.a-very-long-name0.rp_filter",
            "net.ipv4.tcp_early_demux.x",
            "net.ipv6.conf.eth0.disable_ipv6",
        ] {
            assert!(!node_sysctl_allowed(other), "{other}");
        }
    }
}
