//! The `podgate` operator CLI end to end, as root, in throwaway namespaces:
//! sysctl get/set/refusal/diff, route and rule add/list/del leaving the netns
//! as before, inspect after a real podgate-router ADD (and drift), ipsec
//! status, and diagnose naming the broken hop of the OpenVPN-pod scenario
//! in each of its three states (forwarding off, no return path, fixed).
//!
//! The binaries are built on first use (`cargo build -p podgate -p
//! podgate-router`) when missing or older than their sources. Set
//! `PODGATE_CLI_TRANSCRIPT=DIR` to keep the diagnose outputs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::vpn::{self, CLIENT_POOL, TUN_CLIENT_IP, TUN_SERVER_IP};
use podgate_integration::{
    assert_same, bin_dir, bridge_name, ipsec, podgate, podgate_bin, require_root, snapshot, Netns,
    Run, TestNode, Verb,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const NET: &str = "vpnnet";
const SUBNET: &str = "10.22.0.0/16";

/// Build podgate and podgate-router when missing or stale.
fn ensure_built() {
    podgate_integration::built_shipped();
}

/// `podgate` entered into `node`, a throwaway netns standing in for a node
/// (`nsenter --net`): the namespace it runs in, which `--node` and the
/// read-only commands' default mean, is that one, never this machine's.
fn podgate_on(node: &Netns, args: &[&str]) -> Run {
    require_root();
    Run::of(
        Command::new("nsenter")
            .arg(format!("--net={}", node.path().display()))
            .arg(podgate_bin())
            .args(args),
    )
}

fn p(ns: &Netns) -> &str {
    ns.path().to_str().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn sysctl_get_set_refusal_and_diff() {
    require_root();
    let node = Netns::new_with_forwarding("cli-node", true);
    let pod = Netns::new_with_forwarding("cli-sysctl", false);
    // (veth pairs: the dummy module may be missing)
    pod.exec_ok(&[
        "ip", "link", "add", "tun0", "type", "veth", "peer", "name", "tun0p",
    ]);

    let r = podgate(&["sysctl", "get", "--netns", p(&pod), "net.ipv4.ip_forward"]);
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (Some(0), "net.ipv4.ip_forward = 0\n"),
        "{r:?}"
    );

    // --pid: a process inside the pod's netns.
    let mut sleeper = pod.spawn(&["sleep", "60"]);
    let pid = sleeper.id().to_string();
    let r = podgate(&[
        "sysctl",
        "get",
        "--pid",
        &pid,
        "--json",
        "net.ipv4.ip_forward",
    ]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(r.json()[0]["value"], "0", "{r:?}");
    let _ = sleeper.kill();
    let _ = sleeper.wait();

    let r = podgate(&[
        "sysctl",
        "set",
        "--netns",
        p(&pod),
        "net.ipv4.ip_forward=1",
        "net.ipv4.conf.tun0.rp_filter=2",
    ]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("net.ipv4.ip_forward: 0 -> 1"), "{r:?}");
    assert_eq!(pod.sysctl_get("net.ipv4.ip_forward"), "1");
    assert_eq!(pod.sysctl_get("net.ipv4.conf.tun0.rp_filter"), "2");
    let r = podgate(&["sysctl", "set", "--netns", p(&pod), "net.ipv4.ip_forward=1"]);
    assert!(r.stdout.contains("(unchanged)"), "{r:?}");

    // Node-wide names are refused (exit 3) before anything is written.
    pod.sysctl_set("net.ipv4.ip_forward", "0");
    for args in [
        vec!["sysctl", "get", "--netns", p(&pod), "kernel.pid_max"],
        vec!["sysctl", "set", "--netns", p(&pod), "vm.swappiness=1"],
        vec![
            "sysctl",
            "set",
            "--netns",
            p(&pod),
            "net.ipv4.ip_forward=1",
            "kernel.pid_max=4194304",
        ],
    ] {
        let r = podgate(&args);
        assert_eq!(r.code, Some(3), "{args:?}: {r:?}");
        assert!(r.stderr.contains("node-wide"), "{r:?}");
    }
    assert_eq!(
        pod.sysctl_get("net.ipv4.ip_forward"),
        "0",
        "nothing written"
    );
    let r = podgate(&[
        "sysctl",
        "get",
        "--netns",
        p(&pod),
        "net.ipv4.conf.nosuch0.rp_filter",
    ]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("no such sysctl"), "{r:?}");

    // diff: the pod next to the (test) node, each interface included.
    let r = podgate(&[
        "sysctl",
        "diff",
        "--netns",
        p(&pod),
        "--node-netns",
        p(&node),
    ]);
    assert_eq!(r.code, Some(0), "{r:?}");
    for needle in [
        "net.ipv4.conf.all.rp_filter",
        "net.ipv4.conf.default.rp_filter",
        "net.ipv4.conf.tun0.rp_filter",
        "net.ipv4.conf.all.src_valid_mark",
        "net.ipv4.tcp_early_demux",
        "net.ipv4.udp_early_demux",
    ] {
        assert!(r.stdout.contains(needle), "{needle}: {r:?}");
    }
    let fwd = r
        .stdout
        .lines()
        .find(|l| l.starts_with("net.ipv4.ip_forward"))
        .unwrap();
    assert!(fwd.contains("differs"), "{fwd}");
    let j = podgate(&[
        "sysctl",
        "diff",
        "--json",
        "--netns",
        p(&pod),
        "--node-netns",
        p(&node),
    ])
    .json();
    let row = j["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "net.ipv4.ip_forward")
        .unwrap()
        .clone();
    assert_eq!(
        row,
        json!({"name": "net.ipv4.ip_forward", "pod": "0", "node": "1", "differs": true})
    );
}

#[test]
fn route_and_rule_add_list_del_leave_the_netns_as_before() {
    require_root();
    let pod = Netns::new("cli-route");
    // No IPv6 link-local addresses appearing later and spoiling the snapshot.
    pod.sysctl_set("net.ipv6.conf.all.disable_ipv6", "1");
    pod.sysctl_set("net.ipv6.conf.default.disable_ipv6", "1");
    pod.sh_ok(
        "ip link add d0 type veth peer name d1 && ip addr add 10.60.0.1/24 dev d0 && \
         ip link set d1 up && ip link set d0 up",
    );
    let before = snapshot(&pod);
    let ns = p(&pod);

    let r = podgate(&[
        "route",
        "add",
        "--netns",
        ns,
        "10.9.0.0/24",
        "via",
        "10.60.0.2",
        "dev",
        "d0",
        "metric",
        "7",
    ]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let r = podgate(&[
        "route",
        "add",
        "--netns",
        ns,
        "10.10.0.0/16",
        "dev",
        "d0",
        "table",
        "100",
        "proto",
        "static",
    ]);
    assert_eq!(r.code, Some(0), "{r:?}");
    // The kernel has them, as `ip` shows (it hides proto boot).
    let shown = pod.exec_ok(&["ip", "route", "show", "10.9.0.0/24"]);
    assert!(shown.contains("via 10.60.0.2 dev d0 metric 7"), "{shown}");
    let shown = pod.exec_ok(&["ip", "route", "show", "table", "100"]);
    assert!(
        shown.contains("10.10.0.0/16 dev d0 proto static scope link"),
        "{shown}"
    );

    let r = podgate(&["route", "list", "--netns", ns]);
    assert!(
        r.stdout
            .contains("10.9.0.0/24 via 10.60.0.2 dev d0 proto boot metric 7\n"),
        "{r:?}"
    );
    assert!(
        r.stdout
            .contains("10.60.0.0/24 dev d0 proto kernel scope link src 10.60.0.1"),
        "{r:?}"
    );
    assert!(!r.stdout.contains("10.10.0.0/16"), "main table only: {r:?}");
    let r = podgate(&["route", "list", "--netns", ns, "table", "all", "-4"]);
    assert!(
        r.stdout
            .contains("10.10.0.0/16 dev d0 table 100 proto static scope link"),
        "{r:?}"
    );
    assert!(
        r.stdout
            .contains("local 10.60.0.1 dev d0 table local proto kernel scope host"),
        "{r:?}"
    );
    let j = podgate(&["route", "list", "--json", "--netns", ns, "table", "100"]).json();
    assert_eq!(j.as_array().unwrap().len(), 1, "{j}");
    assert_eq!(j[0]["protocolName"], "static");
    assert_eq!(j[0]["tableName"], "100");
    assert_eq!(j[0]["dev"], "d0");

    // Exists already: an error, unless --replace.
    let dup = [
        "route",
        "add",
        "--netns",
        ns,
        "10.9.0.0/24",
        "via",
        "10.60.0.2",
        "metric",
        "7",
    ];
    assert_eq!(podgate(&dup).code, Some(1));
    let mut rep = dup.to_vec();
    rep.insert(2, "--replace");
    assert_eq!(podgate(&rep).code, Some(0));

    // `rule del` with the words of `rule add` deletes what they added.
    let words = [
        "from",
        "10.8.0.0/24",
        "iif",
        "d0",
        "lookup",
        "100",
        "pref",
        "100",
    ];
    let r = podgate(&[&["rule", "add", "--netns", ns][..], &words].concat());
    assert_eq!(r.code, Some(0), "{r:?}");
    let r = podgate(&[
        "rule",
        "add",
        "--netns",
        ns,
        "to",
        "10.11.0.0/16",
        "lookup",
        "main",
    ]);
    assert_eq!(r.code, Some(0), "{r:?}");
    // One below the first non-zero preference (100), as the kernel picks.
    assert!(
        r.stdout
            .contains("added: 99: from all to 10.11.0.0/16 lookup main"),
        "{r:?}"
    );
    let r = podgate(&["rule", "list", "--netns", ns, "-4"]);
    assert!(
        r.stdout
            .contains("100:\tfrom 10.8.0.0/24 iif d0 lookup 100\n"),
        "{r:?}"
    );
    assert!(r.stdout.contains("32766:\tfrom all lookup main"), "{r:?}");
    assert!(pod
        .exec_ok(&["ip", "rule", "show"])
        .contains("from 10.8.0.0/24 iif d0 lookup 100"));
    let j = podgate(&["rule", "list", "--json", "--netns", ns, "pref", "100"]).json();
    assert_eq!(j.as_array().unwrap().len(), 1, "{j}");
    assert_eq!(j[0]["from"], "10.8.0.0/24");

    let first = [&["rule", "del", "--netns", ns][..], &words].concat();
    assert_eq!(podgate(&first).code, Some(0));
    assert_eq!(
        podgate(&[
            "rule",
            "del",
            "--netns",
            ns,
            "to",
            "10.11.0.0/16",
            "lookup",
            "main"
        ])
        .code,
        Some(0)
    );
    assert_eq!(podgate(&first).code, Some(1), "already gone");
    let r = podgate(&["route", "del", "--netns", ns, "10.9.0.0/24"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let r = podgate(&[
        "route",
        "del",
        "--netns",
        ns,
        "10.10.0.0/16",
        "table",
        "100",
    ]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let r = podgate(&["route", "del", "--netns", ns, "10.9.0.0/24"]);
    assert_eq!(r.code, Some(1), "already gone: {r:?}");
    assert!(r.stderr.contains("no route 10.9.0.0/24"), "{r:?}");
    // Usage errors are 64, not 1 or 2.
    assert_eq!(
        podgate(&["route", "add", "--netns", ns, "10.9.0.0/24", "bogus"]).code,
        Some(64)
    );
    assert_eq!(podgate(&["route", "list", "--nope"]).code, Some(64));

    assert_same(&before, &snapshot(&pod));
}

/// The helper on a node, without a target: what changes routes, rules or
/// sysctls refuses (64) and the node keeps its IPv6 default route, its
/// rules (`lookup local` among them) and its forwarding; `--dry-run` says
/// what would change and changes nothing; a rule is deleted only when every
/// field is as given (a fwmark rule or a `not` rule is never taken for a
/// plain one); a sysctl that is not per network namespace is refused even
/// with `--node`; with `--node`, the command acts on the node's own.
#[test]
fn changing_commands_need_a_target_and_match_a_rule_on_every_field() {
    let own = OwnNode::new();
    own.without_a_target_changing_commands_refuse();
    own.dry_run_says_and_changes_nothing();
    own.rule_del_matches_every_field();
    own.node_only_knobs_are_refused();
    own.named_it_acts();
}

/// A throwaway netns standing in for the node podgate runs in: an IPv6
/// default route, fwmark, `not`, blackhole and plain rules, forwarding off;
/// its rules and routes as they were at the start.
struct OwnNode {
    node: Netns,
    rules0: String,
    routes0: String,
}

impl OwnNode {
    fn new() -> OwnNode {
        let node = Netns::new("cli-node-own");
        node.sh_ok(
            "ip link add d0 type veth peer name d1 && ip link set d0 up && ip link set d1 up && \
             ip addr add 10.61.0.1/24 dev d0 && ip -6 addr add fd00:61::1/64 dev d0 nodad && \
             ip -6 route add default via fd00:61::2 dev d0 && \
             ip rule add fwmark 0x10 lookup 100 pref 50 && \
             ip rule add not from 10.8.0.0/24 lookup 100 pref 60 && \
             ip rule add from 10.9.0.0/24 blackhole pref 70 && \
             ip rule add from 10.7.0.0/24 lookup 100 pref 90",
        );
        node.sysctl_set("net.ipv4.ip_forward", "0");
        let mut own = OwnNode {
            node,
            rules0: String::new(),
            routes0: String::new(),
        };
        (own.rules0, own.routes0) = (own.rules(), own.routes());
        assert!(
            own.routes0.contains("default via fd00:61::2 dev d0"),
            "{}",
            own.routes0
        );
        assert!(
            own.rules0.contains("0:\tfrom all lookup local"),
            "{}",
            own.rules0
        );
        own
    }

    fn rules(&self) -> String {
        self.node.exec_ok(&["ip", "rule", "show"])
    }

    fn routes(&self) -> String {
        self.node.exec_ok(&["ip", "-6", "route", "show"])
            + &self.node.exec_ok(&["ip", "route", "show"])
    }

    /// Rules, routes and forwarding as at the start.
    fn unchanged(&self, what: &str) {
        assert_eq!(self.rules(), self.rules0, "{what}: rules");
        assert_eq!(self.routes(), self.routes0, "{what}: routes");
        assert_eq!(
            self.node.sysctl_get("net.ipv4.ip_forward"),
            "0",
            "{what}: forwarding"
        );
    }

    /// Without a target, every changing command refuses (64) and changes
    /// nothing; the reading ones keep their default.
    fn without_a_target_changing_commands_refuse(&self) {
        for args in [
            &["route", "del", "-6", "default"][..],
            &["rule", "del", "from", "all", "lookup", "local"],
            &["sysctl", "set", "net.ipv4.ip_forward=1"],
            &["route", "add", "10.62.0.0/24", "via", "10.61.0.2"],
            &["rule", "add", "from", "10.62.0.0/24", "lookup", "100"],
            &["route", "del", "--dry-run", "-6", "default"],
        ] {
            let r = podgate_on(&self.node, args);
            assert_eq!(r.code, Some(64), "{args:?}: {r:?}");
            assert!(
                r.stderr.contains("give --node for the one podgate runs in"),
                "{r:?}"
            );
            self.unchanged(&args.join(" "));
        }
        // The commands that only read keep their default: the namespace podgate runs in.
        let r = podgate_on(&self.node, &["route", "list", "-6"]);
        assert!(r.stdout.contains("default via fd00:61::2 dev d0"), "{r:?}");
    }

    /// With --node --dry-run each says what it would do and does nothing.
    fn dry_run_says_and_changes_nothing(&self) {
        for (args, want) in [
            (
                &["route", "del", "--node", "--dry-run", "-6", "default"][..],
                "would delete: default via fd00:61::2 dev d0",
            ),
            (
                &[
                    "route",
                    "add",
                    "--node",
                    "--dry-run",
                    "10.62.0.0/24",
                    "via",
                    "10.61.0.2",
                ],
                "would add: 10.62.0.0/24 via 10.61.0.2",
            ),
            (
                &[
                    "rule",
                    "del",
                    "--node",
                    "--dry-run",
                    "from",
                    "10.7.0.0/24",
                    "lookup",
                    "100",
                ],
                "would delete: 90: from 10.7.0.0/24 lookup 100 (node (current netns))",
            ),
            (
                &[
                    "rule",
                    "add",
                    "--node",
                    "--dry-run",
                    "from",
                    "10.62.0.0/24",
                    "lookup",
                    "100",
                ],
                "would add: 49: from 10.62.0.0/24 lookup 100",
            ),
            (
                &[
                    "sysctl",
                    "set",
                    "--node",
                    "--dry-run",
                    "net.ipv4.ip_forward=1",
                ],
                "would change: net.ipv4.ip_forward: 0 -> 1 (node (current netns))",
            ),
        ] {
            let r = podgate_on(&self.node, args);
            assert_eq!(r.code, Some(0), "{args:?}: {r:?}");
            assert!(r.stdout.contains(want), "{args:?}: {r:?}");
            self.unchanged(&args.join(" "));
        }
    }

    /// Every field: the words name no fwmark, no `not`, no blackhole, so
    /// those rules are not theirs; `from all` alone names no table.
    fn rule_del_matches_every_field(&self) {
        for (args, code) in [
            (&["rule", "del", "--node", "from", "all"][..], 64),
            (&["rule", "del", "--node", "from", "10.9.0.0/24"], 64),
            (
                &["rule", "del", "--node", "from", "all", "lookup", "100"],
                1,
            ),
            (
                &[
                    "rule",
                    "del",
                    "--node",
                    "from",
                    "10.8.0.0/24",
                    "lookup",
                    "100",
                ],
                1,
            ),
            (&["rule", "del", "--node", "pref", "50", "lookup", "100"], 1),
        ] {
            let r = podgate_on(&self.node, args);
            assert_eq!(r.code, Some(code), "{args:?}: {r:?}");
            self.unchanged(&args.join(" "));
        }
        let r = podgate_on(&self.node, &["rule", "list", "-4"]);
        for line in [
            "50:\tfrom all fwmark 0x10/0xffffffff lookup 100\n",
            "60:\tnot from 10.8.0.0/24 lookup 100\n",
            "70:\tfrom 10.9.0.0/24 blackhole\n",
        ] {
            assert!(r.stdout.contains(line), "{line:?}: {r:?}");
        }
    }

    /// Knobs of the node alone, under net.*: refused even with --node
    /// (bpf_jit_harden is absent from other namespaces, rmem_max read-only
    /// there, the default neighbour thresholds absent).
    fn node_only_knobs_are_refused(&self) {
        let rmem = self.node.sysctl_get("net.core.rmem_max");
        for name in [
            "net.core.bpf_jit_harden=2",
            "net.core.rmem_max=1048576",
            "net.ipv4.neigh.default.gc_thresh3=1",
        ] {
            let r = podgate_on(&self.node, &["sysctl", "set", "--node", name]);
            assert_eq!(r.code, Some(3), "{name}: {r:?}");
            assert!(
                r.stderr.contains("is not per network namespace"),
                "{name}: {r:?}"
            );
        }
        assert_eq!(self.node.sysctl_get("net.core.rmem_max"), rmem);
        self.unchanged("global knobs");
    }

    /// Named, it acts: on the node's own namespace with --node.
    fn named_it_acts(&self) {
        let r = podgate_on(
            &self.node,
            &[
                "sysctl",
                "set",
                "--node",
                "net.ipv4.conf.d0.rp_filter=2",
                "net.ipv4.ip_forward=1",
            ],
        );
        assert_eq!(r.code, Some(0), "{r:?}");
        assert_eq!(self.node.sysctl_get("net.ipv4.conf.d0.rp_filter"), "2");
        assert_eq!(self.node.sysctl_get("net.ipv4.ip_forward"), "1");
        self.node.sysctl_set("net.ipv4.ip_forward", "0");
        let r = podgate_on(
            &self.node,
            &[
                "rule",
                "del",
                "--node",
                "from",
                "10.7.0.0/24",
                "lookup",
                "100",
            ],
        );
        assert_eq!(r.code, Some(0), "{r:?}");
        assert_eq!(
            self.rules(),
            self.rules0
                .replace("90:\tfrom 10.7.0.0/24 lookup 100\n", "")
        );
        let r = podgate_on(&self.node, &["route", "del", "--node", "-6", "default"]);
        assert_eq!(r.code, Some(0), "{r:?}");
        assert!(
            !self.routes().contains("default via fd00:61::2"),
            "{}",
            self.routes()
        );
        assert!(self.rules().contains("0:\tfrom all lookup local"));
    }
}

/// Strict routing's own IPv6 rules on a host-side interface (`ipproto
/// ipv6-icmp ... lookup local`, then a blackhole) beside a plain rule of
/// the same preference and selectors: `rule del` of the plain rule is
/// refused while the ipproto rule, listed first, is the one the kernel
/// would delete (it matches only the fields it is sent), and with a
/// blackhole beside it, it deletes the plain rule and never the blackhole.
#[test]
fn rule_del_never_takes_an_ipproto_or_blackhole_rule_for_a_plain_one() {
    let node = Netns::new("cli-node-proto");
    node.sh_ok(
        "ip link add d0 type veth peer name d1 && ip link set d0 up && \
         ip -6 rule add to fe80::/10 iif d0 ipproto ipv6-icmp lookup local pref 95 proto 94 && \
         ip -6 rule add to fe80::/10 iif d0 lookup local pref 95 && \
         ip -6 rule add to fe80::/10 iif d0 blackhole pref 96 proto 94 && \
         ip -6 rule add to fe80::/10 iif d0 lookup local pref 96",
    );
    let rules = || node.exec_ok(&["ip", "-6", "rule", "show"]);
    let rules0 = rules();
    let icmp = "95:\tfrom all to fe80::/10 iif d0 ipproto ipv6-icmp lookup local proto 94\n";
    let blackhole = "96:\tfrom all to fe80::/10 iif d0 blackhole proto 94\n";
    for line in [icmp, blackhole] {
        assert!(rules0.contains(line), "{line:?}: {rules0}");
    }
    let del = |pref: &str| {
        podgate_on(
            &node,
            &[
                "rule",
                "del",
                "--node",
                "-6",
                "to",
                "fe80::/10",
                "iif",
                "d0",
                "lookup",
                "local",
                "pref",
                pref,
            ],
        )
    };

    let r = del("95");
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("would not tell"), "{r:?}");
    assert_eq!(rules(), rules0, "nothing deleted");

    let r = del("96");
    assert_eq!(r.code, Some(0), "{r:?}");
    let after = rules();
    assert!(after.contains(icmp) && after.contains(blackhole), "{after}");
    assert_eq!(
        after,
        rules0.replace("96:\tfrom all to fe80::/10 iif d0 lookup local\n", ""),
        "only the plain rule at 96 went"
    );
}

fn router_entry(node: &TestNode) -> Value {
    json!({
        "type": "podgate-router",
        "stateDir": node.state_dir(),
        "logFile": node.root().join("router.log"),
        "capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "profiles": {
            "vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}, "masquerade": [{"source": CLIENT_POOL}]},
            "vpn-routed":  {"sysctls": {"net.ipv4.ip_forward": "1"}, "returnRoutes": [{"dst": CLIENT_POOL}]},
            "vpn-forward": {"sysctls": {"net.ipv4.ip_forward": "1"}}
        },
        "assign": [
            {"namespace": "vpn", "podNamePrefix": "openvpn-gw", "profile": "vpn-gateway"},
            {"namespace": "vpn", "podNamePrefix": "openvpn-fwd", "profile": "vpn-forward"}
        ],
        "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]}
    })
}

fn setup(prefix: &str, with_portmap: bool) -> TestNode {
    require_root();
    ensure_built();
    let node = TestNode::new(prefix);
    let mut extra = Vec::new();
    if with_portmap {
        extra
            .push(json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}));
    }
    extra.push(router_entry(&node));
    node.write_conflist(NET, &node.bridge_conflist(NET, "1.0.0", SUBNET, extra));
    node
}

fn pod_args(ns: &str, name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}")
}

fn pod_ip(result: &Value) -> String {
    result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn inspect_shows_what_the_router_applied_and_its_drift() {
    let node = setup("cli-inspect", false);
    let sd = node.state_dir();
    let (sd, nn) = (s(&sd), p(&node.ns));

    let gw = node.pod("gw");
    gw.set_forwarding(false);
    let out = node.cni(
        Verb::Add,
        NET,
        &gw,
        "eth0",
        Some(&pod_args("vpn", "openvpn-gw-0")),
        None,
    );
    out.assert_ok();
    // cnitool's container IDs: `cnitool-` and 20 hex digits of the netns path's hash.
    let cid_gw = out.container_id.clone().unwrap();
    let routed = node.pod("routed");
    routed.set_forwarding(false);
    let ann = json!({"io.kubernetes.cri.pod-annotations": {
        "podgate.dev/profile": "vpn-routed", "podgate.dev/return-routes": "10.8.1.0/24"}});
    let out = node.cni(
        Verb::Add,
        NET,
        &routed,
        "eth0",
        Some(&pod_args("vpn", "web")),
        Some(ann),
    );
    out.assert_ok();
    let cid_routed = out.container_id.clone().unwrap();
    let routed_ip = pod_ip(out.result.as_ref().unwrap());

    let r = podgate(&["inspect", "--all", "--state-dir", sd, "--node-netns", nn]);
    assert_eq!(r.code, Some(0), "{r:?}");
    for needle in [
        &format!("attachment vpnnet/{cid_gw}/eth0"),
        "profile:     vpn-gateway (selected by assign[0])",
        "net.ipv4.ip_forward = 1 (was 0)",
        "masquerade:  inet podgate-eth0: 10.8.0.0/24 out eth0",
        &format!("attachment vpnnet/{cid_routed}/eth0"),
        "profile:     vpn-routed (selected by annotation podgate.dev/profile)",
        &format!("10.8.1.0/24 via {routed_ip} dev {}", bridge_name(NET)),
        "proto podgate",
        "status:      holds",
    ] {
        assert!(r.stdout.contains(needle), "{needle}: {r:?}");
    }
    let j = podgate(&[
        "inspect",
        "--json",
        "--container",
        &cid_gw,
        "--state-dir",
        sd,
        "--node-netns",
        nn,
    ])
    .json();
    let a = &j["attachments"];
    assert_eq!(a.as_array().unwrap().len(), 1, "{j}");
    assert_eq!(a[0]["state"], "holds");
    assert_eq!(a[0]["profile"], "vpn-gateway");
    assert_eq!(a[0]["key"]["containerID"], cid_gw.as_str());

    // --container selects the recorded netns for the other commands too (prefix ok).
    let r = podgate(&[
        "sysctl",
        "get",
        "--container",
        &cid_gw[..16],
        "--state-dir",
        sd,
        "net.ipv4.ip_forward",
    ]);
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (Some(0), "net.ipv4.ip_forward = 1\n"),
        "{r:?}"
    );
    let r = podgate(&[
        "route",
        "list",
        "--container",
        "cnitool-",
        "--state-dir",
        sd,
    ]);
    assert_eq!(r.code, Some(1), "ambiguous prefix: {r:?}");
    assert!(r.stderr.contains("ambiguous"), "{r:?}");

    // Drift: someone turned forwarding off and removed the masquerade table.
    gw.sysctl_set("net.ipv4.ip_forward", "0");
    gw.exec_ok(&["nft", "delete", "table", "inet", "podgate-eth0"]);
    let r = podgate(&[
        "inspect",
        "--container",
        &cid_gw,
        "--state-dir",
        sd,
        "--node-netns",
        nn,
    ]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stdout.contains("status:      DRIFT: "), "{r:?}");
    assert!(
        r.stdout.contains("sysctl net.ipv4.ip_forward is 0, want 1"),
        "{r:?}"
    );
    assert!(
        r.stdout.contains("nft table inet podgate-eth0 is missing"),
        "{r:?}"
    );
    // ... and the node's return route was deleted by hand.
    node.ns.exec_ok(&["ip", "route", "del", "10.8.1.0/24"]);
    let r = podgate(&[
        "inspect",
        "--json",
        "--container",
        &cid_routed,
        "--state-dir",
        sd,
        "--node-netns",
        nn,
    ]);
    assert_eq!(r.code, Some(2), "{r:?}");
    let a = &r.json()["attachments"][0];
    assert_eq!(a["state"], "drift");
    assert!(
        a["drift"][0]
            .as_str()
            .unwrap()
            .contains("node return route 10.8.1.0/24"),
        "{a}"
    );

    // The pod's netns is gone but DEL never ran: the record outlived its pod
    // (stale: it claims nothing, and the next ADD, DEL or GC clears it).
    let routed_path = routed.path().to_path_buf();
    drop(routed);
    let r = podgate(&[
        "inspect",
        "--container",
        &cid_routed,
        "--state-dir",
        sd,
        "--node-netns",
        nn,
    ]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stdout.contains("STALE: netns") && r.stdout.contains("is gone"),
        "{r:?}"
    );

    node.cni_with_netns_path(
        Verb::Del,
        NET,
        &routed_path,
        "eth0",
        Some(&pod_args("vpn", "web")),
        None,
    )
    .assert_ok();
    node.cni(
        Verb::Del,
        NET,
        &gw,
        "eth0",
        Some(&pod_args("vpn", "openvpn-gw-0")),
        None,
    )
    .assert_ok();
    let r = podgate(&["inspect", "--state-dir", sd, "--node-netns", nn]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("no podgate attachments"), "{r:?}");
}

#[test]
fn ipsec_status_without_an_agent_is_a_clear_report() {
    require_root();
    let ns = Netns::new("cli-ipsec");
    let dir = "/nonexistent/podgate-cli-test/protection";
    let db = "/nonexistent/podgate-cli-test/db.sock";
    let base = [
        "ipsec",
        "status",
        "--netns",
        p(&ns),
        "--protection-dir",
        dir,
        "--ovsdb-socket",
        db,
        "--cni-conf-dir",
        "/nonexistent",
    ];
    let r = podgate(&base);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout.contains("IPsec tunnel protection: NOT REQUIRED"),
        "{r:?}"
    );
    assert!(
        r.stdout.contains(&format!(
            "IPsec not in use on this node (required: auto): no {dir}/required, \
             no {dir}/protection.sock, no OVSDB at {db}"
        )),
        "{r:?}"
    );
    assert!(r.stdout.contains("config: defaults"), "{r:?}");
    assert!(
        r.stdout.contains("ike:    no UDP socket bound to 500/4500"),
        "{r:?}"
    );

    let mut always = base.to_vec();
    always.extend(["--required", "always"]);
    let r = podgate(&always);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stdout.contains("NOT READY"), "{r:?}");
    assert!(
        r.stdout.contains(&format!(
            "ipsec not ready: ovsdb socket {db} absent; {dir}/protection.sock absent: agent not serving"
        )),
        "{r:?}"
    );
    always.push("--json");
    let j = podgate(&always).json();
    assert_eq!(j["report"]["verdict"], "notReady");
    assert_eq!(j["report"]["ikeSockets"], json!([]));

    let mut bad = base.to_vec();
    bad.extend(["--required", "sometimes"]);
    assert_eq!(podgate(&bad).code, Some(64));
}

