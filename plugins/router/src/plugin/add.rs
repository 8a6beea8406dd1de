//! ADD: handles opened in the pod's namespace (this thread moved there and
//! back, [`NetNs::open_in`]); then the node side under the node-wide lock
//! and the pod side through those handles, the record written ahead and
//! after. The steps, in the order a request takes them: [`add_as`] (config,
//! selection, the pod lock), [`open_pod`], [`node_side`]
//! ([`census_under_lock`], [`replace_earlier`], [`plan_and_record`],
//! [`claim_and_apply`]), [`pod_side`]; [`Scope`] decides how much of the
//! store a request reads.

use super::{
    key_of, load, log_swept, logger, ms, open_netns, pod_ips_of, require_caps, selection, store,
};
use crate::apply::{self, ApplyError, Failures};
use crate::claims;
use crate::config::{ConfigError, RouterConfig, RoutingMode};
use crate::error::Error;
use crate::intent::Selection;
use crate::kernel::{Kernel, Live};
use crate::lifecycle::{self, Census};
use crate::observe::{self, Needs};
use crate::plan;
use crate::record::{self, Depth, Here, Origin, ReadError, Record};
use ipnet::IpNet;
use podgate_cni::log::{rfc3339_now, Logger};
use podgate_cni::{prev_or_empty, Added, CniError, Request};
use podgate_kit::netns::NetNs;
use podgate_kit::state::{Key, Names, StateStore};
use serde_json::{json, Value};

/// Pod routes from the plan are reported in the result, as a primary
/// would; without any, prevResult goes back as it came.
fn result_of(req: &Request, rec: &Record) -> Result<Added, CniError> {
    if rec.pod_routes.is_empty() {
        return Ok(Added::PrevResult);
    }
    let mut result = prev_or_empty(&req.conf)?;
    let routes = result
        .entry("routes")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = routes {
        for r in &rec.pod_routes {
            let mut v = json!({"dst": r.dst.to_string()});
            if let (Some(gw), Some(o)) = (r.gateway, v.as_object_mut()) {
                o.insert("gw".into(), Value::String(gw.to_string()));
            }
            list.push(v);
        }
    }
    Ok(Added::Result(result))
}

/// The node side of ADD done, the node-wide lock released.
struct NodeDone {
    rec: Record,
    /// An earlier ADD of this attachment was undone under the lock: the
    /// pod's sysctls may differ from what was read before it.
    reread: bool,
    node: apply::NodeSocket,
    lock_waited: std::time::Duration,
    lock_held: std::time::Duration,
}

/// One ADD request, as every step of it reads it.
struct Add<'a> {
    cfg: &'a RouterConfig,
    req: &'a Request,
    log: &'a Logger,
    sel: &'a Selection<'a>,
    /// The pod's netns.
    ns: &'a NetNs,
    store: &'a StateStore,
    key: &'a Key,
    /// On behalf of the node agent's adoption scan (recorded as such).
    adopted: bool,
}

/// Which other records matter to this ADD: those whose claims would
/// refuse it. They get the precise liveness check, the rest only the
/// cheap one (records of an earlier boot are always recognised, no
/// syscall): the lock is held meanwhile, and GC and the installer's sweep
/// find the others.
struct Interest<'a> {
    key: &'a Key,
    pools: &'a [IpNet],
    /// A routing boundary: every table matters.
    tables: bool,
    /// A strict pod: every strict slot matters.
    strict: bool,
}

impl Interest<'_> {
    fn matters(&self, r: &Record) -> bool {
        let c = r.claim();
        c.key == *self.key
            || c.pools
                .iter()
                .any(|p| self.pools.iter().any(|q| plan::overlaps(p, q)))
            || (self.tables && c.table.is_some())
            || (self.strict && c.strict)
    }

    fn depth(&self, r: &Record) -> Depth {
        if self.matters(r) {
            Depth::Precise
        } else {
            Depth::Boot
        }
    }
}

