//! podgate-tunnel-guard through the real libcni (upstream cnitool; the runner
//! where a test asserts the CNI error code; bridge + host-local +
//! podgate-tunnel-guard, cniVersion 1.0.0, and 1.1.0 with the v1.10.0
//! primaries for GC and STATUS) on a test node with a real
//! ovsdb-server (the agent's lease keys, OVN tunnel Ports/Interfaces), the
//! fixture agent serving Kube-OVN's public protection endpoint (computed from
//! the live kernel policies and the live OVSDB) and real kernel XFRM policies
//! in the node netns.
//!
//! Root only: `cargo test -p podgate-integration --test tunnel_guard`
//! (builds the plugin if needed).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::ipsec::{
    armed_state, lease, rfc3339_from_now, AgentOpts, GuardNode, MARK, TIMEOUT_MS,
};
use podgate_integration::{Primaries, Verb};
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn ready_node_wires_pods_and_passes_the_result_through() {
    let g = GuardNode::new("ready");
    // strongSwan's per-peer ESP policies (mark, reqid) are no bypass.
    g.add_peer_policies("192.0.2.1", "192.0.2.2");
    g.add_peer_policies("192.0.2.1", "192.0.2.3");
    // IKE and unrelated plaintext policies neither.
    g.ip("xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 proto udp dport 500 priority 1");
    g.ip("xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 proto tcp dport 6081 priority 1");
    let result = g.expect_ready("p1");
    // The chained result is bridge's, unchanged: interfaces, the IP, the gateway.
    assert_eq!(result["cniVersion"], "1.0.0");
    let ip = result["ips"][0]["address"].as_str().unwrap();
    assert!(ip.starts_with("10.244.7."), "{result}");
    assert_eq!(result["ips"][0]["gateway"], "10.244.7.1");

    let add = g.last_log("ADD");
    assert_eq!(add["verdict"], "ready");
    assert_eq!(add["msg"], "ipsec ready");
    let report = &add["report"];
    assert_eq!(report["protection"], "armed");
    assert_eq!(report["armed"]["code"], 200);
    assert_eq!(report["ovsdb"]["uuid"], g.ovsdb.uuid());
    assert_eq!(report["ovsdb"]["tunnelCount"], 2);
    assert_eq!(report["signals"]["requiredFile"], true);
    assert_eq!(report["signals"]["ovsdbKeys"].as_array().unwrap().len(), 4);
    for check in [
        "guard.ipv4",
        "guard.ipv6",
        "bypass",
        "tunnels",
        "lease",
        "armed",
    ] {
        let c = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == check)
            .unwrap_or_else(|| panic!("{check} missing: {report}"));
        assert_eq!(c["outcome"], "pass", "{c}");
    }
    // No lease text, no key material in the log.
    let text = std::fs::read_to_string(&g.log).unwrap();
    assert!(!text.contains("TESTLEASE"), "{text}");
}

#[test]
fn agent_says_armed_but_the_ipv6_guard_is_missing() {
    let g = GuardNode::new("noguard6");
    // An agent whose readback covers IPv4 only still answers /armed 200.
    let mut st = armed_state(&g.chassis);
    st["families"] = json!(["ipv4"]);
    g.agent.set(&st);
    g.remove_guard("-6", MARK);
    let msg = g.expect_not_ready("p", &[]);
    assert_eq!(
        msg,
        format!("ipsec not ready: guard ipv6 mark {MARK} missing")
    );
    assert_eq!(g.last_log("ADD")["report"]["armed"]["code"], 200);
    // The real agent's readback (both families) refuses as well.
    g.agent.set(&armed_state(&g.chassis));
    g.expect_not_ready(
        "p2",
        &[
            "agent /armed answered 503",
            "IPsec protection is not armed",
            "guard ipv6",
        ],
    );
    g.install_guard("-6", MARK);
    g.expect_ready("p3");
}

