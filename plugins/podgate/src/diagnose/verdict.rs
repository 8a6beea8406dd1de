//! The diagnosis as a pure function of (facts, probe results): the checks
//! table, one row per hop, and the verdict naming the first broken hop and
//! the layer to look at next.
//!
//! Probes run inside the VPN pod's netns, where forwarding does not matter
//! for the pod's own packets. So a hop that answers the pod can still be
//! dead for tunnel clients: a transit target counts as broken when the
//! client path lacks forwarding or a return path for the client pool, even if
//! the probe answered.

use super::facts::{Facts, RouteFact};
use super::{ProbeRun, Role, Target};
use crate::probe::Outcome;
use ipnet::IpNet;
use serde::Serialize;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Fail,
    Warn,
    Skip,
}

impl Status {
    pub fn text(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Fail => "FAIL",
            Status::Warn => "warn",
            Status::Skip => "skip",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

fn check(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status,
        detail: detail.into(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HopState {
    /// Answers, and nothing on the client path is missing.
    Ok,
    /// No answer (or unreachable) from inside the pod.
    Silent,
    /// Answers the pod itself, but tunnel clients cannot get there and back.
    Blocked,
    /// Answered with an error (DNS NXDOMAIN, nothing on port 53).
    Failed,
    /// Not probed: an earlier hop is broken.
    NotProbed,
}

impl HopState {
    pub fn text(self) -> &'static str {
        match self {
            HopState::Ok => "ok",
            HopState::Silent => "SILENT",
            HopState::Blocked => "BLOCKED",
            HopState::Failed => "FAILED",
            HopState::NotProbed => "-",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hop {
    pub role: Role,
    pub target: String,
    pub method: &'static str,
    pub state: HopState,
    /// What the probes saw.
    pub result: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hop: Option<String>,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    pub checks: Vec<Check>,
    pub hops: Vec<Hop>,
    pub verdict: Verdict,
    /// Caveats on how to read the probes.
    pub notes: Vec<String>,
}

/// How replies to a client pool find their way back into the tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReturnPath {
    /// podgate-shaped masquerade in the pod covers the pool.
    Masquerade(String),
    /// The node routes the pool back via this pod.
    Route(String),
    /// Some other source NAT exists in the pod; its match is not decoded.
    Unverified(String),
    /// Neither; `elsewhere` is a node route covering the pool via someone else.
    Missing { elsewhere: Option<String> },
}

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
        return ReturnPath::Masquerade(format!(
            "masquerade in the pod: inet {} {} out {}",
            m.table, m.source, m.oifname
        ));
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
                return ReturnPath::Route(format!("return route on the node: {}", r.describe()));
            }
            elsewhere = Some(r.describe());
        }
    }
    if let Some(o) = f.other_snat.first() {
        return ReturnPath::Unverified(format!(
            "source NAT in the pod not written by podgate ({o}); assumed to cover {pool}"
        ));
    }
    ReturnPath::Missing { elsewhere }
}

pub fn forwarding(f: &Facts, v6: bool) -> Option<bool> {
    let v = if v6 {
        &f.forwarding_v6
    } else {
        &f.forwarding_v4
    };
    v.as_deref().map(|s| s.trim() != "0")
}

fn fwd_name(v6: bool) -> &'static str {
    if v6 {
        "net.ipv6.conf.all.forwarding"
    } else {
        "net.ipv4.ip_forward"
    }
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

fn is_local(f: &Facts, addr: IpAddr) -> bool {
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

pub fn checks(f: &Facts, targets: &[Target]) -> Vec<Check> {
    let ctx = client_context(f, targets);
    let mut out = Vec::new();
    for v6 in [false, true] {
        let fam = if v6 { "ipv6" } else { "ipv4" };
        let used = family_used(f, targets, v6) || (!v6 && f.pools.is_empty() && targets.is_empty());
        let name = format!("forwarding {fam}");
        let s = fwd_name(v6);
        match forwarding(f, v6) {
            None if v6 => out.push(check(name, Status::Skip, "IPv6 is disabled in this netns")),
            None => out.push(check(name, Status::Warn, format!("{s} could not be read"))),
            Some(true) => out.push(check(name, Status::Ok, format!("{s} = 1 in the pod netns"))),
            Some(false) if ctx && used => out.push(check(
                name,
                Status::Fail,
                format!("{s} = 0 in the pod netns: packets from the tunnel are not forwarded"),
            )),
            Some(false) if used => out.push(check(
                name,
                Status::Warn,
                format!("{s} = 0 in the pod netns (matters only for traffic the pod forwards)"),
            )),
            Some(false) => out.push(check(
                name,
                Status::Skip,
                format!("{s} = 0 (no {fam} pools or targets)"),
            )),
        }
    }
    for v6 in [false, true] {
        if !(family_used(f, targets, v6) || (!v6 && targets.is_empty())) {
            continue;
        }
        let fam = if v6 { "ipv6" } else { "ipv4" };
        let default = f
            .pod_routes
            .iter()
            .find(|r| r.dst.prefix_len() == 0 && r.dst.addr().is_ipv6() == v6);
        out.push(match default {
            Some(r) => check(format!("default route {fam}"), Status::Ok, r.describe()),
            None => check(
                format!("default route {fam}"),
                Status::Warn,
                "none: only destinations with a specific route are reachable",
            ),
        });
    }
    for pool in &f.pools {
        let name = format!("return path {pool}");
        let mut extra = String::new();
        if let Some(e) = &f.nft_error {
            extra += &format!("; nf_tables unreadable: {e}");
        }
        if let Some(e) = &f.node_error {
            extra += &format!("; node routes unreadable: {e}");
        }
        out.push(match return_path(f, pool) {
            ReturnPath::Masquerade(d) | ReturnPath::Route(d) => check(name, Status::Ok, d + &extra),
            ReturnPath::Unverified(d) => check(name, Status::Warn, d + &extra),
            ReturnPath::Missing { elsewhere } => check(
                name,
                Status::Fail,
                format!(
                    "no masquerade for {pool} in the pod and no return route on the node{}{extra}",
                    elsewhere
                        .map(|e| format!(" (the node's route {e} does not go via this pod)"))
                        .unwrap_or_default()
                ),
            ),
        });
    }
    // Routed pools keep the client's source address: the primary must allow it.
    for pool in &f.pools {
        if let (ReturnPath::Route(_), Some(r)) = (return_path(f, pool), spoofing_recipe(f, pool)) {
            out.push(check(format!("anti-spoofing {pool}"), Status::Warn, r));
        }
    }
    if ctx && f.pools.is_empty() {
        out.push(check(
            "return path",
            Status::Warn,
            "no --pool given (and no podgate record): masquerade and return routes not checked",
        ));
    }
    if !f.rp_filter.is_empty() {
        let values: Vec<String> = f
            .rp_filter
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let strict = rp_strict(f);
        out.push(if strict.is_empty() {
            check("rp_filter", Status::Ok, format!("{} (off or loose)", values.join(" ")))
        } else {
            check(
                "rp_filter",
                Status::Warn,
                format!(
                    "{}: strict on {}; packets arriving where the pod would not route their source back are dropped",
                    values.join(" "),
                    strict.join(", ")
                ),
            )
        });
    }
    out
}

/// The verdict for one target from its probes (and the facts).
pub struct HopVerdict {
    pub state: HopState,
    pub reason: Option<String>,
    pub next: Option<String>,
}

/// How to make the primary accept `pool` as a source, when it filters.
fn spoofing_recipe(f: &Facts, pool: &IpNet) -> Option<String> {
    f.primary
        .as_ref()
        .and_then(|p| super::primary::recipe(p, pool))
}

fn ok() -> HopVerdict {
    HopVerdict {
        state: HopState::Ok,
        reason: None,
        next: None,
    }
}

fn broken(state: HopState, reason: String, next: &str) -> HopVerdict {
    HopVerdict {
        state,
        reason: Some(reason),
        next: Some(next.to_string()),
    }
}

fn next_past_pod(t: &Target) -> &'static str {
    match t.role {
        Role::Pod => "the pod network past the VPN pod: the node's route to the target, NetworkPolicy, the target pod itself",
        Role::Service => "the Service: kube-proxy rules and endpoints (a ClusterIP may ignore ICMP: probe IP:PORT)",
        Role::Public => "the node's egress: its default route, SNAT of pod traffic on the node, firewalls",
        Role::Dns => "the DNS service: its endpoints (CoreDNS), NetworkPolicy on port 53",
        Role::Peer => "the tunnel",
    }
}

pub fn hop(f: &Facts, ctx: bool, run: &ProbeRun) -> HopVerdict {
    let t = &run.target;
    let label = t.label();
    let d = &run.direct;
    if t.role == Role::Peer {
        if d.reached() {
            return ok();
        }
        return broken(
            HopState::Silent,
            format!(
                "tunnel peer {} {}: the tunnel itself is down (or {} is not its far end); nothing beyond it can work",
                t.addr,
                d.describe(),
                t.addr
            ),
            "the VPN process and its tunnel interface in the pod, the UDP port mapping to the pod, the client's log",
        );
    }
    if t.role == Role::Dns {
        match d {
            Outcome::BadAnswer { detail } => {
                return broken(
                    HopState::Failed,
                    format!("nameserver {} answers, but {detail}: a DNS problem (the name, search domains, CoreDNS or its upstream), not forwarding", t.addr),
                    "the DNS layer: the name and search path in the pod's resolv.conf, CoreDNS logs",
                )
            }
            Outcome::Refused { detail } => {
                return broken(
                    HopState::Failed,
                    format!("nameserver {}: {detail}", t.addr),
                    "the nameserver address in the pod's resolv.conf and the DNS service's endpoints",
                )
            }
            _ => {}
        }
    }
    if !d.reached() {
        if is_local(f, t.addr) {
            return broken(
                HopState::Silent,
                format!("{label} is the pod's own address and {}", d.describe()),
                "the pod's firewall (nf_tables input)",
            );
        }
        return match route_to(f, t.addr) {
            None => broken(
                HopState::Silent,
                format!(
                    "{label} unreachable: the pod netns has no route to {} (no default route)",
                    t.addr
                ),
                "the pod's routes (`podgate route list`) and the primary CNI plugin's result",
            ),
            Some(r) => {
                let hint = if t.role == Role::Service && t.port.is_none() {
                    " (a ClusterIP often ignores ping: give --service IP:PORT)"
                } else {
                    ""
                };
                broken(
                    HopState::Silent,
                    format!(
                        "{label} {} even from the VPN pod itself (route: {}): the break is past the pod, not in its forwarding{hint}",
                        d.describe(),
                        r.describe()
                    ),
                    next_past_pod(t),
                )
            }
        };
    }
    if !ctx {
        return ok();
    }
    let v6 = t.addr.is_ipv6();
    let missing: Vec<(IpNet, Option<String>)> = f
        .pools
        .iter()
        .filter(|p| family_v6(p) == v6)
        .filter_map(|p| match return_path(f, p) {
            ReturnPath::Missing { elsewhere } => Some((*p, elsewhere)),
            _ => None,
        })
        .collect();
    let pools: Vec<String> = missing.iter().map(|(p, _)| p.to_string()).collect();
    if forwarding(f, v6) == Some(false) {
        let also = if pools.is_empty() {
            String::new()
        } else {
            format!(
                "; no masquerade or return route for {} either: fix that next",
                pools.join(", ")
            )
        };
        return broken(
            HopState::Blocked,
            format!(
                "{label} silent for tunnel clients: forwarding is off in the pod netns ({} = 0); the pod itself reaches it ({}), packets from the tunnel are dropped at the second hop{also}",
                fwd_name(v6),
                d.describe()
            ),
            "turn forwarding on in the pod netns so it survives restarts: a podgate-router profile with sysctls {\"net.ipv4.ip_forward\": \"1\"} (to test: podgate sysctl set net.ipv4.ip_forward=1 in that netns)",
        );
    }
    if !missing.is_empty() {
        let elsewhere: Vec<String> = missing
            .iter()
            .filter_map(|(_, e)| {
                e.as_ref()
                    .map(|e| format!("; the node's route {e} does not go via this pod"))
            })
            .collect();
        return broken(
            HopState::Blocked,
            format!(
                "{label} silent: forwarding is on; no masquerade for {} and no return route on the node: replies cannot find the tunnel{}",
                pools.join(", "),
                elsewhere.concat()
            ),
            "the return path: masquerade the pool in the pod (podgate-router profile `masquerade`) or route it back via the pod on the node (`returnRoutes`)",
        );
    }
    if let Some((src, b)) = &run.bound {
        if !b.reached() {
            let pool = f.pools.iter().find(|p| p.contains(src));
            let masq = pool.is_some_and(|p| matches!(return_path(f, p), ReturnPath::Masquerade(_)));
            let why = if masq {
                "masquerade rewrites the source on the way out, so the reply should come back to the pod's address: look at the node and the target's policy"
            } else {
                "replies to the tunnel address do not come back: look at policies that see the client address (NetworkPolicy, firewalls), the primary's anti-spoofing and rp_filter"
            };
            let mut v = broken(
                HopState::Blocked,
                format!(
                    "{label}: the pod reaches it, but a probe from {src} {}; {why}",
                    b.describe()
                ),
                "the return path of client-addressed traffic",
            );
            if let Some(r) = pool.filter(|_| !masq).and_then(|p| spoofing_recipe(f, p)) {
                v.next = Some(r);
            }
            return v;
        }
    }
    ok()
}

fn result_text(f: &Facts, run: &ProbeRun) -> String {
    let mut s = run.direct.describe();
    if run.target.role == Role::Peer && is_local(f, run.target.addr) {
        s += " (the pod's own address: proves the netns answers, not the tunnel)";
    }
    if let Some((src, b)) = &run.bound {
        s += &format!("; from {src}: {}", b.describe());
        let masq = f
            .pools
            .iter()
            .find(|p| p.contains(src))
            .is_some_and(|p| matches!(return_path(f, p), ReturnPath::Masquerade(_)));
        if masq && b.reached() {
            s += " (masqueraded)";
        }
    }
    s
}

/// The whole diagnosis. `runs` are the probes made, in target order; targets
/// after the first broken hop are reported as not probed.
pub fn judge(f: &Facts, targets: &[Target], runs: &[ProbeRun]) -> Diagnosis {
    let checks = checks(f, targets);
    let ctx = client_context(f, targets);
    let mut hops = Vec::new();
    let mut verdict: Option<Verdict> = None;
    let mut answered: Vec<String> = Vec::new();
    for t in targets {
        let run = runs.iter().find(|r| &r.target == t);
        let (Some(run), None) = (run, &verdict) else {
            hops.push(Hop {
                role: t.role,
                target: t.addr_text(),
                method: t.method(),
                state: HopState::NotProbed,
                result: "not probed (stopped at the first broken hop)".into(),
                reason: None,
                next: None,
            });
            continue;
        };
        let hv = hop(f, ctx, run);
        if hv.state != HopState::Ok {
            let mut message = hv.reason.clone().unwrap_or_default();
            if t.role == Role::Dns && answered.iter().any(|a| !a.starts_with("peer")) {
                message += &format!(
                    "; the IP hops before it answer ({}), so this is DNS, not forwarding",
                    answered.join(", ")
                );
            }
            verdict = Some(Verdict {
                ok: false,
                hop: Some(t.label()),
                message,
                next: hv.next.clone(),
            });
        } else {
            answered.push(t.label());
        }
        hops.push(Hop {
            role: t.role,
            target: t.addr_text(),
            method: t.method(),
            state: hv.state,
            result: result_text(f, run),
            reason: hv.reason,
            next: hv.next,
        });
    }
    let fails: Vec<&Check> = checks.iter().filter(|c| c.status == Status::Fail).collect();
    let verdict = verdict.unwrap_or_else(|| {
        let fail_text = fails
            .iter()
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect::<Vec<_>>()
            .join("; ");
        match (targets.is_empty(), fails.is_empty()) {
            (true, true) => Verdict {
                ok: true,
                hop: None,
                message: "all checks pass (nothing probed: give --peer, --pod, --service, --public or --dns)".into(),
                next: None,
            },
            (true, false) => Verdict {
                ok: false,
                hop: None,
                message: format!("checks failed: {fail_text}"),
                next: Some("probe the hops (--peer, --pod, ...) to see which one this breaks".into()),
            },
            (false, true) => Verdict {
                ok: true,
                hop: None,
                message: format!("all {} hops answer: {}", targets.len(), answered.join(" -> ")),
                next: None,
            },
            (false, false) => Verdict {
                ok: false,
                hop: None,
                message: format!("all hops answer, but checks failed: {fail_text}"),
                next: None,
            },
        }
    });
    let mut notes = Vec::new();
    if let Some(src) = f.from {
        let masq = f
            .pools
            .iter()
            .find(|p| p.contains(&src))
            .is_some_and(|p| matches!(return_path(f, p), ReturnPath::Masquerade(_)));
        if masq {
            notes.push(format!(
                "probes from {src} are masqueraded on the way out, as a client's packets are: they show the masqueraded path and cannot show what a target sees of the client's own address"
            ));
        } else {
            notes.push(format!(
                "probes from {src} need replies routed back to the tunnel address, as a client's do; they leave from the pod itself, so forwarding is judged from the sysctl, not from them"
            ));
        }
    }
    Diagnosis {
        checks,
        hops,
        verdict,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::super::facts::MasqFact;
    use super::*;

    fn rf(dst: &str, gw: Option<&str>, dev: &str) -> RouteFact {
        RouteFact {
            dst: dst.parse().unwrap(),
            gateway: gw.map(|g| g.parse().unwrap()),
            dev: Some(dev.into()),
            protocol: 0,
        }
    }

    /// The article's VPN pod: eth0 10.22.0.5, tun0 10.8.0.1 peer 10.8.0.2.
    fn vpn_pod(forwarding: &str) -> Facts {
        Facts {
            pools: vec!["10.8.0.0/24".parse().unwrap()],
            from: Some("10.8.0.1".parse().unwrap()),
            pod_addrs: vec![
                "10.22.0.5/16".parse().unwrap(),
                "10.8.0.1/32".parse().unwrap(),
            ],
            forwarding_v4: Some(forwarding.into()),
            forwarding_v6: Some("0".into()),
            rp_filter: vec![("all".into(), "0".into()), ("eth0".into(), "0".into())],
            pod_routes: vec![
                rf("0.0.0.0/0", Some("10.22.0.1"), "eth0"),
                rf("10.22.0.0/16", None, "eth0"),
                rf("10.8.0.2/32", None, "tun0"),
            ],
            ..Facts::default()
        }
    }

    fn targets() -> Vec<Target> {
        vec![
            Target {
                role: Role::Peer,
                addr: "10.8.0.2".parse().unwrap(),
                port: None,
                name: None,
            },
            Target {
                role: Role::Pod,
                addr: "10.22.0.3".parse().unwrap(),
                port: None,
                name: None,
            },
            Target {
                role: Role::Service,
                addr: "10.96.0.10".parse().unwrap(),
                port: Some(80),
                name: None,
            },
        ]
    }

    fn answered() -> Outcome {
        Outcome::Answered {
            rtt_ms: 0.2,
            detail: String::new(),
        }
    }

    fn silent() -> Outcome {
        Outcome::Silent { timeout_ms: 1500 }
    }

    fn run(t: &Target, direct: Outcome, bound: Option<Outcome>) -> ProbeRun {
        ProbeRun {
            target: t.clone(),
            direct,
            bound: bound.map(|b| ("10.8.0.1".parse().unwrap(), b)),
        }
    }

    #[test]
    fn state1_forwarding_off_blocks_the_pod_hop_even_though_the_pod_reaches_it() {
        let f = vpn_pod("0");
        let ts = targets();
        let runs = vec![
            run(&ts[0], answered(), None),
            run(&ts[1], answered(), Some(answered())),
        ];
        let d = judge(&f, &ts, &runs);
        assert!(!d.verdict.ok);
        assert_eq!(d.verdict.hop.as_deref(), Some("pod 10.22.0.3"));
        assert!(
            d.verdict
                .message
                .contains("forwarding is off in the pod netns (net.ipv4.ip_forward = 0)"),
            "{}",
            d.verdict.message
        );
        assert_eq!(d.hops[0].state, HopState::Ok);
        assert_eq!(d.hops[1].state, HopState::Blocked);
        assert_eq!(d.hops[2].state, HopState::NotProbed);
        let fwd = d
            .checks
            .iter()
            .find(|c| c.name == "forwarding ipv4")
            .unwrap();
        assert_eq!(fwd.status, Status::Fail);
        let rp = d
            .checks
            .iter()
            .find(|c| c.name == "return path 10.8.0.0/24")
            .unwrap();
        assert_eq!(rp.status, Status::Fail);
    }

    #[test]
    fn state2_forwarding_on_but_no_return_path() {
        let f = vpn_pod("1");
        let ts = targets();
        let runs = vec![
            run(&ts[0], answered(), None),
            run(&ts[1], answered(), Some(silent())),
        ];
        let d = judge(&f, &ts, &runs);
        assert!(!d.verdict.ok);
        assert_eq!(
            d.verdict.message,
            "pod 10.22.0.3 silent: forwarding is on; no masquerade for 10.8.0.0/24 and no return route on the node: replies cannot find the tunnel"
        );
        assert!(d.verdict.next.as_deref().unwrap().contains("returnRoutes"));
        // A return route via another pod is named.
        let mut g = vpn_pod("1");
        g.node_routes = vec![rf("10.8.0.0/24", Some("10.22.0.9"), "br0")];
        let d = judge(&g, &ts, &runs);
        assert!(
            d.verdict.message.contains(
                "the node's route 10.8.0.0/24 via 10.22.0.9 dev br0 does not go via this pod"
            ),
            "{}",
            d.verdict.message
        );
    }

    #[test]
    fn state3_all_fixed_all_hops_answer() {
        let mut f = vpn_pod("1");
        f.masquerade = vec![MasqFact {
            table: "podgate-eth0".into(),
            source: "10.8.0.0/24".parse().unwrap(),
            oifname: "eth0".into(),
        }];
        let ts = targets();
        let runs: Vec<ProbeRun> = ts
            .iter()
            .map(|t| run(t, answered(), t.transit().then(answered)))
            .collect();
        let d = judge(&f, &ts, &runs);
        assert!(d.verdict.ok, "{:?}", d.verdict);
        assert!(d.verdict.message.starts_with("all 3 hops answer"));
        assert!(d.hops.iter().all(|h| h.state == HopState::Ok));
        assert!(d.hops[1].result.contains("masqueraded"));
        assert!(
            d.checks.iter().all(|c| c.status != Status::Fail),
            "{:?}",
            d.checks
        );

        // A return route via this pod is as good as masquerade.
        let mut r = vpn_pod("1");
        r.node_routes = vec![RouteFact {
            protocol: 94,
            ..rf("10.8.0.0/24", Some("10.22.0.5"), "br0")
        }];
        assert!(matches!(
            return_path(&r, &"10.8.0.0/24".parse().unwrap()),
            ReturnPath::Route(_)
        ));
        assert!(judge(&r, &ts, &runs).verdict.ok);
    }

    #[test]
    fn silent_peer_and_silence_past_the_pod() {
        let f = vpn_pod("1");
        let ts = targets();
        let d = judge(&f, &ts, &[run(&ts[0], silent(), None)]);
        assert_eq!(d.verdict.hop.as_deref(), Some("peer 10.8.0.2"));
        assert!(d.verdict.message.contains("the tunnel itself is down"));

        let mut g = vpn_pod("1");
        g.pod_routes.retain(|r| r.dst.prefix_len() > 0);
        let public = Target {
            role: Role::Public,
            addr: "203.0.113.7".parse().unwrap(),
            port: None,
            name: None,
        };
        let d = judge(
            &g,
            std::slice::from_ref(&public),
            &[run(
                &public,
                Outcome::Unreachable {
                    detail: "no route".into(),
                },
                None,
            )],
        );
        assert!(
            d.verdict.message.contains("no route to 203.0.113.7"),
            "{}",
            d.verdict.message
        );

        let d = judge(
            &f,
            &ts,
            &[
                run(&ts[0], answered(), None),
                run(&ts[1], silent(), Some(silent())),
            ],
        );
        assert!(
            d.verdict.message.contains("even from the VPN pod itself"),
            "{}",
            d.verdict.message
        );
    }

    #[test]
    fn dns_failing_while_ip_hops_answer_is_dns() {
        let mut f = vpn_pod("1");
        f.masquerade = vec![MasqFact {
            table: "t".into(),
            source: "10.8.0.0/16".parse().unwrap(),
            oifname: "eth0".into(),
        }];
        f.from = None;
        let mut ts = targets();
        ts.push(Target {
            role: Role::Dns,
            addr: "10.96.0.10".parse().unwrap(),
            port: None,
            name: Some("kubernetes.default".into()),
        });
        let mut runs: Vec<ProbeRun> = ts
            .iter()
            .take(3)
            .map(|t| run(t, answered(), None))
            .collect();
        runs.push(run(
            &ts[3],
            Outcome::BadAnswer {
                detail: "kubernetes.default: NXDOMAIN".into(),
            },
            None,
        ));
        let d = judge(&f, &ts, &runs);
        assert_eq!(
            d.verdict.hop.as_deref(),
            Some("dns kubernetes.default @10.96.0.10")
        );
        assert!(
            d.verdict.message.contains("so this is DNS, not forwarding"),
            "{}",
            d.verdict.message
        );
    }

    #[test]
    fn without_client_context_only_probes_count() {
        let f = Facts {
            forwarding_v4: Some("0".into()),
            ..Facts::default()
        };
        let t = Target {
            role: Role::Public,
            addr: "203.0.113.7".parse().unwrap(),
            port: Some(443),
            name: None,
        };
        let d = judge(&f, std::slice::from_ref(&t), &[run(&t, answered(), None)]);
        assert!(d.verdict.ok, "{:?}", d.verdict);
    }
}
