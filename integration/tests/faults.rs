//! Faults with a defined outcome, each through the real binaries (root only):
//!
//! * the state dir is read-only (bind-mounted ro, or an ro tmpfs): ADD fails
//!   with code 5 naming the path and applies nothing; DEL fails the same way
//!   and keeps the node route and the record (the runtime retries), then
//!   converges once writable;
//! * the state dir is full (a tiny tmpfs): ADD fails with code 5 before
//!   applying anything (its write-ahead record is the first write);
//! * links and FIFOs planted in the state dir (by whoever can write it: the
//!   agent's container) as the event file, its in-flight directory, a lock
//!   file, a record, or the state dir itself: nothing is written through a
//!   link or created at its target, a lock link fails the call closed
//!   (code 5), GC does not block on a FIFO;
//! * a second ADD for the same container ID replaces the first: one route,
//!   one record, one masquerade rule; DEL then leaves nothing;
//! * an unwritable stderr (a full device) does not change the answer: the
//!   refusal still comes back as its own CNI error with exit 1;
//! * a panic still answers with one CNI error JSON on stdout
//!   (`plugins/cni/examples/panic.rs`: panics in ADD, DEL and on a thread);
//! * tunnel-guard: an OVSDB socket that accepts but never answers, and a
//!   protection.sock left behind by a crashed agent, fail ADD in bounded
//!   time with code 11 naming the cause.
//!
//! Mounts happen only inside a private mount namespace of the one plugin
//! process (`unshare -m`): nothing outlives it. Already covered elsewhere and
//! not repeated: hostile stdin/env (conformance.rs), netns deleted before DEL
//! (router.rs), agent hanging / garbage / absent and OVSDB dead
//! (tunnel_guard.rs).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::ipsec::{GuardNode, TIMEOUT_MS};
use podgate_integration::{
    assert_same, built, require_root, run_with_stdin, snapshot, Netns, Run, TempDir,
};
use serde_json::{json, Value};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROUTER: &str = "podgate-router";
const NET: &str = "faultnet";

fn router() -> PathBuf {
    built(&[ROUTER], &["-p", ROUTER]).remove(0)
}

fn panic_example() -> PathBuf {
    built(
        &["examples/panic"],
        &["-p", "podgate-cni", "--example", "panic"],
    )
    .remove(0)
}

/// A node netns and pods, pod `i` linked by veth `pgf<i>` (node side
/// 10.22.i.1/24) to its `eth0` (10.22.i.5/24). IPv6 off: snapshots are exact.
struct Rig {
    pods: Vec<Netns>,
    node: Netns,
    node_fd: File,
    dir: TempDir,
}

