//! Adoption under a real containerd: pods created before podgate's
//! installer ran (the primary alone in the conf dir) get their profile from
//! the node agent once the runtime serves podgate's chain; pods created
//! while it is served, host-network pods and pods policy does not select
//! stay untouched; the runtime's later DEL removes what was adopted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::agent::{self, Agent};
use podgate_integration::containerd::Containerd;
use podgate_integration::cri::{pod_nft, sysctl_in, Cri, Pod};
use podgate_integration::{require_root, TestNode};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const NET: &str = "podnet";

fn router_entry(node: &TestNode, assign: Value) -> Value {
    json!({
        "type": "podgate-router",
        "stateDir": node.state_dir(),
        "capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "allow": {"annotationNamespaces": ["ann"], "pools": ["10.8.0.0/16"]},
        "profiles": {"vpn-gateway": {
            "sysctls": {"net.ipv4.ip_forward": "1"},
            "masquerade": [{"source": "10.8.0.0/24"}]
        }},
        "assign": assign
    })
}

fn write_plugins(node: &TestNode, assign: Value) {
    std::fs::write(
        node.root().join("plugins.json"),
        json!([router_entry(node, assign)]).to_string(),
    )
    .unwrap();
}

/// The router's records (`<network>+<id>+<ifname>.json`), by file name.
fn record_files(node: &TestNode) -> Vec<String> {
    let mut v = node.state_files();
    v.retain(|f| !f.contains('/') && f.ends_with(".json") && f.contains('+'));
    v
}

/// The records in the router's state dir, parsed.
fn records(node: &TestNode) -> Vec<Value> {
    record_files(node)
        .iter()
        .map(|f| serde_json::from_slice(&std::fs::read(node.state_dir().join(f)).unwrap()).unwrap())
        .collect()
}

fn record_of<'a>(recs: &'a [Value], id: &str) -> Option<&'a Value> {
    recs.iter().find(|r| r["key"]["containerID"] == id)
}

