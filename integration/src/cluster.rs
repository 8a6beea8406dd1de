//! A three-node cluster in throwaway namespaces, for client pools that cross
//! nodes.
//!
//! * a fabric netns holding the underlay: a bridge `fab0` with the
//!   "underlay router" address (forwarding off: what reaches it for an
//!   address nobody routes is dropped, as an underlay drops a pod-sourced
//!   reply to a client pool);
//! * nodes A, B and C ([`TestNode`]s), each linked to the fabric by a veth
//!   (`fabric0`, `192.168.100.1-3`), each with its own pod CIDR
//!   (`10.244.1-3.0/24`) wired by the real bridge + host-local plugins (plus
//!   portmap and podgate-router) through libcni, and routes to the other
//!   nodes' pod CIDRs host-gw style (as Flannel host-gw does);
//! * a backend pod on each node, answering TCP on 8080 with its netns name;
//! * a Service VIP `10.96.0.10:80` with one endpoint on each node, DNATed on
//!   every node by an nf_tables table shaped after kube-proxy's nftables mode
//!   (`numgen inc` instead of kube-proxy's `numgen random`, so the share of
//!   connections landing on each endpoint is exact);
//! * an OpenVPN client outside the cluster, linked to node A (see
//!   [`crate::vpn`]), and [`Cluster::vpn_pod`]: a real OpenVPN server in a pod
//!   on node A, reached through its hostPort.
//!
//! Everything is removed when the [`Cluster`] drops, also while unwinding.

// Indexes are node positions in a cluster of exactly three.
#![allow(clippy::indexing_slicing)]

use std::cell::Cell;
use std::process::Child;
use std::time::Duration;

use serde_json::{json, Value};

use crate::vpn::{self, VpnClient, CLIENT_POOL, OPENVPN_PORT, TUN_CLIENT_IP, TUN_SERVER_IP};
use crate::{tcp_listen, tcp_request, CniOutcome, Netns, TcpServer, TestNode, Verb};

/// The CNI network of every node.
pub const NETWORK: &str = "podnet";
/// The Service VIP and its port; endpoints listen on [`BACKEND_PORT`].
pub const VIP: &str = "10.96.0.10";
pub const VIP_PORT: u16 = 80;
pub const BACKEND_PORT: u16 = 8080;
/// The underlay router on the fabric (nodes' default route).
pub const FABRIC_GATEWAY: &str = "192.168.100.254";
/// What the VPN client routes into the tunnel: pods and Services.
pub const CLIENT_ROUTES: [(&str, &str); 2] =
    [("10.244.0.0", "255.255.0.0"), ("10.96.0.0", "255.255.0.0")];

/// Node names, in order: the VPN pod runs on the first.
pub const NODE_NAMES: [&str; 3] = ["a", "b", "c"];

/// The router profiles every node's podgate-router knows; a VPN pod's name
/// picks one (`openvpn-gw-*` masquerade, `openvpn-rt-*` return routes, any
/// other name none: forwarding stays off).
pub fn router_entry(node: &TestNode) -> Value {
    node.router_entry(
        json!({
            "vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}, "masquerade": [{"source": CLIENT_POOL}]},
            "vpn-routed": {"sysctls": {"net.ipv4.ip_forward": "1"}, "returnRoutes": [{"dst": CLIENT_POOL}]}
        }),
        json!([
            {"namespace": "vpn", "podNamePrefix": "openvpn-gw", "profile": "vpn-gateway"},
            {"namespace": "vpn", "podNamePrefix": "openvpn-rt", "profile": "vpn-routed"}
        ]),
    )
}

/// `IgnoreUnknown=1;K8S_POD_NAMESPACE=<ns>;K8S_POD_NAME=<name>`.
pub fn pod_args(namespace: &str, name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}")
}

fn first_ip(out: &CniOutcome) -> String {
    out.first_ip()
        .unwrap_or_else(|| panic!("CNI result without an IP:\n{out:?}"))
}

pub struct ClusterNode {
    pub node: TestNode,
    /// `a`, `b` or `c`.
    pub name: &'static str,
    /// Address on the fabric.
    pub ip: String,
    pub pod_cidr: String,
}

pub struct Backend {
    /// Stops before the pod goes.
    _server: TcpServer,
    pub pod: Netns,
    pub ip: String,
    /// Index into [`Cluster::nodes`].
    pub node: usize,
}

impl Backend {
    /// `backend-a`: what its server's greeting (its netns name) contains.
    pub fn name(&self) -> String {
        format!("backend-{}", NODE_NAMES[self.node])
    }
}

/// Fields drop in order: the client and pods first, then the nodes, then the
/// fabric.
pub struct Cluster {
    pub client: VpnClient,
    pub backends: Vec<Backend>,
    pub nodes: Vec<ClusterNode>,
    pub fabric: Netns,
    next_lport: Cell<u16>,
}

