//! podgate installed the way the README says, on every node.

use podgate_integration::k8s::NODES;
use podgate_integration::output_text;
use serde_json::Value;

use crate::world::{sh_block, workdir, World};

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
    world.before_install = Some(warm_up(world));
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

pub fn the_readme_install_rolls_out_on_every_node(world: &mut World) {
    world.finish();
    ensure_installed(world);
    let c = world.cluster();
    let ds = c.kubectl_json(&["-n", "podgate-system", "get", "ds", "podgate"]);
    assert_eq!(ds["status"]["numberReady"], 3, "{:#}", ds["status"]);
    for node in NODES {
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
