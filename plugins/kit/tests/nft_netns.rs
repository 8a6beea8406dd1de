//! Root-only tests of `podgate_kit::nft` against the real kernel.
//!
//! Every test runs inside network namespaces it creates itself (a thread that
//! calls `unshare(CLONE_NEWNET)`, or named namespaces removed on drop), so the
//! host's networking is never touched. They need root, `nft`, `iptables-nft`
//! and `ip` (CI runs as root and installs them: integration/install-deps.sh)
//! and fail, never skip, without them.
//!
//! `nft` (the CLI) is used only to cross-check what the kernel holds and to
//! create foreign rules.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::fs::File;
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use podgate_kit::nft::{
    Family, Hook, ListedRule, MasqRule, MssDirection, MssRule, MssValue, NftError, NftSocket,
    SnatKind, TableRules,
};

const TAG: &str = "podgate:test-container";

fn rule(src: &str, oif: &str) -> MasqRule {
    MasqRule {
        source: src.parse().unwrap(),
        oifname: oif.into(),
    }
}

/// Fail loudly without root: these tests cannot mean anything otherwise.
fn require_root() {
    let euid = nix::unistd::geteuid();
    assert!(
        euid.is_root(),
        "the nf_tables kernel tests need root to create network namespaces (euid is {euid})"
    );
}

/// Runs `f` on a new thread that first moves into a fresh network namespace.
/// Only that thread (and processes it spawns) sees the namespace; the test
/// harness' threads stay where they are.
fn in_new_netns<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    require_root();
    let handle = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
        f()
    });
    match handle.join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Runs the nft CLI in the calling thread's namespace (Command forks from
