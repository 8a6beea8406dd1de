//! Apply a plan through the kit, undo it, and check it still holds.
//!
//! Pod-side sockets are opened inside the pod netns (sysctls are written
//! there too) and then driven from this thread; node-side changes use a
//! socket in the plugin's own (the node's) namespace.

use crate::config::RoutingMode;
use crate::plan::Plan;
use crate::record::Record;
use crate::routing;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_kit::nft::{MasqRule, NftSocket, TableRules};
use podgate_kit::route::{self, RouteSpec, RTPROT_PODGATE};
use podgate_kit::state::StateStore;
use podgate_kit::{link, sysctl, Error};
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{0}")]
    Kit(#[from] Error),
    #[error("nf_tables in netns {netns}: {source}")]
    Nft {
        netns: String,
        source: podgate_kit::nft::NftError,
    },
}

/// Sockets bound to the pod's namespace.
pub struct PodSockets {
    pub route: RouteSocket,
    pub nft: NftSocket,
    /// The namespace, for error messages.
    pub netns: String,
}

impl PodSockets {
    /// Attach the namespace to an nf_tables error.
    pub fn nft_err(&self, source: podgate_kit::nft::NftError) -> ApplyError {
        ApplyError::Nft {
            netns: self.netns.clone(),
            source,
        }
    }
}

/// Open both sockets inside `ns` (one trip into the namespace).
pub fn pod_sockets(ns: &NetNs) -> Result<PodSockets, ApplyError> {
    let label = ns.path().display().to_string();
    ns.run(|| open_pod_sockets(label))?
}

/// Called on a thread that is already inside the pod's namespace.
fn open_pod_sockets(label: String) -> Result<PodSockets, ApplyError> {
    let nft = NftSocket::new().map_err(|source| ApplyError::Nft {
        netns: label.clone(),
        source,
    })?;
    Ok(PodSockets {
        route: RouteSocket::new_labelled(label.clone())?,
        nft,
        netns: label,
    })
}

/// Rule tag carried in nf_tables userdata: which attachment owns the rule.
pub fn nft_tag(rec: &Record) -> String {
    format!(
        "podgate:{}:{}:{}",
        rec.key.network, rec.key.container_id, rec.key.ifname
    )
}

fn masq_rules(plan: &Plan) -> Vec<MasqRule> {
    plan.masquerade
        .iter()
        .map(|m| MasqRule {
            source: m.source,
            oifname: m.oifname.clone(),
        })
        .collect()
}

/// One step taken, so a failure half-way can be rolled back in reverse.
enum Undo {
    Sysctls(BTreeMap<String, String>, Vec<(String, String)>),
    NftTable(String),
    PodRoute(RouteSpec),
    NodeRoute(RouteSpec),
    Routing(routing::Step),
    /// This ADD set up the node for strict pods; undo restores the node.
    NodeShared {
        v6: bool,
    },
}

/// Apply `plan`; on error everything already done is undone. Returns the
/// record to store.
pub fn apply(
    ns: &NetNs,
    node: &mut RouteSocket,
    store: &StateStore,
    mut rec: Record,
) -> Result<Record, (ApplyError, Vec<String>)> {
    let mut undo: Vec<Undo> = Vec::new();
    match apply_steps(ns, node, store, &mut rec, &mut undo) {
        Ok(()) => Ok(rec),
        Err(e) => {
            let leftovers = rollback(ns, node, store, undo);
            Err((e, leftovers))
        }
    }
}

