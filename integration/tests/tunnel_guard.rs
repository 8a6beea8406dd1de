//! podgate-tunnel-guard through the real libcni (bridge + host-local +
//! podgate-tunnel-guard, cniVersion 1.0.0) on a test node with a real
//! ovsdb-server, the fixture IPsec agent and real kernel XFRM policies in the
//! node netns.
//!
//! Root only: `cargo test -p podgate-integration --test tunnel_guard`
//! (builds the plugin if needed).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common_ipsec;

use common_ipsec::{good_status, rfc3339_from_now, run_plugin, GuardNode, MARK};
use podgate_integration::Verb;
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn ready_node_wires_pods_and_passes_the_result_through() {
    let g = GuardNode::new("ready");
    let result = g.expect_ready("p1");
    // The chained result is bridge's, unchanged: interfaces, the IP, the gateway.
    assert_eq!(result["cniVersion"], "1.0.0");
    let ip = result["ips"][0]["address"].as_str().unwrap();
    assert!(ip.starts_with("10.244.7."), "{result}");
    assert_eq!(result["ips"][0]["gateway"], "10.244.7.1");
    assert!(
        result["interfaces"].as_array().unwrap().len() >= 3,
        "{result}"
    );

    // Realistic per-peer policies with required ESP templates are no bypass.
    g.ip(
        "xfrm policy add dir out src 192.0.2.1/32 dst 192.0.2.2/32 proto udp dport 6081 \
          tmpl src 192.0.2.1 dst 192.0.2.2 proto esp reqid 1 mode transport",
    );
    g.ip(
        "xfrm policy add dir in src 192.0.2.2/32 dst 192.0.2.1/32 proto udp dport 6081 \
          tmpl src 192.0.2.2 dst 192.0.2.1 proto esp reqid 1 mode transport",
    );
    // IKE and unrelated plaintext policies neither.
    g.ip("xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 proto udp dport 500 priority 1");
    g.ip("xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 proto tcp dport 6081 priority 1");
    g.expect_ready("p2");

    let lines = g.log_lines();
    let add = lines.iter().find(|l| l["command"] == "ADD").unwrap();
    assert_eq!(add["verdict"], "ready");
    assert_eq!(add["msg"], "ipsec ready");
}

#[test]
fn agent_absent() {
    let mut g = GuardNode::new("absent");
    g.agent.stop();
    // auto: no agent socket means IPsec is not enabled on this node.
    g.expect_ready("auto");
    g.configure(json!({"required": "always"}));
    g.expect_not_ready("always", &["agent socket", "absent (required: always)"]);
    g.configure(json!({"required": "never"}));
    g.expect_ready("never");
}

#[test]
fn readyz_503() {
    let g = GuardNode::new("r503");
    g.agent.set("503", &good_status(&g.chassis));
    let msg = g.expect_not_ready("p", &["agent /readyz answered 503"]);
    assert_eq!(msg, "ipsec not ready: agent /readyz answered 503");
}

#[test]
fn degraded_phase() {
    let g = GuardNode::new("degraded");
    let mut st = good_status(&g.chassis);
    st["phase"] = json!("Degraded");
    st["reason"] = json!("IKE daemon restarting");
    g.agent.set("normal", &st);
    g.expect_not_ready("p", &["phase Degraded (reason: IKE daemon restarting)"]);
    st["phase"] = json!("WaitingTrust");
    st["reason"] = json!("");
    g.agent.set("normal", &st);
    g.expect_not_ready("p2", &["phase WaitingTrust"]);
}

#[test]
fn certificate_expired_or_nearly() {
    let g = GuardNode::new("cert");
    let mut st = good_status(&g.chassis);
    st["expires"] = json!(rfc3339_from_now(-300));
    g.agent.set("normal", &st);
    g.expect_not_ready("expired", &["certificate expired 5m ago"]);
    st["expires"] = json!(rfc3339_from_now(4 * 60 + 30));
    g.agent.set("normal", &st);
    g.expect_not_ready("nearly", &["certificate expires in 4m", "< 10m"]);
    g.configure(json!({"minCertValidity": "1m"}));
    g.expect_ready("ok-with-1m");
}

#[test]
fn chassis_mismatch() {
    let g = GuardNode::new("chassis");
    g.agent.set("normal", &good_status("some-other-node"));
    g.expect_not_ready(
        "p",
        &["chassis mismatch: agent reports \"some-other-node\", ovsdb system-id is \"chassis-chassis\""],
    );
}

