//! podgate-router through the real libcni (upstream cnitool; the runner for
//! a refusal's CNI error code, libcni 1.3's GC with valid attachments and
//! STATUS), bridge + host-local (+ portmap) primaries, Debian's and v1.10.0,
//! in throwaway node/pod namespaces.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::{
    assert_same, cnitool_container_id, require_root, vpn, CniOutcome, Netns, Primaries, TestNode,
    Verb,
};
use serde_json::{json, Value};
use std::time::Duration;

const NET: &str = "vpnnet";
const SUBNET: &str = "10.22.0.0/16";

fn router_entry(node: &TestNode) -> Value {
    json!({
        "type": "podgate-router",
        "stateDir": node.state_dir(),
        "logFile": std::env::var("PODGATE_TEST_LOG").map(std::path::PathBuf::from).unwrap_or_else(|_| node.root().join("router.log")),
        "capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "profiles": {
            "vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}, "masquerade": [{"source": "10.8.0.0/24"}]},
            "vpn-routed":  {"sysctls": {"net.ipv4.ip_forward": "1"}, "returnRoutes": [{"dst": "10.8.0.0/24"}]}
        },
        "assign": [{"namespace": "vpn", "podNamePrefix": "openvpn-gw", "profile": "vpn-gateway"}],
        "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]}
    })
}

fn setup(prefix: &str, with_portmap: bool) -> TestNode {
    setup_with(prefix, with_portmap, Primaries::Debian, "1.0.0")
}

/// A node with `primaries` and the conflist at `cni_version`.
fn setup_with(
    prefix: &str,
    with_portmap: bool,
    primaries: Primaries,
    cni_version: &str,
) -> TestNode {
    require_root();
    let node = TestNode::with_primaries(prefix, primaries);
    let mut extra = Vec::new();
    if with_portmap {
        extra
            .push(json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}));
    }
    extra.push(router_entry(&node));
    node.write_conflist(NET, &node.bridge_conflist(NET, cni_version, SUBNET, extra));
    node
}

fn pod_args(ns: &str, name: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=x"
    )
}

fn annotations(pairs: Value) -> Value {
    json!({"io.kubernetes.cri.pod-annotations": pairs})
}

/// A new pod netns with forwarding explicitly off, as nodes show it where the
/// primary turns it off or devconf_inherit_init_net=2 (a new netns copies the
/// machine's value otherwise, and a test that inherits 1 proves nothing).
fn pod(node: &TestNode, name: &str) -> Netns {
    let p = node.pod(name);
    p.set_forwarding(false);
    p
}

fn node_routes(node: &TestNode) -> String {
    node.ns.exec_ok(&["ip", "route", "show", "table", "all"])
}

fn add(node: &TestNode, pod: &Netns, args: &str, cap: Option<Value>) -> CniOutcome {
    node.cni(Verb::Add, NET, pod, "eth0", Some(args), cap)
}

fn del(node: &TestNode, pod: &Netns, args: &str) -> CniOutcome {
    node.cni(Verb::Del, NET, pod, "eth0", Some(args), None)
}

/// ADD through the runner as container `cid`, for a test that asserts the
/// CNI error code (cnitool prints only the message).
fn add_runner(
    node: &TestNode,
    pod: &Netns,
    cid: &str,
    args: &str,
    cap: Option<Value>,
) -> CniOutcome {
    node.runner(Verb::Add, NET, pod.path(), cid, "eth0", Some(args), cap)
}

fn del_runner(node: &TestNode, pod: &Netns, cid: &str, args: &str) -> CniOutcome {
    node.runner(Verb::Del, NET, pod.path(), cid, "eth0", Some(args), None)
}

