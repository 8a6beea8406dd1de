//! Every rollback path of ADD's apply (node side and pod side), through the
//! in-memory kernel.

use super::*;
use crate::kernel::fake::Fake;
use crate::record::NodeSysctl;
use podgate_kit::nft::describe_mss;
use podgate_kit::route::RouteSpec;
use podgate_kit::rule::RuleSpec;
use std::path::{Path, PathBuf};

/// A store in its own directory (`.0`), removed with the guard (`.2`).
struct TempStore(PathBuf, StateStore, #[allow(dead_code)] tempfile::TempDir);

fn temp_store() -> TempStore {
    let tmp = tempfile::Builder::new()
        .prefix("pg-apply-unit-")
        .tempdir()
        .unwrap();
    let dir = tmp.path().join("state");
    let store = StateStore::open(&dir).unwrap();
    TempStore(dir, store, tmp)
}

/// The strict golden record as ADD's plan produces it: pending, on this
/// node (no boot or node identity to compare), with a return route and
/// the host-side interface sysctls.
fn strict_record() -> Record {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/records/v1-strict.json");
    let mut rec = record::parse(&p, &std::fs::read(&p).unwrap()).unwrap();
    rec.status = Status::Pending;
    rec.boot_id = None;
    rec.node_netns_id = None;
    rec.node_routes = vec![serde_json::from_str(
        r#"{"dst": "10.40.0.3/32", "oif": 5, "table": 30000, "protocol": 94, "linkScope": true}"#,
    )
    .unwrap()];
    let r = rec.routing.as_mut().unwrap();
    r.host_if_sysctls = vec![
        NodeSysctl {
            name: "net.ipv4.conf.veth1234.proxy_arp".into(),
            value: "1".into(),
        },
        NodeSysctl {
            name: "net.ipv4.neigh.veth1234.proxy_delay".into(),
            value: "0".into(),
        },
    ];
    rec
}

/// `from all lookup local` as the kernel makes it: `proto kernel`.
fn local_rule(priority: u32) -> RuleSpec {
    RuleSpec {
        v6: false,
        priority,
        from: None,
        to: None,
        iif: None,
        table: route::TABLE_LOCAL,
        protocol: route::RouteProtocol::KERNEL.0,
        suppress_prefixlen: None,
        ..RuleSpec::default()
    }
}

/// A node before the pod's ADD: the primary's route to the pod, the
/// local rule at 0, kernel defaults for every sysctl podgate writes.
fn node_before(rec: &Record) -> Fake {
    let r = rec.routing.as_ref().unwrap();
    let mut k = Fake {
        routes: vec![r.main_original.as_ref().unwrap().spec()],
        rules: vec![local_rule(0)],
        ..Fake::default()
    };
    for (name, v) in [
        ("net.ipv4.tcp_early_demux", "1"),
        ("net.ipv4.udp_early_demux", "1"),
        ("net.ipv4.conf.up0.accept_local", "0"),
        ("net.ipv4.conf.up0.rp_filter", "0"),
        ("net.ipv4.conf.veth1234.proxy_arp", "0"),
        ("net.ipv4.neigh.veth1234.proxy_delay", "80"),
    ] {
        k.sysctls.insert(name.into(), v.into());
    }
    k
}

fn strict_file(store: &StateStore) -> PathBuf {
    store.dir().join("node/strict.json")
}

fn same_state(a: &Fake, b: &Fake) -> bool {
    let mut ra = a.routes.clone();
    let mut rb = b.routes.clone();
    ra.sort_by_key(|r| (r.table, r.dst.to_string()));
    rb.sort_by_key(|r| (r.table, r.dst.to_string()));
    a.rules == b.rules && a.sysctls == b.sysctls && ra == rb
}

#[test]
fn a_full_apply_changes_what_the_record_says_and_records_previous_values() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    apply_node(&mut k, &t.1, &mut rec, true).unwrap();
    let r = rec.routing.as_ref().unwrap();
    assert_eq!(
        r.host_if_previous
            .get("net.ipv4.neigh.veth1234.proxy_delay"),
        Some(&"80".to_string())
    );
    let on_disk = record::read(&t.1, &rec.key).unwrap().unwrap();
    assert_eq!(on_disk.status, Status::Pending);
    assert_eq!(
        on_disk.routing.as_ref().unwrap().host_if_previous,
        r.host_if_previous
    );
    assert!(k
        .rules
        .contains(&local_rule(crate::routing::PRIO_LOCAL_MOVED)));
    assert!(!k.rules.iter().any(|x| x.matches(&local_rule(0))));
    assert_eq!(k.sysctls["net.ipv4.tcp_early_demux"], "0");
    assert_eq!(k.sysctls["net.ipv4.conf.veth1234.proxy_arp"], "1");
    for x in &r.table_routes {
        assert!(k.routes.contains(&x.spec()), "{x:?}");
    }
    assert!(k
        .routes
        .contains(&r.main_replacement.as_ref().unwrap().spec()));
    assert!(k.routes.contains(&rec.node_routes[0].spec()));
    assert!(strict_file(&t.1).exists());
}

