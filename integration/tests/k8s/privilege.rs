//! The privilege split of podgate's DaemonSet, attacked on the cluster:
//! the intruder (`examples/intruder.rs`, built static by
//! `podgate_integration::intruder`) is put in the node's `/var/log/podgate`,
//! which the agent container mounts read-only and not `noexec`, and run in
//! the running agent container with `kubectl exec`, standing in for an
//! attacker who took the agent over (it parses what pods send and serves a
//! port they reach). Each attempt is judged from the node: what landed on
//! its disk, its sysctls, its runtime's sandboxes. And the split as the
//! runtime set it up: capabilities and writable mounts, from `/proc` of the
//! containers' processes (the nodes share this machine's PID namespace).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use podgate_integration::containerd::unescape_mountinfo;
use podgate_integration::cri::{in_netns, sysctl_in};
use podgate_integration::k8s::Cluster;
use podgate_integration::{intruder, output_text};
use serde_json::{json, Value};

use crate::install::ensure_installed;
use crate::nodes::{container_pids, node_of, pod_netns, podgate_pod, sandbox_info};
use crate::policy::{namespace_yaml, pod_yaml};
use crate::world::{test_image, World};

const NS: &str = "podgate-system";
/// Where the intruder is put on a node: the plugins' log dir, which the
/// agent mounts (read-only, not `noexec`).
const INTRUDER_DIR: &str = "/var/log/podgate";
/// The node the attacks other than the adoption's run on.
const NODE: &str = "node-1";

/// The intruder in the agent container of `node`'s podgate pod.
struct Intruder<'a> {
    c: &'a Cluster,
    node: &'a str,
    pod: String,
}

impl<'a> Intruder<'a> {
    /// Puts the executable on `node`.
    fn on(c: &'a Cluster, node: &'a str) -> Intruder<'a> {
        let dir = c.host_path(node, INTRUDER_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(intruder::binary(), dir.join("pg-intruder")).unwrap();
        Intruder {
            c,
            node,
            pod: podgate_pod(c, node),
        }
    }

    /// One run (`kubectl exec` in the agent container: its user,
    /// capabilities, seccomp profile and mounts): one JSON value per
    /// attempt.
    fn run(&self, args: &[&str]) -> Vec<Value> {
        let bin = format!("{INTRUDER_DIR}/pg-intruder");
        let mut full = vec!["-n", NS, "exec", &self.pod, "-c", "agent", "--", &bin];
        full.extend_from_slice(args);
        let out = self.c.kubectl(&full);
        assert!(
            out.status.success(),
            "intruder {args:?} on {}:\n{}",
            self.node,
            output_text(&out)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    }

    /// The intruder's one attempt.
    fn once(&self, args: &[&str]) -> Value {
        let mut out = self.run(args);
        assert_eq!(out.len(), 1, "{out:?}");
        out.remove(0)
    }
}

impl Drop for Intruder<'_> {
    fn drop(&mut self) {
        let bin = self
            .c
            .host_path(self.node, &format!("{INTRUDER_DIR}/pg-intruder"));
        let _ = std::fs::remove_file(bin);
    }
}

/// Sysctl `name` of `node`'s own netns.
fn node_sysctl(node: &str, name: &str) -> String {
    sysctl_in(&Cluster::netns_path(node), name)
}