#[test]
fn ipsec_status_reports_the_endpoint_the_guard_and_ike_sockets() {
    let g = ipsec::GuardNode::with_agent(
        "cli",
        ipsec::AgentOpts {
            status: true,
            ..Default::default()
        },
    );
    g.configure(json!({"agentSocket": g.agent.status_socket()}));
    let conf = g.node.conf_dir().join("10-tg.conflist");
    let nn = p(&g.node.ns);
    let args = ["ipsec", "status", "--netns", nn, "--config", s(&conf)];
    let r = podgate(&args);
    keep("ipsec-status", &args, &r);
    assert_eq!(r.code, Some(0), "{r:?}");
    for needle in [
        "IPsec tunnel protection: READY",
        "signals:     required file yes, protection.sock yes, ovsdb keys ovn-ipsec-protection-node-uid",
        "agent:       /armed 200, /startup not asked",
        &format!("_uuid {} system-id chassis-cli, 2 OVN tunnel port(s)", g.ovsdb.uuid()),
        "lease:       mark 759815 (0xb9807) reqid 31337",
        "guard ipv4:  present",
        "guard ipv6:  present",
        "bypass:      none",
        "phase Running",
        "certificate: expires",
        "[ok  ] tunnels",
    ] {
        assert!(r.stdout.contains(needle), "{needle}: {r:?}");
    }
    assert!(
        !r.stdout.contains("PRIVATE KEY")
            && !r.stdout.contains("BEGIN")
            && !r.stdout.contains("TESTLEASE"),
        "{r:?}"
    );
    // Without --config: found in the CNI conf dir.
    let r = podgate(&[
        "ipsec",
        "status",
        "--netns",
        nn,
        "--cni-conf-dir",
        s(&g.node.conf_dir()),
    ]);
    assert!(
        r.stdout.contains(&format!("config: {}", conf.display())),
        "{r:?}"
    );

    // An IKE daemon's socket shows up; a missing guard makes it not ready.
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let mut ike = g.node.ns.spawn(&[
        python,
        "-c",
        "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('0.0.0.0',4500))\ntime.sleep(60)",
    ]);
    assert!(vpn::wait_for(
        || podgate(&["ipsec", "status", "--netns", nn, "--config", s(&conf)])
            .stdout
            .contains("1 UDP socket(s) on 500/4500"),
        10
    ));
    g.remove_guard("", ipsec::MARK);
    let r = podgate(&[
        "ipsec",
        "status",
        "--netns",
        nn,
        "--config",
        s(&conf),
        "--json",
    ]);
    assert_eq!(r.code, Some(2), "{r:?}");
    let j = r.json();
    assert_eq!(j["report"]["verdict"], "notReady");
    assert_eq!(j["report"]["ikeSockets"][0]["local"], "0.0.0.0:4500");
    let _ = ike.kill();
    let _ = ike.wait();
}

