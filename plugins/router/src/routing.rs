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
use crate::refusal::Refusal;
use ipnet::IpNet;
use podgate_cni::result::IpConfig;
use podgate_cni::CniError;
use podgate_kit::link;
use podgate_kit::nft::SnatFinding;
use podgate_kit::route::{RouteEntry, RouteSpec, RTPROT_PODGATE, TABLE_LOCAL, TABLE_MAIN};
use podgate_kit::rule::{RuleAction, RuleSpec};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `routing.exempt`: before the strict rules, so they win.
pub const PRIO_EXEMPT: u32 = 90;
/// strict, IPv6: neighbour discovery between the pod and its node
/// (ICMPv6 to link-local and link-scope multicast addresses, and to the
/// pod's gateway) is delivered on the node.
pub const PRIO_NDP: u32 = 95;
/// strict, IPv6: every other packet from the pod to a link-local or
/// multicast address is dropped. The kernel looks those up bound to the
/// interface they came in on, the pod's table has no route there, and the
/// walk would go on to the local table: every node service on `[::]`.
pub const PRIO_LINK_SCOPE: u32 = 96;
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
/// `IPPROTO_ICMPV6`.
const ICMPV6: u8 = 58;

/// A strict pod's host-side rule, `iif <host if> lookup T` and no other
/// selector, as [`plan`] writes it: it holds the pod behind its boundary,
/// and its interface exists exactly while the pod's netns does (a veth
/// goes with its namespace). Read back, it tells that a strict pod is
/// bound on the node whether or not its record can be read.
pub fn is_host_side_rule(r: &RuleSpec) -> bool {
    r.protocol == RTPROT_PODGATE
        && r.priority == PRIO_STRICT
        && r.iif.is_some()
        && r.from.is_none()
        && r.to.is_none()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutingPlan {
    pub mode: RoutingMode,
    pub uplink: String,
    pub gateway: IpAddr,
    pub table: u32,
    /// The pod's address of the gateway's family.
    pub pod_ip: IpNet,
    pub host_if: String,
    pub table_routes: Vec<RouteSpec>,
    pub rules: Vec<RuleSpec>,
    /// strict: per address of the pod, the primary's route to it in the
    /// main table and what replaces it (a return-route pool's main route
    /// is the plan's node route).
    pub mains: Vec<MainSwap>,
    /// strict: node-wide sysctls (shared by all strict pods).
    pub node_sysctls: Vec<SysctlSetting>,
    /// strict: sysctls of the pod's host-side interface. Proxy ARP answers
    /// the pod's requests for its gateway (see `host_if_sysctls`); IPv6 is
    /// off on it when the pod has no IPv6 address.
    pub host_if_sysctls: Vec<SysctlSetting>,
    /// strict: what `host_if_sysctls` held before ADD wrote them (only those
    /// it changed). Observed when applied, not planned.
    pub host_if_previous: BTreeMap<String, String>,
}

/// A main-table route to one of a strict pod's addresses: the primary's
/// (`original`, put back at DEL) and podgate's through the uplink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MainSwap {
    pub original: RouteSpec,
    pub replacement: RouteSpec,
}

impl RoutingPlan {
    /// The address families its rules are in: node-wide strict settings
    /// (the local rule moved) are per family.
    pub fn families(&self) -> impl Iterator<Item = bool> + '_ {
        [false, true]
            .into_iter()
            .filter(|v6| self.rules.iter().any(|r| r.v6 == *v6))
    }

    /// The pod table's default route of a family: how that family leaves.
    fn default_route(&self, v6: bool) -> Option<&RouteSpec> {
        self.table_routes
            .iter()
            .find(|r| r.dst.prefix_len() == 0 && r.dst.addr().is_ipv6() == v6)
    }
}

/// Node SNAT that masquerades only marked packets (hostPort hairpin, kube
/// service masquerade) does not touch a pod's own egress; anything else in a
/// nat postrouting chain would. The marked-only chains: kube-proxy's
/// `KUBE-POSTROUTING` (iptables mode) and `masquerading` in its own
/// `kube-proxy` table (nftables mode: packets marked 0x4000 on their way to
/// a Service, and hairpin connections of an endpoint to itself), portmap's
/// `CNI-HOSTPORT-MASQ`.
fn snat_matters(found: &SnatFinding) -> bool {
    let kube_proxy_nftables = found.table == "kube-proxy" && found.in_chain("masquerading");
    !(found.in_chain("KUBE-POSTROUTING")
        || found.in_chain("CNI-HOSTPORT-MASQ")
        || kube_proxy_nftables)
}

