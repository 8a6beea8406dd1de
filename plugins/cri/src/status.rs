//! The CNI configuration the runtime loaded: CRI `Status{verbose: true}`.
//!
//! containerd (`pkg/cri/server/status.go`, v1.6.20) fills `info` with
//! * `cniconfig`: go-cni's `GetConfig()` as Go's JSON (field names as in
//!   the Go structs): `{"PluginConfDir", "Prefix", "Networks": [{"Config":
//!   {"Name", "CNIVersion", "Plugins": [{"Network": {"type", ...}, "Source"}],
//!   "Source"}, "IFName"}]}`. The first network is go-cni's loopback
//!   (`cni-loopback` on `lo`); the conf dir's networks follow, the default
//!   one on `<Prefix>0` (`eth0`). `Source` is the raw bytes libcni parsed:
//!   a `.conflist` file's bytes; for a `.conf`/`.json` file the list libcni
//!   synthesised around it, whose single plugin's `Source` is the file's bytes.
//! * `lastCNILoadStatus`: `OK`, or why the last reload failed (the runtime
//!   then keeps serving the config it had).
//!
//! CRI-O (`server/runtime_status.go`) puts only `config` (its sandbox image
//! and runtime config) there: no loaded CNI config. Its NetworkReady
//! condition says only whether some default network is loaded.

use super::{block_on, call_err, client, CriError};
use k8s_cri::v1::StatusRequest;
use serde::Deserialize;
use std::collections::HashMap;

/// What the runtime says about its network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeStatus {
    /// The endpoint that answered.
    pub endpoint: String,
    /// The NetworkReady condition's message when it is not true.
    pub network_not_ready: Option<String>,
    /// None: this runtime does not report what it loaded (CRI-O).
    pub cni: Option<LoadedCni>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedCni {
    /// The conf dir as the runtime sees it.
    pub conf_dir: String,
    /// The network pods get (`<Prefix>0`); None when none is loaded.
    pub default: Option<LoadedNetwork>,
    /// `lastCNILoadStatus` when it is not `OK`.
    pub load_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedNetwork {
    pub name: String,
    /// The bytes libcni parsed (see the module doc for `.conf` files).
    pub source: String,
    pub plugins: Vec<LoadedPlugin>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedPlugin {
    pub kind: String,
    pub source: String,
}

/// go-cni `ConfigResult`, only what podgate reads.
#[derive(Deserialize)]
struct GoConfigResult {
    #[serde(rename = "PluginConfDir", default)]
    conf_dir: String,
    #[serde(rename = "Prefix", default)]
    prefix: String,
    #[serde(rename = "Networks", default)]
    networks: Option<Vec<GoConfNetwork>>,
}

#[derive(Deserialize)]
struct GoConfNetwork {
    #[serde(rename = "Config")]
    config: Option<GoConfList>,
    #[serde(rename = "IFName", default)]
    if_name: String,
}

#[derive(Deserialize)]
struct GoConfList {
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "Plugins", default)]
    plugins: Option<Vec<GoConf>>,
    #[serde(rename = "Source", default)]
    source: String,
}

#[derive(Deserialize)]
struct GoConf {
    #[serde(rename = "Network")]
    network: Option<GoNetConf>,
    #[serde(rename = "Source", default)]
    source: String,
}

#[derive(Deserialize)]
struct GoNetConf {
    #[serde(rename = "type", default)]
    kind: String,
}

/// Asks the runtime at `endpoint` (or crictl's defaults) for its status.
pub fn runtime_status(endpoint: Option<&str>) -> Result<RuntimeStatus, CriError> {
    block_on(async {
        let (endpoint, mut client) = client(endpoint).await?;
        let resp = client
            .status(StatusRequest { verbose: true })
            .await
            .map_err(|s| call_err(&endpoint, "Status", s))?
            .into_inner();
        let network_not_ready = match resp.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.r#type == "NetworkReady")
                .cloned()
        }) {
            Some(c) if c.status => None,
            Some(c) => Some(format!("{}: {}", c.reason, c.message)),
            None => Some("the runtime reports no NetworkReady condition".into()),
        };
        let cni = loaded_cni(&resp.info).map_err(|(key, msg)| CriError::BadInfo {
            endpoint: endpoint.clone(),
            key,
            msg,
        })?;
        Ok(RuntimeStatus {
            endpoint,
            network_not_ready,
            cni,
        })
    })
}