/// The first line of `out` starting with `prefix` (a table row).
fn row<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines().find(|l| l.starts_with(prefix)).unwrap_or("")
}

/// Keep a diagnose output when PODGATE_CLI_TRANSCRIPT names a directory.
fn keep(name: &str, args: &[&str], r: &Run) {
    if let Some(dir) = std::env::var_os("PODGATE_CLI_TRANSCRIPT") {
        let text = format!(
            "$ podgate {}\n{}(exit {})\n",
            args.join(" "),
            r.stdout,
            r.code.unwrap_or(-1)
        );
        std::fs::write(PathBuf::from(dir).join(format!("{name}.txt")), text).unwrap();
    }
}

/// The OpenVPN-pod case: a VPN client outside the cluster, the OpenVPN server
/// in a pod, a backend pod, a Service VIP (DNAT on the node, as kube-proxy
/// does) and a "public" host behind the node. Each round is a fresh VPN pod;
/// diagnose must name the right hop, and what the client really experiences
/// must agree.
#[test]
fn diagnose_names_the_broken_hop_in_the_openvpn_scenario() {
    let node = setup("cli-diag", true);
    let client = vpn::client(&node, "d");
    let nn = p(&node.ns).to_string();
    let sd = s(&node.state_dir()).to_string();

    let backend = node.pod("backend");
    let b = node.cni(
        Verb::Add,
        NET,
        &backend,
        "eth0",
        Some(&pod_args("default", "backend")),
        None,
    );
    b.assert_ok();
    let backend_ip = pod_ip(b.result.as_ref().unwrap());
    let _srv = podgate_integration::tcp_listen_peer_echo(&backend, 8080);

    service_vip(&node, &backend_ip);
    let _public = public_host_behind(&node);

    let client_routes = [
        ("10.22.0.0", "255.255.0.0"),
        ("10.96.0.0", "255.255.0.0"),
        ("203.0.113.0", "255.255.255.0"),
    ];
    let portmap =
        json!({"portMappings": [{"hostPort": 1194, "containerPort": 1194, "protocol": "udp"}]});
    let hops = |ns_args: Vec<String>| -> Vec<String> {
        let mut v = vec!["diagnose".to_string()];
        v.extend(ns_args);
        v.extend(
            [
                "--node-netns",
                &nn,
                "--peer",
                TUN_CLIENT_IP,
                "--from",
                TUN_SERVER_IP,
                "--pod",
                &backend_ip,
                "--service",
                "10.96.0.10:80",
                "--public",
                "203.0.113.7",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        v
    };
    let reaches = |ip: &str, port: u16| {
        podgate_integration::tcp_request(&client.client, ip, port, Duration::from_secs(3))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };

    // (round, pod name, expected exit, needles in the verdict)
    let rounds: [(&str, &str); 3] = [
        ("1-forwarding-off", "plain-vpn"),
        ("2-no-return-path", "openvpn-fwd-0"),
        ("3-fixed", "openvpn-gw-0"),
    ];
    for (i, (round, name)) in rounds.into_iter().enumerate() {
        let vpn_pod = node.pod(name);
        vpn_pod.set_forwarding(false);
        let cap = json!({"portMappings": portmap["portMappings"]});
        let out = node.cni(
            Verb::Add,
            NET,
            &vpn_pod,
            "eth0",
            Some(&pod_args("vpn", name)),
            Some(cap.clone()),
        );
        out.assert_ok();
        let vpn_ip = pod_ip(out.result.as_ref().unwrap());
        let server = vpn::server(&vpn_pod, &client.key);
        let cl = vpn::connect(
            &client.client,
            &client.key,
            42000 + i as u16,
            &client_routes,
        );
        assert!(
            vpn::wait_for(
                || podgate_integration::ping(&client.client, TUN_SERVER_IP, 1),
                20
            ),
            "{round}: tunnel never came up\n{}",
            vpn::logs(&client.key)
        );

        let sel = if round.starts_with('3') {
            // Pools come from podgate's record.
            vec![
                "--container".into(),
                out.container_id.clone().unwrap(),
                "--state-dir".into(),
                sd.clone(),
            ]
        } else {
            vec![
                "--netns".into(),
                p(&vpn_pod).into(),
                "--pool".into(),
                CLIENT_POOL.into(),
            ]
        };
        let args = hops(sel);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = podgate(&argv);
        keep(round, &argv, &r);
        let seen = reaches(&backend_ip, 8080);
        let d = Diag {
            argv: &argv,
            nn: &nn,
            backend_ip: &backend_ip,
            vpn_ip: &vpn_ip,
            reaches: &reaches,
        };
        match i {
            0 => d.forwarding_off(&r, seen),
            1 => d.no_return_path(&r, seen),
            _ => d.fixed(&r, seen),
        }
        vpn::stop(cl);
        vpn::stop(server);
        node.cni(
            Verb::Del,
            NET,
            &vpn_pod,
            "eth0",
            Some(&pod_args("vpn", name)),
            Some(cap),
        )
        .assert_ok();
    }
    node.cni(
        Verb::Del,
        NET,
        &backend,
        "eth0",
        Some(&pod_args("default", "backend")),
        None,
    )
    .assert_ok();
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
}

/// Service VIP 10.96.0.10:80 -> `backend_ip`:8080 on the node, masqueraded
/// like kube-proxy's hairpin.
fn service_vip(node: &TestNode, backend_ip: &str) {
    node.ns.sh_ok(&format!(
        "nft -f - <<'EOF'\n\
         table ip svc {{\n\
           chain pre {{ type nat hook prerouting priority -100; ip daddr 10.96.0.10 tcp dport 80 dnat to {backend_ip}:8080; }}\n\
           chain post {{ type nat hook postrouting priority 100; ct status dnat ip daddr {backend_ip} masquerade; }}\n\
         }}\nEOF"
    ));
}

/// A public host (203.0.113.7) behind the node, routing back to the node
/// for pod addresses.
fn public_host_behind(node: &TestNode) -> Netns {
    let public = Netns::new("public");
    let up = format!("pgpub{}", std::process::id() % 100_000);
    node.ns.exec_ok(&[
        "ip",
        "link",
        "add",
        &up,
        "type",
        "veth",
        "peer",
        "name",
        "wan0",
        "netns",
        public.name(),
    ]);
    node.ns
        .exec_ok(&["ip", "addr", "add", "198.51.100.1/24", "dev", &up]);
    node.ns.exec_ok(&["ip", "link", "set", &up, "up"]);
    node.ns.exec_ok(&[
        "ip",
        "route",
        "add",
        "203.0.113.0/24",
        "via",
        "198.51.100.2",
    ]);
    public.sh_ok(
        "ip addr add 198.51.100.2/24 dev wan0 && ip link set wan0 up && \
         ip addr add 203.0.113.7/32 dev lo && ip route add default via 198.51.100.1",
    );
    public
}

/// One diagnose round's inputs: the command line, the node netns, the
/// backend's and the VPN pod's addresses, whether the client reaches
/// an address and port (what answered, if anything).
struct Diag<'a> {
    argv: &'a [&'a str],
    nn: &'a str,
    backend_ip: &'a str,
    vpn_ip: &'a str,
    reaches: &'a dyn Fn(&str, u16) -> Option<String>,
}

