//! The diagnosis rules: pure functions from the facts (and the probes) to
//! findings ([`super::finding`]), with no wording.
//!
//! Probes run inside the VPN pod's netns, where forwarding does not matter
//! for the pod's own packets. So a hop that answers the pod can still be
//! dead for tunnel clients: a transit target counts as broken when the
//! client path lacks forwarding or a return path for the client pool, even if
//! the probe answered.

use super::facts::{Facts, RouteFact};
use super::finding::{
    CheckFinding, Forwarding, HopFinding, Locality, OffNode, ProbeNote, ReturnPath, Status,
};
use super::{ProbeRun, Role, Target};
use crate::probe::Outcome;
use ipnet::IpNet;
use std::net::IpAddr;

fn family_v6(n: &IpNet) -> bool {
    n.addr().is_ipv6()
}

fn covers(outer: &IpNet, inner: &IpNet) -> bool {
    family_v6(outer) == family_v6(inner)
        && outer.prefix_len() <= inner.prefix_len()
        && outer.contains(&inner.network())
}

pub fn return_path(f: &Facts, pool: &IpNet) -> ReturnPath {
    if let Some(m) = f.masquerade.iter().find(|m| covers(&m.source, pool)) {
        return ReturnPath::Masquerade(m.clone());
    }
    let mut elsewhere = None;
    if !f.node_is_pod {
        let best = f
            .node_routes
            .iter()
            .filter(|r| covers(&r.dst, pool))
            .max_by_key(|r| r.dst.prefix_len());
        if let Some(r) = best {
            let via_pod = r
                .gateway
                .is_some_and(|g| f.pod_addrs.iter().any(|a| a.addr() == g));
            if via_pod {
                return ReturnPath::Route(r.clone());
            }
            elsewhere = Some(r.clone());
        }
    }
    if let Some(o) = f.other_snat.first() {
        return ReturnPath::Unverified(o.clone());
    }
    ReturnPath::Missing { elsewhere }
}

/// Whether the pool `src` belongs to is masqueraded in the pod.
pub fn masqueraded(f: &Facts, src: &IpAddr) -> bool {
    f.pools
        .iter()
        .find(|p| p.contains(src))
        .is_some_and(|p| matches!(return_path(f, p), ReturnPath::Masquerade(_)))
}

pub fn forwarding(f: &Facts, v6: bool) -> Option<bool> {
    let v = if v6 {
        &f.forwarding_v6
    } else {
        &f.forwarding_v4
    };
    v.as_deref().map(|s| s.trim() != "0")
}

/// Probing on behalf of tunnel clients: pools, a source address or a peer given.
pub fn client_context(f: &Facts, targets: &[Target]) -> bool {
    !f.pools.is_empty() || f.from.is_some() || targets.iter().any(|t| t.role == Role::Peer)
}

/// The pod's route to `addr`: longest main-table prefix (policy rules aside).
pub fn route_to(f: &Facts, addr: IpAddr) -> Option<&RouteFact> {
    f.pod_routes
        .iter()
        .filter(|r| r.dst.addr().is_ipv6() == addr.is_ipv6() && r.dst.contains(&addr))
        .max_by_key(|r| r.dst.prefix_len())
}

pub fn is_local(f: &Facts, addr: IpAddr) -> bool {
    f.pod_addrs.iter().any(|a| a.addr() == addr)
}

fn family_used(f: &Facts, targets: &[Target], v6: bool) -> bool {
    f.pools.iter().any(|p| family_v6(p) == v6) || targets.iter().any(|t| t.addr.is_ipv6() == v6)
}

