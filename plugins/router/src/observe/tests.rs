//! Which node reads a plan makes (the fake kernel logs each one), and that
//! the refusals reading them still get what they need.

use super::*;
use crate::config::RouterConfig;
use crate::intent::Source;
use crate::kernel::fake::Fake;
use crate::plan;
use ipnet::IpNet;
use podgate_cni::{CniError, CniResult};
use podgate_kit::link::Link;
use podgate_kit::route::{RouteSpec, RTPROT_PODGATE};
use podgate_kit::state::Key;
use serde_json::json;

fn cfg(profiles: serde_json::Value) -> RouterConfig {
    let c: RouterConfig = serde_json::from_value(json!({
        "profiles": profiles,
        "allow": {"pools": ["10.0.0.0/8", "fd00::/8"]},
    }))
    .unwrap();
    c.validate().unwrap();
    c
}

fn sel<'c>(cfg: &'c RouterConfig, profile: &str, return_routes: &[&str]) -> Selection<'c> {
    let (name, profile) = cfg.profiles.get_key_value(profile).unwrap();
    Selection {
        name,
        profile,
        source: Source::Assign(0),
        masquerade: Vec::new(),
        return_routes: return_routes.iter().map(|p| p.parse().unwrap()).collect(),
    }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// A node with both families: the pod's subnets connected on index 7, a
/// node address of each family, a foreign (static) route of each family.
fn node() -> Fake {
    let mut k = Fake::default();
    for (dst, proto) in [
        ("10.22.1.0/24", 2),
        ("fd22:1::/64", 2),
        ("10.70.0.0/24", 4),
        ("fd70::/64", 4),
    ] {
        let mut r = RouteSpec::new(net(dst));
        r.oif = Some(7);
        r.protocol = proto;
        k.routes.push(r);
    }
    k.addresses = vec![net("10.22.1.1/24"), net("10.60.0.1/32"), net("fd60::1/128")];
    k.links = vec![Link {
        index: 7,
        name: "pgph1".into(),
    }];
    k
}

/// What the pod has on eth0: one address of each family.
fn prev() -> CniResult {
    serde_json::from_value(json!({
        "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
        "ips": [
            {"address": "10.22.1.5/24", "interface": 0},
            {"address": "fd22:1::5/64", "interface": 0},
        ],
    }))
    .unwrap()
}

fn routed() -> RouterConfig {
    cfg(json!({"r": {"sysctls": {"net.ipv4.ip_forward": "1"}}}))
}

/// Observe for `pools` through a fresh [`node`]: the view, and the reads made.
fn observe(sel: &Selection) -> (NodeView, Vec<String>, bool) {
    let mut k = node();
    let mut asked = false;
    let view = node_view(&mut k, &Needs::of(sel), || {
        asked = true;
        Vec::new()
    })
    .unwrap();
    (view, k.calls, asked)
}

#[test]
fn an_ipv4_only_plan_never_reads_ipv6() {
    let cfg = routed();
    let s = sel(&cfg, "r", &["10.9.0.0/24"]);
    let (view, calls, claims) = observe(&s);
    assert_eq!(
        calls,
        ["route list v6=false table=254", "address list v6=false"]
    );
    assert!(claims, "return routes check the other pods' pools");
    assert!(view.routes.iter().all(|r| r.dst.addr().is_ipv4()));
    assert!(view.addresses.iter().all(|a| a.addr().is_ipv4()));
    // And the plan is built from it: the return route via the pod's IPv4
    // address out of the connected route's interface.
    let p = plan::build(&cfg, &s, &Key::new("n", "c", "eth0"), &prev(), &view).unwrap();
    assert_eq!(p.node_routes.len(), 1);
    assert_eq!(p.node_routes[0].gateway, Some("10.22.1.5".parse().unwrap()));
    assert_eq!(p.node_routes[0].oif, Some(7));
}

#[test]
fn an_ipv6_only_plan_never_reads_ipv4() {
    let cfg = routed();
    let (_, calls, _) = observe(&sel(&cfg, "r", &["fd09::/64"]));
    assert_eq!(
        calls,
        ["route list v6=true table=254", "address list v6=true"]
    );
}

