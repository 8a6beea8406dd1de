//! Operator configuration from the conflist: the trust anchor. Pods only pick
//! from what is written here.

use ipnet::IpNet;
use podgate_kit::sysctl;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni/podgate";
pub const ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";

/// Read only through its `Deserialize`, which refuses every key the router
/// does not read, at any depth ([`podgate_cni::config::deserialize_known`]):
/// the nested types below are never deserialized on their own.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub state_dir: PathBuf,
    pub log_file: Option<PathBuf>,
    /// `logLevel`, `logMaxBytes`, `eventFile`.
    pub telemetry: podgate_cni::log::Telemetry,
    pub profiles: BTreeMap<String, Profile>,
    pub assign: Vec<AssignRule>,
    pub allow: Allow,
    /// Prefix of the nf_tables table podgate owns in each pod netns
    /// (`inet <prefix>-<ifname>`).
    pub nft_table: String,
    /// Per-node limit on strict-mode pods (the seed's trunk quota).
    pub max_strict_pods: usize,
}

/// [`RouterConfig`] as the conflist spells it. The telemetry keys are
/// fields of their own rather than a `#[serde(flatten)]` [`Telemetry`]:
/// flatten makes serde buffer every key it does not know (`prevResult`,
/// `capabilities`, the runtime's additions) into a tree of its own before
/// looking at them; without it they are skipped in place (and a key that
/// is not the router's, nor one the spec or the runtime adds, is seen and
/// refused).
///
/// [`Telemetry`]: podgate_cni::log::Telemetry
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default = "default_state_dir")]
    state_dir: PathBuf,
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
    #[serde(default)]
    profiles: BTreeMap<String, Profile>,
    #[serde(default)]
    assign: Vec<AssignRule>,
    #[serde(default)]
    allow: Allow,
    #[serde(default = "default_nft_table")]
    nft_table: String,
    #[serde(default = "default_max_strict")]
    max_strict_pods: usize,
}

impl<'de> Deserialize<'de> for RouterConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        podgate_cni::config::deserialize_known::<Wire, D>(d).map(RouterConfig::from)
    }
}

impl From<Wire> for RouterConfig {
    fn from(w: Wire) -> RouterConfig {
        RouterConfig {
            state_dir: w.state_dir,
            log_file: w.log_file,
            telemetry: podgate_cni::log::Telemetry {
                log_level: w.log_level,
                log_max_bytes: w.log_max_bytes,
                event_file: w.event_file,
            },
            profiles: w.profiles,
            assign: w.assign,
            allow: w.allow,
            nft_table: w.nft_table,
            max_strict_pods: w.max_strict_pods,
        }
    }
}

fn default_max_strict() -> usize {
    100
}

fn default_state_dir() -> PathBuf {
    PathBuf::from(DEFAULT_STATE_DIR)
}

fn default_nft_table() -> String {
    "podgate".into()
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// Namespaced sysctls to set inside the pod netns (`IFNAME` = CNI_IFNAME).
    #[serde(default)]
    pub sysctls: BTreeMap<String, String>,
    #[serde(default)]
    pub masquerade: Vec<Pool>,
    #[serde(default)]
    pub return_routes: Vec<ReturnRoute>,
    #[serde(default)]
    pub pod_routes: Vec<PodRoute>,
    /// Give the pod a routing boundary through the node's uplink.
    #[serde(default)]
    pub routing: Option<Routing>,
    /// Clamp the MSS of TCP SYNs forwarded between the client pools and the
    /// pod interface: `"pmtu"` or a fixed MSS.
    #[serde(default)]
    pub mss_clamp: Option<MssClamp>,
}

/// `mssClamp`: the forward-hook chain in the pod's podgate table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum MssClamp {
    /// The MTU of the route the SYN leaves by and of the route back to its
    /// sender, whichever is smaller, minus the IP and TCP headers.
    Pmtu,
    /// A fixed MSS (never raises a smaller one).
    Fixed(u16),
}

/// Smallest MSS an IPv4 host must accept (RFC 1122); anything lower is a typo.
pub const MSS_MIN: u16 = 536;
/// 65535 minus the IPv4 and TCP headers.
pub const MSS_MAX: u16 = 65495;

impl<'de> Deserialize<'de> for MssClamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => u16::try_from(n)
                .ok()
                .filter(|n| (MSS_MIN..=MSS_MAX).contains(n))
                .map(MssClamp::Fixed)
                .ok_or_else(|| {
                    serde::de::Error::custom(format!("mssClamp {n} is outside {MSS_MIN}-{MSS_MAX}"))
                }),
            Raw::S(s) if s == "pmtu" => Ok(MssClamp::Pmtu),
            Raw::S(s) => Err(serde::de::Error::custom(format!(
                "mssClamp must be \"pmtu\" or a number, not {s:?}"
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RoutingMode {
    /// All of the pod's traffic, same-node and node-to-pod included, leaves
    /// through the uplink and comes back (passes the outside boundary).
    Strict,
    /// Off-node traffic uses the pod's table; same-node traffic stays local.
    Standard,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum TableChoice {
    Auto,
    Id(u32),
}

impl<'de> Deserialize<'de> for TableChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u32),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(TableChoice::Id(n)),
            Raw::S(s) if s == "auto" => Ok(TableChoice::Auto),
            Raw::S(s) => Err(serde::de::Error::custom(format!(
                "table must be a number or \"auto\", not {s:?}"
            ))),
        }
    }
}