#[test]
fn agent_claims_armed_but_guard_is_missing() {
    let g = GuardNode::new("noguard");
    g.remove_guard("", MARK);
    let msg = g.expect_not_ready("p", &[]);
    assert_eq!(
        msg,
        format!("ipsec not ready: guard ipv4 mark {MARK} missing")
    );
    // In phase Prepared (first enable) plaintext is allowed by design.
    let mut st = good_status(&g.chassis);
    st["phase"] = json!("Prepared");
    st["protectionArmed"] = json!(false);
    g.agent.set("normal", &st);
    g.expect_ready("prepared");
}

#[test]
fn guard_with_the_wrong_mark() {
    let g = GuardNode::new("wrongmark");
    g.remove_guard("", MARK);
    g.install_guard("", 4242);
    g.expect_not_ready(
        "p",
        &[&format!(
            "guard ipv4 mark {MARK} missing (guard installed with mark 4242)"
        )],
    );
    // The mark comes from OVSDB: point it at the installed guard (hex accepted).
    g.ovsdb.vsctl(&[
        "set",
        "Open_vSwitch",
        ".",
        "external_ids:ovn-ipsec-protection-mark=0x1092",
    ]);
    g.expect_ready("p2");
    // guardMark overrides OVSDB.
    g.configure(json!({"guardMark": MARK}));
    g.expect_not_ready("p3", &[&format!("guard ipv4 mark {MARK} missing")]);
}

#[test]
fn bypass_policy_for_geneve_without_esp() {
    let g = GuardNode::new("bypass");
    g.ip("xfrm policy add dir out src 192.0.2.1/32 dst 192.0.2.2/32 proto udp dport 6081 priority 100");
    g.expect_not_ready(
        "p",
        &["ipv4 bypass policy without ESP template: out allow 192.0.2.1/32 -> 192.0.2.2/32 udp dport 6081"],
    );
    // An optional ESP template ("level use") lets plaintext out too.
    g.ip("xfrm policy delete dir out src 192.0.2.1/32 dst 192.0.2.2/32 proto udp dport 6081");
    g.ip(
        "xfrm policy add dir out src 192.0.2.1/32 dst 192.0.2.2/32 proto udp dport 4789 \
          tmpl src 192.0.2.1 dst 192.0.2.2 proto esp reqid 7 mode transport level use",
    );
    g.expect_not_ready("p2", &["udp dport 4789", "tmpl esp (optional)"]);
    // A bypass carrying a mark the tunnel packets do not have is harmless.
    g.ip("xfrm policy delete dir out src 192.0.2.1/32 dst 192.0.2.2/32 proto udp dport 4789");
    g.ip("xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 mark 7 mask 0xffffffff priority 5");
    g.expect_ready("p3");
}

#[test]
fn agent_that_never_answers() {
    let g = GuardNode::new("hang");
    g.agent.set("hang", &good_status(&g.chassis));
    let start = Instant::now();
    let msg = g.expect_not_ready(
        "p",
        &[
            "agent /readyz: no answer within 500ms",
            "agent /status: no answer within 500ms",
        ],
    );
    // The kernel and OVSDB checks still ran (and passed): only the agent is named.
    assert!(!msg.contains("guard"), "{msg}");
    // ADD + DEL through libcni, bridge included, stay far from any hang.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn garbage_and_huge_answers() {
    let g = GuardNode::new("garbage");
    g.agent.set("garbage", &good_status(&g.chassis));
    g.expect_not_ready(
        "p1",
        &["agent /status answered 200 with a body that is not status JSON"],
    );
    g.agent.set("huge", &good_status(&g.chassis));
    g.expect_not_ready("p2", &["agent /status: response larger than 65536 bytes"]);
    g.agent.set("notHttp", &good_status(&g.chassis));
    g.expect_not_ready(
        "p3",
        &[
            "agent /readyz: malformed response",
            "agent /status: malformed response",
        ],
    );
}