#[test]
fn every_failing_step_is_undone_and_its_record_removed() {
    let calls = {
        let t = temp_store();
        let mut rec = strict_record();
        let mut k = node_before(&rec);
        apply_node(&mut k, &t.1, &mut rec, true).unwrap();
        k.calls.len()
    };
    // Host sysctl reads, return route, node setup, per-pod boundary.
    assert!(calls >= 15, "{calls} calls");
    for n in 1..=calls {
        let t = temp_store();
        let mut rec = strict_record();
        let mut k = node_before(&rec);
        let before = node_before(&rec);
        k.fail_call(n, libc::EPERM);
        let (e, left) = apply_node(&mut k, &t.1, &mut rec, true).unwrap_err();
        let failed = k.calls[n - 1].clone();
        assert!(e.to_string().contains(&failed), "call {n}: {e}");
        assert!(left.is_empty(), "call {n} ({failed}): left {left:?}");
        assert!(
            same_state(&k, &before),
            "call {n} ({failed}) not undone:\n{k:#?}"
        );
        assert!(
            record::read(&t.1, &rec.key).unwrap().is_none(),
            "call {n} ({failed}): record kept"
        );
        assert!(!strict_file(&t.1).exists(), "call {n}: strict.json kept");
    }
}

#[test]
fn a_failure_while_undoing_keeps_the_pending_record_for_del() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    let pos = |k: &Fake, what: &str| k.calls.iter().position(|c| c.starts_with(what));
    // Dry run to find the call numbers: the first rule add fails, and
    // then the delete of the first table route while undoing (the first
    // per-pod rule, not the node-wide local rule at 1000).
    let mut dry = node_before(&rec);
    let dry_store = temp_store();
    apply_node(&mut dry, &dry_store.1, &mut rec.clone(), true).unwrap();
    let rule_add = pos(&dry, "rule add 100:").unwrap() + 1;
    let r = rec.routing.clone().unwrap();
    let route0 = format!("route del {}", r.table_routes[0].spec().describe());
    k.fail_call(rule_add, libc::EPERM);
    let mut with_undo = node_before(&rec);
    with_undo.fail_call(rule_add, libc::EPERM);
    let probe_store = temp_store();
    let _ = apply_node(&mut with_undo, &probe_store.1, &mut rec.clone(), true);
    let del = with_undo.calls.iter().position(|c| *c == route0).unwrap() + 1;
    k.fail_call(del, libc::EIO);

    let (_, left) = apply_node(&mut k, &t.1, &mut rec, true).unwrap_err();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left.messages()[0].contains(&route0), "{left:?}");
    let kept = record::read(&t.1, &rec.key).unwrap().unwrap();
    assert_eq!(kept.status, Status::Pending);
    // What the removal could undo, it did; DEL finishes from the record.
    assert!(k.routes.contains(&r.table_routes[0].spec()), "{k:#?}");
    assert_eq!(k.sysctls["net.ipv4.conf.veth1234.proxy_arp"], "0");
    assert!(remove_node(&mut k, &kept, &t.1, true).is_empty());
    assert!(same_state(&k, &node_before(&rec)));
}

#[test]
fn removal_is_idempotent_and_already_gone_is_success() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    apply_node(&mut k, &t.1, &mut rec, true).unwrap();
    assert!(remove_node(&mut k, &rec, &t.1, true).is_empty());
    assert!(same_state(&k, &node_before(&rec)));
    assert!(!strict_file(&t.1).exists());
    // Again: everything is gone already.
    assert!(remove_node(&mut k, &rec, &t.1, true).is_empty());
    assert!(same_state(&k, &node_before(&rec)));
    // The pod's host-side interface is gone with its sysctls, and the
    // primary's route cannot be put back (ENODEV): only podgate's own
    // replacement is deleted, and that is gone too.
    let mut bare = Fake::default();
    bare.fail_call(1, libc::ENODEV);
    assert!(remove_node(&mut bare, &rec, &t.1, true).is_empty());
    assert!(bare.routes.is_empty() && bare.rules.is_empty());
    let main = rec
        .routing
        .as_ref()
        .unwrap()
        .main_replacement
        .as_ref()
        .unwrap();
    assert_eq!(
        bare.calls[1],
        format!("route del {}", main.spec().describe())
    );
}

#[test]
fn sysctls_go_back_only_while_they_hold_podgates_value() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    apply_node(&mut k, &t.1, &mut rec, true).unwrap();
    // Another writer changed these after podgate.
    k.sysctls
        .insert("net.ipv4.tcp_early_demux".into(), "1 ".into());
    k.sysctls
        .insert("net.ipv4.conf.up0.rp_filter".into(), "1".into());
    k.sysctls
        .insert("net.ipv4.conf.veth1234.proxy_arp".into(), "0".into());
    k.sysctls
        .insert("net.ipv4.neigh.veth1234.proxy_delay".into(), "5".into());
    let start = k.calls.len();
    assert!(remove_node(&mut k, &rec, &t.1, true).is_empty());
    assert_eq!(k.sysctls["net.ipv4.tcp_early_demux"], "1 ");
    assert_eq!(k.sysctls["net.ipv4.conf.up0.rp_filter"], "1");
    assert_eq!(k.sysctls["net.ipv4.conf.veth1234.proxy_arp"], "0");
    assert_eq!(k.sysctls["net.ipv4.neigh.veth1234.proxy_delay"], "5");
    let writes: Vec<_> = k.calls[start..]
        .iter()
        .filter(|c| c.starts_with("sysctl write"))
        .collect();
    assert_eq!(
        writes,
        [
            "sysctl write net.ipv4.conf.up0.accept_local=0",
            "sysctl write net.ipv4.udp_early_demux=1",
        ],
        "{:#?}",
        &k.calls[start..]
    );
    // Still podgate's: back to what they were.
    assert_eq!(k.sysctls["net.ipv4.udp_early_demux"], "1");
    assert_eq!(k.sysctls["net.ipv4.conf.up0.accept_local"], "0");
}

