//! The operator's text for each finding: check names and details, hop
//! reasons and the next place to look, verdict messages and notes. No rule
//! lives here: everything shown is decided in `rules`.

use super::finding::{CheckFinding, Forwarding, HopFinding, OffNode, ProbeNote, ReturnPath};
use super::{ProbeRun, Role, Target};

fn fam(v6: bool) -> &'static str {
    if v6 {
        "ipv6"
    } else {
        "ipv4"
    }
}

/// The forwarding sysctl of a family.
pub fn fwd_name(v6: bool) -> &'static str {
    if v6 {
        "net.ipv6.conf.all.forwarding"
    } else {
        "net.ipv4.ip_forward"
    }
}

pub fn check_name(c: &CheckFinding) -> String {
    match c {
        CheckFinding::Forwarding { v6, .. } => format!("forwarding {}", fam(*v6)),
        CheckFinding::DefaultRoute { v6, .. } => format!("default route {}", fam(*v6)),
        CheckFinding::ReturnPath { pool, .. } => format!("return path {pool}"),
        CheckFinding::AntiSpoofing { pool, .. } => format!("anti-spoofing {pool}"),
        CheckFinding::PoolsUnknown => "return path".into(),
        CheckFinding::RpFilter { .. } => "rp_filter".into(),
    }
}

fn return_path_text(pool: &ipnet::IpNet, path: &ReturnPath) -> String {
    match path {
        ReturnPath::Masquerade(m) => format!(
            "masquerade in the pod: inet {} {} out {}",
            m.table, m.source, m.oifname
        ),
        ReturnPath::Route(r) => format!("return route on the node: {}", r.describe()),
        ReturnPath::Unverified(o) => {
            format!("source NAT in the pod not written by podgate ({o}); assumed to cover {pool}")
        }
        ReturnPath::Missing { elsewhere } => format!(
            "no masquerade for {pool} in the pod and no return route on the node{}",
            elsewhere
                .as_ref()
                .map(|e| format!(
                    " (the node's route {} does not go via this pod)",
                    e.describe()
                ))
                .unwrap_or_default()
        ),
    }
}