impl Cluster {
    /// Builds the whole cluster (podgate and podgate-router are built first
    /// when missing or stale). Panics, after removing what it made, when a
    /// step fails.
    pub fn new() -> Cluster {
        crate::require_root();
        crate::built(
            &["podgate", "podgate-router"],
            &["-p", "podgate", "-p", "podgate-router"],
        );
        let fabric = Netns::new_with_forwarding("fabric", false);
        fabric.sh_ok(&format!(
            "ip link add fab0 type bridge && ip addr add {FABRIC_GATEWAY}/24 dev fab0 && ip link set fab0 up"
        ));
        let mut nodes = Vec::new();
        for (i, name) in NODE_NAMES.iter().enumerate() {
            let n = i + 1;
            let node = TestNode::new(&format!("mn-{name}"));
            let ip = format!("192.168.100.{n}");
            let pod_cidr = format!("10.244.{n}.0/24");
            let port = format!("fab-{name}");
            fabric.exec_ok(&[
                "ip",
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                "fabric0",
                "netns",
                node.ns.name(),
            ]);
            fabric.sh_ok(&format!(
                "ip link set {port} master fab0 && ip link set {port} up"
            ));
            node.ns.sh_ok(&format!(
                "ip addr add {ip}/24 dev fabric0 && ip link set fabric0 up && \
                 ip route add default via {FABRIC_GATEWAY}"
            ));
            let extra = vec![
                json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
                router_entry(&node),
            ];
            node.write_conflist(
                NETWORK,
                &node.bridge_conflist(NETWORK, "1.0.0", &pod_cidr, extra),
            );
            nodes.push(ClusterNode {
                node,
                name,
                ip,
                pod_cidr,
            });
        }
        // host-gw: every node routes the others' pod CIDRs via their fabric address.
        for a in &nodes {
            for b in nodes.iter().filter(|b| b.name != a.name) {
                a.node
                    .ns
                    .exec_ok(&["ip", "route", "add", &b.pod_cidr, "via", &b.ip]);
            }
        }
        let client = vpn::client(&nodes[0].node, "mn");
        let mut cluster = Cluster {
            client,
            backends: Vec::new(),
            nodes,
            fabric,
            next_lport: Cell::new(43000),
        };
        for i in 0..cluster.nodes.len() {
            let b = cluster.add_backend(i);
            cluster.backends.push(b);
        }
        let endpoints: Vec<String> = cluster.backends.iter().map(|b| b.ip.clone()).collect();
        for n in &cluster.nodes {
            n.node.ns.sh_ok(&kube_proxy_ruleset(&endpoints));
        }
        cluster
    }

    fn add_backend(&self, node: usize) -> Backend {
        let n = &self.nodes[node].node;
        let name = format!("backend-{}", NODE_NAMES[node]);
        let pod = n.pod(&name);
        pod.set_forwarding(false);
        let out = n.cni(
            Verb::Add,
            NETWORK,
            &pod,
            "eth0",
            Some(&pod_args("default", &name)),
            None,
        );
        out.assert_ok();
        let ip = first_ip(&out);
        let server = tcp_listen(&pod, BACKEND_PORT);
        Backend {
            _server: server,
            pod,
            ip,
            node,
        }
    }

    /// Node A, where the VPN pod runs.
    pub fn node_a(&self) -> &ClusterNode {
        &self.nodes[0]
    }

