//! The README's OpenVPN example on the cluster, end to end through the API:
//! the example applied with kubectl, a real OpenVPN client outside the
//! cluster reaching a backend pod on every node and a ClusterIP Service
//! served by kube-proxy, and the README's "How to verify" commands.

use std::process::{Child, Command};
use std::time::Duration;

use podgate_integration::k8s::{Cluster, NODES};
use podgate_integration::{output_text, tcp_request, Netns, TempDir};

use crate::install::ensure_installed;
use crate::world::{sh_block, test_image, workdir, World};

/// A backend on every node and a Service in front of them.
pub const GREETERS: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: greeter, namespace: default}
spec:
  selector: {matchLabels: {app: greeter}}
  template:
    metadata: {labels: {app: greeter}}
    spec:
      automountServiceAccountToken: false
      containers:
        - name: greeter
          image: localhost/podgate/greeter:1
          imagePullPolicy: Never
          ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: greeter, namespace: default}
spec:
  selector: {app: greeter}
  ports: [{port: 80, targetPort: 8080}]
"#;

/// The client's address on the fabric.
const CLIENT_IP: &str = "192.168.200.100";

/// An OpenVPN PKI made with openssl: the server's config (what the README
/// puts in the Secret) and the client's.
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = TempDir::new("k8s-ovpn-pki");
        let sh = |script: &str| {
            let out = Command::new("bash")
                .args(["-euo", "pipefail", "-c", script])
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{script}:\n{}", output_text(&out));
        };
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        sh(&format!(
            "openssl req -x509 {ec} -keyout ca.key -out ca.crt -days 2 -subj /CN=vpn-ca 2>/dev/null
             for n in server client; do
               openssl req -new {ec} -keyout $n.key -out $n.csr -subj /CN=$n 2>/dev/null
               printf 'keyUsage=critical,digitalSignature,keyEncipherment,keyAgreement\\nextendedKeyUsage=%s\\n' \\
                 $([ $n = server ] && echo serverAuth || echo clientAuth) > $n.ext
               openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile $n.ext -out $n.crt 2>/dev/null
             done"
        ));
        Pki { dir }
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap()
    }

    /// `server 10.8.0.0 255.255.255.0` with the pod and Service networks
    /// pushed to the client; no `user`/`group` (the container has no
    /// SETUID/SETGID), no file written (read-only root).
    fn server_conf(&self) -> String {
        format!(
            "dev tun\nproto udp\nport 1194\ntopology subnet\nserver 10.8.0.0 255.255.255.0\n\
             push \"route 10.244.0.0 255.255.0.0\"\npush \"route 10.96.0.0 255.255.0.0\"\n\
             keepalive 2 20\ndh none\nverb 3\n\
             <ca>\n{}</ca>\n<cert>\n{}</cert>\n<key>\n{}</key>\n",
            self.read("ca.crt"),
            self.read("server.crt"),
            self.read("server.key")
        )
    }

    fn client_conf(&self, remote: &str, port: u16) -> String {
        format!(
            "client\ndev tun\nproto udp\nremote {remote} {port}\nnobind\nremote-cert-tls server\n\
             verb 3\n<ca>\n{}</ca>\n<cert>\n{}</cert>\n<key>\n{}</key>\n",
            self.read("ca.crt"),
            self.read("client.crt"),
            self.read("client.key")
        )
    }
}

/// An OpenVPN client outside the cluster: its own netns, linked to the
/// fabric's bridge, connected to the VPN Service's NodePort on node-1.
struct Client {
    ns: Netns,
    process: Child,
    log: std::path::PathBuf,
    _pki_dir: TempDir,
}

