//! `judge` over handmade observations: every verdict path without root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use super::*;
use crate::agent::AgentStatus;
use crate::observe::Asked;
use crate::ovsdb::{TunnelInterface, TunnelPort};
use crate::protection::Answer;
use podgate_kit::xfrm::{Action, Dir, PolicyDump, XfrmPolicy, PROTO_UDP};

const MARK: u32 = 759_815;
const REQID: u32 = 4242;
const UUID: &str = "0d9a3c5e-1b2f-4c6d-8e7f-9a0b1c2d3e4f";

fn now() -> SystemTime {
    time::parse_rfc3339("2026-11-30T00:00:00Z").unwrap()
}

fn guard(family: Family, mark: u32) -> XfrmPolicy {
    crate::guard::tests::guard(family, mark)
}

fn plaintext_6081() -> XfrmPolicy {
    let mut p = crate::guard::tests::policy(Family::Ipv4, Dir::Out, Action::Allow, 10);
    p.index = 9;
    p.selector.proto = PROTO_UDP;
    p.selector.dport = 6081;
    p.selector.dport_mask = 0xffff;
    p
}

fn tunnel(name: &str, opts: &[(&str, &str)]) -> TunnelPort {
    TunnelPort {
        port: name.into(),
        chassis: format!("chassis-{name}"),
        evpn: false,
        dangling: 0,
        interfaces: vec![TunnelInterface {
            name: name.into(),
            kind: "geneve".into(),
            options: opts
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }],
    }
}

fn ovs() -> OvsInfo {
    let tunnels = vec![
        tunnel(
            "ovn-b-0",
            &[("remote_ip", "10.0.0.2"), ("egress_pkt_mark", "759815")],
        ),
        tunnel(
            "ovn-c-0",
            &[
                ("remote_ip", "10.0.0.3"),
                ("remote_name", "chassis-c"),
                ("egress_pkt_mark", "759815"),
                ("ipsec_mark_out", "759815/0xffffffff"),
                ("ipsec_reqid", "4242"),
            ],
        ),
    ];
    OvsInfo {
        uuid: UUID.into(),
        system_id: Some("chassis-a".into()),
        node_uid: Some("uid-1".into()),
        lease: Some("LEASE".into()),
        protection_mark: Some(MARK.to_string()),
        reqid: Some(REQID.to_string()),
        tunnel_count: tunnels.len(),
        tunnels,
    }
}

fn ok(code: u16) -> Option<Asked> {
    Some(Ok(Answer {
        code,
        text: if code == 200 {
            String::new()
        } else {
            "IPsec protection is not armed".into()
        },
    }))
}

fn ready_obs() -> Observations {
    Observations {
        required_file: Some(Presence::Present),
        socket: Some(Presence::Present),
        dir_check: Some(Ok(())),
        socket_check: Some(Ok(())),
        ovsdb: Some(OvsRead::Ok(ovs())),
        armed: ok(200),
        startup: None,
        policies: Some(Ok(vec![
            guard(Family::Ipv4, MARK),
            guard(Family::Ipv6, MARK),
        ]
        .into())),
        readyz: None,
        status: None,
        elapsed: Duration::from_millis(2),
    }
}

fn failed(r: &Evaluation) -> Vec<String> {
    r.failures().map(|c| c.detail.clone()).collect()
}

fn judged(obs: &Observations) -> Evaluation {
    judge(&GuardConfig::default(), obs, now())
}

#[test]
fn an_armed_node_with_guards_lease_and_marked_tunnels_is_ready() {
    let r = judged(&ready_obs());
    assert_eq!(r.verdict, Verdict::Ready, "{r}");
    assert!(failed(&r).is_empty());
    assert_eq!((r.mark, r.reqid), (Some(MARK), Some(REQID)));
    assert_eq!(r.protection, Some(Protection::Armed));
    assert_eq!(r.summary(), "ipsec ready");
    assert_eq!(r.signals.ovsdb_keys.len(), 4);
    let names: Vec<&str> = r.checks.iter().map(|c| c.name.as_str()).collect();
    for n in [
        "required",
        "ovsdb",
        "protection.dir",
        "protection.socket",
        "armed",
        "lease",
        "xfrm",
        "guard.ipv4",
        "guard.ipv6",
        "bypass",
        "tunnels",
    ] {
        assert!(names.contains(&n), "{n} not in {names:?}");
    }
    // Nothing key-like, not even the lease text, in the JSON.
    let json = serde_json::to_string(&r).unwrap();
    assert!(!json.contains("LEASE"), "{json}");
}

