//! `judge` over handmade observations: every verdict path without root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use super::*;
use podgate_kit::xfrm::{Action, Dir, XfrmPolicy, PROTO_UDP};
use std::time::UNIX_EPOCH;

const MARK: u32 = 759_815;

fn now() -> SystemTime {
    time::parse_rfc3339("2026-11-30T00:00:00Z").unwrap()
}

fn status() -> AgentStatus {
    AgentStatus {
        phase: "Running".into(),
        reason: String::new(),
        node_uid: "uid-1".into(),
        chassis: "chassis-a".into(),
        generation: "3".into(),
        certificate_hash: "sha256:aa".into(),
        trust_hash: "sha256:bb".into(),
        configuration_applied: true,
        runtime_healthy: true,
        protection_armed: true,
        expires: "2026-12-01T00:00:00Z".into(),
    }
}

/// An OUT policy; index 8 so reports can be told apart from guard.rs's fixtures.
fn policy(family: Family, action: Action, priority: u32) -> XfrmPolicy {
    XfrmPolicy {
        index: 8,
        ..crate::guard::tests::policy(family, Dir::Out, action, priority)
    }
}

fn guard(family: Family, mark: u32) -> XfrmPolicy {
    crate::guard::tests::guard(family, mark)
}

fn plaintext_6081() -> XfrmPolicy {
    let mut p = policy(Family::Ipv4, Action::Allow, 10);
    p.selector.proto = PROTO_UDP;
    p.selector.dport = 6081;
    p.selector.dport_mask = 0xffff;
    p
}

fn cfg() -> GuardConfig {
    GuardConfig {
        ovsdb_socket: Some("/run/ovs/db.sock".into()),
        ..GuardConfig::default()
    }
}

fn ready_obs() -> Observations {
    Observations {
        agent_present: true,
        readyz: Some(Ok(200)),
        status: Some(Ok(status())),
        ovsdb: Some(Ok(OvsInfo {
            system_id: Some("chassis-a".into()),
            protection_mark: Some(MARK.to_string()),
        })),
        policies: Some(Ok(vec![guard(Family::Ipv4, MARK)])),
        elapsed: Duration::from_millis(2),
    }
}

fn failed(r: &Report) -> Vec<String> {
    r.failures().map(|c| c.detail.clone()).collect()
}

