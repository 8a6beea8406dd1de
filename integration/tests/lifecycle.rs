//! podgate-router across kills, reboots and upgrades (root only), through the
//! real binary in throwaway node and pod namespaces:
//!
//! * crash points: ADD killed (strace fault injection, SIGKILL) at every
//!   sendto/sendmsg/write/rename/openat, one point per run, then DEL; the
//!   same points then GC with no valid attachments; DEL killed at each of its
//!   points, then DEL again. After each, the node's and the pod's routes,
//!   rules and nf_tables, the pod's sysctls and the state dir equal the
//!   snapshot taken before the ADD; the same for a strict pod (node-wide
//!   sysctls, the moved local rule, the per-pod table) beside an
//!   attachment routing a pool and one holding a route table; beside the
//!   killed pod, another attachment holds a pool (or a route table): after
//!   each kill the claims index equals the records' claims and an
//!   overlapping pool (or the taken table) is refused; a strict pod's DEL
//!   leaves the node-wide settings to another strict pod; on a node with
//!   IPv6, the same for a dual-stack strict pod with a pool of each family
//!   (the IPv6 local rule moved, the neighbour discovery and link-scope
//!   rules, a main route swapped per address, the pools' routes through
//!   the uplink) and for an IPv4 strict pod (IPv6 turned off on its
//!   host-side interface);
//! * node scale: an ADD routing a pool, and a strict pod's ADD and DEL,
//!   make the same file and netlink calls (`strace -c`) with 25 and with
//!   250 attachments on the node;
//! * a reboot: records from a "previous boot" (fresh node and pod netns at
//!   the same paths, state dir kept) neither block the new pod's pool claim
//!   nor count toward maxStrictPods, and are cleared; a missed DEL's return
//!   route is cleared by the next ADD and by the installer's sweep;
//! * an upgrade: golden version-1 (and unversioned) records are read, shown
//!   by `podgate inspect`, and removed by DEL; a newer version is kept and
//!   named.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::{
    built, claims_index_matches_records, podgate_bin, podgate_command, require_root,
    run_with_stdin, snapshot, state_files_in, workspace_root, Netns, Run, Snapshot, TempDir,
};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Stdio};

const ROUTER: &str = "podgate-router";
/// Interface index of both veth ends, as the golden records name it.
const IFINDEX: &str = "7";
const POD_SYSCTLS: [&str; 2] = ["net.ipv4.ip_forward", "net.ipv4.conf.eth0.accept_local"];
const STRICT_NODE_SYSCTLS: [&str; 4] = [
    "net.ipv4.tcp_early_demux",
    "net.ipv4.udp_early_demux",
    "net.ipv4.conf.pgup0.accept_local",
    "net.ipv4.conf.pgup0.rp_filter",
];

fn router() -> PathBuf {
    built(&[ROUTER], &["-p", ROUTER]).remove(0)
}

/// A node netns with bridge `pgbr0` (10.22.0.1/24, ifindex 7) and one pod,
/// its `eth0` (10.22.0.5/24, ifindex 7) a veth to `pgl0` on the bridge: the
/// interface indexes the golden records name. IPv6 off so snapshots are
/// exact.
struct Rig {
    node: Netns,
    pod: Netns,
    dir: TempDir,
    network: String,
    /// The pod's addresses as the primary reports them.
    ips: Value,
    host_if: String,
    /// Node sysctls that must come back too (strict settings).
    node_sysctls: Vec<&'static str>,
}

/// Everything a crash must leave as it was.
#[derive(Debug, PartialEq)]
struct World {
    node: Snapshot,
    pod: Snapshot,
    sysctls: Vec<String>,
    state: Vec<String>,
}

impl World {
    fn diff(&self, other: &World) -> String {
        let mut s = String::new();
        s += &format!("[node]\n{}", self.node.diff(&other.node));
        s += &format!("[pod]\n{}", self.pod.diff(&other.pod));
        if self.sysctls != other.sysctls {
            s += &format!("[sysctls] {:?} -> {:?}\n", self.sysctls, other.sysctls);
        }
        if self.state != other.state {
            s += &format!("[state dir] {:?} -> {:?}\n", self.state, other.state);
        }
        s
    }
}

fn wire(node: &Netns, pod: &Netns) {
    node.sysctl_set("net.ipv6.conf.default.disable_ipv6", "1");
    node.sysctl_set("net.ipv6.conf.all.disable_ipv6", "1");
    node.set_forwarding(true);
    node.exec_ok(&[
        "ip", "link", "add", "pgbr0", "index", IFINDEX, "type", "bridge",
    ]);
    node.exec_ok(&["ip", "addr", "add", "10.22.0.1/24", "dev", "pgbr0"]);
    node.exec_ok(&["ip", "link", "set", "pgbr0", "up"]);
    wire_pod(node, pod);
}

