//! The CNI verbs of the tunnel guard: gate ADD/CHECK (and, opt-in, STATUS)
//! on [`evaluate`], log the verdict, never block DEL.

use crate::config::ConfigError;
use crate::{evaluate, GuardConfig, Mode, Required};
use podgate_cni::log::Logger;
use podgate_cni::{code, Added, CniError, NetConf, Plugin, Request};
use serde_json::json;
use std::time::SystemTime;

/// The plugin's name in its errors and log lines.
pub const NAME: &str = "podgate-tunnel-guard";

/// The CNI plugin: ADD and CHECK refused with code 11 (try again later)
/// while the node's protection is not in place, DEL never refused.
pub struct TunnelGuard;

/// Why the guard fails a call; every CNI error of the guard but the
/// protocol's own comes from this, in one conversion.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// ADD, CHECK: the node's protection is not in place (the one-line summary).
    #[error("{0}")]
    Unprotected(String),
    /// STATUS (`reportStatus`): the node is not ready for pods.
    #[error("{0}")]
    NotReady(String),
}

impl From<Error> for CniError {
    fn from(e: Error) -> CniError {
        let c = match e {
            Error::Config(_) => code::INVALID_CONFIG,
            Error::Unprotected(_) => code::TRY_AGAIN_LATER,
            Error::NotReady(_) => code::NOT_AVAILABLE,
        };
        CniError::new(c, e.to_string())
    }
}

fn load(conf: &NetConf) -> Result<GuardConfig, CniError> {
    Ok(GuardConfig::from_value(&conf.value()?).map_err(Error::Config)?)
}

fn logger(cfg: &GuardConfig, req: &Request, verb: &str) -> Logger {
    let mut log = Logger::new(NAME, cfg.log_file.as_deref())
        .limits(&cfg.telemetry)
        .with("command", verb)
        .with("containerID", req.env.container_id.as_str());
    for (key, field) in [
        ("K8S_POD_NAMESPACE", "podNamespace"),
        ("K8S_POD_NAME", "podName"),
    ] {
        if let Some(v) = req.env.arg(key) {
            log = log.with(field, v);
        }
    }
    log
}

/// Evaluate and log; Err(one-line summary) when the caller must refuse.
/// `namespace` is the pod's (CNI_ARGS `K8S_POD_NAMESPACE`), for `excludeNamespaces`.
fn gate(cfg: &GuardConfig, log: &Logger, namespace: Option<&str>) -> Result<(), String> {
    if cfg.required == Required::Never {
        log.info(
            "ipsec not required: required: never",
            json!({"verdict": "notRequired"}),
        );
        return Ok(());
    }
    let report = evaluate(cfg, SystemTime::now());
    let fields = json!({
        "verdict": report.verdict,
        "mode": cfg.mode,
        "failed": report.failures().map(|c| c.detail.as_str()).collect::<Vec<_>>(),
        "report": report,
    });
    match (report.is_ready(), cfg.mode) {
        (true, _) => {
            log.info(&report.summary(), fields);
            Ok(())
        }
        (false, Mode::Audit) => {
            log.warn(&format!("{} (audit: allowed)", report.summary()), fields);
            Ok(())
        }
        // Bootstrap components (the certificate issuer) must start before the
        // node can be armed; the operator names them, a pod cannot.
        (false, Mode::Enforce) if cfg.excluded(namespace) => {
            let ns = namespace.unwrap_or_default();
            log.warn(
                &format!(
                    "{} (namespace {ns} in excludeNamespaces: allowed)",
                    report.summary()
                ),
                fields,
            );
            Ok(())
        }
        (false, Mode::Enforce) => {
            let summary = report.summary();
            log.warn(&summary, fields);
            Err(summary)
        }
    }
}

impl Plugin for TunnelGuard {
    fn add(&self, req: &Request) -> Result<Added, CniError> {
        let cfg = load(&req.conf)?;
        let ns = req.env.arg("K8S_POD_NAMESPACE");
        gate(&cfg, &logger(&cfg, req, "ADD"), ns).map_err(Error::Unprotected)?;
        Ok(Added::PrevResult)
    }