#[test]
fn armed_answer_alone_never_passes() {
    let mut o = ready_obs();
    o.policies = Some(Ok(vec![guard(Family::Ipv4, MARK)].into()));
    let r = judged(&o);
    assert_eq!(failed(&r), [format!("guard ipv6 mark {MARK} missing")]);
    let mut o = ready_obs();
    o.policies
        .as_mut()
        .unwrap()
        .as_mut()
        .unwrap()
        .kept
        .push(plaintext_6081());
    let r = judged(&o);
    assert_eq!(r.verdict, Verdict::NotReady);
    assert!(failed(&r)[0].starts_with("bypass policy without required ESP template: out allow 0.0.0.0/0 -> 0.0.0.0/0 udp dport 6081 priority 10"), "{r}");
}

#[test]
fn a_tunnel_without_the_mark_with_another_reqid_a_custom_port_or_evpn_fails() {
    let mut o = ready_obs();
    let mut info = ovs();
    info.tunnels[0].interfaces[0]
        .options
        .remove("egress_pkt_mark");
    info.tunnels[1].interfaces[0]
        .options
        .insert("ipsec_reqid".into(), "7".into());
    info.tunnels.push(tunnel(
        "ovn-d-0",
        &[("egress_pkt_mark", "759815"), ("dst_port", "7000")],
    ));
    o.ovsdb = Some(OvsRead::Ok(info));
    let r = judged(&o);
    assert_eq!(
        failed(&r),
        ["tunnel ovn-b-0 lacks egress_pkt_mark, tunnel ovn-c-0 has ipsec_reqid=7, want 4242, tunnel ovn-d-0 uses custom dst_port 7000"]
    );
    let mut info = ovs();
    info.tunnels[0].evpn = true;
    o.ovsdb = Some(OvsRead::Ok(info));
    assert!(failed(&judged(&o))[0].contains("not an ordinary OVN tunnel"));
}

#[test]
fn an_incomplete_ovsdb_lease_fails_naming_each_key() {
    let mut o = ready_obs();
    let mut info = ovs();
    info.reqid = None;
    info.protection_mark = Some("0x10".into());
    o.ovsdb = Some(OvsRead::Ok(info));
    let r = judged(&o);
    assert_eq!(
        failed(&r),
        ["ovsdb lease incomplete: ovn-ipsec-protection-reqid missing, ovn-ipsec-protection-mark \"0x10\" is not a non-zero 32-bit number"]
    );
}

#[test]
fn not_armed_with_durable_intent() {
    let mut o = ready_obs();
    o.armed = ok(503);
    let r = judged(&o);
    assert_eq!(r.verdict, Verdict::NotReady);
    assert_eq!(
        failed(&r),
        [format!(
            "agent /armed answered 503 for ovs-uuid {UUID}: IPsec protection is not armed"
        )]
    );
    // A /startup 200 cannot open a node with durable intent.
    o.startup = ok(200);
    let r = judged(&o);
    assert!(
        failed(&r)
            .iter()
            .any(|f| f.contains("/startup answered 200"))
            || r.verdict == Verdict::NotReady
    );
    assert_eq!(r.verdict, Verdict::NotReady);
}

#[test]
fn keys_without_socket_after_reboot() {
    let mut o = ready_obs();
    o.required_file = Some(Presence::Absent);
    o.socket = Some(Presence::Absent);
    o.dir_check = None;
    o.socket_check = None;
    o.armed = None;
    let r = judged(&o);
    assert_eq!(r.verdict, Verdict::NotReady);
    assert!(
        failed(&r)[0].contains("protection.sock absent: agent not serving (durable intent present"),
        "{r}"
    );
    assert!(
        r.checks[0]
            .detail
            .contains("ovsdb ovn-ipsec-protection-node-uid"),
        "{r}"
    );
}

/// OVSDB with no lease keys at all: no durable intent.
fn ovs_without_lease() -> OvsInfo {
    let mut info = ovs();
    info.node_uid = None;
    info.lease = None;
    info.protection_mark = None;
    info.reqid = None;
    info
}

/// An endpoint that is up but not armed, before any lease: `/startup` decides.
fn preparing(startup: u16) -> Observations {
    Observations {
        required_file: Some(Presence::Absent),
        socket: Some(Presence::Present),
        dir_check: Some(Ok(())),
        socket_check: Some(Ok(())),
        ovsdb: Some(OvsRead::Ok(ovs_without_lease())),
        armed: ok(503),
        startup: ok(startup),
        policies: Some(Ok(PolicyDump::default())),
        ..Observations::default()
    }
}

