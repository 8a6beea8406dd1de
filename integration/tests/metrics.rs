//! The node agent's metrics end to end: `podgate install --watch` inside a
//! test node netns chains podgate into a bridge primary and `podgate agent`
//! serves the metrics; pods are ADDed through the real libcni and the real plugins
//! (applied, refused, passed through) and one router ADD is killed half-way;
//! `/metrics` must show each, pass `promtool check metrics`, follow drift and
//! stale records, and keep its counters across a SIGKILLed agent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::agent::{wait_for, Agent, METRICS_PORT as PORT};
use podgate_integration::{bin_dir, http_get, require_root, run_with_stdin, Netns, TestNode, Verb};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::Duration;

const NET: &str = "metricsnet";

fn pod_args(ns: &str, name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}")
}

fn entries(node: &TestNode) -> Value {
    json!([
        {"type": "podgate-tunnel-guard", "required": "always", "mode": "audit",
         "agentSocket": node.root().join("no-agent/status.sock"),
         "eventFile": node.event_file()},
        {"type": "podgate-router", "stateDir": node.state_dir(),
         "logFile": node.root().join("router.log"),
         "capabilities": {"io.kubernetes.cri.pod-annotations": true},
         "profiles": {"vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"},
                                      "masquerade": [{"source": "10.8.0.0/24"}]}},
         "assign": [{"namespace": "vpn", "podNamePrefix": "openvpn-gw", "profile": "vpn-gateway"}],
         "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]}}
    ])
}

/// The value of the sample `series` (name plus labels exactly as rendered).
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn requests(plugin: &str, command: &str, outcome: &str) -> String {
    format!(
        "podgate_cni_requests_total{{plugin=\"{plugin}\",command=\"{command}\",outcome=\"{outcome}\"}}"
    )
}

/// podgate-router ADD run directly (as libcni runs it) under strace, killed
/// at the main thread's third rename(2) (strace counts per thread): the
/// first renames its in-flight mark into place, the second the write-ahead
/// (pending) record, the third would put the `applied` record in place
/// after everything was applied. Returns the signal that ended it.
fn router_add_killed_half_way(node: &TestNode, pod: &Netns) -> Option<i32> {
    let mut conf = entries(node)[1].clone();
    conf["cniVersion"] = json!("1.0.0");
    conf["name"] = json!(NET);
    conf["prevResult"] = json!({"cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": pod.path()}],
        "ips": [{"address": "10.24.9.5/24", "interface": 0}]});
    let out = run_with_stdin(
        node.ns
            .command("strace")
            .args([
                "-f",
                "-qq",
                "-o",
                "/dev/null",
                "-e",
                "trace=rename,renameat,renameat2",
                "-e",
                "inject=rename,renameat,renameat2:signal=KILL:when=3",
            ])
            .arg(bin_dir().join("podgate-router"))
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", "crashed-1")
            .env("CNI_NETNS", pod.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", node.cni_bin_dir())
            .env("CNI_ARGS", pod_args("vpn", "openvpn-gw-crash"))
            .stderr(Stdio::piped()),
        conf.to_string().as_bytes(),
    );
    // strace exits with the tracee's signal re-raised or as 128+signal.
    out.signal
        .or_else(|| out.code.filter(|c| *c > 128).map(|c| c - 128))
}

/// A node whose primary is alone in its conf dir, [`entries`] as the
/// plugins file, and the installer and agent started: the agent chains
/// podgate after the primary.
fn node_with_agent(prefix: &str) -> (TestNode, Agent) {
    require_root();
    podgate_integration::built_shipped();
    let node = TestNode::new(prefix);
    node.write_conflist(
        &format!("10-{NET}"),
        &node.bridge_conflist(NET, "1.0.0", "10.24.0.0/16", vec![]),
    );
    std::fs::write(
        node.root().join("plugins.json"),
        serde_json::to_vec(&entries(&node)).unwrap(),
    )
    .unwrap();
    let agent = Agent::start(&node);
    wait_for(&node, &agent, "install ready", |b| {
        value(b, "podgate_install_ready") == Some(1.0)
    });
    (node, agent)
}

#[test]
fn agent_metrics_count_every_outcome_pass_promtool_and_survive_a_restart() {
    let (node, agent) = node_with_agent("metrics");
    assert!(node.event_file().is_file(), "the agent makes the channel");
    let pods = add_every_outcome(&node);
    let body = every_outcome_counted(&node, &agent);
    promtool_passes_and_only_metrics_is_served(&node, &body);
    drift_is_followed(&node, &agent, &pods.gw);
    let agent = counters_survive_a_restart(&node, agent, &body, &pods.gw);
    stale_is_followed_then_everything_deleted(&node, &agent, pods);
    agent.kill();
}

/// The pods of [`add_every_outcome`].
struct Pods {
    gw: Netns,
    plain: Netns,
    other: Netns,
    _crash: Netns,
}