/// The installer has seen the runtime serve the chain.
fn served(node: &TestNode) -> bool {
    std::fs::read(node.root().join("installer/runtime-chain.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|h| h["firstLoaded"].is_u64())
}

fn until(what: &str, agent: &Agent, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n--- agent log ---\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Pods created before the installer ran: the one `assign` selects and the
/// one whose annotation asks get forwarding and masquerade in their running
/// sandboxes and records marked adopted (counted by profile); a plain pod
/// and a host-network pod `assign` would match stay untouched; a pod
/// created while the chain is served and matched only by a later `assign`
/// rule is not adopted; scans are idempotent; StopPodSandbox +
/// RemovePodSandbox leave nothing.
#[test]
fn sandboxes_created_before_the_chain_are_adopted_and_later_ones_never() {
    require_root();
    podgate_integration::built_shipped();
    let node = TestNode::new("adopt");
    node.refresh_cni_bin();
    node.write_conflist(
        "10-podnet",
        &node.bridge_conflist(NET, "1.0.0", "10.24.0.0/16", vec![]),
    );
    let assign =
        json!([{"namespace": "vpn", "podNamePrefix": "openvpn-", "profile": "vpn-gateway"}]);
    write_plugins(&node, assign.clone());
    let c = Containerd::start(node);
    let node = c.node();
    let mut cri = Cri::connect(&c);
    let node_forwarding = node.ns.sysctl_get("net.ipv4.ip_forward");

    // Before podgate's installer: the primary alone wires these.
    let by_assign = cri.run(&c, &Pod::new("vpn", "openvpn-0")).unwrap();
    let by_annotation = cri
        .run(
            &c,
            &Pod {
                annotations: &[("podgate.dev/profile", "vpn-gateway")],
                ..Pod::new("ann", "gw-0")
            },
        )
        .unwrap();
    let plain = cri.run(&c, &Pod::new("default", "web-0")).unwrap();
    let host = cri
        .run(
            &c,
            &Pod {
                host_network: true,
                ..Pod::new("vpn", "openvpn-host")
            },
        )
        .unwrap();
    let (assign_ns, ann_ns, plain_ns) = (
        cri.netns(&by_assign),
        cri.netns(&by_annotation),
        cri.netns(&plain),
    );
    let fresh = sysctl_in(&plain_ns, "net.ipv4.ip_forward");
    assert_eq!(sysctl_in(&assign_ns, "net.ipv4.ip_forward"), fresh);
    assert!(record_files(node).is_empty(), "no podgate yet");

    let agent = Agent::start_with(node, &c.endpoint());
    // Served: a pod created now goes through the chain (no profile for it).
    until("the chain served", &agent, || served(node));
    let later = cri.run(&c, &Pod::new("vpn", "later-0")).unwrap();
    let later_ns = cri.netns(&later);

    until("both adopted", &agent, || {
        let r = records(node);
        record_of(&r, &by_assign).is_some() && record_of(&r, &by_annotation).is_some()
    });
    let recs = records(node);
    for (id, ns, source) in [
        (&by_assign, &assign_ns, "assign[0]"),
        (&by_annotation, &ann_ns, "annotation podgate.dev/profile"),
    ] {
        let r = record_of(&recs, id).unwrap();
        assert_eq!(r["adopted"], true, "{r}");
        assert_eq!(r["status"], "applied", "{r}");
        assert_eq!(r["profile"], "vpn-gateway", "{r}");
        assert_eq!(r["source"], source, "{r}");
        assert_eq!(r["key"]["network"], NET, "{r}");
        assert_eq!(sysctl_in(ns, "net.ipv4.ip_forward"), "1");
        let nft = pod_nft(ns).expect("podgate's nft table in the adopted sandbox");
        assert!(
            nft.contains("ip saddr 10.8.0.0/24 oifname \"eth0\" masquerade"),
            "{nft}"
        );
    }
    let metrics = agent::wait_for(node, &agent, "podgate_adopted_total", |b| {
        b.contains("podgate_adopted_total{profile=\"vpn-gateway\"} 2")
    });
    assert!(metrics.contains("podgate_adopted_total"), "{metrics}");
    assert!(
        agent.log().contains("adopted vpn/openvpn-0"),
        "{}",
        agent.log()
    );

    // Untouched: the plain pod, the host-network pod (the node's own
    // forwarding), the pod created while the chain was served.
    assert_eq!(records(node).len(), 2, "{:?}", record_files(node));
    assert_eq!(sysctl_in(&plain_ns, "net.ipv4.ip_forward"), fresh);
    assert_eq!(pod_nft(&plain_ns), None);
    assert_eq!(node.ns.sysctl_get("net.ipv4.ip_forward"), node_forwarding);
    assert_eq!(sysctl_in(&later_ns, "net.ipv4.ip_forward"), fresh);

    // A policy change does not reach pods already running through the chain.
    let mut wider = assign.as_array().unwrap().clone();
    wider.push(json!({"namespace": "vpn", "podNamePrefix": "later-", "profile": "vpn-gateway"}));
    write_plugins(node, Value::Array(wider));
    let rendered = || {
        std::fs::read_to_string(node.conf_dir().join("00-podgate.conflist"))
            .is_ok_and(|t| t.contains("later-"))
    };
    until("the wider assign rendered", &agent, rendered);
    let snapshot: Vec<_> = record_files(node)
        .iter()
        .map(|f| std::fs::read(node.state_dir().join(f)).unwrap())
        .collect();
    // Several scans (one a second).
    std::thread::sleep(Duration::from_secs(4));
    let again: Vec<_> = record_files(node)
        .iter()
        .map(|f| std::fs::read(node.state_dir().join(f)).unwrap())
        .collect();
    assert_eq!(again, snapshot, "later scans change nothing");
    assert_eq!(sysctl_in(&later_ns, "net.ipv4.ip_forward"), fresh);
    assert_eq!(pod_nft(&later_ns), None);
    assert!(
        !agent.log().contains("warning: adoption"),
        "{}",
        agent.log()
    );

    // The runtime's DEL goes through podgate's chain now: nothing is left.
    for id in [&by_assign, &by_annotation, &plain, &host, &later] {
        cri.stop_and_remove(id);
    }
    assert!(record_files(node).is_empty(), "{:?}", node.state_files());
    assert!(!assign_ns.exists() && !ann_ns.exists());
}

/// Sandboxes created before the installer ran, on a node whose tunnel
/// guard requires IPsec (`required: always`, audit mode so pods still
/// start): the one in an ordinary namespace is counted unguarded; the one
/// in an excluded namespace and the host-network one are not. With
/// `--repair-unguarded --dry-run` nothing is stopped and the agent says
/// what it would stop; with `--repair-unguarded` the unguarded sandbox is
/// stopped through CRI and the others keep running.
#[test]
fn unguarded_sandboxes_are_reported_and_stopped_only_when_asked() {
    require_root();
    podgate_integration::built_shipped();
    let node = TestNode::new("unguard");
    node.refresh_cni_bin();
    node.write_conflist(
        "10-podnet",
        &node.bridge_conflist(NET, "1.0.0", "10.26.0.0/16", vec![]),
    );
    std::fs::write(
        node.root().join("plugins.json"),
        json!([
            {"type": "podgate-tunnel-guard", "required": "always", "mode": "audit",
             "excludeNamespaces": ["kube-system"],
             "protectionDir": node.root().join("no-protection"),
             "ovsdbSocket": node.root().join("no-ovsdb.sock")},
            router_entry(&node, json!([]))
        ])
        .to_string(),
    )
    .unwrap();
    let c = Containerd::start(node);
    let node = c.node();
    let mut cri = Cri::connect(&c);
    let open = cri.run(&c, &Pod::new("default", "web-0")).unwrap();
    let excluded = cri.run(&c, &Pod::new("kube-system", "dns-0")).unwrap();
    let host = cri
        .run(
            &c,
            &Pod {
                host_network: true,
                ..Pod::new("default", "node-exporter")
            },
        )
        .unwrap();

    let agent = Agent::start_with(node, &c.endpoint());
    agent::wait_for(node, &agent, "podgate_unguarded_sandboxes 1", |b| {
        b.lines().any(|l| l == "podgate_unguarded_sandboxes 1")
    });
    assert!(cri.ready(&open), "reported, not stopped without the flag");
    until("the chain served", &agent, || served(node));
    let out = std::process::Command::new(podgate_integration::bin_dir().join("podgate"))
        .args([
            "inspect",
            "--unguarded",
            "--runtime-endpoint",
            &c.endpoint(),
        ])
        .arg("--installer-state-dir")
        .arg(node.root().join("installer"))
        .arg("--plugins")
        .arg(node.root().join("plugins.json"))
        .output()
        .unwrap();
    let text = podgate_integration::output_text(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a problem found exits 2: {text}"
    );
    assert!(
        text.contains(&format!("unguarded default/web-0 sandbox {open}")),
        "{text}"
    );
    assert!(
        !text.contains("dns-0") && !text.contains("node-exporter"),
        "{text}"
    );
    agent.kill();

    let agent = Agent::start_with_args(node, &c.endpoint(), &["--repair-unguarded", "--dry-run"]);
    until("the dry run's line", &agent, || {
        agent
            .log()
            .contains("dry run: would stop unguarded default/web-0")
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(cri.ready(&open), "a dry run stops nothing");
    assert!(
        !agent.log().contains("kube-system/dns-0"),
        "{}",
        agent.log()
    );
    agent.kill();

    let agent = Agent::start_with_args(node, &c.endpoint(), &["--repair-unguarded"]);
    until("the unguarded sandbox stopped", &agent, || {
        agent.log().contains("stopped unguarded default/web-0")
    });
    assert!(!cri.ready(&open), "stopped through CRI");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        cri.ready(&excluded),
        "an excluded namespace is never stopped"
    );
    assert!(cri.ready(&host), "a host-network sandbox is never stopped");
    drop(agent);
    for id in [&open, &excluded, &host] {
        cri.stop_and_remove(id);
    }
}
