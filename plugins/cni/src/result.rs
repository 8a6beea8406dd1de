//! CNI results: a typed read-only view for plugins, and conversion of the raw
//! JSON between the 0.3.x/0.4.0 and 1.x shapes.
//!
//! Chained plugins must hand prevResult back "unchanged" in the caller's version.
//! We therefore keep the raw JSON as the thing we emit, so fields we do not model
//! (dns, 1.1.0's socketPath/pciID, vendor keys) survive byte-for-byte in meaning.

use crate::config::message_of;
use crate::error::CniError;
use crate::version::Version;
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::net::IpAddr;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Interface {
    pub name: String,
    #[serde(default)]
    pub mac: Option<String>,
    /// Set for interfaces inside the sandbox; absent for host-side ones.
    #[serde(default)]
    pub sandbox: Option<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct IpConfig {
    pub address: IpNet,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
    #[serde(default)]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default)]
    pub gw: Option<IpAddr>,
}

/// A typed view of a result, as plugins need it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct CniResult {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<Route>,
}

impl CniResult {
    /// The sandbox interface called `ifname`, with its index in `interfaces`.
    pub fn sandbox_interface(&self, ifname: &str) -> Option<(usize, &Interface)> {
        self.interfaces
            .iter()
            .enumerate()
            .find(|(_, i)| i.name == ifname && i.sandbox.as_deref().is_some_and(|s| !s.is_empty()))
    }

    /// Host-side interfaces (no sandbox), e.g. the host end of a veth pair or a bridge.
    pub fn host_interfaces(&self) -> impl Iterator<Item = &Interface> {
        self.interfaces
            .iter()
            .filter(|i| i.sandbox.as_deref().is_none_or(str::is_empty))
    }

    /// Addresses assigned to the sandbox interface `ifname`. IPs without an
    /// interface index are taken as belonging to it (allowed by the spec).
    pub fn ips_of(&self, ifname: &str) -> Vec<&IpConfig> {
        let idx = self.sandbox_interface(ifname).map(|(i, _)| i);
        self.ips
            .iter()
            .filter(|ip| match (ip.interface, idx) {
                (Some(i), Some(j)) => i == j,
                (None, _) => true,
                (Some(_), None) => false,
            })
            .collect()
    }
}

/// prevResult as received: the raw JSON (what we emit) plus the typed view.
#[derive(Debug, Clone, PartialEq)]
pub struct PrevResult {
    pub raw: Map<String, Value>,
    pub typed: CniResult,
    /// `raw` as it came (JSON text): what a pass-through prints when
    /// nothing changes it ([`render`]).
    pub text: Box<str>,
}

impl PrevResult {
    pub fn parse(v: &Value) -> Result<PrevResult, CniError> {
        let raw = v
            .as_object()
            .ok_or_else(|| CniError::decode("prevResult is not a JSON object"))?
            .clone();
        let typed =
            CniResult::deserialize(v).map_err(|e| CniError::decode(format!("prevResult: {e}")))?;
        Ok(PrevResult {
            raw,
            typed,
            text: v.to_string().into(),
        })
    }

    /// From the raw text of `prevResult` (not `null`): typed straight from
    /// the text. None for `{}`, what some runtimes send on DEL.
    pub fn from_raw(v: &RawValue) -> Result<Option<PrevResult>, CniError> {
        let text = v.get();
        if !text.starts_with('{') {
            return Err(CniError::decode("prevResult is not a JSON object"));
        }
        // One pass over the text; the typed view from the tree (as
        // `parse` does: the same messages, no positions).
        let v: Value = serde_json::from_str(text)
            .map_err(|e| CniError::decode(format!("prevResult: {}", message_of(&e))))?;
        let typed =
            CniResult::deserialize(&v).map_err(|e| CniError::decode(format!("prevResult: {e}")))?;
        let Value::Object(raw) = v else {
            return Err(CniError::decode("prevResult is not a JSON object"));
        };
        if raw.is_empty() {
            return Ok(None);
        }
        Ok(Some(PrevResult {
            raw,
            typed,
            text: text.into(),
        }))
    }
}

/// Whether [`convert`] would leave `raw` as it is for `version`: the
/// version is already `version`'s and every IP already has (0.3.x/0.4.0)
/// or lacks (1.x) its `version` field.
fn in_shape_of(raw: &Map<String, Value>, version: &str) -> bool {
    if raw.get("cniVersion").and_then(Value::as_str) != Some(version) {
        return false;
    }
    let with_ip_version = Version::parse(version).is_some_and(Version::has_ip_version_field);
    match raw.get("ips") {
        None => true,
        Some(Value::Array(ips)) => ips.iter().all(|ip| match ip.as_object() {
            Some(o) => o.contains_key("version") == with_ip_version,
            None => true,
        }),
        Some(_) => true,
    }
}