fn in_pod(netns: &Path, args: &[&str]) -> String {
    let out = in_netns(netns, args);
    assert!(out.status.success(), "{args:?}: {}", output_text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pod was wired by the shipped `vpn-gateway` profile: forwarding on
/// and podgate's masquerade table in its netns.
pub fn assert_vpn_wired(netns: &Path) {
    assert_eq!(
        in_pod(netns, &["cat", "/proc/sys/net/ipv4/ip_forward"]).trim(),
        "1"
    );
    let nft = in_pod(netns, &["nft", "list", "table", "inet", "podgate-eth0"]);
    assert!(nft.contains("masquerade"), "{nft}");
    assert!(nft.contains("10.8.0.0/24"), "{nft}");
}

/// A VPN pod that started before podgate was on the node is adopted: its
/// forwarding and masquerade are written inside its own netns, through the
/// sysctl broker. From the agent, the node's own knobs cannot be written by
/// any way it has: its /proc/sys (read-only), a writable mount of the
/// node's /proc/sys/net (none), the broker (it refuses the node's namespace
/// but for podgate-router's node settings). A node here is a netns of its
/// own, where the kernel keeps `net.core.rmem_max` read-only and
/// `bpf_jit_*` absent (only the initial netns, a real node's, has them
/// writable): the node's forwarding, `somaxconn` and `optmem_max` stand for
/// every knob of the node's namespace (the attempts on `rmem_max` and
/// `bpf_jit_harden` are made too).
pub fn adoption_writes_a_pods_sysctls_and_the_agent_no_node_knob(world: &mut World) {
    if world.installed {
        world.finish();
    }
    world.cluster().load_image(&test_image("greeter"));
    let c = world.cluster();
    c.apply(&namespace_yaml("vpn"));
    c.apply(&pod_yaml(
        "vpn",
        "early-gw",
        &[("podgate.dev/profile", "vpn-gateway")],
        false,
    ));
    c.wait_pod_ready("vpn", "early-gw");
    let netns = pod_netns(c, "vpn", "early-gw");
    assert_eq!(
        sysctl_in(&netns, "net.ipv4.ip_forward"),
        "0",
        "forwarding before podgate"
    );
    ensure_installed(world);
    let c = world.cluster();
    c.wait(
        "the VPN pod started before podgate adopted (forwarding on)",
        120,
        || (sysctl_in(&netns, "net.ipv4.ip_forward") == "1").then_some(()),
    );
    assert_vpn_wired(&netns);

    let node = node_of(c, "vpn", "early-gw");
    let intruder = Intruder::on(c, &node);
    let knobs = [
        "net.ipv4.ip_forward",
        "net.core.somaxconn",
        "net.core.optmem_max",
        "net.core.rmem_max",
    ];
    let before: Vec<String> = knobs.iter().map(|k| node_sysctl(&node, k)).collect();
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
            results.push((a.join(" "), intruder.once(a)));
        }
    }
    let attempts: [&[&str]; 3] = [
        &["write", "/host/proc/sys/net/core/bpf_jit_harden", "0"],
        &["broker", broker, "net.core.bpf_jit_harden", "0"],
        &["broker", broker, "net.ipv4.conf.all.rp_filter", "0"],
    ];
    for a in attempts {
        results.push((a.join(" "), intruder.once(a)));
    }
    eprintln!("the agent's attempts on {node}'s knobs: {results:#?}");
    let after: Vec<String> = knobs.iter().map(|k| node_sysctl(&node, k)).collect();
    let wrote: Vec<&(String, Value)> = results.iter().filter(|(_, r)| r["ok"] != false).collect();
    assert!(
        wrote.is_empty(),
        "the agent wrote {node}'s knobs: {wrote:#?}"
    );
    assert_eq!(after, before, "{node}'s {knobs:?} changed");
    drop(intruder);
    c.kubectl_ok(&[
        "delete",
        "namespace",
        "vpn",
        "--wait=true",
        "--timeout=180s",
    ]);
}