    /// Never blocks and never contacts the agent: a pod must always be removable.
    fn del(&self, _req: &Request) -> Result<(), CniError> {
        Ok(())
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let cfg = load(&req.conf)?;
        let ns = req.env.arg("K8S_POD_NAMESPACE");
        Ok(gate(&cfg, &logger(&cfg, req, "CHECK"), ns).map_err(Error::Unprotected)?)
    }

    /// Opt-in (`reportStatus`): a failing STATUS marks the whole node NotReady
    /// in containerd >= 2.0.
    fn status(&self, conf: &NetConf) -> Result<(), CniError> {
        let cfg = load(conf)?;
        if !cfg.report_status {
            return Ok(());
        }
        let log = Logger::new(NAME, cfg.log_file.as_deref())
            .limits(&cfg.telemetry)
            .with("command", "STATUS");
        Ok(gate(&cfg, &log, None).map_err(Error::NotReady)?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use podgate_cni::dispatch;
    use serde_json::Value;

    fn call(cmd: &str, conf: Value) -> (i32, Value) {
        let vars = |k: &str| -> Option<String> {
            match k {
                "CNI_COMMAND" => Some(cmd.to_string()),
                "CNI_CONTAINERID" => Some("c1".into()),
                "CNI_IFNAME" => Some("eth0".into()),
                "CNI_NETNS" => Some("/var/run/netns/none".into()),
                _ => None,
            }
        };
        let out = dispatch(&TunnelGuard, vars, conf.to_string().as_bytes());
        let v = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        (out.exit, v)
    }

    fn conf(extra: Value) -> Value {
        let mut c = json!({
            "cniVersion": "1.1.0", "name": "net", "type": NAME,
            "protectionDir": "/nonexistent/podgate-test/protection",
            "ovsdbSocket": "/nonexistent/podgate-test/db.sock",
            "prevResult": {"cniVersion": "1.1.0", "ips": [{"address": "10.1.0.5/24"}],
                           "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/p"}]}
        });
        if let (Some(c), Value::Object(e)) = (c.as_object_mut(), extra) {
            c.extend(e);
        }
        c
    }

    #[test]
    fn add_passes_prev_result_through_when_not_required() {
        let (exit, out) = call("ADD", conf(json!({})));
        assert_eq!(exit, 0, "{out}");
        assert_eq!(out["ips"][0]["address"], "10.1.0.5/24");
        let (exit, _) = call("ADD", conf(json!({"required": "never"})));
        assert_eq!(exit, 0);
    }

    #[test]
    fn add_fails_try_again_when_required_agent_is_absent() {
        let (exit, out) = call("ADD", conf(json!({"required": "always"})));
        assert_eq!(exit, 1);
        assert_eq!(out["code"], 11);
        assert!(out["msg"].as_str().unwrap().starts_with(
            "ipsec not ready: ovsdb socket /nonexistent/podgate-test/db.sock absent; "
        ));
        let (exit, _) = call("ADD", conf(json!({"required": "always", "mode": "audit"})));
        assert_eq!(exit, 0);
        let (exit, out) = call("CHECK", conf(json!({"required": "always"})));
        assert_eq!((exit, out["code"].as_u64()), (1, Some(11)));
    }

    #[test]
    fn del_never_fails_even_with_a_broken_config() {
        assert_eq!(call("DEL", conf(json!({"required": "always"}))).0, 0);
        assert_eq!(call("DEL", conf(json!({"timeoutMs": "x"}))).0, 0);
    }

    #[test]
    fn status_is_opt_in() {
        assert_eq!(call("STATUS", conf(json!({"required": "always"}))).0, 0);
        let (exit, out) = call(
            "STATUS",
            conf(json!({"required": "always", "reportStatus": true})),
        );
        assert_eq!((exit, out["code"].as_u64()), (1, Some(50)));
    }

    #[test]
    fn bad_config_is_code_7() {
        let (exit, out) = call("ADD", conf(json!({"mode": "loud"})));
        assert_eq!((exit, out["code"].as_u64()), (1, Some(7)));
    }
}
