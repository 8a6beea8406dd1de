//! Policy and planning without root: pure functions over config, intent and a
//! described node.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_cni::{env::parse_cni_args, CniError, CniResult, Env, NetConf};
use podgate_kit::route::{RouteEntry, RTPROT_PODGATE};
use podgate_kit::state::Key;
use podgate_router::config::RouterConfig;
use podgate_router::intent::{select, PodIntent, Source};
use podgate_router::plan::{build, NodeView};
use podgate_router::record::Record;
use serde_json::{json, Value};

fn cfg() -> RouterConfig {
    let c: RouterConfig = serde_json::from_value(json!({
        "type": "podgate-router", "stateDir": "/tmp/x",
        "profiles": {
            "vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1", "net.ipv4.conf.IFNAME.rp_filter": "0"},
                            "masquerade": [{"source": "10.8.0.0/24"}]},
            "vpn-routed": {"sysctls": {"net.ipv4.ip_forward": "1"}, "returnRoutes": [{"dst": "10.8.0.0/24"}]}
        },
        "assign": [{"namespace": "vpn", "podNamePrefix": "openvpn", "profile": "vpn-gateway"}],
        "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]}
    }))
    .unwrap();
    c.validate().unwrap();
    c
}

fn intent(args: &str, conf_extra: Value) -> PodIntent {
    let env = Env {
        container_id: "c1".into(),
        ifname: "eth0".into(),
        args: parse_cni_args(args).unwrap(),
        ..Env::default()
    };
    let mut conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "podgate-router"});
    if let (Some(o), Value::Object(e)) = (conf.as_object_mut(), conf_extra) {
        o.extend(e);
    }
    let conf = NetConf::parse(conf.to_string().as_bytes()).unwrap();
    PodIntent::from_request(&env, &conf).unwrap()
}

fn annotations(pairs: Value) -> Value {
    json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": pairs}})
}

#[test]
fn assign_rule_selects_by_namespace_and_prefix() {
    let s = select(
        fixed_cfg(),
        &intent("K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-0", json!({})),
    )
    .unwrap()
    .unwrap();
    assert_eq!(s.name, "vpn-gateway");
    assert_eq!(s.source, Source::Assign(0));
    assert_eq!(s.masquerade, vec!["10.8.0.0/24".parse().unwrap()]);
    // Same namespace, other pod: no profile, pass-through.
    assert!(select(
        &cfg(),
        &intent("K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=web", json!({}))
    )
    .unwrap()
    .is_none());
}

#[test]
fn annotation_and_args_select_in_allowed_namespaces() {
    let s = select(
        fixed_cfg(),
        &intent(
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=web",
            annotations(json!({"podgate.dev/profile": "vpn-routed"})),
        ),
    )
    .unwrap()
    .unwrap();
    assert_eq!((s.name, s.source), ("vpn-routed", Source::Annotation));
    let s = select(
        fixed_cfg(),
        &intent(
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=web",
            json!({"args": {"cni": {"profile": "vpn-routed"}}}),
        ),
    )
    .unwrap()
    .unwrap();
    assert_eq!(s.source, Source::Args);
}

#[test]
fn refusals_name_the_rule() {
    let cases = [
        (
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=x",
            annotations(json!({"podgate.dev/profile": "vpn-routed"})),
            "allow.annotationNamespaces",
        ),
        (
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-1",
            annotations(json!({"podgate.dev/profile": "vpn-routed"})),
            "assign[0]",
        ),
        (
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=x",
            annotations(json!({"podgate.dev/profile": "nope"})),
            "refused by profiles",
        ),
        (
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-1",
            annotations(json!({"podgate.dev/masquerade": "10.9.0.0/24"})),
            "allow.pools",
        ),
        (
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-1",
            annotations(json!({"podgate.dev/masquerade": "0.0.0.0/0"})),
            "allow.pools",
        ),
        (
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-1",
            annotations(json!({"podgate.dev/masquerade": "10.8.0.1/24"})),
            "host bits",
        ),
        (
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=x",
            annotations(json!({"podgate.dev/return-routes": "10.8.1.0/24"})),
            "no podgate profile",
        ),
        (
            "K8S_POD_NAME=x",
            json!({"args": {"cni": {"profile": "vpn-routed"}}}),
            "allow.annotationNamespaces",
        ),
    ];
    for (args, extra, needle) in cases {
        let e = select(&cfg(), &intent(args, extra.clone())).unwrap_err();
        assert_eq!(e.code, 100, "{args} {extra}");
        assert!(e.msg.contains(needle), "{needle:?} not in {:?}", e.msg);
    }
}