/// The pod's veth (its host side on the node's bridge, which outlives it,
/// as a bridge primary's does).
fn wire_pod(node: &Netns, pod: &Netns) {
    pod.sysctl_set("net.ipv6.conf.default.disable_ipv6", "1");
    pod.sysctl_set("net.ipv6.conf.all.disable_ipv6", "1");
    pod.set_forwarding(false);
    // A deleted pod netns takes its veth with it, asynchronously (the
    // kernel's netns cleanup work): wait for the old host side to go.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while node.link_exists("pgl0") {
        assert!(
            std::time::Instant::now() < deadline,
            "pgl0 of the deleted pod never went away"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    node.exec_ok(&[
        "ip",
        "link",
        "add",
        "pgl0",
        "index",
        "8",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "index",
        IFINDEX,
        "netns",
        pod.name(),
    ]);
    node.exec_ok(&["ip", "link", "set", "pgl0", "master", "pgbr0", "up"]);
    pod.exec_ok(&["ip", "addr", "add", "10.22.0.5/24", "dev", "eth0"]);
    pod.exec_ok(&["ip", "link", "set", "eth0", "up"]);
}

impl Rig {
    fn new(tag: &str, pod: Netns, network: &str) -> Rig {
        let node = Netns::new(&format!("lc-node-{tag}"));
        wire(&node, &pod);
        Rig {
            node,
            pod,
            dir: TempDir::new(&format!("lifecycle-{tag}")),
            network: network.into(),
            ips: json!([{"address": "10.22.0.5/24", "gateway": "10.22.0.1", "interface": 1}]),
            host_if: "pgbr0".into(),
            node_sysctls: Vec::new(),
        }
    }

    /// A node with a routed primary and an uplink for strict pods
    /// ([`wire_routed`]), its pod `10.40.0.3/32` behind `pgs0`.
    fn routed(tag: &str) -> Rig {
        let node = Netns::new(&format!("lc-node-{tag}"));
        let pod = Netns::new(&format!("lc-pod-{tag}"));
        wire_routed(&node, &pod);
        Rig {
            node,
            pod,
            dir: TempDir::new(&format!("lifecycle-{tag}")),
            network: "lcnet".into(),
            ips: json!([{"address": "10.40.0.3/32", "interface": 1}]),
            host_if: "pgs0".into(),
            node_sysctls: Vec::new(),
        }
    }

    /// Node and pod "reboot": fresh namespaces at the same paths, wired the
    /// same way; the state dir stays.
    fn reboot(&self) {
        self.pod.recreate();
        self.node.recreate();
        wire(&self.node, &self.pod);
    }

    fn reboot_routed(&self) {
        self.pod.recreate();
        self.node.recreate();
        wire_routed(&self.node, &self.pod);
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn conf(&self, profile: Value, gc: bool) -> Vec<u8> {
        self.conf_for(profile, gc, &self.pod, &self.ips)
    }

    /// [`Rig::conf`] for an attachment in another pod netns of this node.
    fn conf_for(&self, profile: Value, gc: bool, pod: &Netns, ips: &Value) -> Vec<u8> {
        let mut c = json!({
            "cniVersion": "1.1.0",
            "name": self.network,
            "type": ROUTER,
            "stateDir": self.state_dir(),
            "profiles": {"p": profile},
            "assign": [{"namespace": "vpn", "profile": "p"}],
            "prevResult": {
                "cniVersion": "1.1.0",
                "interfaces": [{"name": self.host_if}, {"name": "eth0", "sandbox": pod.path()}],
                "ips": ips
            }
        });
        if gc {
            // The other attachments (`OTHER`) stay.
            c["cni.dev/valid-attachments"] = json!([
                {"containerID": OTHER, "ifname": "eth0"},
                {"containerID": OTHER_POOL, "ifname": "eth0"}
            ]);
            c.as_object_mut().unwrap().remove("prevResult");
        }
        serde_json::to_vec(&c).unwrap()
    }

    fn env(&self, cmd: &str, cid: &str) -> Vec<(String, String)> {
        self.env_for(cmd, cid, &self.pod)
    }

    /// [`Rig::env`] for an interface other than eth0 of the rig's pod.
    fn env_if(&self, cmd: &str, cid: &str, ifname: &str) -> Vec<(String, String)> {
        let mut env = self.env(cmd, cid);
        for (k, v) in &mut env {
            if k == "CNI_IFNAME" {
                *v = ifname.into();
            }
        }
        env
    }

    fn env_for(&self, cmd: &str, cid: &str, pod: &Netns) -> Vec<(String, String)> {
        vec![
            ("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into()),
            ("CNI_COMMAND".into(), cmd.into()),
            ("CNI_CONTAINERID".into(), cid.into()),
            ("CNI_NETNS".into(), pod.path().display().to_string()),
            ("CNI_IFNAME".into(), "eth0".into()),
            ("CNI_PATH".into(), "/usr/lib/cni".into()),
            (
                "CNI_ARGS".into(),
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-0".into(),
            ),
        ]
    }

    /// Runs the router in the node netns, optionally under strace killing it
    /// at the `n`th call of `syscall`.
    fn router(&self, cmd: &str, cid: &str, profile: &Value, kill_at: Option<(&str, u32)>) -> Run {
        self.router_in(cmd, cid, profile, kill_at, &self.pod, &self.ips)
    }

    /// [`Rig::router`] for an attachment in `pod` with addresses `ips`.
    fn router_in(
        &self,
        cmd: &str,
        cid: &str,
        profile: &Value,
        kill_at: Option<(&str, u32)>,
        pod: &Netns,
        ips: &Value,
    ) -> Run {
        let strace: Vec<String> = kill_at
            .map(|(sys, n)| {
                ["-f", "-qq", "-o", "/dev/null", "-e"]
                    .map(String::from)
                    .into_iter()
                    .chain([format!("inject={sys}:signal=KILL:when={n}")])
                    .collect()
            })
            .unwrap_or_default();
        let conf = self.conf_for(profile.clone(), cmd == "GC", pod, ips);
        self.spawn(&strace, self.env_for(cmd, cid, pod), &conf)
    }

    /// The router in the node netns, under `strace` with these arguments
    /// unless there are none.
    fn spawn(&self, strace: &[String], env: Vec<(String, String)>, conf: &[u8]) -> Run {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.node.path().display()));
        if !strace.is_empty() {
            c.arg("strace").args(strace);
        }
        c.arg(router()).env_clear().envs(env).stderr(Stdio::piped());
        run_with_stdin(&mut c, conf)
    }

    fn world(&self) -> World {
        World {
            node: snapshot(&self.node),
            pod: snapshot(&self.pod),
            sysctls: POD_SYSCTLS
                .iter()
                .map(|s| format!("{s}={}", self.pod.sysctl_get(s)))
                .chain(
                    self.node_sysctls
                        .iter()
                        .map(|s| format!("node {s}={}", self.node.sysctl_get(s))),
                )
                .collect(),
            state: state_files_in(&self.state_dir()),
        }
    }

    fn inspect(&self) -> Value {
        let out = podgate_command()
            .args(["inspect", "--all", "--json", "--state-dir"])
            .arg(self.state_dir())
            .arg("--node-netns")
            .arg(self.node.path())
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "inspect output ({e}): {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

fn strace_available() -> bool {
    Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The profile: sysctls + masquerade + return route + pod route.
fn full_profile() -> Value {
    json!({
        "sysctls": {"net.ipv4.ip_forward": "1", "net.ipv4.conf.IFNAME.accept_local": "1"},
        "masquerade": [{"source": "10.8.0.0/24"}],
        "returnRoutes": [{"dst": "10.9.0.0/24"}],
        "podRoutes": [{"dst": "10.99.0.0/16", "gw": "10.22.0.1"}]
    })
}

/// The container ID of the attachment that stays while others come and go.
const OTHER: &str = "c2";
/// A second one that stays (the strict kill-point test: a pool beside a
/// route table).
const OTHER_POOL: &str = "c4";

fn index_matches_records(rig: &Rig, what: &str) {
    claims_index_matches_records(&rig.state_dir(), what);
}

/// The calls a kill point is put before: netlink, file writes, renames
/// into place (records relative to the state dir's handle, the claims
/// index by exchange, the old one then unlinked).
const CALLS: [&str; 9] = [
    "sendto",
    "sendmsg",
    "write",
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "openat",
];

/// Every crash point of ADD (then DEL, and then GC) and of DEL (then DEL
/// again) for `profile`; returns (ADD points, DEL points, saw a pending
/// record in `podgate inspect`).
fn crash_points(rig: &Rig, profile: &Value, also: &dyn Fn(&str)) -> (u32, u32, bool) {
    let before = rig.world();
    let mut add_points = 0;
    let mut del_points = 0;
    let mut saw_pending = false;
    let check = |what: &str| {
        also(what);
        let now = rig.world();
        assert!(
            now == before,
            "{what}: not as before the ADD:\n{}",
            before.diff(&now)
        );
    };

    // ADD killed at each point, then DEL; then the same points and GC.
    for cleanup in ["DEL", "GC"] {
        for sys in CALLS {
            for n in 1.. {
                assert!(n < 1000, "ADD never ran to its end under strace ({sys})");
                let run = rig.router("ADD", "c1", profile, Some((sys, n)));
                if !run.killed() {
                    // Past the last call: the ADD ran to its end.
                    run.ok();
                    rig.router("DEL", "c1", profile, None).ok();
                    check(&format!("ADD completed ({sys} has {} calls), DEL", n - 1));
                    break;
                }
                add_points += 1;
                also(&format!("ADD killed at {sys} #{n}"));
                if !saw_pending && cleanup == "DEL" {
                    let v = rig.inspect();
                    if let Some(a) = v["attachments"].as_array().and_then(|a| a.first()) {
                        if a["status"] == "pending" {
                            assert_eq!(a["state"], "pending", "{a}");
                            saw_pending = true;
                        }
                    }
                }
                rig.router(cleanup, "c1", profile, None).ok();
                check(&format!("ADD killed at {sys} #{n}, then {cleanup}"));
            }
        }
    }

    // DEL killed at each point, then DEL again.
    for sys in CALLS {
        for n in 1.. {
            assert!(n < 1000, "DEL never ran to its end under strace ({sys})");
            rig.router("ADD", "c1", profile, None).ok();
            let run = rig.router("DEL", "c1", profile, Some((sys, n)));
            if !run.killed() {
                run.ok();
                check(&format!("DEL completed ({sys} has {} calls)", n - 1));
                break;
            }
            del_points += 1;
            also(&format!("DEL killed at {sys} #{n}"));
            rig.router("DEL", "c1", profile, None).ok();
            check(&format!("DEL killed at {sys} #{n}, then DEL"));
        }
    }
    (add_points / 2, del_points, saw_pending)
}

#[test]
fn killed_at_any_point_then_del_or_gc_restores_everything() {
    require_root();
    assert!(
        strace_available(),
        "strace is needed (integration/install-deps.sh)"
    );
    let rig = Rig::new("crash", Netns::new("lc-pod-crash"), "lcnet");
    // Another attachment on the node (its own pod netns) holding a pool,
    // and a third whose pool overlaps it: refused at every step.
    let pod2 = Netns::new("lc-pod-crash2");
    let ips2 = json!([{"address": "10.22.0.6/24", "gateway": "10.22.0.1", "interface": 1}]);
    let other = |dst: &str| json!({"masquerade": [{"source": "10.8.0.0/24"}], "returnRoutes": [{"dst": dst}]});
    rig.router_in("ADD", OTHER, &other("10.50.0.0/24"), None, &pod2, &ips2)
        .ok();
    let claims = rig.inspect()["claims"].clone();
    assert_eq!(
        claims,
        json!([{"pool": "10.50.0.0/24", "owner": {"network": "lcnet", "containerID": OTHER, "ifname": "eth0"}, "trusted": true}]),
        "podgate inspect shows the claim and its owner"
    );
    let also = |what: &str| {
        index_matches_records(&rig, what);
        let run = rig.router_in("ADD", "c3", &other("10.50.0.0/16"), None, &pod2, &ips2);
        assert!(
            run.code != Some(0) && run.stdout.contains("already routed to pod c2"),
            "{what}: an overlapping pool is refused: {run:?}"
        );
    };
    let (add, del, saw_pending) = crash_points(&rig, &full_profile(), &also);
    rig.router_in("DEL", OTHER, &other("10.50.0.0/24"), None, &pod2, &ips2)
        .ok();
    index_matches_records(&rig, "all deleted");
    assert!(
        state_files_in(&rig.state_dir()).is_empty(),
        "DEL left {:?}",
        state_files_in(&rig.state_dir())
    );
    println!(
        "crash points tried: {} ({add} ADD points, each then DEL and then GC; {del} DEL points)",
        2 * add + del
    );
    assert!(add > 0 && del > 0, "no crash point was tried");
    assert!(saw_pending, "podgate inspect never showed a pending record");
}

#[test]
fn strict_pod_killed_at_any_point_then_del_or_gc_restores_the_node() {
    require_root();
    assert!(
        strace_available(),
        "strace is needed (integration/install-deps.sh)"
    );
    let mut rig = Rig::routed("scrash");
    // The strict settings, plus the proxy ARP podgate turns on on the
    // pod's host-side interface (issue 17).
    rig.node_sysctls = STRICT_NODE_SYSCTLS
        .iter()
        .copied()
        .chain([
            "net.ipv4.conf.pgs0.proxy_arp",
            "net.ipv4.neigh.pgs0.proxy_delay",
        ])
        .collect();
    // Values the strict settings change, so a leak shows.
    for (name, v) in [
        ("net.ipv4.tcp_early_demux", "1"),
        ("net.ipv4.udp_early_demux", "1"),
    ] {
        rig.node.sysctl_set(name, v);
    }
    rig.node.sysctl_set("net.ipv4.conf.pgup0.rp_filter", "1");
    let strict = json!({
        "sysctls": {"net.ipv4.ip_forward": "1"},
        "routing": {"mode": "strict", "uplink": "pgup0", "gateway": "192.0.2.254", "table": "auto"}
    });
    // Beside it, staying: an attachment routing a pool, and a pod behind a
    // standard boundary holding table 20000 (the killed pod stays the
    // node's first and last strict pod, so every kill point also covers
    // the node-wide settings).
    let pod2 = Netns::new("lc-pod-scrash2");
    wire_routed_pod(&rig.node, &pod2, "pgs1", "10.40.0.4");
    let ips2 = json!([{"address": "10.40.0.4/32", "interface": 1}]);
    let pool = json!({"returnRoutes": [{"dst": "10.50.0.0/24"}]});
    let mut standard = strict.clone();
    standard["routing"]["mode"] = json!("standard");
    rig.router_in("ADD", OTHER_POOL, &pool, None, &pod2, &ips2)
        .ok();
    rig.router_in("ADD", OTHER, &standard, None, &pod2, &ips2)
        .ok();
    let owner = |cid: &str| json!({"network": "lcnet", "containerID": cid, "ifname": "eth0"});
    assert_eq!(
        rig.inspect()["claims"],
        json!([
            {"pool": "10.50.0.0/24", "owner": owner(OTHER_POOL), "trusted": true},
            {"table": 20000, "owner": owner(OTHER), "trusted": true}
        ]),
        "podgate inspect shows the index's claims and their owners"
    );
    // A third pod asks for that table: refused at every step.
    let mut taken = strict.clone();
    taken["routing"]["table"] = json!(20000);
    let pod3 = Netns::new("lc-pod-scrash3");
    wire_routed_pod(&rig.node, &pod3, "pgs2", "10.40.0.5");
    let ips3 = json!([{"address": "10.40.0.5/32", "interface": 1}]);
    let also = |what: &str| {
        index_matches_records(&rig, what);
        let run = rig.router_in("ADD", "c3", &taken, None, &pod3, &ips3);
        assert!(
            run.code != Some(0) && run.stdout.contains("table 20000 is already used by pod c2"),
            "{what}: a table another pod holds is refused: {run:?}"
        );
    };
    let (add, del, _) = crash_points(&rig, &strict, &also);

    // Another strict pod (found through the index's `s=` entry): the
    // killed pod's DEL leaves the node-wide settings to it, and its own
    // DEL puts them back.
    let strict_sysctls = || {
        STRICT_NODE_SYSCTLS
            .map(|n| format!("{n}={}", rig.node.sysctl_get(n)))
            .join(" ")
    };
    let alone = strict_sysctls();
    rig.router_in("ADD", "c5", &strict, None, &pod3, &ips3).ok();
    assert_eq!(
        rig.inspect()["claims"].as_array().map(Vec::len),
        Some(4),
        "the second strict pod's table and slot: {}",
        rig.inspect()["claims"]
    );
    let shared = strict_sysctls();
    assert_ne!(shared, alone, "strict settings in place");
    rig.router("ADD", "c1", &strict, None).ok();
    rig.router("DEL", "c1", &strict, None).ok();
    assert_eq!(strict_sysctls(), shared, "c5 still needs them");
    index_matches_records(&rig, "c1 gone beside c5");
    rig.router_in("DEL", "c5", &strict, None, &pod3, &ips3).ok();
    assert_eq!(strict_sysctls(), alone, "back after the last strict pod");
    for (cid, profile) in [(OTHER, &standard), (OTHER_POOL, &pool)] {
        rig.router_in("DEL", cid, profile, None, &pod2, &ips2).ok();
    }
    index_matches_records(&rig, "all deleted");
    assert!(
        state_files_in(&rig.state_dir()).is_empty(),
        "DEL left {:?}",
        state_files_in(&rig.state_dir())
    );
    println!(
        "strict crash points tried: {} ({add} ADD points, each then DEL and then GC; {del} DEL points)",
        2 * add + del
    );
    assert!(add > 0 && del > 0, "no crash point was tried");
}

/// A node with IPv6 (a routed primary with an uplink of both families,
/// IPv6 addresses without duplicate address detection so snapshots are
/// exact) and its pod at `10.40.0.3/32` behind `pgs0`, also at
/// `fd00:40::3/128` when `dual_stack`.
fn routed_ipv6_rig(tag: &str, dual_stack: bool) -> Rig {
    let node = Netns::new(&format!("lc-node-{tag}"));
    let pod = Netns::new(&format!("lc-pod-{tag}"));
    for ns in [&node, &pod] {
        ns.sysctl_set("net.ipv6.conf.default.accept_dad", "0");
        ns.sysctl_set("net.ipv6.conf.all.accept_dad", "0");
    }
    wire_uplink(&node, &pod);
    node.exec_ok(&[
        "ip",
        "-6",
        "addr",
        "add",
        "2001:db8::1/64",
        "dev",
        "pgup0",
        "nodad",
    ]);
    wire_routed_pod(&node, &pod, "pgs0", "10.40.0.3");
    let mut ips = vec![json!({"address": "10.40.0.3/32", "interface": 1})];
    if dual_stack {
        pod.sysctl_set("net.ipv6.conf.all.disable_ipv6", "0");
        pod.sysctl_set("net.ipv6.conf.eth0.disable_ipv6", "0");
        node.exec_ok(&[
            "ip",
            "-6",
            "addr",
            "add",
            "fd00:40::1/128",
            "dev",
            "pgs0",
            "nodad",
        ]);
        node.exec_ok(&["ip", "-6", "route", "add", "fd00:40::3/128", "dev", "pgs0"]);
        pod.exec_ok(&[
            "ip",
            "-6",
            "addr",
            "add",
            "fd00:40::3/64",
            "dev",
            "eth0",
            "nodad",
        ]);
        ips.push(json!({"address": "fd00:40::3/64", "gateway": "fd00:40::1", "interface": 1}));
    }
    Rig {
        node,
        pod,
        dir: TempDir::new(&format!("lifecycle-{tag}")),
        network: "lcnet".into(),
        ips: Value::Array(ips),
        host_if: "pgs0".into(),
        node_sysctls: STRICT_NODE_SYSCTLS
            .iter()
            .copied()
            .chain([
                "net.ipv4.conf.pgs0.proxy_arp",
                "net.ipv4.neigh.pgs0.proxy_delay",
                "net.ipv6.conf.pgs0.disable_ipv6",
            ])
            .collect(),
    }
}

/// Every kill point of a strict pod's ADD and DEL on a node with IPv6,
/// then DEL or GC: the node and the pod as before, rules compared with
/// their protocols (`ip -d rule`), both families.
fn strict_kill_points_on_an_ipv6_node(rig: &Rig, profile: &Value) {
    rig.node.sysctl_set("net.ipv4.tcp_early_demux", "1");
    rig.node.sysctl_set("net.ipv4.udp_early_demux", "1");
    let rules = || {
        rig.node.exec_ok(&["ip", "-d", "-4", "rule"])
            + &rig.node.exec_ok(&["ip", "-d", "-6", "rule"])
    };
    let before = rules();
    let also = |what: &str| {
        index_matches_records(rig, what);
        // Between kill points only the records' own rules may be there.
        if state_files_in(&rig.state_dir()).is_empty() {
            assert_eq!(rules(), before, "{what}: ip -d rule");
        }
    };
    let (add, del, _) = crash_points(rig, profile, &also);
    assert_eq!(rules(), before);
    assert!(state_files_in(&rig.state_dir()).is_empty());
    println!(
        "strict crash points tried: {} ({add} ADD points, each then DEL and then GC; {del} DEL points)",
        2 * add + del
    );
    assert!(add > 0 && del > 0, "no crash point was tried");
}

#[test]
fn a_dual_stack_strict_pod_killed_at_any_point_then_del_or_gc_restores_the_node() {
    require_root();
    assert!(
        strace_available(),
        "strace is needed (integration/install-deps.sh)"
    );
    let rig = routed_ipv6_rig("dscrash", true);
    let profile = json!({
        "sysctls": {"net.ipv4.ip_forward": "1"},
        "returnRoutes": [{"dst": "10.60.0.0/24"}, {"dst": "fd60::/64"}],
        "routing": {"mode": "strict", "uplink": "pgup0", "gateway": "192.0.2.254",
                    "gateway6": "2001:db8::fe", "table": "auto"}
    });
    // Applied whole first: what the kill points must undo.
    rig.router("ADD", "c1", &profile, None).ok();
    let rec: Value =
        serde_json::from_slice(&std::fs::read(rig.state_dir().join("lcnet+c1+eth0.json")).unwrap())
            .unwrap();
    assert_eq!(rec["version"], 2, "{rec}");
    let v6_rules = rig.node.exec_ok(&["ip", "-6", "rule"]);
    for want in [
        "ipproto ipv6-icmp lookup local",
        "blackhole",
        "1000:\tfrom all lookup local",
    ] {
        assert!(v6_rules.contains(want), "{want}: {v6_rules}");
    }
    rig.router("DEL", "c1", &profile, None).ok();
    strict_kill_points_on_an_ipv6_node(&rig, &profile);
}

#[test]
fn an_ipv4_strict_pod_on_an_ipv6_node_killed_at_any_point_then_del_or_gc_restores_the_node() {
    require_root();
    assert!(
        strace_available(),
        "strace is needed (integration/install-deps.sh)"
    );
    let rig = routed_ipv6_rig("v4crash", false);
    let profile = json!({
        "routing": {"mode": "strict", "uplink": "pgup0", "gateway": "192.0.2.254", "table": "auto"}
    });
    rig.router("ADD", "c1", &profile, None).ok();
    assert_eq!(rig.node.sysctl_get("net.ipv6.conf.pgs0.disable_ipv6"), "1");
    rig.router("DEL", "c1", &profile, None).ok();
    assert_eq!(rig.node.sysctl_get("net.ipv6.conf.pgs0.disable_ipv6"), "0");
    strict_kill_points_on_an_ipv6_node(&rig, &profile);
}

#[test]
fn records_from_a_previous_boot_neither_block_nor_linger() {
    require_root();
    let rig = Rig::new("reboot", Netns::new("lc-pod-reboot"), "lcnet");
    let routed = json!({
        "sysctls": {"net.ipv4.ip_forward": "1"},
        "returnRoutes": [{"dst": "10.9.0.0/24"}]
    });
    let before = rig.world();
    rig.router("ADD", "c1", &routed, None).ok();
    assert!(rig.node.exec_ok(&["ip", "route"]).contains("10.9.0.0/24"));

    // The node "reboots": CRI-O then creates the pod's new sandbox without a
    // DEL of the old one.
    rig.reboot();
    let v = rig.inspect();
    let a = &v["attachments"][0];
    assert_eq!(a["state"], "stale", "{v}");
    assert_eq!(a["key"]["containerID"], "c1", "{v}");

    let run = rig.router("ADD", "c2", &routed, None);
    run.ok();
    let routes = rig.node.exec_ok(&["ip", "route"]);
    assert_eq!(routes.matches("10.9.0.0/24").count(), 1, "{routes}");
    // The old record is gone, the new one is the only one.
    let files = state_files_in(&rig.state_dir());
    assert_eq!(files, vec!["lcnet+c2+eth0.json".to_string()], "{files:?}");
    assert_eq!(rig.inspect()["attachments"][0]["state"], "holds");

    // A missed DEL without a reboot: the pod's netns is gone, its return
    // route is not. The next ADD clears it (route and record) and claims.
    rig.pod.recreate();
    wire_pod(&rig.node, &rig.pod);
    assert!(
        rig.node.exec_ok(&["ip", "route"]).contains("10.9.0.0/24"),
        "the return route of the deleted pod should linger until podgate clears it"
    );
    rig.router("ADD", "c3", &routed, None).ok();
    let files = state_files_in(&rig.state_dir());
    assert_eq!(files, vec!["lcnet+c3+eth0.json".to_string()], "{files:?}");
    let routes = rig.node.exec_ok(&["ip", "route"]);
    assert_eq!(routes.matches("10.9.0.0/24").count(), 1, "{routes}");

    rig.router("DEL", "c3", &routed, None).ok();
    // The DEL the runtime may still send for the old sandboxes finds nothing.
    rig.router("DEL", "c1", &routed, None).ok();
    rig.router("DEL", "c2", &routed, None).ok();
    let after = rig.world();
    assert!(after.state.is_empty(), "{:?}", after.state);
    assert!(!after.node.routes4.iter().any(|r| r.contains("10.9.0.0")));
    let _ = before;
}

/// A routed primary (one /32 per pod, as ptp installs it) and an uplink
/// with a gateway, for strict pods.
fn wire_routed(node: &Netns, pod: &Netns) {
    for ns in [node, pod] {
        ns.sysctl_set("net.ipv6.conf.default.disable_ipv6", "1");
        ns.sysctl_set("net.ipv6.conf.all.disable_ipv6", "1");
    }
    wire_uplink(node, pod);
    wire_routed_pod(node, pod, "pgs0", "10.40.0.3");
}

/// The node forwards, the pod does not; the node's uplink `pgup0`
/// (192.0.2.1/24), its peer `pgup1` left in the node.
fn wire_uplink(node: &Netns, pod: &Netns) {
    node.set_forwarding(true);
    pod.set_forwarding(false);
    node.exec_ok(&[
        "ip", "link", "add", "pgup0", "type", "veth", "peer", "name", "pgup1",
    ]);
    node.exec_ok(&["ip", "addr", "add", "192.0.2.1/24", "dev", "pgup0"]);
    node.exec_ok(&["ip", "link", "set", "pgup0", "up"]);
    node.exec_ok(&["ip", "link", "set", "pgup1", "up"]);
}

/// Another pod of a routed primary: its `eth0` holds `ip`/32, the node
/// routes it through `host_if`.
fn wire_routed_pod(node: &Netns, pod: &Netns, host_if: &str, ip: &str) {
    pod.sysctl_set("net.ipv6.conf.all.disable_ipv6", "1");
    node.exec_ok(&[
        "ip",
        "link",
        "add",
        host_if,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        pod.name(),
    ]);
    node.exec_ok(&["ip", "link", "set", host_if, "up"]);
    let host = format!("{ip}/32");
    node.exec_ok(&["ip", "route", "add", &host, "dev", host_if, "scope", "link"]);
    pod.exec_ok(&["ip", "addr", "add", &host, "dev", "eth0"]);
    pod.exec_ok(&["ip", "link", "set", "eth0", "up"]);
}

#[test]
fn strict_pods_of_a_previous_boot_do_not_count() {
    require_root();
    let rig = Rig::routed("strict");
    let strict = strict_profile();
    // Drives the router with maxStrictPods 1 for `pod` (its eth0 has `ip`/32
    // and its host side `host_if`).
    let max_one = |rig: &Rig, cmd: &str, cid: &str, pod: &Netns, ip: &str, host_if: &str| {
        let mut c: Value = serde_json::from_slice(&rig.conf(strict.clone(), false)).unwrap();
        c["maxStrictPods"] = json!(1);
        c["prevResult"]["interfaces"] =
            json!([{"name": host_if}, {"name": "eth0", "sandbox": pod.path()}]);
        c["prevResult"]["ips"] = json!([{"address": format!("{ip}/32"), "interface": 1}]);
        let mut env = rig.env(cmd, cid);
        env.retain(|(k, _)| k != "CNI_NETNS");
        env.push(("CNI_NETNS".into(), pod.path().display().to_string()));
        let run = rig.spawn(&[], env, &serde_json::to_vec(&c).unwrap());
        (run.code, run.stdout)
    };
    let first =
        |rig: &Rig, cmd: &str, cid: &str| max_one(rig, cmd, cid, &rig.pod, "10.40.0.3", "pgs0");
    let rules_before = rig.node.exec_ok(&["ip", "rule"]);
    assert_eq!(first(&rig, "ADD", "s1").0, Some(0));
    // The limit holds while s1 lives: a second strict pod is refused.
    let other = Netns::new("lc-pod-strict2");
    wire_routed_pod(&rig.node, &other, "pgs1", "10.40.0.4");
    let (code, out) = max_one(&rig, "ADD", "s-other", &other, "10.40.0.4", "pgs1");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("maxStrictPods"), "{out}");
    drop(other);

    rig.reboot_routed();
    let rules_fresh = rig.node.exec_ok(&["ip", "rule"]);
    assert_eq!(rules_fresh, rules_before);
    let (code, out) = first(&rig, "ADD", "s2");
    assert_eq!(
        code,
        Some(0),
        "the previous boot's strict pod still counts: {out}"
    );
    let files = state_files_in(&rig.state_dir());
    assert_eq!(
        files,
        vec![
            "lcnet+s2+eth0.json".to_string(),
            "node/strict.json".to_string()
        ],
        "{files:?}"
    );
    assert_eq!(first(&rig, "DEL", "s2").0, Some(0));
    assert!(state_files_in(&rig.state_dir()).is_empty());
    assert_eq!(rig.node.exec_ok(&["ip", "rule"]), rules_before);
}

/// The node-wide strict settings: the strict sysctls and where the local
/// table's rule stands (a strict pod's own rules are not node-wide).
fn strict_node_wide(rig: &Rig) -> String {
    let sysctls = STRICT_NODE_SYSCTLS.map(|n| format!("{n}={}", rig.node.sysctl_get(n)));
    let rules = rig.node.exec_ok(&["ip", "rule"]);
    let local: Vec<&str> = rules
        .lines()
        .filter(|l| l.ends_with("lookup local"))
        .collect();
    format!("{} {}", sysctls.join(" "), local.join(" "))
}

/// The strict profile of the routed rig (uplink `pgup0`).
fn strict_profile() -> Value {
    json!({"routing": {"mode": "strict", "uplink": "pgup0", "gateway": "192.0.2.254", "table": "auto"}})
}

/// A routed rig whose strict settings differ from podgate's (see
/// [`strict_values_to_change`]), and its node-wide settings before any
/// strict pod.
fn routed_strict(tag: &str) -> (Rig, String) {
    let rig = Rig::routed(tag);
    strict_values_to_change(&rig);
    let alone = strict_node_wide(&rig);
    (rig, alone)
}

/// Values the strict settings change, so that one left behind shows.
fn strict_values_to_change(rig: &Rig) {
    for name in ["net.ipv4.tcp_early_demux", "net.ipv4.udp_early_demux"] {
        rig.node.sysctl_set(name, "1");
    }
    rig.node.sysctl_set("net.ipv4.conf.pgup0.rp_filter", "1");
}

/// strace arguments that hold the traced process 4 s at its `when`th
/// opening of `path` (an interleaving forced from outside).
fn delay_opening(path: &std::path::Path, when: u32) -> Vec<String> {
    ["-f", "-qq", "-o", "/dev/null", "-P"]
        .map(String::from)
        .into_iter()
        .chain([path.display().to_string()])
        .chain(["-e", "trace=openat", "-e"].map(String::from))
        .chain([format!("inject=openat:delay_enter=4000000:when={when}")])
        .collect()
}

/// strace arguments that hold the traced process 4 s at its `when`th
/// `flock` (the state dir's files are opened relative to its handle, so a
/// path filter would not name one of them).
fn delay_flock(when: u32) -> Vec<String> {
    ["-f", "-qq", "-o", "/dev/null", "-e", "trace=flock", "-e"]
        .map(String::from)
        .into_iter()
        .chain([format!("inject=flock:delay_enter=4000000:when={when}")])
        .collect()
}

/// GC collecting every strict pod of the node puts the node-wide strict
/// settings back: each pod it removed no longer counts as live when it
/// judges the next (it kept them, each pod seeing the other).
#[test]
fn gc_of_two_strict_pods_puts_the_node_wide_settings_back() {
    require_root();
    let (rig, alone) = routed_strict("gcstrict");
    let strict = strict_profile();
    let pod2 = Netns::new("lc-pod-gcstrict2");
    wire_routed_pod(&rig.node, &pod2, "pgs1", "10.40.0.4");
    let ips2 = json!([{"address": "10.40.0.4/32", "interface": 1}]);
    rig.router("ADD", "x", &strict, None).ok();
    rig.router_in("ADD", "y", &strict, None, &pod2, &ips2).ok();
    assert_ne!(strict_node_wide(&rig), alone, "strict settings in place");
    // Neither is among the valid attachments.
    rig.router("GC", "-", &strict, None).ok();
    assert!(
        state_files_in(&rig.state_dir()).is_empty(),
        "GC left {:?}",
        state_files_in(&rig.state_dir())
    );
    assert_eq!(
        strict_node_wide(&rig),
        alone,
        "no strict pod left: the node-wide settings are back"
    );
}

/// GC holds the pod lock of an attachment while it collects it, not only
/// looks at it first: an ADD of that pod that begins meanwhile waits for
/// it, then applies to what GC left. Here strace delays GC's opening of the
/// pod's netns path in its collection (the second open: the first is its
/// census), after GC chose to collect. Looked at only, the ADD read
/// `ip_forward=1` before GC put it back to 0, found no record after, and
/// changed nothing: an applied record and a pod that does not forward.
#[test]
fn an_add_during_gc_of_its_pod_waits_for_gc_and_applies_its_sysctls() {
    require_root();
    assert!(
        strace_available(),
        "strace is needed (integration/install-deps.sh)"
    );
    let rig = Rig::new("gcadd", Netns::new("lc-pod-gcadd"), "lcnet");
    rig.pod.sysctl_set("net.ipv4.ip_forward", "0");
    let profile = json!({"sysctls": {"net.ipv4.ip_forward": "1"}});
    rig.router("ADD", "x", &profile, None).ok();
    assert_eq!(rig.pod.sysctl_get("net.ipv4.ip_forward"), "1");
    let delay = delay_opening(rig.pod.path(), 2);
    // x is not among the valid attachments.
    let gc_conf = rig.conf(profile.clone(), true);
    std::thread::scope(|s| {
        let gc = s.spawn(|| rig.spawn(&delay, rig.env("GC", "-"), &gc_conf));
        std::thread::sleep(std::time::Duration::from_secs(1));
        rig.router("ADD", "x", &profile, None).ok();
        gc.join().unwrap().ok();
    });
    assert_eq!(
        rig.pod.sysctl_get("net.ipv4.ip_forward"),
        "1",
        "the ADD after GC set the pod's forwarding"
    );
    assert_eq!(
        state_files_in(&rig.state_dir()),
        vec!["lcnet+x+eth0.json".to_string()]
    );
    rig.router("DEL", "x", &profile, None).ok();
    assert_eq!(rig.pod.sysctl_get("net.ipv4.ip_forward"), "0");
    assert!(state_files_in(&rig.state_dir()).is_empty());
}

/// A repeated ADD whose profile changed from strict to sysctl-only (it
/// checks no claims) removes its earlier strict record with a census taken
/// under the node-wide lock. Here it waits before the lock (strace delays
/// its opening of the lock file) while another strict pod is added: that
/// pod keeps the node-wide strict settings. Read before the lock, the
/// census missed it, and removing the earlier record put the settings back
/// as if no strict pod were left.
#[test]
fn a_profile_change_that_checks_no_claims_keeps_the_strict_settings_of_a_pod_added_while_it_waited()
{
    require_root();
    assert!(
        strace_available(),
        "strace is needed (integration/install-deps.sh)"
    );
    let rig = Rig::routed("waited");
    strict_values_to_change(&rig);
    let node_wide = || strict_node_wide(&rig);
    let alone = node_wide();
    let strict = strict_profile();
    let sysctl_only = json!({"sysctls": {"net.ipv4.ip_forward": "1"}});
    rig.router("ADD", "x", &strict, None).ok();
    let with_strict = node_wide();
    assert_ne!(with_strict, alone, "strict settings in place");

    let pod2 = Netns::new("lc-pod-waited2");
    wire_routed_pod(&rig.node, &pod2, "pgs1", "10.40.0.4");
    let ips2 = json!([{"address": "10.40.0.4/32", "interface": 1}]);
    // Its second flock: the node-wide lock, after the pod's.
    let delay = delay_flock(2);
    let conf = rig.conf(sysctl_only.clone(), false);
    std::thread::scope(|s| {
        let changed = s.spawn(|| rig.spawn(&delay, rig.env("ADD", "x"), &conf));
        // Its records read, it waits at the lock file; meanwhile a strict
        // pod comes and goes through the lock.
        std::thread::sleep(std::time::Duration::from_secs(1));
        rig.router_in("ADD", "y", &strict, None, &pod2, &ips2).ok();
        assert!(
            !changed.is_finished(),
            "the changed ADD took the lock before the strict pod's ADD ended: the race was not set up"
        );
        changed.join().unwrap().ok();
    });
    assert_eq!(
        node_wide(),
        with_strict,
        "y is strict and live: the node-wide strict settings stay"
    );
    let claims = rig.inspect()["claims"].clone();
    assert!(
        claims
            .as_array()
            .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c["owner"]["containerID"] == "y")),
        "only y's claims are left: {claims}"
    );
    rig.router_in("DEL", "y", &strict, None, &pod2, &ips2).ok();
    assert_eq!(node_wide(), alone, "back after the last strict pod");
    rig.router("DEL", "x", &sysctl_only, None).ok();
    assert!(
        state_files_in(&rig.state_dir()).is_empty(),
        "DEL left {:?}",
        state_files_in(&rig.state_dir())
    );
}

fn golden(name: &str) -> Vec<u8> {
    std::fs::read(
        workspace_root()
            .join("plugins/router/tests/records")
            .join(name),
    )
    .unwrap()
}

fn place(rig: &Rig, file: &str, golden_name: &str) {
    std::fs::create_dir_all(rig.state_dir()).unwrap();
    std::fs::write(rig.state_dir().join(file), golden(golden_name)).unwrap();
}

#[test]
fn golden_records_of_earlier_releases_are_shown_and_removed() {
    require_root();
    let rig = Rig::new("golden", Netns::named("pg-golden-pod"), "goldennet");
    let before = rig.world();
    let profile = full_profile();

    // What the version-1 golden record describes, as that release left it:
    // the same kernel objects this release makes for the same profile.
    rig.router("ADD", "golden-v1", &profile, None).ok();
    place(&rig, "goldennet+golden-v1+eth0.json", "v1-vpn-full.json");
    place(&rig, "goldennet+golden-v3+eth0.json", "v3-future.json");
    place(
        &rig,
        "goldennet+golden-pending+eth0.json",
        "v1-pending.json",
    );

    let v = rig.inspect();
    let by_id = |id: &str| {
        v["attachments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["key"]["containerID"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} not shown: {v}"))
    };
    let a = by_id("golden-v1");
    assert_eq!(a["state"], "holds", "{a}");
    assert_eq!(a["version"], 1);
    assert_eq!(a["nodeRoutes"][0]["dst"], "10.9.0.0/24");
    // A pending record from an earlier boot is shown as stale.
    assert_eq!(by_id("golden-pending")["state"], "stale");
    let corrupt = v["corrupt"].to_string();
    assert!(corrupt.contains("format version 3"), "{v}");

    // DEL of the golden record removes what it describes.
    rig.router("DEL", "golden-v1", &profile, None).ok();
    // The newer record is kept, and DEL says why.
    let run = rig.router("DEL", "golden-v3", &profile, None);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stdout.contains("format version 3"), "{run:?}");
    assert!(rig
        .state_dir()
        .join("goldennet+golden-v3+eth0.json")
        .exists());
    std::fs::remove_file(rig.state_dir().join("goldennet+golden-v3+eth0.json")).unwrap();
    // The stale pending one (an earlier boot) is cleared by the next GC.
    assert!(rig
        .state_dir()
        .join("goldennet+golden-pending+eth0.json")
        .exists());
    rig.router("GC", "-", &profile, None).ok();
    let now = rig.world();
    assert!(
        now == before,
        "after DEL of the golden v1 record:\n{}",
        before.diff(&now)
    );

    // An unversioned record (the format before version 1).
    rig.pod.sysctl_set("net.ipv4.ip_forward", "1");
    rig.node.exec_ok(&[
        "ip",
        "route",
        "add",
        "10.9.0.0/24",
        "via",
        "10.22.0.5",
        "dev",
        "pgbr0",
        "proto",
        "94",
    ]);
    place(&rig, "goldennet+golden-v0+eth0.json", "v0-vpn-routed.json");
    let v = rig.inspect();
    assert_eq!(v["attachments"][0]["state"], "holds", "{v}");
    rig.router("DEL", "golden-v0", &profile, None).ok();
    let now = rig.world();
    assert!(
        now == before,
        "after DEL of the golden v0 record:\n{}",
        before.diff(&now)
    );

    // A record that does not parse at all: DEL removes by ownership what
    // carries the attachment's tag, and the node route via its address.
    rig.router("ADD", "golden-x", &profile, None).ok();
    std::fs::write(
        rig.state_dir().join("goldennet+golden-x+eth0.json"),
        b"{\"vers",
    )
    .unwrap();
    rig.router("DEL", "golden-x", &profile, None).ok();
    let now = rig.world();
    // Sysctls cannot be put back without the record; everything else is.
    let mut expect = before.sysctls.clone();
    expect[0] = "net.ipv4.ip_forward=1".into();
    expect[1] = "net.ipv4.conf.eth0.accept_local=1".into();
    assert_eq!(now.sysctls, expect);
    assert!(
        now.node == before.node && now.pod == before.pod && now.state == before.state,
        "after DEL of an unreadable record:\n{}",
        before.diff(&now)
    );

    // Leaked objects without any record (a release before write-ahead
    // records): GC finds them by ownership (protocol 94) and removes them.
    rig.node.exec_ok(&[
        "ip",
        "route",
        "add",
        "10.77.0.0/24",
        "via",
        "10.22.0.5",
        "dev",
        "pgbr0",
        "proto",
        "94",
    ]);
    rig.node.exec_ok(&[
        "ip",
        "route",
        "add",
        "default",
        "via",
        "10.22.0.5",
        "dev",
        "pgbr0",
        "table",
        "20000",
        "proto",
        "94",
    ]);
    rig.node.exec_ok(&[
        "ip",
        "rule",
        "add",
        "from",
        "10.22.0.5",
        "lookup",
        "20000",
        "pref",
        "1536",
        "proto",
        "94",
    ]);
    rig.router("GC", "-", &profile, None).ok();
    let after_gc = rig.world();
    assert!(
        after_gc.node == before.node,
        "GC left podgate-owned objects:\n{}",
        before.diff(&after_gc)
    );
}

