//! The DaemonSet of `conf/kubernetes/`, run the way a kubelet runs it: the
//! pod template read from the manifests (containers, args, env,
//! securityContext, volumes and mounts, probes), the kubelet's part done
//! here ([`podgate_integration::kubelet`]: downward API, ConfigMap volume
//! files, `$(VAR)` expansion) and the result asked of a real containerd's CRI
//! inside a throwaway node netns, with the node's paths under a throwaway
//! "host" root. The image is podgate's (see [`image`]); a VPN pod created
//! afterwards through the same containerd is wired by the binaries the image
//! installed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::containerd::{
    unescape_mountinfo, Containerd, Layout, NODE_NETNS_DIR, PAUSE_IMAGE,
};
use podgate_integration::cri::{Cri, Pod};
use podgate_integration::kubelet::{self, Container, Kubelet};
use podgate_integration::registry::{self, Registry};
use podgate_integration::{
    http_get, intruder, output_text, require_root, workspace_root, Netns, Snapshot, TestNode,
    SYSTEM_CNI_DIR,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const NET: &str = "podnet";
const SUBNET: &str = "10.24.0.0/16";
/// The node's own address (`status.hostIP`), on the node's `lo`.
const HOST_IP: &str = "10.250.0.1";
const WAIT: Duration = Duration::from_secs(30);
const CONTAINER_RUNNING: i32 = 1;
/// The routed primary's pod subnet, and strict routing's uplink and gateway
/// (a veth to a "fabric" netns standing in for the node's network).
const ROUTED_SUBNET: &str = "10.30.0.0/24";
const UPLINK: &str = "pgup0";
const GATEWAY: &str = "192.0.2.254";
/// Where the privilege tests put the intruder on the node: the plugins'
/// log dir, which the agent mounts (read-only, not `noexec`).
const INTRUDER_DIR: &str = "/var/log/podgate";

// ------------------------------------------------------------ the manifests

fn manifest_dir() -> PathBuf {
    workspace_root().join("conf/kubernetes")
}

fn manifests() -> Vec<Value> {
    let mut files: Vec<PathBuf> = fs::read_dir(manifest_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    kubelet::read_manifests(&files)
}

/// The ConfigMaps of podgate-config.yaml: name -> data.
fn configmaps(docs: &[Value]) -> BTreeMap<String, BTreeMap<String, String>> {
    docs.iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .map(|d| {
            let data = d["data"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            (d["metadata"]["name"].as_str().unwrap().to_string(), data)
        })
        .collect()
}

/// In `plugins.json`, an entry naming neither `eventFile` nor `stateDir`
/// writes the plugins' default event file, a path of the node's like every
/// other: it is named, so that [`Kubelet::map_paths`] maps it too (else the
/// containerd-run plugin would write this machine's own default).
fn default_event_files(key: &str, mut v: Value) -> Value {
    if key == "plugins.json" {
        for entry in v.as_array_mut().into_iter().flatten() {
            if entry.get("eventFile").is_none() && entry.get("stateDir").is_none() {
                let file = podgate_cni::event::file_for_entry(entry);
                entry["eventFile"] = json!(file);
            }
        }
    }
    v
}

// ------------------------------------------------------------------ images

/// podgate's image under `name`, built from the Dockerfile by
/// integration/image/build.sh with `commit` (in `podgate --version`; a
/// different commit makes a different podgate binary): an archive `ctr
/// images import` takes. Built once per commit and test process.
fn image(name: &str, commit: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<BTreeMap<String, PathBuf>> =
        std::sync::Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = built.get(commit) {
        return p.clone();
    }
    let dir = podgate_integration::target_dir().join("podgate-daemonset-images");
    fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("podgate-{commit}.tar"));
    podgate_integration::image::build_amd64(name, commit, &out);
    built.insert(commit.into(), out.clone());
    out
}

// ---------------------------------------------------------------- the node

/// The node's primary CNI, as its own installer writes it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Primary {
    /// bridge + host-local.
    Bridge,
    /// ptp + host-local (one veth and one host route per pod), with an
    /// uplink to a fabric netns: what strict routing needs.
    Routed,
}

/// A node: containerd in its netns, its CNI dirs and podgate's paths under
/// `<node>/host`, the primary CNI installed as its own installer would.
struct Node {
    cri: Cri,
    c: Containerd,
    host: PathBuf,
    docs: Vec<Value>,
    image: String,
    /// The routed primary's fabric (dropped with the node).
    _fabric: Option<Netns>,
    /// The tests of this file one at a time (dropped last): their
    /// containerds share the machine's netns dir, each removing the `cni-*`
    /// files it did not find there.
    _serial: std::sync::MutexGuard<'static, ()>,
}

/// A running pod of a DaemonSet: its sandbox and containers by name.
struct DsPod {
    sandbox: String,
    /// The containers' logs (`<name>.log`).
    logs: PathBuf,
    containers: BTreeMap<String, String>,
    specs: BTreeMap<String, Container>,
}

impl Node {
    fn start(prefix: &str) -> Node {
        Node::start_with(prefix, Primary::Bridge)
    }

    fn start_with(prefix: &str, primary: Primary) -> Node {
        static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        require_root();
        let node = TestNode::new(prefix);
        node.ns
            .exec_ok(&["ip", "addr", "add", &format!("{HOST_IP}/32"), "dev", "lo"]);
        let host = node.root().join("host");
        let layout = Layout {
            cni_bin_dir: host.join("opt/cni/bin"),
            cni_conf_dir: host.join("etc/cni/net.d"),
            // Where a node's containerd has it: the installer's readiness
            // asks it what it loaded.
            socket: Some(host.join("run/containerd/containerd.sock")),
            netns_under_state_dir: false,
        };
        fs::create_dir_all(host.join("run/containerd")).unwrap();
        fs::create_dir_all(&layout.cni_bin_dir).unwrap();
        fs::create_dir_all(&layout.cni_conf_dir).unwrap();
        for plugin in ["bridge", "ptp", "host-local", "loopback", "portmap"] {
            fs::copy(
                Path::new(SYSTEM_CNI_DIR).join(plugin),
                layout.cni_bin_dir.join(plugin),
            )
            .unwrap();
        }
        let (conflist, fabric) = match primary {
            Primary::Bridge => (node.bridge_conflist(NET, "1.0.0", SUBNET, Vec::new()), None),
            Primary::Routed => (routed_conflist(&node), Some(fabric(&node))),
        };
        fs::write(
            layout.cni_conf_dir.join("10-podnet.conflist"),
            serde_json::to_vec_pretty(&conflist).unwrap(),
        )
        .unwrap();
        let docs = manifests();
        let image = kubelet::image_of(kubelet::find(&docs, "DaemonSet", "podgate"));
        let c = Containerd::start_with(node, layout);
        let cri = Cri::connect(&c);
        Node {
            cri,
            c,
            host,
            docs,
            image,
            _fabric: fabric,
            _serial: serial,
        }
    }

    /// The image the way it reaches an operator's node: pushed (`podman
    /// push`) to a registry, here a real one in the node netns, and pulled
    /// by containerd under the manifest's name (the CRI's PullImage, as the
    /// kubelet asks for it) through a mirror entry for the name's registry.
    /// The pulled image is the pushed one: same ID, same manifest digest.
    fn pull_through_registry(&mut self, archive: &Path) {
        let started = Instant::now();
        let image = self.image.clone();
        let (host, repository) = registry::split_image_name(&image);
        let registry = Registry::start(&self.c.node().ns, HOST_IP);
        let pushed = registry.push_archive(archive, &image, repository);
        self.c.mirror(host, &registry.url());
        assert!(
            self.cri.image_status(&image).is_none(),
            "containerd has {image} before the pull"
        );
        let image_ref = self.cri.pull_image(&image).unwrap_or_else(|e| {
            panic!(
                "PullImage {image}: {e}
{}",
                registry.log()
            )
        });
        assert_eq!(image_ref, pushed.id);
        let pulled = self.cri.image_status(&image).unwrap();
        assert_eq!(pulled.id, pushed.id);
        assert!(pulled.repo_tags.contains(&image), "{pulled:?}");
        let (name, _tag) = image.rsplit_once(':').unwrap();
        let by_digest = format!("{name}@{}", pushed.manifest);
        assert!(pulled.repo_digests.contains(&by_digest), "{pulled:?}");
        eprintln!(
            "{image} pushed and pulled in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }

    fn kubelet(&self, pod: &str, configmaps: bool) -> Kubelet {
        Kubelet {
            host_root: self.host.clone(),
            // The runtime's netns dir is this machine's (containerd's
            // default on a node, where the agent looks for pods' netns).
            // /proc/sys/net resolves in the opener's netns: the agent's
            // adoption writes a pod's sysctls from inside the pod's netns.
            shared: vec![PathBuf::from(NODE_NETNS_DIR), PathBuf::from("/proc")],
            host_ip: HOST_IP.into(),
            pod_dir: self.c.node().root().join("pods").join(pod),
            configmaps: match configmaps {
                true => self.configmaps(),
                false => BTreeMap::new(),
            },
        }
    }

    /// podgate-config.yaml's ConfigMaps, their absolute paths (the node's)
    /// mapped under the host root.
    fn configmaps(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let k = Kubelet {
            host_root: self.host.clone(),
            shared: Vec::new(),
            host_ip: HOST_IP.into(),
            pod_dir: PathBuf::new(),
            configmaps: BTreeMap::new(),
        };
        configmaps(&self.docs)
            .into_iter()
            .map(|(name, data)| {
                let data = data
                    .into_iter()
                    .map(|(key, text)| match serde_json::from_str::<Value>(&text) {
                        Ok(v) => {
                            let v = k.map_paths(&default_event_files(&key, v));
                            (key, serde_json::to_string_pretty(&v).unwrap())
                        }
                        Err(_) => (key, text),
                    })
                    .collect();
                (name, data)
            })
            .collect()
    }

    /// Runs DaemonSet `ds`'s pod: the sandbox (host network), then each
    /// container in order, as the kubelet does. `pod` names its dir.
    fn run_daemonset(&mut self, ds: &str, pod: &str, with_configmaps: bool) -> DsPod {
        let template = kubelet::find(&self.docs, "DaemonSet", ds)["spec"]["template"].clone();
        let k = self.kubelet(pod, with_configmaps);
        let mut sandbox_config = Pod {
            host_network: template["spec"]["hostNetwork"] == true,
            ..Pod::new("podgate-system", pod)
        }
        .sandbox_config(self.c.cgroup_parent());
        let logs = k.pod_dir.join("logs");
        fs::create_dir_all(&logs).unwrap();
        sandbox_config.log_directory = logs.display().to_string();
        let sandbox = self
            .cri
            .run_sandbox(&sandbox_config)
            .unwrap_or_else(|e| panic!("RunPodSandbox {pod}: {e}\n{}", self.c.log()));
        let mut out = DsPod {
            sandbox,
            logs,
            containers: BTreeMap::new(),
            specs: BTreeMap::new(),
        };
        for c in template["spec"]["containers"].as_array().unwrap() {
            let name = c["name"].as_str().unwrap();
            let mut spec = k.container(&template, name);
            if spec.config.args.first().is_some_and(|a| a == "install") {
                // The ConfigMap's host paths are this node's, mapped under
                // its host root (`configmaps`): the installer is told that
                // root, as on a node laid out otherwise.
                spec.config
                    .args
                    .push(format!("--plugin-path-root={}", self.host.display()));
            }
            let id = self
                .cri
                .start_container(&out.sandbox, &sandbox_config, spec.config.clone())
                .unwrap_or_else(|e| panic!("{ds}/{name}: {e}\n{}", self.c.log()));
            out.containers.insert(name.into(), id);
            out.specs.insert(name.into(), spec);
        }
        out
    }

    /// What the operator's `kubectl delete pod` does: every container
    /// stopped (SIGTERM, grace period), then the sandbox.
    fn delete_daemonset_pod(&mut self, pod: DsPod) {
        for id in pod.containers.values() {
            self.cri.stop_container(id, 10);
        }
        self.cri.stop_and_remove(&pod.sandbox);
    }

    fn pid(&mut self, pod: &DsPod, container: &str) -> u32 {
        let id = &pod.containers[container];
        let (state, pid) = self.cri.container_state(id);
        assert_eq!(
            state,
            CONTAINER_RUNNING,
            "{container} is not running:\n{}",
            self.container_log(pod, container)
        );
        assert!(pid > 0);
        pid
    }

    fn container_log(&self, pod: &DsPod, container: &str) -> String {
        fs::read_to_string(pod.logs.join(format!("{container}.log"))).unwrap_or_default()
    }

    /// The readiness probe of `container`, run as the kubelet runs it
    /// (ExecSync), until it passes; its output.
    fn wait_ready(&mut self, pod: &DsPod, container: &str) -> String {
        let cmd = pod.specs[container]
            .readiness_exec()
            .expect("an exec readiness probe");
        let id = pod.containers[container].clone();
        let start = Instant::now();
        loop {
            let r = self.cri.exec(&id, &cmd, 5);
            if r.code == 0 {
                return r.stdout;
            }
            assert!(
                start.elapsed() < WAIT,
                "{container} not ready after {WAIT:?}: {r:?}\n{}",
                self.container_log(pod, container)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn host_file(&self, path: &str) -> PathBuf {
        self.host.join(path.trim_start_matches('/'))
    }

    /// Runs the intruder ([`intruder`]) in `container` of `pod` with
    /// `args`, as `kubectl exec` would (ExecSync: the container's user,
    /// capabilities, seccomp profile and mounts): one JSON value per
    /// attempt. The executable is put on the node in [`INTRUDER_DIR`].
    fn intrude(&mut self, pod: &DsPod, container: &str, args: &[&str]) -> Vec<Value> {
        let dir = self.host_file(INTRUDER_DIR);
        fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("pg-intruder");
        if !bin.exists() {
            fs::copy(intruder::binary(), &bin).unwrap();
        }
        let mut cmd = vec![format!("{INTRUDER_DIR}/pg-intruder")];
        cmd.extend(args.iter().map(|a| a.to_string()));
        let r = self.cri.exec(&pod.containers[container], &cmd, 120);
        assert_eq!(r.code, 0, "intruder {args:?} in {container}: {r:?}");
        r.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    }

    /// The intruder's one attempt.
    fn intrude_once(&mut self, pod: &DsPod, container: &str, args: &[&str]) -> Value {
        let mut out = self.intrude(pod, container, args);
        assert_eq!(out.len(), 1, "{out:?}");
        out.remove(0)
    }

    /// Sysctl `name` of the node's own netns.
    fn node_sysctl(&self, name: &str) -> String {
        podgate_integration::cri::sysctl_in(self.c.node().ns.path(), name)
    }

    /// podgate-config.yaml's plugins file, changed by `f` (the operator
    /// editing the ConfigMap before applying it).
    fn edit_plugins(&mut self, f: impl FnOnce(&mut Value)) {
        let cm = self
            .docs
            .iter_mut()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "podgate-plugins")
            .unwrap();
        let mut plugins: Value =
            serde_json::from_str(cm["data"]["plugins.json"].as_str().unwrap()).unwrap();
        f(&mut plugins);
        cm["data"]["plugins.json"] = Value::String(serde_json::to_string_pretty(&plugins).unwrap());
    }

    /// podgate-router's attachment records (`*.json` in its state dir)
    /// and its node-wide strict settings (`node/strict.json`).
    fn router_state(&self) -> Vec<String> {
        self.disk()
            .keys()
            .filter_map(|k| k.strip_prefix("var/lib/cni/podgate/"))
            .filter(|k| {
                (!k.contains('/') && !k.starts_with('.') && k.ends_with(".json"))
                    || *k == "node/strict.json"
            })
            .map(String::from)
            .collect()
    }

    /// The installer's process, on the node (for a signal).
    fn signal(&mut self, pod: &DsPod, container: &str, sig: i32) {
        let pid = self.pid(pod, container);
        // SAFETY: kill(2) on a pid of a running container of this test.
        assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
    }

    /// A pod of namespace `vpn` asking for the shipped `vpn-gateway` profile.
    fn vpn_pod(&mut self, name: &str) -> (String, PathBuf) {
        let pod = Pod {
            annotations: &[("podgate.dev/profile", "vpn-gateway")],
            ..Pod::new("vpn", name)
        };
        let id = self
            .cri
            .run_sandbox(&pod.sandbox_config(self.c.cgroup_parent()))
            .unwrap_or_else(|e| panic!("RunPodSandbox vpn/{name}: {e}\n{}", self.c.log()));
        let netns = self.cri.netns(&id);
        (id, netns)
    }

    fn delete_pod(&mut self, id: &str) {
        self.cri.stop_and_remove(id);
    }

    /// Files (with their bytes) under the node's CNI dirs and podgate's
    /// state dirs: what install and uninstall change on disk.
    fn disk(&self) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        for dir in [
            "opt/cni/bin",
            "etc/cni/net.d",
            "var/lib/cni/podgate",
            "var/lib/podgate",
        ] {
            collect_files(&self.host.join(dir), &self.host, &mut out);
        }
        out
    }
}

/// ptp + host-local over [`ROUTED_SUBNET`].
fn routed_conflist(node: &TestNode) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NET,
        "plugins": [{
            "type": "ptp", "ipMasq": false,
            "ipam": {"type": "host-local", "dataDir": node.ipam_dir(),
                     "ranges": [[{"subnet": ROUTED_SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]}
        }]
    })
}

/// The uplink [`UPLINK`] from the node to a fabric netns holding the
/// gateway; the node's early demux on (what strict routing turns off while
/// a strict pod exists).
fn fabric(node: &TestNode) -> Netns {
    let fabric = Netns::new_with_forwarding("fabric", true);
    node.ns.exec_ok(&[
        "ip",
        "link",
        "add",
        UPLINK,
        "type",
        "veth",
        "peer",
        "name",
        "fab0",
        "netns",
        fabric.name(),
    ]);
    node.ns
        .exec_ok(&["ip", "addr", "add", "192.0.2.1/24", "dev", UPLINK]);
    node.ns.exec_ok(&["ip", "link", "set", UPLINK, "up"]);
    fabric.exec_ok(&["ip", "addr", "add", &format!("{GATEWAY}/24"), "dev", "fab0"]);
    fabric.exec_ok(&["ip", "link", "set", "fab0", "up"]);
    fabric.exec_ok(&["ip", "route", "add", ROUTED_SUBNET, "via", "192.0.2.1"]);
    node.ns.sysctl_set("net.ipv4.tcp_early_demux", "1");
    node.ns.sysctl_set("net.ipv4.udp_early_demux", "1");
    fabric
}

fn collect_files(dir: &Path, base: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_files(&p, base, out);
        } else {
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            out.insert(rel, fs::read(&p).unwrap_or_default());
        }
    }
}

fn in_netns(netns: &Path, args: &[&str]) -> String {
    let out = podgate_integration::cri::in_netns(netns, args);
    assert!(out.status.success(), "{args:?}: {}", output_text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pod was wired by the shipped profile: forwarding on and podgate's
/// masquerade table in its netns.
fn assert_vpn_wired(netns: &Path) {
    assert_eq!(
        in_netns(netns, &["cat", "/proc/sys/net/ipv4/ip_forward"]).trim(),
        "1"
    );
    let nft = in_netns(netns, &["nft", "list", "table", "inet", "podgate-eth0"]);
    assert!(nft.contains("masquerade"), "{nft}");
    assert!(nft.contains("10.8.0.0/24"), "{nft}");
}

/// Effective and permitted capability sets of `pid`.
fn caps(pid: u32) -> (u64, u64) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} not in /proc/{pid}/status"));
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    (field("CapEff:"), field("CapPrm:"))
}

/// A mount of a process: (device, root within its filesystem, mount point,
/// read-write).
struct MountEntry {
    dev: String,
    root: PathBuf,
    point: PathBuf,
    rw: bool,
}

fn mounts(pid: &str) -> Vec<MountEntry> {
    fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            MountEntry {
                dev: f[2].into(),
                root: unescape_mountinfo(f[3]).into(),
                point: unescape_mountinfo(f[4]).into(),
                rw: f[5].split(',').any(|o| o == "rw"),
            }
        })
        .collect()
}

