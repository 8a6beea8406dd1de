//! Apply a record through the kit, remove it, and check it still holds.
//!
//! Write-ahead: the record of everything ADD is about to change (with the
//! sysctl values it will overwrite, read first) is on disk, `pending`, before
//! the first change; it is marked `applied` after the last. Removal treats
//! every item as "may or may not exist": already-gone is success, and a
//! sysctl goes back only while it still holds the value podgate wrote. A
//! failed ADD is undone by the same removal a DEL after a crash runs.
//!
//! The pod side goes through [`PodHandles`]: the calling thread enters the
//! pod netns, opens the nf_tables socket, a route socket if needed and the
//! sysctl files, and comes back ([`NetNs::open_in`]); everything else
//! (reading the sysctls, the node side, writing the pod side) runs through
//! those handles from the node's namespace, in order. Node-side changes use a socket
//! in the plugin's own (the node's) namespace, opened only when needed
//! ([`NodeSocket`]).

pub mod boundary;

use crate::kernel::{Kernel, Live};
use crate::record::{self, Mode, NsId, Record, Status};
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::{NetNs, NsIdentity};
use podgate_kit::nft::{describe_mss, Listed, MasqRule, MssRule, TableRules};
use podgate_kit::route::{self, RouteEntry, RTPROT_PODGATE};
use podgate_kit::rule::RuleSpec;
use podgate_kit::state::{Key, StateStore};
use podgate_kit::{link, sysctl, Error};
use std::net::IpAddr;

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

impl ApplyError {
    /// The kit error behind this one, and the pod netns it happened in
    /// (nf_tables in the pod).
    pub fn kit(&self) -> (&Error, Option<&str>) {
        match self {
            ApplyError::Kit(e) => (e, None),
            ApplyError::Nft { netns, source } => (source, Some(netns)),
        }
    }

    /// A write to the state directory failed (not the kernel).
    pub fn is_state(&self) -> bool {
        matches!(self, ApplyError::Kit(Error::State { .. }))
    }
}

/// What could not be done or undone, each failure typed (a kernel call's
/// errno and object kept for the CNI error's details); shown, and
/// serialized for logs, as its messages (joined by "; " in one line).
#[derive(Debug, Default)]
pub struct Failures(Vec<ApplyError>);

impl Failures {
    /// One failure.
    pub fn of(e: impl Into<ApplyError>) -> Failures {
        Failures(vec![e.into()])
    }

    pub fn push(&mut self, e: impl Into<ApplyError>) {
        self.0.push(e.into());
    }

    pub fn extend(&mut self, other: Failures) {
        self.0.extend(other.0);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ApplyError> {
        self.0.iter()
    }

    /// Each failure's message.
    pub fn messages(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

impl std::fmt::Display for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.messages().join("; "))
    }
}

impl serde::Serialize for Failures {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(ToString::to_string))
    }
}

/// An nf_tables error, naming the namespace `k` acts in.
fn nft_err(k: &impl Kernel, source: podgate_kit::nft::NftError) -> ApplyError {
    ApplyError::Nft {
        netns: k.netns().to_string(),
        source,
    }
}

fn mss_rules(rec: &Record) -> Vec<MssRule> {
    rec.mss_clamp.iter().map(record::MssClamp::rule).collect()
}

fn masq_rules(rec: &Record) -> Vec<MasqRule> {
    rec.masquerade
        .iter()
        .map(|m| MasqRule {
            source: m.source,
            oifname: m.oifname.clone(),
        })
        .collect()
}

pub use crate::kernel::NodeSocket;

/// Does undoing or applying `rec` touch the node at all?
pub fn has_node_side(rec: &Record) -> bool {
    !rec.node_routes.is_empty() || rec.routing.is_some()
}

pub use crate::kernel::{PodHandles, PodWants};

/// What ADD reads in the pod's namespace (through its handles) before it
/// takes the node-wide lock (all reads: nothing has changed yet).
#[derive(Debug)]
pub struct PodFacts {
    pub netns_id: NsId,
    /// The pod interface's index, when the profile has pod routes.
    pub oif: Option<u32>,
    /// Current values of the sysctls the profile sets.
    pub sysctls: Vec<(String, Result<String, Error>)>,
}

