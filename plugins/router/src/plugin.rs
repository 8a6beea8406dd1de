//! The CNI verbs.

use crate::apply::{self, ApplyError};
use crate::config::RouterConfig;
use crate::intent::{self, PodIntent, Selection};
use crate::lifecycle::{self, Census, Swept};
use crate::plan::{self, NodeView};
use crate::record::{self, Depth, Here, Origin, ReadError, Record};
use podgate_cni::log::{rfc3339_now, Logger};
use podgate_cni::{code, prev_or_empty, Attachment, CniError, NetConf, Plugin, Request};
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_kit::state::{Key, StateStore};
use podgate_kit::{link, route};
use serde_json::{json, Map, Value};

pub struct Router;

fn kit_err(what: &str, e: impl std::fmt::Display) -> CniError {
    CniError::apply(format!("{what}: {e}"))
}

fn load(conf: &NetConf) -> Result<RouterConfig, CniError> {
    let cfg: RouterConfig = conf.plugin_config()?;
    cfg.validate()?;
    Ok(cfg)
}

fn logger(cfg: &RouterConfig, req: &Request) -> Logger {
    Logger::new("podgate-router", cfg.log_file.as_deref())
        .limits(&cfg.telemetry)
        .with("cmd", format!("{:?}", req.command).to_uppercase())
        .with("containerID", req.env.container_id.clone())
        .with("ifname", req.env.ifname.clone())
        .with("network", req.conf.name.clone())
}

/// Changing another namespace needs both: say which one is missing, not EPERM.
fn require_caps() -> Result<(), CniError> {
    use podgate_kit::caps;
    caps::require(
        caps::CAP_NET_ADMIN,
        "podgate-router changes routes, rules, nf_tables and net sysctls",
    )
    .and_then(|_| {
        caps::require(
            caps::CAP_SYS_ADMIN,
            "podgate-router enters the pod's network namespace (setns)",
        )
    })
    .map_err(|e| CniError::new(podgate_cni::code::NOT_AVAILABLE, e.to_string()))
}

fn key_of(req: &Request) -> Key {
    Key::new(&req.conf.name, &req.env.container_id, &req.env.ifname)
}

fn store(cfg: &RouterConfig) -> Result<StateStore, CniError> {
    StateStore::open(&cfg.state_dir).map_err(|e| CniError::io(e.to_string()))
}

fn open_netns(req: &Request) -> Result<NetNs, CniError> {
    let path = req
        .env
        .netns
        .as_deref()
        .ok_or_else(|| CniError::invalid_env("CNI_NETNS is missing"))?;
    NetNs::open(path).map_err(|e| {
        if e.is_not_found() {
            CniError::new(code::UNKNOWN_CONTAINER, e.to_string())
        } else {
            CniError::invalid_env(e.to_string())
        }
    })
}

fn io_err(e: impl std::fmt::Display) -> CniError {
    CniError::io(e.to_string())
}

/// The parts of the node a plan checks against. Everything else stays
/// unread: observing runs under the node-wide lock, and on a node with 110
/// pods the link dump alone is 110+ messages of ~1.4 KiB.
#[derive(Debug, Clone, Copy)]
struct Needs {
    /// Return routes: node routes (conflicts, the connected route to the pod),
    /// node addresses, other pods' records (pool owners).
    return_routes: bool,
    /// A routing boundary reads all of it, links included.
    routing: bool,
    /// Strict routing also reads the node's nf_tables SNAT rules.
    snat: bool,
}

impl Needs {
    fn of(cfg: &RouterConfig, sel: &Selection) -> Needs {
        let routing = cfg
            .profiles
            .get(&sel.profile)
            .and_then(|p| p.routing.as_ref());
        Needs {
            return_routes: !sel.return_routes.is_empty(),
            routing: routing.is_some(),
            snat: routing.is_some_and(|r| r.mode == crate::config::RoutingMode::Strict),
        }
    }
}

