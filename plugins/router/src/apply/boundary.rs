//! Applying, removing and checking a routing boundary (policy rules, the
//! pod's table, the main route replacement, strict node-wide settings) from
//! its plan, through the [`Kernel`] trait. Planning is in [`crate::routing`].

use super::Failures;
use crate::kernel::Kernel;
use crate::model::SysctlSetting;
use crate::routing::{is_host_side_rule, RoutingPlan, PRIO_LOCAL_MOVED, PRIO_STRICT};
use crate::strict_node::{read_shared, remove_shared, write_shared, VERSION};
use podgate_kit::netns::NsIdentity;
use podgate_kit::route::{self, RouteProtocol, RouteSpec, RTPROT_PODGATE, TABLE_LOCAL, TABLE_MAIN};
use podgate_kit::rule::{RuleAction, RuleSpec};
use podgate_kit::state::StateStore;
use podgate_kit::{sysctl, Error};

/// `from all lookup local` at `priority`, as the kernel creates it at 0:
/// `proto kernel`, which systemd-networkd leaves alone as not foreign.
fn local_rule(v6: bool, priority: u32) -> RuleSpec {
    RuleSpec {
        v6,
        priority,
        table: TABLE_LOCAL,
        protocol: RouteProtocol::KERNEL.0,
        ..RuleSpec::default()
    }
}

/// [`local_rule`] for deleting: protocol unset matches any, so a moved
/// rule an earlier release added without a protocol goes too.
fn any_local_rule(v6: bool, priority: u32) -> RuleSpec {
    RuleSpec {
        protocol: 0,
        ..local_rule(v6, priority)
    }
}

/// Node-wide setup for the first strict pod (of each address family):
/// sysctls and the local rule moved below podgate's rules. Idempotent for
/// later pods (values re-asserted). What it changes is on disk before it
/// changes it.
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
    // The families whose local rule is still at 0, with their rules.
    let mut at_zero = Vec::new();
    for v6 in p.families() {
        let rules = k.rule_list(v6)?;
        if rules.iter().any(|r| r.matches(&local_rule(v6, 0))) {
            at_zero.push((v6, rules));
        }
    }
    if first {
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
    let newly_moved = at_zero.iter().any(|(v6, _)| !shared.moved(*v6));
    if first || newly_moved {
        for (v6, _) in &at_zero {
            shared.set_moved(*v6);
        }
        shared.version = VERSION;
        write_shared(store, &shared)?;
    }
    for s in &p.node_sysctls {
        k.sysctl_ensure(&s.name, &s.value)?;
    }
    for (v6, rules) in at_zero {
        // Add the moved rule first: there is never a moment without local lookup.
        let moved = local_rule(v6, PRIO_LOCAL_MOVED);
        if !rules.iter().any(|r| r.matches(&moved)) {
            k.rule_add(&moved)?;
        }
        k.rule_del(&any_local_rule(v6, 0))?;
    }
    Ok(first)
}

/// Is a strict pod still bound on the node, as the kernel shows it: a
/// podgate host-side rule in `rules` (of either family) whose interface
/// exists (a record that cannot be read says nothing; the rule of a pod
/// whose netns is gone names an interface that went with it).
fn strict_pod_bound<'a>(
    k: &mut impl Kernel,
    rules: impl Iterator<Item = &'a RuleSpec>,
) -> Result<bool, Error> {
    let ifs: Vec<&str> = rules
        .filter(|r| is_host_side_rule(r))
        .filter_map(|r| r.iif.as_deref())
        .collect();
    if ifs.is_empty() {
        return Ok(false);
    }
    let links = k.link_list()?;
    Ok(ifs.iter().any(|i| links.iter().any(|l| l.name == *i)))
}