#[test]
fn node_settings_stay_while_another_strict_pod_needs_them() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    apply_node(&mut k, &t.1, &mut rec, true).unwrap();
    assert!(remove_node(&mut k, &rec, &t.1, false).is_empty());
    assert_eq!(k.sysctls["net.ipv4.tcp_early_demux"], "0");
    assert!(k
        .rules
        .contains(&local_rule(crate::routing::PRIO_LOCAL_MOVED)));
    assert!(strict_file(&t.1).exists());
    // Per-pod parts are gone all the same.
    let r = rec.routing.as_ref().unwrap();
    assert!(!k.routes.contains(&r.table_routes[0].spec()));
    assert!(k.routes.contains(&r.main_original.as_ref().unwrap().spec()));
}

/// The VPN golden record: pod sysctls, a masquerade table, a pod route.
fn pod_record() -> Record {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/records/v1-vpn-full.json");
    let mut rec = record::parse(&p, &std::fs::read(&p).unwrap()).unwrap();
    rec.status = Status::Pending;
    rec
}

fn pod_before() -> Fake {
    let mut k = Fake::default();
    k.sysctls.insert("net.ipv4.ip_forward".into(), "0".into());
    k.sysctls
        .insert("net.ipv4.conf.eth0.accept_local".into(), "0".into());
    k
}

use crate::kernel::fake::NETNS as NS;

#[test]
fn every_failing_pod_step_is_undone_by_the_pod_removal() {
    let t = temp_store();
    let mut dry = pod_before();
    pod_changes(&mut dry, &mut pod_record(), false, &t.1).unwrap();
    assert_eq!(
        dry.calls,
        [
            "sysctl write net.ipv4.ip_forward=1",
            "sysctl write net.ipv4.conf.eth0.accept_local=1",
            "nft replace podgate-eth0",
            "route add 10.99.0.0/16 via 10.22.0.1 oif 7",
        ]
    );
    assert_eq!(dry.tables["podgate-eth0"].masquerade.len(), 1);
    for n in 1..=dry.calls.len() {
        let mut k = pod_before();
        let mut rec = pod_record();
        k.fail_call(n, libc::EPERM);
        let e = pod_changes(&mut k, &mut rec, false, &t.1).unwrap_err();
        let failed = k.calls[n - 1].clone();
        assert!(e.to_string().contains(&failed), "call {n}: {e}");
        if failed.starts_with("nft") {
            assert!(e.to_string().contains(NS), "{e}");
        }
        let left = remove_pod(&mut k, &rec);
        assert!(left.is_empty(), "call {n} ({failed}): {left:?}");
        let before = pod_before();
        assert_eq!(k.sysctls, before.sysctls, "call {n} ({failed})");
        assert!(
            k.tables.is_empty() && k.routes.is_empty(),
            "call {n}: {k:#?}"
        );
    }
}

#[test]
fn pod_values_reread_are_on_disk_before_the_first_pod_change() {
    let t = temp_store();
    let mut rec = pod_record();
    record::write(&t.1, &rec).unwrap();
    // Since the pod facts were read, an undone ADD put ip_forward to 1.
    let mut k = pod_before();
    k.sysctls.insert("net.ipv4.ip_forward".into(), "1".into());
    k.fail_call(4, libc::EPERM); // reads 2, write accept_local, nft
    pod_changes(&mut k, &mut rec, true, &t.1).unwrap_err();
    assert_eq!(k.calls[3], "nft replace podgate-eth0");
    let on_disk = record::read(&t.1, &rec.key).unwrap().unwrap();
    assert_eq!(on_disk.sysctls, rec.sysctls);
    assert_eq!(on_disk.sysctls[0].previous, None);
    assert_eq!(on_disk.sysctls[1].previous.as_deref(), Some("0"));
    assert!(remove_pod(&mut k, &on_disk).is_empty());
    assert_eq!(k.sysctls["net.ipv4.ip_forward"], "1");
    assert_eq!(k.sysctls["net.ipv4.conf.eth0.accept_local"], "0");
}

#[test]
fn pod_removal_is_idempotent_and_restores_only_podgates_values() {
    let t = temp_store();
    let mut rec = pod_record();
    let mut k = pod_before();
    pod_changes(&mut k, &mut rec, false, &t.1).unwrap();
    // Another writer changed ip_forward after podgate.
    k.sysctls.insert("net.ipv4.ip_forward".into(), "2".into());
    assert!(remove_pod(&mut k, &rec).is_empty());
    assert_eq!(k.sysctls["net.ipv4.ip_forward"], "2");
    assert_eq!(k.sysctls["net.ipv4.conf.eth0.accept_local"], "0");
    assert!(k.tables.is_empty() && k.routes.is_empty());
    let start = k.calls.len();
    assert!(remove_pod(&mut k, &rec).is_empty());
    assert!(!k.calls[start..]
        .iter()
        .any(|c| c.starts_with("sysctl write")));
    // A real failure is reported, naming the namespace and the object.
    k.fail_call(3, libc::EBUSY);
    let left = remove_pod(&mut k, &rec);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left.messages()[0].contains(NS) && left.messages()[0].contains("podgate-eth0"),
        "{left:?}"
    );
    // The CNI error DEL makes of it keeps the errno, the object and the
    // pod's netns in its details.
    let e: podgate_cni::CniError = crate::error::Error::Left {
        what: "teardown",
        left,
    }
    .into();
    assert!(e.msg.starts_with("teardown: "), "{}", e.msg);
    let d: serde_json::Value = serde_json::from_str(&e.details).unwrap();
    assert_eq!(d["errno"], libc::EBUSY, "{d}");
    assert_eq!(d["netns"], NS, "{d}");
    assert!(
        d["object"].as_str().unwrap().contains("podgate-eth0"),
        "{d}"
    );
}

