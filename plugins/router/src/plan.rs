//! The plan: what ADD will change, as plain data computed without side
//! effects from (selection, profile, prevResult, what the node looks like).

use crate::config::{ConfigError, PodRoute, Profile, RouterConfig};
use crate::intent::Selection;
pub use crate::model::{overlaps, Claim, NodeView, SysctlSetting};
use crate::refusal::Refusal;
use crate::routing::{self, RoutingPlan};
use ipnet::IpNet;
use podgate_cni::{CniError, CniResult};
use podgate_kit::route::{RouteEntry, RouteSpec, RTPROT_PODGATE, TABLE_MAIN};
use podgate_kit::state::Key;
use podgate_kit::sysctl;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Masquerade {
    pub source: IpNet,
    pub oifname: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub profile: String,
    /// Which rule selected the profile (e.g. `assign[0]`).
    pub source: String,
    pub ifname: String,
    pub pod_ips: Vec<IpNet>,
    /// In the pod netns.
    pub sysctls: Vec<SysctlSetting>,
    /// `inet <table>` in the pod netns, if any masquerade or MSS clamp is planned.
    pub nft_table: Option<String>,
    pub masquerade: Vec<Masquerade>,
    /// `mssClamp`: chain `forward` of `nft_table`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mss_clamp: Vec<podgate_kit::nft::MssRule>,
    /// In the pod netns, out of `ifname` (oif resolved when applied).
    pub pod_routes: Vec<PodRoute>,
    /// In the node netns, tagged with RTPROT_PODGATE.
    pub node_routes: Vec<RouteSpec>,
    /// Strict/standard routing boundary (node side).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingPlan>,
}

fn special(net: &IpNet) -> Option<&'static str> {
    let specials: [(&str, &str); 7] = [
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("224.0.0.0/4", "multicast"),
        ("::1/128", "loopback"),
        ("fe80::/10", "link-local"),
        ("ff00::/8", "multicast"),
        ("::/128", "unspecified"),
    ];
    if net.prefix_len() == 0 {
        return Some("a default route");
    }
    specials.iter().find_map(|(cidr, what)| {
        let s: IpNet = cidr.parse().ok()?;
        overlaps(&s, net).then_some(*what)
    })
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

/// The node interface a pod IP is reached through: the most specific
/// gateway-less main-table route covering it.
fn connected_route(view: &NodeView, ip: IpAddr) -> Option<&RouteEntry> {
    view.routes
        .iter()
        .filter(|r| r.table == TABLE_MAIN && r.gateway.is_none() && r.oif.is_some())
        .filter(|r| r.dst.contains(&ip) && same_family(r.dst.addr(), ip))
        .max_by_key(|r| r.dst.prefix_len())
}

/// Why `pool` may not be routed to the attachment `key` (addresses
/// `pod_ips`), None when nothing holds any of it: a special range, the
/// pod's own subnet, a node address or subnet, another live pod's pool,
/// a main-table route (default routes aside) or a gateway of one. Overlap
/// counts either way: a pool inside a prefix would take that part of it
/// from whoever has it (the longest prefix wins within a table), a pool
/// around one would take the rest. Only the main table is looked at: the
/// return route goes there, and a table looked up before it wins whatever
/// the prefix length (README: "Profile selection and refusals").
fn pool_conflict(pool: &IpNet, key: &Key, pod_ips: &[IpNet], view: &NodeView) -> Option<String> {
    if let Some(what) = special(pool) {
        return Some(format!("it overlaps {what}"));
    }
    if let Some(own) = pod_ips.iter().find(|ip| overlaps(&ip.trunc(), pool)) {
        return Some(format!("it overlaps the pod's own subnet {}", own.trunc()));
    }
    if let Some(a) = view.addresses.iter().find(|a| pool.contains(&a.addr())) {
        return Some(format!("it contains the node's address {}", a.addr()));
    }
    if let Some(a) = view.addresses.iter().find(|a| overlaps(&a.trunc(), pool)) {
        return Some(format!(
            "it overlaps the node's subnet {} (address {})",
            a.trunc(),
            a.addr()
        ));
    }
    for c in view.claims.iter().filter(|c| c.key != *key) {
        if let Some(n) = c.pools.iter().find(|n| overlaps(n, pool)) {
            return Some(format!(
                "it overlaps {n}, already routed to pod {} ({}/{})",
                c.key.container_id, c.key.network, c.key.ifname
            ));
        }
    }
    let main = || {
        view.routes
            .iter()
            .filter(|r| r.table == TABLE_MAIN && same_family(r.dst.addr(), pool.addr()))
    };
    if let Some((r, g)) = main().find_map(|r| Some((r, r.gateways().find(|g| pool.contains(g))?))) {
        return Some(format!(
            "it contains {g}, the gateway of the node's route {} (proto {})",
            r.dst,
            r.route_protocol()
        ));
    }
    main()
        .find(|r| r.dst.prefix_len() > 0 && overlaps(&r.dst, pool))
        .map(|r| {
            format!(
                "the node already routes {}{} (proto {}), which overlaps it",
                r.dst,
                r.gateway.map(|g| format!(" via {g}")).unwrap_or_default(),
                r.route_protocol()
            )
        })
}

