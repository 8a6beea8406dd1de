//! A real containerd (Debian's, with its CRI plugin) running inside a test
//! node's netns, so that every CNI call it makes lands in that netns.
//!
//! * started with `nsenter --net=<node netns> containerd --config <file>`
//!   (`ip netns exec` would remount /sys and lose the cgroup mounts);
//! * everything private: root, state, runc root, `opt`, gRPC/ttrpc sockets,
//!   CNI `bin_dir`/`conf_dir` (the [`TestNode`]'s `cni-bin/` and `net.d/`);
//! * a pause image built here (a static C `pause`, an OCI layout, `ctr
//!   images import`); images are pulled only from a registry a test runs
//!   in the node netns ([`Containerd::mirror`], [`crate::registry`]);
//! * stopped by its PID on every exit path (Drop, also while unwinding):
//!   containerd, then every sandbox process and shim it left, then every
//!   mount under its dirs, the shims' sockets and the pods' cgroups.
//!
//! The kubelet's side of CRI (run, stop, remove sandboxes) is [`crate::cri`].

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use crate::netns::sigkill;
use crate::{output_text, random_suffix, run_ok, target_dir, TestNode};

/// The pause image every sandbox of the test containerd uses.
pub const PAUSE_IMAGE: &str = "localhost/podgate/pause:test";
/// containerd's CRI namespace.
const CRI_NAMESPACE: &str = "k8s.io";
/// How long containerd gets to open its socket / to exit on SIGTERM.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

const PAUSE_C: &str = r#"#include <signal.h>
#include <unistd.h>
static void bye(int s) { (void)s; _exit(0); }
int main(void) {
    signal(SIGINT, bye);
    signal(SIGTERM, bye);
    for (;;) pause();
}
"#;

/// containerd running in `node`'s netns. Owns the node: dropping it stops
/// containerd and everything it started, then removes the node.
pub struct Containerd {
    child: Option<Child>,
    /// The pod cgroup parent tests should put their sandboxes under
    /// (`LinuxPodSandboxConfig.cgroup_parent`), removed on drop.
    cgroup_parent: String,
    // Dropped last (after `Drop::drop` has stopped everything).
    node: TestNode,
}

impl Containerd {
    /// Starts containerd for `node` (CNI dirs: the node's `cni-bin/` and
    /// `net.d/`) and imports the pause image.
    pub fn start(node: TestNode) -> Containerd {
        let image = pause_image();
        let mut c = Containerd {
            child: None,
            cgroup_parent: format!("/podgate-it-{}-{}", std::process::id(), random_suffix()),
            node,
        };
        for d in ["root", "state", "runc", "opt", "certs.d"] {
            fs::create_dir_all(c.dir().join(d)).unwrap();
        }
        fs::write(c.config_path(), c.config()).unwrap();
        c.spawn();
        c.import(&image);
        c
    }

    pub fn node(&self) -> &TestNode {
        &self.node
    }

    /// `ctr -n k8s.io images import <archive>`: an image the CRI can run.
    pub fn import(&self, archive: &Path) {
        run_ok(
            Command::new("ctr")
                .arg("--address")
                .arg(self.socket())
                .args(["-n", CRI_NAMESPACE, "images", "import"])
                .arg(archive)
                .stdin(Stdio::null()),
        );
    }

    /// Pulls of images named `registry/...` (`ghcr.io`, as an image name
    /// says it) go to `endpoint` (`http://10.250.0.1:5000`): a mirror entry
    /// in the CRI's registry hosts dir (`config_path`, read at every pull).
    /// The endpoint is the server as well, so that no pull falls back to the
    /// real registry (outside the namespaces a test made).
    pub fn mirror(&self, registry: &str, endpoint: &str) {
        let dir = self.dir().join("certs.d").join(registry);
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"{endpoint}\"\n\n\
                 [host.\"{endpoint}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .unwrap();
    }

    /// `<node>/containerd`: every file of this containerd.
    pub fn dir(&self) -> PathBuf {
        self.node.root().join("containerd")
    }

    /// The CRI (gRPC) socket.
    pub fn socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    /// `unix://<socket>`, as `--runtime-endpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// Where containerd keeps the pods' netns files
    /// (`netns_mounts_under_state_dir`).
    pub fn state_dir(&self) -> PathBuf {
        self.dir().join("state")
    }

    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir().join("containerd.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops containerd by its PID (SIGTERM, then SIGKILL) and starts it again
    /// on the same dirs; running sandboxes (their shims) stay up, as on a
    /// node whose containerd is restarted.
    pub fn restart(&mut self) {
        self.stop_daemon();
        self.spawn();
    }

    fn config_path(&self) -> PathBuf {
        self.dir().join("config.toml")
    }

    fn config(&self) -> String {
        let d = self.dir();
        let d = d.display();
        format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE here: without this runc fails with
  # "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{d}/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
"#,
            sock = self.socket().display(),
            bin = self.node.cni_bin_dir().display(),
            conf = self.node.conf_dir().display(),
        )
    }