#[test]
fn a_sysctl_still_podgates_is_read_then_written_back() {
    let t = temp_store();
    let mut rec = pod_record();
    let mut k = pod_before();
    pod_changes(&mut k, &mut rec, false, &t.1).unwrap();
    let changed: Vec<_> = rec
        .sysctls
        .iter()
        .filter_map(|s| s.previous.as_ref().map(|p| (s.name.clone(), p.clone())))
        .collect();
    assert!(!changed.is_empty());
    let start = k.calls.len();
    assert!(remove_pod(&mut k, &rec).is_empty());
    let sysctl_calls: Vec<_> = k.calls[start..]
        .iter()
        .filter(|c| c.starts_with("sysctl"))
        .cloned()
        .collect();
    let want: Vec<_> = changed
        .iter()
        .flat_map(|(n, p)| [format!("sysctl read {n}"), format!("sysctl write {n}={p}")])
        .collect();
    assert_eq!(sysctl_calls, want);
    for (n, p) in &changed {
        assert_eq!(&k.sysctls[n], p);
    }
}

/// What `k` holds, to compare with later (the fake is not `Clone`: its
/// call log and failure plan are not state).
fn snapshot(k: &Fake) -> Fake {
    Fake {
        routes: k.routes.clone(),
        rules: k.rules.clone(),
        sysctls: k.sysctls.clone(),
        ..Fake::default()
    }
}

/// A second strict pod beside [`strict_record`]'s: its own address, table,
/// host-side interface and return route.
fn second_strict_record() -> Record {
    let text = serde_json::to_string(&strict_record())
        .unwrap()
        .replace("10.40.0.3", "10.40.0.4")
        .replace("20000", "20001")
        .replace("veth1234", "veth5678")
        .replace("golden-strict", "golden-strict-2");
    serde_json::from_str(&text).unwrap()
}

/// The node after the first strict pod's ADD, with what the second pod's
/// ADD finds of its own (the primary's route, its interface's sysctls).
fn node_with_first_strict_pod(t: &TempStore) -> Fake {
    let mut first = strict_record();
    let mut k = node_before(&first);
    let second = second_strict_record();
    let r = second.routing.as_ref().unwrap();
    k.routes.push(r.main_original.as_ref().unwrap().spec());
    k.sysctls
        .insert("net.ipv4.conf.veth5678.proxy_arp".into(), "0".into());
    k.sysctls
        .insert("net.ipv4.neigh.veth5678.proxy_delay".into(), "80".into());
    apply_node(&mut k, &t.1, &mut first, true).unwrap();
    k
}

#[test]
fn a_second_strict_pod_failing_at_any_step_leaves_the_node_wide_settings() {
    let calls = {
        let t = temp_store();
        let mut k = node_with_first_strict_pod(&t);
        let start = k.calls.len();
        apply_node(&mut k, &t.1, &mut second_strict_record(), false).unwrap();
        // Not the first strict pod: node-wide settings are re-asserted, the
        // local rule is not moved again.
        assert!(
            !k.calls[start..].iter().any(|c| c.starts_with("rule add 0:")
                || c.starts_with(&format!("rule add {}:", crate::routing::PRIO_LOCAL_MOVED))),
            "{:#?}",
            &k.calls[start..]
        );
        k.calls.len() - start
    };
    assert!(calls >= 12, "{calls} calls");
    for n in 1..=calls {
        let t = temp_store();
        let mut k = node_with_first_strict_pod(&t);
        let after_first = snapshot(&k);
        let shared = std::fs::read(strict_file(&t.1)).unwrap();
        let mut second = second_strict_record();
        k.fail_call(n, libc::EPERM);
        let start = k.calls.len();
        let (e, left) = apply_node(&mut k, &t.1, &mut second, false).unwrap_err();
        let failed = k.calls[start + n - 1].clone();
        assert!(e.to_string().contains(&failed), "call {n}: {e}");
        assert!(left.is_empty(), "call {n} ({failed}): left {left:?}");
        assert!(
            same_state(&k, &after_first),
            "call {n} ({failed}) not undone:\n{k:#?}"
        );
        assert!(record::read(&t.1, &second.key).unwrap().is_none());
        assert!(record::read(&t.1, &strict_record().key).unwrap().is_some());
        assert_eq!(
            std::fs::read(strict_file(&t.1)).unwrap(),
            shared,
            "call {n} ({failed}): node/strict.json changed"
        );
    }
}

/// [`strict_record`] as a standard-mode boundary: the pod's table, the
/// standard rules, no main-route replacement and nothing node-wide.
fn standard_record() -> Record {
    let mut rec = strict_record();
    let r = rec.routing.as_mut().unwrap();
    r.mode = Mode::Standard;
    let pod_ip = r.pod_ip;
    let rule = |priority, from, to, table| RuleSpec {
        v6: false,
        priority,
        from,
        to,
        iif: None,
        table,
        protocol: route::RTPROT_PODGATE,
        suppress_prefixlen: None,
        ..RuleSpec::default()
    };
    let from = crate::routing::PRIO_STANDARD_FROM;
    r.rules = [
        rule(
            crate::routing::PRIO_STANDARD_TO,
            None,
            Some(pod_ip),
            route::TABLE_MAIN,
        ),
        RuleSpec {
            suppress_prefixlen: Some(31),
            ..rule(from - 1, Some(pod_ip), None, route::TABLE_MAIN)
        },
        rule(from, Some(pod_ip), None, r.table),
    ]
    .iter()
    .map(record::Rule::from)
    .collect();
    r.main_original = None;
    r.main_replacement = None;
    r.node_sysctls.clear();
    r.host_if_sysctls.clear();
    rec
}