#[test]
fn tunnel_interface_without_egress_mark() {
    let g = GuardNode::new("tunmark");
    // A new peer's tunnel that ovn-controller created without the mark:
    // its packets would leave unmarked, so no guard would catch them.
    g.ovsdb
        .add_tunnel("ovn-d00001-0", "chassis-d", "192.0.2.4", false, false);
    g.expect_not_ready(
        "p",
        &[
            "tunnel ovn-d00001-0 lacks egress_pkt_mark",
            "IPsec protection does not cover the current OVS database",
        ],
    );
    // With remote_name (IPsec tunnels) the ESP mark and reqid are needed too.
    g.ovsdb.vsctl(&[
        "set",
        "Interface",
        "ovn-d00001-0",
        &format!("options:egress_pkt_mark={MARK}"),
        "options:remote_name=chassis-d",
        "options:ipsec_reqid=1",
    ]);
    g.expect_not_ready(
        "p2",
        &[
            "tunnel ovn-d00001-0 lacks ipsec_mark_out",
            "tunnel ovn-d00001-0 has ipsec_reqid=1, want 31337",
        ],
    );
}

#[test]
fn bypass_policy_at_a_higher_priority_than_the_guard() {
    let g = GuardNode::new("bypass");
    g.ip("xfrm policy add dir out src 192.0.2.1/32 dst 192.0.2.2/32 proto udp dport 6081 priority 100");
    g.expect_not_ready(
        "p",
        &[
            "bypass policy without required ESP template: out allow 192.0.2.1/32 -> 192.0.2.2/32 udp dport 6081 priority 100",
            "agent /armed answered 503",
        ],
    );
    // An optional ESP template ("level use") lets plaintext out too, in IPv6 as well.
    g.ip("xfrm policy delete dir out src 192.0.2.1/32 dst 192.0.2.2/32 proto udp dport 6081");
    g.ip(
        "-6 xfrm policy add dir out src 2001:db8::1/128 dst 2001:db8::2/128 proto udp dport 4789 \
          tmpl src 2001:db8::1 dst 2001:db8::2 proto esp reqid 7 mode transport level use",
    );
    g.expect_not_ready("p2", &["udp dport 4789", "tmpl esp (optional)"]);
    // A policy carrying a mark the tunnel packets do not have is harmless.
    g.ip("-6 xfrm policy delete dir out src 2001:db8::1/128 dst 2001:db8::2/128 proto udp dport 4789");
    g.ip("xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 mark 7 mask 0xffffffff priority 5");
    g.expect_ready("p3");
}

#[test]
fn protection_socket_served_by_a_non_root_process() {
    // Bound by root (so the file passes), then served by uid 65534 answering
    // 200 to everything: only SO_PEERCRED tells it from the agent.
    let g = GuardNode::with_agent(
        "impostor",
        AgentOpts {
            impostor_uid: Some(65534),
            ..AgentOpts::default()
        },
    );
    let msg = g.expect_not_ready("p", &[]);
    assert_eq!(
        msg,
        "ipsec not ready: protection.sock is served by uid 65534, not root (SO_PEERCRED)"
    );
}