#[test]
fn the_node_agent_sweeps_records_of_dead_pods() {
    require_root();
    let rig = Rig::new("sweep", Netns::new("lc-pod-sweep"), "lcnet");
    let routed = json!({
        "sysctls": {"net.ipv4.ip_forward": "1"},
        "returnRoutes": [{"dst": "10.9.0.0/24"}]
    });
    rig.router("ADD", "c1", &routed, None).ok();
    // The pod dies without a DEL; its return route stays behind.
    rig.pod.recreate();
    assert!(rig.node.exec_ok(&["ip", "route"]).contains("10.9.0.0/24"));

    let child = agent_command(
        &rig,
        &["--metrics-address", "127.0.0.1:9751", "--sweep-secs", "1"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !state_files_in(&rig.state_dir()).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // SAFETY: kill(2) of the child we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        state_files_in(&rig.state_dir()).is_empty(),
        "the sweep did not remove the stale record:\n{log}"
    );
    assert!(
        log.contains("removed stale record lcnet/c1/eth0"),
        "the sweep's removal is not logged:\n{log}"
    );
    let routes = rig.node.exec_ok(&["ip", "route"]);
    assert!(!routes.contains("10.9.0.0/24"), "{routes}");
}

/// `podgate agent` with `extra`, in the node netns, the rig's state dirs
/// and no runtime.
fn agent_command(rig: &Rig, extra: &[&str]) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", rig.node.path().display()))
        .arg(podgate_bin())
        .arg("agent")
        .args(extra)
        .args(["--runtime-endpoint", "none"])
        .arg("--router-state-dir")
        .arg(rig.state_dir())
        .arg("--agent-state-dir")
        .arg(rig.dir.path().join("agent"))
        .arg("--plugins")
        .arg(rig.dir.path().join("plugins.json"));
    node_dirs(rig, &mut cmd);
    cmd
}

