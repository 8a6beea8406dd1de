//! podgate installed the way the README says, on every node.

use podgate_integration::k8s::{Cluster, NODES};
use podgate_integration::{output_text, workspace_root};
use serde_json::Value;

use crate::nodes::{container_pids, podgate_pod};
use crate::world::{head_commit, sh_block, workdir, World};

const NS: &str = "podgate-system";

/// The CNI network a node's containerd says it loaded for pods (`crictl
/// info`): its name and its plugins' types, in order.
pub fn loaded_cni_network(world: &mut World, node: &str) -> (String, Vec<String>) {
    let info = world.cluster().node_sh_ok(node, "crictl info");
    let info: Value = serde_json::from_str(&info).unwrap();
    let nets = info["cniconfig"]["Networks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // containerd's own loopback comes first; the pod network follows.
    let net = nets
        .iter()
        .find(|n| n["Config"]["Name"] != "cni-loopback")
        .unwrap_or_else(|| panic!("{node}: no pod network in crictl info:\n{info:#}"));
    let types = net["Config"]["Plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            p["Network"]["type"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    (
        net["Config"]["Name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        types,
    )
}

/// A pod on every node, waited for and deleted: what a node keeps of its
/// primary after its first pod (the bridge plugin's `cni0`), so that the
/// snapshot before the install compares with a node whose pods are gone.
const WARM_UP: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: warm-up, namespace: default}
spec:
  selector: {matchLabels: {app: warm-up}}
  template:
    metadata: {labels: {app: warm-up}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      containers:
        - {name: greeter, image: "localhost/podgate/greeter:1", imagePullPolicy: Never}
"#;

/// podgate's image and the greeter's loaded, a pod run and deleted on
/// every node: the nodes' views before an install.
pub fn warm_up(
    world: &mut World,
) -> std::collections::BTreeMap<&'static str, crate::nodes::NodeView> {
    world.podgate_image();
    world
        .cluster()
        .load_image(&crate::world::test_image("greeter"));
    let c = world.cluster();
    c.apply(WARM_UP);
    c.kubectl_ok(&["rollout", "status", "ds/warm-up", "--timeout=120s"]);
    c.kubectl_ok(&["delete", "ds", "warm-up", "--wait=true"]);
    c.wait("the warm-up pods gone", 120, || {
        crate::openvpn::pods(c, "default", "app=warm-up")
            .is_empty()
            .then_some(())
    });
    crate::nodes::views(world.cluster())
}

/// Installs podgate with the README's commands, once per cluster; the
/// nodes' views before it are kept for the uninstall case.
pub fn ensure_installed(world: &mut World) {
    if world.installed {
        return;
    }
    if world.before_install.is_none() {
        world.before_install = Some(warm_up(world));
    }
    let block = sh_block("README.md", "Install on a cluster", "kubectl apply");
    let dir = workdir(&[]);
    let out = world.cluster().sh_in(&block, dir.path());
    assert!(
        out.status.success(),
        "the README's install commands failed:\n{block}\n{}",
        output_text(&out)
    );
    world.installed = true;
}

/// The readiness probe's failure for the `install` container of a podgate
/// pod, from its events (the kubelet's Unhealthy), once there is one.
fn probe_failure(c: &Cluster) -> Option<String> {
    let events = c.kubectl_json(&[
        "-n",
        NS,
        "get",
        "events",
        "--field-selector",
        "reason=Unhealthy",
    ]);
    events["items"]
        .as_array()?
        .iter()
        .filter(|e| e["involvedObject"]["fieldPath"] == "spec.containers{install}")
        .find_map(|e| e["message"].as_str())
        .map(String::from)
}

pub fn the_readme_install_rolls_out_on_every_node(world: &mut World) {
    world.finish();
    world.before_install = Some(warm_up(world));
    // podgate.yaml applied before podgate-config.yaml: the optional
    // ConfigMap volume is an empty dir, every installer unready and saying
    // why, no chain written.
    let c = world.cluster();
    c.kubectl_ok(&[
        "apply",
        "-f",
        &workspace_root()
            .join("conf/kubernetes/podgate.yaml")
            .to_string_lossy(),
    ]);
    let reason = c.wait("an installer unready without its ConfigMap", 120, || {
        probe_failure(c)
    });
    assert!(
        reason
            .contains("plugins file /etc/podgate/plugins.json missing: apply podgate-config.yaml"),
        "{reason}"
    );
    let ds = c.kubectl_json(&["-n", NS, "get", "ds", "podgate"]);
    assert_eq!(ds["status"]["numberReady"], 0, "{:#}", ds["status"]);
    for node in NODES {
        let conf = c.host_path(node, "/etc/cni/net.d/00-podgate.conflist");
        assert!(!conf.exists(), "{node}: a chain without the policy");
    }

    // The README's commands, podgate.yaml applied again among them.
    ensure_installed(world);
    let c = world.cluster();
    let ds = c.kubectl_json(&["-n", NS, "get", "ds", "podgate"]);
    assert_eq!(ds["status"]["numberReady"], 3, "{:#}", ds["status"]);
    for node in NODES {
        the_image_is_installed(world.cluster(), node, &head_commit());
        // The runtime itself says it loads podgate's chain: the primary's
        // plugins followed by podgate's.
        let (name, types) = loaded_cni_network(world, node);
        let primary = if node == "node-3" { "ptp" } else { "bridge" };
        assert_eq!(
            types,
            [primary, "portmap", "podgate-tunnel-guard", "podgate-router"],
            "{node}'s containerd loaded {name}: not the primary's chain followed by podgate's"
        );
        let c = world.cluster();
        let conf = c.host_path(node, "/etc/cni/net.d/00-podgate.conflist");
        assert!(conf.is_file(), "{node}: {} missing", conf.display());
        for bin in ["podgate-router", "podgate-tunnel-guard"] {
            assert!(
                c.host_path(node, &format!("/opt/cni/bin/{bin}")).is_file(),
                "{node}: {bin} not installed"
            );
        }
    }
}

/// The Ready condition of `node`: (status, message).
fn ready_condition(c: &podgate_integration::k8s::Cluster, node: &str) -> (String, String) {
    let n = c.kubectl_json(&["get", "node", node]);
    let cond = n["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or_default();
    (
        cond["status"].as_str().unwrap_or_default().to_string(),
        cond["message"].as_str().unwrap_or_default().to_string(),
    )
}

/// containerd 2.x asks a spec-1.1.0 chain for its STATUS (node-3's, with
/// the reference plugins v1.10.0) through the kubelet's runtime status,
/// every few seconds: both of podgate's plugins answer it, and a router
/// that cannot use its state dir makes the node NotReady with its reason
/// until it can again.
pub fn containerd_2_asks_status_and_a_router_without_its_state_dir_takes_the_node_out(
    world: &mut World,
) {
    ensure_installed(world);
    let c = world.cluster();
    let events = c.host_path("node-3", "/var/lib/cni/podgate/events.jsonl");
    c.wait("STATUS answered by both plugins on node-3", 60, || {
        let text = std::fs::read_to_string(&events).unwrap_or_default();
        ["podgate-router", "podgate-tunnel-guard"]
            .iter()
            .all(|p| {
                text.lines().any(|l| {
                    l.contains(&format!(
                        "\"plugin\":\"{p}\",\"command\":\"STATUS\",\"outcome\":\"ok\""
                    ))
                })
            })
            .then_some(())
    });
    // The state dir read-only, as a failed disk leaves it.
    c.node_sh_ok(
        "node-3",
        "mount --bind -o ro /var/lib/cni/podgate /var/lib/cni/podgate",
    );
    let (_, message) = c.wait("node-3 NotReady for podgate-router's STATUS", 90, || {
        let (status, message) = ready_condition(c, "node-3");
        (status == "False").then_some((status, message))
    });
    let restored = c.node_sh("node-3", "umount /var/lib/cni/podgate");
    assert!(
        message.contains("NetworkReady=false") && message.contains("state dir unusable"),
        "{message}"
    );
    assert!(
        restored.status.success(),
        "umount: {}",
        output_text(&restored)
    );
    c.wait("node-3 Ready again", 90, || {
        (ready_condition(c, "node-3").0 == "True").then_some(())
    });
}

/// `podgate ARGS` in container `container` of `node`'s podgate pod;
/// stdout.
fn exec_podgate(c: &Cluster, node: &str, container: &str, args: &[&str]) -> String {
    let pod = podgate_pod(c, node);
    let mut full = vec!["-n", NS, "exec", &pod, "-c", container, "--"];
    full.push("/usr/local/bin/podgate");
    full.extend_from_slice(args);
    c.kubectl_ok(&full)
}

/// `node` runs podgate's image of `commit`: its `podgate --version` names
/// the commit, the installer's probe says the chain is written, the plugins
/// in the node's bin dir are the image's bytes, and the agent serves
/// `/healthz` (its liveness probe) and `/metrics` on the node's own address.
pub fn the_image_is_installed(c: &Cluster, node: &str, commit: &str) {
    let version = exec_podgate(c, node, "install", &["--version"]);
    assert!(version.contains(commit), "{node}: {version}");
    let check = exec_podgate(c, node, "install", &["install", "--check"]);
    assert!(
        check.contains("chained: 00-podgate.conflist"),
        "{node}: {check}"
    );
    let pod = podgate_pod(c, node);
    let install = container_pids(c, NS, pod.trim_start_matches("pod/"))["install"];
    for bin in ["podgate-router", "podgate-tunnel-guard"] {
        let installed = std::fs::read(c.host_path(node, &format!("/opt/cni/bin/{bin}"))).unwrap();
        let in_image = std::fs::read(format!("/proc/{install}/root/usr/local/bin/{bin}")).unwrap();
        assert!(installed == in_image, "{node}: {bin} is not the image's");
    }
    let ip = c
        .kubectl_ok(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
        ])
        .trim()
        .to_string();
    for path in ["/healthz", "/metrics"] {
        let out = c.node_sh_ok(
            node,
            &format!("curl -sS -o /dev/null -w '%{{http_code}}' http://{ip}:9750{path}"),
        );
        assert_eq!(out, "200", "{node}: GET {ip}:9750{path}");
    }
}