#[test]
fn protection_socket_that_is_a_file_or_a_symlink() {
    let mut g = GuardNode::new("notsock");
    g.agent.stop();
    let sock = g.agent.socket();
    std::fs::write(&sock, "").unwrap();
    g.expect_not_ready("file", &[&format!("{} is not a socket", sock.display())]);
    std::fs::remove_file(&sock).unwrap();
    // A symlink to a live root socket elsewhere is refused before connecting.
    let elsewhere = g.node.root().join("elsewhere.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &sock).unwrap();
    g.expect_not_ready(
        "link",
        &[&format!(
            "{} is a symlink, not the agent's socket",
            sock.display()
        )],
    );
    std::fs::remove_file(&sock).unwrap();
    // A directory others may write into is refused too.
    g.agent.restart(&g.node.ns);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&g.agent.dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    g.expect_not_ready("dir", &["is group/other-writable (mode 0777)"]);
    std::fs::set_permissions(&g.agent.dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    g.expect_ready("fixed");
}

#[test]
fn agent_answers_for_another_ovs_database() {
    let mut g = GuardNode::new("rebuilt");
    let old = g.ovsdb.uuid();
    let mut st = armed_state(&g.chassis);
    st["boundUuid"] = json!(old);
    g.agent.set(&st);
    g.expect_ready("before");
    // The database is rebuilt and repopulated identically: only its _uuid
    // differs, and the agent's readback is bound to the old one.
    g.ovsdb.rebuild(&g.node.ns, &g.chassis);
    g.ovsdb.publish_lease(&lease(&g.chassis));
    g.ovsdb
        .add_tunnel("ovn-b00001-0", "chassis-b", "192.0.2.2", false, true);
    g.ovsdb
        .add_tunnel("ovn-c00001-0", "chassis-c", "192.0.2.3", true, true);
    let new = g.ovsdb.uuid();
    assert_ne!(old, new);
    let msg = g.expect_not_ready("after", &[]);
    assert_eq!(
        msg,
        format!(
            "ipsec not ready: agent /armed answered 503 for ovs-uuid {new}: \
             IPsec protection does not cover the current OVS database"
        )
    );
    // Re-armed on the new database: ready again.
    st["boundUuid"] = json!(new);
    g.agent.set(&st);
    g.expect_ready("rearmed");
}

#[test]
fn ovsdb_keys_but_no_socket_after_a_reboot() {
    let mut g = GuardNode::new("reboot");
    // /run is empty after a reboot (no socket, no `required` file); the
    // guards are gone with the kernel state; OVSDB (on disk) keeps the lease.
    g.agent.stop();
    std::fs::remove_file(g.agent.required_file()).unwrap();
    g.remove_guard("", MARK);
    g.remove_guard("-6", MARK);
    g.expect_not_ready(
        "p",
        &["protection.sock absent: agent not serving (durable intent present"],
    );
    let why = g.last_log("ADD")["report"]["checks"][0]["detail"].clone();
    assert!(
        why.as_str()
            .unwrap()
            .contains("ovsdb ovn-ipsec-protection-node-uid, ovn-ipsec-protection-lease"),
        "{why}"
    );
    // The agent comes back and re-arms: ready.
    g.agent.restart(&g.node.ns);
    g.install_guard("", MARK);
    g.install_guard("-6", MARK);
    assert!(g.agent.required_file().exists());
    g.expect_ready("rearmed");
}

#[test]
fn required_file_and_a_hung_agent_fail_in_bounded_time() {
    let g = GuardNode::new("hang");
    let mut st = armed_state(&g.chassis);
    st["mode"] = json!("hang");
    g.agent.set(&st);
    let start = Instant::now();
    let msg = g.expect_not_ready("p", &[]);
    assert_eq!(
        msg,
        format!("ipsec not ready: agent /armed: no answer within {TIMEOUT_MS}ms")
    );
    // ADD + DEL through libcni, bridge included, stay far from any hang.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn initial_preparation_passes_and_only_with_the_controller() {
    let g = GuardNode::unprotected("startup", true);
    assert!(!g.agent.required_file().exists());
    g.expect_ready("prepared");
    let add = g.last_log("ADD");
    assert_eq!(
        add["msg"],
        "ipsec ready: initial preparation (plaintext by design)"
    );
    assert_eq!(add["report"]["armed"]["code"], 503);
    assert_eq!(add["report"]["startup"]["code"], 200);
    // Prepare is over but nothing was armed: closed.
    let mut st = armed_state(&g.chassis);
    st["lease"] = json!(null);
    st["preparing"] = json!(false);
    g.agent.set(&st);
    g.expect_not_ready(
        "not-preparing",
        &["not armed and agent /startup answered 503: initial IPsec preparation is not authorized"],
    );
    // Durable intent (any lease key) forbids /startup even if it said 200.
    st["preparing"] = json!(true);
    g.agent.set(&st);
    g.ovsdb.vsctl(&[
        "set",
        "Open_vSwitch",
        ".",
        "external_ids:ovn-ipsec-protection-mark=12",
    ]);
    g.expect_not_ready(
        "intent",
        &["agent /armed answered 503", "ovsdb lease incomplete"],
    );
}

#[test]
fn no_signal_at_all_means_not_in_use() {
    let mut g = GuardNode::unprotected("nosignal", false);
    g.agent.stop();
    g.expect_ready("auto");
    let add = g.last_log("ADD");
    assert_eq!(add["verdict"], "notRequired");
    let msg = add["msg"].as_str().unwrap();
    assert!(
        msg.starts_with("ipsec not required: IPsec not in use on this node (required: auto): no "),
        "{msg}"
    );
    assert!(
        msg.contains("no ovn-ipsec-protection-* key in OVSDB"),
        "{msg}"
    );
    // No OVS at all on the node: the same.
    g.ovsdb.stop();
    std::fs::remove_file(&g.ovsdb.socket).unwrap();
    g.expect_ready("no-ovs");
    assert!(g.last_log("ADD")["msg"]
        .as_str()
        .unwrap()
        .contains("no OVSDB at"));
    g.configure(json!({"required": "always"}));
    g.expect_not_ready(
        "always",
        &["absent", "protection.sock absent: agent not serving"],
    );
    g.configure(json!({"required": "never"}));
    g.expect_ready("never");
}

#[test]
fn excluded_namespace_passes_with_a_note_while_not_ready() {
    let g = GuardNode::new("exclude");
    g.configure(json!({"excludeNamespaces": ["cert-manager"]}));
    g.remove_guard("-6", MARK);
    let (pod, out) = g.add_in("issuer", Some("cert-manager"));
    out.assert_ok();
    let add = g.last_log("ADD");
    assert_eq!(add["level"], "warn");
    assert_eq!(add["verdict"], "notReady");
    assert_eq!(add["podNamespace"], "cert-manager");
    assert!(add["msg"]
        .as_str()
        .unwrap()
        .ends_with("(namespace cert-manager in excludeNamespaces: allowed)"));
    g.cni(Verb::Del, &pod).assert_ok();
    // Any other namespace is refused.
    let (pod, out) = g.add_runner_in("web", Some("default"));
    out.assert_cni_error(11);
    g.runner(Verb::Del, &pod, "ctr-web").assert_ok();
}

#[test]
fn private_status_socket_adds_diagnostics_only() {
    let g = GuardNode::with_agent(
        "status",
        AgentOpts {
            status: true,
            ..AgentOpts::default()
        },
    );
    let mut st = armed_state(&g.chassis);
    st["status"]["expires"] = json!(rfc3339_from_now(4 * 60 + 30));
    g.agent.set(&st);
    g.configure(json!({"agentSocket": g.agent.status_socket()}));
    g.expect_ready("p");
    let report = g.last_log("ADD")["report"].clone();
    // The agent's own Status: Configured + applied + live armed = Running.
    assert_eq!(report["agent"]["phase"], "Running");
    assert_eq!(report["agent"]["protectionArmed"], true);
    let warn: Vec<String> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["outcome"] == "warn")
        .map(|c| c["detail"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(warn.len(), 1, "{report}");
    assert!(warn[0].starts_with("certificate expires in 4m"), "{warn:?}");
    // The private status never opens a closed node.
    g.remove_guard("-6", MARK);
    g.expect_not_ready("p2", &["guard ipv6"]);
}

#[test]
fn a_dead_ovsdb_refuses_the_pod_without_asking_the_agent() {
    let mut g = GuardNode::new("deadovs");
    g.ovsdb.stop();
    g.expect_not_ready(
        "p",
        &[
            "ovsdb: connect",
            "agent /armed not asked: no OVS _uuid to bind it to",
        ],
    );
}

#[test]
fn audit_mode_logs_and_lets_pods_through() {
    let g = GuardNode::new("audit");
    g.remove_guard("", MARK);
    g.configure(json!({"mode": "audit"}));
    let (pod, out) = g.add("p");
    out.assert_ok();
    let add = g.last_log("ADD");
    g.cni(Verb::Del, &pod).assert_ok();
    assert_eq!(add["level"], "warn");
    assert_eq!(add["verdict"], "notReady");
    assert_eq!(add["containerID"], out.container_id.unwrap());
    let msg = add["msg"].as_str().unwrap();
    assert!(
        msg.contains(&format!("guard ipv4 mark {MARK} missing")),
        "{msg}"
    );
    assert!(msg.ends_with("(audit: allowed)"), "{msg}");
}

#[test]
fn del_always_succeeds() {
    let mut g = GuardNode::new("del");
    g.configure(json!({"required": "always"}));
    let (pod, add) = g.add("p");
    add.assert_ok();
    // The agent hangs: DEL must not even ask it.
    let mut st = armed_state(&g.chassis);
    st["mode"] = json!("hang");
    g.agent.set(&st);
    let start = Instant::now();
    g.cni(Verb::Del, &pod).assert_ok();
    assert!(start.elapsed() < Duration::from_secs(5));
    // The agent is gone entirely.
    g.agent.set(&armed_state(&g.chassis));
    let (pod2, add) = g.add("p2");
    add.assert_ok();
    g.agent.stop();
    g.cni(Verb::Del, &pod2).assert_ok();
    // DEL is idempotent.
    g.cni(Verb::Del, &pod2).assert_ok();
}

#[test]
fn check_reruns_the_checks() {
    let g = GuardNode::new("check");
    let (pod, add) = g.add_runner_in("p", None);
    add.assert_ok();
    g.runner(Verb::Check, &pod, "ctr-p").assert_ok();
    g.remove_guard("", MARK);
    let out = g.runner(Verb::Check, &pod, "ctr-p");
    out.assert_cni_error(11);
    assert!(out.error_msg().unwrap().contains("guard ipv4"));
    g.runner(Verb::Del, &pod, "ctr-p").assert_ok();
}

/// STATUS through libcni 1.3 (cniVersion 1.1.0, the v1.10.0 primaries
/// before the guard): with `reportStatus` and IPsec required and not ready,
/// cnitool's STATUS fails with the guard's answer (code 50 through the
/// runner); without `reportStatus`, or once ready, it passes.
#[test]
fn status_through_libcni_is_the_guards_answer_only_when_opted_in() {
    let g = GuardNode::with_agent_on("status-verb", AgentOpts::default(), Primaries::Upstream);
    g.configure_at("1.1.0", json!({"required": "always"}));
    g.node.cnitool_status(&g.net).assert_ok();
    g.remove_guard("", MARK);
    g.node.cnitool_status(&g.net).assert_ok();
    g.configure_at("1.1.0", json!({"required": "always", "reportStatus": true}));
    let out = g.node.cnitool_status(&g.net);
    let msg = out.assert_failed();
    assert!(msg.contains("guard ipv4"), "{out:?}");
    let out = g.node.runner_status(&g.net);
    out.assert_cni_error(50);
    assert!(out.error_msg().unwrap().contains("guard ipv4"), "{out:?}");
    g.install_guard("", MARK);
    g.node.cnitool_status(&g.net).assert_ok();
    g.node.runner_status(&g.net).assert_ok();
}

/// GC through libcni 1.3 of a chain with the guard (cniVersion 1.1.0, the
/// v1.10.0 primaries), IPsec required and the agent hanging: a GC with a
/// valid-attachments list takes the stale pod off the node and leaves the
/// live one; `cnitool gc` (no list) takes everything; neither waits for the
/// agent, and the node is as before.
#[test]
fn gc_through_libcni_never_waits_for_the_agent() {
    let g = GuardNode::with_agent_on("gc", AgentOpts::default(), Primaries::Upstream);
    g.configure_at("1.1.0", json!({"required": "always"}));
    g.expect_ready("warm");
    let before = g.node.settled_snapshot();
    let ipam_before = podgate_integration::files_below(&g.node.ipam_dir());
    let (live, out) = g.add("live");
    out.assert_ok();
    let live_id = out.container_id.unwrap();
    let (stale, out) = g.add("stale");
    out.assert_ok();
    let mut st = armed_state(&g.chassis);
    st["mode"] = json!("hang");
    g.agent.set(&st);

    let start = Instant::now();
    g.node.runner_gc(&g.net, &[(&live_id, "eth0")]).assert_ok();
    assert!(!stale.link_exists("eth0"), "the stale pod is still wired");
    assert!(live.link_exists("eth0"), "the live pod lost its interface");
    g.node.cnitool_gc(&g.net).assert_ok();
    assert!(!live.link_exists("eth0"), "cnitool gc left the pod wired");
    assert!(
        start.elapsed() < Duration::from_millis(TIMEOUT_MS),
        "GC waited for the agent: {:?}",
        start.elapsed()
    );
    assert_eq!(
        podgate_integration::files_below(&g.node.ipam_dir()),
        ipam_before
    );
    podgate_integration::assert_same(&before, &g.node.settled_snapshot());
}
