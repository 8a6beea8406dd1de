//! Client pools across nodes, on the three-node cluster of
//! `podgate_integration::cluster`: an OpenVPN pod on node A, backends on A, B
//! and C, a Service with one endpoint on each, DNATed in turn (`numgen
//! inc`), so that each endpoint's share of the connections is exact, which
//! kube-proxy's random choice is not. A return route on node A alone reaches
//! only A's pods (the others reply to the client's address through their
//! own default route, into the fabric, where it is dropped) and exactly A's
//! share of the Service; the pool routed to node A on B and C fixes that.
//! `podgate diagnose` on node A says which it is. Masquerade reaching every
//! node and the Service is proven on a real cluster (`k8s/openvpn.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::cluster::{Cluster, VpnPod, BACKEND_PORT, VIP, VIP_PORT};
use podgate_integration::vpn::TUN_SERVER_IP;
use podgate_integration::Run;

/// Connections to the VIP per check: two rounds over the three endpoints.
const VIP_TRIES: usize = 6;

/// Which backends the client reaches over the tunnel, by name.
fn reached(c: &Cluster) -> Vec<String> {
    c.backends
        .iter()
        .filter(|b| c.client_tcp(&b.ip, BACKEND_PORT).is_some())
        .map(|b| b.name())
        .collect()
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_backend_answers_the_vpn_pods_own_address() {
    let c = Cluster::new();
    let vp = c.vpn_pod("openvpn-0");
    for b in &c.backends {
        assert_eq!(
            vp.tcp(&b.ip, BACKEND_PORT).as_deref(),
            Some(b.pod.name()),
            "{} on node {} from the VPN pod {}",
            b.name(),
            c.nodes[b.node].name,
            vp.ip
        );
    }
    // The VIP too, once per endpoint.
    let mut seen: Vec<String> = (0..3)
        .map(|_| c.backend_named_in(&vp.tcp(VIP, VIP_PORT).unwrap_or_default()))
        .collect();
    seen.sort();
    assert_eq!(seen, names(&["backend-a", "backend-b", "backend-c"]));
    // Forwarding is off in a pod without a profile: the client gets nothing.
    assert_eq!(reached(&c), Vec::<String>::new());
}

#[test]
fn with_return_routes_alone_only_node_as_backend_answers_and_the_vip_loses_b_and_cs_share() {
    let c = Cluster::new();
    let _vp = c.vpn_pod("openvpn-rt-0");
    // The client's own address arrives at A's backend, which answers.
    assert_eq!(reached(&c), names(&["backend-a"]));
    // B's and C's are silent: asserted one by one, with a longer wait.
    for b in c.backends.iter().skip(1) {
        assert_eq!(
            c.client_tcp(&b.ip, BACKEND_PORT),
            None,
            "{} must be silent",
            b.name()
        );
        assert!(!podgate_integration::ping(&c.client.client, &b.ip, 2));
    }
    // Exactly the connections DNATed to A's endpoint answer.
    let shares = c.client_vip_shares(VIP_TRIES);
    let answered: Vec<&String> = shares.iter().flatten().collect();
    assert_eq!(answered.len(), VIP_TRIES / 3, "{shares:?}");
    assert!(answered.iter().all(|b| *b == "backend-a"), "{shares:?}");
}

#[test]
fn with_the_pool_routed_to_node_a_on_b_and_c_all_three_answer() {
    let c = Cluster::new();
    let _vp = c.vpn_pod("openvpn-rt-0");
    c.route_pool_to_node_a();
    assert_eq!(reached(&c), names(&["backend-a", "backend-b", "backend-c"]));
    let shares = c.client_vip_shares(VIP_TRIES);
    assert!(shares.iter().all(Option::is_some), "{shares:?}");
}

/// `podgate diagnose` of the VPN pod (pools from podgate's record) on node
/// A, probing the tunnel peer and `pod` from the tunnel address.
fn diagnose(c: &Cluster, vp: &VpnPod<'_>, pod: &str) -> Run {
    let state_dir = c.node_a().node.state_dir();
    c.diagnose(&[
        "--container",
        &vp.container_id,
        "--state-dir",
        state_dir.to_str().unwrap(),
        "--pod",
        pod,
    ])
}

const CROSS_NODE: &str = "exists only on this node";

#[test]
fn diagnose_names_the_node_local_return_route_for_backends_on_b_and_c_and_not_for_a() {
    let c = Cluster::new();
    let vp = c.vpn_pod("openvpn-rt-0");
    let a = diagnose(&c, &vp, &c.backends[0].ip);
    assert_eq!(a.code, Some(0), "{a:?}");
    assert!(a.text().contains("verdict: all 2 hops answer"), "{a:?}");
    assert!(!a.text().contains(CROSS_NODE), "{a:?}");

    let node_a = &c.node_a().ip;
    for b in c.backends.iter().skip(1) {
        let r = diagnose(&c, &vp, &b.ip);
        assert_eq!(r.code, Some(2), "{r:?}");
        let node = &c.nodes[b.node];
        assert!(
            r.text().contains(&format!(
                "verdict: pod {}: the pod reaches it, but a probe from {TUN_SERVER_IP} silent",
                b.ip
            )),
            "{r:?}"
        );
        assert!(
            r.text().contains(&format!(
                "{} is not served by this node (the node's route {} via {} dev fabric0 proto boot)",
                b.ip, node.pod_cidr, node.ip
            )),
            "{r:?}"
        );
        assert!(
            r.text().contains(&format!(
                "the return route 10.8.0.0/24 via {} {CROSS_NODE}",
                vp.ip
            )),
            "{r:?}"
        );
        assert!(
            r.text().contains("masquerade 10.8.0.0/24 in the pod")
                && r.text().contains(&format!(
                    "route 10.8.0.0/24 to this node ({node_a}) on every node or on the fabric"
                ))
                && r.text().contains("bridge routes only each node's pod CIDR"),
            "{r:?}"
        );
    }
}

#[test]
fn diagnose_does_not_blame_the_return_route_when_bs_backend_is_stopped() {
    let c = Cluster::new();
    let vp = c.vpn_pod("openvpn-rt-0");
    let b = &c.backends[1];
    b.pod.exec_ok(&["ip", "link", "set", "eth0", "down"]);
    let r = diagnose(&c, &vp, &b.ip);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.text().contains(&format!(
            "verdict: pod {} silent (no answer in 1000 ms) even from the VPN pod itself",
            b.ip
        )),
        "{r:?}"
    );
    assert!(!r.text().contains(CROSS_NODE), "{r:?}");
    assert!(
        !r.text().contains("masquerade 10.8.0.0/24 in the pod"),
        "{r:?}"
    );
}