fn pod_ip(result: &Value) -> String {
    result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// Ask the server what source address it saw; None on timeout.
fn seen_source(from: &Netns, ip: &str, port: u16) -> Option<String> {
    podgate_integration::tcp_request(from, ip, port, Duration::from_secs(3))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The OpenVPN-pod scenario: a client on the tunnel reaches the server's tunnel
/// address always, and the pod behind it only when podgate made the VPN pod a
/// router (masqueraded or with a return route).
#[test]
fn openvpn_article_scenario() {
    openvpn_scenario(Primaries::Debian);
}

/// The same with the reference plugins v1.10.0's bridge, host-local and
/// portmap.
#[test]
fn openvpn_article_scenario_upstream_plugins() {
    openvpn_scenario(Primaries::Upstream);
}

fn openvpn_scenario(primaries: Primaries) {
    let node = setup_with("ovpn", true, primaries, "1.0.0");
    let vpn = vpn::client(&node, "c");

    let backend = pod(&node, "backend");
    let b = add(&node, &backend, &pod_args("default", "backend"), None);
    b.assert_ok();
    let backend_ip = pod_ip(b.result.as_ref().unwrap());
    let _srv = podgate_integration::tcp_listen_peer_echo(&backend, 8080);

    // (pod name, annotations, expected source at the backend: None = silent)
    let rounds: [(&str, Value, Option<&str>); 3] = [
        ("plain-vpn", json!({}), None),
        ("openvpn-gw-0", json!({}), Some("VPN_POD_IP")),
        (
            "vpn-routed-0",
            json!({"podgate.dev/profile": "vpn-routed"}),
            Some("10.8.0.2"),
        ),
    ];
    for (round, (name, ann, expect)) in rounds.into_iter().enumerate() {
        let server_pod = pod(&node, name);
        let cap = json!({
            "portMappings": [{"hostPort": 1194, "containerPort": 1194, "protocol": "udp"}],
            "io.kubernetes.cri.pod-annotations": ann,
        });
        let out = add(
            &node,
            &server_pod,
            &pod_args("vpn", name),
            Some(cap.clone()),
        );
        out.assert_ok();
        let vpn_ip = pod_ip(out.result.as_ref().unwrap());
        let forwarding = server_pod.sysctl_get("net.ipv4.ip_forward");
        assert_eq!(
            forwarding,
            if expect.is_some() { "1" } else { "0" },
            "{name}: ip_forward in the pod"
        );

        let server = vpn::server(&server_pod, &vpn.key);
        let client = vpn::connect(
            &vpn.client,
            &vpn.key,
            41000 + round as u16,
            &[("10.22.0.0", "255.255.0.0")],
        );
        assert!(
            vpn::wait_for(|| podgate_integration::ping(&vpn.client, "10.8.0.1", 1), 20),
            "{name}: client never reached the tunnel peer 10.8.0.1\n{}\nnode nat:\n{}",
            vpn::logs(&vpn.key),
            node.ns.exec_ok(&["nft", "list", "ruleset"]),
        );
        let seen = seen_source(&vpn.client, &backend_ip, 8080);
        match expect {
            None => assert_eq!(seen, None, "{name}: backend must be silent without podgate"),
            Some("VPN_POD_IP") => assert_eq!(
                seen.as_deref(),
                Some(vpn_ip.as_str()),
                "{name}: masqueraded to the VPN pod's address"
            ),
            Some(src) => assert_eq!(
                seen.as_deref(),
                Some(src),
                "{name}: client's own tunnel address visible"
            ),
        }
        if name.starts_with("vpn-routed") {
            let routes = node_routes(&node);
            assert!(
                routes.contains(&format!("10.8.0.0/24 via {vpn_ip}")),
                "{routes}"
            );
            assert!(routes.contains("proto 94"), "{routes}");
        }
        vpn::stop(client);
        vpn::stop(server);
        // The runtime passes the same capability args on DEL (portmap needs them).
        node.cni(
            Verb::Del,
            NET,
            &server_pod,
            "eth0",
            Some(&pod_args("vpn", name)),
            Some(cap),
        )
        .assert_ok();
        assert!(
            !node_routes(&node).contains("10.8.0.0/24"),
            "{name}: return route left behind"
        );
    }
    del(&node, &backend, &pod_args("default", "backend")).assert_ok();
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
}

/// A return route on its own: ADD puts the pool's route via the pod on the
/// node and turns the pod's forwarding on, CHECK finds both, DEL takes them
/// away and leaves no record.
#[test]
fn a_return_route_is_added_checked_and_deleted() {
    let node = setup("retroute", false);
    let p = pod(&node, "routed");
    let args = pod_args("vpn", "web");
    let cap = annotations(json!({"podgate.dev/profile": "vpn-routed"}));
    let out = add(&node, &p, &args, Some(cap.clone()));
    out.assert_ok();
    let ip = pod_ip(out.result.as_ref().unwrap());
    let routes = node_routes(&node);
    assert!(
        routes.contains(&format!("10.8.0.0/24 via {ip}")),
        "{routes}"
    );
    assert_eq!(p.sysctl_get("net.ipv4.ip_forward"), "1");
    node.cni(Verb::Check, NET, &p, "eth0", Some(&args), Some(cap.clone()))
        .assert_ok();
    node.cni(Verb::Del, NET, &p, "eth0", Some(&args), Some(cap))
        .assert_ok();
    let routes = node_routes(&node);
    assert!(!routes.contains("10.8.0.0/24"), "{routes}");
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
}

#[test]
fn selection_by_assign_annotation_and_args_and_check_drift() {
    let node = setup("select", false);
    // args.cni as Multus writes it into the plugin's config.
    let mut with_args = router_entry(&node);
    with_args["args"] = json!({"cni": {"profile": "vpn-routed"}});
    node.write_conflist(
        "argsnet",
        &node.bridge_conflist("argsnet", "1.0.0", "10.23.0.0/16", vec![with_args]),
    );

    // assign rule
    let p1 = pod(&node, "assign");
    let r = add(&node, &p1, &pod_args("vpn", "openvpn-gw-1"), None);
    r.assert_ok();
    assert_eq!(p1.sysctl_get("net.ipv4.ip_forward"), "1");
    let nft = p1.exec_ok(&["nft", "list", "table", "inet", "podgate-eth0"]);
    assert!(
        nft.contains("ip saddr 10.8.0.0/24 oifname \"eth0\" masquerade"),
        "{nft}"
    );
    node.cni(
        Verb::Check,
        NET,
        &p1,
        "eth0",
        Some(&pod_args("vpn", "openvpn-gw-1")),
        None,
    )
    .assert_ok();

    // CHECK names drift: forwarding turned off, masquerade table removed.
    p1.sysctl_set("net.ipv4.ip_forward", "0");
    p1.exec_ok(&["nft", "delete", "table", "inet", "podgate-eth0"]);
    let c = node.cni(
        Verb::Check,
        NET,
        &p1,
        "eth0",
        Some(&pod_args("vpn", "openvpn-gw-1")),
        None,
    );
    assert!(!c.success());
    let msg = c.error_msg().unwrap_or_default().to_string();
    assert!(msg.contains("net.ipv4.ip_forward is 0, want 1"), "{msg}");
    assert!(msg.contains("inet podgate-eth0 is missing"), "{msg}");
    del(&node, &p1, &pod_args("vpn", "openvpn-gw-1")).assert_ok();

    // annotation
    let p2 = pod(&node, "ann");
    add(
        &node,
        &p2,
        &pod_args("vpn", "web"),
        Some(annotations(json!({"podgate.dev/profile": "vpn-routed"}))),
    )
    .assert_ok();
    assert!(node_routes(&node).contains("10.8.0.0/24 via"));
    del(&node, &p2, &pod_args("vpn", "web")).assert_ok();

    // args.cni
    let p3 = pod(&node, "args");
    let r = node.cni(
        Verb::Add,
        "argsnet",
        &p3,
        "eth0",
        Some(&pod_args("vpn", "web")),
        None,
    );
    r.assert_ok();
    assert!(
        node_routes(&node).contains("10.8.0.0/24 via 10.23."),
        "{}",
        node_routes(&node)
    );
    node.cni(
        Verb::Del,
        "argsnet",
        &p3,
        "eth0",
        Some(&pod_args("vpn", "web")),
        None,
    )
    .assert_ok();

    // no profile: passed through untouched
    let p4 = pod(&node, "none");
    add(&node, &p4, &pod_args("default", "web"), None).assert_ok();
    assert_eq!(p4.sysctl_get("net.ipv4.ip_forward"), "0");
    assert!(!p4
        .exec(&["nft", "list", "table", "inet", "podgate-eth0"])
        .status
        .success());
    del(&node, &p4, &pod_args("default", "web")).assert_ok();
    assert!(node.state_files().is_empty());
}

#[test]
fn refusals_apply_nothing() {
    let node = setup("refuse", false);
    let warm = pod(&node, "warm");
    add(&node, &warm, &pod_args("default", "warm"), None).assert_ok();

    let other = pod(&node, "owner");
    let owned_by = format!(
        "already routed to pod {}",
        cnitool_container_id(other.path())
    );
    add(
        &node,
        &other,
        &pod_args("vpn", "web"),
        Some(annotations(json!({"podgate.dev/profile": "vpn-routed"}))),
    )
    .assert_ok();
    // What the return-route checks read of the node (its IPv4 addresses and
    // routes, and only those for an IPv4 pool): an address of the node inside
    // a pool, and a route to a pool someone else installed.
    let br = podgate_integration::bridge_name(NET);
    node.ns
        .exec_ok(&["ip", "addr", "add", "10.8.5.1/32", "dev", &br]);
    node.ns.exec_ok(&[
        "ip",
        "route",
        "add",
        "10.8.6.0/24",
        "dev",
        &br,
        "proto",
        "static",
    ]);
    let before = node.settled_snapshot();

    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "default",
            json!({"podgate.dev/profile": "vpn-routed"}),
            "allow.annotationNamespaces",
        ),
        (
            "vpn",
            json!({"podgate.dev/profile": "vpn-gateway", "podgate.dev/masquerade": "192.168.0.0/24"}),
            "allow.pools",
        ),
        (
            "vpn",
            json!({"podgate.dev/profile": "vpn-routed", "podgate.dev/return-routes": "0.0.0.0/0"}),
            "allow.pools",
        ),
        (
            "vpn",
            json!({"podgate.dev/profile": "nope"}),
            "refused by profiles",
        ),
        (
            "vpn",
            json!({"podgate.dev/profile": "vpn-routed"}),
            &owned_by,
        ),
        (
            "vpn",
            json!({"podgate.dev/profile": "vpn-routed", "podgate.dev/return-routes": "10.8.5.0/24"}),
            "contains the node's address 10.8.5.1",
        ),
        (
            "vpn",
            json!({"podgate.dev/profile": "vpn-routed", "podgate.dev/return-routes": "10.8.6.0/24"}),
            "the node already routes 10.8.6.0/24 (proto static)",
        ),
    ];
    for (i, (ns, ann, needle)) in cases.into_iter().enumerate() {
        let p = pod(&node, &format!("bad{i}"));
        let cid = format!("bad{i}");
        let out = add_runner(
            &node,
            &p,
            &cid,
            &pod_args(ns, "web"),
            Some(annotations(ann.clone())),
        );
        out.assert_cni_error(100);
        assert!(
            out.error_msg().unwrap_or_default().contains(needle),
            "{ann}: {:?}",
            out.error_msg()
        );
        assert_eq!(
            p.sysctl_get("net.ipv4.ip_forward"),
            "0",
            "{ann}: nothing applied in the pod"
        );
        // libcni does not DEL a failed ADD by itself; the runtime does.
        del_runner(&node, &p, &cid, &pod_args(ns, "web")).assert_ok();
    }
    assert_same(&before, &node.snapshot());
    del(&node, &other, &pod_args("vpn", "web")).assert_ok();
    del(&node, &warm, &pod_args("default", "warm")).assert_ok();
    assert!(node.state_files().is_empty());
}