/// How much of the store this ADD reads, decided in one place:
///
/// - a plan that checks no claims (no return routes, no routing boundary:
///   a masquerade- or sysctl-only pod) reads only its own earlier record
///   (a repeated ADD), taken before the lock and confirmed under it if
///   stale ([`Scope::early`]). Other pods' stale records are cleared by an
///   ADD whose claims collide with them, GC and the agent's sweep; reading
///   every record here made such an ADD at 250 attachments 2.4x one on an
///   empty node. An earlier record of this attachment that is unreadable
///   or holds claims or node objects (its profile changed) brings every
///   record back, read under the lock like a claims check's: removing it
///   must know what the other live records describe now (a strict pod
///   added while this one waited for the lock keeps the node-wide strict
///   settings);
/// - a plan that checks claims asks the claims index for the records
///   holding one it checks (pools overlapping its own; with a routing
///   boundary every table, and strict slots for a strict pod) and reads
///   its own record; records the index does not hold completely yet are
///   indexed first (under the lock);
/// - otherwise, or when the index cannot answer (`Census::indexed`),
///   every record is judged.
struct Scope<'a> {
    store: &'a StateStore,
    here: &'a Here,
    interest: Interest<'a>,
    claims: bool,
    /// The claims index this ADD read (caught up), and how many records it
    /// does not know.
    index: Option<(claims::Index, usize)>,
}

impl<'a> Scope<'a> {
    fn new(add: &Add<'a>, here: &'a Here, claims: bool) -> Scope<'a> {
        let routing = add.sel.profile.routing.as_ref();
        Scope {
            store: add.store,
            here,
            interest: Interest {
                key: add.key,
                pools: &add.sel.return_routes,
                tables: routing.is_some(),
                strict: routing.is_some_and(|r| r.mode == RoutingMode::Strict),
            },
            claims,
            index: None,
        }
    }

    /// The census of an ADD whose plan checks no claims, taken before the
    /// lock: its own earlier record alone, when there is none or it holds
    /// no claim and nothing on the node (then nothing of another record
    /// can matter). None: every record is read, under the node-wide lock.
    fn early(&self) -> Option<Census> {
        if self.claims {
            return None;
        }
        let own = match record::read(self.store, self.interest.key) {
            Ok(None) => Vec::new(),
            Ok(Some(r)) if !r.claim().holds_any() && !apply::has_node_side(&r) => vec![r],
            _ => return None,
        };
        Some(Census::of(own, self.here, |_| Depth::Precise))
    }

    /// The census under the lock: from the claims index where the plan
    /// checks claims and the index can answer, else from every record in
    /// `names` (a listing this request made), or in a fresh listing when
    /// `names` is None (records went away meanwhile). Fails closed: a
    /// state dir that cannot be listed refuses the ADD rather than
    /// guessing which pools and strict slots are free.
    fn judge(&mut self, names: Option<&Names>) -> Result<Census, Error> {
        let (store, here, interest) = (self.store, self.here, &self.interest);
        let depth = |r: &Record| interest.depth(r);
        if self.claims {
            if let Some(names) = names {
                let mut ix = claims::Index::load(store).map_err(Error::State)?;
                let caught = ix.catch_up(store, names).map_err(Error::State)?;
                self.index = Some((ix, caught.unknown));
            } else if let Some((ix, _)) = &mut self.index {
                // Records went away meanwhile (removals under this lock)
                // and their entries with them: the index as saved now.
                *ix = claims::Index::load(store).map_err(Error::State)?;
            }
            if let Some((ix, unknown)) = &self.index {
                let want = claims::Wanted {
                    pools: interest.pools,
                    tables: interest.tables,
                    strict: interest.strict,
                };
                let key = interest.key;
                if let Some(c) = Census::indexed(store, ix, *unknown, want, key, here, depth) {
                    return Ok(c);
                }
            }
        }
        match names {
            Some(n) => Census::take_in(store, n, here, depth),
            None => Census::take(store, here, depth),
        }
        .map_err(Error::State)
    }

    /// Write the record's claims ahead of it: into the index this ADD read
    /// (written once). Without one (no claims checked) the record holds no
    /// claim and the index is left alone: the next ADD that checks claims
    /// reads the record once and marks it indexed, so a masquerade-only
    /// ADD and its DEL write no index file.
    fn claim(&mut self, rec: &Record) -> Result<(), podgate_kit::Error> {
        match self.index.as_mut() {
            Some((ix, _)) => ix.claim(self.store, rec),
            None if rec.claim().holds_any() => claims::claim(self.store, rec),
            None => Ok(()),
        }
    }
}

