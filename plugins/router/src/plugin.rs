//! The CNI verbs.

use crate::apply::{self, ApplyError};
use crate::config::RouterConfig;
use crate::intent::{self, PodIntent, Selection};
use crate::plan::{self, NodeView};
use crate::record::Record;
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

/// Strict pods other than `key` recorded on this node.
fn other_strict(store: &StateStore, key: &Key) -> usize {
    store
        .list::<Record>()
        .map(|(all, _)| {
            all.iter()
                .filter(|r| r.key != *key && crate::routing::is_strict(r))
                .count()
        })
        .unwrap_or(0)
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

fn observe(node: &mut RouteSocket, store: &StateStore, needs: Needs) -> Result<NodeView, CniError> {
    let any = needs.return_routes || needs.routing;
    let routes = if any {
        route::list_all(node).map_err(|e| kit_err("reading node routes", e))?
    } else {
        Vec::new()
    };
    let addresses = if needs.return_routes {
        link::addresses(node)
            .map_err(|e| kit_err("reading node addresses", e))?
            .into_iter()
            .map(|a| a.addr)
            .collect()
    } else {
        Vec::new()
    };
    let records = if any {
        store
            .list::<Record>()
            .map_err(|e| CniError::io(e.to_string()))?
            .0
    } else {
        Vec::new()
    };
    let links = if needs.routing {
        link::list(node).map_err(|e| kit_err("reading node links", e))?
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
        records,
        links,
        node_snat,
    })
}

