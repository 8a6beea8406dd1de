//! What podgate left on the cluster's nodes, and the helper run where the
//! README runs it: in the `agent` container of the node's podgate pod.

use std::collections::BTreeMap;

use podgate_integration::k8s::{Cluster, NODES};
use podgate_integration::{state_files_in, Snapshot};

/// A node as podgate touches it: its netns (routes, rules, nf_tables,
/// links; kube-proxy's tables left out) and podgate-router's state dir
/// (records, claims, strict settings; the agent's and installer's own
/// files and the event channel left out).
#[derive(Debug, PartialEq, Eq)]
pub struct NodeView {
    net: Snapshot,
    /// The node-wide settings strict routing changes and gives back.
    sysctls: Vec<String>,
    state: Vec<String>,
    /// The CNI dirs: conf files with a digest of their content, binaries.
    cni: Vec<String>,
}

/// Node sysctls podgate-router changes while strict pods exist.
const NODE_SYSCTLS: &[&str] = &[
    "net/ipv4/ip_forward",
    "net/ipv4/tcp_early_demux",
    "net/ipv4/udp_early_demux",
    "net/ipv4/conf/all/rp_filter",
    "net/ipv4/conf/uplink0/rp_filter",
    "net/ipv4/conf/uplink0/accept_local",
];

pub fn view(c: &Cluster, node: &str) -> NodeView {
    let mut state = state_files_in(&c.host_path(node, "/var/lib/cni/podgate"));
    state.retain(|f| {
        !(f.starts_with("agent/") || f.starts_with("installer/") || f.starts_with("events.jsonl"))
    });
    let mut net = c.node_snapshot(node);
    // iptables-nft's tables are the kubelet's and portmap's (podgate's own
    // tables are named podgate*).
    net.nft.retain(|e| {
        !podgate_integration::k8s::nft_entry_table(e)
            .is_some_and(|t| ["nat", "filter", "mangle"].contains(&t.as_str()))
    });
    let sysctls = c
        .node_sh_ok(
            node,
            &format!(
                "for k in {}; do echo \"$k $(cat /proc/sys/$k)\"; done",
                NODE_SYSCTLS.join(" ")
            ),
        )
        .lines()
        .map(String::from)
        .collect();
    let mut cni: Vec<String> = c
        .node_sh_ok(
            node,
            "cd /etc/cni/net.d && sha256sum * 2>/dev/null || true; ls /opt/cni/bin",
        )
        .lines()
        .map(String::from)
        .collect();
    cni.sort();
    NodeView {
        net,
        sysctls,
        state,
        cni,
    }
}

pub fn views(c: &Cluster) -> BTreeMap<&'static str, NodeView> {
    NODES.iter().map(|n| (*n, view(c, n))).collect()
}

/// What differs between two views of every node ("" when none).
pub fn diff(
    before: &BTreeMap<&'static str, NodeView>,
    after: &BTreeMap<&'static str, NodeView>,
) -> String {
    let mut out = String::new();
    for (node, b) in before {
        let a = &after[node];
        let net = b.net.diff(&a.net);
        if !net.is_empty() {
            out += &format!("== {node}\n{net}");
        }
        for (what, bl, al) in [("sysctls", &b.sysctls, &a.sysctls), ("cni", &b.cni, &a.cni)] {
            for x in bl.iter().filter(|x| !al.contains(x)) {
                out += &format!("== {node} {what} - {x}\n");
            }
            for x in al.iter().filter(|x| !bl.contains(x)) {
                out += &format!("== {node} {what} + {x}\n");
            }
        }
        for f in b.state.iter().filter(|f| !a.state.contains(f)) {
            out += &format!("== {node} state - {f}\n");
        }
        for f in a.state.iter().filter(|f| !b.state.contains(f)) {
            out += &format!("== {node} state + {f}\n");
        }
    }
    out
}

/// Waits until every node looks as in `before` (DELs, the sweep and
/// kube-proxy settle within seconds); panics with the difference.
#[track_caller]
pub fn wait_until_as_before(
    c: &Cluster,
    before: &BTreeMap<&'static str, NodeView>,
    what: &str,
    secs: u64,
) {
    let mut last = String::new();
    let settled = c.wait_opt(secs, || {
        last = diff(before, &views(c));
        last.is_empty().then_some(())
    });
    assert!(
        settled.is_some(),
        "{what}: the nodes are not as before:\n{last}"
    );
}

/// The podgate pod on `node` (`pod/<name>`), Ready or not.
pub fn podgate_pod(c: &Cluster, node: &str) -> String {
    c.kubectl_ok(&[
        "-n",
        "podgate-system",
        "get",
        "pod",
        "-l",
        "app.kubernetes.io/name=podgate",
        "--field-selector",
        &format!("spec.nodeName={node}"),
        "-o",
        "name",
    ])
    .trim()
    .to_string()
}

/// `podgate ARGS` in the agent container of `node`'s podgate pod. A
/// kubelet or node that just restarted answers exec only once it has synced
/// its pods again: an exec it refuses ("unable to upgrade connection",
/// "container not found") is tried again for up to two minutes.
pub fn podgate(c: &Cluster, node: &str, args: &[&str]) -> std::process::Output {
    let mut last = None;
    for _ in 0..120 {
        let pod = podgate_pod(c, node);
        let mut full = vec![
            "-n",
            "podgate-system",
            "exec",
            &pod,
            "-c",
            "agent",
            "--",
            "podgate",
        ];
        full.extend_from_slice(args);
        let out = c.kubectl(&full);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let not_yet = pod.is_empty()
            || stderr.contains("unable to upgrade connection")
            || stderr.contains("container not found")
            || stderr.contains("is not running")
            || stderr.contains("does not have a host assigned");
        if !not_yet {
            return out;
        }
        last = Some(out);
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    last.unwrap()
}

/// `net.ipv4.ip_forward` of a pod, as the helper on its node reads it.
pub fn ip_forward(c: &Cluster, namespace: &str, pod: &str) -> String {
    let node = c
        .kubectl_ok(&[
            "-n",
            namespace,
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.spec.nodeName}",
        ])
        .trim()
        .to_string();
    let out = podgate(
        c,
        &node,
        &[
            "sysctl",
            "get",
            "--k8s-pod",
            &format!("{namespace}/{pod}"),
            "net.ipv4.ip_forward",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "sysctl get {namespace}/{pod}:\n{}",
        podgate_integration::output_text(&out)
    );
    text.trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Waits until `podgate inspect --all` in every uninstall DaemonSet pod's
/// agent lists no pod of `namespaces` (its sweep removed their records).
pub fn wait_until_agents_list_none_of(c: &Cluster, namespaces: &[&str]) {
    c.wait(
        "podgate inspect --all listing nothing on every node",
        120,
        || {
            NODES
                .iter()
                .all(|n| {
                    let pod = c.kubectl_ok(&[
                        "-n",
                        "podgate-system",
                        "get",
                        "pod",
                        "-l",
                        "app.kubernetes.io/name=podgate-uninstall",
                        "--field-selector",
                        &format!("spec.nodeName={n}"),
                        "-o",
                        "name",
                    ]);
                    let out = c.kubectl(&[
                        "-n",
                        "podgate-system",
                        "exec",
                        pod.trim(),
                        "-c",
                        "agent",
                        "--",
                        "podgate",
                        "inspect",
                        "--all",
                    ]);
                    let listed = String::from_utf8_lossy(&out.stdout);
                    out.status.success()
                        && namespaces
                            .iter()
                            .all(|ns| !listed.contains(&format!("{ns}/")))
                })
                .then_some(())
        },
    );
}
