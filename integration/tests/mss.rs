//! MSS clamping (`mssClamp`, issue 15) with a real OpenVPN tunnel.
//!
//! The VPN pod sits on a bridge network with MTU 1400 (an overlay's); the
//! backend pod on another bridge with MTU 1500, so the node routes between
//! them and its hop into the VPN pod's network is the narrow one. The client
//! (outside the cluster) reaches the server through the node's hostPort; its
//! tun0 has OpenVPN's default MTU 1500 and OpenVPN's own MSS fix is off
//! (`--mssfix 0`) so only podgate clamps. ICMP "fragmentation needed" is
//! dropped on the node, as on paths that lose it: without clamping the
//! backend's full-size segments are black-holed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::vpn::{self, CLIENT_POOL, TUN_SERVER_IP};
use podgate_integration::{
    podgate, require_root, tcp_listen_bulk, tcp_request, Netns, TcpServer, TestNode, Verb,
};
use serde_json::{json, Value};
use std::time::Duration;

const VPN_NET: &str = "overlay";
const APPS_NET: &str = "apps";
const BULK: usize = 1 << 20;
const BULK_PORT: u16 = 8080;

fn router(node: &TestNode) -> Value {
    let gateway = |clamp: Option<Value>| {
        let mut p = json!({"sysctls": {"net.ipv4.ip_forward": "1"}, "masquerade": [{"source": CLIENT_POOL}]});
        if let Some(c) = clamp {
            p["mssClamp"] = c;
        }
        p
    };
    json!({
        "type": "podgate-router",
        "stateDir": node.state_dir(),
        "logFile": node.root().join("router.log"),
        "profiles": {
            "vpn-gateway": gateway(Some(json!("pmtu"))),
            "vpn-fixed": gateway(Some(json!(1300))),
            "vpn-noclamp": gateway(None)
        },
        "assign": [
            {"podNamePrefix": "vpn-clamp", "profile": "vpn-gateway"},
            {"podNamePrefix": "vpn-fixed", "profile": "vpn-fixed"},
            {"podNamePrefix": "vpn-plain", "profile": "vpn-noclamp"}
        ]
    })
}

fn args(name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=vpn;K8S_POD_NAME={name}")
}

