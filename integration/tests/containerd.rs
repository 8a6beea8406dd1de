//! podgate under the runtime Kubernetes drives: a real containerd (Debian's,
//! CRI plugin) inside a throwaway node netns, driven over CRI with `k8s-cri`
//! exactly as the kubelet does (RunPodSandbox -> CNI ADD with the pod's
//! annotations through `io.kubernetes.cri.pod-annotations`; StopPodSandbox ->
//! DEL; RemovePodSandbox -> DEL without netns). Conflist: bridge + host-local
//! + portmap + podgate-tunnel-guard + podgate-router.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::containerd::{cgroup_tree_exists, Containerd};
use podgate_integration::cri::{in_netns, pod_nft, sysctl_in, Cri, Pod};
use podgate_integration::{
    assert_same, output_text, podgate, podgate_bin, podgate_command, require_root, vpn, Netns, Run,
    Snapshot, TestNode, Verb,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const NET: &str = "podnet";
const SUBNET: &str = "10.23.0.0/16";

// ------------------------------------------------------------------ the node

fn router_entry(node: &TestNode) -> Value {
    json!({
        "type": "podgate-router",
        "stateDir": node.state_dir(),
        "logFile": node.root().join("router.log"),
        "capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "profiles": {
            "vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}, "masquerade": [{"source": "10.8.0.0/24"}]},
            "vpn-routed":  {"sysctls": {"net.ipv4.ip_forward": "1"}, "returnRoutes": [{"dst": "10.8.0.0/24"}]},
            "pool-router": {"sysctls": {"net.ipv4.ip_forward": "1"}}
        },
        "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.9.0.0/16"]}
    })
}

fn chain(node: &TestNode) -> Vec<Value> {
    vec![
        json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
        json!({"type": "podgate-tunnel-guard", "required": "never",
               "eventFile": node.event_file()}),
        router_entry(node),
    ]
}

/// A node with the chain in `net.d/` and containerd running in it.
fn start(prefix: &str) -> Containerd {
    require_root();
    podgate_integration::built_shipped();
    let node = TestNode::new(prefix);
    node.refresh_cni_bin();
    node.write_conflist(
        "10-podnet",
        &node.bridge_conflist(NET, "1.0.0", SUBNET, chain(&node)),
    );
    Containerd::start(node)
}

/// podgate's nf_tables table in the pod, if any (`nft list table`).
/// Forwarding of a fresh netns on this machine (what a sandbox starts with:
/// a new netns copies the initial netns' value).
fn fresh_forwarding() -> String {
    Netns::new("ctd-probe").sysctl_get("net.ipv4.ip_forward")
}

fn node_routes(node: &TestNode) -> String {
    node.ns.exec_ok(&["ip", "route", "show", "table", "all"])
}

/// The helper, pointed at this containerd and node.
fn podgate_at(c: &Containerd, args: &[&str]) -> Run {
    Run::of(
        podgate_command()
            .args(args)
            .arg("--runtime-endpoint")
            .arg(c.endpoint())
            .arg("--state-dir")
            .arg(c.node().state_dir())
            .arg("--node-netns")
            .arg(c.node().ns.path()),
    )
}

/// The helper as `kubectl exec` runs it in the DaemonSet's container
/// (conf/kubernetes/podgate.yaml): the runtime's dir mounted read-only
/// (recursively, as the runtime mounts a hostPath, so the netns mounts below
/// it stay visible), and only the capabilities the manifest adds (SYS_ADMIN,
/// NET_ADMIN, NET_RAW), in a private mount namespace of its own.
fn podgate_as_daemonset(c: &Containerd, args: &[&str]) -> Run {
    let script = r#"d="$1"; shift
mount --rbind "$d" "$d" && mount -o remount,bind,ro "$d" || exit 99
if touch "$d/.rw-probe" 2>/dev/null; then rm -f "$d/.rw-probe"; exit 98; fi
exec setpriv --bounding-set=-all,+sys_admin,+net_admin,+net_raw -- "$@""#;
    Run::of(
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(c.dir())
            .arg(podgate_bin())
            .args(args)
            .arg("--runtime-endpoint")
            .arg(c.endpoint())
            .arg("--state-dir")
            .arg(c.node().state_dir()),
    )
}