/// Annotation pools are read as the Kubernetes API server reads a CIDR
/// (the admission policy's CEL `cidr()`): octal-looking octets, a prefix
/// length with a leading zero or a sign, zones and IPv4-mapped IPv6 are not
/// CIDRs, even where `allow.pools` would cover what they might mean.
#[test]
fn pools_are_read_as_the_api_server_reads_cidrs() {
    let mut c = cfg();
    c.allow.pools = vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()];
    let ask = |pool: &str| {
        select(
            &c,
            &intent(
                "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=x",
                annotations(json!({"podgate.dev/profile": "vpn-routed",
                                   "podgate.dev/return-routes": pool})),
            ),
        )
    };
    for bad in [
        "010.8.1.0/24",
        "10.8.1.0/024",
        "10.8.1.0/+24",
        "10.8.1.0/ 24",
        "::ffff:10.8.1.0/120",
        "::ffff:a08:100/120",
        "0:0:0:0:0:ffff:a08:100/120",
        "64:ff9b::010.8.1.0/120",
        "fe80::%eth0/64",
        "fd00:8::/064",
    ] {
        let e = ask(bad).unwrap_err();
        assert!(e.msg.contains("is not a CIDR"), "{bad}: {}", e.msg);
    }
    for (good, read) in [
        ("10.8.1.0/24", "10.8.1.0/24"),
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("FD00:8::/32", "fd00:8::/32"),
        ("64:ff9b::10.8.1.0/120", "64:ff9b::a08:100/120"),
        ("::fffe:a08:100/120", "::fffe:a08:100/120"),
    ] {
        let s = ask(good).unwrap().unwrap();
        assert_eq!(s.return_routes, vec![read.parse().unwrap()], "{good}");
    }
}

#[test]
fn annotations_narrow_pools_inside_allow() {
    let s = select(
        fixed_cfg(),
        &intent(
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-0",
            annotations(json!({"podgate.dev/masquerade": "10.8.3.0/24, 10.8.4.0/24"})),
        ),
    )
    .unwrap()
    .unwrap();
    assert_eq!(s.masquerade.len(), 2);
}

fn prev() -> CniResult {
    serde_json::from_value(json!({
        "interfaces": [{"name": "cni0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/p"}],
        "ips": [{"address": "10.22.0.5/16", "gateway": "10.22.0.1", "interface": 2}]
    }))
    .unwrap()
}

fn route(dst: &str, gw: Option<&str>, oif: u32, proto: u8) -> RouteEntry {
    RouteEntry {
        dst: dst.parse().unwrap(),
        gateway: gw.map(|g| g.parse().unwrap()),
        oif: Some(oif),
        table: 254,
        protocol: proto,
        metric: None,
        scope: 0,
        kind: 1,
        prefsrc: None,
        multipath: Vec::new(),
    }
}

fn node() -> NodeView {
    NodeView {
        routes: vec![
            route("10.22.0.0/16", None, 3, 2),
            route("10.0.0.0/24", None, 2, 2),
        ],
        addresses: vec![
            "10.22.0.1/16".parse().unwrap(),
            "10.0.0.10/24".parse().unwrap(),
        ],
        claims: vec![],
        links: vec![],
        node_snat: vec![],
        ipv6: false,
    }
}

/// A `cfg()` that lives as long as the test (a selection borrows it).
fn fixed_cfg() -> &'static RouterConfig {
    Box::leak(Box::new(cfg()))
}

/// `vpn-routed` selected from a [`fixed_cfg`].
fn routed() -> podgate_router::intent::Selection<'static> {
    select(
        fixed_cfg(),
        &intent(
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=x",
            annotations(json!({"podgate.dev/profile": "vpn-routed"})),
        ),
    )
    .unwrap()
    .unwrap()
}

#[test]
fn plan_for_gateway_profile() {
    let sel = select(
        fixed_cfg(),
        &intent("K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-0", json!({})),
    )
    .unwrap()
    .unwrap();
    let p = build(&cfg(), &sel, &Key::new("n", "c1", "eth0"), &prev(), &node()).unwrap();
    assert_eq!(p.nft_table.as_deref(), Some("podgate-eth0"));
    assert_eq!(p.masquerade[0].oifname, "eth0");
    assert!(p
        .sysctls
        .iter()
        .any(|s| s.name == "net.ipv4.conf.eth0.rp_filter"));
    assert!(p.node_routes.is_empty());
}

