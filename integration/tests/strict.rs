//! Strict and standard routing (issue: every packet of a protected pod passes
//! its security boundary). A routed primary (ptp + host-local: one veth and
//! one /32 host route per pod) and an uplink veth to a "fabric" netns that is
//! the boundary: its nftables filter drops TCP to port 8080 of pod B. Behind
//! the fabric an "outside" host (198.51.100.7, 2001:db8:51::7) stands for
//! anything off-node. Three networks: IPv4 (`routed`), dual-stack
//! (`routed-ds`) and two IPv4 ranges (`routed-two`); the node and the fabric
//! have IPv6, as nodes of an IPv4 cluster usually do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::agent::{wait_for, Agent};
use podgate_integration::{
    assert_same, bin_dir, cnitool_container_id, ping, require_root, tcp_connect_ok, tcp_listen,
    tcp_listen_peer_echo, tcp_request, udp_answer, udp_request, CniOutcome, Netns, Primaries,
    TestNode, Verb,
};
use serde_json::{json, Value};
use std::time::Duration;

const NET: &str = "routed";
/// ptp + host-local with an IPv4 and an IPv6 range: dual-stack pods; its
/// router entry has the profile with an IPv6 next hop.
const NET_DS: &str = "routed-ds";
/// The same without that profile (no `gateway6` anywhere).
const NET_DS4: &str = "routed-ds4";
/// ptp + host-local with two IPv4 ranges: two IPv4 addresses per pod.
const NET_TWO: &str = "routed-two";
/// A strict VPN pod's client pool (`returnRoutes`).
const POOL: &str = "10.8.0.0/24";

const OUTSIDE: &str = "198.51.100.7";
const OUTSIDE6: &str = "2001:db8:51::7";
/// The fabric's address on the node's uplink: both families' next hop.
const FABRIC6: &str = "2001:db8::fe";
/// NodeLocal DNSCache's address, on a node-side veth end standing in for its
/// `nodelocaldns` dummy interface.
const NODE_LOCAL_DNS: &str = "169.254.20.10";
const NODE_LOCAL_DNS_NET: &str = "169.254.20.10/32";

struct Lab {
    node: TestNode,
    fabric: Netns,
    outside: Netns,
}

fn lab(prefix: &str) -> Lab {
    lab_with(prefix, Primaries::Debian)
}

/// The lab with `primaries`' ptp and host-local.
fn lab_with(prefix: &str, primaries: Primaries) -> Lab {
    require_root();
    let node = TestNode::with_primaries(prefix, primaries);
    let fabric = Netns::new_with_forwarding("fabric", true);
    node.ns.exec_ok(&[
        "ip",
        "link",
        "add",
        "pgup0",
        "type",
        "veth",
        "peer",
        "name",
        "fab0",
        "netns",
        fabric.name(),
    ]);
    node.ns
        .exec_ok(&["ip", "addr", "add", "192.0.2.1/24", "dev", "pgup0"]);
    node.ns.exec_ok(&["ip", "link", "set", "pgup0", "up"]);
    fabric.exec_ok(&["ip", "addr", "add", "192.0.2.254/24", "dev", "fab0"]);
    fabric.exec_ok(&["ip", "link", "set", "fab0", "up"]);
    node.ns.exec_ok(&[
        "ip",
        "-6",
        "addr",
        "add",
        "2001:db8::1/64",
        "dev",
        "pgup0",
        "nodad",
    ]);
    fabric.exec_ok(&[
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{FABRIC6}/64"),
        "dev",
        "fab0",
        "nodad",
    ]);
    for pods in [
        "10.30.0.0/24",
        "10.32.0.0/24",
        "10.33.0.0/24",
        "10.34.0.0/24",
        "10.35.0.0/24",
        POOL,
    ] {
        fabric.exec_ok(&["ip", "route", "add", pods, "via", "192.0.2.1"]);
    }
    for pods in ["fd00:32::/64", "fd00:35::/64"] {
        fabric.exec_ok(&["ip", "-6", "route", "add", pods, "via", "2001:db8::1"]);
    }
    let outside = Netns::new_with_forwarding("outside", false);
    fabric.exec_ok(&[
        "ip",
        "link",
        "add",
        "fab1",
        "type",
        "veth",
        "peer",
        "name",
        "out0",
        "netns",
        outside.name(),
    ]);
    fabric.exec_ok(&["ip", "addr", "add", "198.51.100.1/24", "dev", "fab1"]);
    fabric.exec_ok(&["ip", "link", "set", "fab1", "up"]);
    outside.exec_ok(&["ip", "addr", "add", &format!("{OUTSIDE}/24"), "dev", "out0"]);
    outside.exec_ok(&["ip", "link", "set", "out0", "up"]);
    outside.exec_ok(&["ip", "route", "add", "default", "via", "198.51.100.1"]);
    fabric.exec_ok(&[
        "ip",
        "-6",
        "addr",
        "add",
        "2001:db8:51::1/64",
        "dev",
        "fab1",
        "nodad",
    ]);
    outside.exec_ok(&[
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{OUTSIDE6}/64"),
        "dev",
        "out0",
        "nodad",
    ]);
    outside.exec_ok(&[
        "ip",
        "-6",
        "route",
        "add",
        "default",
        "via",
        "2001:db8:51::1",
    ]);
    // The fabric hairpins packets back to the node; redirects would short-cut it.
    fabric.sysctl_set("net.ipv4.conf.all.send_redirects", "0");
    fabric.sysctl_set("net.ipv4.conf.fab0.send_redirects", "0");
    node.ns.sysctl_set("net.ipv4.tcp_early_demux", "1");
    node.ns.sysctl_set("net.ipv4.udp_early_demux", "1");

    let routing = |mode: &str| json!({"mode": mode, "uplink": "pgup0", "gateway": "192.0.2.254", "table": "auto"});
    let router = json!(
    {"type": "podgate-router", "stateDir": node.state_dir(), "logFile": node.root().join("router.log"),
     "profiles": {
         "protected-strict": {"routing": routing("strict")},
         "protected-exempt": {"routing": {"mode": "strict", "uplink": "pgup0", "gateway": "192.0.2.254",
                                          "exempt": [NODE_LOCAL_DNS_NET]}},
         "protected-standard": {"routing": routing("standard")},
         "strict-masq": {"routing": routing("strict"), "masquerade": [{"source": "10.8.0.0/24"}]},
         "strict-wide": {"routing": {"mode": "strict", "uplink": "pgup0", "gateway": "192.0.2.254",
                                     "exempt": ["10.30.0.0/16"]}},
         "protected-pool": {"routing": routing("strict"), "returnRoutes": [{"dst": POOL}]}
     },
     "assign": [
         {"podNamePrefix": "b-strict", "profile": "protected-strict"},
         {"podNamePrefix": "b-exempt", "profile": "protected-exempt"},
         {"podNamePrefix": "b-standard", "profile": "protected-standard"},
         {"podNamePrefix": "b-masq", "profile": "strict-masq"},
         {"podNamePrefix": "b-wide", "profile": "strict-wide"},
         {"podNamePrefix": "b-pool", "profile": "protected-pool"}
     ]});
    let ranges = |ranges: Value, routes: Value| {
        json!({"type": "ptp", "ipMasq": false,
               "ipam": {"type": "host-local", "dataDir": node.ipam_dir(), "ranges": ranges, "routes": routes}})
    };
    // The dual-stack network's entry has the one profile with an IPv6 next
    // hop; the others keep to what every release accepts.
    let mut router_ds = router.clone();
    router_ds["profiles"]["protected-ds"] = json!({"routing": {"mode": "strict", "uplink": "pgup0",
        "gateway": "192.0.2.254", "gateway6": FABRIC6}});
    router_ds["assign"]
        .as_array_mut()
        .unwrap()
        .push(json!({"podNamePrefix": "b-ds", "profile": "protected-ds"}));
    let v4_default = json!([{"dst": "0.0.0.0/0"}]);
    let ds_default = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
    for (net, primary, entry) in [
        (
            NET,
            ranges(json!([[{"subnet": "10.30.0.0/24"}]]), v4_default.clone()),
            &router,
        ),
        (
            NET_DS,
            ranges(
                json!([[{"subnet": "10.32.0.0/24"}], [{"subnet": "fd00:32::/64"}]]),
                ds_default.clone(),
            ),
            &router_ds,
        ),
        (
            NET_DS4,
            ranges(
                json!([[{"subnet": "10.35.0.0/24"}], [{"subnet": "fd00:35::/64"}]]),
                ds_default,
            ),
            &router,
        ),
        (
            NET_TWO,
            ranges(
                json!([[{"subnet": "10.33.0.0/24"}], [{"subnet": "10.34.0.0/24"}]]),
                v4_default,
            ),
            &router,
        ),
    ] {
        let conf = json!({"cniVersion": "1.0.0", "name": net, "plugins": [primary, entry]});
        node.write_conflist(net, &conf);
    }
    Lab {
        node,
        fabric,
        outside,
    }
}

