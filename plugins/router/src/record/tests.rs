use super::*;

fn golden(name: &str) -> (PathBuf, Vec<u8>) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/records")
        .join(name);
    let b = std::fs::read(&p).unwrap();
    (p, b)
}

#[test]
fn golden_v1_records_parse_and_round_trip() {
    for name in [
        "v1-vpn-full.json",
        "v1-strict.json",
        "v1-pending.json",
        "v1-adopted.json",
    ] {
        let (p, b) = golden(name);
        let r = parse(&p, &b).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.version, 1);
        let again = serde_json::to_vec(&r).unwrap();
        assert_eq!(parse(&p, &again).unwrap(), r, "{name}");
    }
    let (p, b) = golden("v1-vpn-full.json");
    let r = parse(&p, &b).unwrap();
    assert_eq!(r.status, Status::Applied);
    assert_eq!(r.node_routes.len(), 1);
    assert_eq!(r.sysctls[0].previous.as_deref(), Some("0"));
    assert!(!r.adopted, "a record without the field was written by ADD");
    let (p, b) = golden("v1-strict.json");
    assert!(parse(&p, &b).unwrap().is_strict());
}

/// Version 2: a dual-stack strict pod with a pool (rules with a protocol
/// selector and a blackhole action, a main route swapped per address).
#[test]
fn golden_v2_record_parses_round_trips_and_is_applied_as_written() {
    let (p, b) = golden("v2-strict-dual-stack.json");
    let r = parse(&p, &b).unwrap();
    assert_eq!(r.version, 2);
    let again = serde_json::to_vec(&r).unwrap();
    assert_eq!(parse(&p, &again).unwrap(), r);
    let routing = r.routing.as_ref().unwrap();
    assert!(routing.needs_v2());
    let plan = routing.plan();
    assert_eq!(plan.mains.len(), 2);
    assert_eq!(plan.mains[1].replacement.dst.to_string(), "fd00:40::3/128");
    let described: Vec<String> = plan.rules.iter().map(|x| x.describe()).collect();
    for want in [
        "95: from all to fe80::/10 iif veth1234 ipproto 58 lookup 255",
        "96: from all to ff00::/8 iif veth1234 blackhole",
        "100: from all to 10.60.0.0/24 iif up0 lookup 20000",
    ] {
        assert!(described.iter().any(|d| d == want), "{want}: {described:?}");
    }
    assert_eq!(plan.families().collect::<Vec<_>>(), [false, true]);
    // A v1 golden record needs nothing of version 2.
    let (p, b) = golden("v1-strict.json");
    assert!(!parse(&p, &b).unwrap().routing.unwrap().needs_v2());
}

#[test]
fn an_adopted_record_says_so_and_a_record_by_add_does_not_carry_the_field() {
    let (p, b) = golden("v1-adopted.json");
    let r = parse(&p, &b).unwrap();
    assert!(r.adopted);
    assert!(String::from_utf8(serde_json::to_vec(&r).unwrap())
        .unwrap()
        .contains("\"adopted\":true"));
    let (p, b) = golden("v1-vpn-full.json");
    let by_add = serde_json::to_string(&parse(&p, &b).unwrap()).unwrap();
    assert!(!by_add.contains("adopted"), "{by_add}");
}

#[test]
fn scan_reports_each_record_with_its_status() {
    let tmp = tempfile::Builder::new()
        .prefix("podgate-scan-")
        .tempdir()
        .unwrap();
    let d = tmp.path().to_path_buf();
    for (file, g) in [
        ("goldennet+golden-pending+eth0.json", "v1-pending.json"),
        ("goldennet+golden-v3+eth0.json", "v3-future.json"),
    ] {
        std::fs::write(d.join(file), golden(g).1).unwrap();
    }
    std::fs::write(d.join("a+b+c.json"), b"{").unwrap();
    let mut live = parse(Path::new("x"), &golden("v1-vpn-full.json").1).unwrap();
    live.netns = None;
    live.status = Status::Pending;
    std::fs::write(
        d.join(live.key.file_name()),
        serde_json::to_vec(&live).unwrap(),
    )
    .unwrap();
    let infos = scan(&d).unwrap();
    let status = |id: &str| {
        infos
            .iter()
            .find(|i| i.key.as_ref().is_some_and(|k| k.container_id == id))
            .map(|i| i.status.clone())
            .unwrap()
    };
    assert!(matches!(
        status("golden-pending"),
        RecordStatus::Stale { .. }
    ));
    assert_eq!(
        status("golden-v3"),
        RecordStatus::NewerVersion { version: 3 }
    );
    assert!(matches!(status("b"), RecordStatus::Unreadable { .. }));
    assert_eq!(status("golden-v1"), RecordStatus::Pending);
    assert_eq!(infos.len(), 4);
    assert!(scan(&d.join("missing")).unwrap().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn unversioned_records_are_upgraded() {
    let (p, b) = golden("v0-vpn-routed.json");
    let r = parse(&p, &b).unwrap();
    assert_eq!(r.status, Status::Applied);
    assert_eq!(r.profile, "vpn-routed");
    assert_eq!(r.sysctls[0].previous.as_deref(), Some("0"));
    assert_eq!(r.node_routes[0].dst.to_string(), "10.9.0.0/24");
}

#[test]
fn newer_and_broken_records_are_told_apart() {
    let p = Path::new("/x/a+b+c.json");
    let newer = parse(p, br#"{"version": 3, "whatever": true}"#).unwrap_err();
    assert!(matches!(newer, ReadError::Newer { version: 3, .. }));
    assert!(newer.to_string().contains("format version 3"), "{newer}");
    for body in [
        &b"{not json"[..],
        br#"{"version": "1"}"#,
        br#"{"version": 1}"#,
    ] {
        let e = parse(p, body).unwrap_err();
        assert!(matches!(e, ReadError::Unreadable { .. }), "{e}");
    }
}

#[test]
fn a_reboot_or_another_namespace_makes_a_record_stale() {
    let (p, b) = golden("v1-vpn-full.json");
    let mut r = parse(&p, &b).unwrap();
    r.netns = Some(PathBuf::from("/proc/self/ns/net"));
    let here = Here::now();
    let me = NetNs::current().unwrap().identity().unwrap();
    r.netns_id = Some(me.into());
    r.node_netns_id = here.node.map(NsId::from);
    r.boot_id = here.boot_id.clone();
    assert_eq!(r.liveness(&here, Depth::Precise), Liveness::Live);
    let mut reused = r.clone();
    reused.netns_id = Some(NsId {
        cookie: me.cookie.map(|c| c + 1),
        ..me.into()
    });
    assert!(!reused.liveness(&here, Depth::Path).is_stale());
    assert!(reused.liveness(&here, Depth::Precise).is_stale() || me.cookie.is_none());
    let mut old = r.clone();
    old.boot_id = Some("00000000-0000-0000-0000-000000000000".into());
    assert!(matches!(
        old.liveness(&here, Depth::Boot),
        Liveness::Stale {
            node_gone: true,
            ..
        }
    ));
    let mut unseen = r.clone();
    unseen.netns = Some(PathBuf::from("/nonexistent/netns"));
    assert_eq!(unseen.liveness(&here, Depth::Path), Liveness::Live);
    let mut gone = r.clone();
    gone.netns = Some(PathBuf::from("/proc/self/ns/nonexistent"));
    assert!(matches!(
        gone.liveness(&here, Depth::Path),
        Liveness::Stale {
            node_gone: false,
            ..
        }
    ));
}