impl Rig {
    fn new(pods: usize) -> Rig {
        require_root();
        let node = Netns::new_with_forwarding("fault-node", true);
        node.sysctl_set("net.ipv6.conf.default.disable_ipv6", "1");
        node.sysctl_set("net.ipv6.conf.all.disable_ipv6", "1");
        let mut v = Vec::new();
        for i in 0..pods {
            let pod = Netns::new(&format!("fault-pod{i}"));
            pod.set_forwarding(false);
            pod.sysctl_set("net.ipv6.conf.default.disable_ipv6", "1");
            let host = format!("pgf{i}");
            node.exec_ok(&[
                "ip",
                "link",
                "add",
                &host,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                pod.name(),
            ]);
            node.exec_ok(&[
                "ip",
                "addr",
                "add",
                &format!("10.22.{i}.1/24"),
                "dev",
                &host,
            ]);
            node.exec_ok(&["ip", "link", "set", &host, "up"]);
            pod.exec_ok(&[
                "ip",
                "addr",
                "add",
                &format!("10.22.{i}.5/24"),
                "dev",
                "eth0",
            ]);
            pod.exec_ok(&["ip", "link", "set", "eth0", "up"]);
            v.push(pod);
        }
        let node_fd = File::open(node.path()).unwrap();
        Rig {
            pods: v,
            node,
            node_fd,
            dir: TempDir::new("faults"),
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Router config for pod `i`, profile vpn-full with `pool` by annotation.
    fn conf(&self, i: usize, pool: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "type": ROUTER,
            "stateDir": self.state_dir(),
            "capabilities": {"io.kubernetes.cri.pod-annotations": true},
            "profiles": {
                "vpn-full": {
                    "sysctls": {"net.ipv4.ip_forward": "1"},
                    "masquerade": [{"source": "10.8.0.0/24"}],
                    "returnRoutes": [{"dst": "10.8.0.0/24"}]
                }
            },
            "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]},
            "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {
                "podgate.dev/profile": "vpn-full",
                "podgate.dev/masquerade": pool,
                "podgate.dev/return-routes": pool,
            }},
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [{"name": format!("pgf{i}")},
                               {"name": "eth0", "sandbox": self.pods[i].path()}],
                "ips": [{"address": format!("10.22.{i}.5/24"), "gateway": format!("10.22.{i}.1"), "interface": 1}]
            }
        }))
        .unwrap()
    }

    fn env(&self, cmd: &str, i: usize, cid: &str) -> Vec<(String, String)> {
        vec![
            ("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into()),
            ("CNI_COMMAND".into(), cmd.into()),
            ("CNI_CONTAINERID".into(), cid.into()),
            (
                "CNI_NETNS".into(),
                self.pods[i].path().display().to_string(),
            ),
            ("CNI_IFNAME".into(), "eth0".into()),
            ("CNI_PATH".into(), "/usr/lib/cni".into()),
            (
                "CNI_ARGS".into(),
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-0".into(),
            ),
        ]
    }

    /// Runs `argv` in the node netns (entered between fork and exec).
    fn spawn(&self, argv: &[&str], env: &[(String, String)], stdin: &[u8], stderr: Stdio) -> Run {
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stderr(stderr);
        let fd = self.node_fd.as_raw_fd();
        // SAFETY: setns(2) and setrlimit(2) are async-signal-safe; fd stays
        // open until exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // A plugin that aborts (see the panic test) leaves no core file.
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::setrlimit(libc::RLIMIT_CORE, &none) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        run_with_stdin(&mut cmd, stdin)
    }

    fn router(&self, cmd: &str, i: usize, cid: &str, pool: &str) -> Run {
        let r = router();
        self.spawn(
            &[r.to_str().unwrap()],
            &self.env(cmd, i, cid),
            &self.conf(i, pool),
            Stdio::piped(),
        )
    }

    /// The router with the state dir replaced, inside a private mount
    /// namespace of that one process, by what `setup` (a shell snippet, the
    /// dir in "$d") makes of it. After the plugin, the shell lists the dir
    /// and its subdirectories on stderr (`STATE-LS:` lines, paths relative
    /// to it) so leftovers inside the mount are visible.
    fn router_with_state(&self, setup: &str, cmd: &str, i: usize, cid: &str, pool: &str) -> Run {
        let r = router();
        let script = format!(
            "set -e; d=\"$1\"; shift; {setup}; set +e; \"$@\"; rc=$?; \
             find \"$d\" -mindepth 1 -printf '%P\\n' | sed 's/^/STATE-LS: /' >&2; exit $rc"
        );
        let state = self.state_dir();
        self.spawn(
            &[
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
                "sh",
                state.to_str().unwrap(),
                r.to_str().unwrap(),
            ],
            &self.env(cmd, i, cid),
            &self.conf(i, pool),
            Stdio::piped(),
        )
    }

    fn routes(&self) -> String {
        self.node.exec_ok(&["ip", "route", "show", "table", "all"])
    }

    fn records(&self) -> Vec<String> {
        podgate_integration::state_files_in(&self.state_dir())
    }

    /// ip_forward and the podgate table of pod `i`.
    fn pod_state(&self, i: usize) -> (String, String) {
        let p = &self.pods[i];
        (
            p.sysctl_get("net.ipv4.ip_forward"),
            p.exec_ok(&["nft", "list", "ruleset"]),
        )
    }
}