/// The file names in `node`'s CNI conf dir.
fn conf_dir(c: &Cluster, node: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(c.host_path(node, "/etc/cni/net.d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn install_log(c: &Cluster, pod: &str) -> String {
    c.kubectl_ok(&["-n", NS, "logs", pod, "-c", "install"])
}

/// The agent forges the installer's records (a `.conf` "given back" with
/// its bytes, a name leaving the conf dir for the CNI bin dir) and the
/// runtime's history, where earlier releases kept them (the agent's own
/// state dir) and where the installer keeps them. The installer writes
/// none of it, neither on its next pass nor after its pod is replaced
/// (which takes what can be trusted of earlier releases' records); the
/// agent cannot write the installer's state dir at all.
pub fn forged_installer_records_and_history_from_the_agent_write_nothing(world: &mut World) {
    ensure_installed(world);
    let c = world.cluster();
    let conf_before = conf_dir(c, NODE);
    let intruder = Intruder::on(c, NODE);
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
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let history = json!({"version": 1, "bootId": boot_id.trim(), "firstLoaded": 1,
        "missing": [{"lastSeenLoaded": 2, "firstSeenMissing": 3, "seenLoadedAgain": null}]})
    .to_string();
    let legacy = "/var/lib/cni/podgate/installer";
    let mut planted = Vec::new();
    for dir in [legacy, "/var/lib/podgate/installer"] {
        for (key, rec) in &records {
            let path = format!("{dir}/{key}.podgate-backup");
            let r = intruder.once(&["write", &path, &rec.to_string()]);
            planted.push((path, r));
        }
        let path = format!("{dir}/runtime-chain.json");
        let r = intruder.once(&["write", &path, &history]);
        planted.push((path, r));
    }
    drop(intruder);
    eprintln!("planted from the agent: {planted:#?}");
    for (path, r) in &planted {
        if path.starts_with("/var/lib/podgate/") {
            assert_eq!(r["ok"], false, "the agent wrote the installer's {path}");
        }
    }

    let forged = ["/etc/cni/net.d/00-evil.conf", "/opt/cni/bin/pg-forged.conf"];
    let assert_not_written = |logs: &str| {
        for f in forged {
            assert!(
                !c.host_path(NODE, f).exists(),
                "the installer wrote the agent's forged {f}:\n{logs}"
            );
        }
    };
    // A pass now (SIGHUP: re-check), then the pod replaced (a restart takes
    // earlier releases' records).
    let pod = podgate_pod(c, NODE);
    let pid = container_pids(c, NS, pod.trim_start_matches("pod/"))["install"];
    let hup = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .output()
        .unwrap();
    assert!(hup.status.success(), "{}", output_text(&hup));
    std::thread::sleep(std::time::Duration::from_secs(3));
    let first_log = install_log(c, &pod);
    assert_not_written(&first_log);
    c.kubectl_ok(&["-n", NS, "delete", &pod, "--wait=true"]);
    let new_pod = c.wait("the podgate pod on node-1 replaced", 120, || {
        let p = podgate_pod(c, NODE);
        (!p.is_empty() && p != pod).then_some(p)
    });
    c.wait_pod_ready(NS, new_pod.trim_start_matches("pod/"));
    std::thread::sleep(std::time::Duration::from_secs(2));
    let logs = format!("{first_log}\n{}", install_log(c, &new_pod));
    assert_not_written(&logs);
    assert_eq!(conf_dir(c, NODE), conf_before, "{logs}");
    let kept =
        std::fs::read_to_string(c.host_path(NODE, "/var/lib/podgate/installer/runtime-chain.json"))
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
    for (key, _) in &records {
        let _ = std::fs::remove_file(c.host_path(NODE, &format!("{legacy}/{key}.podgate-backup")));
    }
    let _ = std::fs::remove_file(c.host_path(NODE, &format!("{legacy}/runtime-chain.json")));
}

/// From the agent, every socket it can see is asked for a privileged
/// sandbox in the node's namespaces and a privileged container in it (what
/// a compromised agent would do with the runtime's socket: node root):
/// none is given.
/// Through the cri-proxy the agent still reads the runtime's sandboxes.
pub fn the_agent_gets_no_sandbox_from_any_socket_and_reads_through_the_proxy(world: &mut World) {
    ensure_installed(world);
    let c = world.cluster();
    let pod = podgate_pod(c, NODE);
    let info = sandbox_info(c, NS, pod.trim_start_matches("pod/"));
    let cgroup = info["config"]["linux"]["cgroup_parent"]
        .as_str()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| panic!("no cgroup parent in crictl inspectp:\n{info:#}"))
        .to_string();
    let image = "localhost/podgate/pause:3.10";
    let intruder = Intruder::on(c, NODE);
    let rows = intruder.run(&["cri", &cgroup, image]);
    drop(intruder);
    eprintln!("the agent's attempts: {rows:#?}");
    // What an attempt got is removed before judging.
    for r in &rows {
        if let Some(id) = r["runPodSandbox"]["id"].as_str() {
            let _ = c.node_sh(NODE, &format!("crictl stopp {id}; crictl rmp -f {id}"));
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
}

/// What conf/kubernetes/README.md says of the agent's SYS_ADMIN: on a node
/// without an LSM confining `mount` (this machine has no AppArmor), the
/// RuntimeDefault seccomp profile lets it remount a read-only mount
/// read-write, here the CNI conf dir, and write the node's file through it;
/// where AppArmor confines containers, the remount is refused.
pub fn the_agents_read_only_mounts_hold_only_as_far_as_the_lsm(world: &mut World) {
    ensure_installed(world);
    let c = world.cluster();
    let intruder = Intruder::on(c, NODE);
    let file = "/etc/cni/net.d/99-remounted.conflist";
    let before = intruder.once(&["write", file, "{}"]);
    assert_eq!(
        before["ok"], false,
        "the conf dir is writable before: {before}"
    );
    let remount = intruder.once(&["remount", "/etc/cni/net.d", "rw"]);
    let write = intruder.once(&["write", file, "{}"]);
    let landed = c.host_path(NODE, file);
    let wrote = landed.exists();
    let _ = std::fs::remove_file(&landed);
    intruder.once(&["remount", "/etc/cni/net.d", "ro"]);
    let apparmor = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
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
}

/// The split as the runtime set it up on a node, from `/proc` of the
/// podgate pod's running containers: the installer has no capability, the
/// agent its own; the dirs whose writer is node-root (the runtime runs the
/// binaries and loads the conflists; the installer's records say which
/// conflist to write with what) are writable to the installer and to no
/// container with capabilities, and only the containers the manifest adds
/// capabilities to have any.
pub fn each_container_holds_only_its_share_of_the_privileges(world: &mut World) {
    ensure_installed(world);
    let c = world.cluster();
    let pod = podgate_pod(c, NODE);
    let pids = container_pids(c, NS, pod.trim_start_matches("pod/"));
    let ds = c.kubectl_json(&["-n", NS, "get", "ds", "podgate"]);
    let adds_capabilities: BTreeMap<String, bool> = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let add = &k["securityContext"]["capabilities"]["add"];
            (
                k["name"].as_str().unwrap().to_string(),
                add.as_array().is_some_and(|a| !a.is_empty()),
            )
        })
        .collect();
    let names: Vec<&String> = pids.keys().collect();
    let expected: Vec<&String> = adds_capabilities.keys().collect();
    assert_eq!(names, expected, "the running containers of {pod}");

    assert_eq!(
        caps(pids["install"]),
        (0, 0),
        "the installer has capabilities"
    );
    assert_ne!(
        caps(pids["agent"]).0,
        0,
        "the agent runs without its capabilities"
    );
    let node_root_dirs = [
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/var/lib/podgate/installer",
    ];
    for dir in node_root_dirs {
        let host_dir = c.host_path(NODE, dir);
        assert!(
            !writable_mounts_of(pids["install"], &host_dir).is_empty(),
            "the installer cannot write {dir}"
        );
        let w = writable_mounts_of(pids["agent"], &host_dir);
        assert!(w.is_empty(), "the agent can write {dir}: {w:?}");
    }
    for (name, pid) in &pids {
        if caps(*pid).0 != 0 {
            assert!(
                adds_capabilities[name],
                "{name} has capabilities it was not given"
            );
            for dir in node_root_dirs {
                let w = writable_mounts_of(*pid, &c.host_path(NODE, dir));
                assert!(
                    w.is_empty(),
                    "{name} has capabilities and writes {dir}: {w:?}"
                );
            }
        }
    }
}

/// Effective and permitted capability sets of `pid`.
fn caps(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
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
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
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

/// (device, path within its filesystem) of a path of this machine, from
/// this process's mounts (the longest mount point above it).
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