impl PodFacts {
    /// Read through `pod` (opened with the cookie, and with a route socket
    /// when `want_oif`): the interface index of `ifname`, the values of
    /// `sysctl_names`. `ns` is (dev, ino) of the pod's nsfs file.
    pub fn read(
        pod: &mut PodHandles,
        ns: (u64, u64),
        ifname: &str,
        want_oif: bool,
        sysctl_names: &[String],
    ) -> Result<PodFacts, ApplyError> {
        let netns_id = NsId::from(NsIdentity {
            dev: ns.0,
            ino: ns.1,
            cookie: pod.cookie(),
        });
        let oif = if want_oif {
            Some(link::index_of(pod.route()?, ifname)?)
        } else {
            None
        };
        let sysctls = sysctl_names
            .iter()
            .map(|n| (n.clone(), pod.sysctl(n).and_then(|f| f.read())))
            .collect();
        Ok(PodFacts {
            netns_id,
            oif,
            sysctls,
        })
    }

    /// Complete a pending record with what was read in the pod: the netns
    /// identity, the interface of its pod routes, the sysctl values it will
    /// overwrite. A sysctl that could not be read fails the ADD here, before
    /// anything changed.
    pub fn fill(self, rec: &mut Record) -> Result<(), ApplyError> {
        rec.netns_id = Some(self.netns_id);
        for r in &mut rec.pod_routes {
            r.oif = self.oif;
        }
        let mut read = self.sysctls;
        let used = |n: &String| rec.sysctls.iter().any(|s| s.name == *n);
        if let Some(i) = read.iter().position(|(n, r)| r.is_err() && used(n)) {
            if let (_, Err(e)) = read.swap_remove(i) {
                return Err(e.into());
            }
        }
        for s in &mut rec.sysctls {
            let Some((_, Ok(cur))) = read.iter().find(|(n, _)| *n == s.name) else {
                // Not read ahead: the plan and the names disagree (cannot
                // happen for one profile); refuse rather than guess.
                return Err(ApplyError::Kit(Error::SysctlRefused {
                    name: s.name.clone(),
                    msg: "not read in the pod before the plan".into(),
                }));
            };
            s.previous =
                (sysctl::normalize(cur) != sysctl::normalize(&s.value)).then(|| cur.clone());
        }
        Ok(())
    }
}

/// The handles undoing `rec`'s pod side needs: the sysctls it changed, the
/// nf_tables socket for its table, a route socket for its pod routes.
/// `cookie`: also the namespace's cookie, to check it is still the one.
pub fn removal_wants(rec: &Record, names: &mut Vec<String>, cookie: bool) -> bool {
    names.extend(
        rec.sysctls
            .iter()
            .filter(|s| s.previous.is_some())
            .map(|s| s.name.clone()),
    );
    rec.nft_table.is_some() || !rec.pod_routes.is_empty() || !names.is_empty() || cookie
}

fn wants_of<'a>(rec: &Record, names: &'a [String], cookie: bool) -> PodWants<'a> {
    PodWants {
        nft: rec.nft_table.is_some(),
        route: !rec.pod_routes.is_empty(),
        sysctls: names,
        cookie,
    }
}

