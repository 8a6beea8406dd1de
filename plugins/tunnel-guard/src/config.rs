//! The plugin's configuration (its entry in the conflist), with defaults.
//!
//! Paths and the `required` signals follow Kube-OVN's `kube-ovn-ipsec`
//! (`cmd/ipsec/main.go`: `--protection-dir=/run/kube-ovn-ipsec-protection`,
//! `--ovs-socket=/run/openvswitch/db.sock`; `pkg/ipsec/preparation.go`:
//! `protectionRequired`). What the agent fixes (both guard families, the
//! Geneve/VXLAN ports, the mark from OVSDB) is not configurable here: the
//! agent refuses anything else, so a knob could only make the gate weaker.

use crate::time::{human, parse_duration};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_PROTECTION_DIR: &str = "/run/kube-ovn-ipsec-protection";
pub const DEFAULT_OVSDB_SOCKET: &str = "/run/openvswitch/db.sock";
/// The agent's `/startup` handler may take up to 2 s (`protection_endpoint.go`:
/// `context.WithTimeout(..., 2*time.Second)`); the budget covers it plus OVSDB.
pub const DEFAULT_TIMEOUT_MS: u64 = 3000;
pub const DEFAULT_MIN_CERT_VALIDITY: Duration = Duration::from_secs(600);
/// Upper bound on `timeoutMs`: a CNI ADD must not sit on the gate for long.
pub const MAX_TIMEOUT_MS: u64 = 30_000;
/// Keys of earlier versions that the agent now fixes; rejected, not ignored,
/// so an operator learns that the setting no longer does anything.
const REMOVED_KEYS: [(&str, &str); 3] = [
    (
        "guardMark",
        "the mark is the agent's lease in OVSDB external_ids:ovn-ipsec-protection-mark",
    ),
    (
        "tunnelPorts",
        "the agent supports only Geneve 6081 and VXLAN 4789 and refuses custom ports",
    ),
    (
        "families",
        "the agent always installs the IPv4 and the IPv6 guard; both are checked",
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    /// Both families, in the agent's order (`protectionReservation.Indexes`).
    pub const BOTH: [Family; 2] = [Family::Ipv4, Family::Ipv6];

    /// The kernel's address family number (AF_INET / AF_INET6).
    pub fn af(self) -> u16 {
        match self {
            Family::Ipv4 => 2,
            Family::Ipv6 => 10,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        })
    }
}

/// When IPsec protection is required at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Required {
    /// Required iff a durable or live signal exists: the `required` file, any
    /// of the four OVSDB lease keys, or `protection.sock`.
    #[default]
    Auto,
    /// Always required: no signal at all is "not ready".
    Always,
    /// Never required: the gate always opens, nothing is contacted.
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Not ready fails the ADD with code 11.
    #[default]
    Enforce,
    /// Not ready is logged; the pod goes through.
    Audit,
}

/// The plugin's entry in the conflist (camelCase keys; all optional):
///
/// ```json
/// {"type": "podgate-tunnel-guard",
///  "protectionDir": "/run/kube-ovn-ipsec-protection",
///  "ovsdbSocket": "/run/openvswitch/db.sock",
///  "required": "auto", "mode": "enforce", "excludeNamespaces": ["cert-manager"],
///  "timeoutMs": 3000, "agentSocket": null, "minCertValidity": "10m",
///  "reportStatus": false, "logFile": "/var/log/podgate/tunnel-guard.log"}
/// ```
///
/// Read only through [`GuardConfig::from_value`] or its `Deserialize`, which
/// refuses every key the guard does not read
/// ([`podgate_cni::config::deserialize_known`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardConfig {
    /// The agent's public protection endpoint directory (`protection.sock`,
    /// `required`).
    pub protection_dir: PathBuf,
    /// OVSDB: the `Open_vSwitch` `_uuid`, the lease keys and the tunnel interfaces.
    pub ovsdb_socket: PathBuf,
    pub required: Required,
    pub mode: Mode,
    /// Pods in these namespaces pass while the node is not ready (with a
    /// logged note): bootstrap components such as the certificate issuer.
    pub exclude_namespaces: Vec<String>,
    /// Total time budget of one evaluation, all I/O included (1..=30000).
    pub timeout_ms: u64,
    /// The agent's private status socket (`--runtime-dir`/status.sock), only
    /// where an operator made it reachable: extra diagnostics (phase, expiry,
    /// identity), never the presence signal and never a pass.
    pub agent_socket: Option<PathBuf>,
    /// With `agentSocket`: warn when the certificate expires sooner than this.
    #[serde(serialize_with = "ser_duration")]
    pub min_cert_validity: Duration,
    /// Whether STATUS fails (code 50) when not ready. Off by default: a failing
    /// STATUS marks the whole node NotReady in containerd >= 2.0.
    pub report_status: bool,
    /// JSON-lines log; without it only warnings and errors go to stderr.
    pub log_file: Option<PathBuf>,
    /// `logLevel`, `logMaxBytes`, `eventFile`.
    #[serde(flatten)]
    pub telemetry: podgate_cni::log::Telemetry,
}