/// ADD's part under the node-wide lock: stale records, a repeated ADD,
/// observing the node, the plan (every refusal happens here, before
/// anything changed), then the pending record and the node side.
fn node_side(add: &Add<'_>, facts: apply::PodFacts) -> Result<NodeDone, CniError> {
    let needs = Needs::of(add.sel);
    // Boot ID and node netns identity do not change while this runs:
    // read before the lock, not under it. A plan that reads the node opens
    // its node socket here, also before the lock, and that socket gives
    // the node's netns cookie.
    let mut node = apply::NodeSocket::default();
    let here = if needs.reads_node() {
        Here::with_socket(node.get().map_err(node_err)?)
    } else {
        Here::now()
    };
    let mut scope = Scope::new(add, &here, needs.claims);
    // One listing of the state directory serves both the temp-file sweep
    // and the census (taken here or under the lock).
    let early = scope
        .early()
        .map(|census| add.store.names().map(|names| (names, census)));
    let lock = add.store.lock().map_err(Error::State)?;
    let census = census_under_lock(add, &mut scope, early)?;
    if !census.stale.is_empty() {
        // Clearing them needs the node socket: without one, ADD fails here.
        node.get().map_err(node_err)?;
    }
    let (census, reread) = replace_earlier(add, &mut scope, census, &mut Live::lazy(&mut node))?;
    let mut rec = plan_and_record(add, &needs, &census, &mut node, &here, facts)?;
    claim_and_apply(add, &mut scope, &census, &mut node, &mut rec)?;
    let (lock_waited, lock_held) = (lock.waited(), lock.held());
    drop(lock);
    Ok(NodeDone {
        rec,
        reread,
        node,
        lock_waited,
        lock_held,
    })
}

fn node_err(e: podgate_kit::Error) -> CniError {
    Error::kernel("node netlink")(e).into()
}

/// Under the lock: sweep this container's temporary files and take the
/// census (the early one confirmed, or one judged now).
fn census_under_lock(
    add: &Add<'_>,
    scope: &mut Scope<'_>,
    early: Option<Result<(Names, Census), podgate_kit::Error>>,
) -> Result<Census, CniError> {
    let (names, early) = match early {
        Some(r) => {
            let (names, census) = r.map_err(Error::State)?;
            (names, Some(census))
        }
        None => (add.store.names().map_err(Error::State)?, None),
    };
    let store = add.store;
    lifecycle::sweep_temp_in(store, &names, Some(&add.key.container_id)).map_err(Error::State)?;
    Ok(match early {
        Some(c) => {
            let interest = &scope.interest;
            c.confirm_stale(store, scope.here, |r| interest.depth(r))
        }
        None => scope.judge(Some(&names))?,
    })
}