const DEFAULT4: IpNet = IpNet::new_assert(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
const DEFAULT6: IpNet = IpNet::new_assert(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0);
/// `fe80::/10`.
const LINK_LOCAL6: IpNet =
    IpNet::new_assert(IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)), 10);
/// `ff02::/16`: link-scope multicast (solicited-node, all-nodes, all-routers).
const LINK_MULTICAST6: IpNet =
    IpNet::new_assert(IpAddr::V6(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0)), 16);
/// `ff00::/8`.
const MULTICAST6: IpNet =
    IpNet::new_assert(IpAddr::V6(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0)), 8);

/// A policy rule of podgate's: `priority: [from F] [to T] [iif I] lookup table`.
fn rule(
    v6: bool,
    priority: u32,
    from: Option<IpNet>,
    to: Option<IpNet>,
    iif: Option<&str>,
    table: u32,
) -> RuleSpec {
    RuleSpec {
        v6,
        priority,
        from,
        to,
        iif: iif.map(str::to_string),
        table,
        protocol: RTPROT_PODGATE,
        ..RuleSpec::default()
    }
}

/// The addresses the boundary covers and the primary's host route to
/// each. strict: every address of the pod, each family
/// through its own gateway (IPv6: `gateway6`); standard: the address of
/// the gateway's family.
fn covered<'v>(
    routing: &Routing,
    strict: bool,
    pod: &[&IpConfig],
    view: &'v NodeView,
) -> Result<Vec<(IpNet, &'v RouteEntry)>, CniError> {
    let family = |a: IpAddr| a.is_ipv4() == routing.gateway.is_ipv4();
    let mut addrs: Vec<IpNet> = pod.iter().map(|c| IpNet::from(c.address.addr())).collect();
    if !strict {
        addrs.retain(|a| family(a.addr()));
        addrs.truncate(1);
    }
    if !addrs.iter().any(|a| family(a.addr())) {
        return Err(Refusal::NoGatewayFamily(routing.gateway).into());
    }
    if let Some(a) = addrs
        .iter()
        .find(|a| routing.gateway_for(a.addr()).is_none())
    {
        return Err(Refusal::NoGateway6(a.addr()).into());
    }
    addrs
        .into_iter()
        .map(|a| host_route(view, a.addr()).map(|r| (a, r)))
        .collect()
}

/// The primary's route to a pod address: routed primaries (ptp, cloud
/// CNIs) install one host route per address through the pod's host-side
/// interface.
fn host_route(view: &NodeView, ip: IpAddr) -> Result<&RouteEntry, CniError> {
    let r = view
        .routes
        .iter()
        .filter(|r| r.table == TABLE_MAIN && r.gateway.is_none() && r.dst.contains(&ip))
        .filter(|r| r.dst.addr().is_ipv4() == ip.is_ipv4())
        .max_by_key(|r| r.dst.prefix_len())
        .ok_or(Refusal::NoHostRoute(ip))?;
    if r.dst.prefix_len() != r.dst.max_prefix_len() {
        return Err(Refusal::SharedSubnet { ip, subnet: r.dst }.into());
    }
    Ok(r)
}

/// The pod's host-side interface: the one every covered address is
/// routed through.
fn host_if_of(view: &NodeView, routes: &[(IpNet, &RouteEntry)]) -> Result<(u32, String), CniError> {
    let mut index = None;
    for (a, r) in routes {
        let i = r.oif.ok_or(Refusal::HostRouteNoInterface)?;
        if index.is_some_and(|x| x != i) {
            return Err(Refusal::SplitHostInterfaces(a.addr()).into());
        }
        index = Some(i);
    }
    let index = index.ok_or(Refusal::NoPodAddress)?;
    let name = link::name_of(&view.links, index).ok_or(Refusal::InterfaceVanished(index))?;
    Ok((index, name.to_string()))
}