/// this thread, so the child inherits its netns).
fn nft(args: &[&str]) -> String {
    let out = Command::new("nft")
        .args(args)
        .output()
        .expect("run nft (nftables must be installed: integration/install-deps.sh)");
    assert!(
        out.status.success(),
        "nft {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn rules_of(listed: &[ListedRule]) -> Vec<(Option<MasqRule>, Option<String>)> {
    listed
        .iter()
        .map(|l| (l.rule.clone(), l.tag.clone()))
        .collect()
}

#[test]
fn replace_list_delete_round_trip() {
    in_new_netns(|| {
        let mut s = NftSocket::new().unwrap();
        let table = "podgate_test";
        assert_eq!(s.list_masquerade(table).unwrap(), None);

        let wanted = vec![rule("10.8.0.0/24", "eth0"), rule("fd00:8::/64", "eth0")];
        s.replace_masquerade_table(table, &wanted, TAG).unwrap();

        let listed = s.list_masquerade(table).unwrap().unwrap();
        assert_eq!(
            rules_of(&listed),
            wanted
                .iter()
                .map(|r| (Some(r.clone()), Some(TAG.to_string())))
                .collect::<Vec<_>>()
        );
        assert!(listed.iter().all(|l| l.handle > 0));

        let text = nft(&["list", "table", "inet", table]);
        eprintln!("{text}");
        assert!(
            text.contains("type nat hook postrouting priority srcnat; policy accept;"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "ip saddr 10.8.0.0/24 oifname \"eth0\" masquerade comment \"{TAG}\""
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "ip6 saddr fd00:8::/64 oifname \"eth0\" masquerade comment \"{TAG}\""
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("table inet {table} {{\n\tcomment \"{TAG}\"")),
            "{text}"
        );
        let json = nft(&["-j", "list", "ruleset"]);
        assert!(
            json.contains(&format!(
                "\"table\": \"{table}\", \"name\": \"postrouting\", \"handle\": 1, \"type\": \"nat\", \"hook\": \"postrouting\", \"prio\": 100, \"policy\": \"accept\""
            )),
            "{json}"
        );

        // Replacing again is idempotent: still exactly one copy of each rule.
        s.replace_masquerade_table(table, &wanted, TAG).unwrap();
        let again = s.list_masquerade(table).unwrap().unwrap();
        assert_eq!(rules_of(&again), rules_of(&listed));
        let text = nft(&["list", "ruleset"]);
        assert_eq!(text.matches("masquerade").count(), 2, "{text}");
        assert_eq!(text.matches("table inet").count(), 1, "{text}");

        // Replacing with a different set drops the old rules.
        let fewer = vec![rule("192.168.7.1/32", "wg0")];
        s.replace_masquerade_table(table, &fewer, "other-tag")
            .unwrap();
        let listed = s.list_masquerade(table).unwrap().unwrap();
        assert_eq!(
            rules_of(&listed),
            vec![(Some(fewer[0].clone()), Some("other-tag".into()))]
        );

        // An empty rule set leaves table and chain in place.
        s.replace_masquerade_table(table, &[], TAG).unwrap();
        assert_eq!(s.list_masquerade(table).unwrap(), Some(vec![]));

        assert!(s.delete_table(table).unwrap());
        assert!(!s.delete_table(table).unwrap());
        assert_eq!(s.list_masquerade(table).unwrap(), None);
        assert!(!nft(&["list", "ruleset"]).contains(table));
    });
}

fn mss(pool: &str, direction: MssDirection, value: MssValue) -> MssRule {
    MssRule {
        pool: pool.parse().unwrap(),
        ifname: "eth0".into(),
        direction,
        mss: value,
    }
}

/// The MSS-clamp chain: the kernel accepts our encoding, lists it back as
/// ours, and `nft` reads it as the rule we mean.
#[test]
fn mss_clamp_chain_round_trip() {
    in_new_netns(|| {
        let mut s = NftSocket::new().unwrap();
        let table = "podgate_mss";
        let clamp = vec![
            mss("10.8.0.0/24", MssDirection::FromPool, MssValue::Pmtu),
            mss("10.8.0.0/24", MssDirection::ToPool, MssValue::Pmtu),
            mss("fd00:8::/64", MssDirection::FromPool, MssValue::Fixed(1220)),
            mss("10.9.0.0/16", MssDirection::ToPool, MssValue::Fixed(1300)),
        ];
        let masq = vec![rule("10.8.0.0/24", "eth0")];
        let spec = TableRules {
            masquerade: Some(&masq),
            mss: &clamp,
        };
        s.replace_table(table, &spec, TAG).unwrap();
        let listed = s.list_mss(table).unwrap().unwrap();
        assert_eq!(
            listed.iter().map(|l| l.rule.clone()).collect::<Vec<_>>(),
            clamp.iter().cloned().map(Some).collect::<Vec<_>>()
        );
        assert!(listed.iter().all(|l| l.tag.as_deref() == Some(TAG)));
        assert_eq!(
            rules_of(&s.list_masquerade(table).unwrap().unwrap()).len(),
            1
        );

        let text = nft(&["list", "table", "inet", table]);
        eprintln!("{text}");
        for want in [
            "type filter hook forward priority mangle; policy accept;",
            "ip saddr 10.8.0.0/24 oifname \"eth0\" tcp flags syn / syn,rst tcp option maxseg size set rt mtu",
            "ip daddr 10.8.0.0/24 iifname \"eth0\" tcp flags syn / syn,rst tcp option maxseg size set rt mtu",
            "ip6 saddr fd00:8::/64 oifname \"eth0\" tcp flags syn / syn,rst tcp option maxseg size set 1220",
            "ip daddr 10.9.0.0/16 iifname \"eth0\" tcp flags syn / syn,rst tcp option maxseg size set 1300",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let json = nft(&["-j", "list", "ruleset"]);
        assert!(
            json.contains("{\"mangle\": {\"key\": {\"tcp option\": {\"name\": \"maxseg\", \"field\": \"size\"}}, \"value\": {\"rt\": {\"key\": \"mtu\"}}}}"),
            "{json}"
        );
        // A rule someone else adds to the chain is listed as foreign.
        nft(&[
            "add", "rule", "inet", table, "forward", "tcp", "flags", "syn", "tcp", "option",
            "maxseg", "size", "set", "1400",
        ]);
        let listed = s.list_mss(table).unwrap().unwrap();
        assert_eq!(listed.len(), 5);
        assert_eq!(listed[4].rule, None);

        // MSS only: no nat chain is created.
        s.replace_table(
            table,
            &TableRules {
                masquerade: None,
                mss: &clamp[..1],
            },
            TAG,
        )
        .unwrap();
        assert_eq!(s.list_mss(table).unwrap().unwrap().len(), 1);
        assert_eq!(s.list_masquerade(table).unwrap(), Some(vec![]));
        let text = nft(&["list", "table", "inet", table]);
        assert!(!text.contains("postrouting"), "{text}");
        assert!(s.delete_table(table).unwrap());
        assert_eq!(s.list_mss(table).unwrap(), None);
    });
}

#[test]
fn foreign_rules_are_reported_as_drift() {
    in_new_netns(|| {
        let mut s = NftSocket::new().unwrap();
        let table = "pg";
        s.replace_masquerade_table(table, &[rule("10.8.0.0/24", "eth0")], TAG)
            .unwrap();
        // nft's own encoding of the same match (3-byte payload load, no
        // bitwise) is not our exact shape; neither is a counter.
        nft(&[
            "add",
            "rule",
            "inet",
            table,
            "postrouting",
            "ip",
            "saddr",
            "10.9.0.0/24",
            "oifname",
            "eth0",
            "masquerade",
        ]);
        nft(&["add", "rule", "inet", table, "postrouting", "counter"]);
        // But nft's encoding of a full-length IPv6 match is identical to ours.
        nft(&[
            "add",
            "rule",
            "inet",
            table,
            "postrouting",
            "ip6",
            "saddr",
            "fd00::1",
            "oifname",
            "eth1",
            "masquerade",
            "comment",
            "\"hand made\"",
        ]);
        let listed = s.list_masquerade(table).unwrap().unwrap();
        assert_eq!(listed.len(), 4, "{listed:?}");
        assert_eq!(listed[0].rule, Some(rule("10.8.0.0/24", "eth0")));
        assert_eq!(listed[0].tag.as_deref(), Some(TAG));
        assert_eq!(listed[1].rule, None);
        assert_eq!(listed[1].tag, None);
        assert_eq!(listed[2].rule, None);
        assert_eq!(listed[3].rule, Some(rule("fd00::1/128", "eth1")));
        assert_eq!(listed[3].tag.as_deref(), Some("hand made"));
        // Handles are distinct and increasing in chain order here.
        assert!(listed.windows(2).all(|w| w[0].handle < w[1].handle));

        // Replace wipes the foreign additions.
        s.replace_masquerade_table(table, &[rule("10.8.0.0/24", "eth0")], TAG)
            .unwrap();
        assert_eq!(s.list_masquerade(table).unwrap().unwrap().len(), 1);

        // A table of the same name in another family is not ours.
        s.delete_table(table).unwrap();
        nft(&["add", "table", "ip", table]);
        assert_eq!(s.list_masquerade(table).unwrap(), None);
        assert!(!s.delete_table(table).unwrap());
        assert!(nft(&["list", "ruleset"]).contains(&format!("table ip {table}")));
    });
}

#[test]
fn list_tables_and_find_snat_rules() {
    in_new_netns(|| {
        let mut s = NftSocket::new().unwrap();
        assert!(s.find_snat_rules(None).unwrap().is_empty());
        s.replace_masquerade_table("ours", &[rule("10.8.0.0/24", "eth0")], TAG)
            .unwrap();

        nft(&["add", "table", "ip", "nat"]);
        nft(&[
            "add",
            "chain",
            "ip",
            "nat",
            "POSTROUTING",
            "{ type nat hook postrouting priority srcnat; policy accept; }",
        ]);
        nft(&[
            "add",
            "rule",
            "ip",
            "nat",
            "POSTROUTING",
            "ip",
            "saddr",
            "172.17.0.0/16",
            "oifname",
            "!=",
            "docker0",
            "masquerade",
        ]);
        // SNAT behind a jump, kube-proxy style.
        nft(&["add", "chain", "ip", "nat", "KUBE-POSTROUTING"]);
        nft(&[
            "add",
            "rule",
            "ip",
            "nat",
            "POSTROUTING",
            "jump",
            "KUBE-POSTROUTING",
        ]);
        nft(&[
            "add",
            "rule",
            "ip",
            "nat",
            "KUBE-POSTROUTING",
            "meta",
            "mark",
            "0x4000",
            "snat",
            "to",
            "192.0.2.1",
        ]);
        // Not SNAT-relevant: a filter chain and a nat prerouting chain.
        nft(&["add", "table", "ip6", "filter"]);
        nft(&[
            "add",
            "chain",
            "ip6",
            "filter",
            "out",
            "{ type filter hook postrouting priority 0; }",
        ]);
        nft(&["add", "rule", "ip6", "filter", "out", "counter"]);
        nft(&[
            "add",
            "chain",
            "ip",
            "nat",
            "PREROUTING",
            "{ type nat hook prerouting priority dstnat; }",
        ]);
        nft(&[
            "add",
            "rule",
            "ip",
            "nat",
            "PREROUTING",
            "tcp",
            "dport",
            "80",
            "dnat",
            "to",
            "192.0.2.9",
        ]);

        let mut tables = s.list_tables().unwrap();
        tables.sort();
        assert_eq!(
            tables,
            vec![
                (1, "ours".to_string()),
                (2, "nat".to_string()),
                (10, "filter".to_string())
            ]
        );

        let typed = s.find_snat_rules(Some("ours")).unwrap();
        let kube = &typed[1];
        assert_eq!(
            (kube.family, kube.table.as_str(), kube.chain.as_str()),
            (Family::Ip, "nat", "KUBE-POSTROUTING")
        );
        assert_eq!(kube.reached_from.as_deref(), Some("POSTROUTING"));
        assert_eq!((kube.hook, kube.kind), (Hook::Postrouting, SnatKind::Snat));
        assert!(kube.in_chain("POSTROUTING") && kube.in_chain("KUBE-POSTROUTING"));
        assert_eq!(typed[0].kind, SnatKind::Masquerade);
        assert_eq!(typed[0].reached_from, None);
        let found: Vec<String> = typed.iter().map(ToString::to_string).collect();
        eprintln!("{found:#?}");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("ip nat POSTROUTING: masquerade (handle "),
            "{found:?}"
        );
        assert!(
            found[1]
                .starts_with("ip nat KUBE-POSTROUTING (reached from POSTROUTING): snat (handle "),
            "{found:?}"
        );

        let all: Vec<String> = s
            .find_snat_rules(None)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(
            all.iter()
                .any(|d| d.starts_with("inet ours postrouting: masquerade")),
            "{all:?}"
        );

        // iptables-nft rules live in nf_tables too (table ip nat).
        let ipt = Command::new("iptables-nft")
            .args([
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-s",
                "10.1.0.0/16",
                "-j",
                "MASQUERADE",
            ])
            .output()
            .expect("run iptables-nft (integration/install-deps.sh installs it)");
        assert!(
            ipt.status.success(),
            "iptables-nft: {}",
            String::from_utf8_lossy(&ipt.stderr)
        );
        let found = s.find_snat_rules(Some("ours")).unwrap();
        eprintln!("with iptables-nft: {found:#?}");
        assert!(
            found.iter().any(|f| f.kind == SnatKind::XtMasquerade),
            "{found:?}"
        );
        assert_eq!(found.len(), 3, "{found:?}");
    });
}

#[test]
fn socket_stays_in_its_namespace_across_threads() {
    // Create the socket in namespace A, use it from a thread living in
    // namespace B: the table must appear in A only.
    in_new_netns(|| {
        let s = NftSocket::new().unwrap();
        let (tx, rx) = mpsc::channel();
        let worker = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let mut s = s;
            s.replace_masquerade_table("moved", &[rule("10.8.0.0/24", "eth0")], TAG)
                .unwrap();
            // A socket created here sees namespace B, which has no table.
            let mut local = NftSocket::new().unwrap();
            assert_eq!(local.list_masquerade("moved").unwrap(), None);
            tx.send(s).unwrap();
        });
        worker.join().unwrap();
        let mut s = rx.recv().unwrap();
        assert_eq!(s.list_masquerade("moved").unwrap().unwrap().len(), 1);
        let mut fresh = NftSocket::new().unwrap();
        assert_eq!(fresh.list_masquerade("moved").unwrap().unwrap().len(), 1);
        assert!(nft(&["list", "ruleset"]).contains("table inet moved"));
    });
}

