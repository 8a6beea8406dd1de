//! Soak: many ADD/DEL cycles of podgate-router with random profiles, each
//! plugin process driven directly (env + stdin, spawned into the node netns,
//! as a runtime's libcni runs it), against a real veth'd pod netns. Afterwards
//! nothing may be left: no route, rule, nftables table or address in the node
//! or the pod netns, no state file, the pod's sysctls back to what they were;
//! no plugin process may end with an fd still open (beyond stdio), every fd a
//! plugin opens is close-on-exec and no plugin starts a child (strace, when
//! installed); peak RSS of the last cycles equals the first (within noise).
//!
//! Root only. 200 cycles by default (debug build: ~10 s);
//! `PODGATE_SOAK_CYCLES=2000` for the long run, `PODGATE_SOAK_SEED` to
//! replay a run, `PODGATE_SOAK_REPORT=path` writes a JSON summary
//! (integration/bench/run.sh uses it with the release build:
//! `PODGATE_BIN_DIR=target/release`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::{
    assert_same, built, output_text, require_root, snapshot, target_dir, Netns, Run, TempDir,
};
use serde_json::{json, Value};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Once;
use std::time::Instant;

const PLUGIN: &str = "podgate-router";
const NET: &str = "soaknet";

/// The plugin binary, built first if missing or stale.
fn plugin() -> PathBuf {
    built(&[PLUGIN], &["-p", PLUGIN]).remove(0)
}

/// A shared object that, preloaded into a plugin, writes at exit(3) its peak
/// RSS (VmHWM of its own address space: wait4's ru_maxrss would also count
/// the test process's pages the child shared before exec) and every fd still
/// open beyond stdio (what a leaked handle looks like) to $PODGATE_FD_REPORT.
/// Built once with the system C compiler.
fn fd_shim() -> PathBuf {
    static BUILD: Once = Once::new();
    let dir = target_dir().join("soak");
    let so = dir.join("fdreport.so");
    BUILD.call_once(|| {
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("fdreport.c");
        std::fs::write(&src, FD_SHIM_C).unwrap();
        let tmp = dir.join(format!("fdreport.{}.so", std::process::id()));
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output()
            .expect("running cc (the soak test preloads a small C shim)");
        assert!(out.status.success(), "{}", output_text(&out));
        std::fs::rename(&tmp, &so).unwrap();
    });
    so
}

const FD_SHIM_C: &str = r#"
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((destructor)) static void podgate_fd_report(void) {
    const char *out = getenv("PODGATE_FD_REPORT");
    if (!out) return;
    int o = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (o < 0) return;
    DIR *d = opendir("/proc/self/fd");
    if (!d) { close(o); return; }
    int dfd = dirfd(d);
    struct dirent *e;
    char path[64], target[512], line[700];
    long hwm = -1;
    FILE *st = fopen("/proc/self/status", "re");
    if (st) {
        while (fgets(line, sizeof line, st))
            if (sscanf(line, "VmHWM: %ld kB", &hwm) == 1) break;
        fclose(st);
    }
    int n0 = snprintf(line, sizeof line, "exit hwm %ld\n", hwm);
    if (n0 > 0) write(o, line, (size_t)n0);
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        int fd = atoi(e->d_name);
        if (fd <= 2 || fd == dfd || fd == o) continue;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = 0;
        int fl = fcntl(fd, F_GETFD);
        int len = snprintf(line, sizeof line, "fd %d %s %s\n", fd,
                           (fl >= 0 && (fl & FD_CLOEXEC)) ? "cloexec" : "inheritable", target);
        if (len > 0) write(o, line, (size_t)len);
    }
    closedir(d);
    close(o);
}
"#;

/// The node and one pod, linked by a veth pair (node pgsk0 10.22.0.1/24, pod
/// eth0 10.22.0.5/24, default route via the node), IPv6 off on both so that
/// before/after snapshots are exact.
struct Rig {
    pod: Netns,
    node: Netns,
    node_fd: File,
    dir: TempDir,
}