fn table_auto() -> TableChoice {
    TableChoice::Auto
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Routing {
    pub mode: RoutingMode,
    /// Node interface towards the security boundary.
    pub uplink: String,
    /// Next hop on the uplink (strict: the IPv4 one).
    pub gateway: IpAddr,
    /// strict: the IPv6 next hop on the uplink, for pods with IPv6
    /// addresses (a strict pod's every address crosses the boundary).
    #[serde(default)]
    pub gateway6: Option<IpAddr>,
    #[serde(default = "table_auto")]
    pub table: TableChoice,
    /// strict: destinations on the node itself (NodeLocal DNSCache, link-local
    /// node agents) that the pod reaches without crossing the boundary.
    #[serde(default)]
    pub exempt: Vec<IpNet>,
}

impl Routing {
    /// The next hop on the uplink for traffic of `addr`'s family, if the
    /// profile names one.
    pub fn gateway_for(&self, addr: IpAddr) -> Option<IpAddr> {
        [Some(self.gateway), self.gateway6]
            .into_iter()
            .flatten()
            .find(|g| g.is_ipv4() == addr.is_ipv4())
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Pool {
    pub source: IpNet,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ReturnRoute {
    pub dst: IpNet,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct PodRoute {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AssignRule {
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub pod_name_prefix: Option<String>,
    #[serde(default)]
    pub pod_name: Option<String>,
    pub profile: String,
}

impl AssignRule {
    pub fn matches(&self, namespace: Option<&str>, pod: Option<&str>) -> bool {
        let ns_ok = self
            .namespace
            .as_deref()
            .is_none_or(|n| namespace == Some(n));
        let prefix_ok = self
            .pod_name_prefix
            .as_deref()
            .is_none_or(|p| pod.is_some_and(|name| name.starts_with(p)));
        let name_ok = self.pod_name.as_deref().is_none_or(|n| pod == Some(n));
        ns_ok && prefix_ok && name_ok
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Allow {
    /// Namespaces whose pods may choose a profile or pools by annotation or args.
    #[serde(default)]
    pub annotation_namespaces: Vec<String>,
    /// Pools a pod may name in annotations (each must lie inside one of these).
    #[serde(default)]
    pub pools: Vec<IpNet>,
}

/// An operator's mistake in the conflist, or a request it cannot serve.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl From<&str> for ConfigError {
    fn from(s: &str) -> ConfigError {
        ConfigError(s.to_string())
    }
}

impl RouterConfig {
    /// Operator mistakes are config errors (code 7), found before touching anything.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (i, a) in self.assign.iter().enumerate() {
            if !self.profiles.contains_key(&a.profile) {
                return Err(ConfigError(format!(
                    "assign[{i}] names profile {:?}, which is not in profiles",
                    a.profile
                )));
            }
        }
        for (name, p) in &self.profiles {
            for key in p.sysctls.keys() {
                sysctl::path_of(&sysctl::expand_ifname(key, "eth0"))
                    .map_err(|e| ConfigError(format!("profiles.{name}.sysctls: {e}")))?;
            }
            if let Some(r) = &p.routing {
                // strict + masquerade is refused per pod at plan time (code 100),
                // so one bad profile does not stop every pod on the node.
                if let TableChoice::Id(t) = r.table {
                    if t == 0 || (253..=255).contains(&t) {
                        return Err(ConfigError(format!(
                            "profiles.{name}.routing.table {t} is reserved (unspec/default/main/local)"
                        )));
                    }
                }
                if r.mode == RoutingMode::Strict && !r.gateway.is_ipv4() {
                    return Err(ConfigError(format!(
                        "profiles.{name}.routing: a strict profile's gateway is its IPv4 next hop; {} is IPv6 (name the IPv6 next hop in gateway6)",
                        r.gateway
                    )));
                }
                if let Some(g6) = r.gateway6 {
                    if r.mode != RoutingMode::Strict || !g6.is_ipv6() {
                        return Err(ConfigError(format!(
                            "profiles.{name}.routing.gateway6 {g6}: the IPv6 next hop of a strict profile (an IPv6 address, strict mode only)"
                        )));
                    }
                }
                if !r.exempt.is_empty() && r.mode != RoutingMode::Strict {
                    return Err(ConfigError(format!(
                        "profiles.{name}.routing.exempt applies to strict mode only (standard pods reach the node's own addresses directly)"
                    )));
                }
                for e in &r.exempt {
                    let why = if !e.addr().is_ipv4() {
                        Some("is IPv6 (exempt ranges are IPv4 only)".to_string())
                    } else if e.prefix_len() == 0 {
                        Some("is a default route".to_string())
                    } else if e.contains(&r.gateway) {
                        Some(format!("covers the uplink gateway {}", r.gateway))
                    } else {
                        None
                    };
                    if let Some(why) = why {
                        return Err(ConfigError(format!(
                            "profiles.{name}.routing.exempt {e} {why}"
                        )));
                    }
                }
                podgate_cni::env::validate_ifname(&r.uplink).map_err(|_| {
                    ConfigError(format!(
                        "profiles.{name}.routing.uplink {:?} is not an interface name",
                        r.uplink
                    ))
                })?;
            }
            for pool in p
                .masquerade
                .iter()
                .map(|m| m.source)
                .chain(p.return_routes.iter().map(|r| r.dst))
            {
                if pool.prefix_len() == 0 {
                    return Err(ConfigError(format!(
                        "profiles.{name}: pool {pool} is a default route; name the client pool"
                    )));
                }
            }
        }
        if self.nft_table.is_empty()
            || self.nft_table.len() > 32
            || !self
                .nft_table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::from(
                "nftTable must be 1-32 characters of [A-Za-z0-9_-]",
            ));
        }
        Ok(())
    }

    pub fn table_for(&self, ifname: &str) -> String {
        format!("{}-{ifname}", self.nft_table)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn cfg(profile: serde_json::Value) -> Result<RouterConfig, String> {
        let c: RouterConfig =
            serde_json::from_value(serde_json::json!({"profiles": {"p": profile}}))
                .map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.0)?;
        Ok(c)
    }

    fn strict(extra: serde_json::Value) -> serde_json::Value {
        let mut r =
            serde_json::json!({"mode": "strict", "uplink": "eth1", "gateway": "192.0.2.254"});
        if let (Some(o), Some(e)) = (r.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        serde_json::json!({"routing": r})
    }

    #[test]
    fn mss_clamp_values() {
        let p = |v| cfg(serde_json::json!({"mssClamp": v}));
        assert_eq!(
            p(serde_json::json!("pmtu")).unwrap().profiles["p"].mss_clamp,
            Some(MssClamp::Pmtu)
        );
        assert_eq!(
            p(serde_json::json!(1360)).unwrap().profiles["p"].mss_clamp,
            Some(MssClamp::Fixed(1360))
        );
        for bad in [
            serde_json::json!(0),
            serde_json::json!(535),
            serde_json::json!(65496),
            serde_json::json!(-1),
            serde_json::json!("auto"),
            serde_json::json!(1360.5),
        ] {
            assert!(p(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn strict_exempt_and_family_checks() {
        assert!(cfg(strict(serde_json::json!({"exempt": ["169.254.20.10/32"]}))).is_ok());
        for (exempt, want) in [
            ("0.0.0.0/0", "default route"),
            ("192.0.2.0/24", "uplink gateway"),
            ("fd00::/64", "IPv6"),
        ] {
            let e = cfg(strict(serde_json::json!({"exempt": [exempt]}))).unwrap_err();
            assert!(
                e.contains(want) && e.contains("routing.exempt"),
                "{exempt}: {e}"
            );
        }
        let e = cfg(strict(serde_json::json!({"gateway": "2001:db8::1"}))).unwrap_err();
        assert!(e.contains("gateway6"), "{e}");
        assert!(cfg(strict(serde_json::json!({"gateway6": "2001:db8::fe"}))).is_ok());
        for bad in [
            serde_json::json!({"gateway6": "192.0.2.253"}),
            serde_json::json!({"mode": "standard", "gateway6": "2001:db8::fe"}),
        ] {
            let e = cfg(strict(bad.clone())).unwrap_err();
            assert!(e.contains("routing.gateway6"), "{bad}: {e}");
        }
        let e = cfg(strict(
            serde_json::json!({"mode": "standard", "exempt": ["169.254.20.10/32"]}),
        ))
        .unwrap_err();
        assert!(e.contains("strict mode only"), "{e}");
    }

    /// Strict routing's keys are the router's own under its refusal of
    /// unknown keys; a misspelt one inside `routing` is refused by its path.
    #[test]
    fn strict_routing_keys_are_read_and_a_misspelt_one_is_named() {
        let c = cfg(strict(serde_json::json!({
            "gateway6": "2001:db8::fe",
            "exempt": ["169.254.20.10/32"],
            "table": 100
        })))
        .unwrap();
        let r = c.profiles["p"].routing.clone().unwrap();
        assert_eq!(
            (r.gateway6, r.exempt.len(), r.table),
            (
                Some("2001:db8::fe".parse().unwrap()),
                1,
                TableChoice::Id(100)
            )
        );
        for key in ["gatway6", "exmept"] {
            let e = cfg(strict(serde_json::json!({ key: "2001:db8::fe" }))).unwrap_err();
            assert!(
                e.contains(&format!("unknown key \"profiles.p.routing.{key}\"")),
                "{key}: {e}"
            );
        }
    }
}