fn observe(
    node: &mut apply::NodeSocket,
    census: &Census,
    key: &Key,
    needs: Needs,
) -> Result<NodeView, CniError> {
    let any = needs.return_routes || needs.routing;
    let node_err = |e| kit_err("node netlink", e);
    let routes = if any {
        let node = node.get().map_err(node_err)?;
        route::list_all(node).map_err(|e| kit_err("reading node routes", e))?
    } else {
        Vec::new()
    };
    let addresses = if needs.return_routes {
        link::addresses(node.get().map_err(node_err)?)
            .map_err(|e| kit_err("reading node addresses", e))?
            .into_iter()
            .map(|a| a.addr)
            .collect()
    } else {
        Vec::new()
    };
    // Pool owners, tables and strict slots of the other live attachments.
    let claims = if any {
        census.live_except(key).map(Record::claim).collect()
    } else {
        Vec::new()
    };
    let links = if needs.routing {
        link::list(node.get().map_err(node_err)?).map_err(|e| kit_err("reading node links", e))?
    } else {
        Vec::new()
    };
    // Reading nf_tables only when a strict profile needs it keeps the common path short.
    let node_snat = if needs.snat {
        podgate_kit::nft::NftSocket::new()
            .and_then(|mut s| s.find_snat_rules(None))
            .map_err(|e| kit_err("reading node nf_tables", e))?
    } else {
        Vec::new()
    };
    Ok(NodeView {
        routes,
        addresses,
        claims,
        links,
        node_snat,
    })
}

/// The pod's addresses on this interface from prevResult (DEL may have it).
fn pod_ips_of(req: &Request) -> Vec<std::net::IpAddr> {
    req.conf
        .prev_result
        .as_ref()
        .map(|p| {
            p.typed
                .ips_of(&req.env.ifname)
                .iter()
                .map(|i| i.address.addr())
                .collect()
        })
        .unwrap_or_default()
}

fn log_swept(log: &Logger, what: &str, s: &Swept) {
    if !s.removed.is_empty() {
        log.info(what, json!({"removed": s.removed}));
    }
    if !s.failures.is_empty() {
        log.warn(
            &format!("{what}: incomplete"),
            json!({"failures": s.failures}),
        );
    }
}