/// Clear stale records, then replace an earlier ADD of this attachment
/// (pending or applied: either may have left things). Returns the census
/// judged again if records went away (claims must not count what was just
/// removed), and whether the pod's sysctls are to be read again.
fn replace_earlier(
    add: &Add<'_>,
    scope: &mut Scope<'_>,
    census: Census,
    node: &mut impl Kernel,
) -> Result<(Census, bool), CniError> {
    let (store, key, log, here) = (add.store, add.key, add.log, scope.here);
    let mut changed = false;
    if !census.stale.is_empty() {
        let swept = lifecycle::clear_stale(&census, node, store, here);
        log_swept(log, "cleared stale records", &swept);
        changed = !swept.removed.is_empty();
    }
    let replaced = match record::read(store, key) {
        Ok(None) => false,
        // Cleared above with the other stale records.
        Ok(Some(_)) if census.is_stale(key) => false,
        Ok(Some(old)) => {
            let left = lifecycle::remove_record(&old, &census, node, Some(add.ns), store, here);
            if !left.is_empty() {
                let what = "replacing earlier ADD of this attachment";
                return Err(Error::Left { what, left }.into());
            }
            claims::remove(store, key).map_err(Error::State)?;
            true
        }
        Err(e @ (ReadError::Newer { .. } | ReadError::Io(_))) => {
            return Err(Error::Record(e).into())
        }
        Err(e) => {
            log.warn(
                "unreadable record of this attachment",
                json!({"error": e.to_string()}),
            );
            replace_unreadable(add, &census, node)?;
            true
        }
    };
    let census = if changed || replaced {
        scope.judge(None)?
    } else {
        census
    };
    Ok((census, replaced))
}

/// Remove by ownership what an earlier ADD with an unreadable record left.
fn replace_unreadable(
    add: &Add<'_>,
    census: &Census,
    node: &mut impl Kernel,
) -> Result<(), CniError> {
    let orphan = lifecycle::Orphan {
        key: add.key,
        at: lifecycle::Unreadable::Record,
        ns: Some(add.ns),
        pod_ips: &pod_ips_of(add.req),
        table_prefix: &format!("{}-", add.cfg.nft_table),
    };
    let s = lifecycle::remove_unreadable(&orphan, census, node, add.store);
    log_swept(add.log, "removed by ownership", &s);
    if !s.failures.is_empty() {
        let what = "replacing an unreadable record of this attachment";
        let left = s.failures;
        return Err(Error::Left { what, left }.into());
    }
    Ok(())
}

/// Observe the node (pool owners, tables and strict slots of the other
/// live attachments among it), build the plan (every refusal happens
/// here) and the pending record from it and the pod's facts.
fn plan_and_record(
    add: &Add<'_>,
    needs: &Needs,
    census: &Census,
    node: &mut apply::NodeSocket,
    here: &Here,
    facts: apply::PodFacts,
) -> Result<Record, CniError> {
    let (sel, log, key) = (add.sel, add.log, add.key);
    let prev = add
        .req
        .conf
        .prev_result
        .as_ref()
        .ok_or_else(|| ConfigError::from("no prevResult"))?;
    let view = observe::node_view(&mut Live::lazy(node), needs, || {
        census.live_except(key).map(Record::claim).collect()
    })?;
    let strict = sel
        .profile
        .routing
        .as_ref()
        .is_some_and(|r| r.mode == RoutingMode::Strict);
    let mut warnings = Vec::new();
    if strict
        && view
            .links
            .iter()
            .any(|l| l.name == crate::routing::IPVS_LINK)
    {
        let w = "kube-ipvs0 present: IPVS-mode kube-proxy is not compatible with strict routing (service traffic may bypass or break the boundary)".to_string();
        log.warn(&w, json!({}));
        warnings.push(w);
    }
    let plan = match plan::build(add.cfg, sel, key, &prev.typed, &view) {
        Ok(p) => p,
        Err(e) => {
            log.warn("refused", json!({"profile": sel.name, "reason": e.msg}));
            return Err(e);
        }
    };
    if log.enabled(podgate_cni::log::Level::Debug) {
        log.debug("plan", json!({"plan": plan}));
    }
    let origin = Origin {
        created: rfc3339_now(),
        boot_id: here.boot_id.clone(),
        netns: add.req.env.netns.clone(),
        node_netns_id: here.node,
        warnings,
        adopted: add.adopted,
    };
    let mut rec = Record::pending(key, &plan, origin);
    facts
        .fill(&mut rec)
        .map_err(|e| failed(add, e, Failures::default()))?;
    Ok(rec)
}

