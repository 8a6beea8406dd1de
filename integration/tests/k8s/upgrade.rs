//! Upgrade and uninstall through the API, as conf/kubernetes/README.md
//! says.

use podgate_integration::k8s::{Cluster, NODES};
use podgate_integration::{output_text, workspace_root};

use crate::install::the_image_is_installed;
use crate::lifecycle::ensure_policy;
use crate::nodes::{
    container_pids, podgate_pod, views, wait_until_agents_list_none_of, wait_until_as_before,
};
use crate::openvpn::pods;
use crate::policy::{pod_yaml, CHURN};
use crate::world::{build_podgate_image, head_commit, sh_block, workdir, World};

fn deployment(name: &str, replicas: u32) -> String {
    format!(
        r#"{{"apiVersion": "apps/v1", "kind": "Deployment",
  "metadata": {{"name": "{name}", "namespace": "{CHURN}"}},
  "spec": {{"replicas": {replicas}, "selector": {{"matchLabels": {{"app": "{name}"}}}},
    "template": {{"metadata": {{"labels": {{"app": "{name}"}}, "annotations": {{"podgate.dev/profile": "forwarder"}}}},
      "spec": {{"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
        "containers": [{{"name": "greeter", "image": "localhost/podgate/greeter:1", "imagePullPolicy": "Never"}}]}}}}}}}}"#
    )
}

/// The binaries of podgate's image, in `podgate`'s first.
const BINARIES: [&str; 3] = ["podgate", "podgate-router", "podgate-tunnel-guard"];

/// [`BINARIES`] as the image running on `node` holds them (read through
/// its installer's root).
fn image_binaries(c: &Cluster, node: &str) -> Vec<Vec<u8>> {
    let pod = podgate_pod(c, node);
    let pid = container_pids(c, "podgate-system", pod.trim_start_matches("pod/"))["install"];
    BINARIES
        .iter()
        .map(|b| std::fs::read(format!("/proc/{pid}/root/usr/local/bin/{b}")).unwrap())
        .collect()
}

/// Whether `node`'s installed podgate-router was built from `commit`.
pub fn router_built_from(world: &mut World, node: &str, commit: &str) -> bool {
    let bin = world
        .cluster()
        .host_path(node, "/opt/cni/bin/podgate-router");
    std::fs::read(bin).is_ok_and(|b| b.windows(commit.len()).any(|w| w == commit.as_bytes()))
}

pub fn an_upgrade_rolls_out_new_binaries_that_del_what_the_old_set_up(world: &mut World) {
    ensure_policy(world);
    let old_commit = head_commit();
    let c = world.cluster();
    let before = views(c);
    c.apply(&deployment("old", 3));
    c.apply(&pod_yaml(
        CHURN,
        "old-route",
        &[
            ("podgate.dev/profile", "forwarder"),
            ("podgate.dev/return-routes", "10.8.31.0/24"),
        ],
        false,
    ));
    c.kubectl_ok(&[
        "-n",
        CHURN,
        "rollout",
        "status",
        "deploy/old",
        "--timeout=180s",
    ]);
    c.wait_pod_ready(CHURN, "old-route");
    for node in NODES {
        assert!(
            router_built_from(world, node, &old_commit),
            "{node}: not the first image's router"
        );
    }

    let old_binaries = image_binaries(world.cluster(), "node-1");

    // A new image: another commit in `podgate --version`, so binaries that
    // differ in their bytes, under a new tag, put into podgate.yaml and
    // applied as the README says.
    let new_commit = format!("upgrade-{}", &old_commit[..12]);
    let image = podgate_integration::image::manifest_name();
    let new_image = format!(
        "{}:upgrade",
        image.rsplit_once(':').map_or(image.as_str(), |(r, _)| r)
    );
    let archive = build_podgate_image(&new_image, &new_commit);
    world.cluster().load_image(&archive);
    let c = world.cluster();
    let manifest = std::fs::read_to_string(workspace_root().join("conf/kubernetes/podgate.yaml"))
        .unwrap()
        .replace(&format!("image: {image}"), &format!("image: {new_image}"));
    c.apply(&manifest);
    // Pods created while the DaemonSet rolls node by node.
    c.apply(&deployment("during", 3));
    c.kubectl_ok(&[
        "-n",
        CHURN,
        "rollout",
        "status",
        "deploy/during",
        "--timeout=300s",
    ]);
    c.kubectl_ok(&[
        "-n",
        "podgate-system",
        "rollout",
        "status",
        "ds/podgate",
        "--timeout=300s",
    ]);
    for (name, _, _) in pods(c, CHURN, "app=during") {
        assert_eq!(
            crate::nodes::ip_forward(c, CHURN, &name),
            "1",
            "{name}, created during the rollout"
        );
    }
    for node in NODES {
        assert!(
            router_built_from(world, node, &new_commit),
            "{node}: the new image's router is not installed"
        );
        the_image_is_installed(world.cluster(), node, &new_commit);
        let new_binaries = image_binaries(world.cluster(), node);
        for ((bin, old), new) in BINARIES.iter().zip(&old_binaries).zip(&new_binaries) {
            assert!(old != new, "the two images' {bin} are the same");
        }
        for bin in &BINARIES[1..] {
            // A plugin run without CNI_COMMAND says which build it is.
            let path = world
                .cluster()
                .host_path(node, &format!("/opt/cni/bin/{bin}"));
            let about = std::process::Command::new(&path)
                .env_clear()
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            let about = String::from_utf8_lossy(&about.stderr);
            assert!(
                about.contains(&format!("commit {new_commit}")),
                "{node}'s {bin} does not name the new commit: {about}"
            );
        }
    }
    // The new binaries DEL what the old ones set up.
    let c = world.cluster();
    c.kubectl_ok(&[
        "-n",
        CHURN,
        "delete",
        "deploy",
        "old",
        "during",
        "--wait=true",
    ]);
    c.kubectl_ok(&["-n", CHURN, "delete", "pod", "old-route", "--wait=true"]);
    c.wait("the old and during pods gone", 120, || {
        (pods(c, CHURN, "app=old").is_empty() && pods(c, CHURN, "app=during").is_empty())
            .then_some(())
    });
    wait_until_as_before(
        c,
        &before,
        "after the new binaries deleted the old pods",
        60,
    );
}