/// [`GuardConfig`] as the conflist spells it: the telemetry keys are fields
/// of their own, not a `#[serde(flatten)]` [`Telemetry`], so that a key the
/// guard does not read is seen and refused (serde hands the keys a
/// flattened struct does not take to no one).
///
/// [`Telemetry`]: podgate_cni::log::Telemetry
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default = "default_protection_dir")]
    protection_dir: PathBuf,
    #[serde(default = "default_ovsdb_socket")]
    ovsdb_socket: PathBuf,
    #[serde(default)]
    required: Required,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    exclude_namespaces: Vec<String>,
    #[serde(default = "default_timeout")]
    timeout_ms: u64,
    #[serde(default)]
    agent_socket: Option<PathBuf>,
    #[serde(default = "default_min_validity", deserialize_with = "de_duration")]
    min_cert_validity: Duration,
    #[serde(default)]
    report_status: bool,
    #[serde(default)]
    log_file: Option<PathBuf>,
    #[serde(default)]
    log_level: podgate_cni::log::Level,
    #[serde(
        default = "podgate_cni::log::default_max_bytes",
        deserialize_with = "podgate_cni::log::de_max_bytes"
    )]
    log_max_bytes: u64,
    #[serde(default)]
    event_file: Option<PathBuf>,
}

impl<'de> Deserialize<'de> for GuardConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w: Wire = podgate_cni::config::deserialize_known(d)?;
        Ok(GuardConfig {
            protection_dir: w.protection_dir,
            ovsdb_socket: w.ovsdb_socket,
            required: w.required,
            mode: w.mode,
            exclude_namespaces: w.exclude_namespaces,
            timeout_ms: w.timeout_ms,
            agent_socket: w.agent_socket,
            min_cert_validity: w.min_cert_validity,
            report_status: w.report_status,
            log_file: w.log_file,
            telemetry: podgate_cni::log::Telemetry {
                log_level: w.log_level,
                log_max_bytes: w.log_max_bytes,
                event_file: w.event_file,
            },
        })
    }
}

fn default_protection_dir() -> PathBuf {
    PathBuf::from(DEFAULT_PROTECTION_DIR)
}
fn default_ovsdb_socket() -> PathBuf {
    PathBuf::from(DEFAULT_OVSDB_SOCKET)
}
fn default_min_validity() -> Duration {
    DEFAULT_MIN_CERT_VALIDITY
}
fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_MS
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            protection_dir: default_protection_dir(),
            ovsdb_socket: default_ovsdb_socket(),
            required: Required::default(),
            mode: Mode::default(),
            exclude_namespaces: Vec::new(),
            timeout_ms: default_timeout(),
            agent_socket: None,
            min_cert_validity: default_min_validity(),
            report_status: false,
            log_file: None,
            telemetry: podgate_cni::log::Telemetry::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("podgate-tunnel-guard config: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("podgate-tunnel-guard config: {0}")]
    Invalid(String),
}

impl GuardConfig {
    /// Read the plugin's fields from its conflist entry (the keys the spec
    /// and the runtime add, such as `cniVersion` or `prevResult`, are not the
    /// guard's and pass; removed ones are refused with the reason, any other
    /// unknown key by name) and validate them.
    pub fn from_value(v: &Value) -> Result<GuardConfig, ConfigError> {
        for (key, why) in REMOVED_KEYS {
            if v.get(key).is_some() {
                return Err(ConfigError::Invalid(format!(
                    "{key} is no longer supported: {why}"
                )));
            }
        }
        let cfg = GuardConfig::deserialize(v)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(ConfigError::Invalid(format!(
                "timeoutMs must be within 1..={MAX_TIMEOUT_MS}"
            )));
        }
        if !self.protection_dir.is_absolute() {
            return bad("protectionDir must be an absolute path");
        }
        if !self.ovsdb_socket.is_absolute() {
            return bad("ovsdbSocket must be an absolute path");
        }
        if self.agent_socket.as_ref().is_some_and(|p| !p.is_absolute()) {
            return bad("agentSocket must be an absolute path");
        }
        if self.exclude_namespaces.iter().any(|n| n.trim().is_empty()) {
            return bad("excludeNamespaces must not contain an empty name");
        }
        Ok(())
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub fn protection_socket(&self) -> PathBuf {
        self.protection_dir.join(crate::protection::SOCKET)
    }

    pub fn required_file(&self) -> PathBuf {
        self.protection_dir.join(crate::protection::REQUIRED_FILE)
    }

    /// Whether pods of `namespace` pass while the node is not ready.
    pub fn excluded(&self, namespace: Option<&str>) -> bool {
        namespace.is_some_and(|ns| self.exclude_namespaces.iter().any(|e| e == ns))
    }

    /// Whether this entry refuses a pod while protection is not in place:
    /// `mode: enforce` and `required` not `never` (audit mode, or never
    /// required, lets every pod through unchecked).
    pub fn enforces(&self) -> bool {
        self.mode == Mode::Enforce && self.required != Required::Never
    }
}

