//! The network config + prevResult a runtime writes to stdin: the protocol
//! layer's parser and dispatcher (every verb, with a no-op plugin), the
//! router's and the guard's plugin_config, the router's policy and its pure
//! planner over the parsed prevResult. Untrusted parts: prevResult,
//! runtimeConfig (pod annotations) and args.cni.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podgate_cni::result::convert;
use podgate_cni::version::SUPPORTED_VERSIONS;
use podgate_cni::{dispatch, Added, Attachment, CniError, Env, NetConf, Plugin, Request};
use podgate_kit::state::Key;
use podgate_router::config::RouterConfig;
use podgate_router::intent::{select, PodIntent};
use podgate_router::plan::{build, NodeView};
use podgate_tunnel_guard::GuardConfig;
use serde_json::Value;

/// The largest stdin the dispatcher accepts is 4 MiB; inputs are capped far
/// below that (run.sh: -max_len) so each run stays fast.
const MAX_INPUT: usize = 256 * 1024;

struct Noop;

impl Plugin for Noop {
    fn add(&self, _: &Request) -> Result<Added, CniError> {
        Ok(Added::PrevResult)
    }
    fn del(&self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn check(&self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn gc(&self, _: &NetConf, _: &[Attachment]) -> Result<(), CniError> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    // Whole protocol layer, as the binary runs it, for each verb.
    for cmd in ["ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC"] {
        let vars = |k: &str| -> Option<String> {
            match k {
                "CNI_COMMAND" => Some(cmd.into()),
                "CNI_CONTAINERID" => Some("fuzz".into()),
                "CNI_NETNS" => Some("/var/run/netns/fuzz".into()),
                "CNI_IFNAME" => Some("eth0".into()),
                "CNI_ARGS" => Some("K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-0".into()),
                _ => None,
            }
        };
        let out = dispatch(&Noop, vars, data);
        // Whatever happens, stdout is one JSON document (or empty on success).
        assert!(
            out.stdout.is_empty() || serde_json::from_str::<Value>(&out.stdout).is_ok(),
            "stdout is not JSON: {:?}",
            out.stdout
        );
        if out.exit != 0 {
            let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
            assert!(v["code"].as_u64().is_some(), "error without code: {v}");
        }
    }

    let Ok(conf) = NetConf::parse(data) else {
        return;
    };
    let _ = conf.valid_attachments();
    if let Some(prev) = &conf.prev_result {
        for v in SUPPORTED_VERSIONS {
            if let Ok(raw) = prev.raw() {
                let _ = convert(raw, v);
            }
        }
    }
    let _ = GuardConfig::from_value(&conf.value().unwrap_or_default()).map(|c| {
        (
            c.timeout(),
            c.protection_socket(),
            c.excluded(Some("kube-system")),
        )
    });

    let Ok(cfg) = conf.plugin_config::<RouterConfig>() else {
        return;
    };
    if cfg.validate().is_err() {
        return;
    }
    let env = Env {
        container_id: "fuzz".into(),
        ifname: "eth0".into(),
        args: vec![
            ("K8S_POD_NAMESPACE".into(), "vpn".into()),
            ("K8S_POD_NAME".into(), "openvpn-0".into()),
        ],
        ..Env::default()
    };
    let Ok(intent) = PodIntent::from_request(&env, &conf) else {
        return;
    };
    let Ok(Some(sel)) = select(&cfg, &intent) else {
        return;
    };
    if let Some(prev) = &conf.prev_result {
        let key = Key::new(&conf.name, "fuzz", "eth0");
        let _ = build(&cfg, &sel, &key, &prev.typed, &NodeView::default());
    }
});
