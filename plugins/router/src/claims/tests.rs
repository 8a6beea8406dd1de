use super::*;
use crate::record::{Listing, Status};

fn golden(name: &str) -> Record {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/records")
        .join(name);
    record::parse(&p, &std::fs::read(&p).unwrap()).unwrap()
}

/// A state dir of today's layout: records only, no index.
fn store(tag: &str, records: &[&Record]) -> StateStore {
    let d = std::env::temp_dir().join(format!("podgate-claims-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let s = StateStore::open(&d).unwrap();
    for r in records {
        s.write(&r.key, r).unwrap();
    }
    s
}

fn with_key(mut r: Record, cid: &str) -> Record {
    r.key.container_id = cid.into();
    r.status = Status::Applied;
    r
}

fn index_files(s: &StateStore) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir(s))
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn records_of(s: &StateStore) -> Listing {
    record::list_in(s, &s.names().unwrap()).unwrap()
}

#[test]
fn an_upgrade_without_an_index_rebuilds_it_from_the_records_once() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let b = with_key(golden("v0-vpn-routed.json"), "b");
    let s = store("upgrade", &[&a, &b]);
    let mut index = Index::load(&s).unwrap();
    assert!(index.entries.is_empty());
    assert_eq!(index.catch_up(&s, &s.names().unwrap()).unwrap(), 2);
    let want = from_records(&records_of(&s).records);
    assert!(!want.is_empty(), "the golden records claim pools");
    assert_eq!(trusted(&s).unwrap(), want);
    // Known now: the next ADD reads no record to catch up.
    let mut again = Index::load(&s).unwrap();
    assert_eq!(again.catch_up(&s, &s.names().unwrap()).unwrap(), 0);
}

#[test]
fn owners_are_the_records_that_still_claim_an_overlapping_pool() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let pool = a.claim().pools[0];
    let s = store("owners", &[&a]);
    claim(&s, &a).unwrap();
    // An entry whose record is gone (a killed ADD) and one whose record
    // no longer claims the pool: neither is trusted.
    let gone = with_key(a.clone(), "gone");
    claim(&s, &gone).unwrap();
    let mut moved = with_key(a.clone(), "moved");
    claim(&s, &moved).unwrap();
    moved.node_routes.clear();
    s.write(&moved.key, &moved).unwrap();
    let index = Index::load(&s).unwrap();
    let wider: IpNet = format!("{}/8", pool.network()).parse().unwrap();
    let other = Key::new("goldennet", "new", "eth0");
    let owners = index.owners(&s, &[wider], &other);
    assert_eq!(
        owners.iter().map(|r| r.key.clone()).collect::<Vec<_>>(),
        vec![a.key.clone()]
    );
    assert!(
        index.owners(&s, &[pool], &a.key).is_empty(),
        "not its own owner"
    );
    let disjoint: IpNet = "192.0.2.0/24".parse().unwrap();
    assert!(index.owners(&s, &[disjoint], &other).is_empty());
    assert_eq!(trusted(&s).unwrap(), from_records(&records_of(&s).records));
}

#[test]
fn removing_a_record_removes_its_entries_and_prune_removes_orphans() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let b = with_key(golden("v1-vpn-full.json"), "b");
    let s = store("remove", &[&a, &b]);
    claim(&s, &a).unwrap();
    claim(&s, &b).unwrap();
    claim(&s, &with_key(a.clone(), "killed")).unwrap();
    assert!(remove(&s, &a.key).unwrap());
    assert!(index_files(&s)
        .iter()
        .all(|f| !f.ends_with(&a.key.file_name())));
    prune(&s, &s.names().unwrap()).unwrap();
    let left = index_files(&s);
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left.iter().all(|f| f.ends_with(&b.key.file_name())),
        "{left:?}"
    );
    assert_eq!(trusted(&s).unwrap(), from_records(&records_of(&s).records));
}

#[test]
fn todays_record_listing_ignores_the_index_so_a_rollback_reads_the_same_records() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let s = store("rollback", &[&a]);
    let before = records_of(&s);
    claim(&s, &a).unwrap();
    let after = records_of(&s);
    assert_eq!(after.records, before.records);
    assert!(after.unreadable.is_empty() && after.newer.is_empty());
    assert_eq!(
        s.sweep_temp().unwrap(),
        0,
        "index entries are not temp files"
    );
}

#[test]
fn a_record_written_without_the_index_after_a_rollback_is_indexed_by_the_next_add() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let s = store("reupgrade", &[&a]);
    claim(&s, &a).unwrap();
    // The earlier release wrote b's record and knew nothing of the index.
    let b = with_key(golden("v0-vpn-routed.json"), "b");
    s.write(&b.key, &b).unwrap();
    let mut index = Index::load(&s).unwrap();
    assert_eq!(index.catch_up(&s, &s.names().unwrap()).unwrap(), 1);
    assert_eq!(trusted(&s).unwrap(), from_records(&records_of(&s).records));
}