/// The network of [`pools_overlapping_the_nodes_routes_subnets_gateways_or_other_pods_pools_are_refused`]:
/// dual-stack pods.
const POOLNET: &str = "poolnet";

/// A node whose uplink `up0` holds 10.0.0.5/24 and fd00::5/64, with its
/// default routes via 10.0.0.254 and fd00::fe, another node (10.0.0.7,
/// fd00::7) routing 10.8.5.0/24 and fd08:0:5::/48 (the static route the
/// README recommends for a routed pool), a route through an onlink gateway
/// 10.8.7.1 outside every connected subnet and a multipath one with an
/// onlink next hop 10.8.8.1; dual-stack pods on the
/// bridge primary (10.24.0.0/16, fd24::/64), and `vpn` may pick pools in
/// 10.8.0.0/16, the node's subnet 10.0.0.0/24 and fd08::/16.
fn pool_node() -> TestNode {
    let node = setup("pools", false);
    let mut router = router_entry(&node);
    router["allow"]["pools"] = json!(["10.8.0.0/16", "10.0.0.0/24", "fd08::/16"]);
    let mut list = node.bridge_conflist(POOLNET, "1.0.0", "10.24.0.0/16", vec![router]);
    list["plugins"][0]["ipam"]["ranges"] =
        json!([[{"subnet": "10.24.0.0/16"}], [{"subnet": "fd24::/64"}]]);
    list["plugins"][0]["ipam"]["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
    node.write_conflist(POOLNET, &list);
    // No duplicate address detection: the bridge's IPv6 address would
    // finish it (and get its local routes) in the middle of the test.
    node.ns.sysctl_set("net.ipv6.conf.default.accept_dad", "0");
    node.ns.sysctl_set("net.ipv6.conf.all.accept_dad", "0");
    node.ns.sh_ok(
        "ip link add up0 type veth peer name up0p && ip link set up0p up && ip link set up0 up && \
         ip addr add 10.0.0.5/24 dev up0 && ip -6 addr add fd00::5/64 dev up0 nodad && \
         ip route add default via 10.0.0.254 && ip -6 route add default via fd00::fe && \
         ip route add 10.8.5.0/24 via 10.0.0.7 proto static && \
         ip -6 route add fd08:0:5::/48 via fd00::7 proto static && \
         ip route add 10.9.0.0/16 via 10.8.7.1 dev up0 onlink proto static && \
         ip route add 10.10.0.0/16 proto static nexthop via 10.0.0.8 dev up0 \
             nexthop via 10.8.8.1 dev up0 onlink",
    );
    node
}

/// A return-route pool that overlaps, either way, what the node routes
/// elsewhere is refused before anything is applied, in both families: a
/// pool carved out of another node's route (10.8.5.0/25 inside 10.8.5.0/24,
/// fd08:0:5:1::/64 inside fd08:0:5::/48), a pool around one (10.8.4.0/23,
/// fd08::/32), a pool inside the node's subnet holding its gateway but no
/// node address (10.0.0.128/25), a pool holding an onlink gateway (a
/// route's own, a multipath route's next hop's), and a
/// pool inside or around another pod's (10.8.0.0/25, 10.8.0.0/23 with
/// 10.8.0.0/24 routed to pod `owner`). The node's default routes contain
/// every pool and refuse none: a pool that overlaps nothing else is routed
/// to the pod in both families.
#[test]
fn pools_overlapping_the_nodes_routes_subnets_gateways_or_other_pods_pools_are_refused() {
    let node = pool_node();
    let args = pod_args("vpn", "web");
    let pool_annotations = |pools: Option<&str>| {
        let mut ann = json!({"podgate.dev/profile": "vpn-routed"});
        if let Some(pools) = pools {
            ann["podgate.dev/return-routes"] = json!(pools);
        }
        annotations(ann)
    };
    // Through the runner as container `cid`: the refusals' CNI error code,
    // and the owner's container ID they name.
    let add_pool = |p: &Netns, cid: &str, pools: Option<&str>| {
        node.runner(
            Verb::Add,
            POOLNET,
            p.path(),
            cid,
            "eth0",
            Some(&args),
            Some(pool_annotations(pools)),
        )
    };
    let del_pool = |p: &Netns, cid: &str| {
        node.runner(Verb::Del, POOLNET, p.path(), cid, "eth0", Some(&args), None)
            .assert_ok();
    };
    let owner = pod(&node, "owner");
    add_pool(&owner, "owner", None).assert_ok();
    let before = node.settled_snapshot();

    let cases = [
        (
            "10.8.5.0/25",
            "the node already routes 10.8.5.0/24 via 10.0.0.7",
        ),
        (
            "10.8.4.0/23",
            "the node already routes 10.8.5.0/24 via 10.0.0.7",
        ),
        ("10.0.0.128/25", "overlaps the node's subnet 10.0.0.0/24"),
        (
            "10.8.7.0/24",
            "it contains 10.8.7.1, the gateway of the node's route 10.9.0.0/16",
        ),
        (
            "10.8.8.0/24",
            "it contains 10.8.8.1, the gateway of the node's route 10.10.0.0/16",
        ),
        (
            "fd08:0:5:1::/64",
            "the node already routes fd08:0:5::/48 via fd00::7",
        ),
        (
            "fd08::/32",
            "the node already routes fd08:0:5::/48 via fd00::7",
        ),
        ("10.8.0.0/25", "already routed to pod owner"),
        ("10.8.0.0/23", "already routed to pod owner"),
    ];
    let mut wrong = Vec::new();
    for (i, (pool, needle)) in cases.into_iter().enumerate() {
        let p = pod(&node, &format!("carve{i}"));
        let cid = format!("carve{i}");
        let out = add_pool(&p, &cid, Some(pool));
        let msg = out.error_msg().unwrap_or_default().to_string();
        if out.error_code() != Some(100) || !msg.contains(needle) {
            wrong.push(format!(
                "{pool}: want refusal {needle:?}, got code {:?} {msg:?}",
                out.error_code()
            ));
        } else if p.sysctl_get("net.ipv4.ip_forward") != "0" {
            wrong.push(format!("{pool}: refused, but forwarding is on in the pod"));
        }
        // libcni does not DEL a failed ADD by itself; the runtime does.
        del_pool(&p, &cid);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_same(&before, &node.snapshot());

    // Inside the default routes and nothing else: routed to the pod.
    let free = pod(&node, "free");
    let out = node.cni(
        Verb::Add,
        POOLNET,
        &free,
        "eth0",
        Some(&args),
        Some(pool_annotations(Some("10.8.9.0/24,fd08:0:9::/64"))),
    );
    out.assert_ok();
    let result = out.result.as_ref().unwrap();
    let v4 = pod_ip(result);
    let v6 = result["ips"][1]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let routes = node_routes(&node);
    assert!(
        routes.contains(&format!("10.8.9.0/24 via {v4}")),
        "{routes}"
    );
    let routes = node
        .ns
        .exec_ok(&["ip", "-6", "route", "show", "table", "all"]);
    assert!(
        routes.contains(&format!("fd08:0:9::/64 via {v6}")),
        "{routes}"
    );
    node.cni(Verb::Del, POOLNET, &free, "eth0", Some(&args), None)
        .assert_ok();
    del_pool(&owner, "owner");
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
}

#[test]
fn del_after_netns_is_gone_leaves_nothing() {
    del_after_netns_is_gone(Primaries::Debian);
}

/// The same with the reference plugins v1.10.0's bridge and host-local.
#[test]
fn del_after_netns_is_gone_leaves_nothing_upstream_plugins() {
    del_after_netns_is_gone(Primaries::Upstream);
}

fn del_after_netns_is_gone(primaries: Primaries) {
    let node = setup_with("gone", false, primaries, "1.0.0");
    let warm = pod(&node, "warm");
    add(&node, &warm, &pod_args("default", "warm"), None).assert_ok();
    let before = node.settled_snapshot();

    let p = pod(&node, "routed");
    add(
        &node,
        &p,
        &pod_args("vpn", "web"),
        Some(annotations(json!({"podgate.dev/profile": "vpn-routed"}))),
    )
    .assert_ok();
    assert!(node_routes(&node).contains("10.8.0.0/24"));
    assert_eq!(node.state_files().len(), 1);
    let path = p.path().to_path_buf();
    drop(p); // the sandbox's netns is deleted before DEL
    assert!(!path.exists());
    // DEL gets the stale path, exactly as a runtime passes it.
    node.cni_with_netns_path(
        Verb::Del,
        NET,
        &path,
        "eth0",
        Some(&pod_args("vpn", "web")),
        None,
    )
    .assert_ok();
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
    // The kernel destroys a deleted netns asynchronously (cleanup_net) and
    // the pod's veth peer on the node goes with it; under load that can lag
    // the DEL. Wait for it (bounded) so the snapshot compares what podgate
    // left, not the kernel's lag.
    let gone = podgate_integration::vpn::wait_for(|| node.snapshot().links == before.links, 20);
    assert!(
        gone,
        "the deleted pod's veth is still on the node after 20 s"
    );
    assert_same(&before, &node.snapshot());
    // DEL again: idempotent.
    node.cni_with_netns_path(
        Verb::Del,
        NET,
        &path,
        "eth0",
        Some(&pod_args("vpn", "web")),
        None,
    )
    .assert_ok();
    del(&node, &warm, &pod_args("default", "warm")).assert_ok();
}

/// Run `f` for every pod on its own thread, all at once; each must succeed.
fn all_at_once(
    pods: &[Netns],
    f: impl Fn(usize, &Netns) -> podgate_integration::CniOutcome + Sync,
) {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, p)| s.spawn(move || f(i, p)))
            .collect();
        for h in handles {
            h.join().unwrap().assert_ok();
        }
    });
}

