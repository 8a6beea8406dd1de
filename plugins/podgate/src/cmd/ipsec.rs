//! `podgate ipsec status`: the tunnel guard's checks (podgate-tunnel-guard's
//! own evaluation), printed: the durable signals found (the `required`
//! file, the OVSDB lease keys, `protection.sock`), the agent's `/armed` and
//! `/startup` answers, the guards, bypasses and tunnel marks, and (only when
//! `agentSocket` is reachable) phase, expiry and identity; plus the UDP
//! 500/4500 sockets on the node. Never key material.

use crate::error::{Error, Found, Result};
use crate::output;
use crate::select::Target;
use clap::{Args, Subcommand};
use podgate_tunnel_guard::{evaluate, udp, Evaluation, GuardConfig, Verdict};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub const PLUGIN_TYPE: &str = "podgate-tunnel-guard";

#[derive(Debug, Clone, Subcommand)]
pub enum IpsecCmd {
    /// Is the node's IPsec tunnel protection really in place? Durable signals,
    /// the agent's /armed and /startup answers, both guards, bypass policies,
    /// tunnel marks, UDP 500/4500 sockets; with --agent-socket also phase,
    /// expiry and identity. Never prints key material.
    Status(StatusArgs),
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// A conflist (or single plugin config) holding the podgate-tunnel-guard
    /// entry; default: the first conflist in --cni-conf-dir that has one.
    /// Flags below override its fields.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where to look for a conflist when --config is not given.
    #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// The agent's public protection endpoint directory (protectionDir).
    #[arg(long, value_name = "DIR")]
    pub protection_dir: Option<PathBuf>,
    /// OVSDB socket: _uuid, lease keys, tunnel interfaces (ovsdbSocket).
    #[arg(long, value_name = "PATH")]
    pub ovsdb_socket: Option<PathBuf>,
    /// The agent's private status socket, if reachable (agentSocket):
    /// phase, expiry and identity as diagnostics.
    #[arg(long, value_name = "PATH")]
    pub agent_socket: Option<PathBuf>,
    /// auto (required when the required file, an OVSDB lease key or
    /// protection.sock exists), always, never.
    #[arg(long, value_name = "WHEN")]
    pub required: Option<String>,
    /// With --agent-socket: warn when the certificate expires sooner (e.g. 10m, 1h).
    #[arg(long, value_name = "DURATION")]
    pub min_cert_validity: Option<String>,
    /// Time budget for the whole evaluation.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
}

/// The tunnel-guard entry of a conflist, or the config itself if it is one.
pub fn guard_entry(v: &Value) -> Option<Value> {
    if v.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE) {
        return Some(v.clone());
    }
    v.get("plugins")?
        .as_array()?
        .iter()
        .find(|p| p.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE))
        .cloned()
}

fn read_entry(path: &Path) -> Result<Option<Value>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::File {
        op: "reading",
        path: path.into(),
        source,
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|source| Error::FileJson {
        path: path.into(),
        source,
    })?;
    Ok(guard_entry(&v))
}