#[test]
fn invalid_input_is_rejected_before_sending() {
    in_new_netns(|| {
        let mut s = NftSocket::new().unwrap();
        let err = s
            .replace_masquerade_table("t", &[rule("10.8.0.1/24", "eth0")], TAG)
            .unwrap_err();
        assert!(matches!(err, NftError::Invalid { .. }), "{err}");
        assert_eq!(s.list_masquerade("t").unwrap(), None);
        // The socket stays usable after errors.
        s.replace_masquerade_table("t", &[], TAG).unwrap();
        assert!(s.delete_table("t").unwrap());
    });
}

#[test]
fn many_rules_and_many_requests() {
    in_new_netns(|| {
        let mut s = NftSocket::new().unwrap();
        // Enough rules that the dump spans several datagrams.
        let rules: Vec<MasqRule> = (0..150u32)
            .map(|i| {
                rule(
                    &format!("10.{}.{}.0/24", i / 256, i % 256),
                    &format!("veth{i}"),
                )
            })
            .collect();
        s.replace_masquerade_table("big", &rules, TAG).unwrap();
        for _ in 0..20 {
            let listed = s.list_masquerade("big").unwrap().unwrap();
            assert_eq!(listed.len(), rules.len());
            assert!(listed
                .iter()
                .zip(&rules)
                .all(|(l, r)| l.rule.as_ref() == Some(r)));
        }
        assert!(s.list_tables().unwrap().contains(&(1, "big".to_string())));
        assert!(s.delete_table("big").unwrap());
    });
}

