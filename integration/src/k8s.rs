//! The throwaway Kubernetes cluster of `integration/k8s/cluster.sh` from
//! the tests' side: bring it up and down, run kubectl where it reaches the
//! API server, run commands on a node, read a node's state.
//!
//! The cluster is the real kube-apiserver, controller-manager, scheduler,
//! kubelets, kube-proxies and containerd (see the script's header); tests
//! act through kubectl as an operator does and look at nodes only to assert
//! what podgate left there.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{output_text, workspace_root, Snapshot};

/// The cluster's nodes, as `cluster.sh` names them.
pub const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];

/// Which containerd the nodes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Containerd {
    /// Debian's 1.6.
    Debian,
    /// 2.x, built by `integration/k8s/build.sh`.
    V2,
}

impl Containerd {
    pub fn arg(self) -> &'static str {
        match self {
            Containerd::Debian => "debian",
            Containerd::V2 => "2",
        }
    }
}

/// `integration/k8s/cluster.sh`.
pub fn script() -> PathBuf {
    workspace_root().join("integration/k8s/cluster.sh")
}

/// The cluster's name (`$PODGATE_K8S_NAME`, default `pg-k8s`): the prefix
/// of its netns, its cgroup root, its directory's name.
pub fn cluster_name() -> String {
    std::env::var("PODGATE_K8S_NAME").unwrap_or_else(|_| "pg-k8s".into())
}

/// Where the cluster keeps its files.
pub fn cluster_dir() -> PathBuf {
    PathBuf::from("/var/tmp").join(cluster_name())
}

/// `cluster.sh ARGS` with null stdin, from the workspace root.
pub fn cluster_sh(args: &[&str]) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(script())
        .args(args)
        .current_dir(workspace_root())
        .stdin(Stdio::null());
    cmd
}

/// The helm binary `integration/k8s/build.sh` built: `$HELM_BIN/helm`
/// (the directory, as `build.sh --env` prints it), else asked of
/// `build.sh --env` (which builds it the first time, about 4 minutes).
pub fn helm() -> PathBuf {
    let dir = match std::env::var_os("HELM_BIN").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let out = Command::new("bash")
                .arg(workspace_root().join("integration/k8s/build.sh"))
                .arg("--env")
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("running integration/k8s/build.sh --env: {e}"));
            let text = output_text(&out);
            assert!(
                out.status.success(),
                "integration/k8s/build.sh --env failed:\n{text}"
            );
            let line = String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("HELM_BIN=").map(str::to_string))
                .unwrap_or_else(|| panic!("build.sh --env printed no HELM_BIN:\n{text}"));
            PathBuf::from(line)
        }
    };
    dir.join("helm")
}

/// A running cluster, taken down when dropped (also while unwinding).
pub struct Cluster {
    pub containerd: Containerd,
    dir: PathBuf,
}

