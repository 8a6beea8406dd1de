//! podgate installed the way the README says, on every node.

use podgate_integration::k8s::NODES;
use podgate_integration::output_text;
use serde_json::Value;

use crate::world::{sh_block, workdir, World};

/// The CNI config a node's containerd says it loaded (`crictl info`): the
/// first network's name and the file it came from.
pub fn loaded_cni_config(world: &mut World, node: &str) -> (String, String) {
    let info = world.cluster().node_sh_ok(node, "crictl info");
    let info: Value = serde_json::from_str(&info).unwrap();
    let net = &info["cniconfig"]["Networks"];
    // Networks[0] is the loopback containerd adds; the pod network follows.
    let pod_net = net
        .as_array()
        .and_then(|n| n.iter().find(|n| n["Config"]["Name"] != "cni-loopback"))
        .unwrap_or_else(|| panic!("{node}: no pod network in crictl info:\n{info:#}"));
    (
        pod_net["Config"]["Name"].as_str().unwrap_or_default().to_string(),
        pod_net["Source"].as_str().unwrap_or_default().to_string(),
    )
}

/// Installs podgate with the README's commands, once per cluster.
pub fn ensure_installed(world: &mut World) {
    if world.installed {
        return;
    }
    world.podgate_image();
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
        let (name, source) = loaded_cni_config(world, node);
        assert!(
            source.contains("podgate-router") && source.contains("\"bridge\""),
            "{node}'s containerd loaded {name}, not podgate's chain:\n{source}"
        );
        let c = world.cluster();
        let conf = c.host_path(node, "/etc/cni/net.d/00-podgate.conflist");
        assert!(conf.is_file(), "{node}: {} missing", conf.display());
        for bin in ["podgate-router", "podgate-tunnel-guard"] {
            assert!(c.host_path(node, &format!("/opt/cni/bin/{bin}")).is_file(), "{node}: {bin} not installed");
        }
    }
}