/// The node's state once every pod is gone: nothing of podgate's (routes,
/// records), nothing of containerd's pods (netns mounts, cgroups).
fn assert_clean(c: &Containerd, before: &Snapshot) {
    let node = c.node();
    let after = node.settled_snapshot();
    // The bridge stays (the bridge plugin never deletes it), as on a real node.
    let mut after_links = after.clone();
    after_links.links.retain(|l| !l.starts_with("pgbr"));
    after_links.addrs.retain(|a| !a.starts_with("pgbr"));
    after_links
        .routes4
        .retain(|r| !r.contains("\"dev\":\"pgbr"));
    after_links
        .routes6
        .retain(|r| !r.contains("\"dev\":\"pgbr"));
    let mut before = before.clone();
    before.links.retain(|l| !l.starts_with("pgbr"));
    before.addrs.retain(|a| !a.starts_with("pgbr"));
    before.routes4.retain(|r| !r.contains("\"dev\":\"pgbr"));
    before.routes6.retain(|r| !r.contains("\"dev\":\"pgbr"));
    assert_same(&before, &after_links);
    assert!(
        !node_routes(node).contains("proto 94"),
        "{}",
        node_routes(node)
    );
    assert!(
        node.state_files().is_empty(),
        "podgate records left: {:?}",
        node.state_files()
    );
    let netns_dir = c.state_dir().join("io.containerd.grpc.v1.cri/netns");
    let left: Vec<_> = std::fs::read_dir(&netns_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "sandbox netns left: {left:?}");
}

// ------------------------------------------------------------------- tests

/// Profile pod, plain pod, refused annotation, pool claims, the helper by pod
/// name, and Stop + Remove leaving nothing.
#[test]
fn pods_through_containerd_cri() {
    let c = start("ctd-pods");
    let mut cri = Cri::connect(&c);
    let before = c.node().settled_snapshot();
    let baseline = fresh_forwarding();

    // A pod in an allowed namespace that asks for a profile.
    let gw = cri
        .run(
            &c,
            &Pod {
                annotations: &[("podgate.dev/profile", "vpn-gateway")],
                ..Pod::new("vpn", "openvpn-0")
            },
        )
        .unwrap_or_else(|e| panic!("RunPodSandbox vpn/openvpn-0: {e}\n{}", c.log()));
    let gw_ns = cri.netns(&gw);
    assert_eq!(sysctl_in(&gw_ns, "net.ipv4.ip_forward"), "1");
    let nft = pod_nft(&gw_ns).expect("podgate's nft table in the sandbox");
    assert!(
        nft.contains("ip saddr 10.8.0.0/24 oifname \"eth0\" masquerade"),
        "{nft}"
    );
    assert_eq!(c.node().state_files().len(), 1, "one record");

    // A plain pod: untouched.
    let plain = cri.run(&c, &Pod::new("default", "web-0")).unwrap();
    let plain_ns = cri.netns(&plain);
    assert_eq!(sysctl_in(&plain_ns, "net.ipv4.ip_forward"), baseline);
    assert_eq!(pod_nft(&plain_ns), None);
    assert_eq!(c.node().state_files().len(), 1, "no record for a plain pod");

    // An annotation from a namespace outside policy: the sandbox fails with
    // podgate's reason in the runtime's error, and nothing is left.
    let err = cri
        .run(
            &c,
            &Pod {
                annotations: &[("podgate.dev/profile", "vpn-gateway")],
                ..Pod::new("default", "sneaky-0")
            },
        )
        .expect_err("an annotation outside allow.annotationNamespaces must fail the sandbox");
    assert!(
        err.contains("refused by allow.annotationNamespaces"),
        "runtime error must carry podgate's reason: {err}"
    );

    // A return-route pool claimed by annotation, then a second claim refused.
    let pool = Pod {
        annotations: &[
            ("podgate.dev/profile", "pool-router"),
            ("podgate.dev/return-routes", "10.9.1.0/24"),
        ],
        ..Pod::new("vpn", "router-a")
    };
    let a = cri.run(&c, &pool).unwrap();
    let routes = node_routes(c.node());
    assert!(
        routes
            .lines()
            .any(|l| l.starts_with("10.9.1.0/24 via ") && l.contains("proto 94")),
        "{routes}"
    );
    let err = cri
        .run(
            &c,
            &Pod {
                name: "router-b",
                ..pool
            },
        )
        .expect_err("a pool already routed to another pod must be refused");
    assert!(
        err.contains("10.9.1.0/24") && err.contains("refused"),
        "runtime error must name the pool: {err}"
    );

    helper_by_pod_name(&c, &gw, &plain, &a, &baseline);
    helper_from_the_daemonsets_container(&c);

    // Everything deleted as the kubelet deletes pods.
    for id in [&gw, &plain, &a] {
        cri.stop_and_remove(id);
    }
    assert!(!gw_ns.exists() && !plain_ns.exists());
    assert_clean(&c, &before);
}

