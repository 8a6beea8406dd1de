//! A simulated Kubernetes node driving CNI through the real libcni.

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::fs;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use serde_json::{json, Value};

use crate::{bin_dir, bin_runner, cnirunner, sanitize, Netns, TempDir};

/// Where the distribution's reference CNI plugins live.
pub const SYSTEM_CNI_DIR: &str = "/usr/lib/cni";

/// Seconds before a single runner invocation is killed (`timeout(1)`).
const CNI_TIMEOUT_SECS: &str = "120";

/// CNI operation performed by the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Add,
    Check,
    Del,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Add => "add",
            Verb::Check => "check",
            Verb::Del => "del",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Kubernetes-node stand-in: its own netns plus a temp dir with
///
/// * `net.d/`   conflists (`--conf-dir`)
/// * `cache/`   libcni result cache (`--cache-dir`)
/// * `ipam/`    host-local `dataDir`
/// * `state/`   podgate `stateDir`
/// * `cni-bin/` symlinks to every `/usr/lib/cni/*` plugin and every
///   `podgate-*` binary in [`bin_dir`] (`--cni-path`); scripts running them
///   through [`crate::bin_runner`] when one is set
///
/// Fields drop in order: the netns (and everything in it) first, then the dir.
pub struct TestNode {
    pub ns: Netns,
    pub dir: TempDir,
    env: Vec<(String, String)>,
}