fn apply_steps(
    ns: &NetNs,
    node: &mut RouteSocket,
    store: &StateStore,
    rec: &mut Record,
    undo: &mut Vec<Undo>,
) -> Result<(), ApplyError> {
    let plan = rec.plan.clone();
    // Sysctls: read-before-write inside the pod netns; a failure rolls back
    // those already written in the same pass.
    let wanted: Vec<(String, String)> = plan
        .sysctls
        .iter()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();
    // One trip into the namespace: write the sysctls and, if needed, open the
    // sockets used afterwards from this thread.
    let needs_pod_sockets = plan.nft_table.is_some() || !plan.pod_routes.is_empty();
    let label = ns.path().display().to_string();
    let (previous, sockets) = ns.run(|| {
        let previous = write_sysctls(&wanted);
        let sockets = (needs_pod_sockets && previous.is_ok()).then(|| open_pod_sockets(label));
        (previous, sockets)
    })?;
    let previous = previous?;
    undo.push(Undo::Sysctls(previous.clone(), wanted));
    rec.sysctl_previous = previous;

    if let Some(sockets) = sockets {
        let mut pod = sockets?;
        if let Some(table) = &plan.nft_table {
            let masq = masq_rules(&plan);
            let rules = TableRules {
                masquerade: (!masq.is_empty()).then_some(masq.as_slice()),
                mss: &plan.mss_clamp,
            };
            pod.nft
                .replace_table(table, &rules, &nft_tag(rec))
                .map_err(|e| pod.nft_err(e))?;
            undo.push(Undo::NftTable(table.clone()));
        }
        if !plan.pod_routes.is_empty() {
            let oif = link::index_of(&mut pod.route, &plan.ifname)?;
            for r in &plan.pod_routes {
                let mut spec = RouteSpec::new(r.dst);
                spec.gateway = r.gw;
                spec.oif = Some(oif);
                spec.protocol = RTPROT_PODGATE;
                route::add(&mut pod.route, &spec, true)?;
                undo.push(Undo::PodRoute(spec.clone()));
                rec.pod_routes.push(spec);
            }
        }
    }

    for r in &plan.node_routes {
        route::add(node, r, false)?;
        undo.push(Undo::NodeRoute(r.clone()));
    }

    // `rec.plan`: applying fills in what the host-side interface held before.
    if let Some(rp) = rec.plan.routing.as_mut() {
        if rp.mode == RoutingMode::Strict && routing::ensure_node(store, node, rp)? {
            undo.push(Undo::NodeShared {
                v6: !rp.pod_ip.addr().is_ipv4(),
            });
        }
        let mut steps = Vec::new();
        let res = routing::apply_pod(node, rp, &mut steps);
        undo.extend(steps.into_iter().map(Undo::Routing));
        res?;
    }
    Ok(())
}

fn write_sysctls(wanted: &[(String, String)]) -> Result<BTreeMap<String, String>, Error> {
    let mut previous = BTreeMap::new();
    for (name, value) in wanted {
        match sysctl::ensure(name, value) {
            Ok(Some(prev)) => {
                previous.insert(name.clone(), prev);
            }
            Ok(None) => {}
            Err(e) => {
                restore_sysctls(&previous, wanted);
                return Err(e);
            }
        }
    }
    Ok(previous)
}

/// Put back what we changed, but only where the value is still ours: another
/// writer's later change wins.
fn restore_sysctls(
    previous: &BTreeMap<String, String>,
    wanted: &[(String, String)],
) -> Vec<String> {
    let mut failed = Vec::new();
    for (name, prev) in previous {
        let ours = wanted.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let still_ours = sysctl::read(name)
            .ok()
            .zip(ours)
            .is_some_and(|(cur, v)| sysctl::normalize(&cur) == sysctl::normalize(v));
        if still_ours {
            if let Err(e) = sysctl::ensure(name, prev) {
                failed.push(e.to_string());
            }
        }
    }
    failed
}

fn rollback(
    ns: &NetNs,
    node: &mut RouteSocket,
    store: &StateStore,
    undo: Vec<Undo>,
) -> Vec<String> {
    let mut left = Vec::new();
    let mut pod: Option<PodSockets> = None;
    for step in undo.into_iter().rev() {
        match step {
            Undo::Routing(s) => {
                if let Err(e) = routing::undo(node, s) {
                    left.push(e.to_string());
                }
            }
            Undo::NodeShared { v6 } => left.extend(routing::restore_node(store, node, v6)),
            Undo::NodeRoute(r) => {
                if let Err(e) = route::del(node, &r) {
                    left.push(e.to_string());
                }
            }
            Undo::PodRoute(r) => {
                if pod.is_none() {
                    pod = pod_sockets(ns).ok();
                }
                if let Some(p) = pod.as_mut() {
                    if let Err(e) = route::del(&mut p.route, &r) {
                        left.push(e.to_string());
                    }
                }
            }
            Undo::NftTable(t) => {
                if pod.is_none() {
                    pod = pod_sockets(ns).ok();
                }
                if let Some(p) = pod.as_mut() {
                    if let Err(e) = p.nft.delete_table(&t) {
                        left.push(p.nft_err(e).to_string());
                    }
                }
            }
            Undo::Sysctls(prev, wanted) => match ns.run(|| restore_sysctls(&prev, &wanted)) {
                Ok(f) => left.extend(f),
                Err(e) => left.push(e.to_string()),
            },
        }
    }
    left
}

/// Undo a record (DEL/GC): node side, then pod side when the netns can still
/// be opened. Absent things are fine; real failures are returned.
///
/// `last_strict`: no other strict pod remains, so node-wide strict settings
/// go back to what they were.
pub fn remove(
    rec: &Record,
    node: &mut RouteSocket,
    netns: Option<&NetNs>,
    store: &StateStore,
    last_strict: bool,
) -> Vec<String> {
    let mut failures = remove_node_side(rec, node, store, last_strict);
    if let Some(ns) = netns {
        failures.extend(remove_pod_side(rec, ns));
    }
    failures
}