/// The helper by pod name (`--k8s-pod`), for the profile pod and for a
/// pod podgate never touched (`baseline`: the node's fresh forwarding
/// value); an unknown pod named; `inspect` of a pod with and one without a
/// record.
fn helper_by_pod_name(c: &Containerd, gw: &str, plain: &str, a: &str, baseline: &str) {
    let r = podgate_at(
        c,
        &[
            "sysctl",
            "get",
            "--k8s-pod",
            "vpn/openvpn-0",
            "net.ipv4.ip_forward",
        ],
    );
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (Some(0), "net.ipv4.ip_forward = 1\n"),
        "{r:?}"
    );
    let r = podgate_at(
        c,
        &[
            "sysctl",
            "get",
            "--k8s-pod",
            "default/web-0",
            "net.ipv4.ip_forward",
        ],
    );
    assert_eq!(
        (r.code, r.stdout.clone()),
        (Some(0), format!("net.ipv4.ip_forward = {baseline}\n")),
        "{r:?}"
    );
    let r = podgate_at(c, &["diagnose", "--k8s-pod", "vpn/openvpn-0"]);
    assert!(
        r.stdout
            .contains(&format!("pod vpn/openvpn-0 (sandbox {gw}")),
        "{r:?}"
    );
    assert!(
        r.stdout.contains("pools: 10.8.0.0/24"),
        "pools from the record: {r:?}"
    );
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("forwarding ipv4") && l.contains(" ok ")),
        "{r:?}"
    );
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("return path 10.8.0.0/24") && l.contains(" ok ")),
        "{r:?}"
    );
    let r = podgate_at(
        c,
        &[
            "diagnose",
            "--k8s-pod",
            "default/web-0",
            "--pool",
            "10.8.0.0/24",
        ],
    );
    assert!(
        r.stdout
            .contains(&format!("pod default/web-0 (sandbox {plain}")),
        "{r:?}"
    );
    if baseline == "0" {
        assert_eq!(r.code, Some(2), "a plain pod is not a router: {r:?}");
        assert!(
            r.stdout
                .lines()
                .any(|l| l.starts_with("forwarding ipv4") && l.contains("FAIL")),
            "{r:?}"
        );
    }
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("return path 10.8.0.0/24") && l.contains("FAIL")),
        "{r:?}"
    );
    let r = podgate_at(
        c,
        &[
            "sysctl",
            "get",
            "--k8s-pod",
            "vpn/nope",
            "net.ipv4.ip_forward",
        ],
    );
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("pod vpn/nope: no ready sandbox"), "{r:?}");
    let r = podgate_at(c, &["inspect", "--k8s-pod", "vpn/router-a", "--json"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["attachments"].as_array().unwrap().len(), 1, "{r:?}");
    assert_eq!(v["attachments"][0]["key"]["containerID"], a, "{r:?}");
    let r = podgate_at(c, &["inspect", "--k8s-pod", "default/web-0", "--json"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        v["attachments"],
        json!([]),
        "a plain pod has no record: {r:?}"
    );
}

/// The same from the DaemonSet's container (read-only CRI socket, its
/// capabilities only). Its netns is the node's (hostNetwork).
fn helper_from_the_daemonsets_container(c: &Containerd) {
    let r = podgate_as_daemonset(
        c,
        &[
            "sysctl",
            "get",
            "--k8s-pod",
            "vpn/openvpn-0",
            "net.ipv4.ip_forward",
        ],
    );
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (Some(0), "net.ipv4.ip_forward = 1\n"),
        "{r:?}"
    );
    let r = podgate_as_daemonset(
        c,
        &[
            "diagnose",
            "--k8s-pod",
            "vpn/openvpn-0",
            "--node-netns",
            c.node().ns.path().to_str().unwrap(),
        ],
    );
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("return path 10.8.0.0/24") && l.contains(" ok ")),
        "nf_tables readable with the DaemonSet's capabilities: {r:?}"
    );
}