/// The rig's CNI dirs and installer state dir, as `podgate agent` and
/// `podgate uninstall` take them.
fn node_dirs(rig: &Rig, cmd: &mut Command) {
    let conf = rig.dir.path().join("net.d");
    std::fs::create_dir_all(&conf).unwrap();
    cmd.arg("--cni-conf-dir")
        .arg(&conf)
        .arg("--cni-bin-dir")
        .arg(rig.dir.path().join("bin"))
        .arg("--state-dir")
        .arg(rig.dir.path().join("installer"));
}

/// `podgate agent --once` (the one-shot sweep alone, no runtime); its
/// stdout and stderr.
fn sweep_once(rig: &Rig) -> String {
    let out = agent_command(rig, &["--once"]).output().unwrap();
    podgate_integration::output_text(&out)
}

/// `podgate uninstall --wait --purge-state-dir` the rig's state dir, then
/// SIGTERM: what the uninstall DaemonSet does; its log.
fn uninstall_purge(rig: &Rig) -> String {
    let log = rig.dir.path().join("uninstall.log");
    let mut cmd = podgate_command();
    cmd.arg("uninstall");
    node_dirs(rig, &mut cmd);
    let mut child = cmd
        .args(["--wait", "--purge-state-dir"])
        .arg(rig.state_dir())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("waiting for SIGTERM")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "uninstall never waited"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: kill(2) of the child we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{text}");
    text
}