fn add(node: &TestNode, pod: &Netns, ns: &str, name: &str) -> podgate_integration::CniOutcome {
    node.cni(Verb::Add, NET, pod, "eth0", Some(&pod_args(ns, name)), None)
}

/// ADDs with every outcome: a profile applied (the gateway), a pass-through
/// (plain), a refusal (a pod outside allow.annotationNamespaces asking
/// for a profile, through the runner for its CNI error code), and a router
/// ADD killed half-way.
fn add_every_outcome(node: &TestNode) -> Pods {
    let gw = node.pod("openvpn-gw-0");
    gw.set_forwarding(false);
    let plain = node.pod("plain");
    let other = node.pod("other");
    add(node, &gw, "vpn", "openvpn-gw-0").assert_ok();
    add(node, &plain, "vpn", "plain").assert_ok();
    // A pod outside allow.annotationNamespaces asking for a profile (the
    // runner: its CNI error code).
    node.runner(
        Verb::Add,
        NET,
        other.path(),
        "other",
        "eth0",
        Some(&pod_args("default", "other")),
        Some(json!({"io.kubernetes.cri.pod-annotations": {"podgate.dev/profile": "vpn-gateway"}})),
    )
    .assert_cni_error(100);
    let crash_pod = node.pod("crash");
    assert_eq!(
        router_add_killed_half_way(node, &crash_pod),
        Some(libc::SIGKILL),
        "the router ADD must die at the injected point"
    );
    Pods {
        gw,
        plain,
        other,
        _crash: crash_pod,
    }
}

/// `/metrics` once every ADD is counted: by outcome, refusal rule and
/// duration; records, pending, drift; the guard's IPsec state.
fn every_outcome_counted(node: &TestNode, agent: &Agent) -> String {
    let router = "podgate-router";
    let guard = "podgate-tunnel-guard";
    let body = wait_for(node, agent, "every ADD counted", |b| {
        value(b, &requests(router, "ADD", "crashed")) == Some(1.0)
            && value(b, &requests(router, "ADD", "ok")) == Some(2.0)
    });
    assert_eq!(
        value(&body, &requests(router, "ADD", "refused")),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        value(&body, &requests(guard, "ADD", "ok")),
        Some(3.0),
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            "podgate_refusals_total{rule=\"allow.annotationNamespaces\"}"
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            "podgate_cni_request_duration_seconds_count{plugin=\"podgate-router\",command=\"ADD\"}"
        ),
        Some(3.0),
        "crashed requests have no duration: {body}"
    );
    assert_eq!(
        value(
            &body,
            &format!(
                "podgate_attachments{{network=\"{NET}\",profile=\"vpn-gateway\",routing=\"none\"}}"
            )
        ),
        Some(2.0),
        "the applied gateway and the write-ahead record of the crashed ADD: {body}"
    );
    assert_eq!(value(&body, "podgate_records_stale"), Some(0.0), "{body}");
    assert_eq!(
        value(&body, "podgate_records_pending"),
        Some(1.0),
        "the ADD killed half-way left its pending record for DEL: {body}"
    );
    assert_eq!(
        value(&body, "podgate_attachment_drift"),
        Some(1.0),
        "a pending record does not hold: {body}"
    );
    assert_eq!(value(&body, "podgate_ipsec_ready"), Some(0.0), "{body}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("podgate_ipsec_checks_failed{check=") && l.ends_with(" 1")),
        "the missing agent is a failed check: {body}"
    );
    body
}

