//! Root-only integration-test harness for podgate.
//!
//! Everything happens inside network namespaces created (and always removed)
//! by this harness; the host's own networking is never touched:
//!
//! * [`Netns`]: a named netns (`ip netns add pg-<prefix>-<pid>-<rand>`) with
//!   `lo` up, deleted on drop together with every process left inside it.
//! * [`TestNode`]: a simulated Kubernetes node: its own netns plus a temp dir
//!   holding `net.d/`, `var-lib/` (the node's `/var/lib`, with libcni's cache
//!   in `var-lib/cni/`), `ipam/`, `state/` and `cni-bin/`. CNI calls go
//!   through upstream `cnitool` (or, for what it cannot do, `cnirunner`: see
//!   [`tools`]) executed inside the node netns, so bridges, routes and
//!   nftables rules land there.
//! * [`snapshot()`] / [`assert_same`]: before/after equality of routes, rules,
//!   nftables ruleset, links and addresses.
//! * [`ping`], [`tcp_listen`], [`tcp_connect_ok`], [`udp_answer`],
//!   [`udp_request`]: traffic between namespaces.
//! * [`agent::Agent`]: the node agent with its metrics endpoint in a node.
//! * [`cluster::Cluster`]: three nodes on one fabric (pod CIDRs routed
//!   host-gw style, a Service DNATed on every node), a backend on each and an
//!   OpenVPN client outside, for client pools that cross nodes.
//! * [`containerd::Containerd`]: a real containerd (CRI) running inside a
//!   node's netns, with a locally built pause image.
//! * [`ipsec::GuardNode`]: a node for podgate-tunnel-guard: a real
//!   `ovsdb-server`, the fixture IPsec agent and real XFRM policies.
//! * [`registry::Registry`]: a real registry (Debian's `docker-registry`)
//!   in a node's netns, that podman pushes to and containerd pulls from.
//!
//! Tests using it must run as root; call [`require_root`] first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod agent;
pub mod cluster;
pub mod containerd;
pub mod cri;
pub mod image;
pub mod intruder;
pub mod ipsec;
pub mod k8s;
mod netns;
mod node;
pub mod registry;
mod snapshot;
mod tcp;
pub mod tools;
mod udp;
pub mod vpn;

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub use netns::Netns;
pub use node::{
    bridge_name, cnitool_container_id, CniOutcome, Driver, Primaries, TestNode, Verb,
    SYSTEM_CNI_DIR,
};
pub use snapshot::{
    assert_same, claims_index_matches_records, snapshot, state_files, state_files_in, Snapshot,
};
pub use tcp::{
    http_get, in_netns, ping, tcp_connect_ok, tcp_listen, tcp_listen_bulk, tcp_listen_peer_echo,
    tcp_request, TcpServer,
};
pub use tools::{cnirunner, cnirunner_libcni13, cnitool, upstream_plugins_dir};
pub use udp::{udp_answer, udp_request, UdpServer};

/// Newest modification time of any file below `dir` (recursively).
fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest_mtime(&path)
        } else {
            entry.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}

/// Paths of every file and directory below `dir`, relative to it, sorted;
/// empty when `dir` does not exist.
pub fn files_below(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(path.clone());
            }
            if let Ok(rel) = path.strip_prefix(dir) {
                out.push(rel.display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// Workspace binaries `bins` (paths relative to [`bin_dir`]), built with
/// `cargo build <cargo_args>` first if any is missing or older than a source
/// under `plugins/` (`cargo test -p podgate-integration` alone builds no
/// binaries). Serialized within the process; cargo locks across processes.
pub fn built(bins: &[&str], cargo_args: &[&str]) -> Vec<PathBuf> {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let paths: Vec<PathBuf> = bins.iter().map(|b| bin_dir().join(b)).collect();
    let src = newest_mtime(&workspace_root().join("plugins"));
    let stale = paths.iter().any(|p| {
        let t = fs::metadata(p).and_then(|m| m.modified()).ok();
        t.is_none() || t < src
    });
    if stale {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-q"])
            .args(cargo_args)
            .current_dir(workspace_root());
        if bin_dir().file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("running cargo build");
        assert!(
            out.status.success(),
            "cargo build {cargo_args:?}:\n{}",
            output_text(&out)
        );
    }
    for p in &paths {
        assert!(p.is_file(), "{} missing", p.display());
    }
    paths
}

/// The three shipped binaries, `podgate`, `podgate-router` and
/// `podgate-tunnel-guard`, built together (see [`built`]).
pub fn built_shipped() -> Vec<PathBuf> {
    built(
        &["podgate", "podgate-router", "podgate-tunnel-guard"],
        &[
            "-p",
            "podgate",
            "-p",
            "podgate-router",
            "-p",
            "podgate-tunnel-guard",
        ],
    )
}

/// The `podgate` helper binary, built with the plugins first if missing or
/// stale (see [`built_shipped`]).
pub fn podgate_bin() -> PathBuf {
    built_shipped().remove(0)
}

/// `podgate <args>` on this machine, as root, run to its end by [`Run::of`]:
/// only for commands given a throwaway target (a test's netns, dirs, socket).
pub fn podgate(args: &[&str]) -> Run {
    require_root();
    Run::of(podgate_command().args(args))
}

/// The command that runs the `podgate` helper (built first if missing or
/// stale, through [`bin_runner`] when one is set), for what [`podgate`]
/// cannot take: paths, environment, a child kept running, a run without
/// root. Only for commands given a throwaway target.
pub fn podgate_command() -> Command {
    bin_command(&podgate_bin())
}

/// Panics with a clear message unless the effective user is root.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "podgate integration tests need root (they create network namespaces); \
         run them as root, e.g. `sudo -E cargo test -p podgate-integration` (euid is {euid})"
    );
}