impl Diag<'_> {
    /// Round 1, forwarding off in the VPN pod: diagnose names it, and the
    /// client really gets nothing past the peer.
    fn forwarding_off(&self, r: &Run, seen: Option<String>) {
        let backend_ip = self.backend_ip;
        assert_eq!(r.code, Some(2), "{r:?}");
        assert!(r.stdout.contains(&format!(
        "verdict: pod {backend_ip} silent for tunnel clients: forwarding is off in the pod netns (net.ipv4.ip_forward = 0)"
    )), "{r:?}");
        assert!(row(&r.stdout, "forwarding ipv4").contains("FAIL"), "{r:?}");
        assert!(row(&r.stdout, "peer").contains(" ok "), "{r:?}");
        assert!(row(&r.stdout, "pod ").contains("BLOCKED"), "{r:?}");
        assert!(row(&r.stdout, "service").contains("not probed"), "{r:?}");
        assert_eq!(seen, None, "the client really gets nothing past the peer");
    }

    /// Round 2, forwarding on but no masquerade and no return route:
    /// named; then the other fix, a return route made with podgate itself,
    /// and every hop answers with the client's own address arriving.
    fn no_return_path(&self, r: &Run, seen: Option<String>) {
        let (argv, nn, backend_ip, vpn_ip) = (self.argv, self.nn, self.backend_ip, self.vpn_ip);
        let reaches = self.reaches;
        assert_eq!(r.code, Some(2), "{r:?}");
        assert!(r.stdout.contains(&format!(
        "verdict: pod {backend_ip} silent: forwarding is on; no masquerade for 10.8.0.0/24 and no return route on the node: replies cannot find the tunnel"
    )), "{r:?}");
        assert!(row(&r.stdout, "forwarding ipv4").contains(" ok "), "{r:?}");
        assert_eq!(seen, None, "the client really gets nothing past the peer");

        // The other fix: a return route on the node, made with podgate itself.
        let add = podgate(&["route", "add", "--netns", nn, CLIENT_POOL, "via", vpn_ip]);
        assert_eq!(add.code, Some(0), "{add:?}");
        let r = podgate(argv);
        keep("2b-return-route", argv, &r);
        assert_eq!(r.code, Some(0), "{r:?}");
        assert!(r.stdout.contains("verdict: all 4 hops answer"), "{r:?}");
        assert!(
            r.stdout
                .contains("return route on the node: 10.8.0.0/24 via"),
            "{r:?}"
        );
        assert_eq!(
            reaches(backend_ip, 8080).as_deref(),
            Some(TUN_CLIENT_IP),
            "the client's own address arrives"
        );
        let del = podgate(&["route", "del", "--netns", nn, CLIENT_POOL, "via", vpn_ip]);
        assert_eq!(del.code, Some(0), "{del:?}");
    }

    /// Round 3, podgate's profile: every hop answers, masqueraded to the
    /// VPN pod, the Service reached; the JSON says the same.
    fn fixed(&self, r: &Run, seen: Option<String>) {
        let (argv, vpn_ip) = (self.argv, self.vpn_ip);
        let reaches = self.reaches;
        assert_eq!(r.code, Some(0), "{r:?}");
        assert!(
            r.stdout
                .contains("verdict: all 4 hops answer: peer 10.8.0.2 -> pod"),
            "{r:?}"
        );
        assert!(
            r.stdout
                .contains("masquerade in the pod: inet podgate-eth0 10.8.0.0/24 out eth0"),
            "{r:?}"
        );
        assert!(
            !r.stdout.contains("FAIL")
                && !r.stdout.contains("SILENT")
                && !r.stdout.contains("BLOCKED"),
            "{r:?}"
        );
        assert_eq!(seen.as_deref(), Some(vpn_ip), "masqueraded to the VPN pod");
        assert!(
            reaches("10.96.0.10", 80).is_some(),
            "the client reaches the Service"
        );
        let j = podgate(&[argv, &["--json"]].concat()).json();
        assert_eq!(j["verdict"]["ok"], true, "{j}");
        assert_eq!(j["hops"].as_array().unwrap().len(), 4);
        assert_eq!(j["pools"], json!([CLIENT_POOL]));
    }
}