/// The text of a result in the shape of `version`. A chained plugin that
/// hands prevResult back unchanged, in a shape `version` already has, gets
/// prevResult's own text: the same JSON, not parsed and printed again.
pub fn render(raw: Map<String, Value>, prev: Option<&PrevResult>, version: &str) -> String {
    match prev {
        Some(p) if raw == p.raw && in_shape_of(&raw, version) => p.text.to_string(),
        _ => convert(raw, version).to_string(),
    }
}

/// Rewrite a raw result into the shape of `version` (only the parts that differ).
pub fn convert(mut raw: Map<String, Value>, version: &str) -> Value {
    let with_ip_version = Version::parse(version).is_some_and(Version::has_ip_version_field);
    if let Some(Value::Array(ips)) = raw.get_mut("ips") {
        for ip in ips.iter_mut().filter_map(Value::as_object_mut) {
            if with_ip_version {
                if !ip.contains_key("version") {
                    let fam = ip
                        .get("address")
                        .and_then(Value::as_str)
                        .and_then(|a| a.parse::<IpNet>().ok())
                        .map(|n| if n.addr().is_ipv4() { "4" } else { "6" });
                    if let Some(f) = fam {
                        ip.insert("version".into(), Value::String(f.into()));
                    }
                }
            } else {
                ip.remove("version");
            }
        }
    }
    raw.insert("cniVersion".into(), Value::String(version.to_string()));
    Value::Object(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample_030() -> Value {
        json!({
            "cniVersion": "0.3.1",
            "interfaces": [{"name": "cni0", "mac": "aa:bb:cc:dd:ee:ff"},
                           {"name": "veth1", "mac": "aa:bb:cc:dd:ee:00"},
                           {"name": "eth0", "mac": "aa:bb:cc:dd:ee:01", "sandbox": "/var/run/netns/p"}],
            "ips": [{"version": "4", "address": "10.22.0.5/16", "gateway": "10.22.0.1", "interface": 2}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        })
    }

    #[test]
    fn typed_view_finds_sandbox_interface_and_ips() {
        let p = PrevResult::parse(&sample_030()).unwrap();
        assert_eq!(p.typed.sandbox_interface("eth0").unwrap().0, 2);
        assert_eq!(p.typed.ips_of("eth0").len(), 1);
        assert_eq!(p.typed.host_interfaces().count(), 2);
    }

    #[test]
    fn prev_result_without_dns_parses() {
        let v = json!({"cniVersion": "1.0.0", "ips": [{"address": "fd00::5/64"}]});
        assert!(PrevResult::parse(&v).is_ok());
    }

    #[test]
    fn convert_between_shapes_keeps_unknown_fields() {
        let p = PrevResult::parse(&sample_030()).unwrap();
        let v1 = convert(p.raw.clone(), "1.0.0");
        assert!(v1["ips"][0].get("version").is_none());
        assert_eq!(v1["dns"], json!({}));
        let back = convert(v1.as_object().unwrap().clone(), "0.3.1");
        assert_eq!(back, sample_030());
    }

    #[test]
    fn render_echoes_the_text_only_when_nothing_changes() {
        let text = r#"{ "cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.1.0.5/24"}], "x": 1 }"#;
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        let p = PrevResult::from_raw(raw).unwrap().unwrap();
        assert_eq!(render(p.raw.clone(), Some(&p), "0.3.1"), text);
        // Another version, or a changed result: converted and printed anew.
        let v: Value = serde_json::from_str(&render(p.raw.clone(), Some(&p), "1.0.0")).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
        assert!(v["ips"][0].get("version").is_none());
        let mut changed = p.raw.clone();
        changed.insert("routes".into(), json!([]));
        let v: Value = serde_json::from_str(&render(changed, Some(&p), "0.3.1")).unwrap();
        assert_eq!(v["routes"], json!([]));
        // An IP without its 0.3.x version field is not in shape: converted.
        let raw: &RawValue =
            serde_json::from_str(r#"{"cniVersion":"0.3.1","ips":[{"address":"10.1.0.5/24"}]}"#)
                .unwrap();
        let p = PrevResult::from_raw(raw).unwrap().unwrap();
        let v: Value = serde_json::from_str(&render(p.raw.clone(), Some(&p), "0.3.1")).unwrap();
        assert_eq!(v["ips"][0]["version"], "4");
    }

    #[test]
    fn unchanged_in_same_version_is_identical() {
        let v = sample_030();
        assert_eq!(convert(v.as_object().unwrap().clone(), "0.3.1"), v);
    }
}
