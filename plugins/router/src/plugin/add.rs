//! ADD: handles opened in the pod's namespace by a thread that then ends;
//! then, on this thread, the node side under the node-wide lock and the pod
//! side through those handles, the record written ahead and after.

use super::{
    io_err, key_of, kit_err, load, log_swept, logger, ms, open_netns, pod_ips_of, require_caps,
    selection, store,
};
use crate::apply::{self, ApplyError};
use crate::claims;
use crate::config::RouterConfig;
use crate::intent::Selection;
use crate::kernel::Live;
use crate::lifecycle::{self, Census};
use crate::observe::{self, Needs};
use crate::plan;
use crate::record::{self, Depth, Here, Origin, ReadError, Record};
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

/// The census of an ADD whose plan checks no claims: its own earlier
/// record alone, when there is none or it holds no claim and nothing on
/// the node (then nothing of another record can matter). None: the caller
/// reads every record, under the node-wide lock.
fn own_census(store: &StateStore, key: &Key, here: &Here) -> Option<Census> {
    let own = match record::read(store, key) {
        Ok(None) => Vec::new(),
        Ok(Some(r)) if !r.claim().holds_any() && !apply::has_node_side(&r) => vec![r],
        _ => return None,
    };
    Some(Census::of(own, here, |_| Depth::Precise))
}

