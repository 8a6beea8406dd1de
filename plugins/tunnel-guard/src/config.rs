//! The plugin's configuration (its entry in the conflist), with defaults.

use crate::time::{human, parse_duration};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_AGENT_SOCKET: &str = "/run/kube-ovn-ipsec/status.sock";
pub const DEFAULT_TUNNEL_PORTS: [u16; 2] = [6081, 4789];
pub const DEFAULT_TIMEOUT_MS: u64 = 500;
pub const DEFAULT_MIN_CERT_VALIDITY: Duration = Duration::from_secs(600);
/// Upper bound on `timeoutMs`: a CNI ADD must not sit on the gate for long.
pub const MAX_TIMEOUT_MS: u64 = 30_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    /// The kernel's address family number (AF_INET / AF_INET6).
    pub fn af(self) -> u16 {
        match self {
            Family::Ipv4 => libc_af::INET,
            Family::Ipv6 => libc_af::INET6,
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

mod libc_af {
    pub const INET: u16 = 2;
    pub const INET6: u16 = 10;
}

/// When IPsec protection is required at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Required {
    /// Required when the agent socket exists (IPsec enabled on this node).
    #[default]
    Auto,
    /// Required; a missing agent is "not ready".
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
///  "agentSocket": "/run/kube-ovn-ipsec/status.sock",
///  "ovsdbSocket": "/var/run/openvswitch/db.sock",
///  "guardMark": "0xb9807", "tunnelPorts": [6081, 4789], "families": ["ipv4"],
///  "required": "auto", "mode": "enforce", "minCertValidity": "10m",
///  "timeoutMs": 500, "reportStatus": false, "logFile": "/var/log/podgate-tunnel-guard.log"}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardConfig {
    /// The IPsec agent's status socket (HTTP/1.1: /readyz, /status).
    #[serde(default = "default_agent_socket")]
    pub agent_socket: PathBuf,
    /// OVSDB socket: the chassis (system-id) cross-check and the protection mark.
    #[serde(default)]
    pub ovsdb_socket: Option<PathBuf>,
    /// Protection mark (number, or decimal / `0x` string); overrides OVSDB's
    /// `external_ids:ovn-ipsec-protection-mark`.
    #[serde(default, deserialize_with = "de_mark")]
    pub guard_mark: Option<u32>,
    /// UDP destination ports of the tunnels (Geneve, VXLAN) a bypass would expose.
    #[serde(default = "default_ports")]
    pub tunnel_ports: Vec<u16>,
    /// Families whose guard must be installed (`ipv4`, `ipv6`).
    #[serde(default = "default_families")]
    pub families: Vec<Family>,
    #[serde(default)]
    pub required: Required,
    #[serde(default)]
    pub mode: Mode,
    /// The certificate must stay valid at least this long (`10m`, `1h30m`, `0`).
    #[serde(
        default = "default_min_validity",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    pub min_cert_validity: Duration,
    /// Total time budget of one evaluation, all I/O included (1..=30000).
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
    /// Whether STATUS fails (code 50) when not ready. Off by default: a failing
    /// STATUS marks the whole node NotReady in containerd >= 2.0.
    #[serde(default)]
    pub report_status: bool,
    /// JSON-lines log; without it only warnings and errors go to stderr.
    #[serde(default)]
    pub log_file: Option<PathBuf>,
    /// `logLevel`, `logMaxBytes`, `eventFile`.
    #[serde(flatten)]
    pub telemetry: podgate_cni::log::Telemetry,
}

fn default_agent_socket() -> PathBuf {
    PathBuf::from(DEFAULT_AGENT_SOCKET)
}
fn default_ports() -> Vec<u16> {
    DEFAULT_TUNNEL_PORTS.to_vec()
}
fn default_families() -> Vec<Family> {
    vec![Family::Ipv4]
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
            agent_socket: default_agent_socket(),
            ovsdb_socket: None,
            guard_mark: None,
            tunnel_ports: default_ports(),
            families: default_families(),
            required: Required::default(),
            mode: Mode::default(),
            min_cert_validity: default_min_validity(),
            timeout_ms: default_timeout(),
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
    /// Read the plugin's fields from its conflist entry (unknown keys, such as
    /// `cniVersion` or `prevResult`, are ignored) and validate them.
    pub fn from_value(v: &Value) -> Result<GuardConfig, ConfigError> {
        let cfg = GuardConfig::deserialize(v)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if self.tunnel_ports.is_empty() || self.tunnel_ports.contains(&0) {
            return bad("tunnelPorts must list at least one port, none of them 0");
        }
        if self.families.is_empty() {
            return bad("families must list ipv4 and/or ipv6");
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(ConfigError::Invalid(format!(
                "timeoutMs must be within 1..={MAX_TIMEOUT_MS}"
            )));
        }
        if self.agent_socket.as_os_str().is_empty() {
            return bad("agentSocket must not be empty");
        }
        Ok(())
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Families in configuration order, without repeats.
    pub fn families(&self) -> Vec<Family> {
        let mut out: Vec<Family> = Vec::new();
        for f in &self.families {
            if !out.contains(f) {
                out.push(*f);
            }
        }
        out
    }
}

/// A protection mark as OVSDB or a config spells it: decimal or `0x` hex.
pub fn parse_mark(s: &str) -> Option<u32> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn de_mark<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    use serde::de::Error;
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| D::Error::custom("guardMark must fit in 32 bits")),
        Some(Value::String(s)) => parse_mark(&s).map(Some).ok_or_else(|| {
            D::Error::custom(format!("guardMark {s:?} is not a decimal or 0x number"))
        }),
        Some(_) => Err(D::Error::custom("guardMark must be a number or string")),
    }
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

    #[test]
    fn defaults() {
        let c = GuardConfig::from_value(
            &json!({"cniVersion":"1.0.0","name":"n","type":"podgate-tunnel-guard"}),
        )
        .unwrap();
        assert_eq!(c, GuardConfig::default());
        assert_eq!(c.tunnel_ports, vec![6081, 4789]);
        assert_eq!(c.families, vec![Family::Ipv4]);
        assert_eq!(c.timeout(), Duration::from_millis(500));
        assert_eq!(c.min_cert_validity, Duration::from_secs(600));
    }

    #[test]
    fn full_config() {
        let c = GuardConfig::from_value(&json!({
            "agentSocket": "/tmp/a.sock", "ovsdbSocket": "/tmp/db.sock", "guardMark": "0xb9807",
            "tunnelPorts": [6081], "families": ["ipv4", "ipv6", "ipv4"], "required": "always",
            "mode": "audit", "minCertValidity": "1h", "timeoutMs": 200, "reportStatus": true,
            "logFile": "/tmp/g.log"
        }))
        .unwrap();
        assert_eq!(c.guard_mark, Some(759_815));
        assert_eq!(c.families(), vec![Family::Ipv4, Family::Ipv6]);
        assert_eq!((c.required, c.mode), (Required::Always, Mode::Audit));
        assert_eq!(c.min_cert_validity, Duration::from_secs(3600));
        assert!(c.report_status);
        let num = GuardConfig::from_value(&json!({"guardMark": 759815})).unwrap();
        assert_eq!(num.guard_mark, Some(759_815));
    }

    #[test]
    fn invalid_configs() {
        for bad in [
            json!({"guardMark": "nope"}),
            json!({"guardMark": 4294967296u64}),
            json!({"tunnelPorts": []}),
            json!({"tunnelPorts": [70000]}),
            json!({"families": ["ipx"]}),
            json!({"families": []}),
            json!({"required": "sometimes"}),
            json!({"mode": "warn"}),
            json!({"minCertValidity": "10 minutes"}),
            json!({"timeoutMs": 0}),
            json!({"timeoutMs": 600000}),
            json!({"agentSocket": ""}),
        ] {
            assert!(GuardConfig::from_value(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn marks() {
        assert_eq!(parse_mark("759815"), Some(759_815));
        assert_eq!(parse_mark(" 0xB9807 "), Some(759_815));
        assert_eq!(parse_mark("-1"), None);
        assert_eq!(parse_mark("0x"), None);
        assert_eq!(parse_mark(""), None);
    }
}