/// What refuses a strict pod on this node, before anything is planned.
fn strict_refusals(
    cfg: &RouterConfig,
    routing: &Routing,
    pod: &[&IpConfig],
    host_if: &str,
    view: &NodeView,
    self_key: &podgate_kit::state::Key,
) -> Result<(), CniError> {
    if host_if.contains('.') {
        // Its sysctls could not be named (`net.ipv4.conf.<if>.…` splits on dots).
        return Err(Refusal::DottedHostInterface(host_if.to_string()).into());
    }
    let strict_pods = view
        .claims
        .iter()
        .filter(|c| c.key != *self_key && c.strict)
        .count();
    if strict_pods >= cfg.max_strict_pods {
        return Err(Refusal::MaxStrictPods {
            pods: strict_pods,
            limit: cfg.max_strict_pods,
        }
        .into());
    }
    for e in &routing.exempt {
        if let Some(own) = pod.iter().find(|c| overlaps(&c.address.trunc(), e)) {
            return Err(Refusal::ExemptOverlaps {
                exempt: *e,
                subnet: own.address.trunc(),
            }
            .into());
        }
    }
    if let Some(found) = view.node_snat.iter().find(|d| snat_matters(d)) {
        return Err(Refusal::NodeSnat(found.clone()).into());
    }
    Ok(())
}

fn pick_table(
    routing: &Routing,
    view: &NodeView,
    self_key: &podgate_kit::state::Key,
) -> Result<u32, CniError> {
    match routing.table {
        TableChoice::Id(t) => {
            if let Some(r) = view
                .claims
                .iter()
                .find(|c| c.key != *self_key && c.table == Some(t))
            {
                return Err(Refusal::TableTaken {
                    table: t,
                    pod: r.key.container_id.clone(),
                }
                .into());
            }
            Ok(t)
        }
        TableChoice::Auto => {
            let used = |t: u32| {
                view.routes.iter().any(|r| r.table == t)
                    || view.claims.iter().any(|c| c.table == Some(t))
            };
            TABLE_AUTO
                .clone()
                .find(|t| !used(*t))
                .ok_or_else(|| Refusal::NoFreeTable.into())
        }
    }
}

/// The pod's table: per family a default route through the uplink, per
/// covered address its host route through the pod's interface.
fn table_routes(
    routing: &Routing,
    addrs: &[IpNet],
    uplink_index: u32,
    host_index: u32,
    table: u32,
) -> Vec<RouteSpec> {
    let mut out = Vec::new();
    for v6 in [false, true] {
        let Some(gw) = addrs
            .iter()
            .find(|a| a.addr().is_ipv6() == v6)
            .and_then(|a| routing.gateway_for(a.addr()))
        else {
            continue;
        };
        let mut default = RouteSpec::new(if v6 { DEFAULT6 } else { DEFAULT4 });
        default.gateway = Some(gw);
        default.oif = Some(uplink_index);
        default.table = table;
        default.protocol = RTPROT_PODGATE;
        out.push(default);
    }
    for a in addrs {
        let mut to_pod = RouteSpec::new(*a);
        to_pod.oif = Some(host_index);
        to_pod.table = table;
        to_pod.protocol = RTPROT_PODGATE;
        to_pod.link_scope = a.addr().is_ipv4();
        out.push(to_pod);
    }
    out
}

pub fn plan(
    cfg: &RouterConfig,
    routing: &Routing,
    pod: &[&IpConfig],
    masquerade_planned: bool,
    view: &NodeView,
    self_key: &podgate_kit::state::Key,
) -> Result<RoutingPlan, CniError> {
    let strict = routing.mode == RoutingMode::Strict;
    if strict && masquerade_planned {
        return Err(Refusal::StrictMasquerade.into());
    }
    let covered = covered(routing, strict, pod, view)?;
    let addrs: Vec<IpNet> = covered.iter().map(|(a, _)| *a).collect();
    let pod_ip = addrs
        .iter()
        .copied()
        .find(|a| a.addr().is_ipv4() == routing.gateway.is_ipv4())
        .ok_or(Refusal::NoPodAddress)?;

    let uplink_index = view
        .links
        .iter()
        .find(|l| l.name == routing.uplink)
        .map(|l| l.index)
        .ok_or_else(|| Refusal::NoUplink(routing.uplink.clone()))?;
    let (host_index, host_if) = host_if_of(view, &covered)?;
    if strict {
        strict_refusals(cfg, routing, pod, &host_if, view, self_key)?;
    }
    let table = pick_table(routing, view, self_key)?;
    let table_routes = table_routes(routing, &addrs, uplink_index, host_index, table);

    let (rules, mains, node_sysctls, host_if_sysctls) = if strict {
        let gateways: Vec<IpAddr> = pod.iter().filter_map(|c| c.gateway).collect();
        let mains = covered
            .iter()
            .map(|(a, r)| main_swap(*a, r, routing, uplink_index))
            .collect();
        (
            strict_rules(routing, &addrs, &gateways, &host_if, table),
            mains,
            node_sysctls(&routing.uplink),
            host_if_sysctls(&host_if, &addrs, view.ipv6),
        )
    } else {
        let v6 = pod_ip.addr().is_ipv6();
        let r = |priority, from, to, table| rule(v6, priority, from, to, None, table);
        (
            vec![
                r(PRIO_STANDARD_TO, None, Some(pod_ip), TABLE_MAIN),
                // Same-node pods have host routes (/32, /128) in main: their
                // traffic stays local; everything else uses the pod's table.
                RuleSpec {
                    suppress_prefixlen: Some(u32::from(pod_ip.max_prefix_len()) - 1),
                    ..r(PRIO_STANDARD_FROM - 1, Some(pod_ip), None, TABLE_MAIN)
                },
                r(PRIO_STANDARD_FROM, Some(pod_ip), None, table),
            ],
            Vec::new(),
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
        mains,
        node_sysctls,
        host_if_sysctls,
        host_if_previous: BTreeMap::new(),
    })
}