#[test]
fn a_dual_stack_plan_reads_both_families() {
    let cfg = routed();
    let s = sel(&cfg, "r", &["10.9.0.0/24", "fd09::/64"]);
    let (view, calls, _) = observe(&s);
    assert_eq!(
        calls,
        [
            "route list v6=false table=254",
            "route list v6=true table=254",
            "address list v6=false",
            "address list v6=true",
        ]
    );
    let p = plan::build(&cfg, &s, &Key::new("n", "c", "eth0"), &prev(), &view).unwrap();
    let via: Vec<_> = p.node_routes.iter().map(|r| r.gateway).collect();
    assert_eq!(
        via,
        [
            Some("10.22.1.5".parse().unwrap()),
            Some("fd22:1::5".parse().unwrap())
        ]
    );
}

#[test]
fn a_masquerade_or_sysctl_only_plan_reads_nothing() {
    let cfg = cfg(json!({"m": {"sysctls": {"net.ipv4.ip_forward": "1"},
                              "masquerade": [{"source": "10.8.0.0/24"}]}}));
    let needs = Needs::of(&sel(&cfg, "m", &[]));
    assert!(!needs.reads_node());
    assert_eq!(needs, Needs::default());
    let (_, calls, claims) = observe(&sel(&cfg, "m", &[]));
    assert!(calls.is_empty(), "{calls:?}");
    assert!(!claims);
}

#[test]
fn a_routing_boundary_reads_its_family_links_and_for_strict_snat() {
    let standard = cfg(
        json!({"s": {"routing": {"mode": "standard", "uplink": "pgup",
        "gateway": "192.0.2.254", "table": 20010}}}),
    );
    let (_, calls, claims) = observe(&sel(&standard, "s", &[]));
    assert_eq!(calls, ["route list v6=false", "link list"]);
    assert!(claims, "tables of the other pods");
    // A free table is one no route of either family uses.
    let auto = cfg(
        json!({"s": {"routing": {"mode": "standard", "uplink": "pgup",
        "gateway": "192.0.2.254"}}}),
    );
    let (_, calls, _) = observe(&sel(&auto, "s", &[]));
    assert_eq!(
        calls,
        ["route list v6=false", "route list v6=true", "link list"]
    );
    let v6 = cfg(
        json!({"s": {"routing": {"mode": "standard", "uplink": "pgup",
        "gateway": "fd00::fe", "table": 20010}}}),
    );
    let (_, calls, _) = observe(&sel(&v6, "s", &[]));
    assert_eq!(calls, ["route list v6=true", "link list"]);
    let strict = cfg(json!({"s": {"routing": {"mode": "strict", "uplink": "pgup",
        "gateway": "192.0.2.254", "table": 20010}}}));
    let (_, calls, _) = observe(&sel(&strict, "s", &[]));
    // Strict bounds every address of the pod, of either family, and turns
    // IPv6 off on a pod's interface when the pod has none and the node has it.
    assert_eq!(
        calls,
        [
            "route list v6=false",
            "route list v6=true",
            "link list",
            "sysctl read net.ipv6.conf.all.disable_ipv6",
            "nft find snat"
        ]
    );
}

/// The refusals that read the dumps, each in both families: what a plan
/// reads is still enough to refuse.
#[test]
fn refusals_reading_the_node_still_refuse_in_each_family() {
    let cfg = routed();
    let key = Key::new("n", "c", "eth0");
    let refused = |pools: &[&str]| {
        let s = sel(&cfg, "r", pools);
        let (view, _, _) = observe(&s);
        plan::build(&cfg, &s, &key, &prev(), &view).unwrap_err().msg
    };
    let m = refused(&["10.60.0.0/24"]);
    assert!(m.contains("contains the node's address 10.60.0.1"), "{m}");
    let m = refused(&["fd60::/64"]);
    assert!(m.contains("contains the node's address fd60::1"), "{m}");
    let m = refused(&["10.70.0.0/25"]);
    assert!(
        m.contains("the node already routes 10.70.0.0/24 (proto static)"),
        "{m}"
    );
    let m = refused(&["fd70::/48"]);
    assert!(
        m.contains("the node already routes fd70::/64 (proto static)"),
        "{m}"
    );
    // An IPv6 pool is checked even when an IPv4 one comes first and passes.
    let m = refused(&["10.9.0.0/24", "fd60::/64"]);
    assert!(m.contains("fd60::1"), "{m}");
    // A route podgate owns that no live attachment claims (a strict pod's
    // host route, one no record describes) counts too: the live pods'
    // pools are their claims, and stale ones overlapping the pool are
    // cleared before the node is read.
    let s = sel(&cfg, "r", &["10.70.0.0/23"]);
    let mut k = node();
    if let Some(r) = k.routes.iter_mut().find(|r| r.dst == net("10.70.0.0/24")) {
        r.protocol = RTPROT_PODGATE;
    }
    let view = node_view(&mut k, &Needs::of(&s), Vec::new).unwrap();
    let m = plan::build(&cfg, &s, &key, &prev(), &view).unwrap_err().msg;
    assert!(
        m.contains("the node already routes 10.70.0.0/24 (proto podgate)"),
        "{m}"
    );
}

