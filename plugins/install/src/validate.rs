//! podgate's entries are checked with the plugins' own config code before
//! they go into a chain: an operator mistake is reported by the installer
//! (and its DaemonSet stays unready) instead of failing every pod ADD with
//! code 7.

use super::json::Json;
use crate::Error;
use podgate_router::config::RouterConfig;
use podgate_tunnel_guard::GuardConfig;
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};

pub const ROUTER: &str = "podgate-router";
pub const TUNNEL_GUARD: &str = "podgate-tunnel-guard";
/// The plugin binaries the installer ships.
pub const BINARIES: [&str; 2] = [ROUTER, TUNNEL_GUARD];

/// Each entry parses and validates as its plugin would parse it.
pub fn validate_entries(entries: &[Json]) -> Result<(), Error> {
    for (index, entry) in entries.iter().enumerate() {
        let ty = entry
            .as_object()
            .and_then(|o| o.str_field("type"))
            .unwrap_or_default()
            .to_string();
        let invalid = |msg: String| Error::EntryInvalid {
            index,
            ty: ty.clone(),
            msg,
        };
        let value = entry.to_value().map_err(|e| invalid(e.to_string()))?;
        match ty.as_str() {
            ROUTER => {
                let cfg = RouterConfig::deserialize(&value).map_err(|e| invalid(e.to_string()))?;
                cfg.validate().map_err(|e| invalid(e.to_string()))?;
            }
            TUNNEL_GUARD => {
                GuardConfig::from_value(&value).map_err(|e| invalid(e.to_string()))?;
            }
            _ => return Err(Error::EntryUnknownType { index, ty }),
        }
    }
    Ok(())
}

/// podgate's state directories: the router's `stateDir` and the plugins'
/// `eventFile` (where the node agent makes the event channel).
pub const STATE_ROOTS: [&str; 2] = ["/var/lib/cni/podgate", "/var/lib/podgate"];
/// The plugins' `logFile`.
pub const LOG_ROOTS: [&str; 1] = ["/var/log/podgate"];
/// The tunnel guard's `protectionDir`: Kube-OVN's `--protection-dir`.
pub const PROTECTION_ROOTS: [&str; 2] = [
    "/run/kube-ovn-ipsec-protection",
    "/var/run/kube-ovn-ipsec-protection",
];
/// The tunnel guard's `ovsdbSocket`: Open vSwitch's run directory.
pub const OVSDB_ROOTS: [&str; 2] = ["/run/openvswitch", "/var/run/openvswitch"];
/// The tunnel guard's `agentSocket`: Kube-OVN's `--runtime-dir`.
pub const AGENT_ROOTS: [&str; 2] = ["/run/kube-ovn-ipsec", "/var/run/kube-ovn-ipsec"];

/// Where the host paths of podgate's entries may point. The entries come
/// from the `podgate-plugins` ConfigMap, which someone who is not root on
/// the node may be allowed to edit, and the plugins run as root on the
/// node: they write `stateDir`, `logFile` and `eventFile` and connect to
/// `protectionDir`'s socket, `ovsdbSocket` and `agentSocket`. So each must
/// lie in podgate's (or Kube-OVN's and Open vSwitch's) own directory for
/// it, as an absolute path without `.` or `..`, and never inside the
/// installer's own state directory, nor inside the one of earlier releases
/// ([`crate::LEGACY_STATE_DIR`], under podgate-router's default
/// `stateDir`: `--migrate-state-from` reads it and the uninstall purge
/// removes it whole).
#[derive(Debug, Clone, Default)]
pub struct HostPaths {
    /// `--plugin-path-root`: accepted for every key besides the roots
    /// above (set with the installer's arguments, not in the ConfigMap).
    pub extra_roots: Vec<PathBuf>,
    /// The installer's `--state-dir`.
    pub installer_state: PathBuf,
}