#[test]
fn dead_ovsdb() {
    let mut g = GuardNode::new("deadovs");
    g.ovsdb.stop();
    g.expect_not_ready(
        "p",
        &[
            "ovsdb: connect",
            "no protection mark known (ovsdb unavailable)",
        ],
    );
    // Without OVSDB, the mark must come from the config.
    g.configure(json!({"ovsdbSocket": null}));
    g.expect_not_ready(
        "p2",
        &["no protection mark known (no guardMark, no ovsdbSocket)"],
    );
    g.configure(json!({"ovsdbSocket": null, "guardMark": format!("{MARK:#x}")}));
    g.expect_ready("p3");
}

#[test]
fn every_configured_family_needs_its_guard() {
    let g = GuardNode::new("dual");
    g.configure(json!({"families": ["ipv4", "ipv6"]}));
    g.expect_not_ready("p", &[&format!("guard ipv6 mark {MARK} missing")]);
    g.install_guard("-6", MARK);
    g.expect_ready("p2");
    g.ip("-6 xfrm policy add dir out src ::/0 dst ::/0 proto udp dport 6081 priority 10");
    g.expect_not_ready("p3", &["ipv6 bypass policy without ESP template"]);
}

#[test]
fn audit_mode_logs_and_lets_pods_through() {
    let g = GuardNode::new("audit");
    g.remove_guard("", MARK);
    g.configure(json!({"mode": "audit"}));
    g.expect_ready("p");
    let lines = g.log_lines();
    let add = lines
        .iter()
        .find(|l| l["command"] == "ADD")
        .expect("ADD logged");
    assert_eq!(add["level"], "warn");
    assert_eq!(add["verdict"], "notReady");
    assert_eq!(add["containerID"], "ctr-p");
    assert_eq!(
        add["msg"],
        format!("ipsec not ready: guard ipv4 mark {MARK} missing (audit: allowed)")
    );
    assert_eq!(add["failed"][0], format!("guard ipv4 mark {MARK} missing"));
    assert_eq!(add["report"]["agent"]["phase"], "Running");
    // Nothing key-like leaks into logs.
    let text = std::fs::read_to_string(&g.log).unwrap();
    assert!(!text.to_lowercase().contains("private"), "{text}");
}

#[test]
fn del_always_succeeds() {
    let mut g = GuardNode::new("del");
    g.configure(json!({"required": "always"}));
    let (pod, add) = g.add("p");
    add.assert_ok();
    // The agent hangs: DEL must not even ask it.
    g.agent.set("hang", &good_status(&g.chassis));
    let start = Instant::now();
    g.cni(Verb::Del, &pod, "ctr-p").assert_ok();
    assert!(start.elapsed() < Duration::from_secs(5));
    // The agent is gone entirely.
    let (pod2, add) = {
        g.agent.set("normal", &good_status(&g.chassis));
        g.add("p2")
    };
    add.assert_ok();
    g.agent.stop();
    g.cni(Verb::Del, &pod2, "ctr-p2").assert_ok();
    // DEL is idempotent.
    g.cni(Verb::Del, &pod2, "ctr-p2").assert_ok();
}

#[test]
fn check_reruns_the_checks() {
    let g = GuardNode::new("check");
    let (pod, add) = g.add("p");
    add.assert_ok();
    g.cni(Verb::Check, &pod, "ctr-p").assert_ok();
    g.remove_guard("", MARK);
    let out = g.cni(Verb::Check, &pod, "ctr-p");
    out.assert_cni_error(11);
    assert!(out.error_msg().unwrap().contains("guard ipv4"));
    g.cni(Verb::Del, &pod, "ctr-p").assert_ok();
}

#[test]
fn status_fails_only_when_opted_in() {
    // libcni 1.1.2 cannot send STATUS (cniVersion 1.1.0): call the plugin directly.
    let g = GuardNode::new("status");
    g.remove_guard("", MARK);
    let mut conf = g.guard_conf(json!({}));
    conf["cniVersion"] = json!("1.1.0");
    conf["name"] = json!(g.net);
    let (code, out) = run_plugin(&g.node.ns, "STATUS", &conf);
    assert_eq!(code, 0, "{out}");
    conf["reportStatus"] = json!(true);
    let (code, out) = run_plugin(&g.node.ns, "STATUS", &conf);
    assert_eq!((code, out["code"].as_u64()), (1, Some(50)), "{out}");
    assert!(out["msg"].as_str().unwrap().contains("guard ipv4"));
    g.install_guard("", MARK);
    let (code, out) = run_plugin(&g.node.ns, "STATUS", &conf);
    assert_eq!(code, 0, "{out}");
}
