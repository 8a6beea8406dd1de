//! podgate installed, upgraded, rolled back and uninstalled with Helm, by
//! the commands of conf/kubernetes/README.md ("With Helm"), run verbatim.

use std::path::Path;

use podgate_integration::k8s::{Cluster, NODES};
use podgate_integration::{bin_dir, output_text, podgate_command};
use serde_json::json;

use crate::install::warm_up;
use crate::nodes::{ip_forward, wait_until_agents_list_none_of, wait_until_as_before};
use crate::openvpn::pods;
use crate::policy::namespace_yaml;
use crate::upgrade::router_built_from;
use crate::world::{build_podgate_image, head_commit, sh_block, workdir, World};

const README: &str = "conf/kubernetes/README.md";
const HEADING: &str = "With Helm";
/// The namespace the shipped policy lets pick the vpn-gateway profile.
const NS: &str = "vpn";

/// Replicas of the greeter asking for vpn-gateway (forwarding on).
fn gateways(name: &str) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
      "metadata": {"name": name, "namespace": NS},
      "spec": {"replicas": 3, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}, "annotations": {"podgate.dev/profile": "vpn-gateway"}},
          "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "greeter", "image": "localhost/podgate/greeter:1", "imagePullPolicy": "Never"}]}}}})
    .to_string()
}

/// Runs a README block from `dir` with podgate's helper on PATH (the
/// operator's `podgate admission render`).
fn run(c: &Cluster, block: &str, dir: &Path) {
    let script = format!("export PATH=\"{}:$PATH\"\n{block}", bin_dir().display());
    let out = c.sh_in(&script, dir);
    assert!(
        out.status.success(),
        "{block}\nfailed:\n{}",
        output_text(&out)
    );
}

/// Creates the gateways `name` and waits for them to run.
fn start(c: &Cluster, name: &str) {
    c.apply(&gateways(name));
    c.kubectl_ok(&[
        "-n",
        NS,
        "rollout",
        "status",
        &format!("deploy/{name}"),
        "--timeout=300s",
    ]);
}

/// Checks each of the gateways `name` got forwarding on (asked of the
/// node's podgate pod: once podgate's rollout is over).
fn check(c: &Cluster, name: &str, when: &str) {
    for (pod, _, _) in pods(c, NS, &format!("app={name}")) {
        assert_eq!(ip_forward(c, NS, &pod), "1", "{pod}, created {when}");
    }
}

fn wired(c: &Cluster, name: &str, when: &str) {
    start(c, name);
    check(c, name, when);
}