impl fmt::Debug for TestNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestNode")
            .field("ns", &self.ns.name())
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl TestNode {
    /// A node with IPv4/IPv6 forwarding explicitly enabled (like a real node).
    pub fn new(prefix: &str) -> TestNode {
        TestNode::with_forwarding(prefix, true)
    }

    /// A node with `net.ipv4.ip_forward` / `net.ipv6.conf.all.forwarding`
    /// explicitly set to `forwarding`.
    pub fn with_forwarding(prefix: &str, forwarding: bool) -> TestNode {
        let ns = Netns::new_with_forwarding(&format!("node-{}", sanitize(prefix, 16)), forwarding);
        let dir = TempDir::new(prefix);
        let node = TestNode {
            ns,
            dir,
            env: Vec::new(),
        };
        for sub in ["net.d", "cache", "ipam", "state", "cni-bin"] {
            fs::create_dir_all(node.dir.path().join(sub)).unwrap();
        }
        node.link_plugins();
        node
    }

    fn link_plugins(&self) {
        let bin = self.cni_bin_dir();
        let mut sources: Vec<PathBuf> = Vec::new();
        if let Ok(entries) = fs::read_dir(SYSTEM_CNI_DIR) {
            sources.extend(entries.flatten().map(|e| e.path()));
        }
        if let Ok(entries) = fs::read_dir(bin_dir()) {
            sources.extend(entries.flatten().map(|e| e.path()).filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("podgate-") && !n.contains('.'))
            }));
        }
        let runner = bin_runner();
        for src in sources {
            let executable = fs::metadata(&src)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false);
            let Some(name) = src.file_name() else {
                continue;
            };
            if !executable {
                continue;
            }
            let link = bin.join(name);
            let _ = fs::remove_file(&link);
            let podgate = name.to_string_lossy().starts_with("podgate-");
            if podgate && !runner.is_empty() {
                // libcni executes the file: a script that hands the binary to
                // the runner (binfmt_misc is the machine's, not ours to set).
                let script = format!(
                    "#!/bin/sh\nexec {} '{}' \"$@\"\n",
                    runner.join(" "),
                    src.display()
                );
                fs::write(&link, script)
                    .and_then(|()| fs::set_permissions(&link, fs::Permissions::from_mode(0o755)))
                    .unwrap_or_else(|e| panic!("writing {}: {e}", link.display()));
            } else {
                std::os::unix::fs::symlink(&src, &link)
                    .unwrap_or_else(|e| panic!("symlink {}: {e}", link.display()));
            }
        }
    }

    /// Re-creates the `cni-bin/` symlinks (e.g. after building more plugins).
    pub fn refresh_cni_bin(&self) {
        self.link_plugins();
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }
    pub fn conf_dir(&self) -> PathBuf {
        self.root().join("net.d")
    }
    pub fn cache_dir(&self) -> PathBuf {
        self.root().join("cache")
    }
    pub fn ipam_dir(&self) -> PathBuf {
        self.root().join("ipam")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.root().join("state")
    }
    pub fn cni_bin_dir(&self) -> PathBuf {
        self.root().join("cni-bin")
    }

    /// Extra environment for every runner invocation (libcni passes its whole
    /// environment on to the plugins), e.g. `RUST_LOG`.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_string(), value.to_string()));
    }

    /// Writes `net.d/<file_stem>.conflist` (pretty JSON) and returns its path.
    /// The network name used by [`TestNode::cni`] is the conflist's `"name"`.
    pub fn write_conflist(&self, file_stem: &str, conflist: &Value) -> PathBuf {
        let path = self.conf_dir().join(format!("{file_stem}.conflist"));
        let text = serde_json::to_string_pretty(conflist).unwrap();
        fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }

    /// Removes `net.d/<file_stem>.conflist` (if present).
    pub fn remove_conflist(&self, file_stem: &str) {
        let _ = fs::remove_file(self.conf_dir().join(format!("{file_stem}.conflist")));
    }

    /// A new pod sandbox netns (forwarding left at the kernel default).
    pub fn pod(&self, name: &str) -> Netns {
        Netns::new(&format!("pod-{}", sanitize(name, 16)))
    }

    /// A conflist: `bridge` (isGateway, no ipMasq; bridge name derived from
    /// `name`) with `host-local` IPAM over `subnet` (dataDir = this node's
    /// `ipam/`), followed by `extra_plugins`.
    pub fn bridge_conflist(
        &self,
        name: &str,
        cni_version: &str,
        subnet: &str,
        extra_plugins: Vec<Value>,
    ) -> Value {
        let mut plugins = vec![json!({
            "type": "bridge",
            "bridge": bridge_name(name),
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": self.ipam_dir(),
                "ranges": [[{ "subnet": subnet }]],
                // Pods get a default route via the bridge, as on a real node.
                "routes": [{ "dst": "0.0.0.0/0" }],
            },
        })];
        plugins.extend(extra_plugins);
        json!({
            "cniVersion": cni_version,
            "name": name,
            "plugins": plugins,
        })
    }

    /// A podgate-router conflist entry keeping its state and log in this
    /// node's dir, with pod annotations delivered, the operator's `profiles`
    /// and `assign`, and the `vpn` namespace allowed to pick pools inside
    /// 10.8.0.0/16.
    pub fn router_entry(&self, profiles: Value, assign: Value) -> Value {
        json!({
            "type": "podgate-router",
            "stateDir": self.state_dir(),
            "logFile": self.root().join("router.log"),
            "capabilities": {"io.kubernetes.cri.pod-annotations": true},
            "profiles": profiles,
            "assign": assign,
            "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]}
        })
    }

    /// Runs `cnirunner <verb>` inside the node netns for `pod`:
    /// `--conf-dir net.d --name <network> --netns <pod path> --container-id
    /// <container_id> --ifname <ifname> --cni-path cni-bin --cache-dir cache
    /// [--args <args>] [--capability-args <json>]`.
    #[allow(clippy::too_many_arguments)]
    pub fn cni(
        &self,
        verb: Verb,
        network: &str,
        pod: &Netns,
        container_id: &str,
        ifname: &str,
        args: Option<&str>,
        capability_args: Option<Value>,
    ) -> CniOutcome {
        self.cni_with_netns_path(
            verb,
            network,
            pod.path(),
            container_id,
            ifname,
            args,
            capability_args,
        )
    }

    /// [`TestNode::cni`] with an explicit netns path, e.g. one whose netns was
    /// already deleted (DEL after the sandbox is gone).
    #[allow(clippy::too_many_arguments)]
    pub fn cni_with_netns_path(
        &self,
        verb: Verb,
        network: &str,
        netns: &Path,
        container_id: &str,
        ifname: &str,
        args: Option<&str>,
        capability_args: Option<Value>,
    ) -> CniOutcome {
        let runner = cnirunner();
        let mut cmd = Command::new("timeout");
        cmd.args([
            "--kill-after=5",
            CNI_TIMEOUT_SECS,
            "ip",
            "netns",
            "exec",
            self.ns.name(),
        ])
        .arg(&runner)
        .arg(verb.as_str())
        .arg("--conf-dir")
        .arg(self.conf_dir())
        .arg("--name")
        .arg(network)
        .arg("--netns")
        .arg(netns)
        .arg("--container-id")
        .arg(container_id)
        .arg("--ifname")
        .arg(ifname)
        .arg("--cni-path")
        .arg(self.cni_bin_dir())
        .arg("--cache-dir")
        .arg(self.cache_dir());
        if let Some(a) = args {
            cmd.arg("--args").arg(a);
        }
        if let Some(c) = capability_args {
            cmd.arg("--capability-args").arg(c.to_string());
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null());
        let command = format!("{cmd:?}");
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("spawning {command}: {e}"));
        CniOutcome::new(verb, command, out)
    }

    /// ADD `pod` (ifname eth0) to `network`; panics unless it succeeds.
    /// Returns the CNI result.
    pub fn add(&self, network: &str, pod: &Netns, container_id: &str) -> Value {
        let out = self.cni(Verb::Add, network, pod, container_id, "eth0", None, None);
        out.assert_ok();
        out.result.unwrap_or(Value::Null)
    }

    /// CHECK `pod` (ifname eth0) on `network`.
    pub fn check(&self, network: &str, pod: &Netns, container_id: &str) -> CniOutcome {
        self.cni(Verb::Check, network, pod, container_id, "eth0", None, None)
    }

    /// DEL `pod` (ifname eth0) from `network`.
    pub fn del(&self, network: &str, pod: &Netns, container_id: &str) -> CniOutcome {
        self.cni(Verb::Del, network, pod, container_id, "eth0", None, None)
    }

    /// Snapshot of the node netns (see [`crate::snapshot`]).
    pub fn snapshot(&self) -> crate::Snapshot {
        crate::snapshot(&self.ns)
    }

    /// A snapshot once the node has settled: IPv6 link-local addresses and
    /// their routes appear a moment after a veth comes up, so wait until two
    /// snapshots in a row agree (at most ~10 s).
    pub fn settled_snapshot(&self) -> crate::Snapshot {
        let mut last = self.snapshot();
        for _ in 0..20 {
            std::thread::sleep(std::time::Duration::from_millis(500));
            let now = self.snapshot();
            if now == last {
                return now;
            }
            last = now;
        }
        last
    }

    /// Files under `state/` (see [`crate::state_files`]).
    pub fn state_files(&self) -> Vec<String> {
        crate::state_files(self)
    }
}

