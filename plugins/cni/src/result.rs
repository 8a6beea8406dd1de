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
    /// The 0.3.x/0.4.0 `version` field ("4"/"6"), only whether it is there:
    /// it decides whether the result is in a version's shape ([`render`]).
    #[serde(default)]
    pub version: Option<serde::de::IgnoredAny>,
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
    /// The result's own version (it may differ from the config's).
    #[serde(default, rename = "cniVersion")]
    pub cni_version: Option<String>,
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

/// prevResult as received: its text (what a plugin that changes nothing
/// prints) and the typed view. The whole JSON as a tree ([`PrevResult::raw`])
/// is built only by a plugin that changes the result or when the caller's
/// version needs another shape: a pass-through reads the text once, typed
/// (plugins/cni/README.md, design note "prevResult: its text and a typed view").
#[derive(Debug, Clone, PartialEq)]
pub struct PrevResult {
    pub typed: CniResult,
    /// As it came (JSON text, a non-empty object).
    pub text: Box<str>,
}

impl PrevResult {
    /// From the raw text of `prevResult` (not `null`): typed straight from
    /// the text, in one pass. None for `{}`, what some runtimes send on DEL.
    pub fn from_raw(v: &RawValue) -> Result<Option<PrevResult>, CniError> {
        let text = v.get();
        if !text.starts_with('{') {
            return Err(CniError::decode("prevResult is not a JSON object"));
        }
        let typed: CniResult = serde_json::from_str(text)
            .map_err(|e| CniError::decode(format!("prevResult: {}", message_of(&e))))?;
        if is_empty_object(text) {
            return Ok(None);
        }
        Ok(Some(PrevResult {
            typed,
            text: text.into(),
        }))
    }

    /// The whole result as a JSON tree, for a plugin that changes it.
    pub fn raw(&self) -> Result<Map<String, Value>, CniError> {
        serde_json::from_str(&self.text)
            .map_err(|e| CniError::decode(format!("prevResult: {}", message_of(&e))))
    }

    /// Whether [`convert`] would leave this result as it is for `version`:
    /// the result's version is `version`, and every IP already has
    /// (0.3.x/0.4.0) or lacks (1.x) its `version` field.
    fn in_shape_of(&self, version: &str) -> bool {
        let with_ip_version = Version::parse(version).is_some_and(Version::has_ip_version_field);
        self.typed.cni_version.as_deref() == Some(version)
            && self
                .typed
                .ips
                .iter()
                .all(|ip| ip.version.is_some() == with_ip_version)
    }
}

/// `{}` with any whitespace inside (JSON text known to be an object).
fn is_empty_object(text: &str) -> bool {
    text.strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .is_some_and(|inner| inner.trim_matches([' ', '\t', '\n', '\r']).is_empty())
}

/// What ADD answers with.
#[derive(Debug, Clone, PartialEq)]
pub enum Added {
    /// prevResult as it came (a chained plugin that changes nothing), or
    /// an empty result when there was none.
    PrevResult,
    /// A result of the plugin's own: raw JSON in any of the shapes.
    Result(Map<String, Value>),
}