/// The verbose info's CNI part; Ok(None) when the runtime reports none.
fn loaded_cni(info: &HashMap<String, String>) -> Result<Option<LoadedCni>, (&'static str, String)> {
    let Some(raw) = info.get("cniconfig") else {
        return Ok(None);
    };
    // containerd marshals a nil plugin as `null` (no CNI plugin at all).
    let Some(cfg) = serde_json::from_str::<Option<GoConfigResult>>(raw)
        .map_err(|e| ("cniconfig", e.to_string()))?
    else {
        return Ok(None);
    };
    let default_if = format!("{}0", cfg.prefix);
    let default = cfg
        .networks
        .unwrap_or_default()
        .into_iter()
        .find(|n| n.if_name == default_if)
        .and_then(|n| n.config)
        .map(|c| LoadedNetwork {
            name: c.name,
            source: c.source,
            plugins: c
                .plugins
                .unwrap_or_default()
                .into_iter()
                .map(|p| LoadedPlugin {
                    kind: p.network.map(|n| n.kind).unwrap_or_default(),
                    source: p.source,
                })
                .collect(),
        });
    let load_error = info
        .get("lastCNILoadStatus")
        .filter(|s| s.as_str() != "OK")
        .cloned();
    Ok(Some(LoadedCni {
        conf_dir: cfg.conf_dir,
        default,
        load_error,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// containerd 1.6.20's verbose Status info, as printed by
    /// `crictl info` on a node with one conflist.
    fn containerd_info(load_status: &str) -> HashMap<String, String> {
        let cniconfig = serde_json::json!({
            "PluginDirs": ["/opt/cni/bin"],
            "PluginConfDir": "/etc/cni/net.d",
            "PluginMaxConfNum": 1,
            "Prefix": "eth",
            "Networks": [
                {"Config": {"Name": "cni-loopback", "CNIVersion": "0.3.1",
                            "Plugins": [{"Network": {"type": "loopback", "ipam": {}, "dns": {}},
                                         "Source": "{\"type\":\"loopback\"}"}],
                            "Source": "{\n\"cniVersion\": \"0.3.1\",\n\"name\": \"cni-loopback\",\n\"plugins\": [{\n  \"type\": \"loopback\"\n}]\n}"},
                 "IFName": "lo"},
                {"Config": {"Name": "k8s-pod-network", "CNIVersion": "1.0.0",
                            "Plugins": [
                                {"Network": {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "calico", "ipam": {}, "dns": {}},
                                 "Source": "{\"type\":\"calico\"}"},
                                {"Network": {"type": "podgate-router", "ipam": {}, "dns": {}},
                                 "Source": "{\"type\":\"podgate-router\"}"}],
                            "Source": "{\"name\":\"k8s-pod-network\"}"},
                 "IFName": "eth0"}
            ]
        });
        HashMap::from([
            ("cniconfig".to_string(), cniconfig.to_string()),
            ("lastCNILoadStatus".to_string(), load_status.to_string()),
            (
                "lastCNILoadStatus.default".to_string(),
                load_status.to_string(),
            ),
        ])
    }

    #[test]
    fn the_default_network_is_the_one_on_prefix_0_not_the_loopback() {
        let cni = loaded_cni(&containerd_info("OK")).unwrap().unwrap();
        assert_eq!(cni.conf_dir, "/etc/cni/net.d");
        assert_eq!(cni.load_error, None);
        let net = cni.default.unwrap();
        assert_eq!(net.name, "k8s-pod-network");
        assert_eq!(net.source, "{\"name\":\"k8s-pod-network\"}");
        let kinds: Vec<_> = net.plugins.iter().map(|p| p.kind.as_str()).collect();
        assert_eq!(kinds, ["calico", "podgate-router"]);
    }

    #[test]
    fn a_failed_reload_is_reported_beside_the_config_still_served() {
        let cni = loaded_cni(&containerd_info("cni config load failed: bad json"))
            .unwrap()
            .unwrap();
        assert_eq!(
            cni.load_error.as_deref(),
            Some("cni config load failed: bad json")
        );
        assert!(cni.default.is_some());
    }

    #[test]
    fn only_the_loopback_loaded_means_no_default_network() {
        let info = HashMap::from([(
            "cniconfig".to_string(),
            serde_json::json!({"Prefix": "eth", "Networks": [
                {"Config": {"Name": "cni-loopback", "Plugins": null, "Source": ""}, "IFName": "lo"}
            ]})
            .to_string(),
        )]);
        assert_eq!(loaded_cni(&info).unwrap().unwrap().default, None);
    }

    #[test]
    fn a_runtime_without_cniconfig_reports_nothing_loaded() {
        // CRI-O: only "config".
        let crio = HashMap::from([("config".to_string(), "{\"sandboxImage\":\"x\"}".to_string())]);
        assert_eq!(loaded_cni(&crio).unwrap(), None);
        let null = HashMap::from([("cniconfig".to_string(), "null".to_string())]);
        assert_eq!(loaded_cni(&null).unwrap(), None);
        let bad = HashMap::from([("cniconfig".to_string(), "[1]".to_string())]);
        assert!(loaded_cni(&bad).is_err());
    }
}