#[test]
fn plan_return_route_via_pod_on_connected_subnet_and_onlink_for_host_routes() {
    let p = build(
        &cfg(),
        &routed(),
        &Key::new("n", "c1", "eth0"),
        &prev(),
        &node(),
    )
    .unwrap();
    let r = &p.node_routes[0];
    assert_eq!(r.dst.to_string(), "10.8.0.0/24");
    assert_eq!(r.gateway.unwrap().to_string(), "10.22.0.5");
    assert_eq!(
        (r.oif, r.onlink, r.protocol),
        (Some(3), false, RTPROT_PODGATE)
    );

    let mut v = node();
    v.routes.push(route("10.22.0.5/32", None, 7, 3));
    let p = build(&cfg(), &routed(), &Key::new("n", "c1", "eth0"), &prev(), &v).unwrap();
    assert_eq!(
        (p.node_routes[0].oif, p.node_routes[0].onlink),
        (Some(7), true)
    );
}

/// `v` with pod `c0`'s claim of 10.8.0.0/24 (`vpn-routed`).
fn claimed_by_c0(mut v: NodeView) -> NodeView {
    let c0 = Key::new("n", "c0", "eth0");
    let other = build(&cfg(), &routed(), &c0, &prev(), &node()).unwrap();
    v.claims
        .push(Record::pending(&c0, &other, Default::default()).claim());
    v
}

#[test]
fn plan_refuses_conflicting_return_routes() {
    let key = Key::new("n", "c1", "eth0");
    // Already routed to another pod.
    let v = claimed_by_c0(node());
    let e = build(&cfg(), &routed(), &key, &prev(), &v).unwrap_err();
    assert!(e.msg.contains("already routed to pod c0"), "{}", e.msg);

    // A foreign route for the same pool.
    let mut v = node();
    v.routes.push(route("10.8.0.0/24", Some("10.0.0.1"), 2, 4));
    let e = build(&cfg(), &routed(), &key, &prev(), &v).unwrap_err();
    assert!(
        e.msg
            .contains("the node already routes 10.8.0.0/24 via 10.0.0.1 (proto static)"),
        "{}",
        e.msg
    );

    // Node address inside the pool, pod subnet overlap.
    let mut v = node();
    v.addresses.push("10.8.0.7/32".parse().unwrap());
    let e = build(&cfg(), &routed(), &key, &prev(), &v).unwrap_err();
    assert!(e.msg.contains("node's address 10.8.0.7"), "{}", e.msg);

    for (pool, needle) in [
        ("10.22.3.0/24", "pod's own subnet"),
        ("169.254.1.0/24", "link-local"),
    ] {
        let (c, sel) = routed_with(&["10.22.0.0/16", "169.254.0.0/16"], pool);
        let e = build(c, &sel, &key, &prev(), &node()).unwrap_err();
        assert!(e.msg.contains(needle), "{pool}: {}", e.msg);
    }
}

/// `vpn-routed` with `pools` annotated, where `cfg()` also allows `allow`.
fn routed_with(
    allow: &[&str],
    pools: &str,
) -> (
    &'static RouterConfig,
    podgate_router::intent::Selection<'static>,
) {
    let mut c = cfg();
    for p in allow {
        c.allow.pools.push(p.parse().unwrap());
    }
    let c: &'static RouterConfig = Box::leak(Box::new(c));
    let sel = select(
        c,
        &intent(
            "K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=x",
            annotations(
                json!({"podgate.dev/profile": "vpn-routed", "podgate.dev/return-routes": pools}),
            ),
        ),
    )
    .unwrap()
    .unwrap();
    (c, sel)
}

/// A dual-stack pod (10.22.0.5/16, fd22::5/64) on a node with default
/// routes in both families, another node's routes (10.8.5.0/24 via
/// 10.0.0.7, fd08:0:5::/48 via fd00::7), a route through an onlink gateway
/// outside every connected subnet, a multipath route with one such next
/// hop, a strict pod's host route (podgate's own protocol) and a route in
/// another table.
fn carved_node() -> NodeView {
    let mut v = node();
    v.routes.extend([
        route("0.0.0.0/0", Some("10.0.0.254"), 2, 4),
        route("10.8.5.0/24", Some("10.0.0.7"), 2, 4),
        route("10.9.0.0/16", Some("172.31.1.1"), 2, 4),
        route("10.8.40.7/32", Some("10.0.0.254"), 2, RTPROT_PODGATE),
        route("::/0", Some("fe80::1"), 2, 9),
        route("fe80::/64", None, 2, 2),
        route("fd00::/64", None, 2, 2),
        route("fd22::/64", None, 3, 2),
        route("fd08:0:5::/48", Some("fd00::7"), 2, 4),
    ]);
    let mut multipath = route("10.10.0.0/16", None, 2, 4);
    multipath.multipath = vec!["10.0.0.8".parse().unwrap(), "10.8.8.1".parse().unwrap()];
    v.routes.push(multipath);
    let mut other = route("10.8.30.0/24", Some("10.0.0.8"), 2, 4);
    other.table = 100;
    v.routes.push(other);
    v.addresses.push("fd00::10/64".parse().unwrap());
    v
}