/// The cargo workspace root (parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// `<target>/<profile>` derived from the running test executable
/// (`<target>/<profile>/deps/<test>-<hash>`), if it has that shape.
fn exe_profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    Some(deps.parent()?.to_path_buf())
}

/// The cargo target directory: `$CARGO_TARGET_DIR`, else the one the running
/// test binary lives in, else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return if dir.is_absolute() {
            dir
        } else {
            workspace_root().join(dir)
        };
    }
    exe_profile_dir()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Directory holding the `podgate-*` plugin binaries: `$PODGATE_BIN_DIR`, else
/// the profile dir of the running test binary (normally `target/debug`).
///
/// `cargo test -p podgate-integration` does not build the plugins; build them
/// first (`cargo build --bins`).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PODGATE_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    exe_profile_dir().unwrap_or_else(|| target_dir().join("debug"))
}

/// The program (and its arguments) that runs the plugin binaries:
/// `$PODGATE_BIN_RUNNER` split on whitespace, e.g. `qemu-aarch64-static` to
/// run another architecture's binaries from [`bin_dir`] (the arm64 image's,
/// `tests/image.rs`). Empty when the binaries run directly.
pub fn bin_runner() -> Vec<String> {
    std::env::var("PODGATE_BIN_RUNNER")
        .map(|r| r.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// A command that runs the plugin binary `bin` (through [`bin_runner`] when
/// one is set).
pub fn bin_command(bin: &Path) -> Command {
    let runner = bin_runner();
    match runner.split_first() {
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(bin);
            cmd
        }
        None => Command::new(bin),
    }
}

/// 8 random hex characters from the kernel's CSPRNG.
pub(crate) fn random_suffix() -> String {
    let mut buf = [0u8; 4];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("reading /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Keeps `[A-Za-z0-9_-]`, replaces anything else with `_`, caps the length.
pub(crate) fn sanitize(s: &str, max: usize) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(max)
        .collect();
    if cleaned.is_empty() {
        "x".to_string()
    } else {
        cleaned
    }
}

/// Human-readable status + stdout + stderr of a finished command.
pub fn output_text(out: &Output) -> String {
    format!(
        "status: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, panicking (with its output) unless it succeeds; returns stdout.
pub(crate) fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed\n{}",
        output_text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Spawns `cmd` with stdin and stdout piped (stderr as the caller set it,
/// inherited unless set), writes `input` to its stdin, closes it and
/// waits: how a runtime feeds a CNI plugin its config. A child that exits
/// or stops reading early is not an error here (some tests send input a
/// plugin refuses); its output tells what happened.
pub fn run_with_stdin(cmd: &mut Command, input: &[u8]) -> Run {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    if let Some(mut sin) = child.stdin.take() {
        let _ = sin.write_all(input);
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for {cmd:?}: {e}"));
    Run::from(out)
}

/// How a command run by [`run_with_stdin`], [`Run::of`] or [`podgate`]
/// ended, and what it printed.
pub struct Run {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(out: Output) -> Run {
        use std::os::unix::process::ExitStatusExt;
        Run {
            code: out.status.code(),
            signal: out.status.signal(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?} signal {:?}\nstdout: {}\nstderr: {}",
            self.code, self.signal, self.stdout, self.stderr
        )
    }
}

impl Run {
    /// Runs `cmd` (stdin closed, stdout and stderr captured) to its end.
    pub fn of(cmd: &mut Command) -> Run {
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
        Run::from(out)
    }

    /// stdout as one JSON document.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// stdout followed by stderr, as a terminal shows them.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Exited 0.
    pub fn ok(&self) -> &Self {
        assert_eq!(self.code, Some(0), "{self:?}");
        self
    }

    /// Killed by SIGKILL (a kill point).
    pub fn killed(&self) -> bool {
        self.signal == Some(libc::SIGKILL)
    }

    /// Failed with exit 1 and exactly one CNI error JSON on stdout, of
    /// this code and with a message.
    pub fn cni_error(&self, code: u64) -> serde_json::Value {
        assert_eq!(self.code, Some(1), "{self:?}");
        let v: serde_json::Value = serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {self:?}"));
        assert_eq!(v.get("code").and_then(|c| c.as_u64()), Some(code), "{v}");
        assert!(
            v.get("msg")
                .and_then(|m| m.as_str())
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        v
    }
}

/// A temporary directory removed (recursively) on drop.
#[derive(Debug)]
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// Creates `$TMPDIR/podgate-it-<prefix>-<random>` (mode 0700).
    pub fn new(prefix: &str) -> TempDir {
        match tempfile::Builder::new()
            .prefix(&format!("podgate-it-{}-", sanitize(prefix, 24)))
            .tempdir()
        {
            Ok(dir) => TempDir(dir),
            Err(e) => panic!("creating a temp dir podgate-it-{prefix}-*: {e}"),
        }
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}