/// ADD's pod side after the node side, with the pod lock held and the
/// node-wide lock not: the sysctls, the nf_tables table and the pod routes,
/// through `k` in the pod's namespace (the handles opened there:
/// `Live::pod`). A failure leaves what was done for [`remove_pod`]; the
/// caller writes the record `applied` or rolls it back from the record.
pub fn pod_changes(
    k: &mut impl Kernel,
    rec: &mut Record,
    reread: bool,
    store: &StateStore,
) -> Result<(), ApplyError> {
    if reread {
        let mut changed = false;
        for s in &mut rec.sysctls {
            let cur = k.sysctl_read(&s.name)?;
            let prev = (sysctl::normalize(&cur) != sysctl::normalize(&s.value)).then_some(cur);
            changed |= prev != s.previous;
            s.previous = prev;
        }
        // Write-ahead again: the values about to be overwritten are on disk.
        if changed {
            record::write(store, rec)?;
        }
    }
    // `previous` was read in this request (before the plan, or just above
    // after an earlier ADD was undone), under the pod lock: where it is set
    // the value differs, so it is written without reading it again.
    for s in rec.sysctls.iter().filter(|s| s.previous.is_some()) {
        k.sysctl_write(&s.name, &s.value)?;
    }
    if let Some(table) = &rec.nft_table {
        let masq = masq_rules(rec);
        let mss = mss_rules(rec);
        let rules = TableRules {
            masquerade: (!masq.is_empty()).then_some(masq.as_slice()),
            mss: &mss,
        };
        k.nft_replace(table, &rules, &rec.nft_tag())
            .map_err(|source| nft_err(k, source))?;
    }
    for r in &rec.pod_routes {
        k.route_add(&r.spec(), true)?;
    }
    Ok(())
}

/// The node side of ADD, with the node-wide lock held: read what the
/// host-side interface sysctls hold, write the pending record (the first
/// change of any kind: it describes the pod side too), then the node's
/// return routes and the routing boundary. On error what was applied is
/// removed again and the record with it, unless removal left something
/// (then the pending record stays for DEL or GC); the leftovers are
/// returned.
///
/// `last_strict`: no other strict pod exists, so undoing this one may put
/// node-wide strict settings back.
///
/// `k` acts in the node's namespace (`Live::lazy` over the node socket).
/// On error, what was applied is removed by the same record-driven removal
/// DEL runs ([`remove_node`]).
pub fn apply_node(
    k: &mut impl Kernel,
    store: &StateStore,
    rec: &mut Record,
    last_strict: bool,
) -> Result<(), (ApplyError, Failures)> {
    let mut written = false;
    match node_steps(k, store, rec, &mut written) {
        Ok(()) => Ok(()),
        Err(e) if !written => Err((e, Failures::default())),
        Err(e) => {
            let mut left = remove_node(k, rec, store, last_strict);
            if left.is_empty() {
                if let Err(re) = crate::claims::remove(store, &rec.key) {
                    left.push(re);
                }
            }
            Err((e, left))
        }
    }
}

fn node_steps(
    k: &mut impl Kernel,
    store: &StateStore,
    rec: &mut Record,
    written: &mut bool,
) -> Result<(), ApplyError> {
    // Read from this thread (the node's namespace): what the pod's
    // host-side interface sysctls hold before podgate writes them.
    if let Some(r) = rec.routing.as_mut() {
        for s in &r.host_if_sysctls {
            let cur = k.sysctl_read(&s.name)?;
            if sysctl::normalize(&cur) != sysctl::normalize(&s.value) {
                r.host_if_previous.insert(s.name.clone(), cur);
            }
        }
    }
    record::write(store, rec)?;
    *written = true;
    if !has_node_side(rec) {
        return Ok(());
    }

    for r in &rec.node_routes {
        k.route_add(&r.spec(), false)?;
    }

    if let Some(mut rp) = rec.routing.as_ref().map(record::Routing::plan) {
        if rp.mode == crate::config::RoutingMode::Strict {
            boundary::ensure_node(
                store,
                k,
                &rp,
                rec.boot_id.as_deref(),
                rec.node_netns_id.map(NsIdentity::from),
            )?;
        }
        boundary::apply_pod(k, &mut rp)?;
    }
    Ok(())
}

/// Put back what we changed, but only where the value is still ours: another
/// writer's later change wins, and a sysctl a killed ADD never reached still
/// holds its previous value.
fn restore_sysctls(k: &mut impl Kernel, rec: &Record) -> Failures {
    let mut failed = Failures::default();
    for s in &rec.sysctls {
        let Some(prev) = &s.previous else { continue };
        let still_ours = k
            .sysctl_read(&s.name)
            .is_ok_and(|cur| sysctl::normalize(&cur) == sysctl::normalize(&s.value));
        // Still ours means it differs from `prev` (a previous value is
        // recorded only where ADD changed it): write without reading again.
        if still_ours {
            if let Err(e) = k.sysctl_write(&s.name, prev) {
                failed.push(e);
            }
        }
    }
    failed
}