/// Effective rp_filter per interface: max(all, interface).
pub fn rp_strict(f: &Facts) -> Vec<String> {
    let val = |s: &str| -> u8 {
        f.rp_filter
            .iter()
            .find(|(k, _)| k == s)
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let all = val("all");
    f.rp_filter
        .iter()
        .filter(|(k, _)| k != "all" && k != "default")
        .filter(|(k, _)| all.max(val(k)) == 1)
        .map(|(k, _)| k.clone())
        .collect()
}

/// How to make the primary accept `pool` as a source, when it filters.
fn spoofing_recipe(f: &Facts, pool: &IpNet) -> Option<String> {
    f.primary
        .as_ref()
        .and_then(|p| super::primary::recipe(p, pool))
}

/// Where `addr` is served, as the node routes to it: its own address or a
/// route without gateway into a local pod network is this node; a route
/// through a gateway, or onto the device of the node's default route (the
/// uplink), leads to another node.
pub fn locality(f: &Facts, addr: IpAddr) -> Locality {
    if f.node_is_pod || f.node_error.is_some() {
        return Locality::Unknown;
    }
    let Some(t) = f.node_targets.iter().find(|t| t.addr == addr) else {
        return Locality::Unknown;
    };
    if t.node_own {
        return Locality::ThisNode;
    }
    match &t.route {
        None => Locality::Unknown,
        Some(r) if r.gateway.is_some() || r.dev.is_some() && r.dev == t.default_dev => {
            Locality::Elsewhere(r.clone())
        }
        Some(_) => Locality::ThisNode,
    }
}

/// When `pool` comes back by a route on this node only and `target` is
/// served by another node: the return route cannot help its replies.
fn off_node(f: &Facts, target: &Target, pool: &IpNet) -> Option<OffNode> {
    if target.role != Role::Pod {
        return None;
    }
    let ReturnPath::Route(return_route) = return_path(f, pool) else {
        return None;
    };
    let Locality::Elsewhere(node_route) = locality(f, target.addr) else {
        return None;
    };
    let node_addr = f
        .node_targets
        .iter()
        .find(|t| t.addr == target.addr)
        .and_then(|t| t.node_addr);
    let primary_way = f
        .primary
        .as_ref()
        .and_then(|p| super::primary::cluster_route(p, pool, return_route.gateway, node_addr));
    Some(OffNode {
        pool: *pool,
        return_route,
        node_route,
        node_addr,
        primary_way,
    })
}

/// The checks table, in display order.
pub fn checks(f: &Facts, targets: &[Target]) -> Vec<CheckFinding> {
    let ctx = client_context(f, targets);
    let mut out = Vec::new();
    for v6 in [false, true] {
        let used = family_used(f, targets, v6) || (!v6 && f.pools.is_empty() && targets.is_empty());
        let state = match forwarding(f, v6) {
            None if v6 => Forwarding::Disabled,
            None => Forwarding::Unreadable,
            Some(true) => Forwarding::On,
            Some(false) if ctx && used => Forwarding::OffForClients,
            Some(false) if used => Forwarding::OffUsed,
            Some(false) => Forwarding::OffUnused,
        };
        out.push(CheckFinding::Forwarding { v6, state });
    }
    for v6 in [false, true] {
        if !(family_used(f, targets, v6) || (!v6 && targets.is_empty())) {
            continue;
        }
        let route = f
            .pod_routes
            .iter()
            .find(|r| r.dst.prefix_len() == 0 && r.dst.addr().is_ipv6() == v6)
            .cloned();
        out.push(CheckFinding::DefaultRoute { v6, route });
    }
    for pool in &f.pools {
        out.push(CheckFinding::ReturnPath {
            pool: *pool,
            path: return_path(f, pool),
            nft_error: f.nft_error.clone(),
            node_error: f.node_error.clone(),
        });
    }
    for pool in &f.pools {
        if let (ReturnPath::Route(_), Some(recipe)) =
            (return_path(f, pool), spoofing_recipe(f, pool))
        {
            out.push(CheckFinding::AntiSpoofing {
                pool: *pool,
                recipe,
            });
        }
    }
    if ctx && f.pools.is_empty() {
        out.push(CheckFinding::PoolsUnknown);
    }
    if !f.rp_filter.is_empty() {
        out.push(CheckFinding::RpFilter {
            values: f.rp_filter.clone(),
            strict: rp_strict(f),
        });
    }
    out
}

impl CheckFinding {
    pub fn status(&self) -> Status {
        match self {
            CheckFinding::Forwarding { state, .. } => match state {
                Forwarding::On => Status::Ok,
                Forwarding::OffForClients => Status::Fail,
                Forwarding::Unreadable | Forwarding::OffUsed => Status::Warn,
                Forwarding::Disabled | Forwarding::OffUnused => Status::Skip,
            },
            CheckFinding::DefaultRoute { route: Some(_), .. } => Status::Ok,
            CheckFinding::DefaultRoute { route: None, .. } => Status::Warn,
            CheckFinding::ReturnPath { path, .. } => match path {
                ReturnPath::Masquerade(_) | ReturnPath::Route(_) => Status::Ok,
                ReturnPath::Unverified(_) => Status::Warn,
                ReturnPath::Missing { .. } => Status::Fail,
            },
            CheckFinding::AntiSpoofing { .. } | CheckFinding::PoolsUnknown => Status::Warn,
            CheckFinding::RpFilter { strict, .. } if strict.is_empty() => Status::Ok,
            CheckFinding::RpFilter { .. } => Status::Warn,
        }
    }
}

/// What one target's probes mean (`ctx`: probing for tunnel clients).
pub fn hop(f: &Facts, ctx: bool, run: &ProbeRun) -> HopFinding {
    let target = run.target.clone();
    let d = &run.direct;
    if target.role == Role::Peer {
        if d.reached() {
            return HopFinding::Ok;
        }
        return HopFinding::TunnelDown {
            target,
            outcome: d.clone(),
        };
    }
    if target.role == Role::Dns {
        match d {
            Outcome::BadAnswer { detail } => {
                return HopFinding::DnsBadAnswer {
                    target,
                    detail: detail.clone(),
                }
            }
            Outcome::Refused { detail } => {
                return HopFinding::DnsRefused {
                    target,
                    detail: detail.clone(),
                }
            }
            _ => {}
        }
    }
    if !d.reached() {
        if is_local(f, target.addr) {
            return HopFinding::OwnAddressSilent {
                target,
                outcome: d.clone(),
            };
        }
        return match route_to(f, target.addr) {
            None => HopFinding::NoRoute { target },
            Some(r) => HopFinding::SilentPastPod {
                target,
                outcome: d.clone(),
                route: r.clone(),
            },
        };
    }
    if !ctx {
        return HopFinding::Ok;
    }
    let v6 = target.addr.is_ipv6();
    let missing: Vec<(IpNet, Option<RouteFact>)> = f
        .pools
        .iter()
        .filter(|p| family_v6(p) == v6)
        .filter_map(|p| match return_path(f, p) {
            ReturnPath::Missing { elsewhere } => Some((*p, elsewhere)),
            _ => None,
        })
        .collect();
    if forwarding(f, v6) == Some(false) {
        return HopFinding::ForwardingOff {
            target,
            outcome: d.clone(),
            unreturned: missing.into_iter().map(|(p, _)| p).collect(),
        };
    }
    if !missing.is_empty() {
        return HopFinding::NoReturnPath { target, missing };
    }
    if let Some((src, b)) = &run.bound {
        if !b.reached() {
            let pool = f.pools.iter().find(|p| p.contains(src));
            let masq = pool.is_some_and(|p| matches!(return_path(f, p), ReturnPath::Masquerade(_)));
            return HopFinding::ClientRepliesLost {
                src: *src,
                outcome: b.clone(),
                masqueraded: masq,
                recipe: pool.filter(|_| !masq).and_then(|p| spoofing_recipe(f, p)),
                off_node: pool.and_then(|p| off_node(f, &target, p)),
                target,
            };
        }
    }
    HopFinding::Ok
}

/// The caveat on probes from `--from`, if given.
pub fn probe_note(f: &Facts) -> Option<ProbeNote> {
    f.from.map(|src| {
        if masqueraded(f, &src) {
            ProbeNote::Masqueraded(src)
        } else {
            ProbeNote::ClientAddressed(src)
        }
    })
}