/// containerd restarted while pods run (its CNI state must carry over), then
/// the pods deleted: still clean.
/// Sandboxes whose annotations add up to more than gRPC's default answer
/// of 4 MiB: 20 pods with 256 KiB each (the API server's limit for one
/// pod). `--k8s-pod` still finds a pod among them, and the unguarded
/// listing (the node agent's scan, the same code) lists every one.
#[test]
fn a_runtime_listing_past_4_mib_of_annotations_is_read() {
    let c = start("bigann");
    let node = c.node();
    let mut cri = Cri::connect(&c);
    let blob = "x".repeat(256 * 1024);
    let annotations = [("example.com/blob", blob.as_str())];
    let mut ids = Vec::new();
    for i in 0..20 {
        let name = format!("big-{i}");
        let pod = Pod {
            annotations: &annotations,
            ..Pod::new("default", &name)
        };
        ids.push(cri.run(&c, &pod).unwrap());
    }
    let r = podgate_at(&c, &["inspect", "--k8s-pod", "default/big-7", "--json"]);
    assert_eq!(r.code, Some(0), "{r:?}");

    // Every sandbox unguarded: a guard requiring IPsec, and a history whose
    // guard series was seen not served since the boot.
    let installer = node.root().join("installer");
    std::fs::create_dir_all(&installer).unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let open = json!({"firstLoaded": null, "missing": [
        {"lastSeenLoaded": null, "firstSeenMissing": 1, "seenLoadedAgain": null}]});
    std::fs::write(
        installer.join("runtime-chain.json"),
        json!({"version": 2, "bootId": boot.trim(), "router": open, "guard": open}).to_string(),
    )
    .unwrap();
    let plugins = node.root().join("plugins.json");
    std::fs::write(
        &plugins,
        json!([{"type": "podgate-tunnel-guard", "required": "always",
                "protectionDir": node.root().join("no-protection"),
                "ovsdbSocket": node.root().join("no-ovsdb.sock"),
                "eventFile": node.event_file()}])
        .to_string(),
    )
    .unwrap();
    let out = podgate_integration::agent::inspect_unguarded(&c.endpoint(), &installer, &plugins);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    for id in &ids {
        assert!(text.contains(id.as_str()), "{id} not listed: {text}");
    }
    for id in &ids {
        cri.stop_and_remove(id);
    }
}