fn policy_digest(c: &Cluster) -> String {
    let cm = c.kubectl_json(&["-n", "podgate-system", "get", "cm", "podgate-plugins"]);
    cm["metadata"]["annotations"]["podgate.dev/policy-digest"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn routers_built_from(world: &mut World, commit: &str, what: &str) {
    for node in NODES {
        assert!(
            router_built_from(world, node, commit),
            "{node}: not {what}'s router"
        );
    }
}

pub fn install_upgrade_rollback_and_uninstall_with_helm(world: &mut World) {
    assert!(
        !world.installed,
        "the Helm case runs where podgate is not installed (alone, or after the uninstall case)"
    );
    // The commit the image is built from (before its build).
    let old_commit = head_commit();
    let before = warm_up(world);
    // The operator's own policy: the shipped one, one more namespace
    // allowed (so that a reset to the chart's default would show).
    let mut policy: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(podgate_integration::workspace_root().join("conf/plugins.json"))
            .unwrap(),
    )
    .unwrap();
    for e in policy.as_array_mut().unwrap() {
        if e["type"] == "podgate-router" {
            e["allow"]["annotationNamespaces"] = json!([NS, "helm-extra"]);
        }
    }
    let policy = serde_json::to_string_pretty(&policy).unwrap();
    let dir = workdir(&[("plugins.json", &policy)]);
    let digest_out = podgate_command()
        .args(["admission", "digest", "--plugins"])
        .arg(dir.path().join("plugins.json"))
        .output()
        .unwrap();
    assert!(digest_out.status.success(), "{}", output_text(&digest_out));
    let digest = String::from_utf8_lossy(&digest_out.stdout)
        .trim()
        .to_string();

    let c = world.cluster();
    run(c, &sh_block(README, HEADING, "helm install"), dir.path());
    let ds = c.kubectl_json(&["-n", "podgate-system", "get", "ds", "podgate"]);
    assert_eq!(ds["status"]["numberReady"], 3, "{:#}", ds["status"]);
    assert_eq!(policy_digest(c), digest, "the ConfigMap's policy digest");
    let vap = c.kubectl_json(&["get", "validatingadmissionpolicy", "podgate-pods"]);
    assert_eq!(
        vap["metadata"]["annotations"]["podgate.dev/policy-digest"],
        digest.as_str()
    );
    let sa = c.kubectl_json(&["-n", "podgate-system", "get", "sa", "podgate"]);
    assert_eq!(sa["automountServiceAccountToken"], false);
    let bindings = c.kubectl_ok(&[
        "get",
        "rolebindings,clusterrolebindings",
        "-A",
        "-o",
        "wide",
    ]);
    assert!(
        !bindings.contains("podgate"),
        "a binding names podgate:\n{bindings}"
    );
    c.apply(&namespace_yaml(NS));
    wired(c, "installed", "after helm install");
    routers_built_from(world, &old_commit, "the installed image");

    // A new image: binaries of another commit, under a new tag; the same
    // tag and commit as the kubectl upgrade case's, so the build cache
    // serves it when both cases run.
    let new_commit = format!("upgrade-{}", &old_commit[..12]);
    let image = podgate_integration::image::manifest_name();
    let (repo, _) = image.rsplit_once(':').unwrap();
    let archive = build_podgate_image(&format!("{repo}:upgrade"), &new_commit);
    world.cluster().load_image(&archive);
    let c = world.cluster();
    let upgrade =
        sh_block(README, HEADING, "image.tag=").replace("image.tag=0.2.0", "image.tag=upgrade");
    // Pods created while the DaemonSet rolls node by node.
    std::thread::scope(|s| {
        let helm = s.spawn(|| run(c, &upgrade, dir.path()));
        start(c, "during");
        helm.join().unwrap();
    });
    check(world.cluster(), "during", "during helm upgrade");
    routers_built_from(world, &new_commit, "the upgraded image");
    let c = world.cluster();
    assert_eq!(policy_digest(c), digest, "the policy after helm upgrade");
    wired(c, "upgraded", "after helm upgrade");
    // The new binaries DEL what the old ones set up.
    c.kubectl_ok(&["-n", NS, "delete", "deploy", "installed", "--wait=true"]);

    std::thread::scope(|s| {
        let helm = s.spawn(|| run(c, &sh_block(README, HEADING, "helm rollback"), dir.path()));
        start(c, "rollback");
        helm.join().unwrap();
    });
    check(world.cluster(), "rollback", "during helm rollback");
    routers_built_from(world, &old_commit, "the rolled-back image");
    let c = world.cluster();
    assert_eq!(policy_digest(c), digest, "the policy after helm rollback");
    // The old binaries DEL what the new ones set up.
    c.kubectl_ok(&["-n", NS, "delete", "deploy", "upgraded", "--wait=true"]);

    // The uninstall sequence, in two parts: the step its comment names
    // (the pods podgate wired go) in between.
    let block = sh_block(README, HEADING, "uninstall=true");
    let (first, second) = block.split_at(block.find("# pods podgate wired").unwrap());
    run(c, first, dir.path());
    c.kubectl_ok(&["delete", "namespace", NS, "--wait=true", "--timeout=180s"]);
    wait_until_agents_list_none_of(c, &[NS]);
    run(c, second, dir.path());
    c.wait("the podgate-system namespace gone", 180, || {
        (!c.kubectl(&["get", "namespace", "podgate-system"])
            .status
            .success())
        .then_some(())
    });
    let vaps = c.kubectl_ok(&["get", "validatingadmissionpolicies", "-o", "name"]);
    assert!(!vaps.contains("podgate"), "{vaps}");
    wait_until_as_before(c, &before, "after the Helm uninstall", 120);
}
