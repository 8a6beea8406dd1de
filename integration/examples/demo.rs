//! The story `integration/demo.sh` tells, on the three-node cluster of
//! `podgate_integration::cluster`: an OpenVPN client outside the cluster
//! whose pings to a backend on another node, and whose connections to a
//! Service VIP, go nowhere while the VPN pod does not forward (and
//! `podgate diagnose` naming the silent hop), then the same once the pod is
//! recreated with podgate's profile. Exits non-zero when the story does not
//! hold; everything it made is removed on every exit path.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::cluster::{Cluster, VpnPod, VIP, VIP_PORT};
use podgate_integration::vpn::{CLIENT_POOL, TUN_CLIENT_IP, TUN_SERVER_IP};

/// Connections to the VIP per round: one per endpoint.
const VIP_TRIES: usize = 3;

fn dots(label: &str) -> String {
    format!("   {label:.<58} ")
}

/// The client pings each of `backends` (index into the cluster's backends);
/// returns how many answered.
fn ping_backends(c: &Cluster, backends: &[usize]) -> usize {
    let mut ok = 0;
    for &i in backends {
        let b = &c.backends[i];
        let node = c.nodes[b.node].name.to_uppercase();
        let answered = podgate_integration::ping(&c.client.client, &b.ip, 2);
        println!(
            "{}{}",
            dots(&format!("client ping {} {} (node {node})", b.name(), b.ip)),
            if answered { "answers" } else { "timeout" }
        );
        ok += usize::from(answered);
    }
    ok
}

/// The client connects to the VIP `VIP_TRIES` times; returns how many
/// connections got an answer.
fn vip(c: &Cluster) -> usize {
    let shares = c.client_vip_shares(VIP_TRIES);
    let got: Vec<String> = shares.iter().flatten().cloned().collect();
    let detail = if got.is_empty() {
        "timeout".to_string()
    } else {
        got.join(", ")
    };
    println!(
        "{}{} of {VIP_TRIES} answer: {detail}",
        dots(&format!(
            "client tcp {VIP}:{VIP_PORT} (Service VIP), {VIP_TRIES} connections"
        )),
        got.len()
    );
    got.len()
}

/// `podgate diagnose` of the VPN pod on node A; prints its verdict and next
/// step and returns its exit code.
fn diagnose(c: &Cluster, vp: &VpnPod<'_>) -> i32 {
    let pod = &c.backends[1].ip;
    let service = format!("{VIP}:{VIP_PORT}");
    let targets = ["--pool", CLIENT_POOL, "--pod", pod, "--service", &service];
    println!(
        "   $ podgate diagnose --netns <pod> --peer {TUN_CLIENT_IP} --from {TUN_SERVER_IP} {}",
        targets.join(" ")
    );
    let netns = vp.pod.path().to_str().unwrap();
    let out = c.diagnose(&[&["--netns", netns], &targets[..]].concat());
    for l in out
        .stdout
        .lines()
        .filter(|l| l.starts_with("verdict:") || l.starts_with("next:") || l.starts_with("pod "))
    {
        println!("     {l}");
    }
    out.code.unwrap_or(-1)
}

/// One act: the VPN pod `name` on node A, the client's pings to `backends`
/// and connections to the VIP, and diagnose. Returns (backends that
/// answered, VIP connections that answered, diagnose's exit code).
fn act(c: &Cluster, name: &str, backends: &[usize]) -> (usize, usize, i32) {
    let vp = c.vpn_pod(name);
    println!(
        "   tunnel up: client {TUN_CLIENT_IP} <-> pod {TUN_SERVER_IP}; pod net.ipv4.ip_forward = {}",
        vp.pod.sysctl_get("net.ipv4.ip_forward")
    );
    (ping_backends(c, backends), vip(c), diagnose(c, &vp))
}

/// Network namespaces this process made that are still there.
fn own_netns_left() -> usize {
    let tag = format!("-{}-", std::process::id());
    std::fs::read_dir("/var/run/netns")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with("pg-") && n.contains(&tag)
                })
                .count()
        })
        .unwrap_or(0)
}

fn main() {
    println!("== a three-node cluster in network namespaces, an OpenVPN client outside it");
    let c = Cluster::new();
    for n in &c.nodes {
        let b = c.backends.iter().find(|b| c.nodes[b.node].name == n.name);
        println!(
            "   node {}  {:<14} pods {:<14} backend {}",
            n.name.to_uppercase(),
            n.ip,
            n.pod_cidr,
            b.map_or("-", |b| b.ip.as_str())
        );
    }
    println!("   Service {VIP}:{VIP_PORT} -> one backend on each node (DNAT on every node, as kube-proxy does)");

    println!("\n== 1. OpenVPN server in pod vpn/openvpn-0 on node A, no podgate profile");
    let (pinged, served, code) = act(&c, "openvpn-0", &[1]);
    assert!(
        pinged == 0 && served == 0,
        "forwarding off: nothing past the pod should answer"
    );
    assert_eq!(code, 2, "diagnose should report the silent hop");

    println!("\n== 2. the pod recreated as vpn/openvpn-gw-0: podgate's vpn-gateway profile");
    println!("   (podgate-router: net.ipv4.ip_forward=1 and masquerade {CLIENT_POOL} in the pod's netns)");
    let (pinged, served, code) = act(&c, "openvpn-gw-0", &[0, 1, 2]);
    assert!(
        pinged == 3 && served == VIP_TRIES,
        "with the profile every hop should answer"
    );
    assert_eq!(code, 0, "diagnose should find every hop answering");

    println!("\n== 3. removing everything");
    drop(c);
    let left = own_netns_left();
    println!("   network namespaces of this demo left: {left}");
    assert_eq!(left, 0);
    println!("\ndemo: ok");
}