impl Cluster {
    /// `cluster.sh up --containerd <gen>`; panics with its output when it
    /// fails (the script has then removed what it made).
    pub fn up(containerd: Containerd) -> Cluster {
        crate::require_root();
        let out = cluster_sh(&["up", "--containerd", containerd.arg()])
            .output()
            .expect("running cluster.sh up");
        assert!(
            out.status.success(),
            "cluster.sh up failed:\n{}",
            output_text(&out)
        );
        Cluster {
            containerd,
            dir: cluster_dir(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A node's own root: what the node sees at `/` for the directories
    /// its mount namespace binds (`/etc/cni`, `/opt`, `/run`, `/var/lib`,
    /// `/var/log`, `/tmp`); `host_path(node, "/var/lib/cni/podgate")`.
    pub fn host_path(&self, node: &str, path: &str) -> PathBuf {
        self.dir
            .join("nodes")
            .join(node)
            .join("fs")
            .join(path.trim_start_matches('/'))
    }

    /// `bash -c script` where kubectl reaches the cluster (KUBECONFIG and
    /// PATH set), from the workspace root: the README's commands run here
    /// as an operator types them.
    pub fn sh(&self, script: &str) -> Output {
        self.sh_in(script, &workspace_root())
    }

    /// [`Cluster::sh`] from `dir`.
    pub fn sh_in(&self, script: &str, dir: &Path) -> Output {
        // Bounded: `rollout status` and friends wait forever by default.
        let mut cmd = cluster_sh(&[
            "run",
            "timeout",
            "--kill-after=10",
            "600",
            "bash",
            "-euo",
            "pipefail",
            "-c",
            script,
        ]);
        cmd.current_dir(dir);
        cmd.output().expect("running cluster.sh run")
    }

    /// [`Cluster::sh`], panicking with the output unless it succeeds;
    /// returns stdout.
    #[track_caller]
    pub fn sh_ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "{script}\nfailed:\n{}",
            output_text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl ARGS`.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        let mut full = vec!["run", "kubectl"];
        full.extend_from_slice(args);
        cluster_sh(&full).output().expect("running kubectl")
    }

    /// `kubectl ARGS`, panicking unless it succeeds; returns stdout.
    #[track_caller]
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {}\nfailed:\n{}",
            args.join(" "),
            output_text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl -n NS wait --for=condition=Ready pod/POD --timeout=180s`,
    /// panicking unless the pod gets Ready in that time.
    #[track_caller]
    pub fn wait_pod_ready(&self, ns: &str, pod: &str) {
        self.kubectl_ok(&[
            "-n",
            ns,
            "wait",
            "--for=condition=Ready",
            &format!("pod/{pod}"),
            "--timeout=180s",
        ]);
    }

    /// `kubectl ARGS -o json`, parsed.
    #[track_caller]
    pub fn kubectl_json(&self, args: &[&str]) -> Value {
        let mut full = args.to_vec();
        full.extend_from_slice(&["-o", "json"]);
        let out = self.kubectl_ok(&full);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}\n{out}"))
    }

    /// `kubectl apply -f -` of `yaml`.
    #[track_caller]
    pub fn apply(&self, yaml: &str) {
        let mut cmd = cluster_sh(&["run", "kubectl", "apply", "-f", "-"]);
        let run = crate::run_with_stdin(&mut cmd, yaml.as_bytes());
        assert!(run.code == Some(0), "kubectl apply:\n{run:?}\n{yaml}");
    }

    /// `script` run by `bash -c` on `node` (its netns and mount namespace;
    /// crictl, ctr and the cluster's tools on PATH).
    pub fn node_sh(&self, node: &str, script: &str) -> Output {
        cluster_sh(&["node", node, "bash", "-euo", "pipefail", "-c", script])
            .output()
            .expect("running cluster.sh node")
    }

    /// [`Cluster::node_sh`], panicking unless it succeeds; returns stdout.
    #[track_caller]
    pub fn node_sh_ok(&self, node: &str, script: &str) -> String {
        let out = self.node_sh(node, script);
        assert!(
            out.status.success(),
            "on {node}: {script}\nfailed:\n{}",
            output_text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The node's netns, `/run/netns/<cluster name>-<node>` on the machine.
    pub fn netns_path(node: &str) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}-{node}", cluster_name()))
    }

    /// Routes, rules, nf_tables, links and addresses of `node`'s netns,
    /// without kube-proxy's tables (they follow Services and endpoints, not
    /// podgate).
    pub fn node_snapshot(&self, node: &str) -> Snapshot {
        let mut s = crate::snapshot::snapshot_at(&Cluster::netns_path(node));
        s.nft
            .retain(|e| nft_entry_table(e).is_none_or(|t| t != "kube-proxy"));
        s
    }

    /// Imports an image archive into every node's containerd.
    #[track_caller]
    pub fn load_image(&self, archive: &Path) {
        let out = cluster_sh(&["load-image", &archive.to_string_lossy()])
            .output()
            .expect("running cluster.sh load-image");
        assert!(
            out.status.success(),
            "load-image {}:\n{}",
            archive.display(),
            output_text(&out)
        );
    }

    /// Polls `check` every 500 ms until it returns Some, for up to `secs`;
    /// panics with `what` otherwise.
    #[track_caller]
    pub fn wait<T>(&self, what: &str, secs: u64, check: impl FnMut() -> Option<T>) -> T {
        self.wait_opt(secs, check)
            .unwrap_or_else(|| panic!("{what}: not within {secs} s"))
    }

    /// Polls `check` every 500 ms until it returns Some, for up to `secs`.
    pub fn wait_opt<T>(&self, secs: u64, mut check: impl FnMut() -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(v) = check() {
                return Some(v);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        match cluster_sh(&["down"]).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!("warning: cluster.sh down failed:\n{}", output_text(&out)),
            Err(e) => eprintln!("warning: running cluster.sh down: {e}"),
        }
    }
}

/// The table an entry of [`Snapshot::nft`] belongs to: a table's own name,
/// a chain's, rule's or set's `table`.
pub fn nft_entry_table(entry: &str) -> Option<String> {
    let v: Value = serde_json::from_str(entry).ok()?;
    let (kind, obj) = v.as_object()?.iter().next()?;
    let name = if kind == "table" {
        &obj["name"]
    } else {
        &obj["table"]
    };
    name.as_str().map(String::from)
}

/// What of the machine a cluster may touch, to compare before `up` and
/// after `down`: processes of the cluster's programs, mounts, network
/// namespaces, the cgroup tree, the machine's own routes, rules and
/// nf_tables, the sysctls a kubelet writes, and files in the directories
/// a node's mount namespace covers (`/etc/cni`, `/opt`, `/var/lib`,
/// `/var/log`, `/run`). Other test runs' namespaces (`pg-` but not
/// `pg-k8s-`) and cgroups (`podgate-it-`) are left out, so that a run beside
/// other tests compares only what a cluster could have left.
#[derive(Debug, PartialEq, Eq)]
pub struct MachineState {
    processes: Vec<String>,
    mounts: Vec<String>,
    netns: Vec<String>,
    cgroups: Vec<String>,
    net: Snapshot,
    sysctls: Vec<String>,
    files: Vec<String>,
}

/// Programs a cluster runs; none may be left after `down`.
const CLUSTER_PROGRAMS: &[&str] = &[
    "podgate-k8s",
    "etcd",
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "podgate",
    "openvpn",
    "pause",
    "greeter",
];

/// Entries of other test runs beside this one: their netns (`pg-`), test
/// cgroups and dirs (`podgate-it-`), and other clusters' (`pg-k8s-<name>`).
fn is_other_tests(entry: &str) -> bool {
    let name = cluster_name();
    let own = |part: &str| {
        part == name
            || ["fabric", "cp", "node-1", "node-2", "node-3"]
                .iter()
                .any(|n| part == format!("{name}-{n}"))
    };
    let parts = || entry.split(['/', ' ']);
    let other_netns = parts().any(|p| p.starts_with("pg-") && !p.starts_with("pg-k8s"))
        && (entry.contains("/netns/") || entry.starts_with("pg-"));
    let other_cluster = parts().any(|p| p.starts_with("pg-k8s") && !own(p));
    other_netns || other_cluster || entry.contains("podgate-it-")
}

/// Whether process `pid` belongs to another cluster than this one (named
/// otherwise, running beside it): in a cgroup under that cluster's root, or
/// in one of its nodes' mount namespaces.
fn of_another_cluster(pid: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ours = cluster_name();
    let cgroups = std::fs::read_to_string(pid.join("cgroup")).unwrap_or_default();
    if cgroups.lines().any(|l| {
        let path = l.splitn(3, ':').nth(2).unwrap_or_default();
        path.starts_with("/pg-k8s") && path.split('/').nth(1) != Some(ours.as_str())
    }) {
        return true;
    }
    let Ok(mnt) = std::fs::metadata(pid.join("ns/mnt")) else {
        return false;
    };
    std::fs::read_dir("/var/tmp")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| {
            let n = d.file_name().to_string_lossy().into_owned();
            n.starts_with("pg-k8s") && n != ours
        })
        .flat_map(|d| {
            std::fs::read_dir(d.path().join("ns"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .any(|f| {
            std::fs::metadata(f.path()).is_ok_and(|m| m.ino() == mnt.ino() && m.dev() == mnt.dev())
        })
}

impl MachineState {
    pub fn read() -> MachineState {
        let mut processes = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(exe) = std::fs::read_link(entry.path().join("exe")) else {
                continue;
            };
            let name = exe
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if CLUSTER_PROGRAMS.contains(&name.as_str()) && !of_another_cluster(&entry.path()) {
                processes.push(format!(
                    "{} {}",
                    entry.file_name().to_string_lossy(),
                    exe.display()
                ));
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            // mount point and source: ids and peer groups are not stable.
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                format!("{} {}", f.get(4).unwrap_or(&""), f.get(3).unwrap_or(&""))
            })
            .filter(|m| !is_other_tests(m))
            .collect();
        let netns = std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !is_other_tests(n))
            .collect();
        let mut cgroups = Vec::new();
        walk_dirs(Path::new("/sys/fs/cgroup"), 0, &mut cgroups);
        cgroups.retain(|c| !is_other_tests(c));
        let sysctls = [
            "vm/overcommit_memory",
            "vm/panic_on_oom",
            "kernel/panic",
            "kernel/panic_on_oops",
            "kernel/keys/root_maxkeys",
            "kernel/keys/root_maxbytes",
            "net/ipv4/ip_forward",
            "net/ipv6/conf/all/forwarding",
        ]
        .iter()
        .map(|k| {
            let v = std::fs::read_to_string(format!("/proc/sys/{k}")).unwrap_or_default();
            format!("{k} = {}", v.trim())
        })
        .collect();
        let mut files = Vec::new();
        for top in ["/etc/cni", "/opt", "/var/lib", "/var/log", "/run"] {
            walk_files(Path::new(top), &mut files);
        }
        // podman's image store: image builds write it, a cluster never does.
        files.retain(|f| !is_other_tests(f) && !f.contains(" /var/lib/containers/"));
        let mut s = MachineState {
            processes,
            mounts,
            netns,
            cgroups,
            net: crate::snapshot::snapshot_at(Path::new("/proc/self/ns/net")),
            sysctls,
            files,
        };
        for v in [
            &mut s.processes,
            &mut s.mounts,
            &mut s.netns,
            &mut s.cgroups,
            &mut s.files,
        ] {
            v.sort();
        }
        s
    }

    /// `-`/`+` lines of what differs; empty when equal.
    pub fn diff(&self, after: &MachineState) -> String {
        let mut out = String::new();
        let lists = [
            ("processes", &self.processes, &after.processes),
            ("mounts", &self.mounts, &after.mounts),
            ("netns", &self.netns, &after.netns),
            ("cgroups", &self.cgroups, &after.cgroups),
            ("sysctls", &self.sysctls, &after.sysctls),
            ("files", &self.files, &after.files),
        ];
        for (name, a, b) in lists {
            for x in a.iter().filter(|x| !b.contains(x)) {
                out += &format!("[{name}] - {x}\n");
            }
            for x in b.iter().filter(|x| !a.contains(x)) {
                out += &format!("[{name}] + {x}\n");
            }
        }
        out += &self.net.diff(&after.net);
        out
    }
}

/// Cgroup directories, three levels deep (the kubelets' cgroupRoot and
/// what is made below it).
fn walk_dirs(dir: &Path, depth: usize, out: &mut Vec<String>) {
    if depth > 3 {
        return;
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(e.path().display().to_string());
            walk_dirs(&e.path(), depth + 1, out);
        }
    }
}

/// Every entry below `dir` (path and type; sizes and times change with
/// the machine's own activity), not following links or other filesystems'
/// special trees.
fn walk_files(dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(t) = e.file_type() else { continue };
        let kind = if t.is_dir() {
            "d"
        } else if t.is_symlink() {
            "l"
        } else {
            "f"
        };
        out.push(format!("{kind} {}", e.path().display()));
        if t.is_dir() {
            walk_files(&e.path(), out);
        }
    }
}
