//! What the kubelet does that no stand-in did: refusals surfacing as pod
//! events, deletions of every kind, and restarts of the kubelet, containerd
//! and a whole node.

use podgate_integration::k8s::{cluster_sh, Cluster, NODES};
use podgate_integration::output_text;

use crate::install::ensure_installed;
use crate::nodes::{ip_forward, node_of, podgate, views, wait_until_as_before};
use crate::policy::{namespace_yaml, pod_yaml, sandbox_failure, CHURN};
use crate::world::World;

/// The policy the later cases need (profiles `forwarder`, `protected`).
pub fn ensure_policy(world: &mut World) {
    ensure_installed(world);
    if !world.policy_edited {
        crate::policy::an_edited_policy_reaches_new_sandboxes(world);
        world.policy_edited = true;
    }
}

pub fn a_refused_pod_waits_with_podgates_reason_in_its_events(world: &mut World) {
    ensure_installed(world);
    world
        .cluster()
        .load_image(&crate::world::test_image("greeter"));
    let c = world.cluster();
    c.apply(&namespace_yaml("not-allowed"));
    c.apply(&pod_yaml(
        "not-allowed",
        "wants-vpn",
        &[("podgate.dev/profile", "vpn-gateway")],
        false,
    ));
    let reason = c.wait("a FailedCreatePodSandBox event", 120, || {
        sandbox_failure(c, "not-allowed", "wants-vpn")
    });
    // One line, naming the plugin and the operator's rule that refused.
    assert!(!reason.contains('\n'), "{reason}");
    assert!(reason.contains("podgate-router"), "{reason}");
    assert!(reason.contains("allow.annotationNamespaces"), "{reason}");
    let describe = c.kubectl_ok(&["-n", "not-allowed", "describe", "pod", "wants-vpn"]);
    assert!(
        describe.contains("allow.annotationNamespaces"),
        "{describe}"
    );
    let pod = c.kubectl_json(&["-n", "not-allowed", "get", "pod", "wants-vpn"]);
    assert_eq!(pod["status"]["phase"], "Pending", "{:#}", pod["status"]);
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"], "ContainerCreating",
        "{:#}",
        pod["status"]
    );
    c.kubectl_ok(&["delete", "namespace", "not-allowed", "--wait=true"]);
}

/// A Deployment of `replicas` forwarding pods in `churn` (forwarding
/// only: a pool is claimed by one pod, so pods with pools are single pods).
fn forwarders(replicas: u32) -> String {
    format!(
        r#"{{"apiVersion": "apps/v1", "kind": "Deployment",
  "metadata": {{"name": "fwd", "namespace": "{CHURN}"}},
  "spec": {{"replicas": {replicas}, "selector": {{"matchLabels": {{"app": "fwd"}}}},
    "template": {{"metadata": {{"labels": {{"app": "fwd"}}, "annotations": {{"podgate.dev/profile": "forwarder"}}}},
      "spec": {{"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
        "containers": [{{"name": "greeter", "image": "localhost/podgate/greeter:1", "imagePullPolicy": "Never"}}]}}}}}}}}"#
    )
}

pub fn deletions_of_every_kind_leave_nothing_on_the_nodes(world: &mut World) {
    ensure_policy(world);
    let c = world.cluster();
    let before = views(c);

    // kubectl delete pod: a pod with a return route on its node.
    c.apply(&pod_yaml(
        CHURN,
        "router",
        &[
            ("podgate.dev/profile", "forwarder"),
            ("podgate.dev/return-routes", "10.8.7.0/24"),
        ],
        false,
    ));
    c.wait_pod_ready(CHURN, "router");
    let node = c.kubectl_ok(&[
        "-n",
        CHURN,
        "get",
        "pod",
        "router",
        "-o",
        "jsonpath={.spec.nodeName}",
    ]);
    let routes = c.node_sh_ok(node.trim(), "ip route show 10.8.7.0/24");
    assert!(
        routes.contains("10.8.7.0/24 via"),
        "no return route on {node}: {routes}"
    );
    c.kubectl_ok(&["-n", CHURN, "delete", "pod", "router", "--wait=true"]);
    wait_until_as_before(c, &before, "after kubectl delete pod", 60);

    // A Deployment scaled down, then its namespace deleted.
    c.apply(&forwarders(4));
    c.kubectl_ok(&[
        "-n",
        CHURN,
        "rollout",
        "status",
        "deploy/fwd",
        "--timeout=180s",
    ]);
    let pods = crate::openvpn::pods(c, CHURN, "app=fwd");
    assert_eq!(pods.len(), 4, "{pods:?}");
    for (name, _, _) in &pods {
        assert_eq!(ip_forward(c, CHURN, name), "1", "{name}");
    }
    c.kubectl_ok(&["-n", CHURN, "scale", "deploy/fwd", "--replicas=1"]);
    c.wait("the Deployment scaled down to one pod", 120, || {
        (crate::openvpn::pods(c, CHURN, "app=fwd").len() == 1).then_some(())
    });
    c.kubectl_ok(&["-n", CHURN, "delete", "deploy", "fwd", "--wait=true"]);
    c.wait("the last pod gone", 120, || {
        crate::openvpn::pods(c, CHURN, "app=fwd")
            .is_empty()
            .then_some(())
    });
    wait_until_as_before(
        c,
        &before,
        "after a scale-down and the Deployment's deletion",
        60,
    );

    // The namespace deleted with its pods in it, on both primaries.
    c.apply(&pod_yaml(
        CHURN,
        "ns-a",
        &[("podgate.dev/profile", "forwarder")],
        false,
    ));
    c.apply(&pod_yaml(
        CHURN,
        "ns-b",
        &[("podgate.dev/profile", "forwarder")],
        true,
    ));
    for pod in ["ns-a", "ns-b"] {
        c.wait_pod_ready(CHURN, pod);
    }
    c.kubectl_ok(&[
        "delete",
        "namespace",
        CHURN,
        "--wait=true",
        "--timeout=180s",
    ]);
    wait_until_as_before(c, &before, "after the namespace's deletion", 60);
    c.apply(&namespace_yaml(CHURN));
}