/// (device, path within its filesystem) of a host path, from this
/// process's mounts (the longest mount point above it).
fn fs_location(path: &Path) -> (String, PathBuf) {
    let path = path.canonicalize().unwrap();
    let m = mounts("self")
        .into_iter()
        .filter(|m| path.starts_with(&m.point))
        .max_by_key(|m| m.point.components().count())
        .unwrap();
    let rel = path.strip_prefix(&m.point).unwrap();
    (m.dev.clone(), m.root.join(rel))
}

/// The mounts of `pid` that give write access to `host_dir` (the dir
/// itself or a parent of it mounted read-write).
fn writable_mounts_of(pid: u32, host_dir: &Path) -> Vec<String> {
    let (dev, inner) = fs_location(host_dir);
    mounts(&pid.to_string())
        .into_iter()
        .filter(|m| m.rw && m.dev == dev && inner.starts_with(&m.root))
        .map(|m| format!("{} (root {})", m.point.display(), m.root.display()))
        .collect()
}

// ------------------------------------------------------------------- tests

/// Install from the image, pulled from a registry under the manifest's
/// name, with the manifest's pod template: unready until the ConfigMap
/// exists (saying so), then ready; the plugins in the host's bin dir are
/// the image's bytes; a VPN pod created afterwards gets forwarding and
/// masquerade; least privilege as seen in /proc.
#[test]
fn the_daemonset_from_the_manifest_installs_the_images_plugins_and_a_vpn_pod_is_wired_by_them() {
    let mut n = Node::start("ds-install");
    let commit = "0000000000000000000000000000000000000001";
    n.pull_through_registry(&image(&n.image, commit));

    // Applied before podgate-config.yaml: the optional ConfigMap volume is
    // an empty dir, the installer unready and saying why.
    let pod = n.run_daemonset("podgate", "podgate-node", false);
    let install = pod.containers["install"].clone();
    let probe = pod.specs["install"].readiness_exec().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let r = n.cri.exec(&install, &probe, 5);
    assert_ne!(r.code, 0, "ready without the ConfigMap: {r:?}");
    assert!(
        r.stderr
            .contains("plugins file /etc/podgate/plugins.json missing: apply podgate-config.yaml"),
        "{r:?}"
    );
    assert!(!n.host_file("/etc/cni/net.d/00-podgate.conflist").exists());

    // `kubectl apply -f podgate-config.yaml`: the kubelet fills the volume.
    let template = kubelet::find(&n.docs, "DaemonSet", "podgate")["spec"]["template"].clone();
    n.kubelet("podgate-node", true)
        .sync_configmap_volumes(&template);
    let out = n.wait_ready(&pod, "install");
    assert!(out.contains("chained: 00-podgate.conflist"), "{out}");

    // The image's podgate names the commit it was built from.
    let version = n.cri.exec(
        &install,
        &["/usr/local/bin/podgate".into(), "--version".into()],
        5,
    );
    assert!(version.stdout.contains(commit), "{version:?}");

    // The host's CNI dirs: the image's plugins, podgate's conflist.
    let install_pid = n.pid(&pod, "install");
    for bin in ["podgate-router", "podgate-tunnel-guard"] {
        let installed = fs::read(n.host_file(&format!("/opt/cni/bin/{bin}"))).unwrap();
        let in_image = fs::read(format!("/proc/{install_pid}/root/usr/local/bin/{bin}")).unwrap();
        assert!(
            installed == in_image,
            "{bin} on the host is not the image's"
        );
    }
    let conflist: Value = serde_json::from_slice(
        &fs::read(n.host_file("/etc/cni/net.d/00-podgate.conflist")).unwrap(),
    )
    .unwrap();
    let types: Vec<&str> = conflist["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["bridge", "podgate-tunnel-guard", "podgate-router"]);

    // A VPN pod afterwards, through the same containerd.
    let (vpn, netns) = n.vpn_pod("openvpn-0");
    assert_vpn_wired(&netns);
    let log = fs::read_to_string(n.host_file("/var/log/podgate/router.log")).unwrap();
    assert!(log.contains("openvpn-0") || log.contains(&vpn), "{log}");

    // The agent: metrics on the node's own address, /healthz for its
    // liveness probe (httpGet, as the kubelet sends it).
    let agent_pid = n.pid(&pod, "agent");
    let (status, body) = http_get(&n.c.node().ns, HOST_IP, 9750, "/healthz", WAIT).unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = http_get(&n.c.node().ns, HOST_IP, 9750, "/metrics", WAIT).unwrap();
    assert_eq!(status, 200, "{body}");

    // Least privilege, from /proc of the running containers.
    assert_eq!(caps(install_pid), (0, 0), "the installer has capabilities");
    let (eff, _) = caps(agent_pid);
    assert_ne!(eff, 0, "the agent runs without its capabilities");
    // The dirs whose writer is node-root: the runtime runs the binaries and
    // loads the conflists; the installer's records say which conflist to
    // write with what.
    let node_root_dirs = [
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/var/lib/podgate/installer",
    ];
    for dir in node_root_dirs {
        let host_dir = n.host_file(dir);
        assert!(
            !writable_mounts_of(install_pid, &host_dir).is_empty(),
            "the installer cannot write {dir}"
        );
        let w = writable_mounts_of(agent_pid, &host_dir);
        assert!(w.is_empty(), "the agent can write {dir}: {w:?}");
    }
    for (name, spec) in &pod.specs {
        let pid = n.pid(&pod, name);
        if caps(pid).0 != 0 {
            assert!(spec.adds_capabilities(), "{name}");
            for dir in node_root_dirs {
                let w = writable_mounts_of(pid, &n.host_file(dir));
                assert!(
                    w.is_empty(),
                    "{name} has capabilities and writes {dir}: {w:?}"
                );
            }
        }
    }
    // The machine's own forwarding untouched.
    assert_eq!(
        fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .unwrap()
            .trim(),
        "0"
    );
    n.delete_pod(&vpn);
    n.delete_daemonset_pod(pod);
}

/// Upgrade (stop the old pod, start the new image's) with a pod created in
/// between, the new binaries deleting a pod the old ones set up; then the
/// uninstall DaemonSet with a pod still running: after the pods' deletion
/// the node is as before the install.
#[test]
fn upgrade_then_uninstall_leave_the_node_as_it_was_before_the_install() {
    let mut n = Node::start("ds-upgrade");
    let old = image(&n.image, "0000000000000000000000000000000000000001");
    let new = image(&n.image, "0000000000000000000000000000000000000002");
    let before_net: Snapshot = n.c.node().settled_snapshot();
    let before_disk = n.disk();

    n.c.import(&old);
    let v1 = n.run_daemonset("podgate", "podgate-v1", true);
    n.wait_ready(&v1, "install");
    let v1_pid = n.pid(&v1, "install");
    let v1_bins: Vec<Vec<u8>> = ["podgate", "podgate-router", "podgate-tunnel-guard"]
        .iter()
        .map(|b| fs::read(format!("/proc/{v1_pid}/root/usr/local/bin/{b}")).unwrap())
        .collect();
    let (a, a_ns) = n.vpn_pod("a");
    assert_vpn_wired(&a_ns);

    // The rolling update: the old pod goes, a pod is created, the new
    // image's pod comes.
    n.delete_daemonset_pod(v1);
    let (b, b_ns) = n.vpn_pod("b");
    assert_vpn_wired(&b_ns);
    n.c.import(&new);
    let v2 = n.run_daemonset("podgate", "podgate-v2", true);
    n.wait_ready(&v2, "install");
    let v2_pid = n.pid(&v2, "install");
    // Every binary of the new image differs from the old one's (each names
    // the commit it was built from), and the plugins on the host are the new
    // image's: a plugin run without CNI_COMMAND says which build it is.
    for (bin, old_bytes) in ["podgate", "podgate-router", "podgate-tunnel-guard"]
        .iter()
        .zip(&v1_bins)
    {
        let in_image = fs::read(format!("/proc/{v2_pid}/root/usr/local/bin/{bin}")).unwrap();
        assert!(&in_image != old_bytes, "the two images' {bin} are the same");
        if *bin == "podgate" {
            continue;
        }
        let host_path = n.host_file(&format!("/opt/cni/bin/{bin}"));
        let installed = fs::read(&host_path).unwrap();
        assert!(
            installed == in_image,
            "{bin} on the host is not the new image's"
        );
        let about = std::process::Command::new(&host_path)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let about = String::from_utf8_lossy(&about.stderr);
        assert!(
            about.contains("commit 0000000000000000000000000000000000000002"),
            "{bin} on the host does not name the new commit: {about}"
        );
    }
    // The new binaries DEL what the old ones set up.
    n.delete_pod(&a);
    // podgate-router's attachment records: `*.json` in its state dir.
    let records = |n: &Node| -> Vec<String> {
        n.disk()
            .keys()
            .filter_map(|k| k.strip_prefix("var/lib/cni/podgate/"))
            .filter(|k| !k.contains('/') && !k.starts_with('.') && k.ends_with(".json"))
            .map(String::from)
            .collect()
    };
    let left = records(&n);
    assert!(
        left.iter().all(|r| !r.contains(&a)),
        "a's record is left after its DEL: {left:?}"
    );
    let (c, c_ns) = n.vpn_pod("c");
    assert_vpn_wired(&c_ns);

    // Uninstall: podgate's pod deleted, podgate-uninstall.yaml applied.
    n.delete_daemonset_pod(v2);
    let un = n.run_daemonset("podgate-uninstall", "podgate-uninstall", false);
    let out = n.wait_ready(&un, "uninstall");
    assert!(out.contains("uninstalled"), "{out}");
    assert!(!n.host_file("/etc/cni/net.d/00-podgate.conflist").exists());
    assert!(!n.host_file("/opt/cni/bin/podgate-router").exists());
    // A pod still running keeps what podgate applied in its netns.
    assert_vpn_wired(&c_ns);
    // Its DEL no longer reaches podgate; the agent's sweep removes its
    // record once its netns is gone.
    n.delete_pod(&b);
    n.delete_pod(&c);
    let start = Instant::now();
    while !records(&n).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "records left: {:?}\n{}",
            records(&n),
            n.container_log(&un, "agent")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Deleting the uninstall DaemonSet: its uninstall container empties
    // podgate's state dir on SIGTERM, no record being left.
    let un_logs = un.logs.clone();
    n.delete_daemonset_pod(un);
    let log = fs::read_to_string(un_logs.join("uninstall.log")).unwrap_or_default();
    assert!(log.contains("emptied /var/lib/cni/podgate"), "{log}");

    let after_net = n.c.node().settled_snapshot();
    // The bridge stays (the primary's plugin never deletes it), as on a
    // real node.
    let strip = |s: &Snapshot| {
        let mut s = s.clone();
        s.links.retain(|l| !l.starts_with("pgbr"));
        s.addrs.retain(|a| !a.starts_with("pgbr"));
        s.routes4.retain(|r| !r.contains("\"dev\":\"pgbr"));
        s.routes6.retain(|r| !r.contains("\"dev\":\"pgbr"));
        s
    };
    podgate_integration::assert_same(&strip(&before_net), &strip(&after_net));
    let after_disk = n.disk();
    let names = |d: &BTreeMap<String, Vec<u8>>| d.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&before_disk), names(&after_disk));
    assert!(before_disk == after_disk, "a file's content differs");
}