#[test]
fn diagnose_classifies_dns_apart_from_forwarding() {
    let node = setup("cli-dns", false);
    let dnspod = node.pod("dns");
    let d = node.cni(
        Verb::Add,
        NET,
        &dnspod,
        "eth0",
        Some(&pod_args("default", "dns")),
        None,
    );
    d.assert_ok();
    let dns_ip = pod_ip(d.result.as_ref().unwrap());
    // A tiny DNS server: answers A queries for kubernetes.default, NXDOMAIN otherwise.
    let script = r#"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 53))
while True:
    q, a = s.recvfrom(512)
    i, name = 12, []
    while q[i]:
        name.append(q[i+1:i+1+q[i]].decode()); i += 1 + q[i]
    qend = i + 5
    ok = ".".join(name) == "kubernetes.default"
    h = q[:2] + bytes([0x81, 0x80 if ok else 0x83]) + b"\x00\x01" + (b"\x00\x01" if ok else b"\x00\x00") + b"\x00\x00\x00\x00"
    r = h + q[12:qend]
    if ok:
        r += b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x1e\x00\x04" + bytes([10, 96, 0, 1])
    s.sendto(r, a)
"#;
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let mut srv = dnspod.spawn(&[python, "-c", script]);
    let pod = node.pod("client");
    let c = node.cni(
        Verb::Add,
        NET,
        &pod,
        "eth0",
        Some(&pod_args("default", "client")),
        None,
    );
    c.assert_ok();
    let ns = p(&pod).to_string();
    let ask = |name: &str| {
        podgate(&[
            "diagnose",
            "--netns",
            &ns,
            "--pod",
            &dns_ip,
            "--dns",
            name,
            "--dns-server",
            &dns_ip,
        ])
    };
    assert!(vpn::wait_for(
        || ask("kubernetes.default").code == Some(0),
        10
    ));
    let r = ask("kubernetes.default");
    assert!(
        r.stdout.contains("kubernetes.default -> 10.96.0.1"),
        "{r:?}"
    );
    let r = ask("nosuch.default");
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stdout.contains(&format!(
            "verdict: nameserver {dns_ip} answers, but nosuch.default: NXDOMAIN"
        )),
        "{r:?}"
    );
    assert!(r.stdout.contains("so this is DNS, not forwarding"), "{r:?}");
    let _ = srv.kill();
    let _ = srv.wait();
    let r = ask("kubernetes.default");
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stdout.contains("nothing serves DNS")
            || r.stdout.contains("did not answer")
            || r.stdout.contains("silent"),
        "{r:?}"
    );
    for (p_, n) in [(&pod, "client"), (&dnspod, "dns")] {
        node.cni(
            Verb::Del,
            NET,
            p_,
            "eth0",
            Some(&pod_args("default", n)),
            None,
        )
        .assert_ok();
    }
}