fn dual_prev() -> CniResult {
    serde_json::from_value(json!({
        "interfaces": [{"name": "cni0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/p"}],
        "ips": [{"address": "10.22.0.5/16", "gateway": "10.22.0.1", "interface": 2},
                {"address": "fd22::5/64", "gateway": "fd22::1", "interface": 2}]
    }))
    .unwrap()
}

#[test]
fn plan_refuses_pools_overlapping_node_routes_subnets_gateways_and_claims_either_way() {
    let key = Key::new("n", "c1", "eth0");
    let plan = |pools: &str, v: &NodeView| {
        // The node's subnet and an onlink gateway's are allowed pools here.
        let (c, sel) = routed_with(&["10.0.0.0/24", "172.31.0.0/16", "fd08::/16"], pools);
        build(c, &sel, &key, &dual_prev(), v)
    };
    let v = carved_node();
    for (pool, needle) in [
        // Inside another node's route, around it, the same prefix.
        (
            "10.8.5.0/25",
            "the node already routes 10.8.5.0/24 via 10.0.0.7 (proto static)",
        ),
        (
            "10.8.4.0/23",
            "the node already routes 10.8.5.0/24 via 10.0.0.7",
        ),
        (
            "10.8.5.0/24",
            "the node already routes 10.8.5.0/24 via 10.0.0.7",
        ),
        // Inside the node's subnet, holding its gateway but no address of it.
        (
            "10.0.0.128/25",
            "it overlaps the node's subnet 10.0.0.0/24 (address 10.0.0.10)",
        ),
        // An onlink gateway outside every connected subnet.
        (
            "172.31.1.0/24",
            "it contains 172.31.1.1, the gateway of the node's route 10.9.0.0/16",
        ),
        // A multipath route's onlink next hop.
        (
            "10.8.8.0/24",
            "it contains 10.8.8.1, the gateway of the node's route 10.10.0.0/16",
        ),
        // podgate's own route no claim accounts for (a strict pod's host route).
        (
            "10.8.40.0/24",
            "the node already routes 10.8.40.7/32 via 10.0.0.254 (proto podgate)",
        ),
        // IPv6: inside, around, the node's own subnet.
        (
            "fd08:0:5:1::/64",
            "the node already routes fd08:0:5::/48 via fd00::7",
        ),
        (
            "fd08::/32",
            "the node already routes fd08:0:5::/48 via fd00::7",
        ),
    ] {
        let e = plan(pool, &v).unwrap_err();
        assert_eq!(e.code, 100, "{pool}: {}", e.msg);
        assert!(
            e.msg.starts_with(&format!("return route {pool} refused: ")) && e.msg.contains(needle),
            "{pool}: {}",
            e.msg
        );
    }
    // The default routes contain every pool and refuse none; a route in
    // another table does not either (a table looked up before main wins
    // whatever the return route's prefix).
    let p = plan("10.8.9.0/24,fd08:0:9::/64,10.8.30.0/24", &v).unwrap();
    let installed: Vec<String> = p
        .node_routes
        .iter()
        .map(|r| format!("{} via {}", r.dst, r.gateway.unwrap()))
        .collect();
    assert_eq!(
        installed,
        [
            "10.8.9.0/24 via 10.22.0.5",
            "fd08:0:9::/64 via fd22::5",
            "10.8.30.0/24 via 10.22.0.5"
        ]
    );

    // Another pod's pool, inside or around.
    let v = claimed_by_c0(carved_node());
    for pool in ["10.8.0.0/25", "10.8.0.0/23"] {
        let e = plan(pool, &v).unwrap_err();
        assert!(
            e.msg
                .contains("it overlaps 10.8.0.0/24, already routed to pod c0 (n/eth0)"),
            "{pool}: {}",
            e.msg
        );
    }
}

#[test]
fn config_errors_are_code_7() {
    for bad in [
        json!({"profiles": {}, "assign": [{"profile": "missing"}]}),
        json!({"profiles": {"p": {"sysctls": {"kernel.pid_max": "1"}}}}),
        json!({"profiles": {"p": {"masquerade": [{"source": "0.0.0.0/0"}]}}}),
        json!({"nftTable": "bad name"}),
    ] {
        let c: RouterConfig = serde_json::from_value(bad.clone()).unwrap();
        assert_eq!(CniError::from(c.validate().unwrap_err()).code, 7, "{bad}");
    }
}

