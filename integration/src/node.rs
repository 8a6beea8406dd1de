//! A simulated Kubernetes node driving CNI through the real libcni: upstream
//! `cnitool`, or `cnirunner` for what cnitool cannot do (see [`Driver`]).

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::fs;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use serde_json::{json, Value};
use sha2::{Digest, Sha512};

use crate::tools::{cnirunner, cnirunner_libcni13, cnitool, upstream_plugins_dir};
use crate::{bin_dir, bin_runner, sanitize, Netns, TempDir};

/// Where the distribution's reference CNI plugins live.
pub const SYSTEM_CNI_DIR: &str = "/usr/lib/cni";

/// Seconds before a single libcni invocation is killed (`timeout(1)`).
const CNI_TIMEOUT_SECS: &str = "120";

/// A libcni operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Add,
    Check,
    Del,
    /// The network's GC (spec 1.1.0; libcni first DELs the cached
    /// attachments that are not valid).
    Gc,
    /// The network's STATUS (spec 1.1.0).
    Status,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Add => "add",
            Verb::Check => "check",
            Verb::Del => "del",
            Verb::Gc => "gc",
            Verb::Status => "status",
        }
    }
}

/// What drives libcni for a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// Upstream `cnitool` (libcni 1.3), the way its README documents it: the
    /// container ID is [`cnitool_container_id`] of the netns path, a failure
    /// is its message on stderr (no CNI error code), GC sends no valid
    /// attachments.
    Cnitool,
    /// `cnirunner` on Debian's libcni 1.1.2: any container ID, DEL without
    /// a netns, the CNI error code.
    Runner,
    /// `cnirunner` on libcni 1.3: GC with a valid-attachments list, STATUS
    /// with its code.
    RunnerLibcni13,
}

/// The reference plugins a node's `cni-bin/` holds: the primaries the
/// chains start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primaries {
    /// Debian's `containernetworking-plugins` 1.1.1 in [`SYSTEM_CNI_DIR`]
    /// (spec up to 1.0.0).
    Debian,
    /// The reference plugins v1.10.0 built by `integration/go-tools.sh`
    /// (spec up to 1.1.0): `bridge`, `host-local`, `loopback`, `portmap`,
    /// `ptp`, `tuning`.
    Upstream,
}

impl Primaries {
    pub fn dir(self) -> PathBuf {
        match self {
            Primaries::Debian => PathBuf::from(SYSTEM_CNI_DIR),
            Primaries::Upstream => upstream_plugins_dir(),
        }
    }
}