/// The primary's route to `addr` and podgate's replacement through the
/// uplink: node-to-pod and pod-to-pod traffic leaves by the uplink too.
fn main_swap(addr: IpNet, primary: &RouteEntry, routing: &Routing, uplink_index: u32) -> MainSwap {
    let mut original = RouteSpec::from(primary);
    original.link_scope |= addr.addr().is_ipv4();
    let mut replacement = RouteSpec::new(addr);
    replacement.gateway = routing.gateway_for(addr.addr());
    replacement.oif = Some(uplink_index);
    replacement.protocol = RTPROT_PODGATE;
    replacement.metric = original.metric;
    MainSwap {
        original,
        replacement,
    }
}

fn node_sysctls(up: &str) -> Vec<SysctlSetting> {
    [
        // Also IPv6's: the kernel's early demux of both families follows
        // these two.
        ("net.ipv4.tcp_early_demux", "0"),
        ("net.ipv4.udp_early_demux", "0"),
        // Node-originated packets come back over the uplink with the
        // node's own source: dropped as martians without accept_local.
        (&*format!("net.ipv4.conf.{up}.accept_local"), "1"),
        // Replies from other pods arrive on the uplink: strict rp_filter
        // would find their reverse path on a veth and drop them.
        (&*format!("net.ipv4.conf.{up}.rp_filter"), "2"),
    ]
    .iter()
    .map(|(n, v)| SysctlSetting {
        name: n.to_string(),
        value: v.to_string(),
    })
    .collect()
}

/// The strict rules: exemptions (IPv4), IPv6 neighbour discovery and the
/// link-scope drop, then per family everything from the pod's interface
/// and per address everything to it from the uplink into the pod's table.
fn strict_rules(
    routing: &Routing,
    addrs: &[IpNet],
    gateways: &[IpAddr],
    host_if: &str,
    table: u32,
) -> Vec<RuleSpec> {
    let up = &routing.uplink;
    let v4: Vec<IpNet> = addrs
        .iter()
        .copied()
        .filter(|a| a.addr().is_ipv4())
        .collect();
    let has_v6 = addrs.iter().any(|a| a.addr().is_ipv6());
    let mut rules = Vec::new();
    // Exempt destinations: only the node's own addresses (`lookup local`):
    // one that is not local falls through to the strict rules and crosses
    // the boundary, so an exemption never opens a path off the node.
    // Replies sent from an exempt address go straight back to the pod's
    // veth (the pod's table has its host route).
    for e in &routing.exempt {
        let e = e.trunc();
        rules.push(rule(
            false,
            PRIO_EXEMPT,
            None,
            Some(e),
            Some(host_if),
            TABLE_LOCAL,
        ));
        for a in &v4 {
            rules.push(rule(false, PRIO_EXEMPT, Some(e), Some(*a), None, table));
        }
    }
    if has_v6 {
        let ndp = [LINK_LOCAL6, LINK_MULTICAST6].into_iter().chain(
            gateways
                .iter()
                .filter(|g| g.is_ipv6())
                .map(|g| IpNet::from(*g)),
        );
        for to in ndp {
            rules.push(RuleSpec {
                ip_proto: Some(ICMPV6),
                ..rule(true, PRIO_NDP, None, Some(to), Some(host_if), TABLE_LOCAL)
            });
        }
        for to in [LINK_LOCAL6, MULTICAST6] {
            rules.push(RuleSpec {
                action: RuleAction::Blackhole,
                ..rule(true, PRIO_LINK_SCOPE, None, Some(to), Some(host_if), 0)
            });
        }
    }
    for v6 in [false, true] {
        if addrs.iter().any(|a| a.addr().is_ipv6() == v6) {
            rules.push(rule(v6, PRIO_STRICT, None, None, Some(host_if), table));
        }
    }
    for a in addrs {
        rules.push(rule(
            a.addr().is_ipv6(),
            PRIO_STRICT,
            None,
            Some(*a),
            Some(up),
            table,
        ));
    }
    rules
}