#[test]
fn thirty_two_pods_at_once_leave_the_node_as_before() {
    let node = setup("many", false);
    let warm = pod(&node, "warm");
    add(&node, &warm, &pod_args("default", "warm"), None).assert_ok();
    let before = node.settled_snapshot();

    let pods: Vec<Netns> = (0..32).map(|i| pod(&node, &format!("p{i}"))).collect();
    let ann = |i: usize| {
        annotations(
            json!({"podgate.dev/profile": "vpn-routed", "podgate.dev/return-routes": format!("10.8.{i}.0/24")}),
        )
    };
    all_at_once(&pods, |i, p| {
        add(&node, p, &pod_args("vpn", &format!("p{i}")), Some(ann(i)))
    });
    let routes = node_routes(&node);
    for i in 0..32 {
        assert!(
            routes.contains(&format!("10.8.{i}.0/24 via")),
            "pool {i} missing:\n{routes}"
        );
    }
    assert_eq!(node.state_files().len(), 32);
    all_at_once(&pods, |i, p| {
        del(&node, p, &pod_args("vpn", &format!("p{i}")))
    });
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
    assert_same(&before, &node.snapshot());
    del(&node, &warm, &pod_args("default", "warm")).assert_ok();
}

fn routed(pool: &str) -> Value {
    annotations(json!({"podgate.dev/profile": "vpn-routed", "podgate.dev/return-routes": pool}))
}