/// Node-side part of `remove`: routing boundary and return routes.
pub fn remove_node_side(
    rec: &Record,
    node: &mut RouteSocket,
    store: &StateStore,
    last_strict: bool,
) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(rp) = &rec.plan.routing {
        failures.extend(routing::remove_pod(node, rp));
        if rp.mode == RoutingMode::Strict && last_strict {
            failures.extend(routing::restore_node(
                store,
                node,
                !rp.pod_ip.addr().is_ipv4(),
            ));
        }
    }
    for r in &rec.plan.node_routes {
        if let Err(e) = route::del(node, r) {
            failures.push(e.to_string());
        }
    }
    failures
}

/// Pod-side part of `remove`: sysctls back (where still ours), podgate's
/// nf_tables table, pod routes. Needs no node-wide lock: it touches only the
/// pod's own namespace, and writing forwarding sysctls can wait on the
/// kernel's rtnl lock for a long time on a busy node.
pub fn remove_pod_side(rec: &Record, ns: &NetNs) -> Vec<String> {
    let mut failures = Vec::new();
    let wanted: Vec<(String, String)> = rec
        .plan
        .sysctls
        .iter()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();
    match ns.run(|| restore_sysctls(&rec.sysctl_previous, &wanted)) {
        Ok(f) => failures.extend(f),
        Err(e) => failures.push(e.to_string()),
    }
    if rec.plan.nft_table.is_none() && rec.pod_routes.is_empty() {
        return failures;
    }
    match pod_sockets(ns) {
        Ok(mut pod) => {
            if let Some(t) = &rec.plan.nft_table {
                if let Err(e) = pod.nft.delete_table(t) {
                    failures.push(pod.nft_err(e).to_string());
                }
            }
            for r in &rec.pod_routes {
                // Gone with its interface is fine: del treats that as absent.
                if let Err(e) = route::del(&mut pod.route, r) {
                    failures.push(e.to_string());
                }
            }
        }
        Err(e) => failures.push(e.to_string()),
    }
    failures
}

/// What no longer holds, each a one-line description naming the object.
pub fn check(rec: &Record, node: &mut RouteSocket, ns: &NetNs) -> Result<Vec<String>, ApplyError> {
    let mut drift = Vec::new();
    let sysctls: Vec<(String, Result<String, Error>)> = ns.run(|| {
        rec.plan
            .sysctls
            .iter()
            .map(|s| (s.name.clone(), sysctl::read(&s.name)))
            .collect()
    })?;
    for ((name, got), want) in sysctls.iter().zip(&rec.plan.sysctls) {
        match got {
            Ok(v) if sysctl::normalize(v) == sysctl::normalize(&want.value) => {}
            Ok(v) => drift.push(format!("sysctl {name} is {v}, want {}", want.value)),
            Err(e) => drift.push(format!("sysctl {name}: {e}")),
        }
    }
    let mut pod = pod_sockets(ns)?;
    if let Some(t) = &rec.plan.nft_table {
        match pod.nft.list_masquerade(t).map_err(|e| pod.nft_err(e))? {
            None => drift.push(format!("nft table inet {t} is missing")),
            Some(listed) => {
                for m in masq_rules(&rec.plan) {
                    if !listed.iter().any(|l| l.rule.as_ref() == Some(&m)) {
                        drift.push(format!(
                            "masquerade for {} out of {} is missing in inet {t}",
                            m.source, m.oifname
                        ));
                    }
                }
                let extra = listed
                    .iter()
                    .filter(|l| {
                        l.rule
                            .as_ref()
                            .is_none_or(|r| !masq_rules(&rec.plan).contains(r))
                    })
                    .count();
                if extra > 0 {
                    drift.push(format!(
                        "inet {t} holds {extra} rule(s) podgate did not write"
                    ));
                }
                if !rec.plan.mss_clamp.is_empty() {
                    drift.extend(
                        crate::mss::check(&mut pod.nft, t, &rec.plan.mss_clamp)
                            .map_err(|e| pod.nft_err(e))?,
                    );
                }
            }
        }
    }
    if !rec.pod_routes.is_empty() {
        let routes = route::list_all(&mut pod.route)?;
        for r in &rec.pod_routes {
            if route::find(&routes, r).is_none() {
                drift.push(format!("pod route {} is missing", r.describe()));
            }
        }
    }
    if !rec.plan.node_routes.is_empty() {
        let routes = route::list_all(node)?;
        for r in &rec.plan.node_routes {
            if route::find(&routes, r).is_none() {
                drift.push(format!("node return route {} is missing", r.describe()));
            }
        }
    }
    if let Some(rp) = &rec.plan.routing {
        drift.extend(routing::check(node, rp)?);
    }
    Ok(drift)
}
