//! Applying, removing and checking a routing boundary (policy rules, the
//! pod's table, the main route replacement, strict node-wide settings) from
//! its plan, through the [`Kernel`] trait. Planning is in [`crate::routing`].

use crate::kernel::Kernel;
use crate::model::SysctlSetting;
use crate::routing::{is_host_side_rule, RoutingPlan, PRIO_LOCAL_MOVED};
use crate::strict_node::{read_shared, remove_shared, write_shared};
use podgate_kit::netns::NsIdentity;
use podgate_kit::route::{self, RouteSpec, TABLE_LOCAL};
use podgate_kit::rule::RuleSpec;
use podgate_kit::state::StateStore;
use podgate_kit::{sysctl, Error};

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

/// Is a strict pod still bound on the node, as the kernel shows it: a
/// podgate host-side rule in `rules` whose interface exists (a record that
/// cannot be read says nothing; the rule of a pod whose netns is gone
/// names an interface that went with it).
fn strict_pod_bound(k: &mut impl Kernel, rules: &[RuleSpec]) -> Result<bool, Error> {
    let ifs: Vec<&str> = rules
        .iter()
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
    // Unknown: never risk a node without local lookup, nor a bound
    // strict pod without its settings.
    let rules = match k.rule_list(v6) {
        Ok(rs) => rs,
        Err(e) => return vec![e.to_string()],
    };
    match strict_pod_bound(k, &rules) {
        Ok(false) => {}
        Ok(true) => return failed,
        Err(e) => return vec![e.to_string()],
    }
    if shared.local_moved {
        let has_zero = rules.iter().any(|r| r.matches(&local_rule(v6, 0)));
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

/// Drift of a routing plan, read through `k` in the node's namespace.
pub fn check(k: &mut impl Kernel, p: &RoutingPlan) -> Result<Vec<String>, Error> {
    let mut drift = Vec::new();
    let v6 = !p.pod_ip.addr().is_ipv4();
    let routes = k.route_list(v6)?;
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
    let rules = k.rule_list(v6)?;
    for r in &p.rules {
        if !rules.iter().any(|x| x.matches(r)) {
            drift.push(format!("rule {} is missing", r.describe()));
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