/// A number as OVSDB spells the agent's lease values: decimal (`strconv.FormatUint`).
pub fn parse_mark(s: &str) -> Option<u32> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    use serde::de::Error;
    let s = String::deserialize(d)?;
    parse_duration(&s).ok_or_else(|| {
        D::Error::custom(format!(
            "minCertValidity {s:?} is not a duration like \"10m\""
        ))
    })
}

fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&human(*d))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bare() -> GuardConfig {
        GuardConfig::from_value(
            &json!({"cniVersion":"1.0.0","name":"n","type":"podgate-tunnel-guard"}),
        )
        .unwrap()
    }

    #[test]
    fn a_config_without_guard_keys_is_the_default_config() {
        assert_eq!(bare(), GuardConfig::default());
    }

    #[test]
    fn by_default_the_guard_reads_kube_ovns_paths_within_three_seconds() {
        let c = bare();
        assert_eq!(
            c.protection_socket(),
            PathBuf::from("/run/kube-ovn-ipsec-protection/protection.sock")
        );
        assert_eq!(
            c.required_file(),
            PathBuf::from("/run/kube-ovn-ipsec-protection/required")
        );
        assert_eq!(c.ovsdb_socket, PathBuf::from("/run/openvswitch/db.sock"));
        assert_eq!(c.timeout(), Duration::from_millis(3000));
    }

    #[test]
    fn by_default_no_agent_socket_is_asked_and_no_namespace_is_excluded() {
        let c = bare();
        assert_eq!(c.agent_socket, None);
        assert!(c.exclude_namespaces.is_empty());
    }

    #[test]
    fn every_guard_key_is_read_from_the_conflist_entry() {
        let c = GuardConfig::from_value(&json!({
            "protectionDir": "/tmp/p", "ovsdbSocket": "/tmp/db.sock", "required": "always",
            "mode": "audit", "excludeNamespaces": ["cert-manager"], "timeoutMs": 200,
            "agentSocket": "/tmp/a.sock", "minCertValidity": "1h", "reportStatus": true,
            "logFile": "/tmp/g.log"
        }))
        .unwrap();
        assert_eq!((c.required, c.mode), (Required::Always, Mode::Audit));
        assert_eq!(c.min_cert_validity, Duration::from_secs(3600));
        assert!(c.excluded(Some("cert-manager")));
        assert!(!c.excluded(Some("default")));
        assert!(!c.excluded(None));
        assert!(c.report_status);
    }

    #[test]
    fn a_guard_key_of_the_wrong_kind_or_out_of_range_is_refused() {
        for bad in [
            json!({"guardMark": "0x10"}),
            json!({"tunnelPorts": [6081]}),
            json!({"families": ["ipv4"]}),
            json!({"required": "sometimes"}),
            json!({"mode": "warn"}),
            json!({"minCertValidity": "10 minutes"}),
            json!({"timeoutMs": 0}),
            json!({"timeoutMs": 600000}),
            json!({"protectionDir": "relative"}),
            json!({"ovsdbSocket": ""}),
            json!({"agentSocket": "x.sock"}),
            json!({"excludeNamespaces": [""]}),
        ] {
            assert!(GuardConfig::from_value(&bad).is_err(), "{bad}");
        }
        let e = GuardConfig::from_value(&json!({"tunnelPorts": [1]})).unwrap_err();
        assert!(e.to_string().contains("refuses custom ports"), "{e}");
    }

    #[test]
    fn a_misspelt_key_is_refused_by_name_not_left_at_its_default() {
        for (entry, key) in [
            (json!({"requried": "always"}), "\"requried\""),
            (
                json!({"mode": "enforce", "excludeNamespace": ["x"]}),
                "\"excludeNamespace\"",
            ),
            (json!({"loglevel": "debug"}), "\"loglevel\""),
            (json!({"ipMasq": true}), "\"ipMasq\""),
        ] {
            let e = GuardConfig::from_value(&entry).unwrap_err().to_string();
            assert!(
                e.contains(&format!("unknown key {key}"))
                    && e.starts_with("podgate-tunnel-guard config:"),
                "{entry}: {e}"
            );
        }
        // What the spec and the runtimes add is not a typo.
        GuardConfig::from_value(&json!({
            "cniVersion": "1.1.0", "name": "n", "type": "podgate-tunnel-guard",
            "capabilities": {"io.kubernetes.cri.pod-annotations": true},
            "runtimeConfig": {}, "args": {"cni": {}}, "prevResult": {},
            "cni.dev/valid-attachments": [], "logLevel": "debug", "eventFile": "/e"
        }))
        .unwrap();
    }

    #[test]
    fn a_mark_is_a_decimal_u32_as_ovsdb_stores_it() {
        assert_eq!(parse_mark("759815"), Some(759_815));
        assert_eq!(parse_mark("0xB9807"), None);
        assert_eq!(parse_mark("-1"), None);
        assert_eq!(parse_mark("4294967296"), None);
        assert_eq!(parse_mark(""), None);
    }
}