pub fn check_detail(c: &CheckFinding) -> String {
    match c {
        CheckFinding::Forwarding { v6, state } => {
            let s = fwd_name(*v6);
            match state {
                Forwarding::Disabled => "IPv6 is disabled in this netns".into(),
                Forwarding::Unreadable => format!("{s} could not be read"),
                Forwarding::On => format!("{s} = 1 in the pod netns"),
                Forwarding::OffForClients => {
                    format!("{s} = 0 in the pod netns: packets from the tunnel are not forwarded")
                }
                Forwarding::OffUsed => {
                    format!("{s} = 0 in the pod netns (matters only for traffic the pod forwards)")
                }
                Forwarding::OffUnused => format!("{s} = 0 (no {} pools or targets)", fam(*v6)),
            }
        }
        CheckFinding::DefaultRoute { route, .. } => match route {
            Some(r) => r.describe(),
            None => "none: only destinations with a specific route are reachable".into(),
        },
        CheckFinding::ReturnPath {
            pool,
            path,
            nft_error,
            node_error,
        } => {
            let mut s = return_path_text(pool, path);
            if let Some(e) = nft_error {
                s += &format!("; nf_tables unreadable: {e}");
            }
            if let Some(e) = node_error {
                s += &format!("; node routes unreadable: {e}");
            }
            s
        }
        CheckFinding::AntiSpoofing { recipe, .. } => recipe.clone(),
        CheckFinding::PoolsUnknown => {
            "no --pool given (and no podgate record): masquerade and return routes not checked"
                .into()
        }
        CheckFinding::RpFilter { values, strict } => {
            let values: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if strict.is_empty() {
                format!("{} (off or loose)", values.join(" "))
            } else {
                format!(
                    "{}: strict on {}; packets arriving where the pod would not route their source back are dropped",
                    values.join(" "),
                    strict.join(", ")
                )
            }
        }
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

/// Why the hop is broken (None when it is not).
pub fn hop_reason(h: &HopFinding) -> Option<String> {
    Some(match h {
        HopFinding::Ok => return None,
        HopFinding::TunnelDown { target: t, outcome } => format!(
            "tunnel peer {} {}: the tunnel itself is down (or {} is not its far end); nothing beyond it can work",
            t.addr,
            outcome.describe(),
            t.addr
        ),
        HopFinding::DnsBadAnswer { target: t, detail } => format!(
            "nameserver {} answers, but {detail}: a DNS problem (the name, search domains, CoreDNS or its upstream), not forwarding",
            t.addr
        ),
        HopFinding::DnsRefused { target: t, detail } => {
            format!("nameserver {}: {detail}", t.addr)
        }
        HopFinding::OwnAddressSilent { target: t, outcome } => format!(
            "{} is the pod's own address and {}",
            t.label(),
            outcome.describe()
        ),
        HopFinding::NoRoute { target: t } => format!(
            "{} unreachable: the pod netns has no route to {} (no default route)",
            t.label(),
            t.addr
        ),
        HopFinding::SilentPastPod {
            target: t,
            outcome,
            route,
        } => {
            let hint = if t.role == Role::Service && t.port.is_none() {
                " (a ClusterIP often ignores ping: give --service IP:PORT)"
            } else {
                ""
            };
            format!(
                "{} {} even from the VPN pod itself (route: {}): the break is past the pod, not in its forwarding{hint}",
                t.label(),
                outcome.describe(),
                route.describe()
            )
        }
        HopFinding::ForwardingOff {
            target: t,
            outcome,
            unreturned,
        } => {
            let also = if unreturned.is_empty() {
                String::new()
            } else {
                let pools: Vec<String> = unreturned.iter().map(ToString::to_string).collect();
                format!(
                    "; no masquerade or return route for {} either: fix that next",
                    pools.join(", ")
                )
            };
            format!(
                "{} silent for tunnel clients: forwarding is off in the pod netns ({} = 0); the pod itself reaches it ({}), packets from the tunnel are dropped at the second hop{also}",
                t.label(),
                fwd_name(t.addr.is_ipv6()),
                outcome.describe()
            )
        }
        HopFinding::NoReturnPath { target: t, missing } => {
            let pools: Vec<String> = missing.iter().map(|(p, _)| p.to_string()).collect();
            let elsewhere: String = missing
                .iter()
                .filter_map(|(_, e)| {
                    e.as_ref().map(|e| {
                        format!("; the node's route {} does not go via this pod", e.describe())
                    })
                })
                .collect();
            format!(
                "{} silent: forwarding is on; no masquerade for {} and no return route on the node: replies cannot find the tunnel{elsewhere}",
                t.label(),
                pools.join(", "),
            )
        }
        HopFinding::ClientRepliesLost {
            target: t,
            src,
            outcome,
            off_node: Some(o),
            ..
        } => format!(
            "{}: the pod reaches it, but a probe from {src} {}; {}",
            t.label(),
            outcome.describe(),
            off_node_reason(t, o)
        ),
        HopFinding::ClientRepliesLost {
            target: t,
            src,
            outcome,
            masqueraded,
            ..
        } => {
            let why = if *masqueraded {
                "masquerade rewrites the source on the way out, so the reply should come back to the pod's address: look at the node and the target's policy"
            } else {
                "replies to the tunnel address do not come back: look at policies that see the client address (NetworkPolicy, firewalls), the primary's anti-spoofing and rp_filter"
            };
            format!(
                "{}: the pod reaches it, but a probe from {src} {}; {why}",
                t.label(),
                outcome.describe()
            )
        }
    })
}

/// Where to look next for a broken hop (None when it is not broken).
pub fn hop_next(h: &HopFinding) -> Option<String> {
    Some(match h {
        HopFinding::Ok => return None,
        HopFinding::TunnelDown { .. } => "the VPN process and its tunnel interface in the pod, the UDP port mapping to the pod, the client's log".into(),
        HopFinding::DnsBadAnswer { .. } => "the DNS layer: the name and search path in the pod's resolv.conf, CoreDNS logs".into(),
        HopFinding::DnsRefused { .. } => "the nameserver address in the pod's resolv.conf and the DNS service's endpoints".into(),
        HopFinding::OwnAddressSilent { .. } => "the pod's firewall (nf_tables input)".into(),
        HopFinding::NoRoute { .. } => "the pod's routes (`podgate route list`) and the primary CNI plugin's result".into(),
        HopFinding::SilentPastPod { target, .. } => next_past_pod(target).into(),
        HopFinding::ForwardingOff { target, .. } => {
            let s = fwd_name(target.addr.is_ipv6());
            format!("turn forwarding on in the pod netns so it survives restarts: a podgate-router profile with sysctls {{\"{s}\": \"1\"}} (to test: podgate sysctl set --netns <that netns> {s}=1)")
        }
        HopFinding::NoReturnPath { .. } => "the return path: masquerade the pool in the pod (podgate-router profile `masquerade`; works from every node), or, when the cluster routes the pool to this node from every node, route it back via the pod on the node (`returnRoutes`: on this node only)".into(),
        HopFinding::ClientRepliesLost {
            off_node: Some(o), ..
        } => off_node_next(o),
        HopFinding::ClientRepliesLost { recipe: Some(r), .. } => r.clone(),
        HopFinding::ClientRepliesLost { recipe: None, .. } => "the return path of client-addressed traffic".into(),
    })
}

fn via(r: &super::facts::RouteFact) -> String {
    r.gateway
        .map_or_else(|| r.describe(), |g| format!("{} via {g}", r.dst))
}

/// Why a routed pool's replies from another node are lost.
fn off_node_reason(t: &Target, o: &OffNode) -> String {
    format!(
        "{} is not served by this node (the node's route {}): the return route {} exists only on this node, so the node serving {} sends replies to {} its own way (its default route), not back here",
        t.addr,
        o.node_route.describe(),
        via(&o.return_route),
        t.addr,
        o.pool
    )
}

/// The fixes for a return route that exists only on this node.
fn off_node_next(o: &OffNode) -> String {
    let node = o.node_addr.map_or_else(String::new, |a| format!(" ({a})"));
    let mut s = format!(
        "masquerade {pool} in the pod (podgate-router profile `masquerade`: replies then go to the pod's own address, from every node), or route {pool} to this node{node} on every node or on the fabric",
        pool = o.pool
    );
    if let Some(w) = &o.primary_way {
        s += &format!("; {w}");
    }
    s
}

/// What the probes of one target saw. `own_peer`: the peer is the pod's own
/// address; `masqueraded`: the bound probe's pool is masqueraded.
pub fn probe_result(run: &ProbeRun, own_peer: bool, masqueraded: bool) -> String {
    let mut s = run.direct.describe();
    if own_peer {
        s += " (the pod's own address: proves the netns answers, not the tunnel)";
    }
    if let Some((src, b)) = &run.bound {
        s += &format!("; from {src}: {}", b.describe());
        if masqueraded && b.reached() {
            s += " (masqueraded)";
        }
    }
    s
}

pub const NOT_PROBED: &str = "not probed (stopped at the first broken hop)";

/// Appended to a broken DNS hop's reason when IP hops before it answer.
pub fn dns_not_forwarding(answered: &[String]) -> String {
    format!(
        "; the IP hops before it answer ({}), so this is DNS, not forwarding",
        answered.join(", ")
    )
}

fn fail_text(fails: &[&CheckFinding]) -> String {
    fails
        .iter()
        .map(|c| format!("{}: {}", check_name(c), check_detail(c)))
        .collect::<Vec<_>>()
        .join("; ")
}

pub const NOTHING_PROBED: &str =
    "all checks pass (nothing probed: give --peer, --pod, --service, --public or --dns)";

pub fn checks_failed(fails: &[&CheckFinding]) -> String {
    format!("checks failed: {}", fail_text(fails))
}

pub const PROBE_THE_HOPS: &str = "probe the hops (--peer, --pod, ...) to see which one this breaks";

/// `hops`: how many targets were asked for.
pub fn all_answer(hops: usize, answered: &[String]) -> String {
    format!("all {hops} hops answer: {}", answered.join(" -> "))
}

pub fn all_answer_but(fails: &[&CheckFinding]) -> String {
    format!("all hops answer, but checks failed: {}", fail_text(fails))
}

pub fn note(n: ProbeNote) -> String {
    match n {
        ProbeNote::Masqueraded(src) => format!(
            "probes from {src} are masqueraded on the way out, as a client's packets are: they show the masqueraded path and cannot show what a target sees of the client's own address"
        ),
        ProbeNote::ClientAddressed(src) => format!(
            "probes from {src} need replies routed back to the tunnel address, as a client's do; they leave from the pod itself, so forwarding is judged from the sysctl, not from them"
        ),
    }
}