/// The sysctls the selected profile sets on `ifname`, as `build` names
/// them: ADD reads their current values in the pod's namespace before the
/// plan is built (outside the node-wide lock). Names `build` refuses are
/// left out (nothing is read for them; the refusal comes from `build`).
pub fn pod_sysctl_names(sel: &Selection, ifname: &str) -> Vec<String> {
    sel.profile
        .sysctls
        .keys()
        .map(|k| sysctl::expand_ifname(k, ifname))
        .filter(|n| sysctl::path_of(n).is_ok())
        .collect()
}

/// A return route's pod address has no connected route on the node.
#[derive(Debug, thiserror::Error)]
#[error("return route {pool}: the node has no route to the pod address {via}")]
pub struct NoRouteToPod {
    pub pool: IpNet,
    pub via: IpAddr,
}

/// The profile's sysctls on `ifname`, each name checked.
fn sysctls(profile: &Profile, ifname: &str) -> Result<Vec<SysctlSetting>, CniError> {
    profile
        .sysctls
        .iter()
        .map(|(k, v)| {
            let name = sysctl::expand_ifname(k, ifname);
            sysctl::path_of(&name)
                .map(|_| SysctlSetting {
                    name,
                    value: v.clone(),
                })
                .map_err(|e| ConfigError(e.to_string()).into())
        })
        .collect()
}

/// The node's return routes for the selection's pools, via the pod's
/// address of each pool's family out of the connected route to it; a pool
/// something else holds ([`pool_conflict`]) is refused.
fn return_routes(
    sel: &Selection,
    key: &Key,
    pod_ips: &[IpNet],
    view: &NodeView,
) -> Result<Vec<RouteSpec>, CniError> {
    let ifname = key.ifname.as_str();
    let mut node_routes = Vec::new();
    for pool in &sel.return_routes {
        let pool = pool.trunc();
        if let Some(why) = pool_conflict(&pool, key, pod_ips, view) {
            return Err(Refusal::ReturnRouteConflict { pool, why }.into());
        }
        let via = pod_ips
            .iter()
            .map(|n| n.addr())
            .find(|a| same_family(*a, pool.addr()))
            .ok_or_else(|| Refusal::ReturnRouteFamily {
                pool,
                ifname: ifname.to_string(),
            })?;
        let conn = connected_route(view, via).ok_or(NoRouteToPod { pool, via })?;
        let host_route = conn.dst.prefix_len() == conn.dst.max_prefix_len();
        let mut spec = RouteSpec::new(pool);
        spec.gateway = Some(via);
        spec.oif = conn.oif;
        spec.protocol = RTPROT_PODGATE;
        // A /32 (or /128) per pod, as routed primaries install it: the pod IP is
        // not on a connected subnet, so the gateway needs `onlink`.
        spec.onlink = host_route;
        node_routes.push(spec);
    }
    Ok(node_routes)
}

/// `podRoutes` with a gateway of the destination's family.
fn check_pod_routes(profile: &Profile) -> Result<(), CniError> {
    for r in &profile.pod_routes {
        if let Some(gw) = r.gw {
            if !same_family(gw, r.dst.addr()) {
                return Err(ConfigError(format!(
                    "podRoutes: {} via {gw} mixes address families",
                    r.dst
                ))
                .into());
            }
        }
    }
    Ok(())
}

pub fn build(
    cfg: &RouterConfig,
    sel: &Selection,
    key: &Key,
    prev: &CniResult,
    view: &NodeView,
) -> Result<Plan, CniError> {
    let profile = sel.profile;
    let ifname = key.ifname.as_str();
    let pod_ips: Vec<IpNet> = prev.ips_of(ifname).iter().map(|i| i.address).collect();
    let sysctls = sysctls(profile, ifname)?;
    let masquerade: Vec<Masquerade> = sel
        .masquerade
        .iter()
        .map(|p| Masquerade {
            source: p.trunc(),
            oifname: ifname.to_string(),
        })
        .collect();
    let mut node_routes = return_routes(sel, key, &pod_ips, view)?;
    check_pod_routes(profile)?;

    let mss_clamp = match profile.mss_clamp {
        Some(c) => {
            let pools: Vec<IpNet> = sel
                .masquerade
                .iter()
                .chain(&sel.return_routes)
                .copied()
                .collect();
            crate::mss::plan(c, &pools, ifname)?
        }
        None => Vec::new(),
    };

    let mut routing = profile
        .routing
        .as_ref()
        .map(|r| {
            let pod = prev.ips_of(ifname);
            routing::plan(cfg, r, &pod, !masquerade.is_empty(), view, key)
        })
        .transpose()?;
    if let Some(r) = routing.as_mut() {
        routing::bound_return_routes(r, &mut node_routes)?;
    }

    Ok(Plan {
        profile: sel.name.to_string(),
        source: sel.source.to_string(),
        ifname: ifname.to_string(),
        pod_ips,
        sysctls,
        nft_table: (!masquerade.is_empty() || !mss_clamp.is_empty()).then(|| cfg.table_for(ifname)),
        masquerade,
        mss_clamp,
        pod_routes: profile.pod_routes.clone(),
        node_routes,
        routing,
    })
}
