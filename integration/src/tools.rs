//! The Go programs that drive libcni and the upstream reference plugins:
//!
//! * [`cnitool`]: upstream `cnitool` (the libcni version
//!   `runner/go.mod` pins), built once per version by `go-tools.sh`;
//! * [`cnirunner`]: `runner/` on Debian's libcni 1.1.2, for what cnitool
//!   cannot do (a chosen container ID, a DEL without netns, the CNI error
//!   code);
//! * [`cnirunner_libcni13`]: the same source on libcni 1.3, for GC with a
//!   valid-attachments list and STATUS with its code;
//! * [`upstream_plugins_dir`]: the reference plugins v1.10.0 built by
//!   `go-tools.sh`, beside Debian's 1.1.1 in `/usr/lib/cni`.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::{output_text, target_dir, workspace_root};

/// `cnitool` (`$PODGATE_CNITOOL`, else built by `integration/go-tools.sh`).
pub fn cnitool() -> PathBuf {
    if let Some(path) = std::env::var_os("PODGATE_CNITOOL").filter(|d| !d.is_empty()) {
        return PathBuf::from(path);
    }
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let bin = DIR.get_or_init(|| go_tool_dir("cnitool")).join("cnitool");
    assert!(bin.is_file(), "cnitool missing at {}", bin.display());
    bin
}

/// The reference plugins v1.10.0 (`bridge`, `host-local`, `loopback`,
/// `portmap`, `ptp`, `tuning`), built by `integration/go-tools.sh`.
pub fn upstream_plugins_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| go_tool_dir("plugins")).clone()
}

/// `go-tools.sh dir NAME`: builds NAME unless cached, returns its directory.
fn go_tool_dir(name: &str) -> PathBuf {
    let script = workspace_root().join("integration").join("go-tools.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["dir", name])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} dir {name} failed\n{}",
        script.display(),
        output_text(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.is_empty() {
        eprint!("{stderr}");
    }
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Path of the runner on Debian's libcni 1.1.2 (`<target>/cnirunner`, or
/// `$PODGATE_CNIRUNNER`).
pub fn cnirunner() -> PathBuf {
    if let Some(path) = std::env::var_os("PODGATE_CNIRUNNER").filter(|d| !d.is_empty()) {
        return PathBuf::from(path);
    }
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build_runner("cnirunner", &[])).clone()
}

/// Path of the runner on libcni 1.3 (`<target>/cnirunner-libcni13`).
pub fn cnirunner_libcni13() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| build_runner("cnirunner-libcni13", &["--libcni13"]))
        .clone()
}

/// Builds `<target>/<name>` by `integration/runner/build.sh <flags>` when
/// missing or older than a file of `runner/`; a file lock keeps parallel
/// test processes from racing.
fn build_runner(name: &str, flags: &[&str]) -> PathBuf {
    let out = target_dir().join(name);
    let runner_dir = workspace_root().join("integration").join("runner");
    if let Some(parent) = out.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    let lock_path = out.with_extension("lock");
    let lock = File::create(&lock_path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", lock_path.display()));
    // SAFETY: flock on a valid, owned descriptor; released when `lock` closes.
    let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    assert!(
        rc == 0,
        "flock {}: {}",
        lock_path.display(),
        std::io::Error::last_os_error()
    );
    let mtime = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    let newest_source = fs::read_dir(&runner_dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", runner_dir.display()))
        .flatten()
        .filter_map(|e| mtime(&e.path()))
        .max();
    if mtime(&out).is_some_and(|bin| Some(bin) >= newest_source) {
        return out;
    }
    let output = Command::new("bash")
        .arg(runner_dir.join("build.sh"))
        .args(flags)
        .arg(&out)
        .output()
        .expect("running integration/runner/build.sh");
    assert!(
        output.status.success(),
        "building {name} failed ({}); run integration/install-deps.sh first\n{}",
        output.status,
        output_text(&output)
    );
    drop(lock);
    out
}