/// ADD's part under the node-wide lock: stale records, a repeated ADD,
/// observing the node, the plan (every refusal happens here, before
/// anything changed), then the pending record and the node side.
#[allow(clippy::too_many_arguments)]
fn add_node_side(
    cfg: &RouterConfig,
    req: &Request,
    log: &Logger,
    sel: &Selection,
    ns: &NetNs,
    store: &StateStore,
    key: &Key,
    facts: apply::PodFacts,
    adopted: bool,
) -> Result<NodeDone, CniError> {
    let prev = req
        .conf
        .prev_result
        .as_ref()
        .ok_or_else(|| CniError::invalid_config("no prevResult"))?;
    let needs = Needs::of(cfg, sel);
    // Boot ID and node netns identity do not change while this runs:
    // read before the lock, not under it. A plan that reads the node opens
    // its node socket here, also before the lock, and that socket gives
    // the node's netns cookie.
    let mut node = apply::NodeSocket::default();
    let node_err = |e| kit_err("node netlink", e);
    let here = if needs.reads_node() {
        Here::with_socket(node.get().map_err(node_err)?)
    } else {
        Here::now()
    };
    // A plan that checks no claims (no return routes, no routing
    // boundary: a masquerade- or sysctl-only pod) reads no other record:
    // only its own earlier one (a repeated ADD), taken before the lock and
    // confirmed under it if stale. Other pods' stale records are cleared
    // by an ADD whose claims collide with them, GC and the agent's sweep;
    // reading every record here made such an ADD at 250 attachments 2.4x
    // one on an empty node. An earlier record of this attachment that is
    // unreadable or holds claims or node objects (its profile changed)
    // brings every record back, read under the lock like a claims check's:
    // removing it must know what the other live records describe now (a
    // strict pod added while this one waited for the lock keeps the
    // node-wide strict settings).
    // One listing of the state directory serves both the temp-file sweep
    // and the census (taken here or under the lock).
    let early = if needs.claims {
        None
    } else {
        own_census(store, key, &here).map(|census| store.names().map(|names| (names, census)))
    };
    let lock = store.lock().map_err(io_err)?;
    let (names, early) = match early {
        Some(r) => {
            let (names, census) = r.map_err(io_err)?;
            (names, Some(census))
        }
        None => (store.names().map_err(io_err)?, None),
    };
    lifecycle::sweep_temp_in(store, &names, Some(&key.container_id)).map_err(io_err)?;
    let routing = cfg
        .profiles
        .get(&sel.profile)
        .and_then(|p| p.routing.as_ref());
    let strict = routing.is_some_and(|r| r.mode == crate::config::RoutingMode::Strict);
    // The records whose claims would refuse this pod get the precise
    // liveness check; the rest only the cheap one.
    let matters = |r: &Record| {
        let c = r.claim();
        c.key == *key
            || c.pools
                .iter()
                .any(|p| sel.return_routes.iter().any(|q| plan::overlaps(p, q)))
            || (routing.is_some() && c.table.is_some())
            || (strict && c.strict)
    };
    // Records of an earlier boot are always recognised (no syscall);
    // the rest are looked at only where they would refuse this pod: the
    // lock is held meanwhile, and GC and the installer's sweep find the
    // others.
    let depth = |r: &Record| {
        if matters(r) {
            Depth::Precise
        } else {
            Depth::Boot
        }
    };
    // A plan that checks claims asks the claims index for the records
    // holding one it checks (pools overlapping its own; with a routing
    // boundary every table, and strict slots for a strict pod) and reads
    // its own record, instead of reading every record; records the index
    // does not hold completely yet are indexed first (under the lock).
    // Otherwise, or when the index cannot answer (`Census::indexed`),
    // every record is judged.
    let want = claims::Wanted {
        pools: &sel.return_routes,
        tables: routing.is_some(),
        strict,
    };
    let mut index: Option<(claims::Index, usize)> = None;
    let mut judge = |names: Option<&Names>| -> Result<Census, CniError> {
        if needs.claims {
            if let Some(names) = names {
                let mut ix = claims::Index::load(store).map_err(io_err)?;
                let caught = ix.catch_up(store, names).map_err(io_err)?;
                index = Some((ix, caught.unknown));
            } else if let Some((ix, _)) = &mut index {
                // Records went away meanwhile (removals under this lock)
                // and their entries with them: the index as saved now.
                *ix = claims::Index::load(store).map_err(io_err)?;
            }
            if let Some((ix, unknown)) = &index {
                if let Some(c) = Census::indexed(store, ix, *unknown, want, key, &here, depth) {
                    return Ok(c);
                }
            }
        }
        match names {
            Some(n) => Census::take_in(store, n, &here, depth),
            None => Census::take(store, &here, depth),
        }
        .map_err(io_err)
    };
    // Fail closed: a state dir that cannot be listed refuses the ADD
    // rather than guessing which pools and strict slots are free.
    let census = match early {
        Some(c) => c.confirm_stale(store, &here, depth),
        None => judge(Some(&names))?,
    };
    let mut changed = false;
    if !census.stale.is_empty() {
        let swept = lifecycle::clear_stale(&census, node.get().map_err(node_err)?, store, &here);
        log_swept(log, "cleared stale records", &swept);
        changed = !swept.removed.is_empty();
    }
    let mut reread = false;

    // A repeated ADD for the same attachment replaces the earlier one
    // (pending or applied: either may have left things).
    match record::read(store, key) {
        Ok(None) => {}
        // Cleared above with the other stale records.
        Ok(Some(_)) if census.is_stale(key) => {}
        Ok(Some(old)) => {
            let left = lifecycle::remove_record(
                &old,
                &census,
                node.get().map_err(node_err)?,
                Some(ns),
                store,
                &here,
            );
            if !left.is_empty() {
                return Err(CniError::apply(format!(
                    "replacing earlier ADD of this attachment: {}",
                    left.join("; ")
                )));
            }
            claims::remove(store, key).map_err(io_err)?;
            changed = true;
            reread = true;
        }
        Err(e @ ReadError::Newer { .. }) => return Err(CniError::io(e.to_string())),
        Err(ReadError::Io(e)) => return Err(io_err(e)),
        Err(e) => {
            log.warn(
                "unreadable record of this attachment",
                json!({"error": e.to_string()}),
            );
            let s = lifecycle::remove_unreadable(
                key,
                lifecycle::Unreadable::Record,
                &census,
                node.get().map_err(node_err)?,
                Some(ns),
                &pod_ips_of(req),
                &format!("{}-", cfg.nft_table),
                store,
            );
            log_swept(log, "removed by ownership", &s);
            if !s.failures.is_empty() {
                return Err(CniError::apply(format!(
                    "replacing an unreadable record of this attachment: {}",
                    s.failures.join("; ")
                )));
            }
            changed = true;
            reread = true;
        }
    }
    // Judge again only if records went away (rare): claims must not
    // count what was just removed.
    let census = if changed { judge(None)? } else { census };

    // Pool owners, tables and strict slots of the other live attachments.
    let view = observe::node_view(&mut Live::lazy(&mut node), &needs, || {
        census.live_except(key).map(Record::claim).collect()
    })?;
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
    let plan = match plan::build(cfg, sel, key, &prev.typed, &view) {
        Ok(p) => p,
        Err(e) => {
            log.warn("refused", json!({"profile": sel.profile, "reason": e.msg}));
            return Err(e);
        }
    };
    if log.enabled(podgate_cni::log::Level::Debug) {
        log.debug("plan", json!({"plan": plan}));
    }
    let origin = Origin {
        created: rfc3339_now(),
        boot_id: here.boot_id.clone(),
        netns: req.env.netns.clone(),
        node_netns_id: here.node,
        warnings,
        adopted,
    };
    let mut rec = Record::pending(key, &plan, origin);
    let apply_err = |e: ApplyError, leftovers: Vec<String>| {
        let msg = apply_msg(&sel.profile, &e, &leftovers);
        log.error("apply failed, rolled back", json!({"error": msg}));
        apply_cni_err(&e, msg)
    };
    facts.fill(&mut rec).map_err(|e| apply_err(e, Vec::new()))?;
    // Its claims in the index before its record (write-ahead); an ADD that
    // fails with nothing kept (no record) takes them back. An entry left
    // by a kill or a failed removal names no record: not trusted, and
    // pruned by GC.
    let release = || {
        if let Err(e) = claims::release(store, key) {
            log.warn("claims index entries left", json!({"error": e.to_string()}));
        }
    };
    // The index this ADD read (caught up) gets its entries and is written
    // once. Without one (no claims checked) the record holds no claim and
    // the index is left alone: the next ADD that checks claims reads the
    // record once and marks it indexed, so a masquerade-only ADD and its
    // DEL write no index file.
    let claimed = match index.as_mut() {
        Some((ix, _)) => ix.claim(store, &rec),
        None if rec.claim().holds_any() => claims::claim(store, &rec),
        None => Ok(()),
    };
    if let Err(e) = claimed {
        release();
        return Err(io_err(e));
    }
    let last = census.last_strict(key);
    if let Err((e, l)) = apply::apply_node(&mut Live::lazy(&mut node), store, &mut rec, last) {
        if l.is_empty() {
            release();
        }
        return Err(apply_err(e, l));
    }
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
) -> Vec<String> {
    let mut left = apply::remove_pod(&mut Live::pod(pod), rec);
    let lock = match store.lock() {
        Ok(l) => l,
        Err(e) => {
            left.push(e.to_string());
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
                left.push(e.to_string());
                false
            }
        }
    } else {
        false
    };
    if apply::has_node_side(rec) {
        match node.get() {
            Ok(n) => left.extend(apply::remove_node(&mut Live::on(n), rec, store, last)),
            Err(e) => left.push(e.to_string()),
        }
    }
    if left.is_empty() {
        if let Err(e) = claims::remove(store, &rec.key) {
            left.push(e.to_string());
        }
    }
    drop(lock);
    left
}