#[test]
fn without_durable_intent_a_startup_200_is_ready_as_prepared() {
    let r = judged(&preparing(200));
    assert_eq!(r.verdict, Verdict::Ready, "{r}");
    assert_eq!(r.protection, Some(Protection::Prepared));
    assert_eq!(
        r.summary(),
        "ipsec ready: initial preparation (plaintext by design)"
    );
}

#[test]
fn without_durable_intent_a_startup_503_fails() {
    assert!(failed(&judged(&preparing(503)))
        .iter()
        .any(|f| f.starts_with("not armed and agent /startup answered 503")));
}

#[test]
fn nothing_present_is_not_required_unless_always() {
    let o = Observations {
        required_file: Some(Presence::Absent),
        socket: Some(Presence::Absent),
        ovsdb: Some(OvsRead::Ok(ovs_without_lease())),
        policies: Some(Ok(PolicyDump::default())),
        ..Observations::default()
    };
    let r = judged(&o);
    assert_eq!(r.verdict, Verdict::NotRequired);
    assert!(r.checks[0].detail.starts_with("IPsec not in use on this node (required: auto): no /run/kube-ovn-ipsec-protection/required"), "{r}");
    let mut absent = o.clone();
    absent.ovsdb = Some(OvsRead::Absent);
    assert!(judged(&absent).checks[0]
        .detail
        .ends_with("no OVSDB at /run/openvswitch/db.sock"));
    let always = GuardConfig {
        required: Required::Always,
        ..GuardConfig::default()
    };
    let r = judge(&always, &o, now());
    assert_eq!(r.verdict, Verdict::NotReady);
    assert!(failed(&r)[0].contains("protection.sock absent"), "{r}");
    // OVSDB there but unreadable: its keys cannot be ruled out (fail closed).
    let mut stalled = o;
    stalled.ovsdb = Some(OvsRead::Failed("ovsdb: no answer within 500ms".into()));
    let r = judged(&stalled);
    assert_eq!(r.verdict, Verdict::NotReady);
    assert!(r.checks[0].detail.contains("cannot be ruled out"));
    assert_eq!(
        judge(
            &GuardConfig {
                required: Required::Never,
                ..GuardConfig::default()
            },
            &Observations::default(),
            now()
        )
        .verdict,
        Verdict::NotRequired
    );
}

#[test]
fn endpoint_checks_fail_closed() {
    let mut o = ready_obs();
    o.socket_check = Some(Err(
        "/x/protection.sock is a symlink, not the agent's socket".into(),
    ));
    o.armed = None;
    let r = judged(&o);
    assert_eq!(
        failed(&r),
        ["/x/protection.sock is a symlink, not the agent's socket"]
    );
    let mut o = ready_obs();
    o.armed = Some(Err(
        "protection.sock is served by uid 65534, not root (SO_PEERCRED)".into(),
    ));
    assert_eq!(
        failed(&judged(&o)),
        ["protection.sock is served by uid 65534, not root (SO_PEERCRED)"]
    );
}

#[test]
fn agent_diagnostics_never_gate() {
    let cfg = GuardConfig {
        agent_socket: Some("/run/kube-ovn-ipsec/status.sock".into()),
        ..GuardConfig::default()
    };
    let hex = "ab".repeat(32);
    let mut o = ready_obs();
    o.readyz = Some(Ok(503));
    o.status = Some(Ok(AgentStatus {
        phase: "Degraded".into(),
        reason: "IKE daemon restarting".into(),
        node_uid: "uid-1".into(),
        chassis: "chassis-a".into(),
        generation: hex.clone(),
        certificate_hash: hex.clone(),
        trust_hash: hex,
        expires: "2026-11-30T00:04:00Z".into(),
        ..AgentStatus::default()
    }));
    let r = judge(&cfg, &o, now());
    assert_eq!(r.verdict, Verdict::Ready, "{r}");
    let warn: Vec<&str> = r
        .checks
        .iter()
        .filter(|c| c.outcome == Outcome::Warn)
        .map(|c| c.detail.as_str())
        .collect();
    assert_eq!(
        warn,
        [
            "agent /readyz answered 503",
            "certificate expires in 4m < 10m"
        ]
    );
    assert_eq!(r.expires_in_secs, Some(240));
    let text = r.to_string();
    assert!(
        text.contains("phase Degraded (reason: IKE daemon restarting)"),
        "{text}"
    );
}