#[test]
fn a_failed_read_fails_the_observation_naming_it() {
    let cfg = routed();
    let s = sel(&cfg, "r", &["10.9.0.0/24"]);
    let mut k = node();
    k.fail_call(2, libc::EPERM);
    let e: CniError = node_view(&mut k, &Needs::of(&s), Vec::new)
        .unwrap_err()
        .into();
    assert!(e.msg.contains("reading node addresses"), "{}", e.msg);
}

/// The CNI error of a failing kernel call carries its errno and object in
/// `details` (JSON), beside the message naming what the router was doing.
#[test]
fn a_failed_kernel_call_reaches_the_cni_error_details() {
    let cfg = routed();
    let s = sel(&cfg, "r", &["10.9.0.0/24"]);
    let mut k = node();
    k.fail_call(2, libc::EPERM);
    let e: CniError = node_view(&mut k, &Needs::of(&s), Vec::new)
        .unwrap_err()
        .into();
    assert_eq!(e.code, podgate_cni::code::APPLY_FAILED);
    let d: serde_json::Value = serde_json::from_str(&e.details)
        .unwrap_or_else(|err| panic!("details {:?}: {err}", e.details));
    assert_eq!(d["errno"], libc::EPERM, "{d}");
    assert_eq!(d["errnoName"], "EPERM", "{d}");
    assert_eq!(d["object"], "address list v6=false", "{d}");
    assert_eq!(d["family"], "fake", "{d}");
}

/// Return routes read the main table alone: routes of other tables (a
/// foreign route to the pool, a more specific connected route to the pod,
/// the local table's) change nothing a plan decides, the plans built from
/// the main table and from every table are equal, refusals too.
#[test]
fn return_routes_read_the_main_table_alone_and_plan_as_from_every_table() {
    let cfg = routed();
    let key = Key::new("n", "c", "eth0");
    let mut k = node();
    for (dst, table, oif) in [
        ("10.9.0.0/24", 100, None),
        ("10.22.1.5/32", 100, Some(9)),
        ("10.9.0.1/32", 255, Some(1)),
        ("fd09::/64", 100, None),
    ] {
        let mut r = RouteSpec::new(net(dst));
        r.table = table;
        r.oif = oif;
        r.protocol = 4;
        k.routes.push(r);
    }
    for pools in [&["10.9.0.0/24", "fd09::/64"][..], &["10.70.0.0/24"][..]] {
        let s = sel(&cfg, "r", pools);
        let needs = Needs::of(&s);
        assert!(!needs.all_tables);
        k.calls.clear();
        let main = node_view(&mut k, &needs, Vec::new).unwrap();
        assert!(
            k.calls
                .iter()
                .all(|c| !c.starts_with("route list") || c.ends_with("table=254")),
            "{:?}",
            k.calls
        );
        assert!(main.routes.iter().all(|r| r.table == TABLE_MAIN));
        let every = node_view(
            &mut k,
            &Needs {
                all_tables: true,
                ..needs
            },
            Vec::new,
        )
        .unwrap();
        assert!(every.routes.len() > main.routes.len());
        let a = plan::build(&cfg, &s, &key, &prev(), &main).map(|p| p.node_routes);
        let b = plan::build(&cfg, &s, &key, &prev(), &every).map(|p| p.node_routes);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}