/// strict with return routes: each pool crosses the boundary as the pod's
/// own address does. The main table routes it through the uplink (the
/// fabric routes it back to the node), traffic to it from the uplink
/// looks up the pod's table, which has `<pool> via <pod IP>`. `node_routes`
/// (the return routes as planned for a pod without a boundary) become the
/// main-table routes through the uplink.
pub fn bound_return_routes(
    p: &mut RoutingPlan,
    node_routes: &mut [RouteSpec],
) -> Result<(), CniError> {
    if p.mode != RoutingMode::Strict {
        return Ok(());
    }
    for main in node_routes.iter_mut() {
        let v6 = main.dst.addr().is_ipv6();
        let (gw, uplink) = p
            .default_route(v6)
            .map(|d| (d.gateway, d.oif))
            .ok_or(Refusal::ReturnRouteNoGateway(main.dst))?;
        let mut in_table = main.clone();
        in_table.table = p.table;
        p.table_routes.push(in_table);
        p.rules.push(rule(
            v6,
            PRIO_STRICT,
            None,
            Some(main.dst),
            Some(&p.uplink),
            p.table,
        ));
        main.gateway = gw;
        main.oif = uplink;
        main.onlink = false;
    }
    Ok(())
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
fn host_if_sysctls(host_if: &str, addrs: &[IpNet], node_ipv6: bool) -> Vec<SysctlSetting> {
    let mut out = Vec::new();
    if addrs.iter().any(|a| a.addr().is_ipv4()) {
        out.push((format!("net.ipv4.conf.{host_if}.proxy_arp"), "1"));
        out.push((format!("net.ipv4.neigh.{host_if}.proxy_delay"), "0"));
    }
    // A pod without an IPv6 address gets none of the node's IPv6 through
    // its interface: no link-local address on the node's side to reach
    // node services on `[::]` at, every IPv6 packet from the pod dropped.
    if node_ipv6 && !addrs.iter().any(|a| a.addr().is_ipv6()) {
        out.push((format!("net.ipv6.conf.{host_if}.disable_ipv6"), "1"));
    }
    out.into_iter()
        .map(|(name, value)| SysctlSetting {
            name,
            value: value.to_string(),
        })
        .collect()
}

/// Whether `name` is one of the sysctls a plan writes in the node's own
/// namespace ([`node_sysctls`], [`host_if_sysctls`] for an IPv4 pod, a pod
/// with IPv6 and a node without), for any one interface (never `all` or
/// `default`, which would change every interface): the only node sysctls
/// the sysctl broker opens for the node agent (adoption, the sweep's
/// restore).
pub fn node_sysctl_allowed(name: &str) -> bool {
    const IF: &str = "IFNAME";
    let v4: IpNet = IpNet::from(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let given: Vec<&str> = name.split('.').collect();
    node_sysctls(IF)
        .into_iter()
        .chain(host_if_sysctls(IF, &[v4], false))
        .chain(host_if_sysctls(IF, &[], true))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_sysctls_a_plan_writes_are_the_only_ones_allowed_in_the_nodes_namespace() {
        let v4: IpNet = "10.40.0.3/32".parse().unwrap();
        let v6: IpNet = "fd00:40::3/128".parse().unwrap();
        for s in node_sysctls("pgup0")
            .iter()
            .chain(&host_if_sysctls("veth12ab34cd", &[v4], true))
            .chain(&host_if_sysctls("veth12ab34cd", &[v4, v6], true))
        {
            assert!(node_sysctl_allowed(&s.name), "{}", s.name);
        }
        assert!(node_sysctl_allowed("net.ipv6.conf.eth0.disable_ipv6"));
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
            "net.ipv6.conf.all.disable_ipv6",
            "net.ipv6.conf.default.disable_ipv6",
        ] {
            assert!(!node_sysctl_allowed(other), "{other}");
        }
    }
}