// ---------------------------------------------------------------------------
// Functional test: masquerade really rewrites the source address.
// ---------------------------------------------------------------------------

/// Named namespaces (`ip netns add`) removed on drop.
struct Netns {
    names: Vec<String>,
}

impl Netns {
    fn create(names: &[&str]) -> Netns {
        let pid = std::process::id();
        let mut ns = Netns { names: Vec::new() };
        for n in names {
            let name = format!("pgnft-{pid}-{n}");
            ip(&["netns", "add", &name]);
            ns.names.push(name);
        }
        ns
    }

    fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    fn path(&self, i: usize) -> String {
        format!("/run/netns/{}", self.names[i])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on a thread that has joined the named namespace at `path`.
fn in_netns_at<R: Send + 'static>(
    path: String,
    f: impl FnOnce() -> R + Send + 'static,
) -> std::thread::JoinHandle<R> {
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("setns {path}: {e}"));
        f()
    })
}

/// Sends one UDP datagram client → server and returns the source address the
/// server saw.
fn observed_source(ns: &Netns) -> SocketAddr {
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = in_netns_at(ns.path(2), move || {
        let sock = UdpSocket::bind("192.0.2.2:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        ready_tx.send(sock.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 64];
        let (_, from) = sock.recv_from(&mut buf).expect("datagram from client");
        from
    });
    let target = ready_rx.recv().unwrap();
    in_netns_at(ns.path(0), move || {
        // A fresh ephemeral port per call, so conntrack never reuses an
        // earlier NAT decision.
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.send_to(b"hello", target).unwrap();
    })
    .join()
    .unwrap();
    server.join().unwrap()
}

#[test]
fn masquerade_rewrites_source_address() {
    require_root();
    // client (10.8.0.2) --c0/g0-- gw (10.8.0.1 | 192.0.2.1) --u0/s0-- server (192.0.2.2)
    let ns = Netns::create(&["client", "gw", "server"]);
    let (client, gw, server) = (ns.name(0), ns.name(1), ns.name(2));
    ip(&[
        "-n", gw, "link", "add", "g0", "type", "veth", "peer", "name", "c0", "netns", client,
    ]);
    ip(&[
        "-n", gw, "link", "add", "u0", "type", "veth", "peer", "name", "s0", "netns", server,
    ]);
    for (n, dev, addr) in [
        (client, "c0", "10.8.0.2/24"),
        (gw, "g0", "10.8.0.1/24"),
        (gw, "u0", "192.0.2.1/24"),
        (server, "s0", "192.0.2.2/24"),
    ] {
        ip(&["-n", n, "addr", "add", addr, "dev", dev]);
        ip(&["-n", n, "link", "set", dev, "up"]);
        ip(&["-n", n, "link", "set", "lo", "up"]);
    }
    ip(&["-n", client, "route", "add", "default", "via", "10.8.0.1"]);
    // The server can route back to the client network, so that without
    // masquerade the packet still arrives (with the client's own address).
    ip(&[
        "-n",
        server,
        "route",
        "add",
        "10.8.0.0/24",
        "via",
        "192.0.2.1",
    ]);
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            gw,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let before = observed_source(&ns);
    assert_eq!(before.ip().to_string(), "10.8.0.2");

    // The socket is created inside gw and then used from this thread.
    let mut s = in_netns_at(ns.path(1), NftSocket::new)
        .join()
        .unwrap()
        .unwrap();
    s.replace_masquerade_table("pgfunc", &[rule("10.8.0.0/24", "u0")], TAG)
        .unwrap();
    let during = observed_source(&ns);
    assert_eq!(during.ip().to_string(), "192.0.2.1");

    // A rule for another interface does not apply.
    s.replace_masquerade_table("pgfunc", &[rule("10.8.0.0/24", "g0")], TAG)
        .unwrap();
    assert_eq!(observed_source(&ns).ip().to_string(), "10.8.0.2");

    assert!(s.delete_table("pgfunc").unwrap());
    assert_eq!(observed_source(&ns).ip().to_string(), "10.8.0.2");
}

#[test]
fn kernel_errors_abort_the_whole_batch() {
    in_new_netns(|| {
        // A table flagged `owner` belongs to the netlink socket that created
        // it; keep that socket alive in an interactive nft process.
        let mut child = Command::new("nft")
            .arg("-i")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let stdin = child.stdin.as_mut().unwrap();
            writeln!(stdin, "add table inet owned {{ flags owner; }}").unwrap();
            writeln!(stdin, "add chain inet owned keep").unwrap();
            stdin.flush().unwrap();
        }
        let mut s = NftSocket::new().unwrap();
        let mut tries = 0;
        while !nft(&["list", "ruleset"]).contains("chain keep") {
            tries += 1;
            assert!(tries < 100, "nft -i did not create the table");
            std::thread::sleep(Duration::from_millis(20));
        }
        let err = s
            .replace_masquerade_table("owned", &[rule("10.8.0.0/24", "eth0")], TAG)
            .unwrap_err();
        eprintln!("replace error: {err}");
        assert_eq!(err.errno(), Some(libc::EPERM), "{err}");
        assert!(err.to_string().contains("table inet owned"), "{err}");
        let err = s.delete_table("owned").unwrap_err();
        eprintln!("delete error: {err}");
        assert_eq!(err.errno(), Some(libc::EPERM), "{err}");
        // Nothing of the failed batch was applied.
        let text = nft(&["list", "ruleset"]);
        assert!(
            text.contains("chain keep") && !text.contains("postrouting"),
            "{text}"
        );
        assert_eq!(s.list_masquerade("owned").unwrap(), Some(vec![]));
        // The socket is still in sync for the next request.
        s.replace_masquerade_table("mine", &[rule("10.8.0.0/24", "eth0")], TAG)
            .unwrap();
        assert_eq!(s.list_masquerade("mine").unwrap().unwrap().len(), 1);
        drop(child.stdin.take());
        child.wait().unwrap();
    });
}