fn promtool_passes_and_only_metrics_is_served(node: &TestNode, body: &str) {
    // promtool, from Debian's prometheus package.
    let out = run_with_stdin(
        Command::new("promtool")
            .args(["check", "metrics"])
            .stderr(Stdio::piped()),
        body.as_bytes(),
    );
    assert!(
        out.code == Some(0),
        "promtool (Debian package prometheus) check metrics:\n{out:?}\n{body}"
    );

    // Only GET /metrics.
    let (status, _) = http_get(
        &node.ns,
        "127.0.0.1",
        PORT,
        "/debug",
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(status, 404);
}

fn drift_is_followed(node: &TestNode, agent: &Agent, gw: &Netns) {
    // Drift: someone turns forwarding back off in the router pod.
    gw.sysctl_set("net.ipv4.ip_forward", "0");
    wait_for(node, agent, "drift 1", |b| {
        value(b, "podgate_attachment_drift") == Some(1.0)
    });
    gw.sysctl_set("net.ipv4.ip_forward", "1");
}

/// Returns the restarted agent.
fn counters_survive_a_restart(node: &TestNode, agent: Agent, body: &str, gw: &Netns) -> Agent {
    let router = "podgate-router";
    // A SIGKILLed agent comes back with the same counters, then counts on.
    agent.kill();
    let agent = Agent::start(node);
    let after = wait_for(node, &agent, "restarted agent", |b| {
        value(b, "podgate_install_ready") == Some(1.0)
    });
    let counters = |b: &str| -> Vec<String> {
        b.lines()
            .filter(|l| {
                l.starts_with("podgate_cni_requests_total")
                    || l.starts_with("podgate_refusals_total")
                    || l.starts_with("podgate_cni_request_duration_seconds_count")
            })
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        counters(body),
        counters(&after),
        "no double count after a restart"
    );
    node.cni(
        Verb::Del,
        NET,
        gw,
        "eth0",
        Some(&pod_args("vpn", "openvpn-gw-0")),
        None,
    )
    .assert_ok();
    let del = wait_for(node, &agent, "DEL counted", |b| {
        value(b, &requests(router, "DEL", "ok")) == Some(1.0)
    });
    assert_eq!(
        value(&del, &requests(router, "ADD", "ok")),
        Some(2.0),
        "{del}"
    );
    assert_eq!(
        value(&del, &requests(router, "ADD", "crashed")),
        Some(1.0),
        "{del}"
    );
    agent
}

fn stale_is_followed_then_everything_deleted(node: &TestNode, agent: &Agent, pods: Pods) {
    let Pods {
        gw, plain, other, ..
    } = pods;
    // Stale: a pod's netns is deleted before its DEL.
    add(node, &gw, "vpn", "openvpn-gw-0").assert_ok();
    let gw_path = gw.path().to_path_buf();
    drop(gw);
    assert!(!gw_path.exists());
    wait_for(node, agent, "stale 1", |b| {
        value(b, "podgate_records_stale") == Some(1.0)
    });
    node.cni_with_netns_path(
        Verb::Del,
        NET,
        &gw_path,
        "eth0",
        Some(&pod_args("vpn", "openvpn-gw-0")),
        None,
    )
    .assert_ok();
    node.cni(
        Verb::Del,
        NET,
        &plain,
        "eth0",
        Some(&pod_args("vpn", "plain")),
        None,
    )
    .assert_ok();
    node.runner(
        Verb::Del,
        NET,
        other.path(),
        "other",
        "eth0",
        Some(&pod_args("default", "other")),
        None,
    )
    .assert_ok();
}

/// A pod in a namespace that may choose its profile by annotation, ADDed by
/// a runtime that delivers no annotations (Multus, CRI-O before 1.29, a
/// conflist without the capability), passes through without its profile:
/// the router says why in a warning and the agent counts it. A pod whose
/// runtime delivered annotations (none of them podgate's), and a pod
/// outside `allow.annotationNamespaces`, get the plain info line.
#[test]
fn a_pod_that_could_not_choose_its_profile_by_annotation_is_a_counted_warning() {
    let (node, agent) = node_with_agent("noann");
    // Through the runner as container `name`: the log line is matched by
    // its container ID.
    let add = |name: &str, ns: &str, cap: Option<Value>| {
        let pod = node.pod(name);
        pod.set_forwarding(false);
        node.runner(
            Verb::Add,
            NET,
            pod.path(),
            name,
            "eth0",
            Some(&pod_args(ns, name)),
            cap,
        )
        .assert_ok();
        pod
    };
    let delivered = add(
        "delivered",
        "vpn",
        Some(json!({"io.kubernetes.cri.pod-annotations": {"app": "web"}})),
    );
    let outside = add("outside", "default", None);
    let blind = add("blind", "vpn", None);
    for pod in [&delivered, &outside, &blind] {
        assert_eq!(pod.sysctl_get("net.ipv4.ip_forward"), "0", "passed through");
    }

    let series = "podgate_cni_warnings_total{plugin=\"podgate-router\",warning=\"noAnnotations\"}";
    let body = wait_for(&node, &agent, "the warning counted", |b| {
        value(b, &requests("podgate-router", "ADD", "ok")) == Some(3.0)
    });
    assert_eq!(value(&body, series), Some(1.0), "{body}");
    let log = std::fs::read_to_string(node.root().join("router.log")).unwrap();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &Value| l["cmd"] == "ADD")
        .collect();
    let warned: Vec<&Value> = lines.iter().filter(|l| l["level"] == "warn").collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert_eq!(warned[0]["containerID"], "blind", "{log}");
    let msg = warned[0]["msg"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "no profile for this pod; passing through: the runtime delivered no pod annotations"
        ) && msg.contains("\"vpn\"")
            && msg.contains("io.kubernetes.cri.pod-annotations"),
        "{msg}"
    );
    assert_eq!(warned[0]["warning"], "noAnnotations");
    let info = lines
        .iter()
        .filter(|l| l["level"] == "info" && l["msg"] == "no profile for this pod; passing through")
        .count();
    assert_eq!(info, 2, "{log}");
    agent.kill();
}