/// Deterministic, ≤15-char Linux bridge name for a network.
pub fn bridge_name(network: &str) -> String {
    let mut h = DefaultHasher::new();
    network.hash(&mut h);
    format!("pgbr{:08x}", h.finish() & 0xffff_ffff)
}

/// What one runner invocation did.
pub struct CniOutcome {
    pub verb: Verb,
    /// The command line, for messages.
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// Parsed stdout of a successful ADD.
    pub result: Option<Value>,
    /// Parsed `CNI_ERROR {...}` line (`{"code","msg","details"}`), if any.
    pub error: Option<Value>,
}

impl CniOutcome {
    fn new(verb: Verb, command: String, out: std::process::Output) -> CniOutcome {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let result = if out.status.success() && verb == Verb::Add {
            serde_json::from_str(stdout.trim()).ok()
        } else {
            None
        };
        let error = stderr
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("CNI_ERROR "))
            .and_then(|j| serde_json::from_str(j).ok());
        CniOutcome {
            verb,
            command,
            status: out.status,
            stdout,
            stderr,
            result,
            error,
        }
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Exit code: 0 ok, 2 CNI error (see [`CniOutcome::error`]), 1 other error,
    /// 124/137 timeout.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// The CNI error code, if the plugin chain failed with a CNI error.
    pub fn error_code(&self) -> Option<u64> {
        self.error.as_ref().and_then(|e| e["code"].as_u64())
    }

    /// The CNI error message, if any.
    pub fn error_msg(&self) -> Option<&str> {
        self.error.as_ref().and_then(|e| e["msg"].as_str())
    }

    /// Panics (showing the command and its output) unless it succeeded.
    pub fn assert_ok(&self) -> &Self {
        assert!(self.success(), "CNI {} failed:\n{self:?}", self.verb);
        self
    }

    /// Panics unless it failed with a CNI error of `code`.
    pub fn assert_cni_error(&self, code: u64) -> &Self {
        assert!(
            !self.success() && self.error_code() == Some(code),
            "expected CNI {} to fail with CNI error code {code}:\n{self:?}",
            self.verb
        );
        self
    }

    /// `result.ips[].address` (CIDR form), in order.
    pub fn ips(&self) -> Vec<String> {
        self.result
            .as_ref()
            .and_then(|r| r["ips"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str().map(str::to_string))
            .collect()
    }

    /// The first result IP without its prefix length.
    pub fn first_ip(&self) -> Option<String> {
        self.ips()
            .into_iter()
            .next()
            .and_then(|a| a.split('/').next().map(str::to_string))
    }
}

impl fmt::Debug for CniOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "command: {}\nstatus: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.status, self.stdout, self.stderr
        )
    }
}