/// The container ID `cnitool` gives the attachments of `netns`:
/// `cnitool-` and the first 10 bytes of the SHA-512 of its (absolute) path.
pub fn cnitool_container_id(netns: &Path) -> String {
    let digest = Sha512::digest(netns.as_os_str().as_encoded_bytes());
    let hex: String = digest.iter().take(10).map(|b| format!("{b:02x}")).collect();
    format!("cnitool-{hex}")
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Kubernetes-node stand-in: its own netns plus a temp dir with
///
/// * `net.d/`   conflists (`NETCONFPATH`, `--conf-dir`)
/// * `var-lib/` the node's `/var/lib`: every libcni call runs in a private
///   mount namespace with it bound over `/var/lib`, so libcni's result cache
///   (`/var/lib/cni`, which cnitool cannot move) is `var-lib/cni/`, and the
///   machine's own `/var/lib/cni` is never written
/// * `ipam/`    host-local `dataDir`
/// * `state/`   podgate `stateDir`
/// * `cni-bin/` symlinks to every plugin of its [`Primaries`] and every
///   `podgate-*` binary in [`bin_dir`] (`CNI_PATH`); scripts running them
///   through [`crate::bin_runner`] when one is set
///
/// Fields drop in order: the netns (and everything in it) first, then the dir.
pub struct TestNode {
    pub ns: Netns,
    pub dir: TempDir,
    env: Vec<(String, String)>,
    primaries: Primaries,
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
    /// A node with IPv4/IPv6 forwarding explicitly enabled (like a real node)
    /// and Debian's primaries.
    pub fn new(prefix: &str) -> TestNode {
        TestNode::build(prefix, true, Primaries::Debian)
    }

    /// A node with `net.ipv4.ip_forward` / `net.ipv6.conf.all.forwarding`
    /// explicitly set to `forwarding`.
    pub fn with_forwarding(prefix: &str, forwarding: bool) -> TestNode {
        TestNode::build(prefix, forwarding, Primaries::Debian)
    }

    /// A forwarding node whose `cni-bin/` holds `primaries`.
    pub fn with_primaries(prefix: &str, primaries: Primaries) -> TestNode {
        TestNode::build(prefix, true, primaries)
    }

    fn build(prefix: &str, forwarding: bool, primaries: Primaries) -> TestNode {
        let ns = Netns::new_with_forwarding(&format!("node-{}", sanitize(prefix, 16)), forwarding);
        let dir = TempDir::new(prefix);
        let node = TestNode {
            ns,
            dir,
            env: Vec::new(),
            primaries,
        };
        for sub in ["net.d", "var-lib/cni", "ipam", "state", "cni-bin"] {
            fs::create_dir_all(node.dir.path().join(sub)).unwrap();
        }
        node.link_plugins();
        node
    }

    fn link_plugins(&self) {
        let bin = self.cni_bin_dir();
        let mut sources: Vec<PathBuf> = Vec::new();
        let primaries = self.primaries.dir();
        let listed = fs::read_dir(&primaries)
            .unwrap_or_else(|e| panic!("reading {}: {e}", primaries.display()));
        sources.extend(listed.flatten().map(|e| e.path()));
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
    /// The node's `/var/lib` (bound there for every libcni call).
    pub fn var_lib_dir(&self) -> PathBuf {
        self.root().join("var-lib")
    }
    /// libcni's result cache: the node's `/var/lib/cni`.
    pub fn cache_dir(&self) -> PathBuf {
        self.var_lib_dir().join("cni")
    }
    pub fn ipam_dir(&self) -> PathBuf {
        self.root().join("ipam")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.root().join("state")
    }
    /// The node's event channel: where a router entry with this `stateDir`
    /// writes its events, and the `eventFile` a tunnel-guard entry names.
    /// Without it the guard writes the machine's default
    /// (`/var/lib/cni/podgate/events.jsonl`) wherever a runtime runs it
    /// outside [`TestNode::var_lib_dir`] (containerd, the tests' own calls).
    pub fn event_file(&self) -> PathBuf {
        self.state_dir().join("events.jsonl")
    }
    pub fn cni_bin_dir(&self) -> PathBuf {
        self.root().join("cni-bin")
    }

    /// Extra environment for every libcni invocation (libcni passes its whole
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

    /// `cnitool <verb> <network> <pod's netns path>` inside the node netns
    /// ([`Driver::Cnitool`]), with `CNI_IFNAME`, `CNI_ARGS` and `CAP_ARGS`
    /// (capability args as a JSON object) as its README documents.
    pub fn cni(
        &self,
        verb: Verb,
        network: &str,
        pod: &Netns,
        ifname: &str,
        args: Option<&str>,
        capability_args: Option<Value>,
    ) -> CniOutcome {
        self.cni_with_netns_path(verb, network, pod.path(), ifname, args, capability_args)
    }

    /// [`TestNode::cni`] with an explicit netns path, e.g. one whose netns was
    /// already deleted (DEL after the sandbox is gone: the same path gives
    /// the same container ID).
    pub fn cni_with_netns_path(
        &self,
        verb: Verb,
        network: &str,
        netns: &Path,
        ifname: &str,
        args: Option<&str>,
        capability_args: Option<Value>,
    ) -> CniOutcome {
        let mut cmd = self.cnitool_command(verb, network, netns);
        cmd.env("CNI_IFNAME", ifname);
        if let Some(a) = args {
            cmd.env("CNI_ARGS", a);
        }
        if let Some(c) = capability_args {
            cmd.env("CAP_ARGS", c.to_string());
        }
        self.run(
            Driver::Cnitool,
            verb,
            cmd,
            Some(cnitool_container_id(netns)),
        )
    }

    /// `cnitool gc <network>`: libcni DELs every cached attachment of the
    /// network, then (spec 1.1.0) sends GC without a valid-attachments list.
    pub fn cnitool_gc(&self, network: &str) -> CniOutcome {
        let cmd = self.cnitool_command(Verb::Gc, network, self.ns.path());
        self.run(Driver::Cnitool, Verb::Gc, cmd, None)
    }

    /// `cnitool status <network>` (spec 1.1.0; libcni skips older versions).
    pub fn cnitool_status(&self, network: &str) -> CniOutcome {
        let cmd = self.cnitool_command(Verb::Status, network, self.ns.path());
        self.run(Driver::Cnitool, Verb::Status, cmd, None)
    }

    /// `cnitool <verb> <network> <netns>` (the netns only names the
    /// container for GC and STATUS).
    fn cnitool_command(&self, verb: Verb, network: &str, netns: &Path) -> Command {
        let mut cmd = self.libcni_command(&cnitool());
        cmd.arg(verb.as_str())
            .arg(network)
            .arg(netns)
            .env("NETCONFPATH", self.conf_dir())
            .env("CNI_PATH", self.cni_bin_dir())
            .env_remove("CNI_IFNAME")
            .env_remove("CNI_ARGS")
            .env_remove("CAP_ARGS");
        cmd
    }

    /// `cnirunner <verb>` on Debian's libcni 1.1.2 inside the node netns
    /// ([`Driver::Runner`]), for what cnitool cannot do: a container ID of
    /// the test's choosing, a DEL with an empty `netns` (the sandbox gone),
    /// the CNI error code ([`CniOutcome::assert_cni_error`]).
    #[allow(clippy::too_many_arguments)]
    pub fn runner(
        &self,
        verb: Verb,
        network: &str,
        netns: &Path,
        container_id: &str,
        ifname: &str,
        args: Option<&str>,
        capability_args: Option<Value>,
    ) -> CniOutcome {
        let mut cmd = self.runner_command(&cnirunner(), verb, network);
        cmd.arg("--netns")
            .arg(netns)
            .arg("--container-id")
            .arg(container_id)
            .arg("--ifname")
            .arg(ifname);
        if let Some(a) = args {
            cmd.arg("--args").arg(a);
        }
        if let Some(c) = capability_args {
            cmd.arg("--capability-args").arg(c.to_string());
        }
        self.run(Driver::Runner, verb, cmd, Some(container_id.to_string()))
    }

    /// libcni 1.3's GC of `network` with `valid` (container ID, ifname) as
    /// the valid attachments ([`Driver::RunnerLibcni13`]; cnitool sends none).
    pub fn runner_gc(&self, network: &str, valid: &[(&str, &str)]) -> CniOutcome {
        let list: Vec<Value> = valid
            .iter()
            .map(|(c, i)| json!({"containerID": c, "ifname": i}))
            .collect();
        let mut cmd = self.runner_command(&cnirunner_libcni13(), Verb::Gc, network);
        cmd.arg("--valid-attachments")
            .arg(Value::from(list).to_string());
        self.run(Driver::RunnerLibcni13, Verb::Gc, cmd, None)
    }

    /// libcni 1.3's STATUS of `network`, with the CNI error code.
    pub fn runner_status(&self, network: &str) -> CniOutcome {
        let cmd = self.runner_command(&cnirunner_libcni13(), Verb::Status, network);
        self.run(Driver::RunnerLibcni13, Verb::Status, cmd, None)
    }

    /// `<runner> <verb> --conf-dir net.d --name <network> --cni-path cni-bin`
    /// (libcni's cache: its default, the node's `/var/lib/cni`).
    fn runner_command(&self, runner: &Path, verb: Verb, network: &str) -> Command {
        let mut cmd = self.libcni_command(runner);
        cmd.arg(verb.as_str())
            .arg("--conf-dir")
            .arg(self.conf_dir())
            .arg("--name")
            .arg(network)
            .arg("--cni-path")
            .arg(self.cni_bin_dir());
        cmd
    }

    /// `program` inside the node netns and a private mount namespace in which
    /// the node's `var-lib/` is `/var/lib` (libcni's cache is
    /// `/var/lib/cni`), bounded by `timeout(1)`, with the node's extra env.
    fn libcni_command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("timeout");
        cmd.args([
            "--kill-after=5",
            CNI_TIMEOUT_SECS,
            "ip",
            "netns",
            "exec",
            self.ns.name(),
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            r#"mount --bind "$0" /var/lib && exec "$@""#,
        ])
        .arg(self.var_lib_dir())
        .arg(program)
        .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null());
        cmd
    }

    fn run(
        &self,
        driver: Driver,
        verb: Verb,
        mut cmd: Command,
        container_id: Option<String>,
    ) -> CniOutcome {
        let command = format!("{cmd:?}");
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("spawning {command}: {e}"));
        CniOutcome::new(driver, verb, command, out, container_id)
    }

    /// ADD `pod` (ifname eth0) to `network` through cnitool; panics unless it
    /// succeeds. Returns the CNI result.
    pub fn add(&self, network: &str, pod: &Netns) -> Value {
        let out = self.cni(Verb::Add, network, pod, "eth0", None, None);
        out.assert_ok();
        out.result.unwrap_or(Value::Null)
    }

    /// CHECK `pod` (ifname eth0) on `network` through cnitool.
    pub fn check(&self, network: &str, pod: &Netns) -> CniOutcome {
        self.cni(Verb::Check, network, pod, "eth0", None, None)
    }

    /// DEL `pod` (ifname eth0) from `network` through cnitool.
    pub fn del(&self, network: &str, pod: &Netns) -> CniOutcome {
        self.cni(Verb::Del, network, pod, "eth0", None, None)
    }

    /// Snapshot of the node netns (see [`crate::snapshot()`]).
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