/// Milliseconds with microsecond resolution, for log fields.
fn ms(d: std::time::Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// Pod routes from the plan are reported in the result, as a primary would.
fn add_routes_to_result(result: &mut Map<String, Value>, rec: &Record) {
    if rec.pod_routes.is_empty() {
        return;
    }
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
}

impl Router {
    fn selection(cfg: &RouterConfig, req: &Request) -> Result<Option<Selection>, CniError> {
        let intent = PodIntent::from_request(&req.env, &req.conf)?;
        intent::select(cfg, &intent)
    }
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

impl Router {
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
    ) -> Result<NodeDone, CniError> {
        let prev = req
            .conf
            .prev_result
            .as_ref()
            .ok_or_else(|| CniError::invalid_config("no prevResult"))?;
        // Boot ID and node netns identity do not change while this runs:
        // read before the lock, not under it.
        let here = Here::now();
        let needs = Needs::of(cfg, sel);
        // A plan that checks no claims (no return routes, no routing
        // boundary: a masquerade- or sysctl-only pod) needs the other
        // records only to clear stale ones, so they are read before the
        // lock and only the stale ones again under it: reading every record
        // under the lock made each ADD of a burst hold it longer than the
        // last.
        let early = if needs.return_routes || needs.routing {
            None
        } else {
            Some(Census::take(store, &here, |r| {
                if r.key == *key {
                    Depth::Precise
                } else {
                    Depth::Boot
                }
            }))
        };
        let lock = store.lock().map_err(io_err)?;
        lifecycle::sweep_temp(store, Some(&key.container_id)).map_err(io_err)?;
        let mut node = apply::NodeSocket::default();
        let node_err = |e| kit_err("node netlink", e);
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
        let judge = || Census::take(store, &here, depth).map_err(io_err);
        // Fail closed: a state dir that cannot be listed refuses the ADD
        // rather than guessing which pools and strict slots are free.
        let census = match early {
            Some(c) => c.map_err(io_err)?.confirm_stale(store, &here, depth),
            None => judge()?,
        };
        let mut changed = false;
        if !census.stale.is_empty() {
            let swept =
                lifecycle::clear_stale(&census, node.get().map_err(node_err)?, store, &here);
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
                store.remove(key).map_err(io_err)?;
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
        let census = if changed { judge()? } else { census };

        let view = observe(&mut node, &census, key, needs)?;
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
        };
        let mut rec = Record::pending(key, &plan, origin);
        let apply_err = |e: ApplyError, leftovers: Vec<String>| {
            let msg = apply_msg(&sel.profile, &e, &leftovers);
            log.error("apply failed, rolled back", json!({"error": msg}));
            apply_cni_err(&e, msg)
        };
        facts.fill(&mut rec).map_err(|e| apply_err(e, Vec::new()))?;
        let last = census.last_strict(key);
        apply::apply_node(&mut node, store, &mut rec, last).map_err(|(e, l)| apply_err(e, l))?;
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
        ns: &NetNs,
        node: &mut apply::NodeSocket,
        store: &StateStore,
    ) -> Vec<String> {
        let mut left = apply::remove_pod_side(rec, ns);
        let lock = match store.lock() {
            Ok(l) => l,
            Err(e) => {
                left.push(e.to_string());
                return left;
            }
        };
        let here = Here::now();
        let last = if rec.is_strict() {
            match Census::take(store, &here, |r| {
                if r.is_strict() {
                    Depth::Precise
                } else {
                    Depth::Boot
                }
            }) {
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
                Ok(n) => left.extend(apply::remove_node_side(rec, n, store, last)),
                Err(e) => left.push(e.to_string()),
            }
        }
        if left.is_empty() {
            if let Err(e) = store.remove(&rec.key) {
                left.push(e.to_string());
            }
        }
        drop(lock);
        left
    }
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

impl Plugin for Router {
    fn add(&self, req: &Request) -> Result<Map<String, Value>, CniError> {
        let cfg = load(&req.conf)?;
        let log = logger(&cfg, req);
        if req.conf.prev_result.is_none() {
            return Err(CniError::invalid_config(
                "podgate-router is a chained plugin: no prevResult (put it after the primary plugin in the conflist)",
            ));
        }
        let mut result = prev_or_empty(&req.conf);
        let sel = match Self::selection(&cfg, req) {
            Ok(Some(s)) => s,
            Ok(None) => {
                log.info("no profile for this pod; passing through", json!({}));
                return Ok(result);
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
        let label = ns.path().display().to_string();
        let want_oif = cfg
            .profiles
            .get(&sel.profile)
            .is_some_and(|p| !p.pod_routes.is_empty());
        let names = plan::pod_sysctl_names(&cfg, &sel, &key.ifname);
        let (facts_tx, facts_rx) = std::sync::mpsc::sync_channel(1);
        let (go_tx, go_rx) = std::sync::mpsc::sync_channel(1);
        // One trip into the pod: a thread there reads what the record needs
        // while this one waits for the node-wide lock; after the node side
        // it writes the pod side, outside that lock.
        let dev_ino = ns.dev_ino();
        let (nsr, storer, keyr, selr, logr, cfgr) = (&ns, &store, &key, &sel, &log, &cfg);
        let (pod, node) = ns.run_beside(
            || {
                apply::pod_side(
                    apply::PodReads {
                        ns: dev_ino,
                        label: &label,
                        ifname: &key.ifname,
                        want_oif,
                        sysctl_names: &names,
                    },
                    &store,
                    facts_tx,
                    go_rx,
                )
            },
            move || -> Result<NodeDone, CniError> {
                let facts = match facts_rx.recv() {
                    Ok(Ok(f)) => f,
                    Ok(Err(e)) => {
                        let msg = apply_msg(&selr.profile, &e, &[]);
                        logr.error("apply failed, rolled back", json!({"error": msg}));
                        return Err(apply_cni_err(&e, msg));
                    }
                    // The thread did not get into the namespace: its error
                    // comes with its result.
                    Err(_) => return Err(CniError::apply("pod netns thread ended")),
                };
                let done = Router::add_node_side(cfgr, req, logr, selr, nsr, storer, keyr, facts)?;
                let go = apply::Go {
                    rec: done.rec.clone(),
                    reread: done.reread,
                };
                if go_tx.send(go).is_err() {
                    return Err(CniError::apply("pod netns thread ended"));
                }
                Ok(done)
            },
        );
        // The thread could not enter the namespace: nothing was done.
        let pod = pod.map_err(|e| {
            let e = ApplyError::Kit(e);
            let msg = apply_msg(&sel.profile, &e, &[]);
            log.error("apply failed, rolled back", json!({"error": msg}));
            apply_cni_err(&e, msg)
        })?;
        let mut done = node?;
        let outcome = match pod {
            Some((rec, r)) => {
                done.rec = rec;
                r.map_err(|e| (e, true))
            }
            None => Err((
                ApplyError::Kit(podgate_kit::Error::SysctlRefused {
                    name: "-".into(),
                    msg: "pod netns thread ended before the pod side".into(),
                }),
                true,
            )),
        };
        let rec = &mut done.rec;
        let outcome = outcome.and_then(|()| {
            rec.status = record::Status::Applied;
            record::write(&store, rec).map_err(|e| (ApplyError::Kit(e), true))
        });
        if let Err((e, _)) = outcome {
            rec.status = record::Status::Pending;
            let left = Router::roll_back(rec, &ns, &mut done.node, &store);
            let msg = apply_msg(&sel.profile, &e, &left);
            log.error("apply failed, rolled back", json!({"error": msg}));
            return Err(apply_cni_err(&e, msg));
        }
        let rec = &done.rec;
        log.info(
            "applied",
            json!({
                "pod": format!("{}/{}", req.env.arg("K8S_POD_NAMESPACE").unwrap_or("-"), req.env.arg("K8S_POD_NAME").unwrap_or("-")),
                "profile": rec.profile,
                "source": rec.source,
                "sysctls": rec.sysctls,
                "masquerade": rec.masquerade,
                "returnRoutes": rec.node_routes.iter().map(|r| r.spec().describe()).collect::<Vec<_>>(),
                // Contention figures for the burst benchmark (integration/bench).
                "lockWaitMs": ms(done.lock_waited),
                "lockHeldMs": ms(done.lock_held),
            }),
        );
        add_routes_to_result(&mut result, rec);
        Ok(result)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        let cfg = load(&req.conf)?;
        let log = logger(&cfg, req);
        let Some(store) = StateStore::existing(&cfg.state_dir) else {
            return Ok(());
        };
        let key = key_of(req);
        let cid = key.container_id.as_str();
        // No ADD or DEL of this pod runs meanwhile (an ADD past the node
        // side writes its record without the node-wide lock).
        let _pod_lock = store.lock_pod(cid).map_err(io_err)?;
        // Records are replaced by rename, so reading without the lock is safe.
        let rec = match record::read(&store, &key) {
            Ok(Some(r)) => r,
            Ok(None) => {
                // Nothing recorded; an ADD killed while writing its record
                // may have left a temp file.
                let _lock = store.lock().map_err(io_err)?;
                lifecycle::sweep_temp(&store, Some(cid)).map_err(io_err)?;
                return Ok(());
            }
            Err(e @ ReadError::Newer { .. }) => {
                log.error("record kept", json!({"error": e.to_string()}));
                return Err(CniError::io(e.to_string()));
            }
            Err(ReadError::Io(e)) => return Err(io_err(e)),
            Err(e) => return self.del_unreadable(req, &cfg, &log, &store, &key, &e),
        };
        require_caps()?;
        let here = Here::now();
        let recorded = rec.netns.clone();
        let ns = req
            .env
            .netns
            .as_deref()
            .or(recorded.as_deref())
            .and_then(|p| NetNs::open(p).ok())
            .filter(|ns| {
                !rec.liveness(&here, Depth::Path).is_stale() && apply::same_netns(&rec, ns)
            });
        // Pod side first, outside the node-wide lock: it touches only this
        // pod's namespace, which may be gone already (pod deleted).
        if let Some(ns) = &ns {
            let failures = apply::remove_pod_side(&rec, ns);
            if !failures.is_empty() {
                log.error(
                    "pod-side teardown incomplete",
                    json!({"failures": failures}),
                );
                return Err(CniError::apply(format!(
                    "teardown: {}",
                    failures.join("; ")
                )));
            }
        }
        let lock = store.lock().map_err(io_err)?;
        lifecycle::sweep_temp(&store, Some(cid)).map_err(io_err)?;
        let rec = match record::read(&store, &key) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()), // a concurrent DEL finished it
            Err(e) => return Err(CniError::io(e.to_string())),
        };
        let mut node = apply::NodeSocket::default();
        // The other records matter only for a strict pod (whether node-wide
        // settings go back) or a stale one (a live pod may have re-claimed
        // its pool); otherwise DEL does not read them.
        let census = if rec.is_strict() || rec.liveness(&here, Depth::Path).is_stale() {
            Census::take(&store, &here, |r| {
                if r.is_strict() {
                    Depth::Precise
                } else if r.node_routes.is_empty() {
                    Depth::Boot
                } else {
                    Depth::Path
                }
            })
            .map_err(io_err)?
        } else {
            Census::none()
        };
        // Nothing on the node (a masquerade-only pod, no stale record to
        // clear): no node socket either.
        let failures = if apply::has_node_side(&rec) || !census.stale.is_empty() {
            match node.get() {
                Ok(n) => lifecycle::remove_record(&rec, &census, n, None, &store, &here),
                Err(e) => vec![e.to_string()],
            }
        } else {
            Vec::new()
        };
        if !failures.is_empty() {
            log.error("teardown incomplete", json!({"failures": failures}));
            return Err(CniError::apply(format!(
                "teardown: {}",
                failures.join("; ")
            )));
        }
        store.remove(&key).map_err(io_err)?;
        log.info(
            "removed",
            json!({
                "profile": rec.profile,
                "status": rec.status,
                "lockWaitMs": ms(lock.waited()),
                "lockHeldMs": ms(lock.held()),
            }),
        );
        if !census.stale.is_empty() {
            match node.get() {
                Ok(n) => log_swept(
                    &log,
                    "cleared stale records",
                    &lifecycle::clear_stale(&census, n, &store, &here),
                ),
                Err(e) => log.warn(
                    "cleared stale records: incomplete",
                    json!({"failures": [e.to_string()]}),
                ),
            }
        }
        Ok(())
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let cfg = load(&req.conf)?;
        if req.conf.prev_result.is_none() {
            return Err(CniError::invalid_config("CHECK needs prevResult"));
        }
        let sel = Self::selection(&cfg, req)?;
        let key = key_of(req);
        let rec = StateStore::existing(&cfg.state_dir)
            .map(|s| record::read(&s, &key))
            .transpose()
            .map_err(|e| CniError::io(e.to_string()))?
            .flatten();
        let rec = match (sel, rec) {
            (None, None) => return Ok(()),
            (Some(s), None) => {
                return Err(CniError::apply(format!(
                    "profile {:?} applies to this pod but podgate has no record of applying it",
                    s.profile
                )))
            }
            (_, Some(r)) => r,
        };
        let ns = open_netns(req)?;
        let mut node = RouteSocket::new().map_err(|e| kit_err("node netlink", e))?;
        let drift =
            apply::check(&rec, &mut node, &ns).map_err(|e: ApplyError| kit_err("check", e))?;
        if drift.is_empty() {
            Ok(())
        } else {
            Err(CniError::apply(format!("drift: {}", drift.join("; "))))
        }
    }

    fn status(&self, conf: &NetConf) -> Result<(), CniError> {
        let cfg = load(conf)?;
        let store = StateStore::open(&cfg.state_dir)
            .map_err(|e| CniError::not_available(format!("state dir unusable: {e}")))?;
        store
            .lock()
            .map(|_| ())
            .map_err(|e| CniError::not_available(format!("state dir unusable: {e}")))
    }

    fn gc(&self, conf: &NetConf, valid: &[Attachment]) -> Result<(), CniError> {
        let cfg = load(conf)?;
        let Some(store) = StateStore::existing(&cfg.state_dir) else {
            return Ok(());
        };
        let log = Logger::new("podgate-router", cfg.log_file.as_deref())
            .limits(&cfg.telemetry)
            .with("cmd", "GC");
        let _lock = store.lock().map_err(io_err)?;
        lifecycle::sweep_temp(&store, None).map_err(io_err)?;
        let mut node = RouteSocket::new().map_err(|e| kit_err("node netlink", e))?;
        let here = Here::now();
        let census = Census::take_precise(&store, &here).map_err(io_err)?;
        // An attachment whose pod lock is held has an ADD or DEL in flight
        // (an ADD's record is pending until it finishes): that call owns it.
        let is_valid = |k: &Key| {
            valid
                .iter()
                .any(|a| a.container_id == k.container_id && a.ifname == k.ifname)
                || store.pod_busy(&k.container_id)
        };
        let mut failures = Vec::new();
        let swept = lifecycle::clear_stale(&census, &mut node, &store, &here);
        log_swept(&log, "cleared stale records", &swept);
        failures.extend(swept.failures);
        for rec in
            census.listing.records.iter().filter(|r| {
                r.key.network == conf.name && !is_valid(&r.key) && !census.is_stale(&r.key)
            })
        {
            let ns = rec.netns.as_deref().and_then(|p| NetNs::open(p).ok());
            let f = lifecycle::remove_record(rec, &census, &mut node, ns.as_ref(), &store, &here);
            if f.is_empty() {
                let _ = store.remove(&rec.key);
                log.info(
                    "collected",
                    json!({"containerID": rec.key.container_id, "ifname": rec.key.ifname, "status": rec.status}),
                );
            } else {
                failures.extend(f);
            }
        }
        // Unreadable records of attachments that are gone: their objects are
        // found by ownership below.
        let mut keep_unreadable = false;
        for (key, e) in &census.listing.unreadable {
            match key {
                Some(k) if k.network == conf.name && !is_valid(k) => {
                    log.warn(
                        "removing unreadable record",
                        json!({"error": e.to_string()}),
                    );
                    if let Err(e) = store.remove(k) {
                        failures.push(e.to_string());
                    }
                }
                _ => keep_unreadable = true,
            }
        }
        // Ownership sweep: podgate's node routes and rules that no remaining
        // record accounts for. Not while some record cannot be judged (a
        // newer release's, an unreadable one still valid): its objects would
        // look unaccounted for.
        if census.listing.newer.is_empty() && !keep_unreadable {
            let remaining = record::list(&store).map_err(io_err)?;
            let (removed, f) = apply::sweep_node(&mut node, &remaining.records, None);
            if !removed.is_empty() {
                log.info("removed by ownership", json!({"removed": removed}));
            }
            failures.extend(f);
        } else {
            log.warn(
                "ownership sweep skipped: some records cannot be judged",
                json!({"newer": census.listing.newer.iter().map(|(_, e)| e.to_string()).collect::<Vec<_>>()}),
            );
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(CniError::apply(format!("gc: {}", failures.join("; "))))
        }
    }
}

impl Router {
    /// DEL of an attachment whose record does not parse: clean up by
    /// ownership (its tagged tables in CNI_NETNS, podgate's node routes and
    /// rules for its prevResult addresses that no other record accounts
    /// for), then drop the record. The failure to parse is logged.
    fn del_unreadable(
        &self,
        req: &Request,
        cfg: &RouterConfig,
        log: &Logger,
        store: &StateStore,
        key: &Key,
        err: &ReadError,
    ) -> Result<(), CniError> {
        log.warn(
            "unreadable record: removing by ownership",
            json!({"error": err.to_string()}),
        );
        require_caps()?;
        // The caller (DEL) holds the pod lock.
        let _lock = store.lock().map_err(io_err)?;
        lifecycle::sweep_temp(store, Some(&key.container_id)).map_err(io_err)?;
        let mut node = RouteSocket::new().map_err(|e| kit_err("node netlink", e))?;
        let here = Here::now();
        let census = Census::take(store, &here, |_| Depth::Boot).map_err(io_err)?;
        let ns = req.env.netns.as_deref().and_then(|p| NetNs::open(p).ok());
        let s = lifecycle::remove_unreadable(
            key,
            &census,
            &mut node,
            ns.as_ref(),
            &pod_ips_of(req),
            &format!("{}-", cfg.nft_table),
            store,
        );
        log_swept(log, "removed by ownership", &s);
        if s.failures.is_empty() {
            Ok(())
        } else {
            Err(CniError::apply(format!(
                "teardown by ownership: {}",
                s.failures.join("; ")
            )))
        }
    }
}