    fn spawn(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir().join("containerd.log"))
            .unwrap();
        let sock = self.socket();
        let _ = fs::remove_file(&sock);
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.node.ns.path().display()))
            .arg("containerd")
            .arg("--config")
            .arg(self.config_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawning containerd (apt-get install containerd runc)");
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                panic!("containerd exited ({status}) at start:\n{}", self.log());
            }
            let up = Command::new("ctr")
                .arg("--address")
                .arg(&sock)
                .args(["-n", CRI_NAMESPACE, "version"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not answer on {} within {START_TIMEOUT:?}:\n{}",
                sock.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM containerd, SIGKILL after [`STOP_TIMEOUT`], reap it.
    fn stop_daemon(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill(2) on our own child's pid, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// (dev, inode) of every netns file containerd mounted.
    fn sandbox_netns(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for m in mounts_under(&self.dir()) {
            if let Ok(md) = fs::metadata(&m) {
                if md.is_file() {
                    out.push((md.dev(), md.ino()));
                }
            }
        }
        out
    }

    /// Everything containerd left: sandbox processes (by their netns),
    /// shims (in the node netns; the node's own Drop kills those too),
    /// shim sockets, mounts, cgroups.
    fn teardown(&mut self) {
        let shim_sockets = shim_sockets(&self.state_dir());
        self.stop_daemon();
        let netns = self.sandbox_netns();
        for _ in 0..50 {
            let pids = pids_in_netns(&netns);
            if pids.is_empty() {
                break;
            }
            // Sandbox processes of this test.
            sigkill(pids);
            std::thread::sleep(Duration::from_millis(20));
        }
        // Shims inside the test node's netns.
        sigkill(self.node.ns.pids());
        let mut mounts = mounts_under(&self.dir());
        // Deepest first.
        mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        for m in mounts {
            if let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
                // SAFETY: umount2 on a NUL-terminated path we own.
                let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                if rc != 0 {
                    eprintln!(
                        "warning: umount {}: {}",
                        m.display(),
                        std::io::Error::last_os_error()
                    );
                }
            }
        }
        for s in shim_sockets {
            let _ = fs::remove_file(s);
        }
        remove_cgroup_tree(&self.cgroup_parent);
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Mount points at or below `dir` (from /proc/self/mountinfo).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// A path field of `/proc/<pid>/mountinfo`, octal escapes undone.
pub fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// PIDs whose network namespace is one of `netns` ((dev, inode) pairs).
fn pids_in_netns(netns: &[(u64, u64)]) -> Vec<i32> {
    if netns.is_empty() {
        return Vec::new();
    }
    let me = std::process::id() as i32;
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|&pid| pid > 1 && pid != me)
        .filter(|pid| {
            fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| netns.contains(&(m.dev(), m.ino())))
        })
        .collect()
}

/// The shims' socket files (`<state>/io.containerd.runtime.v2.task/<ns>/<id>/address`
/// holds `unix:///run/containerd/s/<hash>`); a killed shim leaves its socket.
fn shim_sockets(state: &Path) -> Vec<PathBuf> {
    let tasks = state.join("io.containerd.runtime.v2.task");
    let mut out = Vec::new();
    for ns in fs::read_dir(tasks).into_iter().flatten().flatten() {
        for task in fs::read_dir(ns.path()).into_iter().flatten().flatten() {
            if let Ok(addr) = fs::read_to_string(task.path().join("address")) {
                if let Some(p) = addr.trim().strip_prefix("unix://") {
                    out.push(PathBuf::from(p));
                }
            }
        }
    }
    out
}

/// Removes `/sys/fs/cgroup/<controller>/<parent>` (and below) in every
/// hierarchy (v1 and v2), killing whatever process is still in it (a shim
/// or a container the netns kills missed, or one still exiting).
pub fn remove_cgroup_tree(parent: &str) {
    let rel = parent.trim_start_matches('/');
    if rel.is_empty() {
        return;
    }
    let root = Path::new("/sys/fs/cgroup");
    let mut roots = vec![root.to_path_buf()];
    roots.extend(
        fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir() && !p.is_symlink()),
    );
    for r in roots {
        rmdir_tree(&r.join(rel));
    }
}

fn rmdir_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            rmdir_tree(&e.path());
        }
    }
    // rmdir fails with EBUSY while a process is in the cgroup, and a
    // process killed a moment ago may still be in it.
    for attempt in 1.. {
        kill_members(dir);
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < 100 => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                eprintln!("warning: rmdir {}: {e}", dir.display());
                return;
            }
        }
    }
}

