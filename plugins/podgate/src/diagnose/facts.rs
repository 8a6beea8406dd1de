//! What the pod's and the node's namespaces look like, read once before any
//! probe (no writes). Failures to read are kept as text: a diagnosis goes on.

use crate::routes::{dev_name, RouteText};
use ipnet::IpNet;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_kit::nft::{Family, NftSocket};
use podgate_kit::route::{self, RouteProtocol, RouteType, TABLE_MAIN};
use podgate_kit::{link, sysctl};
use podgate_router::plan::overlaps;
use serde::Serialize;
use std::net::IpAddr;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteFact {
    pub dst: IpNet,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    pub protocol: u8,
}

impl RouteFact {
    pub fn describe(&self) -> String {
        RouteText {
            dst: if self.dst.prefix_len() == 0 {
                "default".to_string()
            } else {
                self.dst.to_string()
            },
            gateway: self.gateway,
            dev: self.dev.as_deref(),
            proto: (self.protocol != 0).then(|| RouteProtocol(self.protocol).to_string()),
            ..RouteText::default()
        }
        .to_string()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MasqFact {
    /// `inet <table>`.
    pub table: String,
    pub source: IpNet,
    pub oifname: String,
}

/// How the node reaches one target: whether the target is served by this
/// node (a return route on this node helps only its replies) or by another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeTarget {
    pub addr: IpAddr,
    /// The node's main-table route to it (longest prefix), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteFact>,
    /// Device of the node's default route of that family (its uplink).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_dev: Option<String>,
    /// The target is one of the node's own addresses.
    pub node_own: bool,
    /// The node's address on the route's device (what other nodes would
    /// route a pool to), preferring one whose subnet holds the gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_addr: Option<IpAddr>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Facts {
    /// Client pools (VPN address pools) whose traffic the pod forwards.
    pub pools: Vec<IpNet>,
    /// Source address probes are also bound to (a tunnel-side address).
    pub from: Option<IpAddr>,
    /// The pod's addresses (loopback excluded).
    pub pod_addrs: Vec<IpNet>,
    /// Raw values; None when absent (IPv6 disabled) or unreadable.
    pub forwarding_v4: Option<String>,
    pub forwarding_v6: Option<String>,
    /// (scope, value): `all`, `default`, then each interface.
    pub rp_filter: Vec<(String, String)>,
    /// Main-table routes of the pod.
    pub pod_routes: Vec<RouteFact>,
    /// podgate-shaped masquerade rules in the pod.
    pub masquerade: Vec<MasqFact>,
    /// Other source NAT in the pod (descriptions; pool coverage not decoded).
    pub other_snat: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nft_error: Option<String>,
    /// Node main-table routes (not default) overlapping a pool.
    pub node_routes: Vec<RouteFact>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_error: Option<String>,
    /// The node's route to each pod target (read when there are pools).
    pub node_targets: Vec<NodeTarget>,
    /// Whether the node netns is the pod netns itself (no node-side view).
    pub node_is_pod: bool,
    /// The node's primary CNI (read when there are pools: its anti-spoofing
    /// matters for pools routed back to the pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primary: Option<super::primary::PrimaryFact>,
}

fn read_opt(name: &str) -> Option<String> {
    sysctl::read(name).ok()
}

fn main_routes(
    sock: &mut RouteSocket,
    links: &[link::Link],
) -> podgate_kit::Result<Vec<RouteFact>> {
    Ok(route::list_all(sock)?
        .into_iter()
        .filter(|e| e.table == TABLE_MAIN && e.route_type() == RouteType::UNICAST)
        .map(|e| RouteFact {
            dst: e.dst,
            gateway: e.gateway,
            dev: dev_name(links, e.oif),
            protocol: e.protocol,
        })
        .collect())
}

/// The node's view of `addr`, from its main-table routes and addresses.
fn node_target(
    addr: IpAddr,
    routes: &[RouteFact],
    addrs: &[(IpNet, Option<String>)],
) -> NodeTarget {
    let family = |n: &IpNet| n.addr().is_ipv6() == addr.is_ipv6();
    let route = routes
        .iter()
        .filter(|r| family(&r.dst) && r.dst.contains(&addr))
        .max_by_key(|r| r.dst.prefix_len())
        .cloned();
    let default_dev = routes
        .iter()
        .find(|r| family(&r.dst) && r.dst.prefix_len() == 0)
        .and_then(|r| r.dev.clone());
    let node_addr = route.as_ref().and_then(|r| {
        let on_dev: Vec<&IpNet> = addrs
            .iter()
            .filter(|(a, d)| family(a) && d.is_some() && *d == r.dev)
            .map(|(a, _)| a)
            .collect();
        on_dev
            .iter()
            .find(|a| r.gateway.is_some_and(|g| a.contains(&g)))
            .or(on_dev.first())
            .map(|a| a.addr())
    });
    NodeTarget {
        addr,
        route,
        default_dev,
        node_own: addrs.iter().any(|(a, _)| a.addr() == addr),
        node_addr,
    }
}

/// Read the pod netns (and the node's, for return routes and for how it
/// reaches each of `pod_targets`).
pub fn gather(
    pod: &NetNs,
    node: &NetNs,
    pools: &[IpNet],
    from: Option<IpAddr>,
    pod_targets: &[IpAddr],
    cni_conf_dir: &std::path::Path,
) -> crate::error::Result<Facts> {
    let mut f = Facts {
        pools: pools.to_vec(),
        from,
        node_is_pod: pod.same_as(node),
        ..Facts::default()
    };
    let mut sock = RouteSocket::in_netns(pod)?;
    let links = link::list(&mut sock)?;
    let lo: Vec<u32> = links
        .iter()
        .filter(|l| l.name == "lo")
        .map(|l| l.index)
        .collect();
    f.pod_addrs = link::addresses(&mut sock)?
        .into_iter()
        .filter(|a| !lo.contains(&a.index))
        .map(|a| a.addr)
        .collect();
    f.pod_routes = main_routes(&mut sock, &links)?;

    let ifaces: Vec<String> = links
        .iter()
        .filter(|l| l.name != "lo")
        .map(|l| l.name.clone())
        .collect();
    let (fwd4, fwd6, rp) = pod.run(|| {
        let mut rp = Vec::new();
        for scope in ["all", "default"]
            .iter()
            .map(|s| s.to_string())
            .chain(ifaces)
        {
            if let Some(v) = read_opt(&format!("net.ipv4.conf.{scope}.rp_filter")) {
                rp.push((scope, v));
            }
        }
        (
            read_opt("net.ipv4.ip_forward"),
            read_opt("net.ipv6.conf.all.forwarding"),
            rp,
        )
    })?;
    f.forwarding_v4 = fwd4;
    f.forwarding_v6 = fwd6;
    f.rp_filter = rp;

    match pod.run(read_nat) {
        Ok(Ok((m, o))) => {
            f.masquerade = m;
            f.other_snat = o;
        }
        Ok(Err(e)) => f.nft_error = Some(e),
        Err(e) => f.nft_error = Some(e.to_string()),
    }

    if !pools.is_empty() {
        let node_sock = RouteSocket::in_netns(node);
        let node_links: Vec<String> = match node_sock {
            Ok(mut s) => {
                let links = link::list(&mut s).unwrap_or_default();
                let addrs: Vec<(IpNet, Option<String>)> = link::addresses(&mut s)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| (a.addr, dev_name(&links, Some(a.index))))
                    .collect();
                match main_routes(&mut s, &links) {
                    Ok(routes) => {
                        f.node_targets = pod_targets
                            .iter()
                            .map(|t| node_target(*t, &routes, &addrs))
                            .collect();
                        f.node_routes = routes
                            .into_iter()
                            .filter(|r| {
                                r.dst.prefix_len() > 0 && pools.iter().any(|p| overlaps(p, &r.dst))
                            })
                            .collect();
                    }
                    Err(e) => f.node_error = Some(e.to_string()),
                }
                links.into_iter().map(|l| l.name).collect()
            }
            Err(e) => {
                f.node_error = Some(e.to_string());
                Vec::new()
            }
        };
        f.primary = Some(super::primary::read(cni_conf_dir, &node_links));
    }
    Ok(f)
}

/// Masquerade as podgate writes it, and any other source NAT, in the calling
/// thread's netns.
fn read_nat() -> Result<(Vec<MasqFact>, Vec<String>), String> {
    let mut nft = NftSocket::new().map_err(|e| e.to_string())?;
    let mut masq = Vec::new();
    let mut decoded = Vec::new();
    for (family, table) in nft.list_tables().map_err(|e| e.to_string())? {
        if Family::from(family) != Family::Inet {
            continue; // only inet tables can be podgate's
        }
        let Some(rules) = nft.list_masquerade(&table).map_err(|e| e.to_string())? else {
            continue;
        };
        let mut all_ours = !rules.is_empty();
        for r in rules {
            match r.rule {
                Some(m) => masq.push(MasqFact {
                    table: table.clone(),
                    source: m.source,
                    oifname: m.oifname,
                }),
                None => all_ours = false,
            }
        }
        if all_ours {
            decoded.push(table);
        }
    }
    let other = nft
        .find_snat_rules(None)
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|d| !(d.family == Family::Inet && decoded.contains(&d.table)))
        .map(|d| d.to_string())
        .collect();
    Ok((masq, other))
}