#[test]
fn a_standard_boundary_failing_at_any_step_is_undone_without_node_wide_changes() {
    let calls = {
        let t = temp_store();
        let mut rec = standard_record();
        let mut k = node_before(&strict_record());
        let before = snapshot(&k);
        apply_node(&mut k, &t.1, &mut rec, true).unwrap();
        assert!(!strict_file(&t.1).exists());
        assert_eq!(k.sysctls, before.sysctls);
        assert_eq!(k.rules.len(), 4, "{:#?}", k.rules);
        k.calls.len()
    };
    // Return route, two table routes, three rules.
    assert_eq!(calls, 6);
    for n in 1..=calls {
        let t = temp_store();
        let mut rec = standard_record();
        let mut k = node_before(&strict_record());
        let before = snapshot(&k);
        k.fail_call(n, libc::EPERM);
        let (e, left) = apply_node(&mut k, &t.1, &mut rec, true).unwrap_err();
        let failed = k.calls[n - 1].clone();
        assert!(e.to_string().contains(&failed), "call {n}: {e}");
        assert!(left.is_empty(), "call {n} ({failed}): left {left:?}");
        assert!(same_state(&k, &before), "call {n} ({failed}):\n{k:#?}");
        assert!(record::read(&t.1, &rec.key).unwrap().is_none());
        // Undoing a standard boundary never reads or writes node-wide state.
        assert!(!strict_file(&t.1).exists());
        assert!(
            !k.calls.iter().any(|c| c.contains("early_demux")),
            "{:#?}",
            k.calls
        );
    }
}

#[test]
fn a_record_that_cannot_be_written_stops_the_add_before_any_change() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    let before = snapshot(&k);
    // The store's directory is gone (a full or read-only disk fails the
    // same way: the write-ahead record is not on disk).
    std::fs::remove_dir_all(&t.0).unwrap();
    let (e, left) = apply_node(&mut k, &t.1, &mut rec, true).unwrap_err();
    assert!(e.to_string().contains(&*t.0.to_string_lossy()), "{e}");
    assert!(left.is_empty(), "{left:?}");
    assert!(same_state(&k, &before));
    // Only the reads of the host-side interface sysctls happened.
    assert!(
        k.calls.iter().all(|c| c.starts_with("sysctl read")),
        "{:#?}",
        k.calls
    );
    assert_eq!(k.calls.len(), 2);

    // The pod side's second write-ahead (values re-read after an undone
    // ADD): when it fails, no pod sysctl is written.
    let t = temp_store();
    let mut rec = pod_record();
    let mut k = pod_before();
    k.sysctls.insert("net.ipv4.ip_forward".into(), "1".into());
    std::fs::remove_dir_all(&t.0).unwrap();
    let e = pod_changes(&mut k, &mut rec, true, &t.1).unwrap_err();
    assert!(e.to_string().contains(&*t.0.to_string_lossy()), "{e}");
    assert_eq!(
        k.calls,
        [
            "sysctl read net.ipv4.ip_forward",
            "sysctl read net.ipv4.conf.eth0.accept_local",
        ]
    );
    assert_eq!(k.sysctls, {
        let mut s = pod_before().sysctls;
        s.insert("net.ipv4.ip_forward".into(), "1".into());
        s
    });
}

#[test]
fn node_strict_settings_that_cannot_be_written_undo_the_add() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    let before = snapshot(&k);
    // The temp file `node/strict.json` is written through cannot be
    // created (a directory stands in its place).
    let tmp =
        t.0.join(format!("node/.tmp-{}-strict.json", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (e, left) = apply_node(&mut k, &t.1, &mut rec, true).unwrap_err();
    assert!(e.to_string().contains("strict.json"), "{e}");
    assert!(left.is_empty(), "{left:?}");
    assert!(same_state(&k, &before), "{k:#?}");
    assert!(record::read(&t.1, &rec.key).unwrap().is_none());
    assert!(!strict_file(&t.1).exists());
    // Nothing node-wide was written before the file describing it.
    assert!(
        !k.calls
            .iter()
            .any(|c| c.starts_with("sysctl write net.ipv4.tcp") || c.starts_with("rule add")),
        "{:#?}",
        k.calls
    );
}

/// The VPN record with an MSS clamp beside its masquerade.
fn pod_record_with_mss() -> Record {
    let mut rec = pod_record();
    rec.mss_clamp = vec![record::MssClamp {
        pool: "10.8.0.0/24".parse().unwrap(),
        ifname: "eth0".into(),
        direction: record::MssDirection::FromPool,
        mss: record::MssValue::Fixed(1300),
    }];
    rec
}

#[test]
fn check_reads_the_pod_side_through_the_kernel_and_names_each_drift() {
    let t = temp_store();
    let mut rec = pod_record_with_mss();
    let mut k = pod_before();
    pod_changes(&mut k, &mut rec, false, &t.1).unwrap();
    assert_eq!(k.tables["podgate-eth0"].mss.len(), 1);
    let pending = check_pod(&mut k, &rec).unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert!(pending[0].contains("record pending"), "{pending:?}");
    rec.status = Status::Applied;
    assert_eq!(check_pod(&mut k, &rec).unwrap(), Vec::<String>::new());

    k.sysctls.insert("net.ipv4.ip_forward".into(), "0".into());
    let table = k.tables.get_mut("podgate-eth0").unwrap();
    for l in &mut table.masquerade {
        l.rule = None; // someone rewrote podgate's rule
    }
    table.mss.clear();
    k.routes.clear();
    let mss = describe_mss(&rec.mss_clamp[0].rule());
    let route = rec.pod_routes[0].spec().describe();
    assert_eq!(
        check_pod(&mut k, &rec).unwrap(),
        [
            "sysctl net.ipv4.ip_forward is 0, want 1".to_string(),
            "masquerade for 10.8.0.0/24 out of eth0 is missing in inet podgate-eth0".into(),
            "inet podgate-eth0 holds 1 rule(s) podgate did not write".into(),
            format!("mss clamp `{mss}` is missing in inet podgate-eth0"),
            format!("pod route {route} is missing"),
        ]
    );
    k.tables.clear();
    k.sysctls.remove("net.ipv4.conf.eth0.accept_local");
    let drift = check_pod(&mut k, &rec).unwrap();
    assert_eq!(drift.len(), 4, "{drift:?}");
    assert!(
        drift[1].starts_with("sysctl net.ipv4.conf.eth0.accept_local: ")
            && drift[1].contains("ENOENT"),
        "{drift:?}"
    );
    assert_eq!(drift[2], "nft table inet podgate-eth0 is missing");
    // A listing that fails is an error naming the namespace, never a
    // clean bill of health.
    k.fail_call(3, libc::EIO);
    let e = check_pod(&mut k, &rec).unwrap_err();
    assert!(
        e.to_string().contains(NS) && e.to_string().contains("nft list podgate-eth0"),
        "{e}"
    );
}

#[test]
fn check_reads_the_node_side_through_the_kernel_and_names_each_drift() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    apply_node(&mut k, &t.1, &mut rec, true).unwrap();
    rec.status = Status::Applied;
    assert_eq!(check_node(&mut k, &rec).unwrap(), Vec::<String>::new());

    let r = rec.routing.clone().unwrap();
    let ret = rec.node_routes[0].spec();
    k.routes.retain(|x| *x != ret);
    // The primary put its own route to the pod back over podgate's.
    k.route_add(&r.main_original.as_ref().unwrap().spec(), true)
        .unwrap();
    let lost = r.rules[1].spec();
    k.rules.retain(|x| !x.matches(&lost));
    k.sysctls
        .insert("net.ipv4.tcp_early_demux".into(), "1".into());
    k.sysctls
        .insert("net.ipv4.conf.veth1234.proxy_arp".into(), "0".into());
    let main = r.main_replacement.as_ref().unwrap().spec().describe();
    assert_eq!(
        check_node(&mut k, &rec).unwrap(),
        [
            format!("node return route {} is missing", ret.describe()),
            format!("main route {main} is missing (strict boundary bypassed)"),
            format!("rule {} is missing", lost.describe()),
            "node sysctl net.ipv4.tcp_early_demux is 1, want 0".into(),
            "node sysctl net.ipv4.conf.veth1234.proxy_arp is 0, want 1".into(),
        ]
    );
    let start = k.calls.len();
    k.fail_call(1, libc::EIO);
    let e = check_node(&mut k, &rec).unwrap_err();
    assert_eq!(k.calls[start], "route list v6=false");
    assert!(e.to_string().contains("route list v6=false"), "{e}");
}