/// host-local's files in the node's `ipam/`, but the reservation of `ip`:
/// an attachment only GC learns of keeps its address, as bridge v1.10.0
/// implements no GC and so never passes it on to host-local's.
fn ipam_files_but(node: &TestNode, ip: Option<&str>) -> Vec<String> {
    let mut files = podgate_integration::files_below(&node.ipam_dir());
    files.retain(|f| ip.is_none_or(|ip| *f != format!("{NET}/{ip}")));
    files
}

/// GC through libcni 1.3 with a valid-attachments list, as a runtime sends
/// it after a restart (cniVersion 1.1.0, the v1.10.0 primaries): a pod still
/// valid keeps everything; one the runtime no longer lists (its sandbox
/// still there) is collected by the router's GC although libcni's cache lost
/// it (its ADD's result never cached: the runtime died first), by libcni's
/// DEL when cached: routes, records, the pods' forwarding and addresses go
/// (but the uncached one's address, see [`ipam_files_but`]), and the node is
/// as with the valid pod alone.
#[test]
fn gc_through_libcni_keeps_valid_attachments_and_collects_the_rest() {
    let node = setup_with("gc", false, Primaries::Upstream, "1.1.0");
    let warm = pod(&node, "warm");
    add(&node, &warm, &pod_args("default", "warm"), None).assert_ok();
    let keep = pod(&node, "keep");
    add(
        &node,
        &keep,
        &pod_args("vpn", "keep"),
        Some(routed("10.8.1.0/24")),
    )
    .assert_ok();
    let with_keep = node.settled_snapshot();
    let ipam_with_keep = podgate_integration::files_below(&node.ipam_dir());
    let uncached = pod(&node, "uncached");
    let uncached_ip = add(
        &node,
        &uncached,
        &pod_args("vpn", "uncached"),
        Some(routed("10.8.2.0/24")),
    )
    .assert_ok()
    .first_ip();
    let cached = pod(&node, "cached");
    add(
        &node,
        &cached,
        &pod_args("vpn", "cached"),
        Some(routed("10.8.3.0/24")),
    )
    .assert_ok();
    assert_eq!(node.state_files().len(), 3);
    let uncached_id = cnitool_container_id(uncached.path());
    let entry = node
        .cache_dir()
        .join(format!("results/{NET}-{uncached_id}-eth0"));
    std::fs::remove_file(&entry).unwrap_or_else(|e| panic!("{}: {e}", entry.display()));

    let valid = [
        cnitool_container_id(warm.path()),
        cnitool_container_id(keep.path()),
    ];
    node.runner_gc(NET, &[(&valid[0], "eth0"), (&valid[1], "eth0")])
        .assert_ok();
    let routes = node_routes(&node);
    assert!(
        routes.contains("10.8.1.0/24"),
        "the valid pod's route must stay:\n{routes}"
    );
    for pool in ["10.8.2.0/24", "10.8.3.0/24"] {
        assert!(
            !routes.contains(pool),
            "{pool} outlived its pod's GC:\n{routes}"
        );
    }
    assert_eq!(node.state_files().len(), 1, "{:?}", node.state_files());
    assert_eq!(keep.sysctl_get("net.ipv4.ip_forward"), "1");
    for p in [&uncached, &cached] {
        assert_eq!(
            p.sysctl_get("net.ipv4.ip_forward"),
            "0",
            "forwarding restored"
        );
    }
    node.cni(
        Verb::Check,
        NET,
        &keep,
        "eth0",
        Some(&pod_args("vpn", "keep")),
        Some(routed("10.8.1.0/24")),
    )
    .assert_ok();
    // The uncached pod's interface is its sandbox's to take (GC does not
    // remove links); with it gone, nothing of either is left.
    drop(uncached);
    drop(cached);
    let gone = vpn::wait_for(|| node.snapshot().links == with_keep.links, 20);
    assert!(
        gone,
        "a collected pod's veth is still on the node after 20 s"
    );
    assert_same(&with_keep, &node.snapshot());
    assert_eq!(
        ipam_files_but(&node, uncached_ip.as_deref()),
        ipam_with_keep
    );
    del(&node, &keep, &pod_args("vpn", "keep")).assert_ok();
    del(&node, &warm, &pod_args("default", "warm")).assert_ok();
    assert!(node.state_files().is_empty());
}