/// Undo a record's node side (DEL/GC/a failed ADD) through `k` in the
/// node's namespace: the routing boundary and the return routes. Absent
/// things are fine; real failures are returned.
///
/// `last_strict`: no other strict pod remains, so node-wide strict settings
/// go back to what they were.
pub fn remove_node(
    k: &mut impl Kernel,
    rec: &Record,
    store: &StateStore,
    last_strict: bool,
) -> Failures {
    let mut failures = Failures::default();
    if let Some(r) = &rec.routing {
        let rp = r.plan();
        failures.extend(boundary::remove_pod(k, &rp));
        if r.mode == Mode::Strict && last_strict {
            failures.extend(boundary::restore_node(store, k));
        }
    }
    for r in &rec.node_routes {
        if let Err(e) = k.route_del(&r.spec()) {
            failures.push(e);
        }
    }
    failures
}

/// The handles for undoing `rec`'s pod side in `ns`, opened only if `ns`
/// still is the namespace `rec` was applied in (device and inode here, the
/// cookie from the handles). `Ok(None)`: nothing to undo there, or another
/// namespace.
pub fn removal_handles(rec: &Record, ns: &NetNs) -> Result<Option<PodHandles>, Error> {
    let id = rec.netns_id;
    if id.is_some_and(|id| ns.dev_ino() != (id.dev, id.ino)) {
        return Ok(None);
    }
    let cookie = id.is_some_and(|id| id.cookie.is_some());
    let mut names = Vec::new();
    if !removal_wants(rec, &mut names, false) {
        return Ok(None);
    }
    let pod = PodHandles::open(ns, wants_of(rec, &names, cookie))?;
    let same = match (id.and_then(|id| id.cookie), pod.cookie()) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    };
    Ok(same.then_some(pod))
}

/// Undo a record's pod side through `k` in the pod's namespace (handles
/// from [`removal_handles`]: `Live::pod`): sysctls back (where still ours),
/// podgate's nf_tables table, pod routes. Needs no node-wide lock: it
/// touches only the pod's own namespace, and writing forwarding sysctls can
/// wait on the kernel's rtnl lock for a long time on a busy node.
/// Already-gone is success; real failures are returned.
pub fn remove_pod(k: &mut impl Kernel, rec: &Record) -> Failures {
    let mut failures = restore_sysctls(k, rec);
    if let Some(t) = &rec.nft_table {
        if let Err(source) = k.nft_delete(t) {
            failures.push(nft_err(k, source));
        }
    }
    for r in &rec.pod_routes {
        // Gone with its interface is fine: del treats that as absent.
        if let Err(e) = k.route_del(&r.spec()) {
            failures.push(e);
        }
    }
    failures
}

/// Ownership sweep of one pod namespace for an attachment whose record is
/// unusable: podgate's nf_tables tables (name prefix `table_prefix`) tagged
/// with this attachment's tag, and podgate's routes (protocol 94) out of its
/// interface. Sysctls cannot be put back without the record. Returns what was
/// removed and what failed.
pub fn sweep_pod(k: &mut impl Kernel, key: &Key, table_prefix: &str) -> (Vec<String>, Failures) {
    let mut removed = Vec::new();
    let mut failed = Failures::default();
    let tag = record::nft_tag(key);
    match k.nft_list_tagged(table_prefix) {
        Ok(tables) => {
            for (name, _) in tables
                .into_iter()
                .filter(|(_, t)| t.as_deref() == Some(&tag))
            {
                match k.nft_delete(&name) {
                    Ok(_) => removed.push(format!("nft table inet {name} in {}", k.netns())),
                    Err(e) => failed.push(nft_err(k, e)),
                }
            }
        }
        Err(e) => failed.push(nft_err(k, e)),
    }
    let oif = match k.link_list() {
        Ok(links) => links.iter().find(|l| l.name == key.ifname).map(|l| l.index),
        Err(e) => {
            failed.push(e);
            None
        }
    };
    if let Some(oif) = oif {
        match list_all(k) {
            Ok(routes) => {
                for r in routes
                    .iter()
                    .filter(|r| r.protocol == RTPROT_PODGATE && r.oif == Some(oif))
                {
                    match k.route_del(&route::RouteSpec::from(r)) {
                        Ok(_) => removed.push(format!("pod route {}", r.dst)),
                        Err(e) => failed.push(e),
                    }
                }
            }
            Err(e) => failed.push(e),
        }
    }
    (removed, failed)
}