#[test]
fn every_failing_pod_step_after_a_reread_is_undone_by_the_pod_removal() {
    // The pod facts were read while an earlier ADD of this attachment held
    // ip_forward at podgate's 1 (nothing to put back, says the pending
    // record); that ADD was undone since, so the pod side reads the values
    // again, writes the record, then changes.
    let pending = || {
        let mut rec = pod_record();
        rec.sysctls[0].previous = None;
        rec
    };
    let calls = {
        let t = temp_store();
        let mut k = pod_before();
        pod_changes(&mut k, &mut pending(), true, &t.1).unwrap();
        k.calls.len()
    };
    // Two reads, two writes, nft, the pod route.
    assert_eq!(calls, 6);
    for n in 1..=calls {
        let t = temp_store();
        let mut k = pod_before();
        let mut rec = pending();
        record::write(&t.1, &rec).unwrap();
        k.fail_call(n, libc::EPERM);
        let e = pod_changes(&mut k, &mut rec, true, &t.1).unwrap_err();
        let failed = k.calls[n - 1].clone();
        assert!(e.to_string().contains(&failed), "call {n}: {e}");
        // Write-ahead: once anything changed, the disk says what it found.
        let on_disk = record::read(&t.1, &rec.key).unwrap().unwrap();
        if !failed.starts_with("sysctl read") {
            assert_eq!(on_disk.sysctls, rec.sysctls, "call {n} ({failed})");
        }
        // The caller rolls back from the record the pod side returns.
        let left = remove_pod(&mut k, &rec);
        assert!(left.is_empty(), "call {n} ({failed}): {left:?}");
        assert_eq!(k.sysctls, pod_before().sysctls, "call {n} ({failed})");
        assert!(
            k.tables.is_empty() && k.routes.is_empty(),
            "call {n}: {k:#?}"
        );
    }
}