/// `cnitool gc` (no valid attachments: everything goes) for every spec
/// version podgate declares, the v1.10.0 primaries before the router:
/// libcni DELs every cached attachment, and at 1.1.0 sends GC, which
/// collects an attachment libcni's cache lost too. Nothing is left: routes,
/// records, pods' forwarding, addresses (but the lost one's, see
/// [`ipam_files_but`]), interfaces.
#[test]
fn cnitool_gc_leaves_nothing_for_every_spec_version() {
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let node = setup_with(
            &format!("cgc{version}"),
            false,
            Primaries::Upstream,
            version,
        );
        let warm = pod(&node, "warm");
        add(&node, &warm, &pod_args("default", "warm"), None).assert_ok();
        del(&node, &warm, &pod_args("default", "warm")).assert_ok();
        let before = node.settled_snapshot();
        let ipam_before = podgate_integration::files_below(&node.ipam_dir());
        let gw = pod(&node, "gw");
        add(&node, &gw, &pod_args("vpn", "openvpn-gw-0"), None).assert_ok();
        let rt = pod(&node, "rt");
        add(
            &node,
            &rt,
            &pod_args("vpn", "rt"),
            Some(routed("10.8.4.0/24")),
        )
        .assert_ok();
        let mut pods = vec![&gw, &rt];
        let lost = pod(&node, "lost");
        let mut lost_ip = None;
        if version == "1.1.0" {
            lost_ip = add(
                &node,
                &lost,
                &pod_args("vpn", "lost"),
                Some(routed("10.8.5.0/24")),
            )
            .assert_ok()
            .first_ip();
            let id = cnitool_container_id(lost.path());
            std::fs::remove_file(node.cache_dir().join(format!("results/{NET}-{id}-eth0")))
                .unwrap();
            pods.push(&lost);
        }

        node.cnitool_gc(NET).assert_ok();
        assert!(
            node.state_files().is_empty(),
            "{version}: {:?}",
            node.state_files()
        );
        let routes = node_routes(&node);
        assert!(!routes.contains("10.8."), "{version}: {routes}");
        for p in pods {
            assert_eq!(p.sysctl_get("net.ipv4.ip_forward"), "0", "{version}");
            assert!(
                !p.exec_ok(&["nft", "list", "tables"]).contains("podgate"),
                "{version}: masquerade left in a pod"
            );
        }
        drop(lost);
        let gone = vpn::wait_for(|| node.snapshot().links == before.links, 20);
        assert!(
            gone,
            "{version}: a pod's veth is still on the node after 20 s"
        );
        assert_same(&before, &node.snapshot());
        assert_eq!(
            ipam_files_but(&node, lost_ip.as_deref()),
            ipam_before,
            "{version}"
        );
    }
}

