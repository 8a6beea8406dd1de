//! Adoption under a real containerd: pods created before podgate's
//! installer ran (the primary alone in the conf dir) get their profile from
//! the node agent once the runtime serves podgate's chain; pods created
//! while it is served, host-network pods and pods policy does not select
//! stay untouched; the runtime's later DEL removes what was adopted.
//!
//! The one-shot agent (`podgate agent --once`) under strace: killed at each
//! of its file, netlink and netns calls while it adopts a sandbox, the next
//! scan converges (adopted once, complete record, claims index as the
//! records say) and the runtime's DEL leaves the node as it was; paused
//! (strace delay) before it takes the pod, after its write-ahead record and
//! after the pod-side apply while the kubelet's StopPodSandbox +
//! RemovePodSandbox run: nothing is left and the agent says what happened.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::agent::{self, Agent};
use podgate_integration::containerd::Containerd;
use podgate_integration::cri::{in_netns, pod_nft, sysctl_in, Cri, Pod};
use podgate_integration::{
    assert_same, bin_dir, claims_index_matches_records, output_text, podgate_command, require_root,
    state_files_in, Snapshot, TempDir, TestNode,
};
use serde_json::{json, Value};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
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

/// The router's records (`<network>+<id>+<ifname>.json`), by file name;
/// not a writer's temp file (`.tmp-<pid>-<record file>`, maybe half
/// written).
fn record_files(node: &TestNode) -> Vec<String> {
    let mut v = node.state_files();
    v.retain(|f| {
        !f.contains('/') && !f.starts_with('.') && f.ends_with(".json") && f.contains('+')
    });
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
        .is_some_and(|h| h["router"]["firstLoaded"].is_u64())
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

/// The guard entry requiring IPsec (no protection here: not ready) in
/// `mode`, and the router's, as the plugins file.
fn write_guarded_plugins(node: &TestNode, mode: &str, assign: Value) {
    std::fs::write(
        node.root().join("plugins.json"),
        json!([
            {"type": "podgate-tunnel-guard", "required": "always", "mode": mode,
             "excludeNamespaces": ["kube-system"],
             "protectionDir": node.root().join("no-protection"),
             "ovsdbSocket": node.root().join("no-ovsdb.sock"),
             "eventFile": node.event_file()},
            router_entry(node, assign)
        ])
        .to_string(),
    )
    .unwrap();
}

/// The installer has seen the runtime serve an enforcing tunnel guard.
fn guard_enforcing(node: &TestNode) -> bool {
    std::fs::read(node.root().join("installer/runtime-chain.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|h| {
            h["guard"]["firstLoaded"].is_u64()
                && h["guard"]["missing"]
                    .as_array()
                    .is_some_and(|m| m.iter().all(|p| p["seenLoadedAgain"].is_u64()))
        })
}

/// Sandboxes created before the installer ran, on a node whose tunnel
/// guard requires IPsec (`required: always`, audit mode so pods still
/// start): the one in an ordinary namespace is counted unguarded; the one
/// in an excluded namespace and the host-network one are not. Once the
/// guard enforces (repairing while it audits would recreate them
/// unchecked again): with `--repair-unguarded --dry-run` nothing is
/// stopped and the agent says what it would stop; with
/// `--repair-unguarded` the unguarded sandbox is stopped through CRI and
/// the others keep running.
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
    write_guarded_plugins(&node, "audit", json!([]));
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
    let out = agent::inspect_unguarded(
        &c.endpoint(),
        &node.root().join("installer"),
        &node.root().join("plugins.json"),
    );
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

    write_guarded_plugins(node, "enforce", json!([]));
    let agent = Agent::start_with_args(node, &c.endpoint(), &["--repair-unguarded", "--dry-run"]);
    until("the guard enforcing", &agent, || guard_enforcing(node));
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

/// `podgate install --check` for `node`: the runtime loaded podgate's
/// entries as the plugins file has them (the readiness probe).
fn loaded_as_configured(c: &Containerd) -> bool {
    let node = c.node();
    let mut cmd = podgate_command();
    agent::install(&mut cmd, node, &node.root().join("plugins.json"))
        .args(["--check", "--runtime-endpoint", &c.endpoint()])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Pods the chain admitted while no tunnel guard checked them: one while
/// only podgate-router was in the chain the runtime served, one while the
/// guard was there in audit mode. Once the guard enforces and the node
/// requires IPsec, both are counted unguarded: the guard's own enforcing
/// history decides, not any podgate plugin being loaded (which counted
/// neither).
#[test]
fn pods_admitted_while_the_guard_was_absent_or_auditing_are_counted_unguarded() {
    require_root();
    podgate_integration::built_shipped();
    let node = TestNode::new("guardhist");
    node.refresh_cni_bin();
    node.write_conflist(
        "10-podnet",
        &node.bridge_conflist(NET, "1.0.0", "10.27.0.0/16", vec![]),
    );
    write_plugins(&node, json!([]));
    let c = Containerd::start(node);
    let node = c.node();
    let mut cri = Cri::connect(&c);
    let agent = Agent::start_with(node, &c.endpoint());
    until("the chain served", &agent, || {
        served(node) && loaded_as_configured(&c)
    });
    let router_only = cri.run(&c, &Pod::new("default", "router-only")).unwrap();

    write_guarded_plugins(node, "audit", json!([]));
    until("the auditing guard loaded", &agent, || {
        loaded_as_configured(&c)
    });
    let audited = cri.run(&c, &Pod::new("default", "audited")).unwrap();

    write_guarded_plugins(node, "enforce", json!([]));
    until("the guard enforcing", &agent, || guard_enforcing(node));
    agent::wait_for(node, &agent, "podgate_unguarded_sandboxes 2", |b| {
        b.lines().any(|l| l == "podgate_unguarded_sandboxes 2")
    });
    drop(agent);
    for id in [&router_only, &audited] {
        cri.stop_and_remove(id);
    }
}

/// `runtime-chain.json` lost while the chain is served (deleted here; a
/// file of another version reads the same): the watch's next look sees
/// the chain served, which says nothing of the sandboxes created before
/// it. A pod that went through the chain (router and enforcing guard,
/// IPsec not required then) is then neither adopted by an `assign` rule
/// added since nor stopped by `--repair-unguarded` once the node requires
/// IPsec; a fresh history made every running sandbox a candidate.
#[test]
fn a_lost_history_adopts_and_repairs_nothing() {
    require_root();
    podgate_integration::built_shipped();
    let node = TestNode::new("losthist");
    node.refresh_cni_bin();
    node.write_conflist(
        "10-podnet",
        &node.bridge_conflist(NET, "1.0.0", "10.29.0.0/16", vec![]),
    );
    let protection = node.root().join("protection");
    std::fs::create_dir_all(&protection).unwrap();
    let plugins = |node: &TestNode, assign: Value| {
        json!([
            {"type": "podgate-tunnel-guard", "required": "auto", "mode": "enforce",
             "protectionDir": protection, "ovsdbSocket": node.root().join("no-ovsdb.sock"),
             "eventFile": node.event_file()},
            router_entry(node, assign)
        ])
        .to_string()
    };
    std::fs::write(node.root().join("plugins.json"), plugins(&node, json!([]))).unwrap();
    let c = Containerd::start(node);
    let node = c.node();
    let mut cri = Cri::connect(&c);
    let agent = Agent::start_with(node, &c.endpoint());
    until("the chain served", &agent, || {
        served(node) && guard_enforcing(node) && loaded_as_configured(&c)
    });
    let through = cri.run(&c, &Pod::new("vpn", "late-0")).unwrap();
    let ns = cri.netns(&through);
    let fresh = sysctl_in(&ns, "net.ipv4.ip_forward");
    agent.kill();

    std::fs::remove_file(node.root().join("installer/runtime-chain.json")).unwrap();
    let assign = json!([{"namespace": "vpn", "podNamePrefix": "late-", "profile": "vpn-gateway"}]);
    std::fs::write(node.root().join("plugins.json"), plugins(node, assign)).unwrap();
    std::fs::write(
        protection.join("required"),
        "IPsec output protection version 1\n",
    )
    .unwrap();
    let agent = Agent::start_with_args(node, &c.endpoint(), &["--repair-unguarded"]);
    until("the watch looked again", &agent, || served(node));
    // The node requires IPsec now: the guard is counted, and finds nothing.
    agent::wait_for(node, &agent, "podgate_unguarded_sandboxes 0", |b| {
        b.lines().any(|l| l == "podgate_unguarded_sandboxes 0")
    });
    // Several collections and scans (one a second).
    std::thread::sleep(Duration::from_secs(4));
    let log = agent.log();
    assert!(cri.ready(&through), "stopped as unguarded:\n{log}");
    assert!(
        record_of(&records(node), &through).is_none(),
        "adopted:\n{log}"
    );
    assert_eq!(sysctl_in(&ns, "net.ipv4.ip_forward"), fresh, "{log}");
    assert!(
        !log.contains("stopped unguarded") && !log.contains("adopted vpn/late-0"),
        "{log}"
    );
    drop(agent);
    cri.stop_and_remove(&through);
}

// ---- The one-shot agent under strace: kills and stops mid-adoption ----

/// The profile of the kill and stop tests: a pod sysctl, masquerade (the
/// pod's nf_tables table) and a return route on the node (a claim in the
/// claims index), for pods `vpn/kp-*`.
fn one_shot_plugins(node: &TestNode) -> Value {
    json!([node.router_entry(
        json!({"vpn-gateway": {
            "sysctls": {"net.ipv4.ip_forward": "1"},
            "masquerade": [{"source": "10.8.0.0/24"}],
            "returnRoutes": [{"dst": "10.8.0.0/24"}]
        }}),
        json!([{"namespace": "vpn", "podNamePrefix": "kp-", "profile": "vpn-gateway"}]),
    )])
}

/// How long the installer gets to see the runtime load a change.
const RELOAD: Duration = Duration::from_secs(20);

/// A containerd node for the one-shot agent: the bridge primary (its bridge
/// made by a first pod, then removed: `baseline` is the node before podgate
/// touched anything), the installer watching with `--primary` (so a file
/// sorting before podgate's opens a period in which the runtime serves the
/// primary alone, as a co-installer may), [`one_shot_plugins`].
struct OneShot {
    installer: Child,
    cri: Cri,
    c: Containerd,
    baseline: Snapshot,
    forwarding: String,
    pods: u32,
}

impl OneShot {
    fn start(tag: &str) -> OneShot {
        require_root();
        podgate_integration::built_shipped();
        let node = TestNode::new(tag);
        node.refresh_cni_bin();
        node.write_conflist("10-podnet", &Self::primary(&node));
        std::fs::write(
            node.root().join("plugins.json"),
            one_shot_plugins(&node).to_string(),
        )
        .unwrap();
        let c = Containerd::start(node);
        let mut cri = Cri::connect(&c);
        let warm = cri.run(&c, &Pod::new("default", "warm")).unwrap();
        cri.stop_and_remove(&warm);
        let node = c.node();
        let baseline = node.settled_snapshot();
        let forwarding = node.ns.sysctl_get("net.ipv4.ip_forward");
        let podgate = bin_dir().join("podgate");
        let installer = agent::install_watch(
            &mut node.ns.command(podgate.to_str().unwrap()),
            node,
            &node.root().join("plugins.json"),
        )
        .args(["--primary", "10-podnet.conflist"])
        .args(["--debounce-ms", "50", "--resync-secs", "1"])
        .args(["--runtime-endpoint", &c.endpoint()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(node.root().join("installer.log")).unwrap())
        .spawn()
        .unwrap();
        let s = OneShot {
            installer,
            cri,
            c,
            baseline,
            forwarding,
            pods: 0,
        };
        s.history_until("the chain served", |h| h["router"]["firstLoaded"].is_u64());
        s
    }

    fn primary(node: &TestNode) -> Value {
        node.bridge_conflist(NET, "1.0.0", "10.28.0.0/16", vec![])
    }

    fn node(&self) -> &TestNode {
        self.c.node()
    }

    /// The installer's record once `done` holds for it.
    fn history_until(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let node = self.node();
        let log = node.root().join("installer.log");
        agent::history_until(node, &log, RELOAD, what, done)
    }

    /// A sandbox `vpn/kp-N` created while the runtime serves the primary
    /// alone (a copy of it sorting before podgate's file), then the chain
    /// served again: a candidate the policy selects. Its ID and netns.
    fn pod_without_chain(&mut self) -> (String, PathBuf) {
        let missing = |h: &Value| h["router"]["missing"].as_array().map_or(0, Vec::len);
        let n = missing(&self.history_until("the record", |_| true));
        let hold = Self::primary(self.node());
        self.node().write_conflist("00-aaa", &hold);
        self.history_until("the chain missing", |h| {
            missing(h) == n + 1 && h["router"]["missing"][n]["seenLoadedAgain"].is_null()
        });
        let name = format!("kp-{}", self.pods);
        self.pods += 1;
        let id = self.cri.run(&self.c, &Pod::new("vpn", &name)).unwrap();
        self.node().remove_conflist("00-aaa");
        self.history_until("the chain served again", |h| {
            h["router"]["missing"][n]["seenLoadedAgain"].is_u64()
        });
        let netns = self.cri.netns(&id);
        (id, netns)
    }

    /// `podgate agent --once` in the node netns, under `strace` with these
    /// arguments unless there are none.
    fn once_cmd(&self, strace: &[String]) -> Command {
        let node = self.node();
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", node.ns.path().display()));
        if !strace.is_empty() {
            cmd.arg("strace").args(strace);
        }
        cmd.arg(bin_dir().join("podgate"));
        agent::agent(&mut cmd, node, &node.root().join("plugins.json"))
            .arg("--once")
            .args(["--runtime-endpoint", &self.c.endpoint()])
            .arg("--router-state-dir")
            .arg(node.state_dir())
            .arg("--agent-state-dir")
            .arg(node.root().join("agent"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn once(&self, strace: &[String]) -> Output {
        self.once_cmd(strace).output().unwrap()
    }

    /// Adopted exactly once: one record, complete (applied, adopted, the
    /// profile), forwarding and the nf_tables table in the sandbox, the
    /// return route on the node, the claims index as the records say.
    fn assert_adopted(&self, id: &str, netns: &Path, what: &str) {
        let node = self.node();
        let recs = records(node);
        assert_eq!(recs.len(), 1, "{what}: {:?}", record_files(node));
        let r = record_of(&recs, id).unwrap_or_else(|| panic!("{what}: no record of {id}"));
        assert_eq!(r["status"], "applied", "{what}: {r}");
        assert_eq!(r["adopted"], true, "{what}: {r}");
        assert_eq!(r["profile"], "vpn-gateway", "{what}: {r}");
        assert_eq!(
            r["nodeRoutes"].as_array().map(Vec::len),
            Some(1),
            "{what}: {r}"
        );
        assert_eq!(sysctl_in(netns, "net.ipv4.ip_forward"), "1", "{what}");
        assert!(pod_nft(netns).is_some(), "{what}: no nf_tables table");
        assert!(
            return_routes(node).contains("10.8.0.0/24"),
            "{what}: no return route: {}",
            return_routes(node)
        );
        claims_index_matches_records(&node.state_dir(), what);
    }

    /// StopPodSandbox + RemovePodSandbox were run: no record, no return
    /// route, no claim, and the node's links, addresses, routes, rules and
    /// nf_tables as before podgate (a moment given to settle).
    fn assert_clean(&self, what: &str) {
        let node = self.node();
        assert_eq!(
            state_files_in(&node.state_dir()),
            Vec::<String>::new(),
            "{what}"
        );
        assert_eq!(return_routes(node), "", "{what}");
        claims_index_matches_records(&node.state_dir(), what);
        assert_eq!(node.ns.sysctl_get("net.ipv4.ip_forward"), self.forwarding);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut now = node.snapshot();
        while now != self.baseline && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            now = node.snapshot();
        }
        if now != self.baseline {
            panic!(
                "{what}: the node is not as before:\n{}",
                self.baseline.diff(&now)
            );
        }
        assert_same(&self.baseline, &now);
    }
}

impl Drop for OneShot {
    fn drop(&mut self) {
        let _ = self.installer.kill();
        let _ = self.installer.wait();
    }
}

/// The node's return routes (podgate-router's route protocol, 94).
fn return_routes(node: &TestNode) -> String {
    node.ns
        .exec_ok(&["ip", "-4", "route", "show", "table", "all", "proto", "94"])
        .trim()
        .to_string()
}

fn strace_available() -> bool {
    Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The calls the kill points and pauses are counted on: entering a netns,
/// opening and writing files (records, claims, sysctls), renaming them
/// into place (the claims index by exchange, the old one then unlinked),
/// netlink (routes, addresses, nf_tables), connecting to CRI.
const CALLS: [&str; 11] = [
    "setns",
    "openat",
    "write",
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "sendto",
    "sendmsg",
    "connect",
];

/// One traced call: its name, its ordinal among calls of that name (from
/// 1, as strace's `when=` counts them) and its text.
#[derive(Debug, Clone)]
struct Call {
    name: String,
    nth: u32,
    text: String,
}

/// A clean `podgate agent --once` adopting one sandbox, traced: its calls
/// of [`CALLS`] in order (one thread: strace counts `when=` per thread),
/// and the sandbox's ID; then StopPodSandbox + RemovePodSandbox leave the
/// node as it was. The first adoption on a node also makes the claims
/// index's directory: trace a second one for the calls every later
/// adoption makes.
fn trace_adoption(s: &mut OneShot, dir: &TempDir) -> (Vec<Call>, String) {
    let (id, netns) = s.pod_without_chain();
    let counted = || -> u64 {
        std::fs::read(s.node().root().join("agent/metrics.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["counters"]["adopted"]["vpn-gateway"].as_u64())
            .unwrap_or(0)
    };
    let before = counted();
    let file = dir.path().join("trace");
    let out = s.once(&[
        "-f".into(),
        "-qq".into(),
        "-o".into(),
        file.display().to_string(),
        "-e".into(),
        format!("trace={}", CALLS.join(",")),
    ]);
    assert!(out.status.success(), "{}", output_text(&out));
    s.assert_adopted(&id, &netns, "a clean one-shot adoption");
    assert_eq!(counted(), before + 1, "the one-shot adoption is counted");
    let text = std::fs::read_to_string(&file).unwrap();
    let mut counts = std::collections::BTreeMap::<String, u32>::new();
    let mut calls = Vec::new();
    let mut pids = std::collections::BTreeSet::new();
    for line in text.lines() {
        let (pid, rest) = line.split_once(' ').unwrap_or(("", line));
        let rest = rest.trim_start();
        let Some(name) = rest.split_once('(').map(|(n, _)| n) else {
            continue;
        };
        if !CALLS.contains(&name) {
            continue;
        }
        pids.insert(pid.to_string());
        let nth = counts.entry(name.into()).or_default();
        *nth += 1;
        calls.push(Call {
            name: name.into(),
            nth: *nth,
            text: rest.into(),
        });
    }
    assert_eq!(pids.len(), 1, "one thread makes these calls: {pids:?}");
    s.cri.stop_and_remove(&id);
    s.assert_clean("a clean one-shot adoption, then Stop+Remove");
    (calls, id)
}

/// strace arguments: no output, `inject` as given.
fn inject(spec: String) -> Vec<String> {
    ["-f", "-qq", "-o", "/dev/null", "-e"]
        .map(String::from)
        .into_iter()
        .chain([spec])
        .collect()
}

/// The reference calls of an adoption, from the first `setns` (into the
/// sandbox, reading its addresses) on; the second traced adoption of the
/// node (see [`trace_adoption`]).
fn reference(s: &mut OneShot, dir: &TempDir) -> Vec<Call> {
    let (first, _) = trace_adoption(s, dir);
    let (calls, _) = trace_adoption(s, dir);
    assert!(
        first.len() >= calls.len(),
        "the first adoption makes the index dir"
    );
    let start = calls
        .iter()
        .position(|c| c.name == "setns")
        .expect("the adoption never entered the sandbox's netns");
    calls[start..].to_vec()
}

/// A [`OneShot`] node and the [`reference`] calls of an adoption there
/// (the trace kept in the dir).
fn traced_node(tag: &str) -> (OneShot, TempDir, Vec<Call>) {
    assert!(
        strace_available(),
        "strace is needed (integration/install-deps.sh)"
    );
    let mut s = OneShot::start(tag);
    let dir = TempDir::new(tag);
    let calls = reference(&mut s, &dir);
    (s, dir, calls)
}

/// `podgate agent --once` killed (SIGKILL from strace) at each call the
/// adoption makes, from entering the sandbox's netns to asking the runtime
/// whether the sandbox still runs (files opened read-only left out: a kill
/// there is the kill at the call before): after each kill a second one-shot scan,
/// unkilled, converges (the pod adopted exactly once, its record complete,
/// forwarding on, its nf_tables table and the node's return route there,
/// the claims index as rebuilt from the records), and StopPodSandbox +
/// RemovePodSandbox leave the node as before podgate. After the readiness
/// check (the report, the adoption counter, the stale sweep) every third
/// call is tried: nothing there changes the pod.
#[test]
fn a_one_shot_adoption_killed_at_any_call_converges_on_the_next_scan_and_leaves_nothing_after_del()
{
    let (mut s, _dir, calls) = traced_node("adoptkill");
    let checked = calls
        .iter()
        .position(|c| c.name == "connect")
        .expect("no readiness check after the adoption");
    // A file opened read-only changes nothing: a kill there is the kill
    // at the call before it.
    let writes =
        |c: &Call| c.name != "openat" || c.text.contains("O_WRONLY") || c.text.contains("O_RDWR");
    let points: Vec<(bool, &Call)> = calls
        .iter()
        .enumerate()
        .filter(|(i, c)| writes(c) && (*i <= checked || (i - checked) % 3 == 0))
        .map(|(i, c)| (i > checked, c))
        .collect();
    let started = Instant::now();
    for (tail, c) in &points {
        let what = format!("killed at {} #{} ({})", c.name, c.nth, c.text);
        let (id, netns) = s.pod_without_chain();
        let killed = s.once(&inject(format!(
            "inject={}:signal=KILL:when={}",
            c.name, c.nth
        )));
        // In the tail (report, counter, sweep) a `write` may come one
        // earlier or later than in the reference (tokio's wake-ups through
        // an eventfd): a run past its last such call finished the adoption.
        if !(*tail && killed.status.success()) {
            assert_eq!(
                killed.status.signal(),
                Some(libc::SIGKILL),
                "{what}: not killed\n{}",
                output_text(&killed)
            );
        }
        let again = s.once(&[]);
        assert!(
            again.status.success(),
            "{what}, then a scan:\n{}",
            output_text(&again)
        );
        s.assert_adopted(&id, &netns, &what);
        let third = s.once(&[]);
        let text = String::from_utf8_lossy(&third.stdout);
        assert!(
            third.status.success() && text.contains("nothing to adopt"),
            "{what}: a third scan changes nothing:\n{}",
            output_text(&third)
        );
        s.cri.stop_and_remove(&id);
        s.assert_clean(&format!("{what}, a scan, then Stop+Remove"));
    }
    println!(
        "{} kill points of {} calls from the first setns, in {:?}",
        points.len(),
        calls.len(),
        started.elapsed()
    );
}

/// The pod interface's addresses in a sandbox: `ip -o addr show dev eth0`
/// of one family, as `address/prefix`, in the kernel's listing order.
fn eth0_addresses(netns: &Path, family: &str) -> Vec<String> {
    let out = in_netns(netns, &["ip", "-o", family, "addr", "show", "dev", "eth0"]);
    assert!(out.status.success(), "{}", output_text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .skip_while(|w| !w.starts_with("inet"))
                .nth(1)
        })
        .map(str::to_string)
        .collect()
}

/// A pod with NET_ADMIN that started before the chain takes another pod's
/// address and lists it before its own (the test acts as the pod: its
/// addresses flushed, the other pod's added, then its own): the one-shot
/// scan refuses to adopt it, since its interface holds an address the
/// runtime does not report for the sandbox, names the pod and the rule,
/// exits 1 and counts the refusal (`podgate_refusals{rule="adoption"}`).
/// Nothing is bound to the foreign address: no record, no return route,
/// no claim, forwarding and nf_tables untouched in the pod. Stop + Remove
/// of both pods leave the node as before podgate.
#[test]
fn a_sandbox_holding_another_pods_address_is_refused_and_nothing_is_bound_to_it() {
    let mut s = OneShot::start("adoptforeign");
    let victim = s.cri.run(&s.c, &Pod::new("default", "victim")).unwrap();
    let victim_ns = s.cri.netns(&victim);
    let (id, netns) = s.pod_without_chain();
    let forwarding = sysctl_in(&netns, "net.ipv4.ip_forward");
    let [theirs] = &eth0_addresses(&victim_ns, "-4")[..] else {
        panic!("the victim has one IPv4 address")
    };
    let [own] = &eth0_addresses(&netns, "-4")[..] else {
        panic!("the pod has one IPv4 address")
    };
    let script = format!(
        "ip -4 addr flush dev eth0 && ip addr add {theirs} dev eth0 && \
         ip addr add {own} dev eth0 && ip route add default via 10.28.0.1"
    );
    let out = in_netns(&netns, &["sh", "-c", &script]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(eth0_addresses(&netns, "-4"), [theirs.clone(), own.clone()]);

    let out = s.once(&[]);
    let text = output_text(&out);
    let node = s.node();
    let bound = format!(
        "the pod's address {own}, the other pod's {theirs}\nrecords: {:?}\nreturn routes: {}",
        record_files(node),
        return_routes(node)
    );
    assert_eq!(out.status.code(), Some(1), "{text}\n{bound}");
    let theirs_ip = theirs.split('/').next().unwrap();
    assert!(
        text.lines().any(|l| l.contains("vpn/kp-0")
            && l.contains("refused by adoption")
            && l.contains(theirs_ip)),
        "the agent names the pod, the rule and the address:\n{text}"
    );
    assert!(record_files(node).is_empty(), "{bound}");
    assert_eq!(return_routes(node), "", "{bound}");
    assert_eq!(sysctl_in(&netns, "net.ipv4.ip_forward"), forwarding);
    assert_eq!(pod_nft(&netns), None);
    claims_index_matches_records(&node.state_dir(), "a refused adoption");
    let refusals = std::fs::read(node.root().join("agent/metrics.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v["counters"]["refusals"]["adoption"].as_u64());
    assert_eq!(refusals, Some(1), "the refusal is counted");

    s.cri.stop_and_remove(&id);
    s.cri.stop_and_remove(&victim);
    s.assert_clean("a refused adoption, then Stop+Remove");
}

/// How long the stop test pauses the agent (strace `delay_enter`/`delay_exit`).
const PAUSE: Duration = Duration::from_secs(4);

/// `podgate agent --once` paused (strace delays one call, [`PAUSE`]) while the
/// kubelet's StopPodSandbox + RemovePodSandbox run: (1) having opened the
/// pod's lock file, before it holds the pod (the runtime's DEL finds no
/// record; the agent finds the sandbox gone), (2) right after its
/// write-ahead record, before the node and pod sides (the runtime's DEL
/// waits for the pod's lock, then removes what the adoption applied), (3)
/// after the pod-side apply and the final record, before it asks whether
/// the sandbox still runs (the agent undoes it). Each time: the agent says
/// what happened to the pod and exits 0; no record, no return route, no
/// claim, and the node's links, routes, rules and nf_tables as before
/// podgate, after the agent's own run and one more scan. While the runtime
/// serves the primary alone, the one-shot scan exits 1 saying why.
#[test]
fn a_sandbox_stopped_mid_adoption_leaves_nothing_and_the_agent_says_so() {
    let (mut s, _dir, calls) = traced_node("adoptstop");
    let lock = calls
        .iter()
        .position(|c| c.name == "openat" && c.text.contains("\".pod-"))
        .expect("no pod lock opened");
    // Records are renamed into place relative to the state dir's handle.
    let pending = lock
        + calls[lock..]
            .iter()
            .position(|c| c.name.starts_with("rename") && c.text.contains(".json\""))
            .expect("no record written");
    let check = pending
        + calls[pending..]
            .iter()
            .position(|c| c.name == "connect")
            .expect("no readiness check");
    // What shows the agent is at the pause: the pod's lock file, or its
    // record with this status.
    let reached = |s: &OneShot, id: &str, sign: &str| match sign {
        "lock" => s
            .node()
            .state_dir()
            .join(format!(".pod-{id}.lock"))
            .exists(),
        status => record_of(&records(s.node()), id).is_some_and(|r| r["status"] == status),
    };
    // (when, the call, how it is delayed, what shows the agent is there,
    // what the agent must say of the pod).
    let pauses = [
        (
            "before it holds the pod",
            &calls[lock],
            "delay_exit",
            "lock",
            "stopped ",
        ),
        (
            "after the write-ahead record",
            &calls[pending],
            "delay_exit",
            "pending",
            "",
        ),
        (
            "after the pod-side apply",
            &calls[check],
            "delay_enter",
            "applied",
            "stopped while it was adopted: undone",
        ),
    ];
    for (when, c, delay, sign, says) in pauses {
        let what = format!("stopped {when} ({} #{} {delay})", c.name, c.nth);
        let (id, _) = s.pod_without_chain();
        let agent = s
            .once_cmd(&inject(format!(
                "inject={}:{delay}={}:when={}",
                c.name,
                PAUSE.as_micros(),
                c.nth
            )))
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !reached(&s, &id, sign) {
            assert!(
                Instant::now() < deadline,
                "{what}: the agent never got there"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let paused = Instant::now();
        s.cri.stop_and_remove(&id);
        // Before the write-ahead record and after the final one the pod is
        // not locked: Stop + Remove must finish inside the pause for the
        // case to be the one named (after the write-ahead record, the
        // runtime's DEL waits for the agent).
        assert!(
            sign == "pending" || paused.elapsed() < PAUSE,
            "{what}: StopPodSandbox + RemovePodSandbox took {:?}, longer than the pause",
            paused.elapsed()
        );
        let out = agent.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{what}:\n{}", output_text(&out));
        let pod = format!("vpn/kp-{}", s.pods - 1);
        assert!(
            text.lines().any(|l| l.contains(&pod) && l.contains(says)),
            "{what}: the agent names the pod:\n{}",
            output_text(&out)
        );
        println!("{what}: {}", text.trim());
        let again = s.once(&[]);
        assert!(
            again.status.success(),
            "{what}, a scan:\n{}",
            output_text(&again)
        );
        s.assert_clean(&what);
    }

    // While the runtime serves the primary alone, the one-shot scan does
    // not adopt and says why, with exit status 1.
    let hold = OneShot::primary(s.node());
    s.node().write_conflist("00-aaa", &hold);
    s.history_until("the chain missing", |h| {
        h["router"]["missing"]
            .as_array()
            .and_then(|m| m.last())
            .is_some_and(|m| m["seenLoadedAgain"].is_null())
    });
    let out = s.once(&[]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("not adopting: the runtime does not serve podgate's chain"),
        "{text}"
    );
}