impl HostPaths {
    /// Every host path of `entries` (parsed as in [`validate_entries`]),
    /// the first that is out of place an error naming the entry, the key
    /// and the directories it may be in.
    pub fn check(&self, entries: &[Json]) -> Result<(), Error> {
        for (index, entry) in entries.iter().enumerate() {
            let invalid = |ty: &str, msg: String| Error::EntryInvalid {
                index,
                ty: ty.to_string(),
                msg,
            };
            let value = entry.to_value().map_err(|e| invalid("?", e.to_string()))?;
            for (ty, key, path, roots) in host_paths_of(&value).map_err(|(ty, e)| invalid(ty, e))? {
                self.check_one(key, &path, roots)
                    .map_err(|msg| invalid(ty, msg))?;
            }
        }
        Ok(())
    }

    fn check_one(&self, key: &str, path: &Path, roots: &[&str]) -> Result<(), String> {
        let plain = path.is_absolute()
            && path
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !plain {
            return Err(format!(
                "{key} {}: a host path must be absolute, without \".\" or \"..\"",
                path.display()
            ));
        }
        if path.starts_with(&self.installer_state) {
            return Err(format!(
                "{key} {} is inside the installer's state directory {}",
                path.display(),
                self.installer_state.display()
            ));
        }
        if path.starts_with(crate::LEGACY_STATE_DIR) {
            return Err(format!(
                "{key} {} is inside the installer's state directory of earlier releases {}",
                path.display(),
                crate::LEGACY_STATE_DIR
            ));
        }
        let mut allowed = roots
            .iter()
            .map(PathBuf::from)
            .chain(self.extra_roots.iter().cloned());
        if allowed.any(|r| path.starts_with(&r)) {
            return Ok(());
        }
        let listed: Vec<String> = roots
            .iter()
            .map(|r| r.to_string())
            .chain(self.extra_roots.iter().map(|r| r.display().to_string()))
            .collect();
        Err(format!(
            "{key} {} is outside {}: the plugins run as root on the node, and the ConfigMap must not point them at other host files",
            path.display(),
            listed.join(", ")
        ))
    }
}

type HostPath = (&'static str, &'static str, PathBuf, &'static [&'static str]);