/// Issue 36 (4): CHECK names every rule the kernel walks before a strict
/// pod's own that can take its traffic past them, and no other.
#[test]
fn check_names_the_rules_ahead_of_the_strict_rules_that_can_take_the_pods_traffic() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    apply_node(&mut k, &t.1, &mut rec, true).unwrap();
    let rp = rec.routing.as_ref().unwrap().plan();
    assert_eq!(boundary::check(&mut k, &rp).unwrap(), Vec::<String>::new());
    let net = |s: &str| Some(s.parse().unwrap());
    let rule = |priority, table| RuleSpec {
        priority,
        table,
        ..RuleSpec::default()
    };
    let harmless = [
        // Another strict pod's rules: podgate's, looking up its own table.
        RuleSpec {
            iif: Some("veth9999".into()),
            protocol: route::RTPROT_PODGATE,
            ..rule(90, 20001)
        },
        // A rule that drops.
        RuleSpec {
            action: podgate_kit::rule::RuleAction::Blackhole,
            ..rule(10, 0)
        },
        // Selectors that miss the pod both ways.
        RuleSpec {
            from: net("10.99.0.0/24"),
            to: net("10.98.0.0/24"),
            ..rule(20, route::TABLE_LOCAL)
        },
        RuleSpec {
            iif: Some("eth7".into()),
            to: net("10.98.0.0/24"),
            ..rule(30, route::TABLE_MAIN)
        },
        // After the pod's rules.
        rule(200, route::TABLE_LOCAL),
    ];
    let ahead = [
        // A re-added local rule, another agent's below podgate's, a lookup
        // of main for the pod's own traffic, one for traffic to it.
        rule(0, route::TABLE_LOCAL),
        rule(50, route::TABLE_LOCAL),
        RuleSpec {
            iif: Some("veth1234".into()),
            ..rule(99, route::TABLE_MAIN)
        },
        RuleSpec {
            to: net("10.40.0.0/24"),
            iif: Some("eth7".into()),
            ..rule(99, 300)
        },
    ];
    for r in harmless.iter().chain(&ahead) {
        k.rule_add(r).unwrap();
    }
    let drift = boundary::check(&mut k, &rp).unwrap();
    let want: Vec<String> = ahead
        .iter()
        .map(|r| boundary::ahead_message(r, rp.pod_ip.addr()))
        .collect();
    assert_eq!(drift, want);
    assert!(drift[0].starts_with("rule 0: from all lookup 255 (proto unspec) comes before the strict rules of pod 10.40.0.3"), "{drift:?}");
    // What the agent counts is the same list.
    let found: Vec<RuleSpec> = rules_ahead(&mut k, &rec)
        .unwrap()
        .into_iter()
        .map(|a| a.rule)
        .collect();
    assert_eq!(found, ahead.to_vec());
}

/// Issue 36 (3): the local-table rule goes back as the kernel made it
/// (`proto kernel`), the IPv6 one too when a strict pod had IPv6.
#[test]
fn the_moved_local_rules_go_back_as_the_kernel_made_them() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    let local6 = RuleSpec {
        v6: true,
        ..local_rule(0)
    };
    k.rules.push(local6.clone());
    let before = k.rules.clone();
    // An IPv6 rule of the pod's: the family's local rule moves too.
    let r = rec.routing.as_mut().unwrap();
    r.rules.push(record::Rule::from(&RuleSpec {
        v6: true,
        iif: Some("veth1234".into()),
        protocol: route::RTPROT_PODGATE,
        ..RuleSpec {
            priority: crate::routing::PRIO_STRICT,
            table: r.table,
            ..RuleSpec::default()
        }
    }));
    apply_node(&mut k, &t.1, &mut rec, true).unwrap();
    for v6 in [false, true] {
        let moved = RuleSpec {
            v6,
            ..local_rule(crate::routing::PRIO_LOCAL_MOVED)
        };
        assert!(k.rules.contains(&moved), "{v6}: {:?}", k.rules);
        assert!(!k
            .rules
            .iter()
            .any(|x| x.v6 == v6 && x.matches(&local_rule(0))));
    }
    let shared = crate::strict_node::read_shared(&t.1).unwrap().unwrap();
    assert!(shared.local_moved && shared.local_moved6, "{shared:?}");
    assert_eq!(shared.version, crate::strict_node::VERSION);
    assert!(remove_node(&mut k, &rec, &t.1, true).is_empty());
    let mut after = k.rules.clone();
    let mut want = before;
    for v in [&mut after, &mut want] {
        v.sort_by_key(|r| (r.v6, r.priority));
    }
    assert_eq!(after, want, "rules with their protocols as before");
}

/// A strict pod the records cannot show (its record unreadable, or moved to
/// quarantine) keeps the node-wide strict settings while its host-side
/// interface exists, as the kernel tells: removing the last readable
/// strict record leaves them. Once its netns (and the interface) is gone,
/// they go back.
#[test]
fn node_wide_settings_stay_while_a_strict_pods_interface_lives_whatever_its_record() {
    let t = temp_store();
    let mut rec = strict_record();
    let before = node_before(&rec);
    let mut k = node_before(&rec);
    apply_node(&mut k, &t.1, &mut rec, true).unwrap();
    let other = RuleSpec {
        iif: Some("vethother".into()),
        table: 30001,
        priority: crate::routing::PRIO_STRICT,
        protocol: route::RTPROT_PODGATE,
        ..local_rule(0)
    };
    k.rules.push(other.clone());
    k.links.push(podgate_kit::link::Link {
        index: 9,
        name: "vethother".into(),
    });
    assert!(remove_node(&mut k, &rec, &t.1, true).is_empty());
    assert!(k
        .rules
        .contains(&local_rule(crate::routing::PRIO_LOCAL_MOVED)));
    assert!(!k.rules.iter().any(|x| x.matches(&local_rule(0))));
    assert_eq!(k.sysctls["net.ipv4.tcp_early_demux"], "0");
    assert!(strict_file(&t.1).exists(), "what to restore is kept");
    // Its netns went, and its interface with it; its rule stays (detached).
    k.links.clear();
    assert!(boundary::restore_node(&t.1, &mut k).is_empty());
    assert!(!strict_file(&t.1).exists());
    k.rules.retain(|r| *r != other);
    assert!(same_state(&k, &before), "{k:#?}");
}