impl Client {
    fn connect(pki: &Pki, node_port: u16) -> Client {
        let ns = Netns::new("k8s-vpnclient");
        let fabric = Cluster::netns_path("fabric");
        let port = format!("vc{}", std::process::id() % 100_000);
        let sh = |script: &str| {
            let out = Command::new("nsenter")
                .arg(format!("--net={}", fabric.display()))
                .args(["sh", "-c", script])
                .output()
                .unwrap();
            assert!(out.status.success(), "{script}:\n{}", output_text(&out));
        };
        sh(&format!(
            "ip link add {port} type veth peer name uplink0 netns {} && ip link set {port} master fab0 up",
            ns.name()
        ));
        ns.sh_ok(&format!(
            "ip addr add {CLIENT_IP}/24 dev uplink0 && ip link set uplink0 up"
        ));
        let dir = TempDir::new("k8s-ovpn-client");
        let conf = dir.path().join("client.conf");
        let log = dir.path().join("client.log");
        std::fs::write(&conf, pki.client_conf(&node_ip("node-1"), node_port)).unwrap();
        let process = ns.spawn(&[
            "openvpn",
            "--config",
            conf.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
        ]);
        let client = Client {
            ns,
            process,
            log,
            _pki_dir: dir,
        };
        let up = podgate_integration::vpn::wait_for(
            || podgate_integration::ping(&client.ns, "10.8.0.1", 1),
            60,
        );
        assert!(up, "the tunnel never came up:\n{}", client.log());
        client
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What `ip:port` answers the client (trimmed), None when silent.
    fn tcp(&self, ip: &str, port: u16) -> Option<String> {
        tcp_request(&self.ns, ip, port, Duration::from_secs(2))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// This machine's own `net.ipv4.ip_forward`.
fn machine_ip_forward() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
        .unwrap()
        .trim()
        .to_string()
}

fn node_ip(node: &str) -> String {
    let i = NODES.iter().position(|n| *n == node).unwrap() + 1;
    format!("192.168.200.{i}")
}

/// Pods of `selector` in `namespace`: (name, IP, node).
pub fn pods(c: &Cluster, namespace: &str, selector: &str) -> Vec<(String, String, String)> {
    let v = c.kubectl_json(&["-n", namespace, "get", "pods", "-l", selector]);
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                p["status"]["podIP"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                p["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

pub fn the_example_reaches_every_node_and_a_service_through_the_api(world: &mut World) {
    ensure_installed(world);
    for image in ["openvpn", "greeter"] {
        let archive = test_image(image);
        world.cluster().load_image(&archive);
    }
    let c = world.cluster();
    c.apply(GREETERS);
    c.kubectl_ok(&["rollout", "status", "ds/greeter", "--timeout=120s"]);

    let machine_forwarding = machine_ip_forward();
    let pki = Pki::new();
    let example = sh_block(
        "README.md",
        "A minimal OpenVPN example",
        "openvpn-example.yaml",
    );
    let dir = workdir(&[("server.conf", &pki.server_conf())]);
    let out = c.sh_in(&example, dir.path());
    assert!(
        out.status.success(),
        "{example}\nfailed:\n{}",
        output_text(&out)
    );
    c.kubectl_ok(&[
        "-n",
        "vpn",
        "rollout",
        "status",
        "deploy/openvpn-gw",
        "--timeout=180s",
    ]);

    let node_port: u16 = c
        .kubectl_ok(&[
            "-n",
            "vpn",
            "get",
            "svc",
            "openvpn-gw",
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ])
        .trim()
        .parse()
        .unwrap();
    // The VPN pod wired by the shipped profile in its own netns, the
    // router's log naming it; the machine's own forwarding untouched.
    let gw = pods(c, "vpn", "app.kubernetes.io/name=openvpn-gw");
    let [(gw_name, _, gw_node)] = gw.as_slice() else {
        panic!("one openvpn-gw pod: {gw:?}")
    };
    crate::privilege::assert_vpn_wired(&crate::nodes::pod_netns(c, "vpn", gw_name));
    let log = std::fs::read_to_string(c.host_path(gw_node, "/var/log/podgate/router.log"))
        .unwrap_or_default();
    let (_, sandbox) = crate::nodes::ready_sandbox(c, "vpn", gw_name);
    assert!(
        log.contains(gw_name.as_str()) || log.contains(&sandbox),
        "{gw_node}'s router.log names neither {gw_name} nor {sandbox}:\n{log}"
    );
    assert_eq!(
        machine_ip_forward(),
        machine_forwarding,
        "the machine's ip_forward"
    );
    let client = Client::connect(&pki, node_port);

    let greeters = pods(c, "default", "app=greeter");
    let on: Vec<&str> = greeters.iter().map(|g| g.2.as_str()).collect();
    for node in NODES {
        assert!(on.contains(&node), "no greeter on {node}: {greeters:?}");
    }
    for (name, ip, node) in &greeters {
        assert_eq!(
            client.tcp(ip, 8080).as_deref(),
            Some(name.as_str()),
            "the client does not reach the backend on {node} ({ip})\n{}",
            client.log()
        );
    }
    let vip = c
        .kubectl_ok(&["get", "svc", "greeter", "-o", "jsonpath={.spec.clusterIP}"])
        .trim()
        .to_string();
    // Every connection to the Service answered by a backend, until each
    // backend has answered one (kube-proxy picks endpoints at random: 60
    // connections miss one of three with a probability of 1e-10).
    let names: Vec<&str> = greeters.iter().map(|g| g.0.as_str()).collect();
    let mut answered: Vec<String> = Vec::new();
    for i in 0..60 {
        let answer = client.tcp(&vip, 80);
        assert!(
            answer.as_deref().is_some_and(|a| names.contains(&a)),
            "connection {i} to the Service {vip}:80 got {answer:?}"
        );
        if let Some(a) = answer.filter(|a| !answered.contains(a)) {
            answered.push(a);
        }
        if answered.len() == names.len() {
            break;
        }
    }
    answered.sort();
    let mut all: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    all.sort();
    assert_eq!(answered, all, "the backends behind the Service {vip}:80");

    // The README's "How to verify", verbatim, with the client connected
    // and the kubectl plugin on PATH as the README installs it.
    let verify = sh_block("README.md", "How to verify", "kubectl podgate");
    let plugin = PluginPath::new();
    let out = c.sh(&plugin.around(&verify));
    let text = output_text(&out);
    assert!(out.status.success(), "{verify}\nfailed:\n{text}");
    assert!(text.contains("net.ipv4.ip_forward = 1"), "{text}");
    assert!(text.contains("holds"), "{text}");
    drop(client);
    the_kubectl_plugin_says_what_is_wrong_and_copies_a_report(world, &plugin);
}

/// A directory holding `kubectl-podgate` (conf/kubectl-podgate), to put on
/// PATH as the README installs it.
pub struct PluginPath(TempDir);

impl PluginPath {
    pub fn new() -> PluginPath {
        let dir = TempDir::new("k8s-plugin");
        let conf = podgate_integration::workspace_root().join("conf/kubectl-podgate");
        std::os::unix::fs::symlink(conf, dir.path().join("kubectl-podgate")).unwrap();
        PluginPath(dir)
    }

    /// `script` with the plugin on PATH.
    pub fn around(&self, script: &str) -> String {
        format!(
            "export PATH={}:\"$PATH\"\n{script}",
            self.0.path().display()
        )
    }
}

/// `kubectl podgate`'s clear errors (no such pod, a pod not scheduled, no
/// node) and `report NODE`, which copies the node's archive.
fn the_kubectl_plugin_says_what_is_wrong_and_copies_a_report(
    world: &mut World,
    plugin: &PluginPath,
) {
    let c = world.cluster();
    c.apply(&crate::policy::namespace_yaml("nowhere"));
    c.apply(
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unplaced", "namespace": "nowhere"},
            "spec": {"nodeSelector": {"no-such-label": "x"}, "automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "localhost/podgate/greeter:1", "imagePullPolicy": "Never"}]}}"#,
    );
    for (cmd, says) in [
        (
            "kubectl podgate inspect vpn/no-such-pod",
            "no pod vpn/no-such-pod",
        ),
        (
            "kubectl podgate inspect nowhere/unplaced",
            "pod nowhere/unplaced is not scheduled to a node yet",
        ),
        (
            "kubectl podgate inspect no-slash",
            "name the pod as NAMESPACE/POD",
        ),
        ("kubectl podgate report node-9", "no node node-9"),
    ] {
        let out = c.sh(&plugin.around(cmd));
        let text = output_text(&out);
        assert!(
            !out.status.success() && text.contains(says),
            "{cmd}: want '{says}':\n{text}"
        );
    }
    let dir = TempDir::new("k8s-report");
    let out = c.sh_in(
        &plugin.around("kubectl podgate report node-1 && tar -tf podgate-report-node-1.tar"),
        dir.path(),
    );
    let text = output_text(&out);
    assert!(
        out.status.success() && text.contains("podgate-report-node-1.tar"),
        "report:\n{text}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).lines().count() > 3,
        "an archive of a few files:\n{text}"
    );
    c.kubectl_ok(&["delete", "namespace", "nowhere", "--wait=false"]);
}