#[test]
fn containerd_restart_while_pods_run() {
    let mut c = start("ctd-restart");
    let before = c.node().settled_snapshot();
    let mut cri = Cri::connect(&c);
    let routed = cri
        .run(
            &c,
            &Pod {
                annotations: &[("podgate.dev/profile", "vpn-routed")],
                ..Pod::new("vpn", "openvpn-1")
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let gw = cri
        .run(
            &c,
            &Pod {
                annotations: &[("podgate.dev/profile", "vpn-gateway")],
                ..Pod::new("vpn", "openvpn-2")
            },
        )
        .unwrap();
    let gw_ns = cri.netns(&gw);
    assert!(node_routes(c.node()).contains("10.8.0.0/24 via"));
    drop(cri);

    let old = c.pid();
    c.restart();
    assert_ne!(old, c.pid());
    let mut cri = Cri::connect(&c);
    // The pods survived the restart, podgate's state with them.
    assert_eq!(sysctl_in(&gw_ns, "net.ipv4.ip_forward"), "1");
    assert_eq!(c.node().state_files().len(), 2);
    let r = podgate_at(
        &c,
        &[
            "sysctl",
            "get",
            "--k8s-pod",
            "vpn/openvpn-2",
            "net.ipv4.ip_forward",
        ],
    );
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (Some(0), "net.ipv4.ip_forward = 1\n"),
        "{r:?}"
    );
    for id in [&routed, &gw] {
        cri.stop_and_remove(id);
    }
    assert_clean(&c, &before);
    drop(cri);
    let parent = c.cgroup_parent().to_string();
    drop(c);
    assert!(!cgroup_tree_exists(&parent), "cgroups of {parent} left");
}

/// The OpenVPN-pod scenario (a VPN pod that must forward) once through
/// containerd: an OpenVPN server in
/// a CRI sandbox with `vpn-gateway`; the client reaches the pod behind it.
#[test]
fn openvpn_scenario_through_containerd() {
    let c = start("ctd-ovpn");
    let node = c.node();
    let vpn = vpn::client(node, "k");
    // The backend pod is wired by libcni into the same network (same conf
    // dir, same host-local store), so containerd's sandbox can reach it.
    let backend = node.pod("backend");
    let b = node.cni(
        Verb::Add,
        NET,
        &backend,
        "eth0",
        Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=backend"),
        None,
    );
    b.assert_ok();
    let backend_ip = b.first_ip().unwrap();
    let _srv = podgate_integration::tcp_listen_peer_echo(&backend, 8080);

    let mut cri = Cri::connect(&c);
    let id = cri
        .run(
            &c,
            &Pod {
                annotations: &[("podgate.dev/profile", "vpn-gateway")],
                udp_ports: &[(vpn::OPENVPN_PORT as i32, vpn::OPENVPN_PORT as i32)],
                ..Pod::new("vpn", "openvpn-0")
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let netns = cri.netns(&id);
    let addr = in_netns(&netns, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"]);
    let vpn_ip = String::from_utf8_lossy(&addr.stdout)
        .split_whitespace()
        .nth(3)
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
        .unwrap();

    let server = vpn::server_in(&netns, &vpn.key);
    let client = vpn::connect(
        &vpn.client,
        &vpn.key,
        42001,
        &[("10.23.0.0", "255.255.0.0")],
    );
    let up = vpn::wait_for(|| podgate_integration::ping(&vpn.client, "10.8.0.1", 1), 30);
    let seen = up
        .then(|| {
            podgate_integration::tcp_request(&vpn.client, &backend_ip, 8080, Duration::from_secs(3))
                .ok()
        })
        .flatten()
        .map(|s| s.trim().to_string());
    vpn::stop(client);
    vpn::stop(server);
    assert!(
        up,
        "client never reached the tunnel peer\n{}",
        vpn::logs(&vpn.key)
    );
    assert_eq!(
        seen.as_deref(),
        Some(vpn_ip.as_str()),
        "the backend sees the client masqueraded to the VPN pod's address"
    );
    cri.stop_and_remove(&id);
    node.cni(
        Verb::Del,
        NET,
        &backend,
        "eth0",
        Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=backend"),
        None,
    )
    .assert_ok();
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
    assert!(!node_routes(node).contains("proto 94"));
}

/// `podgate install --watch` as the DaemonSet runs it, stopped by its PID
/// (SIGTERM on `stop`, SIGKILL on drop).
struct Installer {
    child: std::process::Child,
    log: PathBuf,
}

impl Installer {
    fn start(c: &Containerd, plugins: &Path) -> Installer {
        let node = c.node();
        let log = node.root().join("installer.log");
        let mut cmd = podgate_command();
        let child = podgate_integration::agent::install_watch(&mut cmd, node, plugins)
            .args(["--debounce-ms", "50"])
            .arg("--ready-file")
            .arg(node.root().join("installer.ready"))
            .arg("--runtime-endpoint")
            .arg(c.endpoint())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Installer { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(mut self) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let ok = vpn::wait_for(|| self.child.try_wait().unwrap().is_some(), 10);
        assert!(ok, "installer did not stop:\n{}", self.log());
    }
}

impl Drop for Installer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// First IPv4 address of eth0 in a sandbox netns.
/// `podgate cri-proxy`, the agent's only way to the runtime in the
/// DaemonSet: the reads podgate makes are forwarded (the helper's
/// `--k8s-pod` finds a pod through it), a RunPodSandbox is refused without
/// reaching the runtime, and StopPodSandbox (`--repair-unguarded`) is
/// forwarded only with `--allow-stop`. SIGTERM: exit 0, socket removed.
#[test]
fn the_cri_proxy_forwards_podgates_reads_and_no_write_unless_allowed() {
    let c = start("ctd-proxy");
    let mut cri = Cri::connect(&c);
    let plain = cri.run(&c, &Pod::new("default", "plain")).unwrap();
    let sandboxes = cri.count_sandboxes().unwrap();
    for allow_stop in [false, true] {
        let sock = c.node().root().join(format!("proxy-{allow_stop}.sock"));
        let mut proxy = podgate_command();
        proxy
            .args(["cri-proxy", "--listen"])
            .arg(&sock)
            .args(["--runtime-endpoint", &c.endpoint()])
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        if allow_stop {
            proxy.arg("--allow-stop");
        }
        let proxy = proxy.spawn().unwrap();
        let start = std::time::Instant::now();
        while !sock.exists() {
            assert!(start.elapsed() < Duration::from_secs(10), "no proxy socket");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut via = Cri::connect_socket(&sock).unwrap();
        assert_eq!(via.count_sandboxes(), Ok(sandboxes));
        let endpoint = format!("unix://{}", sock.display());
        podgate(&[
            "sysctl",
            "get",
            "--k8s-pod",
            "default/plain",
            "--runtime-endpoint",
            &endpoint,
            "net.ipv4.ip_forward",
        ])
        .ok();

        let run =
            via.run_sandbox(&Pod::new("default", "intruder").sandbox_config(c.cgroup_parent()));
        let err = run.unwrap_err();
        assert!(
            err.contains("does not forward /runtime.v1.RuntimeService/RunPodSandbox"),
            "{err}"
        );
        assert_eq!(cri.count_sandboxes(), Ok(sandboxes), "a sandbox was made");
        let stop = via.try_stop(&plain);
        match allow_stop {
            false => {
                assert!(stop.unwrap_err().contains("does not forward"));
                assert!(cri.ready(&plain), "stopped without --allow-stop");
            }
            true => {
                stop.unwrap();
                assert!(!cri.ready(&plain), "not stopped with --allow-stop");
            }
        }
        // SAFETY: kill(2) on the proxy this test started.
        assert_eq!(unsafe { libc::kill(proxy.id() as i32, libc::SIGTERM) }, 0);
        let out = proxy.wait_with_output().unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{log}");
        assert!(
            log.contains("refused /runtime.v1.RuntimeService/RunPodSandbox"),
            "{log}"
        );
        assert!(!sock.exists(), "{log}");
    }
    cri.stop_and_remove(&plain);
}

fn sandbox_ip(netns: &Path) -> String {
    let out = in_netns(netns, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"]);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(3)
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no IPv4 on eth0: {}", output_text(&out)))
}

/// Never a pod without the chain: the node reboots, the primary's installer
/// rewrites its conflist before podgate's DaemonSet is back (as Calico and
/// Cilium do at start); containerd still wires a new pod through podgate
/// (podgate's own conflist sorts first); podgate's installer comes back and
/// re-renders from the primary's new content.
#[test]
fn primary_rewrites_its_conflist_while_the_installer_is_down() {
    require_root();
    podgate_integration::built_shipped();
    let node = TestNode::new("ctd-reboot");
    // Its new content after the "reboot": another subnet on another bridge
    // (the bridge plugin refuses a second gateway address on one bridge).
    let primary = |node: &TestNode, subnet: &str| {
        let mut list = node.bridge_conflist(
            NET,
            "1.0.0",
            subnet,
            vec![json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true})],
        );
        if subnet != "10.23.0.0/16" {
            list["plugins"][0]["bridge"] = json!("pgbr-rebooted");
        }
        list
    };
    // What the primary CNI wrote: no podgate in it.
    node.write_conflist("10-podnet", &primary(&node, "10.23.0.0/16"));
    let plugins = node.root().join("plugins.json");
    std::fs::write(
        &plugins,
        json!([
            {"type": "podgate-tunnel-guard", "required": "never",
             "eventFile": node.event_file()},
            router_entry(&node)
        ])
        .to_string(),
    )
    .unwrap();
    let c = Containerd::start(node);
    let node = c.node();
    let own = node.conf_dir().join("00-podgate.conflist");
    let ready = node.root().join("installer.ready");
    let installer = Installer::start(&c, &plugins);
    assert!(
        vpn::wait_for(|| ready.exists(), 20),
        "installer never ready:\n{}",
        installer.log()
    );
    let mut cri = Cri::connect(&c);
    let vpn_pod = |name: &'static str| Pod {
        annotations: &[("podgate.dev/profile", "vpn-gateway")],
        ..Pod::new("vpn", name)
    };
    let first = cri
        .run(&c, &vpn_pod("openvpn-0"))
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let first_ns = cri.netns(&first);
    assert_eq!(sysctl_in(&first_ns, "net.ipv4.ip_forward"), "1");

    // Reboot: the installer is down; the primary's installer rewrites its
    // file (temp + rename) with new content.
    installer.stop();
    assert!(
        own.exists(),
        "podgate's file stays while its installer is down"
    );
    let primary_file = node.conf_dir().join("10-podnet.conflist");
    let tmp = node.conf_dir().join(".10-podnet.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(&primary(node, "10.24.0.0/16")).unwrap(),
    )
    .unwrap();
    std::fs::rename(&tmp, &primary_file).unwrap();
    // A pod created now is still wired through podgate.
    std::thread::sleep(Duration::from_millis(500));
    let during = cri.run(&c, &vpn_pod("openvpn-1")).unwrap();
    let during_ns = cri.netns(&during);
    assert_eq!(
        sysctl_in(&during_ns, "net.ipv4.ip_forward"),
        "1",
        "a pod created while the installer was down missed podgate"
    );
    assert!(pod_nft(&during_ns).is_some());
    assert!(
        sandbox_ip(&during_ns).starts_with("10.23."),
        "podgate's copy still holds the primary's previous content"
    );

    // The installer comes back: podgate's file is rendered from the
    // primary's new content, and new pods get it.
    let installer = Installer::start(&c, &plugins);
    assert!(
        vpn::wait_for(
            || std::fs::read_to_string(&own).is_ok_and(|t| t.contains("10.24.0.0/16")),
            20
        ),
        "podgate's file not re-rendered:\n{}",
        installer.log()
    );
    let primary_now: Value =
        serde_json::from_slice(&std::fs::read(&primary_file).unwrap()).unwrap();
    assert_eq!(
        primary_now,
        primary(node, "10.24.0.0/16"),
        "primary untouched"
    );
    let mut after = None;
    // containerd reloads its CNI config on the file event; give it a moment.
    for _ in 0..50 {
        let id = cri.run(&c, &vpn_pod("openvpn-2")).unwrap();
        let ns = cri.netns(&id);
        if sandbox_ip(&ns).starts_with("10.24.") {
            after = Some((id, ns));
            break;
        }
        cri.stop_and_remove(&id);
        std::thread::sleep(Duration::from_millis(200));
    }
    let (after, after_ns) = after.expect("containerd never used the re-rendered chain");
    assert_eq!(sysctl_in(&after_ns, "net.ipv4.ip_forward"), "1");
    installer.stop();

    for id in [&first, &during, &after] {
        cri.stop_and_remove(id);
    }
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
    assert!(!node_routes(node).contains("proto 94"));
    let out = podgate_command()
        .arg("uninstall")
        .arg("--cni-conf-dir")
        .arg(node.conf_dir())
        .arg("--cni-bin-dir")
        .arg(node.cni_bin_dir())
        .arg("--state-dir")
        .arg(node.root().join("installer"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(!own.exists());
}