/// The same with IPv6: a dual-stack strict pod the records cannot show is
/// seen by its host-side rules of either family, and the IPv6 local rule
/// moved for the strict pods stays moved with the IPv4 one while its
/// interface lives; both go back, as the kernel made them, once it is gone.
#[test]
fn both_moved_local_rules_stay_while_a_dual_stack_strict_pods_interface_lives() {
    let t = temp_store();
    let mut rec = strict_record();
    let mut k = node_before(&rec);
    let local6 = |priority| RuleSpec {
        v6: true,
        ..local_rule(priority)
    };
    k.rules.push(local6(0));
    let (rules_before, sysctls_before) = (k.rules.clone(), k.sysctls.clone());
    let host_side = |v6, iif: &str, table| RuleSpec {
        v6,
        iif: Some(iif.into()),
        table,
        priority: crate::routing::PRIO_STRICT,
        protocol: route::RTPROT_PODGATE,
        ..RuleSpec::default()
    };
    let r = rec.routing.as_mut().unwrap();
    r.rules
        .push(record::Rule::from(&host_side(true, "veth1234", r.table)));
    apply_node(&mut k, &t.1, &mut rec, true).unwrap();
    let other = [
        host_side(false, "vethother", 30001),
        host_side(true, "vethother", 30001),
    ];
    assert!(other.iter().all(crate::routing::is_host_side_rule));
    k.rules.extend(other.iter().cloned());
    k.links.push(podgate_kit::link::Link {
        index: 9,
        name: "vethother".into(),
    });
    assert!(remove_node(&mut k, &rec, &t.1, true).is_empty());
    for moved in [
        local_rule(crate::routing::PRIO_LOCAL_MOVED),
        local6(crate::routing::PRIO_LOCAL_MOVED),
    ] {
        assert!(k.rules.contains(&moved), "{moved:?} kept: {:?}", k.rules);
    }
    assert!(!k.rules.contains(&local6(0)), "{:?}", k.rules);
    assert!(strict_file(&t.1).exists(), "what to restore is kept");
    k.links.clear();
    assert!(boundary::restore_node(&t.1, &mut k).is_empty());
    assert!(!strict_file(&t.1).exists());
    k.rules.retain(|r| !other.contains(r));
    let mut after = k.rules.clone();
    let mut want = rules_before;
    for v in [&mut after, &mut want] {
        v.sort_by_key(|r| (r.v6, r.priority));
    }
    assert_eq!(after, want, "both local rules back, proto kernel");
    assert_eq!(k.sysctls, sysctls_before);
}

/// The ownership sweep of a pod goes through the `Kernel` trait: this
/// attachment's tagged table and podgate's routes out of its interface go;
/// another attachment's table, a foreign route and podgate's route out of
/// another interface stay; a failing call is reported with its errno.
#[test]
fn the_pod_sweep_removes_only_what_carries_this_attachments_tag() {
    use crate::kernel::fake::Table;
    use podgate_kit::link::Link;
    let key = Key::new("n", "c1", "eth0");
    let other = Key::new("n", "c2", "eth0");
    let mut k = Fake {
        links: vec![
            Link {
                index: 3,
                name: "eth0".into(),
            },
            Link {
                index: 4,
                name: "net1".into(),
            },
        ],
        ..Fake::default()
    };
    for (name, owner) in [("podgate-eth0", &key), ("podgate-net1", &other)] {
        let tag = record::nft_tag(owner);
        k.tables.insert(
            name.into(),
            Table {
                tag,
                ..Table::default()
            },
        );
    }
    let route = |dst: &str, oif: u32, protocol: u8| {
        let mut r = RouteSpec::new(dst.parse().unwrap());
        r.oif = Some(oif);
        r.protocol = protocol;
        r
    };
    k.routes = vec![
        route("10.50.0.0/24", 3, RTPROT_PODGATE),
        route("fd50::/64", 3, RTPROT_PODGATE),
        route("10.51.0.0/24", 3, 4),
        route("10.52.0.0/24", 4, RTPROT_PODGATE),
    ];
    let (removed, failed) = sweep_pod(&mut k, &key, "podgate-");
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(
        removed,
        [
            format!("nft table inet podgate-eth0 in {NS}"),
            "pod route 10.50.0.0/24".to_string(),
            "pod route fd50::/64".to_string(),
        ]
    );
    assert_eq!(k.tables.keys().collect::<Vec<_>>(), ["podgate-net1"]);
    let left: Vec<String> = k.routes.iter().map(|r| r.dst.to_string()).collect();
    assert_eq!(left, ["10.51.0.0/24", "10.52.0.0/24"]);

    // A failing listing is one typed failure, naming the namespace.
    k.fail_call(1, libc::EPERM);
    let (removed, failed) = sweep_pod(&mut k, &other, "podgate-");
    assert!(removed.is_empty(), "{removed:?}");
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (e, netns) = failed.iter().next().unwrap().kit();
    assert_eq!((e.errno(), netns), (Some(libc::EPERM), Some(NS)));
}

/// The node sweep through the `Kernel` trait: podgate's rules and routes
/// for an unusable record's addresses go, what a record accounts for and
/// what is not podgate's stay.
#[test]
fn the_node_sweep_removes_unaccounted_objects_of_the_addresses_only() {
    let mut ours = RouteSpec::new("10.60.0.0/24".parse().unwrap());
    ours.gateway = Some("10.22.0.9".parse().unwrap());
    ours.protocol = RTPROT_PODGATE;
    let mut kept = ours.clone();
    kept.dst = "10.61.0.0/24".parse().unwrap();
    kept.gateway = Some("10.22.0.8".parse().unwrap());
    let mut foreign = ours.clone();
    foreign.dst = "10.62.0.0/24".parse().unwrap();
    foreign.protocol = 4;
    let mut k = Fake {
        routes: vec![ours, kept, foreign],
        ..Fake::default()
    };
    let ip: std::net::IpAddr = "10.22.0.9".parse().unwrap();
    let (removed, failed) = sweep_node(&mut k, &[], Some(&[ip]));
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert!(removed[0].contains("10.60.0.0/24"), "{removed:?}");
    let left: Vec<String> = k.routes.iter().map(|r| r.dst.to_string()).collect();
    assert_eq!(left, ["10.61.0.0/24", "10.62.0.0/24"]);
}