/// STATUS through libcni 1.3 (cniVersion 1.1.0, the v1.10.0 primaries,
/// libcni sends it to no older version): the router's answer is "state dir
/// unusable" (code 50 through the runner) while its stateDir cannot be
/// opened, and success once it can.
#[test]
fn status_through_libcni_reports_an_unusable_state_dir() {
    let node = setup_with("status", false, Primaries::Upstream, "1.1.0");
    node.cnitool_status(NET).assert_ok();
    node.runner_status(NET).assert_ok();
    let state = node.state_dir();
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::write(&state, b"not a directory").unwrap();
    let out = node.cnitool_status(NET);
    assert!(
        out.assert_failed().contains("state dir unusable"),
        "{out:?}"
    );
    let out = node.runner_status(NET);
    out.assert_cni_error(50);
    assert!(
        out.error_msg().unwrap().contains("state dir unusable"),
        "{out:?}"
    );
    std::fs::remove_file(&state).unwrap();
    node.cnitool_status(NET).assert_ok();
}

/// podRoutes land in the pod and in the result; a step that fails half-way
/// (an unreachable pod-route gateway, after sysctls and masquerade were
/// applied) rolls everything back.
#[test]
fn pod_routes_and_rollback_on_half_way_failure() {
    require_root();
    let node = TestNode::new("rollback");
    let mut entry = router_entry(&node);
    entry["profiles"]["with-routes"] = json!({"sysctls": {"net.ipv4.ip_forward": "1"},
        "podRoutes": [{"dst": "10.99.0.0/24", "gw": "10.22.0.1"}]});
    entry["profiles"]["broken"] = json!({"sysctls": {"net.ipv4.ip_forward": "1"},
        "masquerade": [{"source": "10.8.0.0/24"}],
        "podRoutes": [{"dst": "10.99.0.0/24", "gw": "10.98.0.1"}]});
    entry["assign"] = json!([{"podNamePrefix": "routes", "profile": "with-routes"}, {"podNamePrefix": "broken", "profile": "broken"}]);
    node.write_conflist(
        NET,
        &node.bridge_conflist(NET, "1.0.0", SUBNET, vec![entry]),
    );

    let p = pod(&node, "routes");
    let out = add(&node, &p, &pod_args("default", "routes-0"), None);
    out.assert_ok();
    let routes = out.result.as_ref().unwrap()["routes"].to_string();
    assert!(
        routes.contains("10.99.0.0/24") && routes.contains("10.22.0.1"),
        "{routes}"
    );
    let in_pod = p.exec_ok(&["ip", "route"]);
    assert!(
        in_pod.contains("10.99.0.0/24 via 10.22.0.1 dev eth0"),
        "{in_pod}"
    );
    del(&node, &p, &pod_args("default", "routes-0")).assert_ok();
    assert!(!p.exec_ok(&["ip", "route"]).contains("10.99.0.0/24"));

    let b = pod(&node, "broken");
    let out = add_runner(&node, &b, "broken", &pod_args("default", "broken-0"), None);
    out.assert_cni_error(101);
    assert!(
        out.error_msg().unwrap().contains("10.99.0.0/24"),
        "{:?}",
        out.error_msg()
    );
    assert_eq!(
        b.sysctl_get("net.ipv4.ip_forward"),
        "0",
        "sysctl rolled back"
    );
    assert!(
        !b.exec(&["nft", "list", "table", "inet", "podgate-eth0"])
            .status
            .success(),
        "masquerade rolled back"
    );
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
    del_runner(&node, &b, "broken", &pod_args("default", "broken-0")).assert_ok();
}

