//! What podgate left on the cluster's nodes, and the helper run where the
//! README runs it: in the `agent` container of the node's podgate pod.

use std::collections::BTreeMap;

use podgate_integration::k8s::{Cluster, NODES};
use podgate_integration::{state_files_in, Snapshot};
use serde_json::Value;

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
    let node = node_of(c, namespace, pod);
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

/// The node pod `namespace/pod` runs on.
pub fn node_of(c: &Cluster, namespace: &str, pod: &str) -> String {
    c.kubectl_ok(&[
        "-n",
        namespace,
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.spec.nodeName}",
    ])
    .trim()
    .to_string()
}

/// `crictl LIST -o json --label ...` of pod `namespace/pod` on its node:
/// the listing's items (`items` of `pods`, `containers` of `ps`).
fn crictl_of_pod(c: &Cluster, namespace: &str, pod: &str, list: &str) -> (String, Vec<Value>) {
    let node = node_of(c, namespace, pod);
    let out = c.node_sh_ok(
        &node,
        &format!(
            "crictl {list} -o json --label io.kubernetes.pod.namespace={namespace} \
             --label io.kubernetes.pod.name={pod}"
        ),
    );
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    let key = if list == "pods" {
        "items"
    } else {
        "containers"
    };
    (node, v[key].as_array().cloned().unwrap_or_default())
}

/// The ready sandbox of pod `namespace/pod`: its node and ID.
pub fn ready_sandbox(c: &Cluster, namespace: &str, pod: &str) -> (String, String) {
    let (node, items) = crictl_of_pod(c, namespace, pod, "pods");
    let id = items
        .iter()
        .find(|s| s["state"] == "SANDBOX_READY")
        .and_then(|s| s["id"].as_str())
        .unwrap_or_else(|| panic!("no ready sandbox of {namespace}/{pod} on {node}: {items:?}"))
        .to_string();
    (node, id)
}

/// `crictl inspectp`'s `info` of the ready sandbox of `namespace/pod`
/// (its `pid`, its `config`), as the pod's node reports it.
pub fn sandbox_info(c: &Cluster, namespace: &str, pod: &str) -> Value {
    let (node, id) = ready_sandbox(c, namespace, pod);
    let out = c.node_sh_ok(&node, &format!("crictl inspectp -o json {id}"));
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    v["info"].clone()
}

/// The netns of pod `namespace/pod`, by its sandbox's process on this
/// machine (the nodes share its PID namespace).
pub fn pod_netns(c: &Cluster, namespace: &str, pod: &str) -> std::path::PathBuf {
    let info = sandbox_info(c, namespace, pod);
    let pid = info["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid in crictl inspectp:\n{info:#}"));
    std::path::PathBuf::from(format!("/proc/{pid}/ns/net"))
}

/// The running containers of pod `namespace/pod`: name -> pid on this
/// machine.
pub fn container_pids(c: &Cluster, namespace: &str, pod: &str) -> BTreeMap<String, u32> {
    let (node, containers) = crictl_of_pod(c, namespace, pod, "ps");
    containers
        .iter()
        .filter(|k| k["state"] == "CONTAINER_RUNNING")
        .map(|k| {
            let id = k["id"].as_str().unwrap();
            let out = c.node_sh_ok(&node, &format!("crictl inspect -o json {id}"));
            let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}:\n{out}"));
            let pid = v["info"]["pid"].as_u64().unwrap();
            (
                k["metadata"]["name"].as_str().unwrap().to_string(),
                u32::try_from(pid).unwrap(),
            )
        })
        .collect()
}