fn accounted_route(records: &[Record], e: &RouteEntry) -> bool {
    records.iter().any(|rec| {
        let node = rec.node_routes.iter();
        let routing = rec.routing.iter().flat_map(|r| {
            r.table_routes
                .iter()
                .chain(r.main_replacement.as_ref())
                .chain(r.main_original.as_ref())
                .chain(
                    r.extra_mains
                        .iter()
                        .flat_map(|m| [&m.original, &m.replacement]),
                )
        });
        node.chain(routing)
            .any(|r| route::find(std::slice::from_ref(e), &r.spec()).is_some())
    })
}

fn accounted_rule(records: &[Record], r: &RuleSpec) -> bool {
    records.iter().any(|rec| {
        rec.routing
            .iter()
            .flat_map(|x| x.rules.iter())
            .any(|x| x.spec().matches(r))
    })
}

/// Ownership sweep of the node: podgate's routes (protocol 94, any table) and
/// rules (protocol 94) that none of `records` describes. With `only`, just
/// those referring to these pod addresses, the other rules into the pod
/// tables those rules look up and the rules naming the same pod interface
/// (a strict pod's `iif <host if>` rules name no address), and the routes
/// of those tables: what an attachment with an unusable record left.
/// Returns what was removed and what failed.
pub fn sweep_node(
    k: &mut impl Kernel,
    records: &[Record],
    only: Option<&[IpAddr]>,
) -> (Vec<String>, Failures) {
    let mut removed = Vec::new();
    let mut failed = Failures::default();
    let refers = |net: Option<ipnet::IpNet>| {
        net.is_some_and(|n| only.is_some_and(|ips| ips.iter().any(|ip| n.contains(ip))))
    };
    let mut tables = Vec::new();
    for v6 in [false, true] {
        let rules = match k.rule_list(v6) {
            Ok(r) => r,
            Err(e) => {
                failed.push(e);
                continue;
            }
        };
        let ours: Vec<&RuleSpec> = rules
            .iter()
            .filter(|r| r.protocol == RTPROT_PODGATE && !accounted_rule(records, r))
            .collect();
        // With `only`: the rules naming those addresses, then every other
        // rule into a pod table one of them uses (a strict pod's `iif <host
        // if> lookup T` names no address), then the rules naming that
        // interface (its exemptions, `iif <host if> to <range> lookup
        // local`).
        let named: Vec<u32> = ours
            .iter()
            .filter(|r| refers(r.from) || refers(r.to))
            .map(|r| r.table)
            .filter(|t| *t != route::TABLE_MAIN && *t != route::TABLE_LOCAL)
            .collect();
        let ifs: Vec<&str> = ours
            .iter()
            .filter(|r| named.contains(&r.table) && crate::routing::is_host_side_rule(r))
            .filter_map(|r| r.iif.as_deref())
            .collect();
        for r in ours {
            let pod_side =
                named.contains(&r.table) || r.iif.as_deref().is_some_and(|i| ifs.contains(&i));
            if only.is_some() && !refers(r.from) && !refers(r.to) && !pod_side {
                continue;
            }
            tables.push(r.table);
            match k.rule_del(r) {
                Ok(_) => removed.push(format!("node rule {}", r.describe())),
                Err(e) => failed.push(e),
            }
        }
    }
    match list_all(k) {
        Ok(routes) => {
            for e in routes.iter().filter(|e| e.protocol == RTPROT_PODGATE) {
                let mine = match only {
                    None => true,
                    Some(ips) => {
                        e.gateway.is_some_and(|g| ips.contains(&g))
                            || (e.dst.prefix_len() == e.dst.max_prefix_len()
                                && ips.contains(&e.dst.addr()))
                            || (e.table != route::TABLE_MAIN && tables.contains(&e.table))
                    }
                };
                if !mine || accounted_route(records, e) {
                    continue;
                }
                match k.route_del(&route::RouteSpec::from(e)) {
                    Ok(_) => removed.push(format!(
                        "node route {}",
                        route::RouteSpec::from(e).describe()
                    )),
                    Err(err) => failed.push(err),
                }
            }
        }
        Err(e) => failed.push(e),
    }
    (removed, failed)
}