/// (entry, where it came from)
fn base_config(a: &StatusArgs) -> Result<(Value, String)> {
    if let Some(p) = &a.config {
        return match read_entry(p)? {
            Some(v) => Ok((v, p.display().to_string())),
            None => Err(Error::msg(format!(
                "{}: no {PLUGIN_TYPE} entry",
                p.display()
            ))),
        };
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&a.cni_conf_dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for f in files {
        let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !matches!(ext, "conflist" | "conf" | "json") {
            continue;
        }
        if let Ok(Some(v)) = read_entry(&f) {
            return Ok((v, f.display().to_string()));
        }
    }
    Ok((Value::Object(Map::new()), "defaults".into()))
}

/// Overlay the flags on the entry (camelCase keys), so validation is the plugin's.
pub fn overlay(mut entry: Value, a: &StatusArgs) -> Value {
    let Some(o) = entry.as_object_mut() else {
        return entry;
    };
    let mut set = |k: &str, v: Value| {
        o.insert(k.to_string(), v);
    };
    if let Some(p) = &a.protection_dir {
        set("protectionDir", Value::String(p.display().to_string()));
    }
    if let Some(p) = &a.ovsdb_socket {
        set("ovsdbSocket", Value::String(p.display().to_string()));
    }
    if let Some(p) = &a.agent_socket {
        set("agentSocket", Value::String(p.display().to_string()));
    }
    if let Some(r) = &a.required {
        set("required", Value::String(r.clone()));
    }
    if let Some(m) = &a.min_cert_validity {
        set("minCertValidity", Value::String(m.clone()));
    }
    if let Some(t) = a.timeout_ms {
        set("timeoutMs", Value::from(t));
    }
    entry
}

pub fn run(cmd: &IpsecCmd, target: &Target, json: bool) -> Result<Found> {
    let IpsecCmd::Status(a) = cmd;
    let (entry, source) = base_config(a)?;
    let cfg =
        GuardConfig::from_value(&overlay(entry, a)).map_err(|e| Error::usage(e.to_string()))?;
    let sel = target.select()?;
    // The XFRM readback and the socket table are per netns: read them in the chosen one.
    let mut evaluation: Evaluation = sel.ns.run(|| {
        let mut r = evaluate(&cfg, SystemTime::now());
        r.ike_sockets = udp::ike_sockets().ok();
        r
    })?;
    if evaluation.ike_sockets.is_none() {
        evaluation.ike_sockets = Some(Vec::new());
    }
    if json {
        output::json(&serde_json::json!({ "config": source, "report": evaluation }))?;
    } else {
        let ike = match evaluation.ike_sockets.as_deref() {
            Some([]) | None => {
                "no UDP socket bound to 500/4500 here: no IKE daemon listens in this netns"
                    .to_string()
            }
            Some(s) => format!(
                "{} UDP socket(s) on 500/4500: an IKE daemon is bound (not proof it works)",
                s.len()
            ),
        };
        output::text(format!(
            "config: {source}\nnetns:  {}\n{evaluation}ike:    {ike}\nsummary: {}\n",
            sel.chosen.label(),
            evaluation.summary()
        ))?;
    }
    Ok(Found::problem_if(evaluation.verdict == Verdict::NotReady))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `--config`: a missing file and one that is not JSON are errors
    /// naming the file, with the I/O or JSON error kept.
    #[test]
    fn a_config_that_cannot_be_read_names_the_file() {
        let tmp = tempfile::Builder::new()
            .prefix("podgate-ipsec-config-")
            .tempdir()
            .unwrap();
        let dir = tmp.path();
        let missing = dir.join("missing.conflist");
        match read_entry(&missing) {
            Err(Error::File { op, path, source }) => {
                assert_eq!((op, path), ("reading", missing.clone()));
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{other:?}"),
        }
        let bad = dir.join("bad.conflist");
        std::fs::write(&bad, "{not json").unwrap();
        match read_entry(&bad) {
            Err(Error::FileJson { path, source }) => {
                assert_eq!(path, bad);
                assert!(source.is_syntax(), "{source}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn finds_the_guard_entry() {
        let conflist = json!({"cniVersion": "1.0.0", "name": "k", "plugins": [
            {"type": "kube-ovn"}, {"type": PLUGIN_TYPE, "timeoutMs": 700}]});
        assert_eq!(guard_entry(&conflist).unwrap()["timeoutMs"], 700);
        assert!(guard_entry(&json!({"type": "bridge"})).is_none());
        assert!(guard_entry(&json!({"type": PLUGIN_TYPE})).is_some());
    }

    #[test]
    fn flags_override_the_entry() {
        let a = StatusArgs {
            config: None,
            cni_conf_dir: PathBuf::from("/nonexistent"),
            protection_dir: Some(PathBuf::from("/tmp/prot")),
            ovsdb_socket: None,
            agent_socket: Some(PathBuf::from("/tmp/x.sock")),
            required: Some("always".into()),
            min_cert_validity: None,
            timeout_ms: Some(200),
        };
        let v = overlay(
            json!({"type": PLUGIN_TYPE, "ovsdbSocket": "/tmp/db.sock", "timeoutMs": 900}),
            &a,
        );
        let cfg = GuardConfig::from_value(&v).unwrap();
        assert_eq!(cfg.protection_dir, PathBuf::from("/tmp/prot"));
        assert_eq!(cfg.ovsdb_socket, PathBuf::from("/tmp/db.sock"));
        assert_eq!(cfg.agent_socket, Some(PathBuf::from("/tmp/x.sock")));
        assert_eq!(cfg.timeout_ms, 200);
    }
}
