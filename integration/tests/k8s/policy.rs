//! The operator's policy (the `podgate-plugins` ConfigMap) edited on a
//! running cluster: the installers re-render the chain, new sandboxes get
//! the new policy.

use podgate_integration::k8s::{Cluster, NODES};
use podgate_integration::workspace_root;
use serde_json::{json, Value};

use crate::install::ensure_installed;
use crate::nodes::ip_forward;
use crate::world::World;

/// Namespaces the edited policy lets pick a profile, beside `vpn`.
pub const CHURN: &str = "churn";

/// The shipped policy (podgate-config.yaml) with what the later cases
/// use: `forwarder` (forwarding only; pools come from the pod's
/// `podgate.dev/return-routes`), `protected` (strict routing through the
/// cluster's underlay) and the `churn` namespace allowed to ask.
pub fn edited_policy() -> String {
    let path = workspace_root().join("conf/kubernetes/podgate-config.yaml");
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let plugins = doc["data"]["plugins.json"].as_str().unwrap();
    let mut plugins: Value = serde_json::from_str(plugins).unwrap();
    let router = plugins
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["type"] == "podgate-router")
        .unwrap();
    router["profiles"]["forwarder"] = json!({"sysctls": {"net.ipv4.ip_forward": "1"}});
    router["profiles"]["protected"] = json!({"routing": {
        "mode": "strict", "uplink": "uplink0", "gateway": "192.168.200.254", "table": "auto"}});
    router["allow"]["annotationNamespaces"]
        .as_array_mut()
        .unwrap()
        .push(json!(CHURN));
    let data = serde_json::to_string_pretty(&plugins).unwrap();
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "podgate-plugins", "namespace": "podgate-system",
                     "labels": {"app.kubernetes.io/name": "podgate"}},
        "data": {"plugins.json": data}
    });
    serde_json::to_string(&cm).unwrap()
}

/// A pod of the greeter image in `namespace` with `annotations`; on the
/// ptp node when `on_ptp` (strict routing needs a routed primary).
pub fn pod_yaml(namespace: &str, name: &str, annotations: &[(&str, &str)], on_ptp: bool) -> String {
    let ann: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "greeter", "image": "localhost/podgate/greeter:1", "imagePullPolicy": "Never"}]
    });
    if on_ptp {
        spec["nodeSelector"] = json!({"podgate-k8s/primary": "ptp"});
    }
    serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": ann},
        "spec": spec
    }))
    .unwrap()
}

pub fn namespace_yaml(name: &str) -> String {
    format!("{{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {{\"name\": \"{name}\"}}}}")
}

/// Whether every node's chain holds `needle` (the installers re-rendered).
fn every_chain_holds(c: &Cluster, needle: &str) -> bool {
    NODES.iter().all(|n| {
        std::fs::read_to_string(c.host_path(n, "/etc/cni/net.d/00-podgate.conflist"))
            .is_ok_and(|t| t.contains(needle))
    })
}

/// The reason a pod's sandbox failed, from its events (the kubelet's
/// FailedCreatePodSandBox), once there is one.
pub fn sandbox_failure(c: &Cluster, namespace: &str, pod: &str) -> Option<String> {
    let events = c.kubectl_json(&[
        "-n",
        namespace,
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={pod},reason=FailedCreatePodSandBox"),
    ]);
    events["items"]
        .as_array()?
        .last()
        .and_then(|e| e["message"].as_str())
        .map(String::from)
}

pub fn an_edited_policy_reaches_new_sandboxes(world: &mut World) {
    ensure_installed(world);
    let image = crate::world::test_image("greeter");
    world.cluster().load_image(&image);
    let c = world.cluster();
    c.apply(&namespace_yaml(CHURN));
    // Before the edit: `churn` may not ask, so the sandbox is refused and
    // the kubelet keeps retrying.
    c.apply(&pod_yaml(
        CHURN,
        "early",
        &[("podgate.dev/profile", "forwarder")],
        false,
    ));
    let refusal = c.wait("the early pod's sandbox refused", 120, || {
        sandbox_failure(c, CHURN, "early")
    });
    assert!(refusal.contains("podgate-router"), "{refusal}");

    c.apply(&edited_policy());
    c.wait("every installer re-rendered the edited policy", 180, || {
        every_chain_holds(c, "forwarder").then_some(())
    });
    // The retried sandbox and a new pod get it.
    c.apply(&pod_yaml(
        CHURN,
        "late",
        &[("podgate.dev/profile", "forwarder")],
        false,
    ));
    for pod in ["early", "late"] {
        c.wait_pod_ready(CHURN, pod);
        assert_eq!(ip_forward(c, CHURN, pod), "1", "{CHURN}/{pod}: forwarding");
    }
    c.kubectl_ok(&["-n", CHURN, "delete", "pod", "early", "late", "--wait=true"]);
}