    /// A VPN pod named `name` (namespace `vpn`) on node A, its forwarding
    /// starting off as a fresh pod's does, with a running OpenVPN server and
    /// the outside client connected (waits for the tunnel).
    pub fn vpn_pod(&self, name: &str) -> VpnPod<'_> {
        let node = &self.node_a().node;
        let pod = node.pod(name);
        pod.set_forwarding(false);
        let mut vp = VpnPod {
            cluster: self,
            name: name.to_string(),
            container_id: String::new(),
            ip: String::new(),
            server: None,
            client: None,
            pod,
        };
        let out = vp.cni(Verb::Add);
        out.assert_ok();
        vp.container_id = out.container_id.clone().unwrap_or_default();
        vp.ip = first_ip(&out);
        vp.server = Some(vpn::server(&vp.pod, &self.client.key));
        let lport = self.next_lport.get();
        self.next_lport.set(lport + 1);
        vp.client = Some(vpn::connect(
            &self.client.client,
            &self.client.key,
            lport,
            &CLIENT_ROUTES,
        ));
        assert!(
            vpn::wait_for(|| crate::ping(&self.client.client, TUN_SERVER_IP, 1), 20),
            "the tunnel to {name} never came up\n{}",
            vpn::logs(&self.client.key)
        );
        vp
    }

    /// `podgate diagnose <args>` of a VPN pod on node A as its tunnel sees it
    /// (`--peer` the client's tunnel address, `--from` the pod's), with node
    /// A's netns and CNI config dir and 1 s per probe; `args` select the pod
    /// and name the targets.
    pub fn diagnose(&self, args: &[&str]) -> crate::Run {
        let a = &self.node_a().node;
        crate::Run::of(
            crate::podgate_command()
                .arg("diagnose")
                .args(args)
                .args(["--peer", TUN_CLIENT_IP, "--from", TUN_SERVER_IP])
                .args(["--timeout-ms", "1000", "--node-netns"])
                .arg(a.ns.path())
                .arg("--cni-conf-dir")
                .arg(a.conf_dir()),
        )
    }

    /// Routes the client pool to node A on every other node, as an operator
    /// would by hand (or on the fabric).
    pub fn route_pool_to_node_a(&self) {
        let a = self.node_a().ip.clone();
        for n in self.nodes.iter().skip(1) {
            n.node
                .ns
                .exec_ok(&["ip", "route", "add", CLIENT_POOL, "via", &a]);
        }
    }

    /// What the client gets from `ip:port` over the tunnel (the server's
    /// greeting, trimmed), or None when nothing answers within a second.
    pub fn client_tcp(&self, ip: &str, port: u16) -> Option<String> {
        tcp_request(&self.client.client, ip, port, Duration::from_secs(1))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    /// For each of `n` new connections from the client to the VIP: the backend
    /// that answered (`backend-a`), or None when the connection got nothing.
    pub fn client_vip_shares(&self, n: usize) -> Vec<Option<String>> {
        (0..n)
            .map(|_| {
                self.client_tcp(VIP, VIP_PORT)
                    .map(|greeting| self.backend_named_in(&greeting))
            })
            .collect()
    }

    /// The backend whose netns name `greeting` is.
    pub fn backend_named_in(&self, greeting: &str) -> String {
        self.backends
            .iter()
            .find(|b| greeting == b.pod.name())
            .map(Backend::name)
            .unwrap_or_else(|| format!("unknown ({greeting})"))
    }
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster::new()
    }
}

/// The Service as kube-proxy's nftables mode writes it: a `kube-proxy`
/// table, a service chain choosing an endpoint chain, endpoint chains that
/// mark hairpin traffic for masquerade and DNAT.
fn kube_proxy_ruleset(endpoints: &[String]) -> String {
    let mut chains = String::new();
    let mut vmap = Vec::new();
    for (i, ep) in endpoints.iter().enumerate() {
        chains += &format!(
            "chain endpoint-{i} {{ ip saddr {ep} jump mark-for-masquerade; \
             meta l4proto tcp dnat to {ep}:{BACKEND_PORT}; }}\n"
        );
        vmap.push(format!("{i} : goto endpoint-{i}"));
    }
    format!(
        "nft -f - <<'EOF'\n\
         table ip kube-proxy {{\n\
           chain mark-for-masquerade {{ meta mark set meta mark or 0x4000; }}\n\
           chain masquerading {{ type nat hook postrouting priority 100; meta mark and 0x4000 == 0x4000 masquerade fully-random; }}\n\
           {chains}\
           chain service-web {{ numgen inc mod {n} vmap {{ {vmap} }}; }}\n\
           chain services {{ ip daddr {VIP} tcp dport {VIP_PORT} goto service-web; }}\n\
           chain nat-prerouting {{ type nat hook prerouting priority -100; jump services; }}\n\
           chain nat-output {{ type nat hook output priority -100; jump services; }}\n\
         }}\nEOF",
        n = endpoints.len(),
        vmap = vmap.join(", ")
    )
}

/// A VPN pod on node A with its OpenVPN server and the connected client;
/// dropping it stops both and deletes the pod through libcni.
pub struct VpnPod<'a> {
    cluster: &'a Cluster,
    pub name: String,
    /// cnitool's container ID for the pod.
    pub container_id: String,
    /// The pod's own address (eth0).
    pub ip: String,
    server: Option<Child>,
    client: Option<Child>,
    pub pod: Netns,
}

impl VpnPod<'_> {
    fn cni(&self, verb: Verb) -> CniOutcome {
        let cap = json!({"portMappings": [{
            "hostPort": OPENVPN_PORT, "containerPort": OPENVPN_PORT, "protocol": "udp"}]});
        self.cluster.node_a().node.cni(
            verb,
            NETWORK,
            &self.pod,
            "eth0",
            Some(&pod_args("vpn", &self.name)),
            Some(cap),
        )
    }

    /// What the pod itself gets from `ip:port` (its own address as source).
    pub fn tcp(&self, ip: &str, port: u16) -> Option<String> {
        tcp_request(&self.pod, ip, port, Duration::from_secs(1))
            .ok()
            .map(|s| s.trim().to_string())
    }
}

impl Drop for VpnPod<'_> {
    fn drop(&mut self) {
        for c in [self.client.take(), self.server.take()]
            .into_iter()
            .flatten()
        {
            vpn::stop(c);
        }
        let out = self.cni(Verb::Del);
        if !out.success() {
            eprintln!("warning: CNI DEL of {} failed:\n{out:?}", self.name);
        }
    }
}