/// What strict pods whose netns is gone left on the node and no record in
/// `records` accounts for (their record could not be read): a podgate
/// host-side rule whose interface is gone names the pod's table, the rules
/// into that table name the pod's address, and what refers to that address
/// or table goes as [`sweep_node`] removes an unusable record's objects.
/// The rule of a live pod (its interface exists) is never touched.
pub fn sweep_detached(k: &mut impl Kernel, records: &[Record]) -> (Vec<String>, Failures) {
    let links = match k.link_list() {
        Ok(l) => l,
        Err(e) => return (Vec::new(), Failures::of(e)),
    };
    let mut ips = Vec::new();
    for v6 in [false, true] {
        let rules = match k.rule_list(v6) {
            Ok(r) => r,
            Err(e) => return (Vec::new(), Failures::of(e)),
        };
        let dead: Vec<u32> = rules
            .iter()
            .filter(|r| crate::routing::is_host_side_rule(r) && !accounted_rule(records, r))
            .filter(|r| {
                !r.iif
                    .as_deref()
                    .is_some_and(|i| links.iter().any(|l| l.name == i))
            })
            .map(|r| r.table)
            .collect();
        ips.extend(
            rules
                .iter()
                .filter(|r| r.protocol == RTPROT_PODGATE && dead.contains(&r.table))
                .filter_map(|r| r.to)
                .filter(|t| t.prefix_len() == t.max_prefix_len())
                .map(|t| t.addr()),
        );
    }
    if ips.is_empty() {
        return (Vec::new(), Failures::default());
    }
    sweep_node(k, records, Some(&ips))
}

/// What no longer holds, each a one-line description naming the object:
/// the pod side read on one trip into `ns` ([`check_pod`]), the node
/// side from this thread ([`check_node`]).
pub fn check(rec: &Record, node: &mut RouteSocket, ns: &NetNs) -> Result<Vec<String>, ApplyError> {
    check_with(rec, &mut Live::on(node), ns)
}

/// [`check`] with the node side through `node`: many records checked in a
/// row share one [`crate::kernel::ListedOnce`] view of the node.
pub fn check_with(
    rec: &Record,
    node: &mut impl Kernel,
    ns: &NetNs,
) -> Result<Vec<String>, ApplyError> {
    let names: Vec<String> = rec.sysctls.iter().map(|s| s.name.clone()).collect();
    let mut pod = PodHandles::open(ns, wants_of(rec, &names, false))?;
    let mut drift = check_pod(&mut Live::pod(&mut pod), rec)?;
    drift.extend(check_node(node, rec)?);
    Ok(drift)
}

/// The pod side of [`check`] through `k` in the pod's namespace: the
/// record's state, its sysctls, the nf_tables table and the pod routes.
pub fn check_pod(k: &mut impl Kernel, rec: &Record) -> Result<Vec<String>, ApplyError> {
    let mut drift = Vec::new();
    if rec.status == Status::Pending {
        drift.push("ADD has not finished (record pending): it is running, or was killed half-way and awaits DEL".into());
    }
    for want in &rec.sysctls {
        let name = &want.name;
        match k.sysctl_read(name) {
            Ok(v) if sysctl::normalize(&v) == sysctl::normalize(&want.value) => {}
            Ok(v) => drift.push(format!("sysctl {name} is {v}, want {}", want.value)),
            Err(e) => drift.push(format!("sysctl {name}: {e}")),
        }
    }
    if let Some(t) = &rec.nft_table {
        match k.nft_list_masquerade(t).map_err(|e| nft_err(k, e))? {
            None => drift.push(format!("nft table inet {t} is missing")),
            Some(listed) => {
                drift.extend(chain_drift(
                    &listed,
                    &masq_rules(rec),
                    |m| {
                        format!(
                            "masquerade for {} out of {} is missing in inet {t}",
                            m.source, m.oifname
                        )
                    },
                    &format!("inet {t}"),
                ));
                if !rec.mss_clamp.is_empty() {
                    if let Some(listed) = k.nft_list_mss(t).map_err(|e| nft_err(k, e))? {
                        drift.extend(chain_drift(
                            &listed,
                            &mss_rules(rec),
                            |r| format!("mss clamp `{}` is missing in inet {t}", describe_mss(r)),
                            &format!("inet {t} forward"),
                        ));
                    }
                }
            }
        }
    }
    if !rec.pod_routes.is_empty() {
        let routes = list_all(k)?;
        for r in &rec.pod_routes {
            if route::find(&routes, &r.spec()).is_none() {
                drift.push(format!("pod route {} is missing", r.spec().describe()));
            }
        }
    }
    Ok(drift)
}