fn ip_of(out: &podgate_integration::CniOutcome) -> String {
    out.result.as_ref().unwrap()["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// Counters at the backend: which MSS its SYNs carry. `nft` reads the option
/// from the packet as it arrives.
fn mss_probe(backend: &Netns) {
    backend.sh_ok(&format!(
        "nft -f - <<'EOF'\n\
         table inet probe {{\n\
           chain input {{ type filter hook input priority 0; policy accept;\n\
             tcp dport {BULK_PORT} tcp flags syn / syn,ack tcp option maxseg size 1460 counter comment \"1460\"\n\
             tcp dport {BULK_PORT} tcp flags syn / syn,ack tcp option maxseg size 1360 counter comment \"1360\"\n\
             tcp dport {BULK_PORT} tcp flags syn / syn,ack tcp option maxseg size 1300 counter comment \"1300\"\n\
             tcp dport {BULK_PORT} tcp flags syn / syn,ack counter comment \"syn\"\n\
           }}\n\
         }}\nEOF"
    ));
}

/// Packets counted by the rule with `comment` in `table` of `ns`.
fn counter(ns: &Netns, table: &str, comment: &str) -> u64 {
    let out = ns.exec_ok(&["nft", "-j", "list", "table", "inet", table]);
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

struct Round {
    /// SYNs at the backend with MSS 1460 / 1360 / 1300, and all SYNs.
    mss: [u64; 4],
    /// Bytes the client received of the 1 MiB transfer (None: it failed).
    received: Option<usize>,
    /// ICMP "fragmentation needed" the node dropped meanwhile.
    icmp_dropped: u64,
}

/// The node: the VPN pod's network (MTU 1400, portmap, podgate-router) and
/// the apps network (MTU 1500), ICMP frag-needed dropped on the node; the
/// backend pod serving 1 MiB and counting SYNs by MSS; the VPN client.
/// Fields drop in order: client, bulk server, backend, node.
struct Rig {
    client: vpn::VpnClient,
    _bulk: TcpServer,
    backend: Netns,
    backend_ip: String,
    node: TestNode,
}

impl Rig {
    fn new() -> Rig {
        let node = TestNode::new("mss");
        let mut vpn_conf = node.bridge_conflist(
            VPN_NET,
            "1.0.0",
            "10.22.0.0/24",
            vec![
                json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
                router(&node),
            ],
        );
        vpn_conf["plugins"][0]["mtu"] = json!(1400);
        node.write_conflist(VPN_NET, &vpn_conf);
        node.write_conflist(
            APPS_NET,
            &node.bridge_conflist(APPS_NET, "1.0.0", "10.23.0.0/24", vec![]),
        );
        // Where the node would tell the backend to send smaller packets, it cannot.
        node.ns.sh_ok(
            "nft -f - <<'EOF'\n\
             table inet lossy {\n\
               chain lossy_out { type filter hook output priority 0; policy accept;\n\
                 icmp type destination-unreachable icmp code frag-needed counter drop comment \"frag-needed\"; }\n\
               chain lossy_fwd { type filter hook forward priority 0; policy accept;\n\
                 icmp type destination-unreachable icmp code frag-needed counter drop comment \"frag-needed\"; }\n\
             }\nEOF",
        );

        let backend = node.pod("backend");
        let b = node.cni(Verb::Add, APPS_NET, &backend, "eth0", None, None);
        b.assert_ok();
        let backend_ip = ip_of(&b);
        assert_eq!(
            backend.exec_ok(&["cat", "/sys/class/net/eth0/mtu"]).trim(),
            "1500"
        );
        mss_probe(&backend);
        let bulk = tcp_listen_bulk(&backend, BULK_PORT, BULK);
        let client = vpn::client(&node, "m");
        Rig {
            client,
            _bulk: bulk,
            backend,
            backend_ip,
            node,
        }
    }

    fn portmap() -> Value {
        json!({"portMappings": [{"hostPort": 1194, "containerPort": 1194, "protocol": "udp"}]})
    }

    /// One round: VPN pod `name` (ADD through the chain), the tunnel from
    /// the client on `lport`, the 1 MiB transfer, what the backend and the
    /// node counted; for `vpn-clamp*` also `inspect` of the clamp and its
    /// drift; DEL leaves nothing of podgate's in the pod.
    fn round(&self, name: &str, lport: u16) -> Round {
        let (node, client, backend, backend_ip) =
            (&self.node, &self.client, &self.backend, &self.backend_ip);
        let portmap = Rig::portmap();
        let no_mssfix = ["--mssfix", "0"];
        let pod = node.pod(name);
        pod.set_forwarding(false);
        let out = node.cni(
            Verb::Add,
            VPN_NET,
            &pod,
            "eth0",
            Some(&args(name)),
            Some(portmap.clone()),
        );
        out.assert_ok();
        assert_eq!(
            pod.exec_ok(&["cat", "/sys/class/net/eth0/mtu"]).trim(),
            "1400"
        );
        let server = vpn::server_with(&pod, &client.key, &no_mssfix);
        let cl = vpn::connect_with(
            &client.client,
            &client.key,
            lport,
            &[("10.23.0.0", "255.255.255.0")],
            &no_mssfix,
        );
        assert!(
            vpn::wait_for(
                || podgate_integration::ping(&client.client, TUN_SERVER_IP, 1),
                20
            ),
            "{name}: tunnel never came up\n{}",
            vpn::logs(&client.key)
        );
        assert_eq!(
            client
                .client
                .exec_ok(&["cat", "/sys/class/net/tun0/mtu"])
                .trim(),
            "1500"
        );
        let before: Vec<u64> = ["1460", "1360", "1300", "syn"]
            .iter()
            .map(|c| counter(backend, "probe", c))
            .collect();
        let icmp0 = counter(&node.ns, "lossy", "frag-needed");
        let received = tcp_request(
            &client.client,
            backend_ip,
            BULK_PORT,
            Duration::from_secs(4),
        )
        .ok()
        .map(|s| s.len());
        let after: Vec<u64> = ["1460", "1360", "1300", "syn"]
            .iter()
            .map(|c| counter(backend, "probe", c))
            .collect();
        let round = Round {
            mss: [0, 1, 2, 3].map(|i| after[i] - before[i]),
            received,
            icmp_dropped: counter(&node.ns, "lossy", "frag-needed") - icmp0,
        };

        if name.starts_with("vpn-clamp") {
            inspect_names_the_clamp_and_its_drift(node, &pod, out.container_id.as_deref().unwrap());
        }

        vpn::stop(cl);
        vpn::stop(server);
        node.cni(
            Verb::Del,
            VPN_NET,
            &pod,
            "eth0",
            Some(&args(name)),
            Some(portmap.clone()),
        )
        .assert_ok();
        let left = pod.exec_ok(&["nft", "list", "ruleset"]);
        assert!(!left.contains("podgate"), "{name}: DEL left {left}");
        round
    }
}

/// `podgate inspect` (CHECK's drift check) covers the clamp chain: holds,
/// then names the rule deleted by hand.
fn inspect_names_the_clamp_and_its_drift(node: &TestNode, pod: &Netns, container_id: &str) {
    let state_dir = node.state_dir();
    let inspect = || {
        let r = podgate(&[
            "inspect",
            "--container",
            container_id,
            "--state-dir",
            state_dir.to_str().unwrap(),
            "--node-netns",
            node.ns.path().to_str().unwrap(),
        ]);
        (r.code, r.stdout)
    };
    let (code, text) = inspect();
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("mss clamp:   inet podgate-eth0 forward: ip saddr 10.8.0.0/24 oifname \"eth0\" tcp flags syn / syn,rst tcp option maxseg size set rt mtu"),
        "{text}"
    );
    let table = pod.exec_ok(&[
        "nft",
        "-a",
        "list",
        "chain",
        "inet",
        "podgate-eth0",
        "forward",
    ]);
    assert!(
        table.contains("tcp option maxseg size set rt mtu"),
        "{table}"
    );
    let handle = table
        .lines()
        .find(|l| l.contains("oifname \"eth0\""))
        .and_then(|l| l.rsplit("# handle ").next())
        .unwrap()
        .trim()
        .to_string();
    pod.exec_ok(&[
        "nft",
        "delete",
        "rule",
        "inet",
        "podgate-eth0",
        "forward",
        "handle",
        &handle,
    ]);
    let (code, text) = inspect();
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("DRIFT: mss clamp `ip saddr 10.8.0.0/24 oifname \"eth0\""),
        "{text}"
    );
}

#[test]
fn mss_clamp_lets_full_size_transfers_through_a_narrow_pod_network() {
    require_root();
    podgate_integration::built(
        &["podgate", "podgate-router"],
        &["-p", "podgate", "-p", "podgate-router"],
    );
    let rig = Rig::new();
    let run = |name: &str, lport: u16| rig.round(name, lport);
    let plain = run("vpn-plain-0", 43001);
    assert_eq!(
        plain.mss,
        [1, 0, 0, 1],
        "without clamping the backend sees the client's MSS 1460"
    );
    assert_ne!(
        plain.received,
        Some(BULK),
        "without clamping the transfer must stall (the path drops full-size segments)"
    );
    assert!(
        plain.icmp_dropped > 0,
        "the node dropped frag-needed: {}",
        plain.icmp_dropped
    );

    let clamped = run("vpn-clamp-0", 43002);
    assert_eq!(
        clamped.mss,
        [0, 1, 0, 1],
        "pmtu: the SYN reaches the backend with MSS 1360 (1400 - 40)"
    );
    assert_eq!(
        clamped.received,
        Some(BULK),
        "1 MiB through the clamped path"
    );

    let fixed = run("vpn-fixed-0", 43003);
    assert_eq!(fixed.mss, [0, 0, 1, 1], "mssClamp 1300");
    assert_eq!(fixed.received, Some(BULK));

    assert!(
        rig.node.state_files().is_empty(),
        "{:?}",
        rig.node.state_files()
    );
    rig.node
        .cni(Verb::Del, APPS_NET, &rig.backend, "eth0", None, None)
        .assert_ok();
}