fn state_ls(run: &Run) -> Vec<String> {
    run.stderr
        .lines()
        .filter_map(|l| l.strip_prefix("STATE-LS: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn read_only_state_dir_fails_cleanly_and_applies_nothing() {
    let rig = Rig::new(2);
    // Pod 0 is already set up; its record and the lock file exist.
    rig.router("ADD", 0, "ctr-0", "10.8.1.0/24").ok();
    assert_eq!(rig.records().len(), 1);
    assert_eq!(rig.pod_state(0).0, "1");
    let node_before = snapshot(&rig.node);
    let pod1_before = snapshot(&rig.pods[1]);
    let records_before = rig.records();

    let ro_bind = r#"mount --bind "$d" "$d"; mount -o remount,ro,bind "$d""#;
    let ro_tmpfs = r#"mount -t tmpfs -o ro,size=64k podgate-ro "$d""#;
    for (what, setup) in [("ro bind mount", ro_bind), ("empty ro tmpfs", ro_tmpfs)] {
        let run = rig.router_with_state(setup, "ADD", 1, "ctr-1", "10.8.2.0/24");
        let e = run.cni_error(5);
        let msg = e["msg"].as_str().unwrap();
        assert!(
            msg.contains(rig.state_dir().to_str().unwrap())
                && msg.contains("Read-only file system"),
            "{what}: the error names the dir and the cause: {msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
        assert_eq!(rig.pod_state(1), ("0".to_string(), String::new()), "{what}");
        assert_same(&node_before, &snapshot(&rig.node));
        assert_same(&pod1_before, &snapshot(&rig.pods[1]));
        assert_eq!(rig.records(), records_before, "{what}");
    }

    // DEL cannot take the lock either: it fails the same way, the node's
    // return route and the record stay (the pod side, undone first and
    // outside the lock, may already be gone), the runtime retries DEL, and
    // the retry converges once the dir is writable.
    let run = rig.router_with_state(ro_bind, "DEL", 0, "ctr-0", "10.8.1.0/24");
    let e = run.cni_error(5);
    assert!(
        e["msg"].as_str().unwrap().contains("Read-only file system"),
        "{e}"
    );
    assert!(rig.routes().contains("10.8.1.0/24 via 10.22.0.5"));
    assert_eq!(rig.records(), records_before);
    rig.router("DEL", 0, "ctr-0", "10.8.1.0/24").ok();
    assert!(!rig.routes().contains("10.8.1.0/24"));
    assert!(rig.records().is_empty(), "{:?}", rig.records());
    assert_eq!(rig.pod_state(0), ("0".to_string(), String::new()));
}

#[test]
fn full_state_dir_rolls_back_the_add() {
    let rig = Rig::new(1);
    let node_before = snapshot(&rig.node);
    let pod_before = snapshot(&rig.pods[0]);
    // A 16 KiB tmpfs filled to the last block: the lock file (an inode, no
    // data) can still be made; the record cannot be written.
    let full = r#"mkdir -p "$d"; mount -t tmpfs -o size=16k podgate-full "$d"; \
        dd if=/dev/zero of="$d/fill" bs=4k 2>/dev/null || true"#;
    let run = rig.router_with_state(full, "ADD", 0, "ctr-0", "10.8.3.0/24");
    let e = run.cni_error(5);
    let msg = e["msg"].as_str().unwrap();
    // The claims index, written ahead of the write-ahead record, is the
    // first write: it fails before anything is applied.
    assert!(msg.contains("No space left on device"), "{msg}");
    assert!(!msg.contains("rollback left"), "rollback incomplete: {msg}");
    // Nothing the ADD would apply is there.
    assert_eq!(rig.pod_state(0), ("0".to_string(), String::new()));
    assert_same(&node_before, &snapshot(&rig.node));
    assert_same(&pod_before, &snapshot(&rig.pods[0]));
    // No record, no claims index entry (it is written ahead of the
    // record: the index is never replaced here) and no half-written temp
    // file was left behind.
    let inside = state_ls(&run);
    let unexpected: Vec<&String> = inside
        .iter()
        .filter(|f| !matches!(f.as_str(), ".lock" | "fill"))
        .collect();
    assert!(unexpected.is_empty(), "a record was written: {inside:?}");
    // The runtime's DEL after the failed ADD succeeds and leaves nothing.
    rig.router("DEL", 0, "ctr-0", "10.8.3.0/24").ok();
    assert!(rig.records().is_empty());
    assert_same(&node_before, &snapshot(&rig.node));
}

#[test]
fn second_add_for_the_same_container_replaces_the_first() {
    let rig = Rig::new(1);
    let node_before = snapshot(&rig.node);
    let pod_before = snapshot(&rig.pods[0]);
    let one_rule = |pool: &str| {
        let (fwd, rules) = rig.pod_state(0);
        assert_eq!(fwd, "1");
        assert_eq!(rules.matches("masquerade").count(), 1, "{rules}");
        assert!(rules.contains(&format!("ip saddr {pool}")), "{rules}");
        assert_eq!(rules.matches("table inet").count(), 1, "{rules}");
    };

    rig.router("ADD", 0, "ctr-0", "10.8.4.0/24").ok();
    rig.router("ADD", 0, "ctr-0", "10.8.4.0/24").ok();
    let routes = rig.routes();
    assert_eq!(routes.matches("10.8.4.0/24").count(), 1, "{routes}");
    assert_eq!(rig.records().len(), 1, "{:?}", rig.records());
    one_rule("10.8.4.0/24");

    // The same attachment asking for another pool: the old one goes.
    rig.router("ADD", 0, "ctr-0", "10.8.5.0/24").ok();
    let routes = rig.routes();
    assert!(!routes.contains("10.8.4.0/24"), "{routes}");
    assert_eq!(routes.matches("10.8.5.0/24").count(), 1, "{routes}");
    assert_eq!(rig.records().len(), 1);
    one_rule("10.8.5.0/24");
    let rec: Value =
        serde_json::from_slice(&std::fs::read(rig.state_dir().join(&rig.records()[0])).unwrap())
            .unwrap();
    // What DEL will restore is the pod's value before podgate, not podgate's own.
    assert_eq!(rec["sysctls"][0]["name"], "net.ipv4.ip_forward", "{rec}");
    assert_eq!(rec["sysctls"][0]["previous"], "0", "{rec}");

    rig.router("DEL", 0, "ctr-0", "10.8.5.0/24").ok();
    assert!(rig.records().is_empty());
    assert_eq!(rig.pod_state(0), ("0".to_string(), String::new()));
    assert_same(&node_before, &snapshot(&rig.node));
    assert_same(&pod_before, &snapshot(&rig.pods[0]));
}

/// A state dir for planting links and FIFOs in, by whoever can write it
/// (the agent's container mounts it read-write), beside stand-ins for a
/// file and a directory of the node (`/etc/shadow`, `/etc/cron.d`) that
/// podgate-router (root) must never write through a link.
struct Planted {
    rig: Rig,
    node_file: PathBuf,
    node_dir: PathBuf,
}

const PLANTED_POOL: &str = "10.8.1.0/24";

impl Planted {
    fn new() -> Planted {
        let rig = Rig::new(1);
        let node_file = rig.dir.path().join("node-file");
        let node_dir = rig.dir.path().join("node-dir");
        std::fs::create_dir_all(rig.state_dir()).unwrap();
        std::fs::write(&node_file, "keep\n").unwrap();
        std::fs::create_dir_all(&node_dir).unwrap();
        Planted {
            rig,
            node_file,
            node_dir,
        }
    }

    fn link(&self, target: &std::path::Path, name: &str) {
        std::os::unix::fs::symlink(target, self.rig.state_dir().join(name)).unwrap();
    }

    fn router(&self, cmd: &str) -> Run {
        self.rig.router(cmd, 0, "ctr-0", PLANTED_POOL)
    }

    /// Neither stand-in was written through a link.
    fn untouched(&self, what: &str) {
        assert_eq!(
            std::fs::read_to_string(&self.node_file).unwrap(),
            "keep\n",
            "{what}: written through the link"
        );
        let in_dir: Vec<_> = std::fs::read_dir(&self.node_dir).unwrap().collect();
        assert!(
            in_dir.is_empty(),
            "{what}: files made through the link: {in_dir:?}"
        );
    }

    /// A refused call: code 5 naming `what`, nothing applied.
    fn refused(&self, run: &Run, what: &str, node_before: &podgate_integration::Snapshot) {
        let e = run.cni_error(5);
        let msg = e["msg"].as_str().unwrap();
        assert!(msg.contains(what) && msg.contains("symbolic link"), "{msg}");
        assert_eq!(
            self.rig.pod_state(0),
            ("0".to_string(), String::new()),
            "{what}"
        );
        assert_same(node_before, &snapshot(&self.rig.node));
        self.untouched(what);
    }
}

/// The event file a link to a node file: the call goes through (the event
/// channel is best effort) and nothing is appended to the file.
#[test]
fn an_event_file_planted_as_a_link_gets_nothing_written_through_it() {
    let p = Planted::new();
    p.link(&p.node_file, "events.jsonl");
    std::fs::create_dir(p.rig.state_dir().join("events.jsonl.inflight")).unwrap();
    p.router("ADD").ok();
    p.router("DEL").ok();
    p.untouched("events.jsonl a link");
}

/// The in-flight directory a link to a node directory: no mark is made
/// there, not even for a moment (the directory is not modified), and the
/// event itself is still recorded.
#[test]
fn an_inflight_dir_planted_as_a_link_gets_no_mark() {
    let p = Planted::new();
    let state = p.rig.state_dir();
    std::fs::write(state.join("events.jsonl"), "").unwrap();
    p.link(&p.node_dir, "events.jsonl.inflight");
    let mtime = || std::fs::metadata(&p.node_dir).unwrap().modified().unwrap();
    let before = mtime();
    p.router("ADD").ok();
    assert_eq!(mtime(), before, "a mark was made through the link");
    p.untouched("events.jsonl.inflight a link");
    let events = std::fs::read_to_string(state.join("events.jsonl")).unwrap();
    assert!(events.contains("\"command\":\"ADD\""), "{events}");
    p.router("DEL").ok();
}

/// The node-wide lock a dangling link, the pod's lock a link to a node
/// file: the call fails closed (code 5 naming the file), creates no target
/// and applies nothing; once the link is gone the runtime's retry works.
#[test]
fn lock_files_planted_as_links_fail_the_call_closed_and_create_nothing() {
    let p = Planted::new();
    let node_before = snapshot(&p.rig.node);
    let created = p.rig.dir.path().join("created-by-root");
    for (lock, target) in [(".lock", &created), (".pod-ctr-0.lock", &p.node_file)] {
        p.link(target, lock);
        let run = p.router("ADD");
        p.refused(&run, lock, &node_before);
        assert!(!created.exists(), "{lock}: the link's target was created");
        std::fs::remove_file(p.rig.state_dir().join(lock)).unwrap();
    }
    p.router("ADD").ok();
    p.router("DEL").ok();
}

/// The state dir itself a link to a node directory: refused, nothing
/// written there.
#[test]
fn a_state_dir_that_is_a_link_is_refused() {
    let p = Planted::new();
    let node_before = snapshot(&p.rig.node);
    let state = p.rig.state_dir();
    std::fs::remove_dir(&state).unwrap();
    std::os::unix::fs::symlink(&p.node_dir, &state).unwrap();
    let run = p.router("ADD");
    p.refused(&run, "", &node_before);
    std::fs::remove_file(&state).unwrap();
}

/// A FIFO named as a record: GC (which reads every record) answers at once,
/// the FIFO reported unreadable and removed, instead of blocking forever.
#[test]
fn a_fifo_planted_as_a_record_does_not_block_gc() {
    let p = Planted::new();
    let state = p.rig.state_dir();
    let fifo = Command::new("mkfifo")
        .arg(state.join(format!("{NET}+ctr-x+eth0.json")))
        .status()
        .unwrap();
    assert!(fifo.success());
    let gc = serde_json::to_vec(&json!({
        "cniVersion": "1.1.0", "name": NET, "type": ROUTER, "stateDir": state,
        "cni.dev/valid-attachments": []
    }))
    .unwrap();
    let r = router();
    let started = Instant::now();
    let run = p.rig.spawn(
        &["timeout", "20", r.to_str().unwrap()],
        &p.rig.env("GC", 0, "ctr-0"),
        &gc,
        Stdio::piped(),
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "GC blocked: {run:?}"
    );
    run.ok();
    assert!(p.rig.records().is_empty(), "{:?}", p.rig.records());
}

/// A panicking plugin process must print exactly one CNI error (code 999,
/// in the config's cniVersion) on stdout and exit 1.
fn assert_panic_answer(run: &Run, version: &str, details: &str, what: &str) {
    let lines: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "{what}: one JSON line on stdout: {run:?}");
    let v: Value =
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{what}: {e}: {run:?}"));
    assert_eq!(v["code"], 999, "{what}: {v}");
    assert_eq!(v["cniVersion"], version, "{what}: {v}");
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .ends_with("internal error (panic)"),
        "{what}: {v}"
    );
    assert!(
        v["details"].as_str().unwrap().contains(details),
        "{what}: details should carry the panic message and location: {v}"
    );
}

#[test]
fn panic_hook_answers_with_a_cni_error() {
    require_root();
    let bin = panic_example();
    let dir = TempDir::new("panic");
    let events = dir.path().join("events.jsonl");
    let conf = |v: &str| {
        json!({"cniVersion": v, "name": "n", "type": "panic", "eventFile": events}).to_string()
    };
    let netns = Netns::new("panic");
    let run = |cmd: &str, version: &str| -> Run {
        run_with_stdin(
            Command::new(&bin)
                .env_clear()
                .env("CNI_COMMAND", cmd)
                .env("CNI_CONTAINERID", "ctr-panic")
                .env("CNI_NETNS", netns.path())
                .env("CNI_IFNAME", "eth0")
                .current_dir(dir.path())
                .stderr(Stdio::piped()),
            conf(version).as_bytes(),
        )
    };
    for (cmd, version, details) in [
        ("ADD", "1.0.0", "deliberate panic in ADD of ctr-panic"),
        ("DEL", "0.4.0", "deliberate panic in DEL"),
        ("CHECK", "1.1.0", "deliberate panic on a helper thread"),
    ] {
        let r = run(cmd, version);
        assert_eq!(r.code, Some(1), "{cmd}: exit 1: {r:?}");
        assert_panic_answer(&r, version, details, cmd);
        assert!(details_have_location(&r), "{cmd}: {r:?}");
        assert!(
            r.stderr.contains("panic"),
            "{cmd}: stderr names the panic: {r:?}"
        );
    }
}

/// The CNI error's details name the panic's source location.
fn details_have_location(r: &Run) -> bool {
    serde_json::from_str::<Value>(r.stdout.trim())
        .ok()
        .and_then(|v| v["details"].as_str().map(|d| d.contains("panic.rs:")))
        .unwrap_or(false)
}

/// The real router, its stderr on /dev/full and a refused pod: the refusal is
/// logged to stderr (no logFile) and that write fails. Logging is best effort:
/// the runtime still gets the refusal as a normal CNI error and exit 1, not a
/// panic and not an abort.
#[test]
fn unwritable_stderr_does_not_break_the_answer() {
    let rig = Rig::new(1);
    let r = router();
    let mut env = rig.env("ADD", 0, "ctr-refused");
    env.retain(|(k, _)| k != "CNI_ARGS");
    // Namespace "default" may not choose profiles: refused, logged as a warning.
    env.push((
        "CNI_ARGS".into(),
        "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web".into(),
    ));
    let full = File::options().write(true).open("/dev/full").unwrap();
    let run = rig.spawn(
        &[r.to_str().unwrap()],
        &env,
        &rig.conf(0, "10.8.6.0/24"),
        Stdio::from(full),
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    let v: Value =
        serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {run:?}"));
    assert_eq!(v["code"], 100, "the refusal itself, not a panic: {v}");
    assert!(
        v["msg"]
            .as_str()
            .unwrap_or_default()
            .contains("allow.annotationNamespaces"),
        "{v}"
    );
    assert_eq!(rig.pod_state(0), ("0".to_string(), String::new()));
    assert!(rig.records().is_empty());
}

#[test]
fn ovsdb_that_never_answers_fails_add_in_bounded_time() {
    let g = GuardNode::new("ovshang");
    // Accepts (the kernel's backlog does) but never reads or answers.
    let sock = g.node.root().join("stalled-db.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    g.configure(json!({"ovsdbSocket": sock}));
    let start = Instant::now();
    let msg = g.expect_not_ready(
        "p",
        &[
            &format!("ovsdb: no answer within {TIMEOUT_MS}ms"),
            "agent /armed not asked: no OVS _uuid to bind it to",
        ],
    );
    assert!(!msg.contains("guard"), "{msg}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "ADD + DEL through libcni took {:?}",
        start.elapsed()
    );
    // Without the `required` file and the socket, a stalled OVSDB still cannot
    // rule out its lease keys: closed, not "IPsec not in use".
    let mut st = podgate_integration::ipsec::armed_state(&g.chassis);
    st["lease"] = json!(null);
    g.agent.set(&st);
    let mut g = g;
    g.agent.stop();
    std::fs::remove_file(g.agent.required_file()).unwrap();
    let msg = g.expect_not_ready("auto", &["ovsdb: no answer within"]);
    assert!(msg.contains("protection.sock absent"), "{msg}");
}

#[test]
fn stale_protection_socket_is_not_ready_not_absent() {
    let mut g = GuardNode::new("stale");
    g.agent.stop();
    std::fs::remove_file(g.agent.required_file()).unwrap();
    // A crashed agent leaves its socket file: with required: auto this must
    // not read as "IPsec not in use here", and must fail in bounded time.
    let l = std::os::unix::net::UnixListener::bind(g.agent.socket()).unwrap();
    drop(l);
    assert!(g.agent.socket().exists());
    let start = Instant::now();
    g.expect_not_ready("p", &["agent /armed: connect", "Connection refused"]);
    assert!(start.elapsed() < Duration::from_secs(10));
    std::fs::remove_file(g.agent.socket()).unwrap();
    // Socket and file gone, but the OVSDB lease keys remain: still closed.
    g.expect_not_ready(
        "keys",
        &["protection.sock absent: agent not serving (durable intent"],
    );
}

#[test]
fn test_mounts_stay_private() {
    // Mounts are made only inside the plugin's own mount namespace
    // (unshare -m): none may show up in the test process's.
    let mut mounts = String::new();
    File::open("/proc/self/mountinfo")
        .and_then(|mut f| f.read_to_string(&mut mounts))
        .unwrap();
    for tag in ["podgate-ro", "podgate-full", "podgate-it-faults"] {
        assert!(!mounts.contains(tag), "{tag} leaked:\n{mounts}");
    }
}

/// The agent's event channel and the log on a full disk (a 16 KiB tmpfs
/// filled to the last block, in a private mount namespace of that one
/// process), and a log on /dev/full: a refused ADD and an idle DEL answer
/// exactly as they do with no channel and no log.
#[test]
fn full_disk_under_the_event_channel_and_log_does_not_change_the_answer() {
    let rig = Rig::new(1);
    let r = router();
    let refused_env = |cmd: &str| {
        let mut env = rig.env(cmd, 0, "ctr-refused");
        env.retain(|(k, _)| k != "CNI_ARGS");
        env.push((
            "CNI_ARGS".into(),
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web".into(),
        ));
        env
    };
    let conf_with_log = |log: &str| {
        let mut c: Value = serde_json::from_slice(&rig.conf(0, "10.8.7.0/24")).unwrap();
        c["logFile"] = json!(log);
        serde_json::to_vec(&c).unwrap()
    };
    let plain = |cmd: &str| {
        rig.spawn(
            &[r.to_str().unwrap()],
            &refused_env(cmd),
            &rig.conf(0, "10.8.7.0/24"),
            Stdio::null(),
        )
    };
    let expected_add = plain("ADD");
    let expected_del = plain("DEL");
    assert_eq!(expected_add.code, Some(1));
    assert_eq!(expected_del.code, Some(0));

    let state = rig.state_dir();
    let log_in_state = state.join("router.log");
    let full = r#"mkdir -p "$d"; mount -t tmpfs -o size=16k podgate-full "$d"; \
        printf '{"podgateEvents":1,"id":"t"}\n' > "$d/events.jsonl"; \
        mkdir "$d/events.jsonl.inflight"; \
        dd if=/dev/zero of="$d/fill" bs=4k 2>/dev/null || true"#;
    let script = format!(
        "set -e; d=\"$1\"; shift; {full}; set +e; \"$@\"; rc=$?; \
         ls -A \"$d\" | sed 's/^/STATE-LS: /' >&2; exit $rc"
    );
    for (cmd, expected) in [("ADD", &expected_add), ("DEL", &expected_del)] {
        for log in [log_in_state.to_str().unwrap(), "/dev/full"] {
            let run = rig.spawn(
                &[
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    &script,
                    "sh",
                    state.to_str().unwrap(),
                    r.to_str().unwrap(),
                ],
                &refused_env(cmd),
                &conf_with_log(log),
                Stdio::piped(),
            );
            assert!(
                state_ls(&run).iter().any(|f| f == "events.jsonl"),
                "the channel was in place: {run:?}"
            );
            assert_eq!(
                (run.code, run.stdout.trim()),
                (expected.code, expected.stdout.trim()),
                "{cmd} with log {log} on a full disk: {run:?}"
            );
        }
    }
    assert_eq!(rig.pod_state(0), ("0".to_string(), String::new()));
    assert!(rig.records().is_empty());
}