/// Drift of one of podgate's chains as listed: each wanted rule that is
/// missing (`missing` words it), and one line for the rules podgate did
/// not write (`chain` names where they are).
fn chain_drift<R: PartialEq>(
    listed: &[Listed<R>],
    wanted: &[R],
    missing: impl Fn(&R) -> String,
    chain: &str,
) -> Vec<String> {
    let mut drift: Vec<String> = wanted
        .iter()
        .filter(|w| !listed.iter().any(|l| l.rule.as_ref() == Some(*w)))
        .map(missing)
        .collect();
    let extra = listed
        .iter()
        .filter(|l| l.rule.as_ref().is_none_or(|r| !wanted.contains(r)))
        .count();
    if extra > 0 {
        drift.push(format!(
            "{chain} holds {extra} rule(s) podgate did not write"
        ));
    }
    drift
}

/// The node side of [`check`] through `k` in the node's namespace: the
/// return routes and the routing boundary.
pub fn check_node(k: &mut impl Kernel, rec: &Record) -> Result<Vec<String>, ApplyError> {
    let mut drift = Vec::new();
    if !rec.node_routes.is_empty() {
        let routes = list_all(k)?;
        for r in &rec.node_routes {
            if route::find(&routes, &r.spec()).is_none() {
                drift.push(format!(
                    "node return route {} is missing",
                    r.spec().describe()
                ));
            }
        }
    }
    if let Some(rp) = &rec.routing {
        drift.extend(boundary::check(k, &rp.plan())?);
    }
    Ok(drift)
}

/// A node rule that comes before a strict pod's boundary rules and can
/// take its traffic past them ([`boundary::rules_ahead`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleAhead {
    pub rule: RuleSpec,
    /// The pod's address (of the gateway's family) and container.
    pub pod: IpAddr,
    pub container_id: String,
}

impl std::fmt::Display for RuleAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({})",
            boundary::ahead_message(&self.rule, self.pod),
            self.container_id
        )
    }
}

/// The node's rules that come before a strict record's boundary rules and
/// can take its pod's traffic past them, read through `k` in the node's
/// namespace; none for other records.
pub fn rules_ahead(k: &mut impl Kernel, rec: &Record) -> Result<Vec<RuleAhead>, Error> {
    let Some(rp) = rec
        .routing
        .as_ref()
        .filter(|_| rec.is_strict())
        .map(record::Routing::plan)
    else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for v6 in rp.families() {
        let listed = k.rule_list(v6)?;
        out.extend(
            boundary::rules_ahead(&listed, &rp, v6)
                .into_iter()
                .map(|r| RuleAhead {
                    rule: r.clone(),
                    pod: rp.pod_ip.addr(),
                    container_id: rec.key.container_id.clone(),
                }),
        );
    }
    Ok(out)
}

/// Routes of both families, as [`route::list_all`].
fn list_all(k: &mut impl Kernel) -> Result<Vec<RouteEntry>, Error> {
    let mut v = k.route_list(false)?;
    v.extend(k.route_list(true)?);
    Ok(v)
}

#[cfg(test)]
mod tests;