mod routing {
    use super::*;
    use podgate_kit::link::Link;
    use podgate_kit::nft::{Family, Hook, SnatFinding, SnatKind};

    fn strict_cfg(max: usize) -> RouterConfig {
        let c: RouterConfig = serde_json::from_value(json!({
            "maxStrictPods": max,
            "profiles": {
                "strict": {"routing": {"mode": "strict", "uplink": "up0", "gateway": "192.0.2.254"}},
                "standard": {"routing": {"mode": "standard", "uplink": "up0", "gateway": "192.0.2.254", "table": 300}},
                "strict-masq": {"routing": {"mode": "strict", "uplink": "up0", "gateway": "192.0.2.254"},
                                "masquerade": [{"source": "10.8.0.0/24"}]},
                "strict-exempt": {"routing": {"mode": "strict", "uplink": "up0", "gateway": "192.0.2.254",
                                              "exempt": ["169.254.20.10/32", "169.254.170.23/32"]}},
                "strict-wide": {"routing": {"mode": "strict", "uplink": "up0", "gateway": "192.0.2.254",
                                            "exempt": ["10.30.0.1/32"]}},
                "clamp": {"mssClamp": 1360, "returnRoutes": [{"dst": "10.8.0.0/24"}],
                          "masquerade": [{"source": "10.9.0.0/24"}]},
                "clamp-nopool": {"mssClamp": "pmtu"},
                "strict-ds": {"routing": {"mode": "strict", "uplink": "up0", "gateway": "192.0.2.254",
                                          "gateway6": "2001:db8::fe"}},
                "strict-pool": {"routing": {"mode": "strict", "uplink": "up0", "gateway": "192.0.2.254"},
                                "returnRoutes": [{"dst": "10.8.0.0/24"}]}
            },
            "assign": [{"podNamePrefix": "ds-", "profile": "strict-ds"},
                       {"podNamePrefix": "sp-", "profile": "strict-pool"},
                       {"podNamePrefix": "s-", "profile": "strict"},
                       {"podNamePrefix": "std-", "profile": "standard"},
                       {"podNamePrefix": "m-", "profile": "strict-masq"},
                       {"podNamePrefix": "e-", "profile": "strict-exempt"},
                       {"podNamePrefix": "w-", "profile": "strict-wide"},
                       {"podNamePrefix": "c-", "profile": "clamp"},
                       {"podNamePrefix": "cn-", "profile": "clamp-nopool"}]
        }))
        .unwrap();
        c.validate().unwrap();
        c
    }

    fn ptp_prev() -> CniResult {
        serde_json::from_value(json!({
            "interfaces": [{"name": "veth9"}, {"name": "eth0", "sandbox": "/run/netns/p"}],
            "ips": [{"address": "10.30.0.7/24", "gateway": "10.30.0.1", "interface": 1}]
        }))
        .unwrap()
    }

    fn ptp_node() -> NodeView {
        NodeView {
            routes: vec![
                route("10.30.0.7/32", None, 9, 3),
                route("192.0.2.0/24", None, 2, 2),
            ],
            addresses: vec!["192.0.2.1/24".parse().unwrap()],
            claims: vec![],
            links: vec![
                Link {
                    index: 2,
                    name: "up0".into(),
                },
                Link {
                    index: 9,
                    name: "veth9".into(),
                },
            ],
            node_snat: vec![],
            ipv6: true,
        }
    }

    /// A dual-stack pod of ptp: both addresses routed through `veth9`.
    fn ds_prev() -> CniResult {
        serde_json::from_value(json!({
            "interfaces": [{"name": "veth9"}, {"name": "eth0", "sandbox": "/run/netns/p"}],
            "ips": [{"address": "10.30.0.7/24", "gateway": "10.30.0.1", "interface": 1},
                    {"address": "fd00:30::7/64", "gateway": "fd00:30::1", "interface": 1}]
        }))
        .unwrap()
    }

    fn ds_node() -> NodeView {
        let mut v = ptp_node();
        v.routes.push(route("fd00:30::7/128", None, 9, 3));
        v.routes.push(route("2001:db8::/64", None, 2, 2));
        v
    }

    fn plan_with(
        c: &RouterConfig,
        pod: &str,
        prev: &CniResult,
        view: &NodeView,
    ) -> Result<podgate_router::plan::Plan, podgate_cni::CniError> {
        let sel = select(
            c,
            &intent(
                &format!("K8S_POD_NAMESPACE=x;K8S_POD_NAME={pod}"),
                json!({}),
            ),
        )
        .unwrap()
        .unwrap();
        build(c, &sel, &Key::new("n", pod, "eth0"), prev, view)
    }