/// podgate's own routes and rules on the node (protocol 94).
fn podgate_objects(rig: &Rig) -> String {
    let rules: String = rig
        .node
        .exec_ok(&["ip", "-d", "rule"])
        .lines()
        .filter(|l| l.ends_with(" proto 94"))
        .map(|l| format!("{l}\n"))
        .collect();
    let routes = rig
        .node
        .exec_ok(&["ip", "route", "show", "table", "all", "proto", "94"]);
    format!("{rules}{routes}")
}

/// A strict pod's record emptied (what a power cut leaves of a record
/// written without fsync, or any record podgate cannot read), and the pod
/// gone without a DEL (its netns deleted, its veth with it): the node
/// agent's sweep moves the record to `quarantine/` and says so, removes
/// what the pod left on the node (found from its host-side rule, whose
/// interface went with the netns), puts the node-wide strict settings
/// back, and the uninstall purge then empties the state dir. Before, the
/// unreadable record pinned all three forever.
#[test]
fn an_unreadable_strict_record_whose_netns_is_gone_no_longer_pins_the_node() {
    require_root();
    let (rig, alone) = routed_strict("unread");
    let rules_before = rig.node.exec_ok(&["ip", "rule"]);
    let strict = strict_profile();
    rig.router("ADD", "s1", &strict, None).ok();
    assert_ne!(strict_node_wide(&rig), alone, "strict settings in place");
    let file = "lcnet+s1+eth0.json";
    std::fs::write(rig.state_dir().join(file), b"").unwrap();
    // The pod dies without a DEL: its netns goes, and its veth with it.
    rig.pod.recreate();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while rig.node.link_exists("pgs0") {
        assert!(std::time::Instant::now() < deadline, "pgs0 never went");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    let out = sweep_once(&rig);
    assert_eq!(
        strict_node_wide(&rig),
        alone,
        "the node-wide strict settings are back:\n{out}"
    );
    assert_eq!(rig.node.exec_ok(&["ip", "rule"]), rules_before, "{out}");
    assert_eq!(podgate_objects(&rig), "", "what the pod left: {out}");
    assert!(
        out.contains(&format!("quarantined unreadable record {file}")),
        "{out}"
    );
    assert!(rig.state_dir().join("quarantine").join(file).exists());
    let log = uninstall_purge(&rig);
    assert_eq!(
        state_files_in(&rig.state_dir()),
        Vec::<String>::new(),
        "the purge ran: {log}"
    );
}

/// The same for a dual-stack strict pod on a node with IPv6: its IPv6
/// rules (neighbour discovery, the link-scope drop, its host-side rule)
/// are found from its host-side rules like the IPv4 ones and go, and the
/// node's rules of both families (the IPv6 local rule moved for it
/// included) are back as they were, with their protocols.
#[test]
fn an_unreadable_dual_stack_strict_record_whose_netns_is_gone_leaves_both_families_as_before() {
    require_root();
    let rig = routed_ipv6_rig("unread6", true);
    strict_values_to_change(&rig);
    let alone = strict_node_wide(&rig);
    let rules = || {
        rig.node.exec_ok(&["ip", "-d", "-4", "rule"])
            + &rig.node.exec_ok(&["ip", "-d", "-6", "rule"])
    };
    let rules_before = rules();
    let profile = json!({
        "routing": {"mode": "strict", "uplink": "pgup0", "gateway": "192.0.2.254",
                    "gateway6": "2001:db8::fe", "table": "auto"}
    });
    rig.router("ADD", "s1", &profile, None).ok();
    let v6_rules = rig.node.exec_ok(&["ip", "-6", "rule"]);
    for want in [
        "ipproto ipv6-icmp lookup local",
        "blackhole",
        "1000:\tfrom all lookup local",
    ] {
        assert!(v6_rules.contains(want), "{want}: {v6_rules}");
    }
    let file = "lcnet+s1+eth0.json";
    std::fs::write(rig.state_dir().join(file), b"").unwrap();
    rig.pod.recreate();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while rig.node.link_exists("pgs0") {
        assert!(std::time::Instant::now() < deadline, "pgs0 never went");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    let out = sweep_once(&rig);
    assert!(
        out.contains(&format!("quarantined unreadable record {file}")),
        "{out}"
    );
    assert_eq!(rules(), rules_before, "ip -d rule, both families: {out}");
    assert_eq!(podgate_objects(&rig), "", "what the pod left: {out}");
    let routes6 = rig
        .node
        .exec_ok(&["ip", "-6", "route", "show", "table", "all", "proto", "94"]);
    assert_eq!(routes6, "", "what the pod left: {out}");
    assert_eq!(strict_node_wide(&rig), alone, "{out}");
}

/// The same emptied record while the strict pod lives: the sweep
/// quarantines it but the node-wide settings stay (the kernel shows the
/// pod bound: its host-side interface exists), and the runtime's DEL then
/// finds it in quarantine, removes the pod's objects by ownership (its
/// prevResult address and host-side rule) and puts the settings back.
#[test]
fn an_unreadable_strict_record_of_a_live_pod_keeps_the_node_bound_until_its_del() {
    require_root();
    let (rig, alone) = routed_strict("unreadlive");
    let strict = strict_profile();
    rig.router("ADD", "s1", &strict, None).ok();
    let with_strict = strict_node_wide(&rig);
    let file = "lcnet+s1+eth0.json";
    std::fs::write(rig.state_dir().join(file), b"").unwrap();
    let out = sweep_once(&rig);
    assert!(
        out.contains(&format!("quarantined unreadable record {file}")),
        "{out}"
    );
    assert_eq!(strict_node_wide(&rig), with_strict, "kept: {out}");
    let objects = podgate_objects(&rig);
    assert!(
        objects.contains("iif pgs0"),
        "the pod stays bound: {objects}"
    );
    rig.router("DEL", "s1", &strict, None).ok();
    assert_eq!(strict_node_wide(&rig), alone, "back after its DEL");
    assert_eq!(podgate_objects(&rig), "");
    assert!(
        state_files_in(&rig.state_dir()).is_empty(),
        "{:?}",
        state_files_in(&rig.state_dir())
    );
}

/// Calls per syscall in an `strace -f` log written with [`counting`].
fn strace_counts(path: &std::path::Path) -> std::collections::BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for line in text.lines() {
        // "PID  call(args) = result", or one call split across
        // "call(args <unfinished ...>" and "<... call resumed>) = result".
        let rest = match line.split_once(' ') {
            Some((pid, rest)) if pid.bytes().all(|b| b.is_ascii_digit()) => rest.trim_start(),
            _ => line,
        };
        if rest.ends_with("<unfinished ...>") || rest.starts_with("---") || rest.starts_with("+++")
        {
            continue;
        }
        // The kernel restarts some calls itself (ERESTARTNOINTR): writing
        // ip_forward does when the RTNL lock is busy elsewhere on the
        // machine. strace shows each attempt; the call is made once.
        if rest
            .rsplit_once(" = ")
            .is_some_and(|(_, result)| result.contains("ERESTART"))
        {
            continue;
        }
        let name = match rest.strip_prefix("<... ") {
            Some(resumed) => resumed.split(' ').next(),
            None => rest.split('(').next(),
        };
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            // The netlink socket's receive timeout is set again only when a
            // request has waited more than 10 ms (a loaded machine) and
            // then restored: time, not work, counted on its own.
            let name = if name == "setsockopt" && rest.contains("SO_RCVTIMEO") {
                RCVTIMEO
            } else {
                name
            };
            *counts.entry(name.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

/// [`strace_counts`]' key of `setsockopt(..., SO_RCVTIMEO, ...)`.
const RCVTIMEO: &str = "setsockopt SO_RCVTIMEO";

/// `strace` arguments tracing file, descriptor and network calls
/// (following threads) into `out`, one line per call for [`strace_counts`].
fn counting(out: &std::path::Path) -> Vec<String> {
    ["-f", "-e", "trace=%file,%desc,%network", "-o"]
        .map(String::from)
        .into_iter()
        .chain([out.display().to_string()])
        .collect()
}

/// Attachment `i` of the node-scale tests (the node-scale bench's pod):
/// its own interface name in the rig's pod netns, a routed pool of its
/// own and masquerade.
fn add_scale_attachment(rig: &Rig, i: usize, strace: &[String]) -> Run {
    let ifname = format!("sc{i}");
    let profile = json!({
        "masquerade": [{"source": "10.8.0.0/24"}],
        "returnRoutes": [{"dst": format!("10.{}.{}.0/24", 100 + i / 256, i % 256)}]
    });
    let mut conf: Value = serde_json::from_slice(&rig.conf(profile, false)).unwrap();
    conf["prevResult"]["interfaces"][1]["name"] = json!(ifname);
    let env = rig.env_if("ADD", &format!("scale-{i}"), &ifname);
    rig.spawn(strace, env, &serde_json::to_vec(&conf).unwrap())
}

/// The calls of one run at 25 and at 250 attachments are the same, except
/// for buffers of listings that hold every attachment: `recvfrom`, up to
/// `dumps` more at 250 (a node route dump the plan reads holds the 225
/// return routes added meanwhile), and `getdents64`, up to 1 more (the
/// names of the state dir; names, not records, are read; the claims index
/// is one file, read and written whole). The netlink receive timeout's
/// settings ([`RCVTIMEO`]) are left out: how many there are depends on how
/// long the kernel took, not on what was asked.
fn assert_same_calls(
    what: &str,
    at25: &std::collections::BTreeMap<String, u64>,
    at250: &std::collections::BTreeMap<String, u64>,
    dumps: u64,
) {
    assert!(
        at25.get("openat").is_some_and(|n| *n > 0),
        "{what}: no file syscalls counted: {at25:?}"
    );
    let [mut at25, mut at250] = [at25.clone(), at250.clone()];
    at25.remove(RCVTIMEO);
    at250.remove(RCVTIMEO);
    for (call, slack) in [("recvfrom", dumps), ("getdents64", 1)] {
        let (n25, n250) = (
            at25.remove(call).unwrap_or(0),
            at250.remove(call).unwrap_or(0),
        );
        assert!(
            n25 <= n250 && n250 <= n25 + slack,
            "{what}: {call}: {n25} at 25 attachments, {n250} at 250"
        );
    }
    assert_eq!(
        at25, at250,
        "{what}: syscalls with 25 attachments (left) and with 250 (right)"
    );
}

#[test]
fn an_add_makes_the_same_file_and_netlink_syscalls_at_25_and_at_250_attachments() {
    require_root();
    assert!(
        strace_available(),
        "strace is needed (integration/install-deps.sh)"
    );
    let rig = Rig::new("scale", Netns::new("lc-pod-scale"), "lcnet");
    let mut counts = Vec::new();
    for i in 0..=250 {
        if i == 25 || i == 250 {
            let out = rig.dir.path().join(format!("strace-{i}"));
            add_scale_attachment(&rig, i, &counting(&out)).ok();
            counts.push(strace_counts(&out));
        } else {
            add_scale_attachment(&rig, i, &[]).ok();
        }
    }
    // The plan checks the pool against the node's routes: one dump.
    assert_same_calls("ADD", &counts[0], &counts[1], 1);
}

#[test]
fn a_strict_add_and_del_make_the_same_file_and_netlink_syscalls_at_25_and_at_250_attachments() {
    require_root();
    assert!(
        strace_available(),
        "strace is needed (integration/install-deps.sh)"
    );
    let rig = Rig::routed("sscale");
    // The strict pod: its own netns behind pgs1; the other attachments
    // (a pool and masquerade each) in the rig's pod.
    let pod = Netns::new("lc-pod-sscale2");
    wire_routed_pod(&rig.node, &pod, "pgs1", "10.40.0.4");
    let ips = json!([{"address": "10.40.0.4/32", "interface": 1}]);
    let strict = json!({
        "sysctls": {"net.ipv4.ip_forward": "1"},
        "routing": {"mode": "strict", "uplink": "pgup0", "gateway": "192.0.2.254", "table": "auto"}
    });
    let rules = rig.node.exec_ok(&["ip", "rule"]);
    let mut adds = Vec::new();
    let mut dels = Vec::new();
    for i in 0..=250 {
        if i == 25 || i == 250 {
            let conf = rig.conf_for(strict.clone(), false, &pod, &ips);
            let cid = format!("strict-{i}");
            for (cmd, counts) in [("ADD", &mut adds), ("DEL", &mut dels)] {
                let out = rig.dir.path().join(format!("strace-{cmd}-{i}"));
                rig.spawn(&counting(&out), rig.env_for(cmd, &cid, &pod), &conf)
                    .ok();
                counts.push(strace_counts(&out));
            }
            // The last strict pod gone: the node-wide settings went back.
            assert_eq!(rig.node.exec_ok(&["ip", "rule"]), rules, "at {i}");
        }
        if i < 250 {
            add_scale_attachment(&rig, i, &[]).ok();
        }
    }
    // Picking a free table reads the node's routes, IPv4 and IPv6: two dumps.
    assert_same_calls("strict ADD", &adds[0], &adds[1], 2);
    assert_same_calls("strict DEL", &dels[0], &dels[1], 0);
}

#[test]
fn a_masquerade_only_add_and_del_make_the_same_file_and_netlink_syscalls_at_25_and_at_250_attachments(
) {
    require_root();
    assert!(
        strace_available(),
        "strace is needed (integration/install-deps.sh)"
    );
    let rig = Rig::new("mscale", Netns::new("lc-pod-mscale"), "lcnet");
    // A profile checking no claims (the VPN gateway's): it reads no other
    // record, whatever the node holds.
    let profile = json!({
        "sysctls": {"net.ipv4.ip_forward": "1"},
        "masquerade": [{"source": "10.8.0.0/24"}]
    });
    let mut conf: Value = serde_json::from_slice(&rig.conf(profile, false)).unwrap();
    conf["prevResult"]["interfaces"][1]["name"] = json!("mq0");
    let conf = serde_json::to_vec(&conf).unwrap();
    let mut adds = Vec::new();
    let mut dels = Vec::new();
    for i in 0..=250 {
        if i == 25 || i == 250 {
            for (cmd, counts) in [("ADD", &mut adds), ("DEL", &mut dels)] {
                let env = rig.env_if(cmd, &format!("masq-{i}"), "mq0");
                let out = rig.dir.path().join(format!("strace-{cmd}-{i}"));
                rig.spawn(&counting(&out), env, &conf).ok();
                counts.push(strace_counts(&out));
            }
        }
        if i < 250 {
            add_scale_attachment(&rig, i, &[]).ok();
        }
    }
    assert_same_calls("masquerade-only ADD", &adds[0], &adds[1], 0);
    assert_same_calls("masquerade-only DEL", &dels[0], &dels[1], 0);
    // It writes no claims index file: its record holds no claim. The next
    // ADD that checks claims reads that record once and marks it indexed.
    let index = rig.state_dir().join("claims.v2");
    let written = || {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&index).unwrap();
        (m.ino(), m.mtime(), m.mtime_nsec(), m.len())
    };
    let before = written();
    rig.spawn(&[], rig.env_if("ADD", "masq-kept", "mq0"), &conf)
        .ok();
    assert_eq!(written(), before, "the masquerade-only ADD wrote the index");
    let marker = format!("c={}+masq-kept+mq0.json", rig.network);
    let entries = || std::fs::read_to_string(&index).unwrap();
    assert!(!entries().lines().any(|l| l == marker));
    add_scale_attachment(&rig, 250, &[]).ok();
    assert!(entries().lines().any(|l| l == marker), "{}", entries());
}

#[test]
fn syscall_counts_take_a_restarted_or_split_call_once() {
    let dir = TempDir::new("strace-counts");
    let log = dir.path().join("strace");
    std::fs::write(
        &log,
        "7887  openat(AT_FDCWD, \"/proc/sys/net/ipv4/ip_forward\", O_RDWR|O_CLOEXEC) = 5\n\
         7887  pwrite64(5, \"1\", 1, 0)            = ? ERESTARTNOINTR (To be restarted)\n\
         7887  pwrite64(5, \"1\", 1, 0)            = 1\n\
         7888  sendto(3, \"x = y\", 5, 0, NULL, 0 <unfinished ...>\n\
         7887  setsockopt(3, SOL_SOCKET, SO_RCVTIMEO_OLD, \"\\0\", 16) = 0\n\
         7887  setsockopt(3, SOL_NETLINK, NETLINK_EXT_ACK, [1], 4) = 0\n\
         7887  --- SIGCHLD {si_signo=SIGCHLD} ---\n\
         7888  <... sendto resumed>)              = 5\n\
         7888  +++ exited with 0 +++\n",
    )
    .unwrap();
    let want: std::collections::BTreeMap<String, u64> = [
        ("openat", 1),
        ("pwrite64", 1),
        ("sendto", 1),
        ("setsockopt", 1),
        (RCVTIMEO, 1),
    ]
    .map(|(n, c)| (n.to_string(), c))
    .into();
    assert_eq!(strace_counts(&log), want);
}