/// Issue 15: a pool routed back to the pod (`returnRoutes`) keeps the client's
/// source address, which the primary's anti-spoofing must allow: diagnose
/// names the setting for the node's primary (Calico here, from a copy of a
/// real Calico conflist), says so when it cannot recognise the primary, and
/// says nothing about spoofing under bridge.
/// `diagnose --dns` with `--pid` reads the pod's resolv.conf, which the pod
/// controls: a FIFO there, a link to `/dev/zero` and `/dev/zero` itself
/// (bind-mounted) end it at once with an error naming the file, reading
/// nothing (it neither blocks nor fills memory: it runs under a 1 GiB
/// address-space limit and a 30 s timeout here).
#[test]
fn diagnose_dns_neither_blocks_nor_fills_memory_on_a_hostile_resolv_conf() {
    require_root();
    ensure_built();
    let pod = Netns::new("cli-resolv");
    for (what, setup, says) in [
        ("a FIFO", "mkfifo /etc/resolv.conf", "not a regular file"),
        (
            "a link to /dev/zero",
            "ln -s /dev/zero /etc/resolv.conf",
            "symbolic link",
        ),
        (
            "/dev/zero bind-mounted",
            ": > /etc/resolv.conf && mount --bind /dev/zero /etc/resolv.conf",
            "not a regular file",
        ),
    ] {
        // The pod's own mount namespace, its /etc a tmpfs of its own.
        let script = format!("mount -t tmpfs pg-resolv /etc && {setup} && exec sleep 60");
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", p(&pod)))
            .args(["unshare", "--mount", "--propagation", "private"])
            .args(["sh", "-c", &script])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        let comm = format!("/proc/{pid}/comm");
        assert!(
            vpn::wait_for(
                || std::fs::read_to_string(&comm).is_ok_and(|c| c == "sleep\n"),
                10
            ),
            "{what}: the pod process never started"
        );
        let started = std::time::Instant::now();
        let out = Command::new("prlimit")
            .arg("--as=1073741824")
            .args(["timeout", "30"])
            .arg(bin_dir().join("podgate"))
            .args(["diagnose", "--pid", &pid, "--dns", "kubernetes.default"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let took = started.elapsed();
        let _ = child.kill();
        let _ = child.wait();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            took < Duration::from_secs(10),
            "{what}: took {took:?}, exit {:?}: {err}",
            out.status.code()
        );
        assert!(
            !out.status.success() && err.contains("resolv.conf") && err.contains(says),
            "{what}: exit {:?}: {err}",
            out.status.code()
        );
    }
}

#[test]
fn diagnose_names_the_primarys_anti_spoofing_for_routed_pools() {
    let node = setup("cli-primary", false);
    let sd = node.state_dir();
    let (sd, nn) = (s(&sd), p(&node.ns));
    let routed = node.pod("routed");
    let ann = json!({"io.kubernetes.cri.pod-annotations": {"podgate.dev/profile": "vpn-routed"}});
    let cid_routed = node
        .cni(
            Verb::Add,
            NET,
            &routed,
            "eth0",
            Some(&pod_args("vpn", "web")),
            Some(ann.clone()),
        )
        .assert_ok()
        .container_id
        .clone()
        .unwrap();
    let diagnose = |conf_dir: &Path, json: bool| {
        let mut args = vec![
            "diagnose",
            "--container",
            &cid_routed,
            "--state-dir",
            sd,
            "--node-netns",
            nn,
            "--cni-conf-dir",
            conf_dir.to_str().unwrap(),
        ];
        if json {
            args.push("--json");
        }
        podgate(&args)
    };

    // The node's own primary: bridge, which filters no sources.
    let r = diagnose(&node.conf_dir(), false);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("return path 10.8.0.0/24  ok"), "{r:?}");
    assert!(!r.stdout.contains("anti-spoofing"), "{r:?}");

    let calico = podgate_integration::TempDir::new("calico-net.d");
    std::fs::copy(
        podgate_integration::workspace_root()
            .join("integration/fixtures/primaries/10-calico.conflist"),
        calico.path().join("10-calico.conflist"),
    )
    .unwrap();
    let r = diagnose(calico.path(), false);
    assert_eq!(r.code, Some(0), "{r:?}");
    let spoof = row(&r.stdout, "anti-spoofing 10.8.0.0/24");
    for needle in [
        "warn",
        "primary calico (10-calico.conflist)",
        "`workloadSourceSpoofing: Any` in the FelixConfiguration named default",
        "`cni.projectcalico.org/allowedSourcePrefixes: '[\"10.8.0.0/24\"]'`",
    ] {
        assert!(spoof.contains(needle), "{needle:?} missing in {spoof}");
    }
    let j = diagnose(calico.path(), true).json();
    assert_eq!(j["facts"]["primary"]["plugin"], "calico", "{j}");
    keep(
        "diagnose-calico",
        &["diagnose", "--container", "cid-routed"],
        &r,
    );

    // A primary podgate does not know: said so, no guess.
    std::fs::write(
        calico.path().join("05-weave.conflist"),
        r#"{"cniVersion": "0.3.1", "name": "weave", "plugins": [{"type": "weave-net"}]}"#,
    )
    .unwrap();
    let r = diagnose(calico.path(), false);
    let spoof = row(&r.stdout, "anti-spoofing 10.8.0.0/24");
    assert!(
        spoof.contains("does not recognise the primary weave-net"),
        "{spoof}"
    );
    assert!(!spoof.contains("calico"), "{spoof}");

    node.cni(
        Verb::Del,
        NET,
        &routed,
        "eth0",
        Some(&pod_args("vpn", "web")),
        Some(ann),
    )
    .assert_ok();
}