#[test]
fn ready_node() {
    let r = judge(&cfg(), &ready_obs(), now());
    assert_eq!(r.verdict, Verdict::Ready, "{r}");
    assert!(failed(&r).is_empty());
    assert_eq!(r.mark, Some(MARK));
    assert_eq!(r.mark_source.as_deref(), Some("ovsdb"));
    assert_eq!(r.expires_in_secs, Some(86_400));
    assert_eq!(r.summary(), "ipsec ready");
    let text = r.to_string();
    assert!(
        text.contains("READY") && text.contains("phase:       Running"),
        "{text}"
    );
    assert!(text.contains("in 1d"), "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["verdict"], "ready");
    assert_eq!(json["guards"][0]["guard"]["mark"]["value"], MARK);
}

#[test]
fn never_and_auto_without_agent_are_not_required() {
    let c = GuardConfig {
        required: Required::Never,
        ..cfg()
    };
    let r = judge(&c, &Observations::default(), now());
    assert_eq!(r.verdict, Verdict::NotRequired);
    assert!(r.is_ready());
    let r = judge(&cfg(), &Observations::default(), now());
    assert_eq!(r.verdict, Verdict::NotRequired);
    assert!(r.checks[0].detail.contains("absent"));
}

#[test]
fn always_without_agent_is_not_ready() {
    let c = GuardConfig {
        required: Required::Always,
        ..cfg()
    };
    let r = judge(&c, &Observations::default(), now());
    assert_eq!(r.verdict, Verdict::NotReady);
    assert_eq!(
        r.summary(),
        "ipsec not ready: agent socket /run/kube-ovn-ipsec/status.sock absent (required: always)"
    );
}

#[test]
fn agent_failures_are_named() {
    let mut o = ready_obs();
    o.readyz = Some(Ok(503));
    o.status = Some(Err("agent /status: no answer within 500ms".into()));
    let r = judge(&cfg(), &o, now());
    assert_eq!(
        failed(&r),
        [
            "agent /readyz answered 503",
            "agent /status: no answer within 500ms"
        ]
    );
    // Without a phase the kernel checks still gate (and pass here).
    assert!(r
        .checks
        .iter()
        .any(|c| c.name == "guard.ipv4" && c.outcome == Outcome::Pass));
}

#[test]
fn phases() {
    for (phase, ok) in [
        ("Running", true),
        ("Configured", true),
        ("Restored", true),
        ("Prepared", true),
        ("Degraded", false),
        ("WaitingTrust", false),
        ("Bogus", false),
    ] {
        let mut o = ready_obs();
        let mut s = status();
        s.phase = phase.into();
        s.reason = "ike down".into();
        o.status = Some(Ok(s));
        let r = judge(&cfg(), &o, now());
        assert_eq!(r.is_ready(), ok, "{phase}: {r}");
        if !ok {
            assert_eq!(failed(&r), [format!("phase {phase} (reason: ike down)")]);
        }
    }
}

#[test]
fn armed_phase_needs_all_flags() {
    let mut o = ready_obs();
    let mut s = status();
    s.runtime_healthy = false;
    s.protection_armed = false;
    o.status = Some(Ok(s));
    let r = judge(&cfg(), &o, now());
    assert_eq!(
        failed(&r),
        ["phase Running but runtimeHealthy, protectionArmed false"]
    );
}

#[test]
fn prepared_phase_does_not_need_the_guard() {
    let mut o = ready_obs();
    let mut s = status();
    s.phase = "Prepared".into();
    s.protection_armed = false;
    o.status = Some(Ok(s));
    o.policies = Some(Ok(vec![plaintext_6081()]));
    o.ovsdb = Some(Ok(OvsInfo {
        system_id: Some("chassis-a".into()),
        protection_mark: None,
    }));
    let r = judge(&cfg(), &o, now());
    assert_eq!(r.verdict, Verdict::Ready, "{r}");
    assert!(r
        .checks
        .iter()
        .any(|c| c.name == "mark" && c.outcome == Outcome::Skip && c.detail.contains("Prepared")));
    // ...but the rest of the identity is still required.
    let mut s = status();
    s.phase = "Prepared".into();
    s.expires = "2026-11-30T00:04:00Z".into();
    o.status = Some(Ok(s));
    assert_eq!(
        failed(&judge(&cfg(), &o, now())),
        ["certificate expires in 4m < 10m"]
    );
}

#[test]
fn certificate_expiry() {
    for (expires, want) in [
        (
            "2026-11-30T00:04:00Z",
            Some("certificate expires in 4m < 10m"),
        ),
        ("2026-11-29T23:55:00Z", Some("certificate expired 5m ago")),
        ("2026-11-30T00:00:00Z", Some("certificate expires now")),
        (
            "tomorrow",
            Some("certificate expiry \"tomorrow\" is not RFC 3339"),
        ),
        ("", Some("agent status has no certificate expiry")),
        ("2026-11-30T00:10:00Z", None),
        ("2026-11-30T09:00:00+08:00", None),
    ] {
        let mut o = ready_obs();
        let mut s = status();
        s.expires = expires.into();
        o.status = Some(Ok(s));
        let r = judge(&cfg(), &o, now());
        match want {
            Some(w) => assert_eq!(failed(&r), [w], "{expires}"),
            None => assert!(r.is_ready(), "{expires}: {r}"),
        }
    }
}

#[test]
fn identity_and_chassis() {
    let mut o = ready_obs();
    let mut s = status();
    s.trust_hash.clear();
    s.chassis = "chassis-b".into();
    o.status = Some(Ok(s));
    let r = judge(&cfg(), &o, now());
    assert_eq!(
        failed(&r),
        [
            "agent status lacks trustHash",
            "chassis mismatch: agent reports \"chassis-b\", ovsdb system-id is \"chassis-a\""
        ]
    );
    let mut o = ready_obs();
    o.ovsdb = Some(Ok(OvsInfo {
        system_id: None,
        protection_mark: Some("0xb9807".into()),
    }));
    assert_eq!(
        failed(&judge(&cfg(), &o, now())),
        ["ovsdb has no external_ids:system-id"]
    );
}

#[test]
fn marks() {
    // Dead OVSDB, no override: both named.
    let mut o = ready_obs();
    o.ovsdb = Some(Err("ovsdb: connect /x: Connection refused".into()));
    assert_eq!(
        failed(&judge(&cfg(), &o, now())),
        [
            "ovsdb: connect /x: Connection refused",
            "no protection mark known (ovsdb unavailable)"
        ]
    );
    // guardMark overrides OVSDB.
    let c = GuardConfig {
        guard_mark: Some(MARK),
        ..cfg()
    };
    let mut o = ready_obs();
    o.ovsdb = Some(Ok(OvsInfo {
        system_id: Some("chassis-a".into()),
        protection_mark: Some("1".into()),
    }));
    let r = judge(&c, &o, now());
    assert!(r.is_ready(), "{r}");
    assert_eq!(r.mark_source.as_deref(), Some("guardMark"));
    // No OVSDB at all: guardMark or nothing.
    let c = GuardConfig::default();
    let mut o = ready_obs();
    o.ovsdb = None;
    assert_eq!(
        failed(&judge(&c, &o, now())),
        ["no protection mark known (no guardMark, no ovsdbSocket)"]
    );
    let c = GuardConfig {
        guard_mark: Some(MARK),
        ..GuardConfig::default()
    };
    let r = judge(&c, &o, now());
    assert!(r.is_ready(), "{r}");
    assert!(r
        .checks
        .iter()
        .any(|c| c.name == "chassis" && c.outcome == Outcome::Skip));
    // Garbage mark in OVSDB.
    let mut o = ready_obs();
    o.ovsdb = Some(Ok(OvsInfo {
        system_id: Some("chassis-a".into()),
        protection_mark: Some("lots".into()),
    }));
    assert_eq!(
        failed(&judge(&cfg(), &o, now())),
        ["ovsdb ovn-ipsec-protection-mark \"lots\" is not a number"]
    );
}

#[test]
fn kernel_readback_decides_not_the_agent() {
    // Agent says armed, kernel has nothing.
    let mut o = ready_obs();
    o.policies = Some(Ok(vec![]));
    assert_eq!(
        failed(&judge(&cfg(), &o, now())),
        ["guard ipv4 mark 759815 missing"]
    );
    // Guard with another mark.
    o.policies = Some(Ok(vec![guard(Family::Ipv4, 42)]));
    assert_eq!(
        failed(&judge(&cfg(), &o, now())),
        ["guard ipv4 mark 759815 missing (guard installed with mark 42)"]
    );
    // Plaintext allow for udp/6081 in front of the guard.
    o.policies = Some(Ok(vec![guard(Family::Ipv4, MARK), plaintext_6081()]));
    assert_eq!(
        failed(&judge(&cfg(), &o, now())),
        ["ipv4 bypass policy without ESP template: out allow 0.0.0.0/0 -> 0.0.0.0/0 udp dport 6081 priority 10 index 8 no template"]
    );
    // Many bypasses are summarised.
    o.policies = Some(Ok(std::iter::repeat_n(plaintext_6081(), 5).collect()));
    let r = judge(&cfg(), &o, now());
    assert!(failed(&r)[1].ends_with("and 2 more"), "{r}");
    // Dump failure.
    o.policies = Some(Err("xfrm policy dump timed out after 1ms".into()));
    assert_eq!(
        failed(&judge(&cfg(), &o, now())),
        ["xfrm policy dump: xfrm policy dump timed out after 1ms"]
    );
}

#[test]
fn every_family_is_checked() {
    let c = GuardConfig {
        families: vec![Family::Ipv4, Family::Ipv6],
        ..cfg()
    };
    let r = judge(&c, &ready_obs(), now());
    assert_eq!(failed(&r), ["guard ipv6 mark 759815 missing"]);
    let mut o = ready_obs();
    o.policies = Some(Ok(vec![
        guard(Family::Ipv4, MARK),
        guard(Family::Ipv6, MARK),
    ]));
    assert!(judge(&c, &o, now()).is_ready());
}

#[test]
fn many_failures_in_one_line() {
    let mut o = ready_obs();
    let mut s = status();
    s.expires = "2026-11-30T00:04:00Z".into();
    o.status = Some(Ok(s));
    o.policies = Some(Ok(vec![]));
    assert_eq!(
        judge(&cfg(), &o, now()).summary(),
        "ipsec not ready: certificate expires in 4m < 10m; guard ipv4 mark 759815 missing"
    );
}

#[test]
fn evaluate_is_bounded_without_an_agent() {
    let c = GuardConfig {
        agent_socket: "/nonexistent/podgate/status.sock".into(),
        ..GuardConfig::default()
    };
    let r = evaluate(&c, UNIX_EPOCH);
    assert_eq!(r.verdict, Verdict::NotRequired);
}
