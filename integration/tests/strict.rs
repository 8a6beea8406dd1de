//! Strict and standard routing (issue: every packet of a protected pod passes
//! its security boundary). A routed primary (ptp + host-local: one veth and
//! one /32 host route per pod) and an uplink veth to a "fabric" netns that is
//! the boundary: its nftables filter drops TCP to port 8080 of pod B. Behind
//! the fabric an "outside" host (198.51.100.7) stands for anything off-node.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::{
    assert_same, cnitool_container_id, require_root, tcp_connect_ok, tcp_listen, tcp_request,
    udp_answer, udp_request, CniOutcome, Netns, Primaries, TestNode, Verb,
};
use serde_json::{json, Value};
use std::time::Duration;

const NET: &str = "routed";

const OUTSIDE: &str = "198.51.100.7";
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
    fabric.exec_ok(&["ip", "route", "add", "10.30.0.0/24", "via", "192.0.2.1"]);
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
    // The fabric hairpins packets back to the node; redirects would short-cut it.
    fabric.sysctl_set("net.ipv4.conf.all.send_redirects", "0");
    fabric.sysctl_set("net.ipv4.conf.fab0.send_redirects", "0");
    node.ns.sysctl_set("net.ipv4.tcp_early_demux", "1");
    node.ns.sysctl_set("net.ipv4.udp_early_demux", "1");

    let routing = |mode: &str| json!({"mode": mode, "uplink": "pgup0", "gateway": "192.0.2.254", "table": "auto"});
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": NET,
        "plugins": [
            {"type": "ptp", "ipMasq": false,
             "ipam": {"type": "host-local", "dataDir": node.ipam_dir(),
                      "ranges": [[{"subnet": "10.30.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "podgate-router", "stateDir": node.state_dir(), "logFile": node.root().join("router.log"),
             "profiles": {
                 "protected-strict": {"routing": routing("strict")},
                 "protected-exempt": {"routing": {"mode": "strict", "uplink": "pgup0", "gateway": "192.0.2.254",
                                                  "exempt": [NODE_LOCAL_DNS_NET]}},
                 "protected-standard": {"routing": routing("standard")},
                 "strict-masq": {"routing": routing("strict"), "masquerade": [{"source": "10.8.0.0/24"}]},
                 "strict-wide": {"routing": {"mode": "strict", "uplink": "pgup0", "gateway": "192.0.2.254",
                                             "exempt": ["10.30.0.0/16"]}}
             },
             "assign": [
                 {"podNamePrefix": "b-strict", "profile": "protected-strict"},
                 {"podNamePrefix": "b-exempt", "profile": "protected-exempt"},
                 {"podNamePrefix": "b-standard", "profile": "protected-standard"},
                 {"podNamePrefix": "b-masq", "profile": "strict-masq"},
                 {"podNamePrefix": "b-wide", "profile": "strict-wide"}
             ]}
        ]
    });
    node.write_conflist(NET, &conf);
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
    lab.node
        .cni(Verb::Add, NET, pod, "eth0", Some(&args(name)), None)
}

fn del(lab: &Lab, pod: &Netns, name: &str) {
    lab.node
        .cni(Verb::Del, NET, pod, "eth0", Some(&args(name)), None)
        .assert_ok();
}

/// `verb` through the runner as container `name`, for a test that asserts
/// the CNI error code (cnitool prints only the message).
fn runner(lab: &Lab, verb: Verb, pod: &Netns, name: &str) -> CniOutcome {
    lab.node
        .runner(verb, NET, pod.path(), name, "eth0", Some(&args(name)), None)
}

fn ip_of(out: &podgate_integration::CniOutcome) -> String {
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
    let rules = format!(
        "table inet boundary {{\n chain filter_forward {{\n  type filter hook forward priority 0; policy accept;\n  ip daddr {b} counter comment \"to-b\"\n  ip saddr {b} counter comment \"from-b\"\n  ip daddr {b} tcp dport 8080 counter drop\n  ip saddr {b} tcp dport 7272 counter drop\n }}\n}}\n"
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

/// Packets counted by the fabric rule with this comment.
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
        .next()
        .unwrap_or(0)
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
    lab.node
        .cni(
            Verb::Check,
            NET,
            &b,
            "eth0",
            Some(&args("b-strict-0")),
            None,
        )
        .assert_ok();

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
    let check = |l: &Lab| {
        l.node.runner(
            Verb::Check,
            NET,
            b.path(),
            &cnitool_container_id(b.path()),
            "eth0",
            Some(&args("b-strict-0")),
            None,
        )
    };
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

/// Strict routing is IPv4 only: an IPv6 strict profile is a config error.
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
    let out = lab.node.runner(
        Verb::Add,
        "routed6",
        b.path(),
        "b-v6-0",
        "eth0",
        Some(&args("b-v6-0")),
        None,
    );
    out.assert_cni_error(7);
    assert!(
        out.error_msg().unwrap().contains("IPv4 pods only"),
        "{:?}",
        out.error_msg()
    );
    // DEL reads the same (invalid) config; the node netns goes with the test.
    let _ = lab.node.runner(
        Verb::Del,
        "routed6",
        b.path(),
        "b-v6-0",
        "eth0",
        Some(&args("b-v6-0")),
        None,
    );
}
