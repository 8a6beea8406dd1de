//! Strict and standard routing boundaries (policy rules + a table per pod).
//!
//! strict: everything to or from the pod leaves through the uplink and comes
//! back, so an outside security boundary sees same-node and node-to-pod
//! traffic too. standard: only off-node traffic uses the pod's table.

use crate::config::{RouterConfig, Routing, RoutingMode, TableChoice};
use crate::kernel::Kernel;
use crate::plan::{NodeView, SysctlSetting};
use ipnet::IpNet;
use podgate_cni::CniError;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NsIdentity;
use podgate_kit::nft::SnatFinding;
use podgate_kit::route::{self, RouteSpec, RTPROT_PODGATE, TABLE_LOCAL, TABLE_MAIN};
use podgate_kit::rule::{self, RuleSpec};
use podgate_kit::state::StateStore;
use podgate_kit::{link, sysctl, Error};
use serde::{Deserialize, Serialize};
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    #[serde(default)]
    pub host_if_sysctls: Vec<SysctlSetting>,
    /// strict: what `host_if_sysctls` held before ADD wrote them (only those
    /// it changed). Observed when applied, not planned.
    #[serde(default)]
    pub host_if_previous: BTreeMap<String, String>,
}

/// What the node looked like before the first strict pod, restored after the
/// last (`node/strict.json` in the state dir). Written before the node-wide
/// settings change (write-ahead), like the attachment records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeShared {
    /// 1; absent in files written before the format was versioned.
    #[serde(default)]
    pub version: u64,
    /// Boot and node netns it was written in: from another one, it
    /// describes nothing that still exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_netns_id: Option<NsIdentity>,
    pub local_moved: bool,
    pub sysctl_previous: BTreeMap<String, String>,
    /// The values podgate wrote: a sysctl is put back only while it holds one.
    #[serde(default)]
    pub sysctl_written: BTreeMap<String, String>,
}