/// The text of ADD's answer in the shape of `version`. prevResult handed
/// back in a shape `version` already has is its own text: the same JSON,
/// not parsed and printed again.
pub fn render(added: Added, prev: Option<&PrevResult>, version: &str) -> Result<String, CniError> {
    let raw = match (added, prev) {
        (Added::PrevResult, Some(p)) if p.in_shape_of(version) => return Ok(p.text.to_string()),
        (Added::PrevResult, Some(p)) => p.raw()?,
        (Added::PrevResult, None) => Map::new(),
        (Added::Result(raw), _) => raw,
    };
    Ok(convert(raw, version).to_string())
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
        let p = prev(&sample_030().to_string());
        assert_eq!(p.typed.sandbox_interface("eth0").unwrap().0, 2);
        assert_eq!(p.typed.ips_of("eth0").len(), 1);
        assert_eq!(p.typed.host_interfaces().count(), 2);
    }

    #[test]
    fn prev_result_without_dns_parses() {
        let v = json!({"cniVersion": "1.0.0", "ips": [{"address": "fd00::5/64"}]});
        prev(&v.to_string());
    }

    #[test]
    fn convert_between_shapes_keeps_unknown_fields() {
        let p = prev(&sample_030().to_string());
        let v1 = convert(p.raw().unwrap(), "1.0.0");
        assert!(v1["ips"][0].get("version").is_none());
        assert_eq!(v1["dns"], json!({}));
        let back = convert(v1.as_object().unwrap().clone(), "0.3.1");
        assert_eq!(back, sample_030());
    }

    fn prev(text: &str) -> PrevResult {
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        PrevResult::from_raw(raw).unwrap().unwrap()
    }

    fn rendered(added: Added, p: Option<&PrevResult>, version: &str) -> Value {
        serde_json::from_str(&render(added, p, version).unwrap()).unwrap()
    }

    #[test]
    fn render_echoes_the_text_only_when_nothing_changes() {
        let text = r#"{ "cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.1.0.5/24"}], "x": 1 }"#;
        let p = prev(text);
        assert_eq!(render(Added::PrevResult, Some(&p), "0.3.1").unwrap(), text);
        // Another version: converted and printed anew, unknown keys kept.
        let v = rendered(Added::PrevResult, Some(&p), "1.0.0");
        assert_eq!(v["cniVersion"], "1.0.0");
        assert!(v["ips"][0].get("version").is_none());
        assert_eq!(v["x"], 1);
        // A result of the plugin's own.
        let mut changed = p.raw().unwrap();
        changed.insert("routes".into(), json!([]));
        let v = rendered(Added::Result(changed), Some(&p), "0.3.1");
        assert_eq!(v["routes"], json!([]));
        // An IP without its 0.3.x version field is not in shape: converted.
        let p = prev(r#"{"cniVersion":"0.3.1","ips":[{"address":"10.1.0.5/24"}]}"#);
        let v = rendered(Added::PrevResult, Some(&p), "0.3.1");
        assert_eq!(v["ips"][0]["version"], "4");
        // A 1.x result whose IP still has one: not in shape either.
        let p = prev(r#"{"cniVersion":"1.0.0","ips":[{"version":"4","address":"10.1.0.5/24"}]}"#);
        let v = rendered(Added::PrevResult, Some(&p), "1.0.0");
        assert!(v["ips"][0].get("version").is_none());
        // A result without its own cniVersion gets the config's.
        let p = prev(r#"{"ips":[{"address":"fd00::5/64"}]}"#);
        assert_eq!(
            rendered(Added::PrevResult, Some(&p), "1.1.0")["cniVersion"],
            "1.1.0"
        );
        // No prevResult: an empty result in the config's version.
        assert_eq!(
            rendered(Added::PrevResult, None, "1.0.0"),
            json!({"cniVersion": "1.0.0"})
        );
    }

    #[test]
    fn empty_prev_result_is_none_and_garbage_is_refused() {
        for empty in ["{}", "{ }", "{\n\t}"] {
            let raw: &RawValue = serde_json::from_str(empty).unwrap();
            assert!(PrevResult::from_raw(raw).unwrap().is_none(), "{empty:?}");
        }
        for bad in [
            r#"[1]"#,
            r#"{"ips":[{"address":"not-an-ip"}]}"#,
            r#"{"interfaces":5}"#,
            r#"{"cniVersion":1}"#,
        ] {
            let raw: &RawValue = serde_json::from_str(bad).unwrap();
            let e = PrevResult::from_raw(raw).unwrap_err();
            assert_eq!(e.code, 6, "{bad}: {e:?}");
            assert!(!e.msg.contains(" at line "), "{}", e.msg);
        }
    }

    #[test]
    fn unchanged_in_same_version_is_identical() {
        let v = sample_030();
        assert_eq!(convert(v.as_object().unwrap().clone(), "0.3.1"), v);
    }
}