fn args(name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}")
}

fn add(lab: &Lab, pod: &Netns, name: &str) -> CniOutcome {
    add_on(lab, NET, pod, name)
}

fn del(lab: &Lab, pod: &Netns, name: &str) {
    del_on(lab, NET, pod, name);
}

fn add_on(lab: &Lab, net: &str, pod: &Netns, name: &str) -> CniOutcome {
    lab.node
        .cni(Verb::Add, net, pod, "eth0", Some(&args(name)), None)
}

fn del_on(lab: &Lab, net: &str, pod: &Netns, name: &str) {
    lab.node
        .cni(Verb::Del, net, pod, "eth0", Some(&args(name)), None)
        .assert_ok();
}

fn check_on(lab: &Lab, net: &str, pod: &Netns, name: &str) -> CniOutcome {
    lab.node
        .cni(Verb::Check, net, pod, "eth0", Some(&args(name)), None)
}

/// The result's addresses without prefix length, in order.
fn ips_of(out: &CniOutcome) -> Vec<String> {
    out.ips()
        .iter()
        .map(|a| a.split('/').next().unwrap().to_string())
        .collect()
}

/// The pod's gateway of the family of `v6`, from the result.
fn gateway_of(out: &CniOutcome, v6: bool) -> String {
    out.result.as_ref().unwrap()["ips"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|ip| ip["gateway"].as_str())
        .find(|g| g.contains(':') == v6)
        .unwrap()
        .to_string()
}

/// The node side of the pod's veth as ptp reports it: name and MAC.
fn host_veth(out: &CniOutcome) -> (String, String) {
    let i = &out.result.as_ref().unwrap()["interfaces"][0];
    (
        i["name"].as_str().unwrap().to_string(),
        i["mac"].as_str().unwrap().to_string(),
    )
}

/// The IPv6 link-local address the kernel gives an interface with `mac`
/// (EUI-64, the default `addr_gen_mode`), scoped to the pod's `eth0`: the
/// address of its veth's node side as the pod reaches it.
fn link_local_of(mac: &str) -> String {
    let b: Vec<u8> = mac
        .split(':')
        .map(|x| u8::from_str_radix(x, 16).unwrap())
        .collect();
    format!(
        "fe80::{:02x}{:02x}:{:02x}ff:fe{:02x}:{:02x}{:02x}%eth0",
        b[0] ^ 2,
        b[1],
        b[2],
        b[3],
        b[4],
        b[5]
    )
}