impl NodeShared {
    fn describes_this_node(&self, boot_id: Option<&str>, node: Option<NsIdentity>) -> bool {
        let same_boot = match (self.boot_id.as_deref(), boot_id) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let same_ns = match (self.node_netns_id, node) {
            (Some(a), Some(b)) => a.same_as(&b),
            _ => true,
        };
        same_boot && same_ns
    }
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
            if let Some(own) = key_pod_ips
                .iter()
                .find(|ip| crate::plan::overlaps(&ip.trunc(), e))
            {
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
        let node_sysctls = [
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
        .collect();
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

const SHARED_KEY: &str = "strict.json";

fn shared_path(store: &StateStore) -> std::path::PathBuf {
    store.dir().join("node").join(SHARED_KEY)
}

pub fn read_shared(store: &StateStore) -> Result<Option<NodeShared>, Error> {
    let p = shared_path(store);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| Error::StateCorrupt {
                path: p,
                msg: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::State {
            path: p,
            op: "read",
            source,
        }),
    }
}

fn write_shared(store: &StateStore, s: &NodeShared) -> Result<(), Error> {
    let node = StateStore::open(&store.dir().join("node"))?;
    let p = shared_path(store);
    let tmp = node
        .dir()
        .join(format!(".tmp-{}-{SHARED_KEY}", std::process::id()));
    let body = serde_json::to_vec_pretty(s).map_err(|e| Error::StateCorrupt {
        path: p.clone(),
        msg: e.to_string(),
    })?;
    std::fs::write(&tmp, body)
        .and_then(|_| std::fs::rename(&tmp, &p))
        .map_err(|source| Error::State {
            path: node.dir().join(SHARED_KEY),
            op: "write",
            source,
        })
}

/// Temp files a killed writer of `node/strict.json` left (lock held).
pub fn sweep_temp(store: &StateStore) -> Result<usize, Error> {
    match StateStore::existing(&store.dir().join("node")) {
        Some(node) => node.sweep_temp(),
        None => Ok(0),
    }
}

fn remove_shared(store: &StateStore) {
    let _ = std::fs::remove_file(shared_path(store));
    let _ = std::fs::remove_dir(store.dir().join("node"));
}

fn local_rule(v6: bool, priority: u32) -> RuleSpec {
    RuleSpec {
        v6,
        priority,
        from: None,
        to: None,
        iif: None,
        table: TABLE_LOCAL,
        protocol: 0,
        suppress_prefixlen: None,
    }
}

/// Node-wide setup for the first strict pod: sysctls and the local rule moved
/// below podgate's rules. Idempotent for later pods (values re-asserted).
/// What it changes is on disk before it changes it.
pub fn ensure_node(
    store: &StateStore,
    k: &mut impl Kernel,
    p: &RoutingPlan,
    boot_id: Option<&str>,
    node_id: Option<NsIdentity>,
) -> Result<bool, Error> {
    let existing = read_shared(store)?.filter(|s| s.describes_this_node(boot_id, node_id));
    let first = existing.is_none();
    let mut shared = existing.unwrap_or_default();
    let v6 = !p.pod_ip.addr().is_ipv4();
    let rules = k.rule_list(v6)?;
    let at_zero = rules.iter().any(|r| r.matches(&local_rule(v6, 0)));
    if first {
        shared.version = 1;
        shared.boot_id = boot_id.map(str::to_string);
        shared.node_netns_id = node_id;
        for s in &p.node_sysctls {
            let cur = k.sysctl_read(&s.name)?;
            if sysctl::normalize(&cur) != sysctl::normalize(&s.value) {
                shared.sysctl_previous.insert(s.name.clone(), cur);
                shared
                    .sysctl_written
                    .insert(s.name.clone(), s.value.clone());
            }
        }
    }
    if first || (at_zero && !shared.local_moved) {
        shared.local_moved |= at_zero;
        write_shared(store, &shared)?;
    }
    for s in &p.node_sysctls {
        k.sysctl_ensure(&s.name, &s.value)?;
    }
    if at_zero {
        // Add the moved rule first: there is never a moment without local lookup.
        if !rules
            .iter()
            .any(|r| r.matches(&local_rule(v6, PRIO_LOCAL_MOVED)))
        {
            k.rule_add(&local_rule(v6, PRIO_LOCAL_MOVED))?;
        }
        k.rule_del(&local_rule(v6, 0))?;
    }
    Ok(first)
}

/// Undo `ensure_node` when no strict pod is left. Idempotent: a rule already
/// back, a sysctl someone else changed since, are left alone. A file from
/// another boot or node netns describes nothing here and is just removed.
pub fn restore_node(store: &StateStore, k: &mut impl Kernel, v6: bool) -> Vec<String> {
    let mut failed = Vec::new();
    let shared = match read_shared(store) {
        Ok(Some(s)) => s,
        Ok(None) => return failed,
        Err(e) => return vec![e.to_string()],
    };
    let here_boot = podgate_kit::netns::boot_id().ok();
    let here_node = podgate_kit::netns::current_identity().ok();
    if !shared.describes_this_node(here_boot.as_deref(), here_node) {
        remove_shared(store);
        return failed;
    }
    if shared.local_moved {
        let has_zero = match k.rule_list(v6) {
            Ok(rs) => rs.iter().any(|r| r.matches(&local_rule(v6, 0))),
            Err(e) => {
                // Unknown: never risk a node without local lookup.
                return vec![e.to_string()];
            }
        };
        if !has_zero {
            if let Err(e) = k.rule_add(&local_rule(v6, 0)) {
                failed.push(e.to_string());
            }
        }
        if let Err(e) = k.rule_del(&local_rule(v6, PRIO_LOCAL_MOVED)) {
            failed.push(e.to_string());
        }
    }
    for (name, prev) in &shared.sysctl_previous {
        let ours = match shared.sysctl_written.get(name) {
            // Files from before `sysctlWritten`: restore as those releases did.
            None => true,
            Some(w) => k
                .sysctl_read(name)
                .is_ok_and(|cur| sysctl::normalize(&cur) == sysctl::normalize(w)),
        };
        if ours {
            if let Err(e) = k.sysctl_ensure(name, prev) {
                failed.push(e.to_string());
            }
        }
    }
    if failed.is_empty() {
        remove_shared(store);
    }
    failed
}

/// Per-pod part: host-side interface sysctls (their previous values go into
/// `p.host_if_previous`), table routes, rules, main route replacement. A
/// failure leaves what was done for [`remove_pod`], which undoes a routing
/// plan from the record whether or not each step was reached.
pub fn apply_pod(k: &mut impl Kernel, p: &mut RoutingPlan) -> Result<(), Error> {
    for s in &p.host_if_sysctls {
        if let Some(prev) = k.sysctl_ensure(&s.name, &s.value)? {
            p.host_if_previous.insert(s.name.clone(), prev);
        }
    }
    for r in &p.table_routes {
        k.route_add(r, true)?;
    }
    for r in &p.rules {
        k.rule_add(r)?;
    }
    if let (Some(_), Some(repl)) = (&p.main_original, &p.main_replacement) {
        k.route_add(repl, true)?;
    }
    Ok(())
}

/// Put a host-side interface sysctl back, but only while it still holds our
/// value (a later writer wins); an interface already gone is fine.
fn restore_host_sysctl(
    k: &mut impl Kernel,
    s: &SysctlSetting,
    previous: Option<&String>,
) -> Result<(), Error> {
    let Some(prev) = previous else {
        return Ok(());
    };
    match k.sysctl_read(&s.name) {
        Ok(cur) if sysctl::normalize(&cur) == sysctl::normalize(&s.value) => {
            match k.sysctl_ensure(&s.name, prev) {
                Err(e) if !e.is_not_found() => Err(e),
                _ => Ok(()),
            }
        }
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Put the primary's route back if its interface still exists; otherwise
/// the pod is gone and only our replacement must go.
fn restore_main(k: &mut impl Kernel, orig: &RouteSpec, repl: &RouteSpec) -> Result<(), Error> {
    match k.route_add(orig, true) {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => k.route_del(repl).map(|_| ()),
        Err(e) => Err(e),
    }
}

/// Everything a routing plan installed, in reverse order of [`apply_pod`]:
/// the one removal of a routing plan (DEL, GC, a failed ADD). Absent things
/// are success; each real failure is one line.
pub fn remove_pod(k: &mut impl Kernel, p: &RoutingPlan) -> Vec<String> {
    let mut failed = Vec::new();
    let mut note = |r: Result<(), Error>| {
        if let Err(e) = r {
            failed.push(e.to_string());
        }
    };
    if let (Some(o), Some(r)) = (&p.main_original, &p.main_replacement) {
        note(restore_main(k, o, r));
    }
    for r in p.rules.iter().rev() {
        note(k.rule_del(r).map(|_| ()));
    }
    for r in p.table_routes.iter().rev() {
        note(k.route_del(r).map(|_| ()));
    }
    for s in p.host_if_sysctls.iter().rev() {
        note(restore_host_sysctl(k, s, p.host_if_previous.get(&s.name)));
    }
    failed
}

/// Drift of a routing plan.
pub fn check(node: &mut RouteSocket, p: &RoutingPlan) -> Result<Vec<String>, Error> {
    let mut drift = Vec::new();
    let v6 = !p.pod_ip.addr().is_ipv4();
    let routes = route::list(node, v6)?;
    for r in &p.table_routes {
        if route::find(&routes, r).is_none() {
            drift.push(format!("route {} is missing", r.describe()));
        }
    }
    if let Some(r) = &p.main_replacement {
        if route::find(&routes, r).is_none() {
            drift.push(format!(
                "main route {} is missing (strict boundary bypassed)",
                r.describe()
            ));
        }
    }
    let rules = rule::list(node, v6)?;
    for r in &p.rules {
        if !rules.iter().any(|x| x.matches(r)) {
            drift.push(format!("rule {} is missing", r.describe()));
        }
    }
    for s in p.node_sysctls.iter().chain(&p.host_if_sysctls) {
        match sysctl::read(&s.name) {
            Ok(v) if sysctl::normalize(&v) == s.value => {}
            Ok(v) => drift.push(format!("node sysctl {} is {v}, want {}", s.name, s.value)),
            Err(e) => drift.push(e.to_string()),
        }
    }
    Ok(drift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_settings_of_another_boot_or_netns_describe_nothing_here() {
        let id = NsIdentity {
            dev: 4,
            ino: 100,
            cookie: Some(7),
        };
        let s = NodeShared {
            version: 1,
            boot_id: Some("b1".into()),
            node_netns_id: Some(id),
            ..Default::default()
        };
        assert!(s.describes_this_node(Some("b1"), Some(id)));
        assert!(!s.describes_this_node(Some("b2"), Some(id)));
        let other = NsIdentity { ino: 101, ..id };
        assert!(!s.describes_this_node(Some("b1"), Some(other)));
        // Unknown on either side never discards the file.
        assert!(s.describes_this_node(None, None));
        let old: NodeShared = serde_json::from_str(
            r#"{"localMoved": true, "sysctlPrevious": {"net.ipv4.tcp_early_demux": "1"}}"#,
        )
        .unwrap();
        assert_eq!(old.version, 0);
        assert!(old.describes_this_node(Some("b1"), Some(id)));
        assert!(old.sysctl_written.is_empty());
    }
}