/// (plugin type, key, path, allowed roots) of every host path an entry
/// names, defaults included.
fn host_paths_of(value: &serde_json::Value) -> Result<Vec<HostPath>, (&'static str, String)> {
    let ty = value.get("type").and_then(serde_json::Value::as_str);
    let mut out: Vec<HostPath> = Vec::new();
    let mut telemetry = |ty: &'static str, log: Option<PathBuf>, events: Option<PathBuf>| {
        out.extend(log.map(|p| (ty, "logFile", p, &LOG_ROOTS[..])));
        out.extend(events.map(|p| (ty, "eventFile", p, &STATE_ROOTS[..])));
    };
    match ty {
        Some(ROUTER) => {
            let c = RouterConfig::deserialize(value).map_err(|e| (ROUTER, e.to_string()))?;
            telemetry(ROUTER, c.log_file, c.telemetry.event_file);
            out.push((ROUTER, "stateDir", c.state_dir, &STATE_ROOTS));
        }
        Some(TUNNEL_GUARD) => {
            let c = GuardConfig::from_value(value).map_err(|e| (TUNNEL_GUARD, e.to_string()))?;
            telemetry(TUNNEL_GUARD, c.log_file, c.telemetry.event_file);
            out.push((
                TUNNEL_GUARD,
                "protectionDir",
                c.protection_dir,
                &PROTECTION_ROOTS,
            ));
            out.push((TUNNEL_GUARD, "ovsdbSocket", c.ovsdb_socket, &OVSDB_ROOTS));
            out.extend(
                c.agent_socket
                    .map(|p| (TUNNEL_GUARD, "agentSocket", p, &AGENT_ROOTS[..])),
            );
        }
        _ => {}
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod tests {
    use super::super::chain::{self, List};
    use super::*;
    use std::path::PathBuf;

    fn conf_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conf")
    }

    fn podgate_entries(list: &List) -> Vec<Json> {
        list.plugins()
            .iter()
            .filter(|p| chain::is_podgate(p))
            .cloned()
            .collect()
    }

    /// Every example conflist under conf/ is JSON, chainable, ends with
    /// podgate's entries, and those entries pass the plugins' own validation.
    #[test]
    fn example_conflists_are_valid() {
        let mut seen = 0;
        for entry in std::fs::read_dir(conf_dir()).expect("conf/ exists") {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if chain::kind_of(&name) != Some(chain::Kind::List) {
                continue;
            }
            let text = std::fs::read(&path).unwrap();
            let list = List::parse(&name, &text).unwrap_or_else(|e| panic!("{e}"));
            list.check_chainable(&name)
                .unwrap_or_else(|e| panic!("{e}"));
            let ours = podgate_entries(&list);
            assert!(!ours.is_empty(), "{name}: no podgate entry");
            assert!(
                list.merged(&ours).same(&list),
                "{name}: podgate entries must come last, after the primary's plugins"
            );
            validate_entries(&ours).unwrap_or_else(|e| panic!("{name}: {e}"));
            host_paths()
                .check(&ours)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            seen += 1;
        }
        assert!(seen >= 3, "expected the example conflists under conf/");
    }

    /// conf/plugins.json is valid and is what the operator's ConfigMap
    /// (podgate-config.yaml) holds.
    #[test]
    fn kubernetes_configmap_entries_are_valid() {
        let path = conf_dir().join("plugins.json");
        let text = std::fs::read(&path).expect("conf/plugins.json");
        let entries = chain::parse_entries(&text).unwrap();
        validate_entries(&entries).unwrap();
        let yaml =
            std::fs::read_to_string(conf_dir().join("kubernetes/podgate-config.yaml")).unwrap();
        // The ConfigMap embeds plugins.json verbatim (indented); compare as JSON.
        let start = yaml
            .find("plugins.json: |")
            .expect("ConfigMap key plugins.json");
        let body: String = yaml[start..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("    ") || l.is_empty())
            .map(|l| l.strip_prefix("    ").unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let embedded: serde_json::Value = serde_json::from_str(&body).unwrap();
        let file: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            embedded, file,
            "podgate-config.yaml's ConfigMap and plugins.json differ"
        );
    }

    /// Seed 000: cert-manager issues the IPsec certificates, so it must
    /// start before IPsec is in place; the shipped guard lets it.
    #[test]
    fn shipped_tunnel_guard_lets_the_certificate_issuer_start_before_ipsec() {
        let text = std::fs::read(conf_dir().join("plugins.json")).unwrap();
        let entries = chain::parse_entries(&text).unwrap();
        let guard = entries
            .iter()
            .map(|e| e.to_value().unwrap())
            .find(|v| v["type"] == TUNNEL_GUARD)
            .expect("a tunnel-guard entry");
        let cfg = GuardConfig::from_value(&guard).unwrap();
        assert!(cfg.excluded(Some("cert-manager")));
        assert!(!cfg.excluded(Some("vpn")));
    }

    fn host_paths() -> HostPaths {
        HostPaths {
            extra_roots: Vec::new(),
            installer_state: PathBuf::from(crate::DEFAULT_STATE_DIR),
        }
    }

    #[test]
    fn the_shipped_entries_name_host_paths_in_podgates_directories() {
        let text = std::fs::read(conf_dir().join("plugins.json")).unwrap();
        host_paths()
            .check(&chain::parse_entries(&text).unwrap())
            .unwrap();
        // The defaults too.
        let bare = br#"[{"type":"podgate-tunnel-guard"},{"type":"podgate-router"}]"#;
        host_paths()
            .check(&chain::parse_entries(bare).unwrap())
            .unwrap();
    }

    #[test]
    fn a_host_path_outside_podgates_directories_is_refused_naming_the_key() {
        for (entry, want) in [
            (
                r#"{"type":"podgate-router","stateDir":"/etc"}"#,
                "stateDir /etc is outside /var/lib/cni/podgate, /var/lib/podgate",
            ),
            (
                r#"{"type":"podgate-router","logFile":"/etc/cron.d/x"}"#,
                "logFile /etc/cron.d/x is outside /var/log/podgate",
            ),
            (
                r#"{"type":"podgate-router","logFile":"/var/log/podgate-x/r.log"}"#,
                "logFile /var/log/podgate-x/r.log is outside",
            ),
            (
                r#"{"type":"podgate-router","stateDir":"/var/lib/cni/podgate/../../../etc"}"#,
                "without \".\" or \"..\"",
            ),
            (
                r#"{"type":"podgate-router","eventFile":"/root/.bashrc"}"#,
                "eventFile /root/.bashrc is outside",
            ),
            (
                r#"{"type":"podgate-router","stateDir":"/var/lib/cni/podgate/installer/x"}"#,
                "inside the installer's state directory",
            ),
            (
                r#"{"type":"podgate-router","stateDir":"/var/lib/podgate/installer/x"}"#,
                "inside the installer's state directory /var/lib/podgate/installer",
            ),
            (
                r#"{"type":"podgate-tunnel-guard","logFile":"/etc/passwd"}"#,
                "logFile /etc/passwd is outside",
            ),
            (
                r#"{"type":"podgate-tunnel-guard","ovsdbSocket":"/run/containerd/containerd.sock"}"#,
                "ovsdbSocket /run/containerd/containerd.sock is outside /run/openvswitch",
            ),
            (
                r#"{"type":"podgate-tunnel-guard","protectionDir":"/run/containerd"}"#,
                "protectionDir /run/containerd is outside",
            ),
            (
                r#"{"type":"podgate-tunnel-guard","agentSocket":"/var/run/docker.sock"}"#,
                "agentSocket /var/run/docker.sock is outside",
            ),
        ] {
            let entries = chain::parse_entries(format!("[{entry}]").as_bytes()).unwrap();
            validate_entries(&entries).unwrap();
            let e = host_paths().check(&entries).unwrap_err().to_string();
            assert!(e.contains(want), "{entry}: {e}");
        }
        // --plugin-path-root adds a root for every key.
        let roots = HostPaths {
            extra_roots: vec![PathBuf::from("/tmp/node")],
            ..host_paths()
        };
        let entries = chain::parse_entries(
            br#"[{"type":"podgate-router","stateDir":"/tmp/node/state","logFile":"/tmp/node/r.log"}]"#,
        )
        .unwrap();
        roots.check(&entries).unwrap();
        assert!(host_paths().check(&entries).is_err());
    }

    #[test]
    fn a_misspelt_key_of_either_plugin_is_refused_naming_it() {
        for (entry, key) in [
            (
                r#"{"type":"podgate-tunnel-guard","requried":"always"}"#,
                "\"requried\"",
            ),
            (r#"{"type":"podgate-router","assgin":[]}"#, "\"assgin\""),
            (
                r#"{"type":"podgate-router","profiles":{"p":{"maskerade":[]}}}"#,
                "\"profiles.p.maskerade\"",
            ),
            (
                r#"{"type":"podgate-router","allow":{"pool":[]}}"#,
                "\"allow.pool\"",
            ),
            (
                r#"{"type":"podgate-router","profiles":{"p":{}},"assign":[{"profile":"p","namespce":"vpn"}]}"#,
                "\"assign[0].namespce\"",
            ),
            (
                r#"{"type":"podgate-router","profiles":{"p":{"masquerade":[{"source":"10.8.0.0/24","snat":1}]}}}"#,
                "\"profiles.p.masquerade[0].snat\"",
            ),
        ] {
            let entries = chain::parse_entries(format!("[{entry}]").as_bytes()).unwrap();
            let e = validate_entries(&entries).unwrap_err().to_string();
            assert!(e.contains(&format!("unknown key {key}")), "{entry}: {e}");
        }
    }

    #[test]
    fn bad_entries_are_refused() {
        let bad = chain::parse_entries(
            br#"[{"type":"podgate-router","assign":[{"profile":"missing"}]}]"#,
        )
        .unwrap();
        assert!(validate_entries(&bad).is_err());
        let bad =
            chain::parse_entries(br#"[{"type":"podgate-tunnel-guard","timeoutMs":0}]"#).unwrap();
        assert!(validate_entries(&bad).is_err());
        let unknown = chain::parse_entries(br#"[{"type":"podgate-nope"}]"#).unwrap();
        assert!(matches!(
            validate_entries(&unknown),
            Err(Error::EntryUnknownType { .. })
        ));
        let ok =
            chain::parse_entries(br#"[{"type":"podgate-tunnel-guard"},{"type":"podgate-router"}]"#)
                .unwrap();
        validate_entries(&ok).unwrap();
    }
}
