//! The network configuration a runtime writes to a plugin's stdin.

use crate::error::CniError;
use crate::result::PrevResult;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

/// Fields every plugin's config has, plus the raw object for plugin-specific ones.
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
    pub raw: Value,
}

/// One entry of `cni.dev/valid-attachments` (GC, spec 1.1.0).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

impl NetConf {
    /// Parse stdin. Errors: 6 for bytes that are not a JSON object, 7 for a
    /// config that is JSON but not a network config. The version is checked by
    /// the caller, which knows the verb.
    pub fn parse(bytes: &[u8]) -> Result<NetConf, CniError> {
        let raw: Value = serde_json::from_slice(bytes)
            .map_err(|e| CniError::decode(format!("network config is not valid JSON: {e}")))?;
        let obj = raw
            .as_object()
            .ok_or_else(|| CniError::decode("network config is not a JSON object"))?;
        let str_field = |k: &str| -> Result<String, CniError> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(CniError::invalid_config(format!("{k} must be a string"))),
            }
        };
        let cni_version = str_field("cniVersion")?;
        let name = str_field("name")?;
        let plugin_type = str_field("type")?;
        let object_field = |k: &str| -> Result<Map<String, Value>, CniError> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(Map::new()),
                Some(Value::Object(m)) => Ok(m.clone()),
                Some(_) => Err(CniError::invalid_config(format!("{k} must be an object"))),
            }
        };
        let runtime_config = object_field("runtimeConfig")?;
        let args_cni = match obj.get("args") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(a)) => match a.get("cni") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m.clone(),
                Some(_) => return Err(CniError::invalid_config("args.cni must be an object")),
            },
            Some(_) => return Err(CniError::invalid_config("args must be an object")),
        };
        let prev_result = match obj.get("prevResult") {
            None | Some(Value::Null) => None,
            // An empty prevResult ({}) is what some runtimes send on DEL.
            Some(Value::Object(m)) if m.is_empty() => None,
            Some(v) => Some(PrevResult::parse(v)?),
        };
        Ok(NetConf {
            cni_version,
            name,
            plugin_type,
            prev_result,
            runtime_config,
            args_cni,
            raw,
        })
    }

    /// Deserialize the plugin-specific config; errors are code 7 with the serde path.
    pub fn plugin_config<T: DeserializeOwned>(&self) -> Result<T, CniError> {
        T::deserialize(&self.raw)
            .map_err(|e| CniError::invalid_config(format!("{} config: {e}", self.plugin_type)))
    }

    /// `cni.dev/valid-attachments` for GC (missing = none are valid).
    pub fn valid_attachments(&self) -> Result<Vec<Attachment>, CniError> {
        match self.raw.get("cni.dev/valid-attachments") {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(v) => Vec::<Attachment>::deserialize(v)
                .map_err(|e| CniError::invalid_config(format!("cni.dev/valid-attachments: {e}"))),
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

    #[test]
    fn valid_attachments() {
        let c = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"t",
            "cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(c.valid_attachments().unwrap().len(), 1);
    }
}
