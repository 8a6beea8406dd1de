//! The CNI verbs: one file a verb, the helpers they share here.

mod add;
pub mod adopt;
mod del;
mod gc;

use crate::config::{RouterConfig, ANNOTATIONS_CAPABILITY};
use crate::error::Error;
use crate::intent::{self, PodIntent, Selection};
use crate::lifecycle::Swept;
use podgate_cni::log::Logger;
use podgate_cni::{Added, Attachment, CniError, NetConf, Plugin, Request};
use podgate_kit::netns::NetNs;
use podgate_kit::state::{Key, StateStore};
use serde_json::json;

pub struct Router;

fn load(conf: &NetConf) -> Result<RouterConfig, CniError> {
    let cfg: RouterConfig = conf.plugin_config()?;
    cfg.validate()?;
    Ok(cfg)
}

fn logger(cfg: &RouterConfig, req: &Request) -> Logger {
    Logger::new("podgate-router", cfg.log_file.as_deref())
        .limits(&cfg.telemetry)
        .with("cmd", req.command.as_str())
        .with("containerID", req.env.container_id.clone())
        .with("ifname", req.env.ifname.clone())
        .with("network", req.conf.name.clone())
}

/// Changing another namespace needs both: say which one is missing, not EPERM.
fn require_caps() -> Result<(), CniError> {
    use podgate_kit::caps;
    // One capget for both.
    caps::require_all(&[
        (
            caps::CAP_NET_ADMIN,
            "podgate-router changes routes, rules, nf_tables and net sysctls",
        ),
        (
            caps::CAP_SYS_ADMIN,
            "podgate-router enters the pod's network namespace (setns)",
        ),
    ])
    .map_err(|source| Error::Unavailable { what: None, source })?;
    Ok(())
}

fn key_of(req: &Request) -> Key {
    Key::new(&req.conf.name, &req.env.container_id, &req.env.ifname)
}

fn store(cfg: &RouterConfig) -> Result<StateStore, CniError> {
    Ok(StateStore::open(&cfg.state_dir).map_err(Error::State)?)
}

fn open_netns(req: &Request) -> Result<NetNs, CniError> {
    let path = req
        .env
        .netns
        .as_deref()
        .ok_or_else(|| Error::Env("CNI_NETNS is missing".into()))?;
    Ok(NetNs::open(path).map_err(Error::Netns)?)
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

fn selection<'c>(cfg: &'c RouterConfig, req: &Request) -> Result<Option<Selection<'c>>, CniError> {
    let intent = PodIntent::from_request(&req.env, &req.conf)?;
    intent::select(cfg, &intent)
}

/// The log line (and, where the runtime delivered no annotations to a pod
/// that may choose its profile by annotation, the warning counted as
/// `noAnnotations`) of a pod that gets no profile.
pub(super) fn passing_through(cfg: &RouterConfig, req: &Request, log: &Logger) {
    match intent::annotations_missing(cfg, &req.env, &req.conf) {
        Some(ns) => {
            log.warn(
                &format!(
                    "no profile for this pod; passing through: the runtime delivered no pod annotations \
                     (runtimeConfig has no {ANNOTATIONS_CAPABILITY}), so a {} annotation of this pod in \
                     namespace {ns:?} (allow.annotationNamespaces) could not be seen; the entry needs \
                     capabilities {{\"{ANNOTATIONS_CAPABILITY}\": true}} and a runtime that fills it \
                     (containerd >= 1.5, CRI-O >= 1.29; Multus passes none: use assign or args.cni.profile)",
                    intent::ANN_PROFILE
                ),
                json!({"warning": NO_ANNOTATIONS}),
            );
            podgate_cni::event::warn(NO_ANNOTATIONS);
        }
        None => log.info("no profile for this pod; passing through", json!({})),
    }
}

/// The event label of [`passing_through`]'s warning.
const NO_ANNOTATIONS: &str = "noAnnotations";

impl Plugin for Router {
    fn add(&self, req: &Request) -> Result<Added, CniError> {
        add::add(req)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        del::del(req)
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        gc::check(req)
    }

    fn status(&self, conf: &NetConf) -> Result<(), CniError> {
        gc::status(conf)
    }

    fn gc(&self, conf: &NetConf, valid: &[Attachment]) -> Result<(), CniError> {
        gc::gc(conf, valid)
    }
}