    #[test]
    fn a_dual_stack_strict_pod_is_bounded_in_both_families() {
        let r = plan_with(&strict_cfg(100), "ds-0", &ds_prev(), &ds_node())
            .unwrap()
            .routing
            .unwrap();
        let rules: Vec<String> = r.rules.iter().map(|x| x.describe()).collect();
        assert_eq!(
            rules,
            vec![
                "95: from all to fe80::/10 iif veth9 ipproto 58 lookup 255",
                "95: from all to ff02::/16 iif veth9 ipproto 58 lookup 255",
                "95: from all to fd00:30::1/128 iif veth9 ipproto 58 lookup 255",
                "96: from all to fe80::/10 iif veth9 blackhole",
                "96: from all to ff00::/8 iif veth9 blackhole",
                "100: from all iif veth9 lookup 20000",
                "100: from all iif veth9 lookup 20000",
                "100: from all to 10.30.0.7/32 iif up0 lookup 20000",
                "100: from all to fd00:30::7/128 iif up0 lookup 20000",
            ]
        );
        assert_eq!(
            r.rules.iter().filter(|x| x.v6).count(),
            7,
            "IPv6 rules: neighbour discovery, link scope, the pod's two"
        );
        let routes: Vec<String> = r.table_routes.iter().map(|x| x.describe()).collect();
        assert!(
            routes.iter().any(|x| x.contains("::/0 via 2001:db8::fe")),
            "{routes:?}"
        );
        let swaps: Vec<(String, String)> = r
            .mains
            .iter()
            .map(|m| (m.original.describe(), m.replacement.describe()))
            .collect();
        assert_eq!(swaps.len(), 2, "{swaps:?}");
        assert!(
            swaps[1].1.contains("fd00:30::7/128 via 2001:db8::fe"),
            "{swaps:?}"
        );
        // The pod has IPv6: it stays on on its interface.
        assert!(
            !r.host_if_sysctls
                .iter()
                .any(|s| s.name.contains("disable_ipv6")),
            "{:?}",
            r.host_if_sysctls
        );
        // Without an IPv6 next hop the pod is refused, naming what is missing.
        let e = plan_with(&strict_cfg(100), "s-0", &ds_prev(), &ds_node()).unwrap_err();
        assert_eq!(e.code, 100);
        assert!(
            e.msg.contains("fd00:30::7") && e.msg.contains("gateway6"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn every_ipv4_address_of_a_strict_pod_is_bounded() {
        let prev: CniResult = serde_json::from_value(json!({
            "interfaces": [{"name": "veth9"}, {"name": "eth0", "sandbox": "/run/netns/p"}],
            "ips": [{"address": "10.30.0.7/24", "interface": 1}, {"address": "10.31.0.7/24", "interface": 1}]
        }))
        .unwrap();
        let mut v = ptp_node();
        v.routes.push(route("10.31.0.7/32", None, 9, 3));
        let r = plan_with(&strict_cfg(100), "s-0", &prev, &v)
            .unwrap()
            .routing
            .unwrap();
        let to: Vec<String> = r
            .rules
            .iter()
            .filter_map(|x| x.to)
            .map(|t| t.to_string())
            .collect();
        assert_eq!(to, vec!["10.30.0.7/32", "10.31.0.7/32"]);
        assert_eq!(r.mains.len(), 2);
        // A second address routed through another interface: refused.
        let mut v = ptp_node();
        v.routes.push(route("10.31.0.7/32", None, 2, 3));
        let e = plan_with(&strict_cfg(100), "s-0", &prev, &v).unwrap_err();
        assert!(e.msg.contains("10.31.0.7"), "{}", e.msg);
    }

    #[test]
    fn a_strict_pods_return_route_pool_is_routed_through_the_uplink() {
        let p = plan_for(&strict_cfg(100), "sp-0", &ptp_node()).unwrap();
        let main: Vec<String> = p.node_routes.iter().map(|r| r.describe()).collect();
        let r = p.routing.unwrap();
        assert_eq!(main.len(), 1);
        assert!(
            main[0].starts_with("10.8.0.0/24 via 192.0.2.254") && p.node_routes[0].oif == Some(2),
            "{main:?}"
        );
        let in_table = r
            .table_routes
            .iter()
            .find(|x| x.dst.to_string() == "10.8.0.0/24")
            .unwrap();
        assert_eq!(
            (
                in_table.gateway.unwrap().to_string(),
                in_table.oif,
                in_table.onlink,
                in_table.table
            ),
            ("10.30.0.7".to_string(), Some(9), true, 20_000)
        );
        assert!(r
            .rules
            .iter()
            .any(|x| x.describe() == "100: from all to 10.8.0.0/24 iif up0 lookup 20000"));
    }

    fn plan_for(
        c: &RouterConfig,
        pod: &str,
        view: &NodeView,
    ) -> Result<podgate_router::plan::Plan, podgate_cni::CniError> {
        plan_with(c, pod, &ptp_prev(), view)
    }

    #[test]
    fn strict_exemptions_come_first_and_stay_local() {
        let r = plan_for(&strict_cfg(100), "e-0", &ptp_node())
            .unwrap()
            .routing
            .unwrap();
        let rules: Vec<String> = r.rules.iter().map(|x| x.describe()).collect();
        assert_eq!(
            rules,
            vec![
                "90: from all to 169.254.20.10/32 iif veth9 lookup 255",
                "90: from 169.254.20.10/32 to 10.30.0.7/32 lookup 20000",
                "90: from all to 169.254.170.23/32 iif veth9 lookup 255",
                "90: from 169.254.170.23/32 to 10.30.0.7/32 lookup 20000",
                "100: from all iif veth9 lookup 20000",
                "100: from all to 10.30.0.7/32 iif up0 lookup 20000"
            ]
        );
        // Proxy ARP on the host side answers the pod's gateway; an IPv4
        // pod on a node with IPv6 gets no IPv6 through its interface.
        let hs: Vec<(&str, &str)> = r
            .host_if_sysctls
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_str()))
            .collect();
        assert_eq!(
            hs,
            vec![
                ("net.ipv4.conf.veth9.proxy_arp", "1"),
                ("net.ipv4.neigh.veth9.proxy_delay", "0"),
                ("net.ipv6.conf.veth9.disable_ipv6", "1")
            ]
        );
        // An exemption covering the pod's subnet (its gateway) is refused.
        let e = plan_for(&strict_cfg(100), "w-0", &ptp_node()).unwrap_err();
        assert_eq!(e.code, 100);
        assert!(e.msg.contains("refused by routing.exempt: 10.30.0.1/32 overlaps the pod's own subnet 10.30.0.0/24"), "{}", e.msg);
    }

    #[test]
    fn mss_clamp_covers_every_pool_both_ways() {
        use podgate_kit::nft::{MssDirection, MssValue};
        let p = plan_for(&strict_cfg(100), "c-0", &ptp_node()).unwrap();
        assert_eq!(p.nft_table.as_deref(), Some("podgate-eth0"));
        let got: Vec<(String, MssDirection, MssValue)> = p
            .mss_clamp
            .iter()
            .map(|m| (m.pool.to_string(), m.direction, m.mss))
            .collect();
        let f = MssValue::Fixed(1360);
        assert_eq!(
            got,
            vec![
                ("10.9.0.0/24".into(), MssDirection::FromPool, f),
                ("10.9.0.0/24".into(), MssDirection::ToPool, f),
                ("10.8.0.0/24".into(), MssDirection::FromPool, f),
                ("10.8.0.0/24".into(), MssDirection::ToPool, f),
            ]
        );
        let e = plan_for(&strict_cfg(100), "cn-0", &ptp_node()).unwrap_err();
        assert!(e.msg.contains("refused by mssClamp"), "{}", e.msg);
    }

    #[test]
    fn strict_plan_routes_everything_through_the_uplink() {
        let p = plan_for(&strict_cfg(100), "s-0", &ptp_node()).unwrap();
        let r = p.routing.unwrap();
        assert_eq!(r.table, 20_000);
        assert_eq!(r.host_if, "veth9");
        let rules: Vec<String> = r.rules.iter().map(|x| x.describe()).collect();
        assert_eq!(
            rules,
            vec![
                "100: from all iif veth9 lookup 20000",
                "100: from all to 10.30.0.7/32 iif up0 lookup 20000"
            ]
        );
        assert_eq!(r.mains.len(), 1);
        let repl = &r.mains[0].replacement;
        assert_eq!(
            (
                repl.dst.to_string(),
                repl.gateway.unwrap().to_string(),
                repl.oif
            ),
            ("10.30.0.7/32".into(), "192.0.2.254".into(), Some(2))
        );
        assert_eq!(r.mains[0].original.oif, Some(9));
        let names: Vec<&str> = r.node_sysctls.iter().map(|s| s.name.as_str()).collect();
        assert!(
            names.contains(&"net.ipv4.tcp_early_demux")
                && names.contains(&"net.ipv4.conf.up0.accept_local")
        );
    }

    #[test]
    fn standard_plan_keeps_same_node_traffic_in_main() {
        let r = plan_for(&strict_cfg(100), "std-0", &ptp_node())
            .unwrap()
            .routing
            .unwrap();
        let rules: Vec<String> = r.rules.iter().map(|x| x.describe()).collect();
        assert_eq!(
            rules,
            vec![
                "512: from all to 10.30.0.7/32 lookup 254",
                "1535: from 10.30.0.7/32 lookup 254 suppress_prefixlength 31",
                "1536: from 10.30.0.7/32 lookup 300",
            ]
        );
        assert!(r.mains.is_empty() && r.node_sysctls.is_empty());
    }

    /// A masquerade rule in `ip nat <chain>` as the node scan reports it.
    fn snat(chain: &str, reached_from: Option<&str>, handle: u64) -> SnatFinding {
        SnatFinding {
            family: Family::Ip,
            table: "nat".into(),
            chain: chain.into(),
            reached_from: reached_from.map(Into::into),
            hook: Hook::Postrouting,
            kind: SnatKind::Masquerade,
            handle,
        }
    }

    #[test]
    fn strict_routing_is_refused_with_masquerade_node_snat_a_bridge_primary_or_no_uplink() {
        let c = strict_cfg(1);
        let e = plan_for(&c, "m-0", &ptp_node()).unwrap_err();
        assert!(e.msg.contains("masquerade"), "{}", e.msg);

        let mut v = ptp_node();
        v.node_snat.push(snat("POSTROUTING", None, 4));
        let e = plan_for(&c, "s-0", &v).unwrap_err();
        assert!(
            e.msg.contains("node SNAT") && e.msg.contains("POSTROUTING"),
            "{}",
            e.msg
        );
        // Mark-gated masquerade (hostPort hairpin, kube services) does not touch pod egress.
        let mut v = ptp_node();
        v.node_snat
            .push(snat("CNI-HOSTPORT-MASQ", Some("POSTROUTING"), 9));
        assert!(plan_for(&c, "s-0", &v).is_ok());
        // kube-proxy's nftables mode: `masquerading` in its own table, reached
        // from `nat-postrouting` (marked packets and hairpin connections).
        let mut v = ptp_node();
        v.node_snat.push(SnatFinding {
            table: "kube-proxy".into(),
            ..snat("masquerading", Some("nat-postrouting"), 35)
        });
        assert!(plan_for(&c, "s-0", &v).is_ok());
        // A chain of that name in another table is anyone's masquerade.
        let mut v = ptp_node();
        v.node_snat
            .push(snat("masquerading", Some("nat-postrouting"), 36));
        assert!(plan_for(&c, "s-0", &v).is_err());

        // A bridge primary: the pod sits on a shared subnet.
        let mut v = ptp_node();
        v.routes = vec![route("10.30.0.0/24", None, 9, 2)];
        let e = plan_for(&c, "s-0", &v).unwrap_err();
        assert!(e.msg.contains("routed primary"), "{}", e.msg);

        // Missing uplink.
        let mut v = ptp_node();
        v.links.retain(|l| l.name != "up0");
        assert!(plan_for(&c, "s-0", &v)
            .unwrap_err()
            .msg
            .contains("uplink up0"));

        // maxStrictPods.
        let first = plan_for(&c, "s-0", &ptp_node()).unwrap();
        let mut v = ptp_node();
        v.claims.push(
            Record::pending(
                &Key::new("n", "s-other", "eth0"),
                &first,
                Default::default(),
            )
            .claim(),
        );
        let e = plan_for(&c, "s-0", &v).unwrap_err();
        assert!(e.msg.contains("maxStrictPods"), "{}", e.msg);
        // ... and table auto skips the one in use.
        let c2 = strict_cfg(5);
        assert_eq!(
            plan_for(&c2, "s-0", &v).unwrap().routing.unwrap().table,
            20_001
        );
    }

    #[test]
    fn reserved_tables_are_config_errors() {
        let c: RouterConfig = serde_json::from_value(json!({
            "profiles": {"x": {"routing": {"mode": "strict", "uplink": "up0", "gateway": "192.0.2.254", "table": 254}}}
        }))
        .unwrap();
        assert_eq!(CniError::from(c.validate().unwrap_err()).code, 7);
        let bad: Result<RouterConfig, _> = serde_json::from_value(json!({
            "profiles": {"x": {"routing": {"mode": "strict", "uplink": "up0", "gateway": "192.0.2.254", "table": "any"}}}
        }));
        assert!(bad.is_err());
    }
}