// ------------------------------------------- the privilege split, attacked
//
// Each test runs the intruder (examples/intruder.rs) inside the running
// agent container, standing in for an attacker who took the agent over (it
// parses what pods send and serves a port they reach).

const COMMIT: &str = "0000000000000000000000000000000000000001";

/// A node with podgate's DaemonSet (its ConfigMap applied) running, ready.
fn podgate_running(prefix: &str) -> (Node, DsPod) {
    let mut n = Node::start(prefix);
    n.c.import(&image(&n.image, COMMIT));
    let pod = n.run_daemonset("podgate", "podgate-node", true);
    n.wait_ready(&pod, "install");
    (n, pod)
}

/// Waits until `f` holds; panics with `what` (and `more()`) after `limit`.
fn wait_for(limit: Duration, what: &str, mut f: impl FnMut() -> bool, more: impl Fn() -> String) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "{what} after {limit:?}\n{}",
            more()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The agent forges the installer's records (a `.conf` "given back" with
/// its bytes, a name leaving the conf dir for the CNI bin dir) and the
/// runtime's history, where earlier releases kept them (the agent's own
/// state dir) and where the installer keeps them. The installer writes
/// none of it, neither on its next pass nor after a restart (which takes
/// what can be trusted of earlier releases' records); the agent cannot
/// write the installer's state dir at all.
#[test]
fn forged_installer_records_and_history_from_the_agent_write_nothing() {
    let (mut n, pod) = podgate_running("ds-forge");

    let evil = r#"{"cniVersion": "1.0.0", "name": "evil", "type": "bridge", "bridge": "evil0"}"#;
    let records = [
        (
            "00-evil.conflist",
            json!({"file": "00-evil.conflist", "written": "", "original": evil,
                   "convertedFrom": "00-evil.conf"}),
        ),
        (
            "10-x.conflist",
            json!({"file": "10-x.conflist", "written": "", "original": evil,
                   "convertedFrom": "../../../opt/cni/bin/pg-forged.conf"}),
        ),
    ];
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let history = json!({"version": 1, "bootId": boot_id.trim(), "firstLoaded": 1,
        "missing": [{"lastSeenLoaded": 2, "firstSeenMissing": 3, "seenLoadedAgain": null}]})
    .to_string();
    let mut planted = Vec::new();
    for dir in [
        "/var/lib/cni/podgate/installer",
        "/var/lib/podgate/installer",
    ] {
        for (key, rec) in &records {
            let path = format!("{dir}/{key}.podgate-backup");
            let r = n.intrude_once(&pod, "agent", &["write", &path, &rec.to_string()]);
            planted.push((path, r));
        }
        let path = format!("{dir}/runtime-chain.json");
        let r = n.intrude_once(&pod, "agent", &["write", &path, &history]);
        planted.push((path, r));
    }
    eprintln!("planted from the agent: {planted:#?}");
    for (path, r) in &planted {
        if path.starts_with("/var/lib/podgate/") {
            assert_eq!(r["ok"], false, "the agent wrote the installer's {path}");
        }
    }

    // A pass now (SIGHUP: re-check), then the pod replaced (a restart takes
    // earlier releases' records).
    let install_log = |n: &Node, p: &DsPod| n.container_log(p, "install");
    let forged = ["/etc/cni/net.d/00-evil.conf", "/opt/cni/bin/pg-forged.conf"];
    let assert_not_written = |n: &Node, logs: &str| {
        for f in forged {
            assert!(
                !n.host_file(f).exists(),
                "the installer wrote the agent's forged {f}:\n{logs}"
            );
        }
    };
    n.signal(&pod, "install", libc::SIGHUP);
    std::thread::sleep(Duration::from_secs(3));
    let first_log = install_log(&n, &pod);
    assert_not_written(&n, &first_log);
    n.delete_daemonset_pod(pod);
    let pod = n.run_daemonset("podgate", "podgate-node-2", true);
    n.wait_ready(&pod, "install");
    std::thread::sleep(Duration::from_secs(2));
    let logs = format!("{first_log}\n{}", install_log(&n, &pod));
    assert_not_written(&n, &logs);
    let mut conf: Vec<String> = fs::read_dir(n.host_file("/etc/cni/net.d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    conf.sort();
    assert_eq!(
        conf,
        ["00-podgate.conflist", "10-podnet.conflist"],
        "{logs}"
    );
    let kept = fs::read_to_string(n.host_file("/var/lib/podgate/installer/runtime-chain.json"))
        .unwrap_or_default();
    assert!(
        !kept.contains("\"firstSeenMissing\": 3") && kept.contains("firstLoaded"),
        "the installer's history is not its own: {kept}"
    );
    assert!(
        logs.contains("not taking the record of 00-evil.conflist")
            && logs.contains("not taking the record of 10-x.conflist"),
        "{logs}"
    );
    n.delete_daemonset_pod(pod);
}

/// From the agent, every socket it can see is asked for a privileged
/// sandbox and a privileged container with the node's `/` (what a
/// compromised agent would do with the runtime's socket): none is given.
/// Through the cri-proxy the agent still reads the runtime's sandboxes.
#[test]
fn the_agent_gets_no_sandbox_from_any_socket_and_reads_through_the_proxy() {
    let (mut n, pod) = podgate_running("ds-cri");
    let cgroup = n.c.cgroup_parent().to_string();
    let rows = n.intrude(&pod, "agent", &["cri", &cgroup, PAUSE_IMAGE]);
    eprintln!("the agent's attempts: {rows:#?}");
    // What an attempt got is removed before judging.
    for r in &rows {
        if let Some(id) = r["runPodSandbox"]["id"].as_str() {
            n.cri.stop_and_remove(id);
        }
    }
    let got: Vec<&Value> = rows
        .iter()
        .filter(|r| r["runPodSandbox"]["ok"] == true)
        .collect();
    assert!(
        got.is_empty(),
        "the agent got sandboxes from the runtime: {got:#?}"
    );
    let proxy = rows
        .iter()
        .find(|r| r["socket"] == "/run/podgate-cri/cri.sock")
        .unwrap_or_else(|| panic!("the agent sees no cri-proxy socket: {rows:#?}"));
    assert_eq!(proxy["list"]["ok"], true, "{proxy}");
    assert!(
        proxy["runPodSandbox"]["error"].as_str().is_some_and(
            |e| e.contains("does not forward /runtime.v1.RuntimeService/RunPodSandbox")
        ),
        "{proxy}"
    );
    n.delete_daemonset_pod(pod);
}

/// What conf/kubernetes/README.md says of the agent's SYS_ADMIN: on a node
/// without an LSM confining `mount` (this machine has no AppArmor), the
/// RuntimeDefault seccomp profile lets it remount a read-only mount
/// read-write, here the CNI conf dir, and write the node's file through it;
/// where AppArmor confines containers, the remount is refused.
#[test]
fn the_agents_read_only_mounts_hold_only_as_far_as_the_lsm() {
    let (mut n, pod) = podgate_running("ds-remount");
    let before = n.intrude_once(
        &pod,
        "agent",
        &["write", "/etc/cni/net.d/99-remounted.conflist", "{}"],
    );
    assert_eq!(
        before["ok"], false,
        "the conf dir is writable before: {before}"
    );
    let remount = n.intrude_once(&pod, "agent", &["remount", "/etc/cni/net.d", "rw"]);
    let write = n.intrude_once(
        &pod,
        "agent",
        &["write", "/etc/cni/net.d/99-remounted.conflist", "{}"],
    );
    let landed = n.host_file("/etc/cni/net.d/99-remounted.conflist");
    let wrote = landed.exists();
    let _ = fs::remove_file(&landed);
    n.intrude_once(&pod, "agent", &["remount", "/etc/cni/net.d", "ro"]);
    let apparmor = fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y");
    if apparmor {
        assert!(
            remount["ok"] == false && !wrote,
            "AppArmor let the agent remount: {remount} {write}"
        );
    } else {
        assert!(
            remount["ok"] == true && wrote,
            "without an LSM the agent could not remount, as the README says it can: {remount} {write}"
        );
    }
    n.delete_daemonset_pod(pod);
}

/// A VPN pod that started before podgate was on the node is adopted: its
/// forwarding is written inside its own netns, through the sysctl broker.
/// From the agent, the node's own knobs cannot be written by any way it
/// has: its /proc/sys (read-only), a writable mount of the node's
/// /proc/sys/net (none), the broker (it refuses the node's namespace but
/// for podgate-router's node settings). The node here is a netns of its
/// own, where the kernel keeps `net.core.rmem_max` read-only and
/// `bpf_jit_*` absent (only the initial netns, a real node's, has them
/// writable): the node's forwarding, `somaxconn` and `optmem_max` stand for
/// every knob of the node's namespace (the attempts on `rmem_max` and
/// `bpf_jit_harden` are made too).
#[test]
fn adoption_writes_a_pods_sysctls_and_the_agent_no_node_knob() {
    let mut n = Node::start("ds-sysctl");
    n.c.import(&image(&n.image, COMMIT));
    let (vpn, netns) = n.vpn_pod("openvpn-0");
    let forwarding =
        |netns: &Path| podgate_integration::cri::sysctl_in(netns, "net.ipv4.ip_forward");
    assert_eq!(forwarding(&netns), "0");
    let pod = n.run_daemonset("podgate", "podgate-node", true);
    n.wait_ready(&pod, "install");
    wait_for(
        Duration::from_secs(90),
        "the VPN pod started before podgate is not adopted",
        || forwarding(&netns) == "1",
        || n.container_log(&pod, "agent") + &n.container_log(&pod, "sysctl-broker"),
    );
    assert_vpn_wired(&netns);

    let knobs = [
        "net.ipv4.ip_forward",
        "net.core.somaxconn",
        "net.core.optmem_max",
        "net.core.rmem_max",
    ];
    let before: Vec<String> = knobs.iter().map(|k| n.node_sysctl(k)).collect();
    let broker = "/run/podgate-sysctl/broker.sock";
    let mut results = Vec::new();
    for (knob, value) in knobs.iter().zip(&before) {
        let other = match value.as_str() {
            "1" => "0".to_string(),
            v => (v.parse::<u64>().unwrap() + 1).to_string(),
        };
        let path = knob.replace('.', "/");
        let own = format!("/proc/sys/{path}");
        let host = format!("/host/proc/sys/{path}");
        let attempts: [&[&str]; 3] = [
            &["write", &own, &other],
            &["write", &host, &other],
            &["broker", broker, knob, &other],
        ];
        for a in attempts {
            results.push((a.join(" "), n.intrude_once(&pod, "agent", a)));
        }
    }
    let attempts: [&[&str]; 3] = [
        &["write", "/host/proc/sys/net/core/bpf_jit_harden", "0"],
        &["broker", broker, "net.core.bpf_jit_harden", "0"],
        &["broker", broker, "net.ipv4.conf.all.rp_filter", "0"],
    ];
    for a in attempts {
        results.push((a.join(" "), n.intrude_once(&pod, "agent", a)));
    }
    eprintln!("the agent's attempts on the node's knobs: {results:#?}");
    let after: Vec<String> = knobs.iter().map(|k| n.node_sysctl(k)).collect();
    let wrote: Vec<&(String, Value)> = results.iter().filter(|(_, r)| r["ok"] != false).collect();
    assert!(
        wrote.is_empty(),
        "the agent wrote the node's knobs: {wrote:#?}"
    );
    assert_eq!(after, before, "the node's {knobs:?} changed");
    n.delete_pod(&vpn);
    n.delete_daemonset_pod(pod);
}

/// podgate-uninstall.yaml with a strict pod still running: once the pod is
/// gone, the agent's sweep removes its record and puts the node's strict
/// settings back (through the sysctl broker), and deleting the uninstall
/// DaemonSet empties podgate's state dirs.
#[test]
fn uninstall_with_a_strict_pod_alive_restores_the_node_and_empties_the_state_dirs() {
    let mut n = Node::start_with("ds-strict", Primary::Routed);
    n.edit_plugins(|plugins| {
        let router = plugins
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|p| p["type"] == "podgate-router")
            .unwrap();
        router["profiles"]["protected-strict"] =
            json!({"routing": {"mode": "strict", "uplink": UPLINK, "gateway": GATEWAY}});
        router["assign"] = json!([{"podNamePrefix": "s-strict", "profile": "protected-strict"}]);
    });
    n.c.import(&image(&n.image, COMMIT));
    let node_settings = [
        "net.ipv4.tcp_early_demux".to_string(),
        "net.ipv4.udp_early_demux".to_string(),
        format!("net.ipv4.conf.{UPLINK}.accept_local"),
        format!("net.ipv4.conf.{UPLINK}.rp_filter"),
    ];
    let settings =
        |n: &Node| -> Vec<String> { node_settings.iter().map(|s| n.node_sysctl(s)).collect() };
    let before = settings(&n);

    let pod = n.run_daemonset("podgate", "podgate-node", true);
    n.wait_ready(&pod, "install");
    let strict = n
        .cri
        .run_sandbox(&Pod::new("default", "s-strict-0").sandbox_config(n.c.cgroup_parent()))
        .unwrap_or_else(|e| panic!("RunPodSandbox s-strict-0: {e}\n{}", n.c.log()));
    assert_eq!(n.node_sysctl("net.ipv4.tcp_early_demux"), "0", "not strict");
    assert!(n.router_state().contains(&"node/strict.json".to_string()));

    n.delete_daemonset_pod(pod);
    let un = n.run_daemonset("podgate-uninstall", "podgate-uninstall", false);
    n.wait_ready(&un, "uninstall");
    assert_eq!(
        n.node_sysctl("net.ipv4.tcp_early_demux"),
        "0",
        "the pod still runs"
    );
    n.delete_pod(&strict);
    wait_for(
        Duration::from_secs(60),
        "the strict pod's record and the node's strict settings are left",
        || n.router_state().is_empty(),
        || format!("{:?}\n{}", n.router_state(), n.container_log(&un, "agent")),
    );
    assert_eq!(
        settings(&n),
        before,
        "the node's strict settings not put back"
    );

    let logs = un.logs.clone();
    n.delete_daemonset_pod(un);
    let log = fs::read_to_string(logs.join("uninstall.log")).unwrap_or_default();
    assert!(log.contains("emptied /var/lib/cni/podgate"), "{log}");
    let left: Vec<String> = n
        .disk()
        .keys()
        .filter(|k| k.starts_with("var/lib/"))
        .cloned()
        .collect();
    assert!(left.is_empty(), "podgate's state left: {left:?}\n{log}");
}