#[test]
fn long_tags_are_stored_and_listed() {
    in_new_netns(|| {
        let mut s = NftSocket::new().unwrap();
        // podgate's tag shape: network name, 64-hex container id, ifname.
        let realistic = format!(
            "podgate:{}:{}:{}",
            "a-rather-long-cni-network-name-for-production",
            "0123456789abcdef".repeat(4),
            "eth0"
        );
        let longest = "t".repeat(253);
        for tag in [realistic.as_str(), longest.as_str()] {
            s.replace_masquerade_table("tags", &[rule("10.8.0.0/24", "eth0")], tag)
                .unwrap();
            let listed = s.list_masquerade("tags").unwrap().unwrap();
            assert_eq!(listed[0].tag.as_deref(), Some(tag));
            let text = nft(&["list", "ruleset"]);
            assert!(
                text.contains(&format!("masquerade comment \"{tag}\"")),
                "{text}"
            );
        }
        assert!(s
            .replace_masquerade_table("tags", &[], &"t".repeat(254))
            .is_err());
    });
}

#[test]
fn table_without_our_chain_lists_empty() {
    in_new_netns(|| {
        nft(&["add", "table", "inet", "bare"]);
        let mut s = NftSocket::new().unwrap();
        assert_eq!(s.list_masquerade("bare").unwrap(), Some(vec![]));
        // A same-named regular chain in another table does not leak in.
        nft(&["add", "table", "inet", "other"]);
        nft(&["add", "chain", "inet", "other", "postrouting"]);
        nft(&["add", "rule", "inet", "other", "postrouting", "counter"]);
        assert_eq!(s.list_masquerade("bare").unwrap(), Some(vec![]));
        assert_eq!(s.list_masquerade("other").unwrap().unwrap().len(), 1);
    });
}