/// Undo `ensure_node` when no strict pod is left: the caller found no other
/// live strict record, and the kernel shows no strict pod bound (one whose
/// record cannot be read keeps the settings while its interface lives).
/// Idempotent: a rule already back, a sysctl someone else changed since,
/// are left alone. A file from another boot or node netns describes
/// nothing here and is just removed.
pub fn restore_node(store: &StateStore, k: &mut impl Kernel) -> Failures {
    let mut failed = Failures::default();
    let shared = match read_shared(store) {
        Ok(Some(s)) => s,
        Ok(None) => return failed,
        Err(e) => {
            failed.push(e);
            return failed;
        }
    };
    let here_boot = podgate_kit::netns::boot_id().ok();
    let here_node = podgate_kit::netns::current_identity().ok();
    if !shared.describes_this_node(here_boot.as_deref(), here_node) {
        remove_shared(store);
        return failed;
    }
    // Unknown: never risk a node without local lookup, nor a bound
    // strict pod without its settings. Every strict pod has an IPv4
    // address (its gateway is IPv4), so its IPv4 host-side rule tells
    // whether it is bound; the IPv6 rules are listed where the IPv6 local
    // rule was moved.
    let mut listed = Vec::new();
    for v6 in [false, true]
        .into_iter()
        .filter(|v6| !*v6 || shared.moved(*v6))
    {
        match k.rule_list(v6) {
            Ok(rs) => listed.push((v6, rs)),
            Err(e) => {
                failed.push(e);
                return failed;
            }
        }
    }
    match strict_pod_bound(k, listed.iter().flat_map(|(_, rs)| rs)) {
        Ok(false) => {}
        Ok(true) => return failed,
        Err(e) => {
            failed.push(e);
            return failed;
        }
    }
    for (v6, rules) in listed.iter().filter(|(v6, _)| shared.moved(*v6)) {
        let v6 = *v6;
        let has_zero = rules.iter().any(|r| r.matches(&local_rule(v6, 0)));
        if !has_zero {
            if let Err(e) = k.rule_add(&local_rule(v6, 0)) {
                failed.push(e);
                continue;
            }
        }
        if let Err(e) = k.rule_del(&any_local_rule(v6, PRIO_LOCAL_MOVED)) {
            failed.push(e);
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
                failed.push(e);
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
    for m in &p.mains {
        k.route_add(&m.replacement, true)?;
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
pub fn remove_pod(k: &mut impl Kernel, p: &RoutingPlan) -> Failures {
    let mut failed = Failures::default();
    let mut note = |r: Result<(), Error>| {
        if let Err(e) = r {
            failed.push(e);
        }
    };
    for m in p.mains.iter().rev() {
        note(restore_main(k, &m.original, &m.replacement));
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

/// Drift of a routing plan, read through `k` in the node's namespace:
/// what is missing of it, and the rules the kernel walks before its strict
/// rules that can take the pod's traffic past them ([`rules_ahead`]).
pub fn check(k: &mut impl Kernel, p: &RoutingPlan) -> Result<Vec<String>, Error> {
    let mut drift = Vec::new();
    let mut routes = Vec::new();
    for v6 in [false, true] {
        let wanted = p
            .table_routes
            .iter()
            .chain(p.mains.iter().map(|m| &m.replacement))
            .any(|r| r.dst.addr().is_ipv6() == v6);
        if wanted {
            routes.extend(k.route_list(v6)?);
        }
    }
    for r in &p.table_routes {
        if route::find(&routes, r).is_none() {
            drift.push(format!("route {} is missing", r.describe()));
        }
    }
    for m in &p.mains {
        if route::find(&routes, &m.replacement).is_none() {
            drift.push(format!(
                "main route {} is missing (strict boundary bypassed)",
                m.replacement.describe()
            ));
        }
    }
    for v6 in p.families() {
        let rules = k.rule_list(v6)?;
        for r in p.rules.iter().filter(|r| r.v6 == v6) {
            if !rules.iter().any(|x| x.matches(r)) {
                drift.push(format!("rule {} is missing", r.describe()));
            }
        }
        if p.mode == crate::config::RoutingMode::Strict {
            for r in rules_ahead(&rules, p, v6) {
                drift.push(ahead_message(r, p.pod_ip.addr()));
            }
            if !rules.iter().any(|r| r.matches(&local_rule(v6, r.priority))) {
                drift.push(format!(
                    "no rule looks up the local table ({}): the node delivers nothing to its own addresses",
                    if v6 { "IPv6" } else { "IPv4" }
                ));
            }
        }
    }
    for s in p.node_sysctls.iter().chain(&p.host_if_sysctls) {
        match k.sysctl_read(&s.name) {
            Ok(v) if sysctl::normalize(&v) == s.value => {}
            Ok(v) => drift.push(format!("node sysctl {} is {v}, want {}", s.name, s.value)),
            Err(e) => drift.push(e.to_string()),
        }
    }
    Ok(drift)
}

/// What a rule found by [`rules_ahead`] means, naming it and the pod.
pub fn ahead_message(r: &RuleSpec, pod: std::net::IpAddr) -> String {
    format!(
        "rule {} (proto {}) comes before the strict rules of pod {pod}: its traffic can bypass the boundary",
        r.describe(),
        RouteProtocol(r.protocol),
    )
}

/// The rules of one family (`listed`, in the kernel's walk order) before
/// the last of `p`'s own that can match a packet of the pod or to it, and
/// do not drop it: a `lookup local` there delivers the pod's traffic to
/// the node's services, any other lookup routes it past the pod's table.
/// Where none of its rules is listed, every rule up to podgate's strict
/// priority counts. Not counted: `p`'s own rules, rules that drop, and
/// other pods' boundary rules (podgate's, looking up their own tables).
pub fn rules_ahead<'a>(listed: &'a [RuleSpec], p: &RoutingPlan, v6: bool) -> Vec<&'a RuleSpec> {
    let own: Vec<&RuleSpec> = p.rules.iter().filter(|r| r.v6 == v6).collect();
    let is_own = |r: &RuleSpec| own.iter().any(|o| o.matches(r));
    let before = match listed.iter().rposition(&is_own) {
        Some(last) => listed.get(..last).unwrap_or_default(),
        None => listed
            .iter()
            .position(|r| r.priority > PRIO_STRICT)
            .and_then(|n| listed.get(..n))
            .unwrap_or(listed),
    };
    // The destinations the boundary covers: the pod's addresses, its pools.
    let covered: Vec<_> = own
        .iter()
        .filter(|r| r.iif.as_deref() == Some(p.uplink.as_str()))
        .filter_map(|r| r.to)
        .collect();
    let takes_pod_traffic = |r: &RuleSpec| {
        let from_pod = r.iif.as_ref().is_none_or(|i| *i == p.host_if)
            && r.from
                .is_none_or(|f| covered.iter().any(|c| f.contains(&c.addr())));
        let to_pod =
            r.to.is_none_or(|t| covered.iter().any(|c| t.contains(&c.addr())));
        from_pod || to_pod
    };
    let other_boundary = |r: &RuleSpec| {
        r.protocol == RTPROT_PODGATE
            && r.action == RuleAction::Lookup
            && ![TABLE_LOCAL, TABLE_MAIN, route::TABLE_DEFAULT].contains(&r.table)
    };
    before
        .iter()
        .filter(|r| !is_own(r) && !r.action.drops() && !other_boundary(r))
        .filter(|r| takes_pod_traffic(r))
        .collect()
}