/// 32 concurrent ADDs against a log one line short of `logMaxBytes`: they all
/// race to rotate it. The filler must be the whole rotated copy (rotated
/// once, nothing written into it after the rename) and every ADD's line must
/// be in the new file exactly once, whole.
#[test]
fn log_rotation_under_thirty_two_concurrent_adds_loses_no_line() {
    require_root();
    let node = TestNode::new("logrot");
    let log = node.root().join("router.log");
    let max: usize = 64 * 1024;
    let mut entry = router_entry(&node);
    entry["logFile"] = json!(log);
    entry["logMaxBytes"] = json!(max);
    node.write_conflist(
        NET,
        &node.bridge_conflist(NET, "1.0.0", SUBNET, vec![entry]),
    );
    let filler = format!("{{\"filler\":\"{}\"}}", "f".repeat(max - 64));
    std::fs::write(&log, format!("{filler}\n")).unwrap();

    let pods: Vec<Netns> = (0..32).map(|i| pod(&node, &format!("r{i}"))).collect();
    all_at_once(&pods, |i, p| {
        add(&node, p, &pod_args("vpn", &format!("openvpn-gw-{i}")), None)
    });
    let rotated = std::fs::read_to_string(node.root().join("router.log.1")).unwrap();
    assert!(
        rotated == format!("{filler}\n"),
        "rotated copy holds the filler only"
    );
    let current = std::fs::read_to_string(&log).unwrap();
    let mut applied = std::collections::BTreeMap::new();
    for line in current.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("torn or interleaved line ({e}): {line}"));
        if v["msg"] == "applied" {
            *applied
                .entry(v["containerID"].as_str().unwrap().to_string())
                .or_insert(0) += 1;
        }
    }
    let want: std::collections::BTreeMap<String, i32> = pods
        .iter()
        .map(|p| (cnitool_container_id(p.path()), 1))
        .collect();
    assert_eq!(applied, want, "every ADD's line exactly once");
    assert!(
        current.len() <= max,
        "{} bytes > logMaxBytes",
        current.len()
    );
    all_at_once(&pods, |i, p| {
        del(&node, p, &pod_args("vpn", &format!("openvpn-gw-{i}")))
    });
}

/// Sysctls go through /proc/sys files the pod thread opens in the pod's
/// namespace and this thread writes later: a per-interface one
/// (`conf/IFNAME/...`) lands on the pod's interface, the rest go back on DEL; one
/// the pod's namespace lacks fails the ADD before anything changed, with the
/// sysctl and the namespace named.
#[test]
fn sysctls_through_handles_per_interface_and_missing() {
    require_root();
    let node = TestNode::new("sysfd");
    let mut entry = router_entry(&node);
    entry["profiles"]["per-if"] = json!({"sysctls": {
        "net.ipv4.ip_forward": "1",
        "net.ipv4.conf.IFNAME.rp_filter": "2",
    }});
    entry["profiles"]["missing"] = json!({"sysctls": {
        "net.ipv4.ip_forward": "1",
        "net.ipv4.conf.IFNAME.no_such_knob": "1",
    }, "masquerade": [{"source": "10.8.0.0/24"}]});
    let conf = node.bridge_conflist(NET, "1.0.0", SUBNET, vec![entry]);
    node.write_conflist(NET, &conf);
    let warm = pod(&node, "warm");
    add(&node, &warm, &pod_args("default", "warm"), None).assert_ok();
    let before = node.settled_snapshot();

    let p = pod(&node, "perif");
    // eth0 is made by the primary in the same ADD and takes this value.
    p.sysctl_set("net.ipv4.conf.default.rp_filter", "0");
    let args = pod_args("vpn", "web");
    let ann = Some(annotations(json!({"podgate.dev/profile": "per-if"})));
    add(&node, &p, &args, ann).assert_ok();
    assert_eq!(p.sysctl_get("net.ipv4.conf.eth0.rp_filter"), "2");
    assert_eq!(p.sysctl_get("net.ipv4.ip_forward"), "1");
    assert_eq!(p.sysctl_get("net.ipv4.conf.default.rp_filter"), "0");
    del(&node, &p, &args).assert_ok();
    // The primary's DEL removed eth0 with its conf/; ip_forward went back.
    assert_eq!(p.sysctl_get("net.ipv4.ip_forward"), "0");

    let q = pod(&node, "missing");
    let ann = Some(annotations(json!({"podgate.dev/profile": "missing"})));
    let out = add_runner(&node, &q, "missing", &args, ann);
    out.assert_cni_error(101);
    let msg = out.error_msg().unwrap_or_default().to_string();
    assert!(
        msg.contains("net.ipv4.conf.eth0.no_such_knob")
            && msg.contains(&*q.path().to_string_lossy()),
        "the error names the sysctl and the pod's netns: {msg}"
    );
    assert_eq!(q.sysctl_get("net.ipv4.ip_forward"), "0", "nothing applied");
    assert!(
        q.exec_ok(&["nft", "list", "tables"]).trim().is_empty(),
        "no nf_tables table in the pod"
    );
    del_runner(&node, &q, "missing", &args).assert_ok();
    assert_same(&before, &node.snapshot());
    del(&node, &warm, &pod_args("default", "warm")).assert_ok();
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
}