/// Milliseconds with microsecond resolution, for log fields.
fn ms(d: std::time::Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// Pod routes from the plan are reported in the result, as a primary would.
fn add_routes_to_result(result: &mut Map<String, Value>, rec: &Record) {
    if rec.plan.pod_routes.is_empty() {
        return;
    }
    let routes = result
        .entry("routes")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = routes {
        for r in &rec.plan.pod_routes {
            let mut v = json!({"dst": r.dst.to_string()});
            if let (Some(gw), Some(o)) = (r.gw, v.as_object_mut()) {
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

impl Plugin for Router {
    fn add(&self, req: &Request) -> Result<Map<String, Value>, CniError> {
        let cfg = load(&req.conf)?;
        let log = logger(&cfg, req);
        let prev = req.conf.prev_result.as_ref().ok_or_else(|| {
            CniError::invalid_config(
                "podgate-router is a chained plugin: no prevResult (put it after the primary plugin in the conflist)",
            )
        })?;
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
        let lock = store.lock().map_err(|e| CniError::io(e.to_string()))?;
        let mut node = RouteSocket::new().map_err(|e| kit_err("node netlink", e))?;

        // A repeated ADD for the same attachment replaces the earlier one.
        if let Ok(Some(old)) = store.read::<Record>(&key) {
            let last = other_strict(&store, &key) == 0;
            let left = apply::remove(&old, &mut node, Some(&ns), &store, last);
            if !left.is_empty() {
                return Err(CniError::apply(format!(
                    "replacing earlier ADD of this attachment: {}",
                    left.join("; ")
                )));
            }
            let _ = store.remove(&key);
        }

        let needs = Needs::of(&cfg, &sel);
        let strict = needs.snat;
        let view = observe(&mut node, &store, needs)?;
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
        let plan = match plan::build(&cfg, &sel, &key, &prev.typed, &view) {
            Ok(p) => p,
            Err(e) => {
                log.warn("refused", json!({"profile": sel.profile, "reason": e.msg}));
                return Err(e);
            }
        };
        let rec = Record {
            key: key.clone(),
            netns: req.env.netns.clone(),
            created: rfc3339_now(),
            plan,
            sysctl_previous: Default::default(),
            pod_routes: Vec::new(),
            warnings,
        };
        let rec = apply::apply(&ns, &mut node, &store, rec).map_err(|(e, leftovers)| {
            let mut msg = format!("applying profile {:?}: {e}", sel.profile);
            if !leftovers.is_empty() {
                msg += &format!("; rollback left: {}", leftovers.join("; "));
            }
            log.error("apply failed, rolled back", json!({"error": msg}));
            CniError::apply(msg)
        })?;
        if let Err(e) = store.write(&key, &rec) {
            let last = other_strict(&store, &key) == 0;
            let left = apply::remove(&rec, &mut node, Some(&ns), &store, last);
            return Err(CniError::io(format!(
                "recording state: {e}{}",
                if left.is_empty() {
                    String::new()
                } else {
                    format!("; cleanup left: {}", left.join("; "))
                }
            )));
        }
        log.info(
            "applied",
            json!({
                "pod": format!("{}/{}", req.env.arg("K8S_POD_NAMESPACE").unwrap_or("-"), req.env.arg("K8S_POD_NAME").unwrap_or("-")),
                "profile": rec.plan.profile,
                "source": rec.plan.source,
                "sysctls": rec.plan.sysctls,
                "masquerade": rec.plan.masquerade,
                "returnRoutes": rec.plan.node_routes.iter().map(|r| r.describe()).collect::<Vec<_>>(),
                // Contention figures for the burst benchmark (integration/bench).
                "lockWaitMs": ms(lock.waited()),
                "lockHeldMs": ms(lock.held()),
            }),
        );
        drop(lock);
        add_routes_to_result(&mut result, &rec);
        Ok(result)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        let cfg = load(&req.conf)?;
        let log = logger(&cfg, req);
        let Some(store) = StateStore::existing(&cfg.state_dir) else {
            return Ok(());
        };
        let key = key_of(req);
        // Records are replaced by rename, so reading without the lock is safe.
        let rec = match store.read::<Record>(&key) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(e) => {
                // A corrupt record cannot be undone; drop it so DEL converges.
                log.warn(
                    "dropping unreadable record",
                    json!({"error": e.to_string()}),
                );
                let _lock = store.lock().map_err(|e| CniError::io(e.to_string()))?;
                let _ = store.remove(&key);
                return Ok(());
            }
        };
        require_caps()?;
        // Pod side first, outside the node-wide lock: it touches only this
        // pod's namespace, which may be gone already (pod deleted).
        if let Some(ns) = req.env.netns.as_deref().and_then(|p| NetNs::open(p).ok()) {
            let failures = apply::remove_pod_side(&rec, &ns);
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
        let lock = store.lock().map_err(|e| CniError::io(e.to_string()))?;
        if store.read::<Record>(&key).ok().flatten().is_none() {
            return Ok(()); // a concurrent DEL finished it
        }
        let mut node = RouteSocket::new().map_err(|e| kit_err("node netlink", e))?;
        let last = other_strict(&store, &key) == 0;
        let failures = apply::remove_node_side(&rec, &mut node, &store, last);
        if !failures.is_empty() {
            log.error("teardown incomplete", json!({"failures": failures}));
            return Err(CniError::apply(format!(
                "teardown: {}",
                failures.join("; ")
            )));
        }
        store
            .remove(&key)
            .map_err(|e| CniError::io(e.to_string()))?;
        log.info(
            "removed",
            json!({
                "profile": rec.plan.profile,
                "lockWaitMs": ms(lock.waited()),
                "lockHeldMs": ms(lock.held()),
            }),
        );
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
            .map(|s| s.read::<Record>(&key))
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
        let log = Logger::new("podgate-router", cfg.log_file.as_deref()).with("cmd", "GC");
        let _lock = store.lock().map_err(|e| CniError::io(e.to_string()))?;
        let (records, _) = store
            .list::<Record>()
            .map_err(|e| CniError::io(e.to_string()))?;
        let mut node = RouteSocket::new().map_err(|e| kit_err("node netlink", e))?;
        let mut failures = Vec::new();
        for rec in records.iter().filter(|r| r.key.network == conf.name) {
            let keep = valid
                .iter()
                .any(|a| a.container_id == rec.key.container_id && a.ifname == rec.key.ifname);
            if keep {
                continue;
            }
            let ns = rec.netns.as_deref().and_then(|p| NetNs::open(p).ok());
            let last = other_strict(&store, &rec.key) == 0;
            let f = apply::remove(rec, &mut node, ns.as_ref(), &store, last);
            if f.is_empty() {
                let _ = store.remove(&rec.key);
                log.info(
                    "collected",
                    json!({"containerID": rec.key.container_id, "ifname": rec.key.ifname}),
                );
            } else {
                failures.extend(f);
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(CniError::apply(format!("gc: {}", failures.join("; "))))
        }
    }
}