/// Wait (up to 5 s) until no IPv6 address of `ns` is tentative: duplicate
/// address detection done, so IPv6 works as far as the kernel is concerned.
fn ipv6_settled(ns: &Netns) {
    for _ in 0..50 {
        if ns
            .exec_ok(&["ip", "-6", "addr", "show", "tentative"])
            .trim()
            .is_empty()
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{}: IPv6 addresses stay tentative", ns.name());
}

/// `ip -d rule` of both families, as an operator compares them.
fn rules_d(ns: &Netns) -> String {
    ns.exec_ok(&["ip", "-d", "-4", "rule", "show"])
        + &ns.exec_ok(&["ip", "-d", "-6", "rule", "show"])
}

/// `verb` through the runner on `net` as container `name`, for a test that
/// asserts the CNI error code (cnitool prints only the message).
fn runner_on(lab: &Lab, verb: Verb, net: &str, pod: &Netns, name: &str) -> CniOutcome {
    lab.node
        .runner(verb, net, pod.path(), name, "eth0", Some(&args(name)), None)
}

fn runner(lab: &Lab, verb: Verb, pod: &Netns, name: &str) -> CniOutcome {
    runner_on(lab, verb, NET, pod, name)
}

/// CHECK of cnitool's attachment of `pod` on `net` through the runner (same
/// container ID, same cache): a drift's CNI error code.
fn runner_check_on(lab: &Lab, net: &str, pod: &Netns, name: &str) -> CniOutcome {
    lab.node.runner(
        Verb::Check,
        net,
        pod.path(),
        &cnitool_container_id(pod.path()),
        "eth0",
        Some(&args(name)),
        None,
    )
}

fn ip_of(out: &CniOutcome) -> String {
    let v: &Value = out.result.as_ref().unwrap();
    v["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// Boundary filter in the fabric: count everything to and from B, drop TCP
/// 8080 to B and TCP 7272 from B (to anything, the node included).
fn fabric_filter(fabric: &Netns, b: &str) {
    fabric_filter_all(fabric, &[b]);
}

/// [`fabric_filter`] for every address (or prefix) of B, of either family.
fn fabric_filter_all(fabric: &Netns, bs: &[&str]) {
    let mut rules = String::new();
    for b in bs {
        let ip = if b.contains(':') { "ip6" } else { "ip" };
        rules += &format!(
            "  {ip} daddr {b} counter comment \"to-b\"\n  {ip} saddr {b} counter comment \"from-b\"\n  {ip} daddr {b} tcp dport 8080 counter drop\n  {ip} saddr {b} tcp dport 7272 counter drop\n"
        );
    }
    let rules = format!(
        "table inet boundary {{\n chain filter_forward {{\n  type filter hook forward priority 0; policy accept;\n{rules} }}\n}}\n"
    );
    let out = fabric
        .command("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(rules.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(
        out.status.success(),
        "nft -f: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Packets counted by the fabric rules with this comment.
fn counted(fabric: &Netns, comment: &str) -> u64 {
    let out = fabric.exec_ok(&["nft", "-j", "list", "table", "inet", "boundary"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.get("rule"))
        .filter(|r| r["comment"].as_str() == Some(comment))
        .filter_map(|r| r["expr"].as_array())
        .flat_map(|ex| {
            ex.iter()
                .filter_map(|x| x.get("counter"))
                .map(|c| c["packets"].as_u64().unwrap_or(0))
        })
        .sum()
}

/// Packets to B that crossed the fabric.
fn crossed(fabric: &Netns) -> u64 {
    counted(fabric, "to-b")
}

/// Packets from B that crossed the fabric.
fn crossed_from(fabric: &Netns) -> u64 {
    counted(fabric, "from-b")
}

const T: Duration = Duration::from_secs(2);

#[test]
fn strict_sends_same_node_and_node_traffic_through_the_boundary() {
    strict_through_the_boundary(Primaries::Debian);
}

/// The same with the reference plugins v1.10.0's ptp and host-local.
#[test]
fn strict_sends_same_node_and_node_traffic_through_the_boundary_upstream_plugins() {
    strict_through_the_boundary(Primaries::Upstream);
}

fn strict_through_the_boundary(primaries: Primaries) {
    let lab = lab_with("strict", primaries);
    let before = lab.node.settled_snapshot();

    let a = lab.node.pod("a");
    let b = lab.node.pod("b-strict");
    let out_a = add(&lab, &a, "a-client");
    out_a.assert_ok();
    let out_b = add(&lab, &b, "b-strict-0");
    out_b.assert_ok();
    let b_ip = ip_of(&out_b);
    fabric_filter(&lab.fabric, &b_ip);
    let _s1 = tcp_listen(&b, 8080);
    let _s2 = tcp_listen(&b, 9090);

    assert_eq!(lab.node.ns.sysctl_get("net.ipv4.tcp_early_demux"), "0");
    assert_eq!(lab.node.ns.sysctl_get("net.ipv4.udp_early_demux"), "0");

    let c0 = crossed(&lab.fabric);
    assert!(
        !tcp_connect_ok(&a, &b_ip, 8080, T),
        "pod A opened 8080 on strict pod B past the boundary"
    );
    assert!(
        !tcp_connect_ok(&lab.node.ns, &b_ip, 8080, T),
        "the node opened 8080 on strict pod B"
    );
    assert!(
        tcp_connect_ok(&a, &b_ip, 9090, T),
        "pod A must reach B:9090 through the fabric"
    );
    assert!(
        tcp_connect_ok(&lab.node.ns, &b_ip, 9090, T),
        "the node must reach B:9090 (kubelet probes)"
    );
    let c1 = crossed(&lab.fabric);
    assert!(
        c1 >= c0 + 4,
        "same-node and node traffic must cross the fabric: {c0} -> {c1}"
    );

    // CHECK holds, then names drift.
    check(&lab, &b, "b-strict-0").assert_ok();

    del(&lab, &b, "b-strict-0");
    del(&lab, &a, "a-client");
    assert_eq!(
        lab.node.ns.sysctl_get("net.ipv4.tcp_early_demux"),
        "1",
        "restored after the last strict pod"
    );
    assert!(
        lab.node.state_files().is_empty(),
        "{:?}",
        lab.node.state_files()
    );
    assert_same(&before, &lab.node.settled_snapshot());
}

/// Issue 17: nothing has talked to the pod yet (so it has not learned its
/// gateway's MAC from a request of the node's), and its first packets are
/// its own: a TCP connection and a DNS-style UDP exchange with a host beyond
/// the fabric. Then what the pod reaches on its own node, and how.
#[test]
fn strict_pod_starts_connections_right_after_add() {
    strict_pod_first_packets(Primaries::Debian);
}

/// The same with the reference plugins v1.10.0's ptp and host-local.
#[test]
fn strict_pod_starts_connections_right_after_add_upstream_plugins() {
    strict_pod_first_packets(Primaries::Upstream);
}

fn strict_pod_first_packets(primaries: Primaries) {
    let lab = lab_with("strictout", primaries);
    let before = lab.node.settled_snapshot();
    let b = lab.node.pod("b-strict");
    let out_b = add(&lab, &b, "b-strict-0");
    out_b.assert_ok();
    let b_ip = ip_of(&out_b);
    fabric_filter(&lab.fabric, &b_ip);
    let web = tcp_listen(&lab.outside, 7070);
    let dns = udp_answer(&lab.outside, "0.0.0.0", 5353);

    // The very first traffic of the pod, before anything else reaches it.
    let c0 = crossed_from(&lab.fabric);
    let got = tcp_request(&b, OUTSIDE, 7070, T)
        .unwrap_or_else(|e| panic!("strict pod's first TCP connection to {OUTSIDE}: {e}"));
    assert_eq!(got, web.greeting());
    let answer = udp_request(&b, OUTSIDE, 5353, T)
        .unwrap_or_else(|e| panic!("strict pod's first UDP exchange with {OUTSIDE}: {e}"));
    assert_eq!(
        answer.trim(),
        format!("{} {b_ip}", lab.outside.name()),
        "the outside host sees the pod's own address"
    );
    assert_eq!(dns.answered(), 1);
    let c1 = crossed_from(&lab.fabric);
    assert!(
        c1 >= c0 + 4,
        "the pod's TCP and UDP packets must cross the fabric: {c0} -> {c1}"
    );
    let neigh = b.exec_ok(&["ip", "neigh", "show", "dev", "eth0"]);
    assert!(!neigh.contains("INCOMPLETE"), "{neigh}");

    // Its own node: the node's addresses answer, but only through the
    // boundary (which can refuse them): proxy ARP makes no address local.
    let gw = out_b.result.as_ref().unwrap()["ips"][0]["gateway"]
        .as_str()
        .unwrap()
        .to_string();
    let _n1 = tcp_listen(&lab.node.ns, 7171);
    let _n2 = tcp_listen(&lab.node.ns, 7272);
    for node_ip in [gw.as_str(), "192.0.2.1"] {
        let c = crossed_from(&lab.fabric);
        assert!(
            tcp_connect_ok(&b, node_ip, 7171, T),
            "the strict pod must reach the node's {node_ip}:7171 through the fabric"
        );
        assert!(
            crossed_from(&lab.fabric) > c,
            "{node_ip}: the pod's packets to its own node must cross the fabric"
        );
        assert!(
            !tcp_connect_ok(&b, node_ip, 7272, T),
            "the boundary drops TCP 7272 from the pod: the node's {node_ip}:7272 must not answer"
        );
    }

    // CHECK covers the host-side interface: proxy ARP off is drift.
    let host_if = lab.node.ns.exec_ok(&[
        "ip", "-o", "route", "get", &b_ip, "iif", "pgup0", "from", OUTSIDE,
    ]);
    let host_if = host_if
        .split_whitespace()
        .skip_while(|w| *w != "dev")
        .nth(1)
        .unwrap()
        .to_string();
    // The runner CHECKs cnitool's attachment (same container ID, same
    // cache): the drift's CNI error code.
    let check = |l: &Lab| runner_check_on(l, NET, &b, "b-strict-0");
    check(&lab).assert_ok();
    let knob = format!("net.ipv4.conf.{host_if}.proxy_arp");
    lab.node.ns.sysctl_set(&knob, "0");
    let drift = check(&lab);
    drift.assert_cni_error(101);
    assert!(
        drift.error_msg().unwrap().contains(&knob),
        "{:?}",
        drift.error_msg()
    );
    lab.node.ns.sysctl_set(&knob, "1");

    del(&lab, &b, "b-strict-0");
    assert!(lab.node.state_files().is_empty());
    assert_same(&before, &lab.node.settled_snapshot());

    // The pod's netns (and with it the host-side veth) gone before DEL: DEL
    // still removes the rules and routes, and the vanished proxy-ARP knob is
    // not an error.
    let c = lab.node.pod("b-strict");
    add(&lab, &c, "b-strict-1").assert_ok();
    let path = c.path().to_path_buf();
    drop(c);
    lab.node
        .cni_with_netns_path(
            Verb::Del,
            NET,
            &path,
            "eth0",
            Some(&args("b-strict-1")),
            None,
        )
        .assert_ok();
    assert!(lab.node.state_files().is_empty());
    assert_same(&before, &lab.node.settled_snapshot());
}

/// Issue 15: `routing.exempt` keeps traffic to node-local services (and its
/// replies) on the node; everything else still crosses the fabric.
#[test]
fn strict_exempt_destinations_stay_on_the_node() {
    let lab = lab("strictexempt");
    let before = lab.node.settled_snapshot();
    let b = lab.node.pod("b-exempt");
    let out_b = add(&lab, &b, "b-exempt-0");
    out_b.assert_ok();
    let b_ip = ip_of(&out_b);
    fabric_filter(&lab.fabric, &b_ip);
    let rules = lab.node.ns.exec_ok(&["ip", "rule"]);
    assert_eq!(rules.matches(NODE_LOCAL_DNS).count(), 2, "{rules}");
    assert!(
        rules.contains(&format!("90:\tfrom all to {NODE_LOCAL_DNS} iif ")),
        "{rules}"
    );
    assert!(
        rules.contains(&format!("90:\tfrom {NODE_LOCAL_DNS} to {b_ip} lookup ")),
        "{rules}"
    );

    // NodeLocal DNSCache stand-in: the address on a node-side veth, a DNS-style
    // server bound to it (as node-local-dns binds its IPs) and a TCP service.
    lab.node.ns.exec_ok(&[
        "ip", "link", "add", "pgdns0", "type", "veth", "peer", "name", "pgdns1",
    ]);
    lab.node
        .ns
        .exec_ok(&["ip", "addr", "add", NODE_LOCAL_DNS_NET, "dev", "pgdns0"]);
    lab.node.ns.exec_ok(&["ip", "link", "set", "pgdns0", "up"]);
    lab.node.ns.exec_ok(&["ip", "link", "set", "pgdns1", "up"]);
    let dns = udp_answer(&lab.node.ns, NODE_LOCAL_DNS, 53);
    let _tcp = tcp_listen(&lab.node.ns, 7373);

    let (to0, from0) = (crossed(&lab.fabric), crossed_from(&lab.fabric));
    let answer = udp_request(&b, NODE_LOCAL_DNS, 53, T)
        .unwrap_or_else(|e| panic!("strict pod to node-local DNS {NODE_LOCAL_DNS}: {e}"));
    assert!(answer.ends_with(&format!(" {b_ip}\n")), "{answer}");
    assert_eq!(dns.answered(), 1);
    assert!(
        tcp_connect_ok(&b, NODE_LOCAL_DNS, 7373, T),
        "strict pod to node-local TCP {NODE_LOCAL_DNS}:7373"
    );
    assert_eq!(
        (crossed(&lab.fabric), crossed_from(&lab.fabric)),
        (to0, from0),
        "exempt traffic (and its replies) must not cross the fabric"
    );
    // Everything else still does.
    let _web = tcp_listen(&lab.outside, 7070);
    assert!(tcp_connect_ok(&b, OUTSIDE, 7070, T));
    assert!(
        crossed_from(&lab.fabric) > from0,
        "non-exempt traffic must cross the fabric"
    );
    assert!(
        crossed(&lab.fabric) > to0,
        "its replies come back through the fabric"
    );

    del(&lab, &b, "b-exempt-0");
    lab.node.ns.exec_ok(&["ip", "link", "del", "pgdns0"]);
    let rules = lab.node.ns.exec_ok(&["ip", "rule"]);
    assert!(
        !rules.contains(NODE_LOCAL_DNS),
        "DEL removes the exemption rules: {rules}"
    );
    assert!(lab.node.state_files().is_empty());
    assert_same(&before, &lab.node.settled_snapshot());
}

/// An exemption that would cover the pod's own subnet is refused per pod.
#[test]
fn strict_exempt_covering_the_pod_subnet_is_refused() {
    let lab = lab("strictexempt2");
    let before = lab.node.settled_snapshot();
    let b = lab.node.pod("b-wide");
    let out = runner(&lab, Verb::Add, &b, "b-wide-0");
    out.assert_cni_error(100);
    let msg = out.error_msg().unwrap();
    assert!(
        msg.contains("refused by routing.exempt") && msg.contains("10.30.0.0/24"),
        "{msg}"
    );
    runner(&lab, Verb::Del, &b, "b-wide-0").assert_ok();
    assert_same(&before, &lab.node.settled_snapshot());
}

#[test]
fn standard_keeps_same_node_traffic_local() {
    let lab = lab("standard");
    let before = lab.node.settled_snapshot();
    let a = lab.node.pod("a");
    let b = lab.node.pod("b-standard");
    add(&lab, &a, "a-client").assert_ok();
    let out_b = add(&lab, &b, "b-standard-0");
    out_b.assert_ok();
    let b_ip = ip_of(&out_b);
    fabric_filter(&lab.fabric, &b_ip);
    let _s = tcp_listen(&b, 8080);
    let rules = lab.node.ns.exec_ok(&["ip", "rule"]);
    assert!(rules.contains(&format!("to {b_ip} lookup main")), "{rules}");
    assert!(
        rules.contains(&format!("from {b_ip} lookup 20000")),
        "{rules}"
    );

    let c0 = crossed(&lab.fabric);
    assert!(
        tcp_connect_ok(&a, &b_ip, 8080, T),
        "standard: same-node traffic stays local"
    );
    assert!(tcp_connect_ok(&lab.node.ns, &b_ip, 8080, T));
    assert_eq!(
        crossed(&lab.fabric),
        c0,
        "standard: nothing crossed the fabric"
    );

    del(&lab, &b, "b-standard-0");
    del(&lab, &a, "a-client");
    assert_same(&before, &lab.node.settled_snapshot());
}

#[test]
fn strict_with_masquerade_is_refused() {
    let lab = lab("strictmasq");
    let before = lab.node.settled_snapshot();
    let b = lab.node.pod("b-masq");
    let out = runner(&lab, Verb::Add, &b, "b-masq-0");
    out.assert_cni_error(100);
    assert!(
        out.error_msg().unwrap().contains("masquerade"),
        "{:?}",
        out.error_msg()
    );
    runner(&lab, Verb::Del, &b, "b-masq-0").assert_ok();
    assert_same(&before, &lab.node.settled_snapshot());
}

/// A strict profile's `gateway` is its IPv4 next hop (IPv6's is
/// `gateway6`): an IPv6 one is a config error that says so.
#[test]
fn strict_ipv6_profile_is_refused() {
    let lab = lab("strict6");
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "routed6",
        "plugins": [
            {"type": "ptp", "ipMasq": false,
             "ipam": {"type": "host-local", "dataDir": lab.node.ipam_dir(),
                      "ranges": [[{"subnet": "fd00:30::/64"}]]}},
            {"type": "podgate-router", "stateDir": lab.node.state_dir(),
             "profiles": {"v6": {"routing": {"mode": "strict", "uplink": "pgup0", "gateway": "2001:db8::fe"}}},
             "assign": [{"podNamePrefix": "b", "profile": "v6"}]}
        ]
    });
    lab.node.write_conflist("routed6", &conf);
    let b = lab.node.pod("b-v6");
    let out = runner_on(&lab, Verb::Add, "routed6", &b, "b-v6-0");
    out.assert_cni_error(7);
    assert!(
        out.error_msg().unwrap().contains("gateway6"),
        "{:?}",
        out.error_msg()
    );
    // DEL reads the same (invalid) config; the node netns goes with the test.
    let _ = runner_on(&lab, Verb::Del, "routed6", &b, "b-v6-0");
}

/// Issue 36 (1): an IPv4 strict pod on a node with IPv6 reaches no node
/// service listening on `[::]` at the link-local address of its veth's
/// node side, nor by link-scope multicast: podgate turns IPv6 off on that
/// interface (and puts it back at DEL).
#[test]
fn an_ipv4_strict_pod_reaches_no_node_service_at_its_veths_link_local_address() {
    let lab = lab("strictll");
    let before = lab.node.settled_snapshot();
    let rules_before = rules_d(&lab.node.ns);
    let b = lab.node.pod("b-strict");
    let out = add(&lab, &b, "b-strict-0");
    out.assert_ok();
    let (veth, mac) = host_veth(&out);
    let ll = link_local_of(&mac);
    // Node services on every address of both families (kubelet, sshd and
    // node-exporter listen so).
    let _svc = tcp_listen(&lab.node.ns, 7474);
    let dns = udp_answer(&lab.node.ns, "::", 7475);
    ipv6_settled(&b);
    ipv6_settled(&lab.node.ns);

    assert!(
        !tcp_connect_ok(&b, &ll, 7474, T),
        "strict pod B reached the node's [::]:7474 at {ll}, the link-local address of its veth's node side"
    );
    let multicast = udp_request(&b, "ff02::1%eth0", 7475, T);
    assert!(
        multicast.is_err() && dns.answered() == 0,
        "strict pod B reached the node's [::]:7475 by all-nodes multicast: {multicast:?}"
    );
    let knob = format!("net.ipv6.conf.{veth}.disable_ipv6");
    assert_eq!(lab.node.ns.sysctl_get(&knob), "1");
    // Its IPv4 still works, through the boundary.
    let _web = tcp_listen(&lab.outside, 7070);
    assert!(tcp_connect_ok(&b, OUTSIDE, 7070, T));
    // CHECK covers the knob.
    check_on(&lab, NET, &b, "b-strict-0").assert_ok();
    lab.node.ns.sysctl_set(&knob, "0");
    let drift = runner_check_on(&lab, NET, &b, "b-strict-0");
    drift.assert_cni_error(101);
    assert!(drift.error_msg().unwrap().contains(&knob), "{drift:?}");
    lab.node.ns.sysctl_set(&knob, "1");

    del(&lab, &b, "b-strict-0");
    assert!(lab.node.state_files().is_empty());
    assert_same(&before, &lab.node.settled_snapshot());
    assert_eq!(rules_d(&lab.node.ns), rules_before);
}

/// Issue 36 (1): a dual-stack strict pod is bounded in both families. Its
/// IPv6 leaves through the uplink to the IPv6 next hop (`gateway6`); pod to
/// pod, node to pod and pod to node cross the fabric, which can refuse
/// them; link-local and multicast reach nothing on the node but neighbour
/// discovery (ICMPv6), which IPv6 needs. After the last DEL both families'
/// rules are what they were.
#[test]
fn a_dual_stack_strict_pod_crosses_the_boundary_in_both_families() {
    let lab = lab("strictds");
    let before = lab.node.settled_snapshot();
    let rules_before = rules_d(&lab.node.ns);
    let a = lab.node.pod("a");
    let b = lab.node.pod("b-ds");
    add_on(&lab, NET_DS, &a, "a-client").assert_ok();
    let out_b = add_on(&lab, NET_DS, &b, "b-ds-0");
    out_b.assert_ok();
    let ips = ips_of(&out_b);
    let (b4, b6) = (ips[0].clone(), ips[1].clone());
    assert!(b6.contains(':'), "{ips:?}");
    let gw6 = gateway_of(&out_b, true);
    let (_, mac) = host_veth(&out_b);
    fabric_filter_all(&lab.fabric, &[&b4, &b6]);
    let _s1 = tcp_listen(&b, 8080);
    let _s2 = tcp_listen(&b, 9090);
    let _n1 = tcp_listen(&lab.node.ns, 7171);
    let _n2 = tcp_listen(&lab.node.ns, 7272);
    let dns = udp_answer(&lab.node.ns, "::", 7475);
    for ns in [&a, &b, &lab.node.ns] {
        ipv6_settled(ns);
    }

    // To B over IPv6, from a pod of the same node and from the node: through
    // the fabric, which refuses 8080.
    assert!(
        !tcp_connect_ok(&a, &b6, 8080, T),
        "pod A opened [{b6}]:8080 on strict pod B past the boundary"
    );
    assert!(
        !tcp_connect_ok(&lab.node.ns, &b6, 8080, T),
        "the node opened [{b6}]:8080 on strict pod B"
    );
    let c0 = crossed(&lab.fabric);
    assert!(tcp_connect_ok(&a, &b6, 9090, T), "pod A to [{b6}]:9090");
    assert!(
        tcp_connect_ok(&lab.node.ns, &b6, 9090, T),
        "node to [{b6}]:9090"
    );
    assert!(
        crossed(&lab.fabric) >= c0 + 4,
        "same-node and node traffic to B's IPv6 must cross the fabric"
    );
    // B to its node over IPv6: only through the fabric (which drops 7272).
    for node_ip in [gw6.as_str(), "2001:db8::1"] {
        let c = crossed_from(&lab.fabric);
        assert!(
            tcp_connect_ok(&b, node_ip, 7171, T),
            "strict pod B must reach the node's [{node_ip}]:7171 through the fabric"
        );
        assert!(
            crossed_from(&lab.fabric) > c,
            "[{node_ip}]: B's packets to its own node must cross the fabric"
        );
        assert!(
            !tcp_connect_ok(&b, node_ip, 7272, T),
            "the boundary drops TCP 7272 from B: the node's [{node_ip}]:7272 must not answer"
        );
    }
    // Link-local and multicast: nothing but neighbour discovery and ping.
    let ll = link_local_of(&mac);
    assert!(
        !tcp_connect_ok(&b, &ll, 7171, T),
        "strict pod B reached the node's [::]:7171 at its veth's link-local {ll}"
    );
    let multicast = udp_request(&b, "ff02::1%eth0", 7475, T);
    assert!(
        multicast.is_err() && dns.answered() == 0,
        "strict pod B reached the node's [::]:7475 by all-nodes multicast: {multicast:?}"
    );
    assert!(
        ping(&b, &ll, 1),
        "ICMPv6 to the link-local (neighbour discovery's protocol) is answered"
    );
    // Off-node over IPv6, through the fabric.
    let _web = tcp_listen(&lab.outside, 7070);
    let c = crossed_from(&lab.fabric);
    assert!(
        tcp_connect_ok(&b, OUTSIDE6, 7070, T),
        "B to [{OUTSIDE6}]:7070"
    );
    assert!(crossed_from(&lab.fabric) > c);
    // And IPv4 as for any strict pod.
    assert!(!tcp_connect_ok(&a, &b4, 8080, T));
    assert!(tcp_connect_ok(&a, &b4, 9090, T));

    check_on(&lab, NET_DS, &b, "b-ds-0").assert_ok();
    del_on(&lab, NET_DS, &b, "b-ds-0");
    del_on(&lab, NET_DS, &a, "a-client");
    assert!(lab.node.state_files().is_empty());
    assert_same(&before, &lab.node.settled_snapshot());
    assert_eq!(rules_d(&lab.node.ns), rules_before);
}

/// Issue 36 (1): a dual-stack pod whose strict profile names no IPv6 next
/// hop (`gateway6`) is refused at ADD: its IPv6 could not cross the
/// boundary, and must not bypass it. (Were it admitted, the test shows
/// what the pod reaches.)
#[test]
fn a_dual_stack_pod_on_a_strict_profile_without_gateway6_is_refused() {
    let lab = lab("strictds4");
    let before = lab.node.settled_snapshot();
    let b = lab.node.pod("b-strict");
    let out = runner_on(&lab, Verb::Add, NET_DS4, &b, "b-strict-ds");
    if out.success() {
        // What that pod could do: its IPv6 reaches the node directly.
        let _n = tcp_listen(&lab.node.ns, 7171);
        let gw6 = gateway_of(&out, true);
        fabric_filter_all(
            &lab.fabric,
            &ips_of(&out).iter().map(String::as_str).collect::<Vec<_>>(),
        );
        ipv6_settled(&b);
        ipv6_settled(&lab.node.ns);
        let c = crossed_from(&lab.fabric);
        let reached = tcp_connect_ok(&b, &gw6, 7171, T);
        panic!(
            "a dual-stack pod on an IPv4-only strict profile was admitted; it reached the node's [{gw6}]:7171: {reached}, crossing the fabric: {}",
            crossed_from(&lab.fabric) > c
        );
    }
    out.assert_cni_error(100);
    let msg = out.error_msg().unwrap();
    assert!(
        msg.contains("gateway6") && msg.contains("fd00:35::"),
        "{msg}"
    );
    runner_on(&lab, Verb::Del, NET_DS4, &b, "b-strict-ds").assert_ok();
    assert_same(&before, &lab.node.settled_snapshot());
}

/// Issue 36 (1): every IPv4 address of a strict pod crosses the boundary,
/// the second one too.
#[test]
fn every_address_of_a_strict_pod_crosses_the_boundary() {
    let lab = lab("strict2ip");
    let before = lab.node.settled_snapshot();
    let a = lab.node.pod("a");
    let b = lab.node.pod("b-strict");
    add_on(&lab, NET_TWO, &a, "a-client").assert_ok();
    let out_b = add_on(&lab, NET_TWO, &b, "b-strict-two");
    out_b.assert_ok();
    let ips = ips_of(&out_b);
    assert_eq!(ips.len(), 2, "{ips:?}");
    fabric_filter_all(&lab.fabric, &[&ips[0], &ips[1]]);
    let _s1 = tcp_listen(&b, 8080);
    let _s2 = tcp_listen(&b, 9090);
    for ip in &ips {
        assert!(
            !tcp_connect_ok(&a, ip, 8080, T),
            "pod A opened {ip}:8080 on strict pod B past the boundary"
        );
        assert!(
            !tcp_connect_ok(&lab.node.ns, ip, 8080, T),
            "the node opened {ip}:8080 on strict pod B past the boundary"
        );
        let c = crossed(&lab.fabric);
        assert!(tcp_connect_ok(&a, ip, 9090, T), "pod A to {ip}:9090");
        assert!(crossed(&lab.fabric) > c, "{ip}: must cross the fabric");
    }
    check_on(&lab, NET_TWO, &b, "b-strict-two").assert_ok();
    del_on(&lab, NET_TWO, &b, "b-strict-two");
    del_on(&lab, NET_TWO, &a, "a-client");
    assert!(lab.node.state_files().is_empty());
    assert_same(&before, &lab.node.settled_snapshot());
}

/// Issue 36 (2): a strict pod's return-route pool (a VPN's clients) crosses
/// the boundary as the pod's own address does: the main table routes the
/// pool through the uplink, the fabric routes it back, and only then the
/// pod's table hands it to the pod.
#[test]
fn a_strict_pods_return_route_pool_crosses_the_boundary() {
    let lab = lab("strictpool");
    let before = lab.node.settled_snapshot();
    let a = lab.node.pod("a");
    let b = lab.node.pod("b-pool");
    add(&lab, &a, "a-client").assert_ok();
    let out_b = add(&lab, &b, "b-pool-0");
    out_b.assert_ok();
    // A client of the VPN, as the pod sees it: an address of the pool.
    let client = "10.8.0.5";
    b.exec_ok(&["ip", "addr", "add", &format!("{client}/32"), "dev", "lo"]);
    fabric_filter_all(&lab.fabric, &[POOL]);
    let _s1 = tcp_listen(&b, 8080);
    let _s2 = tcp_listen(&b, 9090);

    assert!(
        !tcp_connect_ok(&a, client, 8080, T),
        "pod A opened {client}:8080 in strict pod B's pool past the boundary"
    );
    assert!(
        !tcp_connect_ok(&lab.node.ns, client, 8080, T),
        "the node opened {client}:8080 in strict pod B's pool past the boundary"
    );
    let c = crossed(&lab.fabric);
    assert!(
        tcp_connect_ok(&a, client, 9090, T),
        "pod A to {client}:9090"
    );
    assert!(
        tcp_connect_ok(&lab.node.ns, client, 9090, T),
        "node to {client}:9090"
    );
    assert!(
        crossed(&lab.fabric) >= c + 4,
        "the pool's traffic must cross the fabric"
    );
    let main = lab.node.ns.exec_ok(&["ip", "route", "show", POOL]);
    assert!(
        main.contains("via 192.0.2.254"),
        "the pool's main route: {main}"
    );
    // The client's own traffic leaves through the fabric too, with its
    // own address (the pod routes it from the client's address).
    let gw = gateway_of(&out_b, false);
    b.exec_ok(&[
        "ip", "route", "add", OUTSIDE, "via", &gw, "dev", "eth0", "src", client,
    ]);
    let _web = tcp_listen_peer_echo(&lab.outside, 7070);
    let c = crossed_from(&lab.fabric);
    let seen = tcp_request(&b, OUTSIDE, 7070, T)
        .unwrap_or_else(|e| panic!("client {client} to {OUTSIDE}:7070: {e}"));
    assert_eq!(seen.trim(), client);
    assert!(crossed_from(&lab.fabric) > c);

    check(&lab, &b, "b-pool-0").assert_ok();
    del(&lab, &b, "b-pool-0");
    del(&lab, &a, "a-client");
    assert!(lab.node.state_files().is_empty());
    assert_same(&before, &lab.node.settled_snapshot());
}

fn check(lab: &Lab, pod: &Netns, name: &str) -> CniOutcome {
    check_on(lab, NET, pod, name)
}

/// Issue 36 (3): after the last strict pod's DEL, `ip -d rule` of both
/// families is what it was before the first ADD, protocols included (the
/// local-table rule podgate moved and put back is `proto kernel`, as the
/// kernel made it).
#[test]
fn ip_rules_after_the_last_strict_del_are_those_before_the_first_add() {
    let lab = lab("strictrules");
    let rules_before = rules_d(&lab.node.ns);
    assert!(
        rules_before.contains("0:\tfrom all lookup local proto kernel"),
        "{rules_before}"
    );
    let b1 = lab.node.pod("b-strict");
    let b2 = lab.node.pod("b-strict2");
    add(&lab, &b1, "b-strict-1").assert_ok();
    add(&lab, &b2, "b-strict-2").assert_ok();
    // IPv4 pods: the IPv4 local rule moved, the IPv6 one where it was.
    let during = lab.node.ns.exec_ok(&["ip", "-d", "-4", "rule", "show"]);
    assert!(
        during.contains("1000:\tfrom all lookup local proto kernel"),
        "{during}"
    );
    assert!(!during.lines().any(|l| l.starts_with("0:\t")), "{during}");
    del(&lab, &b1, "b-strict-1");
    del(&lab, &b2, "b-strict-2");
    assert_eq!(rules_d(&lab.node.ns), rules_before);
}

/// Issue 36 (4): a rule placed before podgate's strict rules (a re-added
/// `pref 0 lookup local`, another agent's local rule at 50) lets a strict
/// pod reach the node directly. CHECK and `podgate inspect` name it as
/// drift, and the node agent reports it (a gauge and a warning at every
/// sweep) and leaves it.
#[test]
fn a_rule_ahead_of_the_strict_boundary_is_reported_by_check_inspect_and_the_agent() {
    let lab = lab("strictahead");
    let b = lab.node.pod("b-strict");
    let out_b = add(&lab, &b, "b-strict-0");
    out_b.assert_ok();
    let b_ip = ip_of(&out_b);
    fabric_filter(&lab.fabric, &b_ip);
    let _n = tcp_listen(&lab.node.ns, 7272);
    assert!(
        !tcp_connect_ok(&b, "192.0.2.1", 7272, T),
        "the boundary drops TCP 7272 from B"
    );
    check(&lab, &b, "b-strict-0").assert_ok();
    let inspect = || {
        lab.node
            .ns
            .command(bin_dir().join("podgate").to_str().unwrap())
            .args(["inspect", "--all", "--state-dir"])
            .arg(lab.node.state_dir())
            .output()
            .unwrap()
    };
    assert!(inspect().status.success());
    std::fs::write(
        lab.node.root().join("plugins.json"),
        serde_json::to_vec(&json!([{"type": "podgate-router", "stateDir": lab.node.state_dir()}]))
            .unwrap(),
    )
    .unwrap();
    let state_dir = lab.node.state_dir();
    let agent = Agent::start_alone(
        &lab.node,
        "none",
        &[
            "--adopt",
            "false",
            "--sweep-secs",
            "1",
            "--router-state-dir",
            state_dir.to_str().unwrap(),
        ],
    );

    for (pref, what) in [
        ("0", "a re-added local rule"),
        ("50", "another agent's local rule"),
    ] {
        lab.node
            .ns
            .exec_ok(&["ip", "rule", "add", "pref", pref, "lookup", "local"]);
        // The hole: B reaches the node's service directly, past the fabric.
        let c = crossed_from(&lab.fabric);
        assert!(
            tcp_connect_ok(&b, "192.0.2.1", 7272, T) && crossed_from(&lab.fabric) == c,
            "{what}: the rule must open the node to B directly (else this test proves nothing)"
        );
        let rule = format!("rule {pref}: from all lookup 255 (proto unspec) comes before the strict rules of pod {b_ip}");
        let drift = runner_check_on(&lab, NET, &b, "b-strict-0");
        drift.assert_cni_error(101);
        assert!(
            drift.error_msg().unwrap().contains(&rule),
            "{what}: CHECK: {drift:?}"
        );
        let shown = inspect();
        assert_eq!(
            shown.status.code(),
            Some(2),
            "{what}: podgate inspect: {shown:?}"
        );
        assert!(
            String::from_utf8_lossy(&shown.stdout).contains(&rule),
            "{what}: podgate inspect: {shown:?}"
        );
        wait_for(&lab.node, &agent, "the rule ahead counted", |m| {
            m.contains("podgate_strict_rules_ahead 1")
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !agent.log().contains(&rule) {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: agent log: {}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // Reported, not removed: the rule is another agent's.
        assert!(lab
            .node
            .ns
            .exec_ok(&["ip", "rule", "show", "pref", pref])
            .contains("lookup local"));
        lab.node
            .ns
            .exec_ok(&["ip", "rule", "del", "pref", pref, "lookup", "local"]);
        check(&lab, &b, "b-strict-0").assert_ok();
        wait_for(&lab.node, &agent, "no rule ahead", |m| {
            m.contains("podgate_strict_rules_ahead 0")
        });
    }
    agent.kill();
    del(&lab, &b, "b-strict-0");
}