impl Rig {
    fn new() -> Rig {
        require_root();
        let node = Netns::new_with_forwarding("soak-node", true);
        let pod = Netns::new("soak-pod");
        pod.set_forwarding(false);
        for ns in [&node, &pod] {
            ns.sysctl_set("net.ipv6.conf.default.disable_ipv6", "1");
            ns.sysctl_set("net.ipv6.conf.all.disable_ipv6", "1");
        }
        node.exec_ok(&[
            "ip",
            "link",
            "add",
            "pgsk0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ]);
        node.exec_ok(&["ip", "addr", "add", "10.22.0.1/24", "dev", "pgsk0"]);
        node.exec_ok(&["ip", "link", "set", "pgsk0", "up"]);
        pod.exec_ok(&["ip", "addr", "add", "10.22.0.5/24", "dev", "eth0"]);
        pod.exec_ok(&["ip", "link", "set", "eth0", "up"]);
        pod.exec_ok(&["ip", "route", "add", "default", "via", "10.22.0.1"]);
        let node_fd = File::open(node.path()).unwrap();
        Rig {
            pod,
            node,
            node_fd,
            dir: TempDir::new("soak"),
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn conf(&self, annotations: Option<Value>) -> Vec<u8> {
        let fwd = json!({"net.ipv4.ip_forward": "1"});
        let mut c = json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "type": PLUGIN,
            "stateDir": self.state_dir(),
            "capabilities": {"io.kubernetes.cri.pod-annotations": true},
            "profiles": {
                "vpn-gateway": {"sysctls": fwd, "masquerade": [{"source": "10.8.0.0/24"}]},
                "vpn-routed": {"sysctls": fwd, "returnRoutes": [{"dst": "10.8.0.0/24"}]},
                "vpn-full": {
                    "sysctls": {"net.ipv4.ip_forward": "1", "net.ipv4.conf.IFNAME.rp_filter": "2"},
                    "masquerade": [{"source": "10.8.0.0/24"}],
                    "returnRoutes": [{"dst": "10.8.0.0/24"}],
                    "podRoutes": [{"dst": "10.9.0.0/24", "gw": "10.22.0.1"}]
                }
            },
            "assign": [
                {"namespace": "soak", "podName": "gw", "profile": "vpn-gateway"},
                {"namespace": "soak", "podName": "routed", "profile": "vpn-routed"},
                {"namespace": "soak", "podName": "full", "profile": "vpn-full"}
            ],
            "allow": {"annotationNamespaces": ["soak"], "pools": ["10.8.0.0/16"]},
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "pgsk0"}, {"name": "eth0", "sandbox": self.pod.path()}],
                "ips": [{"address": "10.22.0.5/24", "gateway": "10.22.0.1", "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}]
            }
        });
        if let Some(a) = annotations {
            c["runtimeConfig"] = json!({"io.kubernetes.cri.pod-annotations": a});
        }
        serde_json::to_vec(&c).unwrap()
    }

    fn env(&self, cmd: &str, cid: &str, pod_name: &str) -> Vec<(String, String)> {
        [
            ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin".to_string()),
            ("CNI_COMMAND", cmd.to_string()),
            ("CNI_CONTAINERID", cid.to_string()),
            ("CNI_NETNS", self.pod.path().display().to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", "/usr/lib/cni".to_string()),
            (
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=soak;K8S_POD_NAME={pod_name}"),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Runs `argv` with `env` and `stdin`, entering the node netns between
    /// fork and exec (no `ip netns exec` in between: what is timed is the
    /// plugin process alone). Returns what it printed and its status, and
    /// how long it ran (ms).
    fn spawn(&self, argv: &[&Path], env: &[(String, String)], stdin: &[u8]) -> (Run, f64) {
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let fd = self.node_fd.as_raw_fd();
        // SAFETY: setns(2) and close_range(2) are async-signal-safe; fd stays
        // open until exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Only stdio crosses exec, as from a container runtime: fds
                // the test harness inherited (cargo's jobserver, ...) must not
                // be mistaken for the plugin's own.
                let all = libc::c_uint::MAX;
                if libc::syscall(libc::SYS_close_range, 3, all, libc::CLOSE_RANGE_CLOEXEC) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let t0 = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
        {
            let mut sin = child.stdin.take().unwrap();
            let _ = sin.write_all(stdin);
        }
        let mut stderr = child.stderr.take().unwrap();
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let mut stdout = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        let status = child.wait().unwrap();
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        use std::os::unix::process::ExitStatusExt;
        let run = Run {
            code: status.code(),
            signal: status.signal(),
            stdout,
            stderr: err_reader.join().unwrap(),
        };
        (run, ms)
    }
}

/// xorshift64*: reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What one cycle asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Gateway,
    Routed,
    Full,
    /// Profile by annotation, with its own pools.
    Annotated,
    /// No profile: passed through untouched.
    None,
}

const VARIANTS: [Variant; 5] = [
    Variant::Gateway,
    Variant::Routed,
    Variant::Full,
    Variant::Annotated,
    Variant::None,
];

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    let k = ((p / 100.0 * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[k - 1]
}

fn median_i64(v: &[i64]) -> i64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

/// Every fd-creating syscall in an strace -ff log that leaves an fd without
/// close-on-exec, and every child process or exec (threads are fine).
fn cloexec_violations(text: &str, first_file: bool) -> Vec<String> {
    let mut bad = Vec::new();
    let mut execs = 0;
    for line in text.lines() {
        let Some((call, ret)) = line.rsplit_once(" = ") else {
            continue;
        };
        let ok_fd = ret
            .split_whitespace()
            .next()
            .and_then(|r| r.parse::<i64>().ok());
        let name = call.split('(').next().unwrap_or_default().trim();
        let flagged = |flag: &str| call.contains(flag);
        let fd_made = ok_fd.is_some_and(|fd| fd >= 0);
        let violation = match name {
            "open" | "openat" | "openat2" | "pipe2" | "dup3" => fd_made && !flagged("O_CLOEXEC"),
            "socket" | "socketpair" | "accept4" => fd_made && !flagged("SOCK_CLOEXEC"),
            "accept" | "pipe" | "dup" | "inotify_init" | "epoll_create" | "eventfd" => fd_made,
            "dup2" => ok_fd.is_some_and(|fd| fd > 2),
            "fcntl" => fd_made && flagged("F_DUPFD") && !flagged("F_DUPFD_CLOEXEC"),
            "eventfd2" => fd_made && !flagged("EFD_CLOEXEC"),
            "epoll_create1" => fd_made && !flagged("EPOLL_CLOEXEC"),
            "memfd_create" => fd_made && !flagged("MFD_CLOEXEC"),
            "signalfd4" => fd_made && !flagged("SFD_CLOEXEC"),
            "timerfd_create" => fd_made && !flagged("TFD_CLOEXEC"),
            "inotify_init1" => fd_made && !flagged("IN_CLOEXEC"),
            "clone" | "clone3" => ok_fd.is_some_and(|p| p > 0) && !flagged("CLONE_THREAD"),
            "fork" | "vfork" => true,
            "execve" | "execveat" => {
                execs += 1;
                !first_file || execs > 1
            }
            _ => false,
        };
        if violation {
            bad.push(line.to_string());
        }
    }
    bad
}

fn strace_available() -> bool {
    Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs one plugin call under `strace -f -ff` and returns the violations.
fn audit_fds(rig: &Rig, env: &[(String, String)], stdin: &[u8], tag: &str) -> Vec<String> {
    let dir = rig.dir.path().join(format!("strace-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = dir.join("trace");
    let strace = PathBuf::from("strace");
    let ff = PathBuf::from("-ff");
    let qq = PathBuf::from("-qq");
    let o = PathBuf::from("-o");
    let plugin = plugin();
    let (run, _) = rig.spawn(&[&strace, &ff, &qq, &o, &prefix, &plugin], env, stdin);
    assert_eq!(run.code, Some(0), "under strace {tag}: {run:?}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    // The process's own file has the lowest pid (threads come later).
    files.sort_by_key(|p| {
        p.extension()
            .and_then(|e| e.to_str())
            .and_then(|e| e.parse::<u64>().ok())
            .unwrap_or(u64::MAX)
    });
    let mut bad = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let text = std::fs::read_to_string(f).unwrap();
        bad.extend(
            cloexec_violations(&text, i == 0)
                .into_iter()
                .map(|l| format!("{tag}: {l}")),
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    bad
}

#[test]
fn soak_add_del_cycles_leave_nothing_behind() {
    let rig = Rig::new();
    let plugin = plugin();
    let shim = fd_shim();
    let cycles: usize = std::env::var("PODGATE_SOAK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed: u64 = std::env::var("PODGATE_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!(
        "soak: {cycles} cycles, PODGATE_SOAK_SEED={seed}, plugin {}",
        plugin.display()
    );
    let mut rng = Rng(seed);

    let node_before = snapshot(&rig.node);
    let pod_before = snapshot(&rig.pod);
    let rp_before = rig.pod.sysctl_get("net.ipv4.conf.eth0.rp_filter");
    let report = rig.dir.path().join("fd-report");
    assert!(
        strace_available(),
        "the soak's close-on-exec audit needs strace (integration/install-deps.sh installs it)"
    );
    let mut audited: Vec<Variant> = Vec::new();
    let mut fd_problems: Vec<String> = Vec::new();

    let mut add_ms = Vec::new();
    let mut del_ms = Vec::new();
    // Peak RSS (KiB, VmHWM at exit) per variant, ADD and DEL, in cycle order.
    let mut rss: Vec<(Variant, i64, i64)> = Vec::new();

    for i in 0..cycles {
        let v = VARIANTS[rng.below(VARIANTS.len() as u64) as usize];
        let (pod_name, ann) = match v {
            Variant::Gateway => ("gw", None),
            Variant::Routed => ("routed", None),
            Variant::Full => ("full", None),
            Variant::None => ("web", None),
            Variant::Annotated => {
                let pool = format!("10.8.{}.0/24", 1 + rng.below(250));
                (
                    "annotated",
                    Some(json!({
                        "podgate.dev/profile": "vpn-full",
                        "podgate.dev/masquerade": pool,
                        "podgate.dev/return-routes": pool,
                    })),
                )
            }
        };
        let conf = rig.conf(ann);
        let cid = format!("soak-{i}");
        let mut calls = [("ADD", 0.0, 0), ("DEL", 0.0, 0)];
        for call in calls.iter_mut() {
            let mut env = rig.env(call.0, &cid, pod_name);
            if !audited.contains(&v) {
                fd_problems.extend(audit_fds(&rig, &env, &conf, &format!("{v:?}-{}", call.0)));
                if call.0 == "DEL" {
                    audited.push(v);
                }
                // The audited call did the work; the timed one below repeats
                // it (ADD replaces, DEL is idempotent).
            }
            let _ = std::fs::remove_file(&report);
            env.push(("LD_PRELOAD".into(), shim.display().to_string()));
            env.push(("PODGATE_FD_REPORT".into(), report.display().to_string()));
            let (run, ms) = rig.spawn(&[&plugin], &env, &conf);
            assert_eq!(
                run.code,
                Some(0),
                "cycle {i} {v:?} {} in {ms:.1} ms: {run:?}",
                call.0
            );
            if call.0 == "ADD" {
                let out: Value = serde_json::from_str(run.stdout.trim())
                    .unwrap_or_else(|e| panic!("cycle {i} ADD stdout: {e}: {run:?}"));
                assert_eq!(out["cniVersion"], "1.0.0", "{out}");
            } else {
                assert!(run.stdout.trim().is_empty(), "DEL printed {:?}", run.stdout);
            }
            match std::fs::read_to_string(&report) {
                Ok(text) => {
                    assert!(text.starts_with("exit hwm "), "{text}");
                    call.2 = text
                        .lines()
                        .next()
                        .and_then(|l| l.strip_prefix("exit hwm "))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(-1);
                    fd_problems.extend(
                        text.lines()
                            .skip(1)
                            .map(|l| format!("cycle {i} {v:?} {}: open at exit: {l}", call.0)),
                    );
                }
                Err(e) => fd_problems.push(format!(
                    "cycle {i} {v:?} {}: no fd report ({e}): exited without exit(3)?",
                    call.0
                )),
            }
            call.1 = ms;
        }
        add_ms.push(calls[0].1);
        del_ms.push(calls[1].1);
        rss.push((v, calls[0].2, calls[1].2));

        // Every 25th cycle (and the last), the node and the pod are back to
        // the start between cycles, not only at the end.
        if i % 25 == 24 || i + 1 == cycles {
            assert_same(&node_before, &snapshot(&rig.node));
            assert_eq!(rig.pod.sysctl_get("net.ipv4.ip_forward"), "0", "cycle {i}");
        }
    }

    assert_same(&node_before, &snapshot(&rig.node));
    assert_same(&pod_before, &snapshot(&rig.pod));
    assert_eq!(rig.pod.sysctl_get("net.ipv4.ip_forward"), "0");
    assert_eq!(
        rig.pod.sysctl_get("net.ipv4.conf.eth0.rp_filter"),
        rp_before
    );
    let left = podgate_integration::state_files_in(&rig.state_dir());
    assert!(left.is_empty(), "state files left: {left:?}");
    assert!(
        fd_problems.is_empty(),
        "fd problems:\n{}",
        fd_problems.join("\n")
    );

    // RSS flat: per variant, the median of the last few ADDs is within noise
    // of the first few (each cycle is a fresh process: growth would mean the
    // plugin reads something that grows, e.g. leaked records).
    let mut rss_lines = Vec::new();
    let mut rss_ok = true;
    let (mut first_all, mut last_all) = (None, None);
    for v in VARIANTS {
        let adds: Vec<i64> = rss.iter().filter(|r| r.0 == v).map(|r| r.1).collect();
        if adds.len() < 4 {
            continue;
        }
        let w = (adds.len() / 4).clamp(1, 10);
        let first = median_i64(&adds[..w]);
        let last = median_i64(&adds[adds.len() - w..]);
        let tolerance = (first / 20).max(256);
        rss_ok &= last <= first + tolerance;
        rss_lines.push(format!(
            "{v:?}: first {first} KiB, last {last} KiB (n {}, window {w})",
            adds.len()
        ));
    }
    // The first and the last ADD of the richest profile, as the headline.
    let full: Vec<i64> = rss
        .iter()
        .filter(|r| r.0 == Variant::Full)
        .map(|r| r.1)
        .collect();
    if let (Some(f), Some(l)) = (full.first(), full.last()) {
        first_all = Some(*f);
        last_all = Some(*l);
    }
    let max_rss = rss.iter().map(|r| r.1.max(r.2)).max().unwrap_or(0);
    let summary = json!({
        "cycles": cycles,
        "seed": seed,
        "plugin": plugin,
        "add_p50_ms": pct(&add_ms, 50.0),
        "add_p99_ms": pct(&add_ms, 99.0),
        "del_p50_ms": pct(&del_ms, 50.0),
        "del_p99_ms": pct(&del_ms, 99.0),
        "rss_first_kib": first_all,
        "rss_last_kib": last_all,
        "rss_max_kib": max_rss,
        "rss_per_variant": rss_lines,
        "cloexec_audit": "strace: every fd-creating syscall had CLOEXEC, no child",
        "ok": rss_ok,
        "detail": if rss_ok { "nothing left; RSS flat".to_string() } else { format!("RSS grew: {}", rss_lines.join("; ")) },
    });
    eprintln!("soak: {summary}");
    if let Ok(path) = std::env::var("PODGATE_SOAK_REPORT") {
        std::fs::write(&path, serde_json::to_vec_pretty(&summary).unwrap()).unwrap();
    }
    assert!(rss_ok, "peak RSS grew over the soak: {rss_lines:?}");
}