/// Every podgate attachment on every node holds (`podgate inspect --all`
/// in each agent exits 0) and the listing names each of `expected` (a
/// pool: attachments whose changes are all inside the pod keep no record).
fn all_hold(c: &Cluster, expected: &[&str]) {
    let mut listed = String::new();
    for node in NODES {
        let out = podgate(c, node, &["inspect", "--all"]);
        let text = output_text(&out);
        assert!(out.status.success(), "inspect --all on {node}:\n{text}");
        listed += &text;
    }
    for p in expected {
        assert!(
            listed.contains(p),
            "{p} not among the attachments:\n{listed}"
        );
    }
}

#[track_caller]
fn cluster_ok(args: &[&str]) {
    let out = cluster_sh(args).output().unwrap();
    assert!(
        out.status.success(),
        "cluster.sh {args:?}:\n{}",
        output_text(&out)
    );
}

pub fn restarts_and_a_reboot_end_with_every_pod_wired(world: &mut World) {
    ensure_policy(world);
    let c = world.cluster();
    c.apply(&pod_yaml(
        CHURN,
        "keep-fwd",
        &[("podgate.dev/profile", "forwarder")],
        true,
    ));
    c.apply(&pod_yaml(
        CHURN,
        "keep-route",
        &[
            ("podgate.dev/profile", "forwarder"),
            ("podgate.dev/return-routes", "10.8.9.0/24"),
        ],
        true,
    ));
    for pod in ["keep-fwd", "keep-route"] {
        c.wait_pod_ready(CHURN, pod);
    }
    let node = node_of(c, CHURN, "keep-fwd");
    assert_eq!(node, node_of(c, CHURN, "keep-route"));

    let check = |what: &str| {
        for pod in ["keep-fwd", "keep-route"] {
            c.wait_pod_ready(CHURN, pod);
            assert_eq!(
                ip_forward(c, CHURN, pod),
                "1",
                "after {what}: {pod}'s forwarding"
            );
        }
        let routes = c.node_sh_ok(&node, "ip route show 10.8.9.0/24");
        assert!(
            routes.contains("10.8.9.0/24 via"),
            "after {what}: no return route on {node}: {routes}"
        );
        all_hold(c, &["pool 10.8.9.0/24"]);
    };
    cluster_ok(&["restart", &node, "kubelet"]);
    check("a kubelet restart");
    cluster_ok(&["restart", &node, "containerd"]);
    check("a containerd restart");
    // A reboot: everything on the node stops, its netns and /run go, the
    // disk stays; the kubelet makes new sandboxes for the same pods.
    cluster_ok(&["stop-node", &node]);
    cluster_ok(&["start-node", &node, "--reboot"]);
    c.wait("the rebooted node Ready", 180, || {
        let out = c.kubectl(&[
            "wait",
            "--for=condition=Ready",
            &format!("node/{node}"),
            "--timeout=2s",
        ]);
        out.status.success().then_some(())
    });
    check("a reboot");
    c.kubectl_ok(&[
        "-n",
        CHURN,
        "delete",
        "pod",
        "keep-fwd",
        "keep-route",
        "--wait=true",
    ]);
}