/// SIGKILL to every process in cgroup `dir`.
fn kill_members(dir: &Path) {
    let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    sigkill(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
}

/// Whether any cgroup dir of `parent` exists in any hierarchy.
pub fn cgroup_tree_exists(parent: &str) -> bool {
    let rel = parent.trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    root.join(rel).is_dir()
        || fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().join(rel).is_dir())
}

/// `<target>/podgate-pause/pause-oci.tar`, built once (per process, and under
/// a file lock across processes) from [`PAUSE_C`]: `gcc -static`, one layer,
/// an OCI image layout, tarred for `ctr images import`.
pub fn pause_image() -> PathBuf {
    static BUILD: Once = Once::new();
    let dir = target_dir().join("podgate-pause");
    let archive = dir.join("pause-oci.tar");
    BUILD.call_once(|| build_pause_image(&dir, &archive));
    assert!(archive.is_file(), "{} missing", archive.display());
    archive
}

fn build_pause_image(dir: &Path, archive: &Path) {
    fs::create_dir_all(dir).unwrap();
    let lock = File::create(dir.join("lock")).unwrap();
    // SAFETY: flock on a valid descriptor we own; released when it closes.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let source = dir.join("pause.c");
    if archive.is_file() && fs::read_to_string(&source).is_ok_and(|s| s == PAUSE_C) {
        return;
    }
    let work = dir.join("work");
    let _ = fs::remove_dir_all(&work);
    let rootfs = work.join("rootfs");
    fs::create_dir_all(&rootfs).unwrap();
    fs::write(&source, PAUSE_C).unwrap();
    run_ok(
        Command::new("gcc")
            .args(["-static", "-Os", "-o"])
            .arg(rootfs.join("pause"))
            .arg(&source),
    );
    oci_archive(
        &rootfs,
        &ImageConfig {
            name: PAUSE_IMAGE,
            entrypoint: &["/pause"],
            cmd: &[],
            user: "",
        },
        archive,
    );
    let _ = fs::remove_dir_all(&work);
}

/// An image's name and run config.
pub struct ImageConfig<'a> {
    /// `io.containerd.image.name`: what `ctr images import` names it.
    pub name: &'a str,
    pub entrypoint: &'a [&'a str],
    pub cmd: &'a [&'a str],
    /// `USER`; empty: root.
    pub user: &'a str,
}

/// `archive`: an OCI image layout (tar) of one layer holding `rootfs`, as
/// `ctr images import` takes it.
pub fn oci_archive(rootfs: &Path, image: &ImageConfig, archive: &Path) {
    let work = archive.with_extension("work");
    let _ = fs::remove_dir_all(&work);
    let blobs = work.join("layout/blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    let layer = work.join("layer.tar");
    run_ok(
        Command::new("tar")
            .args([
                "--sort=name",
                "--mtime=@0",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "-C",
            ])
            .arg(rootfs)
            .arg("-cf")
            .arg(&layer)
            .arg("."),
    );
    let blob = |path: &Path| -> (String, u64) {
        let out = run_ok(Command::new("sha256sum").arg(path));
        let digest = out.split_whitespace().next().unwrap().to_string();
        let size = fs::metadata(path).unwrap().len();
        fs::copy(path, blobs.join(&digest)).unwrap();
        (format!("sha256:{digest}"), size)
    };
    let (layer_digest, layer_size) = blob(&layer);
    let write_json = |name: &str, v: &serde_json::Value| -> PathBuf {
        let p = work.join(name);
        fs::write(&p, v.to_string()).unwrap();
        p
    };
    let config = write_json(
        "config.json",
        &serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": image.entrypoint, "Cmd": image.cmd, "User": image.user},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }),
    );
    let (config_digest, config_size) = blob(&config);
    let manifest = write_json(
        "manifest.json",
        &serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest, "size": layer_size}],
        }),
    );
    let (manifest_digest, manifest_size) = blob(&manifest);
    let layout = work.join("layout");
    let reference = image.name.rsplit_once(':').map_or("latest", |(_, t)| t);
    fs::write(
        layout.join("index.json"),
        serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest, "size": manifest_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": image.name,
                                "org.opencontainers.image.ref.name": reference},
            }],
        })
        .to_string(),
    )
    .unwrap();
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let tmp = archive.with_extension("tmp");
    let out = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&tmp)
        .arg(".")
        .output()
        .unwrap();
    assert!(out.status.success(), "tar: {}", output_text(&out));
    fs::rename(&tmp, archive).unwrap();
    let _ = fs::remove_dir_all(&work);
}
