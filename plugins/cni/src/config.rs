//! The network configuration a runtime writes to a plugin's stdin.
//!
//! One pass over the bytes: the top-level keys every plugin needs are taken
//! as raw JSON slices and parsed typed on their own; everything else is only
//! checked to be JSON and skipped. The plugin's own config is then parsed
//! typed straight from the text ([`NetConf::plugin_config`]), never through a
//! `serde_json::Value` of the whole document (plugins/cni/README.md, design
//! note "One typed pass over the config").

use crate::error::CniError;
use crate::result::PrevResult;
use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// Fields every plugin's config has, plus the text for plugin-specific ones.
#[derive(Debug, Clone)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub plugin_type: String,
    pub prev_result: Option<PrevResult>,
    /// `runtimeConfig`: capability args the runtime filled in (untrusted: per pod).
    pub runtime_config: Map<String, Value>,
    /// `args.cni`: per-attachment args (e.g. from Multus) (untrusted: per pod).
    pub args_cni: Map<String, Value>,
    /// The whole config as received: valid JSON, a top-level object.
    pub text: Box<str>,
    /// `eventFile` and `stateDir` when they are non-empty strings (where the
    /// event channel is, [`crate::event::file_for`]).
    pub(crate) event_file: Option<String>,
    pub(crate) state_dir: Option<String>,
    valid_attachments: Option<Box<RawValue>>,
}