/// The record's claims into the index before the record (write-ahead),
/// then the pending record and the node side. An ADD that fails with
/// nothing kept (no record) takes its claims back. An entry left by a
/// kill or a failed removal names no record: not trusted, and pruned by
/// GC.
fn claim_and_apply(
    add: &Add<'_>,
    scope: &mut Scope<'_>,
    census: &Census,
    node: &mut apply::NodeSocket,
    rec: &mut Record,
) -> Result<(), CniError> {
    let release = || {
        if let Err(e) = claims::release(add.store, add.key) {
            let error = e.to_string();
            add.log
                .warn("claims index entries left", json!({"error": error}));
        }
    };
    if let Err(e) = scope.claim(rec) {
        release();
        return Err(Error::State(e).into());
    }
    let last = census.last_strict(add.key);
    if let Err((e, l)) = apply::apply_node(&mut Live::lazy(node), add.store, rec, last) {
        if l.is_empty() {
            release();
        }
        return Err(failed(add, e, l));
    }
    Ok(())
}

/// A failed apply, rolled back (leaving `left`): logged, and the error.
fn failed(add: &Add<'_>, source: ApplyError, left: Failures) -> CniError {
    let e = Error::Apply {
        profile: add.sel.name.to_string(),
        source: Box::new(source),
        left,
    };
    let msg = e.to_string();
    add.log
        .error("apply failed, rolled back", json!({"error": msg}));
    e.into()
}

/// Undo an ADD whose node side is applied and whose pod side failed (or
/// whose final record write did): the pod side, then the node side
/// under the node-wide lock with the strict count as it is now, then
/// the record. Returns what could not be removed (the pending record
/// then stays for DEL or GC).
fn roll_back(
    rec: &Record,
    pod: &mut apply::PodHandles,
    node: &mut apply::NodeSocket,
    store: &StateStore,
) -> Failures {
    let mut left = apply::remove_pod(&mut Live::pod(pod), rec);
    let lock = match store.lock() {
        Ok(l) => l,
        Err(e) => {
            left.push(e);
            return left;
        }
    };
    let here = Here::now();
    let last = if rec.is_strict() {
        let census = store.names().and_then(|names| {
            Census::for_strict(store, &names, &here, rec, |r| {
                if r.is_strict() {
                    Depth::Precise
                } else {
                    Depth::Boot
                }
            })
        });
        match census {
            Ok(c) => c.last_strict(&rec.key),
            Err(e) => {
                // Fail closed: keep node-wide settings.
                left.push(e);
                false
            }
        }
    } else {
        false
    };
    if apply::has_node_side(rec) {
        match node.get() {
            Ok(n) => left.extend(apply::remove_node(&mut Live::on(n), rec, store, last)),
            Err(e) => left.push(e),
        }
    }
    if left.is_empty() {
        if let Err(e) = claims::remove(store, &rec.key) {
            left.push(e);
        }
    }
    drop(lock);
    left
}

pub(super) fn add(req: &Request) -> Result<Added, CniError> {
    add_as(req, false)
}