/// What one libcni invocation did.
pub struct CniOutcome {
    pub driver: Driver,
    pub verb: Verb,
    /// The command line, for messages.
    pub command: String,
    /// The attachment's container ID (cnitool's is derived from the netns
    /// path); none for GC and STATUS.
    pub container_id: Option<String>,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// Parsed stdout of a successful ADD.
    pub result: Option<Value>,
    /// The runner's `CNI_ERROR {...}` line (`{"code","msg","details"}`), if
    /// any (cnitool prints only the message: [`CniOutcome::error_msg`]).
    pub error: Option<Value>,
}

impl CniOutcome {
    fn new(
        driver: Driver,
        verb: Verb,
        command: String,
        out: std::process::Output,
        container_id: Option<String>,
    ) -> CniOutcome {
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
            driver,
            verb,
            command,
            container_id,
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

    /// Exit code: 0 ok; the runner's 2 for a CNI error (see
    /// [`CniOutcome::error`]), 1 for any other failure (cnitool: any
    /// failure); 124/137 timeout.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// The CNI error code, if the plugin chain failed with a CNI error.
    pub fn error_code(&self) -> Option<u64> {
        self.error.as_ref().and_then(|e| e["code"].as_u64())
    }

    /// The CNI error message, if any: the runner's `msg`; cnitool's last
    /// stderr line of a failure (libcni's `msg; details`).
    pub fn error_msg(&self) -> Option<&str> {
        match self.driver {
            Driver::Cnitool if !self.success() => {
                self.stderr.lines().rev().find(|l| !l.trim().is_empty())
            }
            Driver::Cnitool => None,
            Driver::Runner | Driver::RunnerLibcni13 => {
                self.error.as_ref().and_then(|e| e["msg"].as_str())
            }
        }
    }

    /// Panics unless it failed; returns the failure's message.
    pub fn assert_failed(&self) -> &str {
        assert!(
            !self.success(),
            "expected CNI {} to fail:\n{self:?}",
            self.verb
        );
        self.error_msg().unwrap_or_default()
    }

    /// Panics (showing the command and its output) unless it succeeded.
    pub fn assert_ok(&self) -> &Self {
        assert!(self.success(), "CNI {} failed:\n{self:?}", self.verb);
        self
    }

    /// Panics unless it failed with a CNI error of `code` (a runner's call:
    /// cnitool does not print the code).
    pub fn assert_cni_error(&self, code: u64) -> &Self {
        assert!(
            self.driver != Driver::Cnitool,
            "cnitool prints no CNI error code: drive this call through TestNode::runner\n{self:?}"
        );
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
