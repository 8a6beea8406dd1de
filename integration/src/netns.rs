//! Named network namespaces managed with `ip netns`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, Once};
use std::time::Duration;

use crate::{output_text, random_suffix, run_ok, sanitize};

/// `ip netns add/del` mutate the shared `/var/run/netns` mount; serialise them
/// within the process to avoid the known first-use mount race.
static NETNS_LOCK: Mutex<()> = Mutex::new(());

const NETNS_DIR: &str = "/var/run/netns";

/// A named network namespace `pg-<prefix>-<pid>-<random>` with `lo` up.
///
/// Dropping it kills every process left inside and deletes it (also during a
/// panic unwind). Namespaces left behind by test processes that died without
/// unwinding (SIGKILL, abort) are reaped the first time a process creates one.
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
}

impl Netns {
    /// Creates a fresh namespace with `lo` up; sysctls are the kernel's
    /// defaults for a new netns (IPv4 forwarding off).
    pub fn new(prefix: &str) -> Netns {
        static REAP: Once = Once::new();
        REAP.call_once(reap_stale);

        let name = format!(
            "pg-{}-{}-{}",
            sanitize(prefix, 24),
            std::process::id(),
            random_suffix()
        );
        {
            let _guard = NETNS_LOCK.lock().unwrap_or_else(|p| p.into_inner());
            run_ok(Command::new("ip").args(["netns", "add", &name]));
        }
        // From here on, Drop cleans up even if a later step panics.
        let ns = Netns {
            path: Path::new(NETNS_DIR).join(&name),
            name,
        };
        ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// A namespace with exactly this name, for fixtures that name a fixed
    /// path (golden records). Must start with `pg-`; an existing one of that
    /// name (left by a killed test) is replaced.
    pub fn named(name: &str) -> Netns {
        assert!(
            name.starts_with("pg-"),
            "{name}: test namespaces start with pg-"
        );
        if Path::new(NETNS_DIR).join(name).exists() {
            destroy(name);
        }
        let ns = Netns {
            name: name.to_string(),
            path: Path::new(NETNS_DIR).join(name),
        };
        ns.add();
        ns
    }

    /// Deletes the namespace and makes a fresh one at the same path, as a
    /// node reboot does (everything inside is gone; `lo` up again).
    pub fn recreate(&self) {
        destroy(&self.name);
        self.add();
    }

    fn add(&self) {
        {
            let _guard = NETNS_LOCK.lock().unwrap_or_else(|p| p.into_inner());
            run_ok(Command::new("ip").args(["netns", "add", &self.name]));
        }
        self.exec_ok(&["ip", "link", "set", "lo", "up"]);
    }

    /// Like [`Netns::new`], then explicitly sets `net.ipv4.ip_forward` and
    /// `net.ipv6.conf.all.forwarding` to `forwarding`.
    pub fn new_with_forwarding(prefix: &str, forwarding: bool) -> Netns {
        let ns = Netns::new(prefix);
        ns.set_forwarding(forwarding);
        ns
    }

    /// Sets IPv4 and IPv6 forwarding in this namespace.
    pub fn set_forwarding(&self, forwarding: bool) {
        let v = if forwarding { "1" } else { "0" };
        self.sysctl_set("net.ipv4.ip_forward", v);
        self.sysctl_set("net.ipv6.conf.all.forwarding", v);
    }

    /// The `ip netns` name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mount path (`/var/run/netns/<name>`), usable as CNI_NETNS.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A `Command` running `program` inside the namespace
    /// (`ip netns exec <name> <program>`), for custom stdio / spawning.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `args[0] args[1..]` inside the namespace and returns its output.
    pub fn exec(&self, args: &[&str]) -> Output {
        let (program, rest) = args.split_first().expect("exec needs a program");
        let mut cmd = self.command(program);
        cmd.args(rest).stdin(Stdio::null());
        cmd.output()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"))
    }

    /// Like [`Netns::exec`] but panics (showing the output) on failure;
    /// returns stdout.
    pub fn exec_ok(&self, args: &[&str]) -> String {
        let out = self.exec(args);
        assert!(
            out.status.success(),
            "in netns {}: {args:?} failed\n{}",
            self.name,
            output_text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `sh -c script` inside the namespace.
    pub fn sh(&self, script: &str) -> Output {
        self.exec(&["sh", "-c", script])
    }

    /// Like [`Netns::sh`] but panics on failure; returns stdout.
    pub fn sh_ok(&self, script: &str) -> String {
        self.exec_ok(&["sh", "-c", script])
    }

    /// Spawns `args` inside the namespace with null stdio. The process is
    /// killed when the namespace is dropped, if still running.
    pub fn spawn(&self, args: &[&str]) -> Child {
        let (program, rest) = args.split_first().expect("spawn needs a program");
        let mut cmd = self.command(program);
        cmd.args(rest)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd.spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"))
    }

    /// Writes `value` to `/proc/sys/<key>` inside the namespace. `key` is in
    /// sysctl dotted form (`net.ipv4.ip_forward`) or already a path
    /// (`net/ipv4/conf/eth0.100/forwarding`).
    pub fn sysctl_set(&self, key: &str, value: &str) {
        let path = sysctl_path(key);
        let out = self.exec(&["sh", "-c", r#"echo "$1" > "$2""#, "sh", value, &path]);
        assert!(
            out.status.success(),
            "in netns {}: sysctl {key}={value} failed\n{}",
            self.name,
            output_text(&out)
        );
    }

    /// Reads `/proc/sys/<key>` inside the namespace (trimmed).
    pub fn sysctl_get(&self, key: &str) -> String {
        let path = sysctl_path(key);
        self.exec_ok(&["cat", &path]).trim().to_string()
    }

    /// PIDs of processes whose network namespace is this one.
    pub fn pids(&self) -> Vec<i32> {
        ns_pids(&self.name)
    }

    /// Whether a link named `ifname` exists in the namespace.
    pub fn link_exists(&self, ifname: &str) -> bool {
        self.exec(&["ip", "link", "show", "dev", ifname])
            .status
            .success()
    }

    /// Addresses (`addr/prefixlen`) of `ifname`, IPv4 first then IPv6, as
    /// reported by `ip -j addr show dev <ifname>`. Empty if it doesn't exist.
    pub fn addrs(&self, ifname: &str) -> Vec<String> {
        let out = self.exec(&["ip", "-j", "addr", "show", "dev", ifname]);
        if !out.status.success() {
            return Vec::new();
        }
        let links: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for link in links.as_array().into_iter().flatten() {
            for a in link["addr_info"].as_array().into_iter().flatten() {
                let (Some(local), Some(len)) = (a["local"].as_str(), a["prefixlen"].as_u64())
                else {
                    continue;
                };
                let s = format!("{local}/{len}");
                if a["family"] == "inet6" {
                    v6.push(s);
                } else {
                    v4.push(s);
                }
            }
        }
        v4.extend(v6);
        v4
    }

    /// First IPv4 address of `ifname` without prefix length, if any.
    pub fn ipv4(&self, ifname: &str) -> Option<String> {
        self.addrs(ifname)
            .into_iter()
            .find(|a| !a.contains(':'))
            .and_then(|a| a.split('/').next().map(str::to_string))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        destroy(&self.name);
    }
}

fn sysctl_path(key: &str) -> String {
    let rel = if key.contains('/') {
        key.trim_start_matches('/').to_string()
    } else {
        key.replace('.', "/")
    };
    format!("/proc/sys/{rel}")
}

fn ns_pids(name: &str) -> Vec<i32> {
    Command::new("ip")
        .args(["netns", "pids", name])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// SIGKILL to each of `pids` a test found in what it made (a netns, a
/// cgroup), never to init or this test process.
pub(crate) fn sigkill(pids: impl IntoIterator<Item = i32>) {
    for pid in pids {
        if pid > 1 && pid != std::process::id() as i32 {
            // SAFETY: plain kill(2); the pid is a process of the test's own
            // namespace or cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Kills everything inside `name`, then deletes it. Never panics (it runs
/// from Drop, possibly while unwinding).
fn destroy(name: &str) {
    for _ in 0..100 {
        let pids = ns_pids(name);
        if pids.is_empty() {
            break;
        }
        sigkill(pids);
        std::thread::sleep(Duration::from_millis(20));
    }
    let _guard = NETNS_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut last_err = String::new();
    for _ in 0..5 {
        match Command::new("ip").args(["netns", "del", name]).output() {
            Ok(o) if o.status.success() => return,
            Ok(o) => last_err = String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => last_err = e.to_string(),
        }
        if !Path::new(NETNS_DIR).join(name).exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("warning: ip netns del {name} failed: {last_err}");
}

/// Deletes `pg-*-<pid>-<rand>` namespaces whose creating process is gone.
fn reap_stale() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("pg-") {
            continue;
        }
        let mut parts = name.rsplitn(3, '-');
        let (Some(rand), Some(pid), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if rand.len() != 8 || !rand.chars().all(|c| c.is_ascii_hexdigit()) {
            continue;
        }
        if !Path::new(&format!("/proc/{pid}")).exists() {
            destroy(&name);
        }
    }
}