/// One entry of `cni.dev/valid-attachments` (GC, spec 1.1.0).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// The top-level keys NetConf reads, as slices of the input. A key given
/// twice counts with its last value, as in a `serde_json::Map`.
#[derive(Default)]
struct Top<'a> {
    cni_version: Option<&'a RawValue>,
    name: Option<&'a RawValue>,
    plugin_type: Option<&'a RawValue>,
    prev_result: Option<&'a RawValue>,
    runtime_config: Option<&'a RawValue>,
    args: Option<&'a RawValue>,
    event_file: Option<&'a RawValue>,
    state_dir: Option<&'a RawValue>,
    valid_attachments: Option<&'a RawValue>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Top<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Top<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Top<'a>, M::Error> {
                let mut top = Top::default();
                while let Some(k) = m.next_key::<Cow<'de, str>>()? {
                    let slot = match k.as_ref() {
                        "cniVersion" => &mut top.cni_version,
                        "name" => &mut top.name,
                        "type" => &mut top.plugin_type,
                        "prevResult" => &mut top.prev_result,
                        "runtimeConfig" => &mut top.runtime_config,
                        "args" => &mut top.args,
                        "eventFile" => &mut top.event_file,
                        "stateDir" => &mut top.state_dir,
                        "cni.dev/valid-attachments" => &mut top.valid_attachments,
                        _ => {
                            m.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = Some(m.next_value()?);
                }
                Ok(top)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Top-level keys that are not a plugin's own settings: what the CNI spec
/// defines for every plugin configuration object (`type`, `capabilities`;
/// `runtimeConfig` and `args`, reserved for the runtime) and what runtimes
/// insert when they execute a list (`cniVersion` and `name` from the list,
/// `prevResult`). Keys starting with [`RESERVED_PREFIX`] are reserved too.
/// The spec's well-known `ipMasq`, `ipam` and `dns` are not here: they mean
/// something only to a plugin that implements them, and podgate's do not.
pub const PROTOCOL_KEYS: [&str; 7] = [
    "cniVersion",
    "name",
    "type",
    "capabilities",
    "runtimeConfig",
    "args",
    "prevResult",
];
/// "Any keys starting with `cni.dev/`" are reserved for the protocol
/// (1.1.0's GC adds `cni.dev/valid-attachments`).
pub const RESERVED_PREFIX: &str = "cni.dev/";

/// Deserialize a plugin's own config, refusing every key it does not read,
/// at any depth, except the [`PROTOCOL_KEYS`] at the top: a misspelt
/// setting (`"requried": "always"`) would otherwise be skipped and leave the
/// setting at its default. The error names every such key by its path
/// (`requried`, `profiles.vpn.maskerade`, `assign[0].profil`).
///
/// A config type calls this from its `Deserialize` impl on a type without
/// `#[serde(flatten)]` (serde hands a flattened struct's unknown keys to no
/// one, so they could not be seen).
pub fn deserialize_known<'de, T, D>(d: D) -> Result<T, D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    let mut unknown = Vec::new();
    let value = serde_ignored::deserialize(d, |path| {
        if !is_protocol_key(&path) {
            unknown.push(key_path(&path));
        }
    })?;
    match unknown.as_slice() {
        [] => Ok(value),
        [one] => Err(serde::de::Error::custom(format!(
            "unknown key {one:?} (not a setting of this plugin: check its spelling)"
        ))),
        many => Err(serde::de::Error::custom(format!(
            "unknown keys {} (not settings of this plugin: check their spelling)",
            many.iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn is_protocol_key(path: &serde_ignored::Path) -> bool {
    match path {
        serde_ignored::Path::Map {
            parent: serde_ignored::Path::Root,
            key,
        } => PROTOCOL_KEYS.contains(&key.as_str()) || key.starts_with(RESERVED_PREFIX),
        _ => false,
    }
}

/// `profiles.vpn.maskerade`, `assign[0].profil`: map keys joined by dots,
/// list indexes in brackets, options and newtypes left out.
fn key_path(path: &serde_ignored::Path) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", key_path(parent)),
        Path::Map { parent, key } => match key_path(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => key_path(parent),
    }
}

/// A serde_json error without its " at line L column C": the messages of a
/// typed parse from text read as they did when the parse went through a
/// `Value`, which has no positions.
pub fn message_of(e: &serde_json::Error) -> String {
    let s = e.to_string();
    if e.line() == 0 {
        return s;
    }
    let tail = format!(" at line {} column {}", e.line(), e.column());
    match s.strip_suffix(&tail) {
        Some(m) => m.to_string(),
        None => s,
    }
}

fn is_null(v: Option<&RawValue>) -> Option<&RawValue> {
    v.filter(|r| r.get() != "null")
}

fn string_field(k: &str, v: Option<&RawValue>) -> Result<String, CniError> {
    match is_null(v) {
        None => Ok(String::new()),
        Some(r) => serde_json::from_str::<String>(r.get())
            .map_err(|_| CniError::invalid_config(format!("{k} must be a string"))),
    }
}

fn object_field(k: &str, v: Option<&RawValue>) -> Result<Map<String, Value>, CniError> {
    match is_null(v) {
        None => Ok(Map::new()),
        Some(r) if r.get().starts_with('{') => serde_json::from_str(r.get())
            .map_err(|e| CniError::invalid_config(format!("{k}: {}", message_of(&e)))),
        Some(_) => Err(CniError::invalid_config(format!("{k} must be an object"))),
    }
}

/// A non-empty string, or None (what [`crate::event::file_for_entry`] takes).
fn path_field(v: Option<&RawValue>) -> Option<String> {
    v.and_then(|r| serde_json::from_str::<String>(r.get()).ok())
        .filter(|s| !s.is_empty())
}

impl NetConf {
    /// Parse stdin. Errors: 6 for bytes that are not a JSON object, 7 for a
    /// config that is JSON but not a network config. The version is checked by
    /// the caller, which knows the verb.
    pub fn parse(bytes: &[u8]) -> Result<NetConf, CniError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            CniError::decode(format!("network config is not valid JSON: not UTF-8 ({e})"))
        })?;
        let top: Top = serde_json::from_str(text).map_err(|e| {
            if e.is_data() {
                CniError::decode("network config is not a JSON object")
            } else {
                CniError::decode(format!("network config is not valid JSON: {e}"))
            }
        })?;
        let cni_version = string_field("cniVersion", top.cni_version)?;
        let name = string_field("name", top.name)?;
        let plugin_type = string_field("type", top.plugin_type)?;
        let runtime_config = object_field("runtimeConfig", top.runtime_config)?;
        let args_cni = match object_field("args", top.args)?.remove("cni") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m,
            Some(_) => return Err(CniError::invalid_config("args.cni must be an object")),
        };
        let prev_result = match is_null(top.prev_result) {
            None => None,
            Some(r) => PrevResult::from_raw(r)?,
        };
        Ok(NetConf {
            cni_version,
            name,
            plugin_type,
            prev_result,
            runtime_config,
            args_cni,
            event_file: path_field(top.event_file),
            state_dir: path_field(top.state_dir),
            valid_attachments: is_null(top.valid_attachments).map(RawValue::to_owned),
            text: text.into(),
        })
    }

    /// Deserialize the plugin-specific config from the text in one typed
    /// pass; errors are code 7 with the serde message (a plugin's config
    /// type refuses the keys it does not read: [`deserialize_known`]).
    pub fn plugin_config<T: DeserializeOwned>(&self) -> Result<T, CniError> {
        serde_json::from_str(&self.text).map_err(|e| {
            CniError::invalid_config(format!("{} config: {}", self.plugin_type, message_of(&e)))
        })
    }

    /// The whole config as a `Value`, for code that walks it by key.
    pub fn value(&self) -> Result<Value, CniError> {
        serde_json::from_str(&self.text)
            .map_err(|e| CniError::decode(format!("network config: {}", message_of(&e))))
    }

    /// `cni.dev/valid-attachments` for GC (missing = none are valid).
    pub fn valid_attachments(&self) -> Result<Vec<Attachment>, CniError> {
        match &self.valid_attachments {
            None => Ok(Vec::new()),
            Some(v) => serde_json::from_str(v.get()).map_err(|e| {
                CniError::invalid_config(format!("cni.dev/valid-attachments: {}", message_of(&e)))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_fields() {
        let c = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"podgate-router",
            "runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"a":"b"}},
            "args":{"cni":{"profile":"vpn"}},"prevResult":{}}"#,
        )
        .unwrap();
        assert_eq!(c.cni_version, "1.1.0");
        assert!(c.prev_result.is_none());
        assert_eq!(c.args_cni["profile"], "vpn");
        assert!(c
            .runtime_config
            .contains_key("io.kubernetes.cri.pod-annotations"));
    }

    #[test]
    fn garbage_is_decode_error() {
        assert_eq!(NetConf::parse(b"{nope").unwrap_err().code, 6);
        assert_eq!(NetConf::parse(b"[1]").unwrap_err().code, 6);
        assert_eq!(NetConf::parse(br#"{"name":5}"#).unwrap_err().code, 7);
        assert_eq!(
            NetConf::parse(br#"{"args":{"cni":3}}"#).unwrap_err().code,
            7
        );
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Own {
        #[serde(default)]
        required: Option<String>,
        #[serde(default)]
        profiles: std::collections::BTreeMap<String, Inner>,
        #[serde(default)]
        assign: Vec<Inner>,
    }

    #[derive(Debug, Deserialize)]
    struct Inner {
        #[serde(default)]
        routing: Option<Leaf>,
    }

    #[derive(Debug, Deserialize)]
    struct Leaf {
        #[serde(default)]
        mode: String,
    }

    fn own(text: &str) -> Result<Own, String> {
        deserialize_known(&mut serde_json::Deserializer::from_str(text))
            .map_err(|e: serde_json::Error| message_of(&e))
    }

    #[test]
    fn a_plugin_config_refuses_keys_it_does_not_read_at_any_depth() {
        let e = own(r#"{"requried": "always"}"#).unwrap_err();
        assert_eq!(
            e,
            r#"unknown key "requried" (not a setting of this plugin: check its spelling)"#
        );
        let e = own(
            r#"{"assgin": [], "profiles": {"vpn": {"maskerade": 1, "routing": {"mode": "x", "gatway": 1}}},
                "assign": [{"routing": null, "profil": "p"}], "ipMasq": true}"#,
        )
        .unwrap_err();
        for key in [
            "\"assgin\"",
            "\"profiles.vpn.maskerade\"",
            "\"profiles.vpn.routing.gatway\"",
            "\"assign[0].profil\"",
            "\"ipMasq\"",
        ] {
            assert!(e.contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn the_keys_the_spec_and_the_runtime_add_are_not_a_plugins_own() {
        let c = own(
            r#"{"cniVersion": "1.1.0", "name": "n", "type": "t", "required": "always",
                "capabilities": {"io.kubernetes.cri.pod-annotations": true},
                "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"a": "b"}},
                "args": {"cni": {"profile": "vpn"}}, "prevResult": {"ips": []},
                "cni.dev/valid-attachments": [], "cni.dev/later": 1}"#,
        )
        .unwrap();
        assert_eq!(c.required.as_deref(), Some("always"));
        let c = own(r#"{"profiles": {"vpn": {"routing": {"mode": "strict"}}}, "assign": [{}]}"#)
            .unwrap();
        let routing = c.profiles["vpn"].routing.as_ref().unwrap();
        assert_eq!((routing.mode.as_str(), c.assign.len()), ("strict", 1));
        // Reserved at the top only: inside the plugin's own objects they are typos.
        let e = own(r#"{"profiles": {"p": {"name": "x"}}}"#).unwrap_err();
        assert!(e.contains("profiles.p.name"), "{e}");
    }

    #[test]
    fn gc_valid_attachments_are_read_from_the_config() {
        let c = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"t",
            "cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(c.valid_attachments().unwrap().len(), 1);
    }
}