pub fn the_documented_uninstall_leaves_every_node_as_before_the_install(world: &mut World) {
    ensure_policy(world);
    let before = world
        .before_install
        .take()
        .expect("the install case's snapshot");
    let c = world.cluster();
    // Alive when the uninstall starts: a strict pod, a return-route pod, a
    // masquerading pod.
    c.apply(&pod_yaml(
        CHURN,
        "strict",
        &[("podgate.dev/profile", "protected")],
        true,
    ));
    c.apply(&pod_yaml(
        CHURN,
        "routed",
        &[
            ("podgate.dev/profile", "forwarder"),
            ("podgate.dev/return-routes", "10.8.41.0/24"),
        ],
        false,
    ));
    c.apply(&crate::policy::namespace_yaml("vpn"));
    c.apply(&pod_yaml(
        "vpn",
        "masq",
        &[("podgate.dev/profile", "vpn-gateway")],
        false,
    ));
    for (ns, pod) in [(CHURN, "strict"), (CHURN, "routed"), ("vpn", "masq")] {
        c.wait_pod_ready(ns, pod);
    }
    // The strict pod's node-wide settings, which the uninstall must give
    // back once it is gone.
    let strict_node = crate::nodes::node_of(c, CHURN, "strict");
    let strict_on = || {
        c.node_sh_ok(&strict_node, "cat /proc/sys/net/ipv4/tcp_early_demux")
            .trim()
            == "0"
            && c.host_path(&strict_node, "/var/lib/cni/podgate/node/strict.json")
                .is_file()
    };
    assert!(strict_on(), "{strict_node}: the strict pod's node settings");
    // The sequence of "Upgrade and uninstall", verbatim, in two parts: the
    // step its comment names (the pods podgate wired go) in between.
    let block = sh_block(
        "conf/kubernetes/README.md",
        "Upgrade and uninstall",
        "podgate-uninstall.yaml",
    );
    let step = "# pods podgate wired that still run";
    let (first, second) = block.split_at(
        block
            .find(step)
            .expect("the uninstall block's restart step"),
    );
    let dir = workdir(&[]);
    let out = c.sh_in(first, dir.path());
    assert!(
        out.status.success(),
        "{first}\nfailed:\n{}",
        output_text(&out)
    );
    // Pods still running keep what podgate applied: the masquerading pod
    // its forwarding and table, the strict pod its node settings.
    crate::privilege::assert_vpn_wired(&crate::nodes::pod_netns(c, "vpn", "masq"));
    assert!(
        strict_on(),
        "{strict_node}: strict settings gone while the pod runs"
    );
    // Every workload of the earlier cases goes too: the node must end as it
    // was before the install, when it ran none.
    for ns in [CHURN, "vpn"] {
        let _ = c.kubectl(&["delete", "namespace", ns, "--wait=true", "--timeout=180s"]);
    }
    let _ = c.kubectl(&["delete", "ds", "greeter", "--wait=true"]);
    let _ = c.kubectl(&["delete", "svc", "greeter"]);
    c.wait("every test pod gone", 180, || {
        let all = c.kubectl_ok(&["get", "pods", "-A", "--no-headers"]);
        all.lines()
            .all(|l| l.starts_with("podgate-system "))
            .then_some(())
    });
    // The uninstall DaemonSet's agents sweep what the pods left.
    wait_until_agents_list_none_of(c, &[CHURN, "vpn"]);
    let out = c.sh_in(second, dir.path());
    assert!(
        out.status.success(),
        "{second}\nfailed:\n{}",
        output_text(&out)
    );
    c.wait("the podgate-system namespace gone", 180, || {
        (!c.kubectl(&["get", "namespace", "podgate-system"])
            .status
            .success())
        .then_some(())
    });
    wait_until_as_before(c, &before, "after the documented uninstall", 120);
    // Deleting the uninstall DaemonSet emptied podgate's state dirs (the
    // dirs themselves are the kubelet's, made for the hostPath volumes).
    for node in NODES {
        let mut left = Vec::new();
        for dir in ["/var/lib/cni/podgate", "/var/lib/podgate"] {
            files_under(&c.host_path(node, dir), &mut left);
        }
        assert!(left.is_empty(), "{node}: podgate's state left: {left:?}");
    }
    world.installed = false;
    world.policy_edited = false;
}

/// Every file (not directory) below `dir`.
fn files_under(dir: &std::path::Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            files_under(&e.path(), out);
        } else {
            out.push(e.path().display().to_string());
        }
    }
}
