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

fn main_routes(sock: &mut RouteSocket) -> podgate_kit::Result<Vec<RouteFact>> {
    let links = link::list(sock)?;
    Ok(route::list_all(sock)?
        .into_iter()
        .filter(|e| e.table == TABLE_MAIN && e.route_type() == RouteType::UNICAST)
        .map(|e| RouteFact {
            dst: e.dst,
            gateway: e.gateway,
            dev: dev_name(&links, e.oif),
            protocol: e.protocol,
        })
        .collect())
}

/// Read the pod netns (and the node's, for return routes).
pub fn gather(
    pod: &NetNs,
    node: &NetNs,
    pools: &[IpNet],
    from: Option<IpAddr>,
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
    f.pod_routes = main_routes(&mut sock)?;

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
                match main_routes(&mut s) {
                    Ok(routes) => {
                        f.node_routes = routes
                            .into_iter()
                            .filter(|r| {
                                r.dst.prefix_len() > 0 && pools.iter().any(|p| overlaps(p, &r.dst))
                            })
                            .collect();
                    }
                    Err(e) => f.node_error = Some(e.to_string()),
                }
                link::list(&mut s)
                    .map(|ls| ls.into_iter().map(|l| l.name).collect())
                    .unwrap_or_default()
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