fn apply_msg(profile: &str, e: &ApplyError, leftovers: &[String]) -> String {
    let mut msg = format!("applying profile {profile:?}: {e}");
    if !leftovers.is_empty() {
        msg += &format!(
            "; rollback left (record kept pending for DEL): {}",
            leftovers.join("; ")
        );
    }
    msg
}

fn apply_cni_err(e: &ApplyError, msg: String) -> CniError {
    if matches!(e, ApplyError::Kit(podgate_kit::Error::State { .. })) {
        CniError::io(msg)
    } else {
        CniError::apply(msg)
    }
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
        return Err(CniError::invalid_config(
            "podgate-router is a chained plugin: no prevResult (put it after the primary plugin in the conflist)",
        ));
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
    // side (design note "Lock scope").
    let _pod_lock = store.lock_pod(&key.container_id).map_err(io_err)?;
    let profile = cfg.profiles.get(&sel.profile);
    let want_oif = profile.is_some_and(|p| !p.pod_routes.is_empty());
    let want_nft = profile.is_some_and(|p| !p.masquerade.is_empty() || p.mss_clamp.is_some());
    let names = plan::pod_sysctl_names(&cfg, &sel, &key.ifname);
    let failed = |e: ApplyError| {
        let msg = apply_msg(&sel.profile, &e, &[]);
        log.error("apply failed, rolled back", json!({"error": msg}));
        apply_cni_err(&e, msg)
    };
    // One trip into the pod: a thread there opens the handles and ends
    // (design note "The pod thread only opens handles"); everything else
    // runs on this thread through them.
    let mut pod = apply::PodHandles::open(
        &ns,
        apply::PodWants {
            nft: want_nft,
            route: want_oif,
            sysctls: &names,
            cookie: true,
        },
    )
    .map_err(|e| failed(ApplyError::Kit(e)))?;
    let facts = apply::PodFacts::read(&mut pod, ns.dev_ino(), &key.ifname, want_oif, &names)
        .map_err(failed)?;
    let mut done = add_node_side(&cfg, req, &log, &sel, &ns, &store, &key, facts, adopted)?;
    let outcome = apply::pod_changes(&mut Live::pod(&mut pod), &mut done.rec, done.reread, &store)
        .and_then(|()| {
            done.rec.status = record::Status::Applied;
            record::write(&store, &done.rec).map_err(ApplyError::Kit)
        });
    if let Err(e) = outcome {
        let rec = &mut done.rec;
        rec.status = record::Status::Pending;
        let left = roll_back(rec, &mut pod, &mut done.node, &store);
        let msg = apply_msg(&sel.profile, &e, &left);
        log.error("apply failed, rolled back", json!({"error": msg}));
        return Err(apply_cni_err(&e, msg));
    }
    drop(pod);
    let rec = &done.rec;
    log.info(
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
    result_of(req, rec)
}