/// ADD; `adopted`: on behalf of the node agent's adoption scan (recorded
/// as such), not the runtime.
pub(super) fn add_as(req: &Request, adopted: bool) -> Result<Added, CniError> {
    let cfg = load(&req.conf)?;
    let log = logger(&cfg, req);
    if req.conf.prev_result.is_none() {
        return Err(ConfigError::from(
            "podgate-router is a chained plugin: no prevResult (put it after the primary plugin in the conflist)",
        )
        .into());
    }
    let sel = match selection(&cfg, req) {
        Ok(Some(s)) => s,
        Ok(None) => {
            super::passing_through(&cfg, req, &log);
            return Ok(Added::PrevResult);
        }
        Err(e) => {
            log.warn("refused", json!({"reason": e.msg}));
            return Err(e);
        }
    };
    require_caps()?;
    let ns = open_netns(req)?;
    let key = key_of(req);
    let store = store(&cfg)?;
    // Every attachment of this pod, ADD and DEL alike, one at a time;
    // taken before the node-wide lock, which is held only for the node
    // side (design note "Two locks, fixed order").
    let _pod_lock = store.lock_pod(&key.container_id).map_err(Error::State)?;
    let add = Add {
        cfg: &cfg,
        req,
        log: &log,
        sel: &sel,
        ns: &ns,
        store: &store,
        key: &key,
        adopted,
    };
    let (mut pod, facts) = open_pod(&add)?;
    let mut done = node_side(&add, facts)?;
    pod_side(&add, &mut pod, &mut done)?;
    drop(pod);
    log_applied(&add, &done);
    result_of(req, &done.rec)
}

/// One trip into the pod: this thread enters its netns, opens the handles
/// and comes back (design note "The pod side through handles"); the
/// sysctls the plan and the record need are read through them before the
/// lock, and everything else runs through them too.
fn open_pod(add: &Add<'_>) -> Result<(apply::PodHandles, apply::PodFacts), CniError> {
    let profile = add.sel.profile;
    let want_oif = !profile.pod_routes.is_empty();
    let want_nft = !profile.masquerade.is_empty() || profile.mss_clamp.is_some();
    let names = plan::pod_sysctl_names(add.sel, &add.key.ifname);
    let mut pod = apply::PodHandles::open(
        add.ns,
        apply::PodWants {
            nft: want_nft,
            route: want_oif,
            sysctls: &names,
            cookie: true,
        },
    )
    .map_err(|e| failed(add, ApplyError::Kit(e), Failures::default()))?;
    let facts = apply::PodFacts::read(
        &mut pod,
        add.ns.dev_ino(),
        &add.key.ifname,
        want_oif,
        &names,
    )
    .map_err(|e| failed(add, e, Failures::default()))?;
    Ok((pod, facts))
}

/// The pod side through its handles, then the record as applied; on
/// failure both sides rolled back.
fn pod_side(
    add: &Add<'_>,
    pod: &mut apply::PodHandles,
    done: &mut NodeDone,
) -> Result<(), CniError> {
    let store = add.store;
    let outcome = apply::pod_changes(&mut Live::pod(pod), &mut done.rec, done.reread, store)
        .and_then(|()| {
            done.rec.status = record::Status::Applied;
            record::write(store, &done.rec).map_err(ApplyError::Kit)
        });
    if let Err(e) = outcome {
        let rec = &mut done.rec;
        rec.status = record::Status::Pending;
        let left = roll_back(rec, pod, &mut done.node, store);
        return Err(failed(add, e, left));
    }
    Ok(())
}

fn log_applied(add: &Add<'_>, done: &NodeDone) {
    let (req, rec) = (add.req, &done.rec);
    add.log.info(
        "applied",
        json!({
            "pod": format!("{}/{}", req.env.arg("K8S_POD_NAMESPACE").unwrap_or("-"), req.env.arg("K8S_POD_NAME").unwrap_or("-")),
            "profile": rec.profile,
            "source": rec.source,
            "adopted": rec.adopted,
            "sysctls": rec.sysctls,
            "masquerade": rec.masquerade,
            "returnRoutes": rec.node_routes.iter().map(|r| r.spec().describe()).collect::<Vec<_>>(),
            // Contention figures for the burst benchmark (integration/bench).
            "lockWaitMs": ms(done.lock_waited),
            "lockHeldMs": ms(done.lock_held),
        }),
    );
}
