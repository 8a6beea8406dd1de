use super::*;
use crate::record::{Listing, Status};
use std::path::PathBuf;

fn golden(name: &str) -> Record {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/records")
        .join(name);
    record::parse(&p, &std::fs::read(&p).unwrap()).unwrap()
}

/// A state dir of today's layout: records only, no index; removed with the
/// returned guard.
fn store(tag: &str, records: &[&Record]) -> (tempfile::TempDir, StateStore) {
    let t = tempfile::Builder::new()
        .prefix(&format!("podgate-claims-{tag}-"))
        .tempdir()
        .unwrap();
    let s = StateStore::open(&t.path().join("state")).unwrap();
    for r in records {
        s.write(&r.key, r).unwrap();
    }
    (t, s)
}

fn with_key(mut r: Record, cid: &str) -> Record {
    r.key.container_id = cid.into();
    r.status = Status::Applied;
    r
}

/// The entries of `claims.v2`, one a line after the header (empty: no
/// file).
fn index_files(s: &StateStore) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_to_string(s.dir().join(FILE))
        .map(|t| t.lines().skip(1).map(String::from).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn v1_dir(s: &StateStore) -> PathBuf {
    s.dir().join(V1_DIR)
}

fn pools(p: &[IpNet]) -> Wanted<'_> {
    Wanted {
        pools: p,
        ..Wanted::default()
    }
}

fn records_of(s: &StateStore) -> Listing {
    record::list_in(s, &s.names().unwrap()).unwrap()
}

#[test]
fn an_upgrade_without_an_index_rebuilds_it_from_the_records_once() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let b = with_key(golden("v0-vpn-routed.json"), "b");
    let (_tmp, s) = store("upgrade", &[&a, &b]);
    let mut index = Index::load(&s).unwrap();
    assert!(index.entries.is_empty());
    assert_eq!(index.catch_up(&s, &s.names().unwrap()).unwrap().added, 2);
    let want = from_records(&records_of(&s).records);
    assert!(!want.is_empty(), "the golden records claim pools");
    assert_eq!(trusted(&s).unwrap(), want);
    // Known now: the next ADD reads no record to catch up.
    let mut again = Index::load(&s).unwrap();
    assert_eq!(again.catch_up(&s, &s.names().unwrap()).unwrap().added, 0);
}

#[test]
fn owners_are_the_records_that_still_claim_an_overlapping_pool() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let pool = a.claim().pools[0];
    let (_tmp, s) = store("owners", &[&a]);
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
    let (owners, _) = index.records(&s, &pools(&[wider]), &other);
    assert_eq!(
        owners.iter().map(|r| r.key.clone()).collect::<Vec<_>>(),
        vec![a.key.clone()]
    );
    assert!(
        index.records(&s, &pools(&[pool]), &a.key).0.is_empty(),
        "not its own owner"
    );
    let disjoint: IpNet = "192.0.2.0/24".parse().unwrap();
    assert!(index.records(&s, &pools(&[disjoint]), &other).0.is_empty());
    assert_eq!(trusted(&s).unwrap(), from_records(&records_of(&s).records));
}

#[test]
fn removing_a_record_removes_its_entries_and_prune_removes_orphans() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let b = with_key(golden("v1-vpn-full.json"), "b");
    let (_tmp, s) = store("remove", &[&a, &b]);
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
    let (_tmp, s) = store("rollback", &[&a]);
    let before = records_of(&s);
    claim(&s, &a).unwrap();
    // A temp file a killed writer of the index left.
    std::fs::write(s.dir().join(TMP), "podgate claims v2\n").unwrap();
    let after = records_of(&s);
    assert_eq!(after.records, before.records);
    assert!(after.unreadable.is_empty() && after.newer.is_empty());
    assert_eq!(
        s.sweep_temp().unwrap(),
        1,
        "the orphaned temp file is swept, the index is not"
    );
    assert!(s.dir().join(FILE).exists() && !s.dir().join(TMP).exists());
    // Every release's catch-up skips dot names and names no record.
    assert!(Key::from_file_name(FILE).is_none() && TMP.starts_with('.'));
}

#[test]
fn a_record_written_without_the_index_after_a_rollback_is_indexed_by_the_next_add() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let (_tmp, s) = store("reupgrade", &[&a]);
    claim(&s, &a).unwrap();
    // The earlier release wrote b's record and knew nothing of the index.
    let b = with_key(golden("v0-vpn-routed.json"), "b");
    s.write(&b.key, &b).unwrap();
    let mut index = Index::load(&s).unwrap();
    assert_eq!(index.catch_up(&s, &s.names().unwrap()).unwrap().added, 1);
    assert_eq!(trusted(&s).unwrap(), from_records(&records_of(&s).records));
}

/// The last release's reading of one name of its index (its
/// `Entry::parse`, `plugins/router/src/claims.rs` at 266959f): `k=<file>`
/// or `p=<pool>=<file>`, every other name skipped.
fn previous_release_parse(name: &str) -> Option<(Option<IpNet>, String)> {
    if let Some(rec) = name.strip_prefix("k=") {
        return Some((None, rec.to_string()));
    }
    let (pool, rec) = name.strip_prefix("p=")?.split_once('=')?;
    Some((Some(pool.replace('_', "/").parse().ok()?), rec.to_string()))
}

/// The last release's index, as it reads it (`claims.v1/` absent: empty).
fn previous_release_index(s: &StateStore) -> BTreeSet<(Option<IpNet>, String)> {
    std::fs::read_dir(v1_dir(s))
        .map(|rd| {
            rd.filter_map(|e| previous_release_parse(&e.unwrap().file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default()
}

/// What the last release's index must hold for `records`: each pool and
/// a `k=` marker per record.
fn previous_release_want(records: &[Record]) -> BTreeSet<(Option<IpNet>, String)> {
    records
        .iter()
        .flat_map(|r| {
            let file = r.key.file_name();
            r.claim()
                .pools
                .into_iter()
                .map(Some)
                .chain([None])
                .map(move |p| (p, file.clone()))
        })
        .collect()
}

/// The last release's ADD of `rec` as far as its index goes (its
/// `Index::catch_up` and `claim` at 266959f): every record without a `k=`
/// name in `claims.v1/` is indexed (its `p=` names, then `k=`; the
/// directory is made when absent), then `rec`'s names, then its record.
fn previous_release_add(s: &StateStore, rec: &Record) {
    let known: BTreeSet<String> = previous_release_index(s)
        .into_iter()
        .filter(|(p, _)| p.is_none())
        .map(|(_, f)| f)
        .collect();
    let mut todo: Vec<Record> = records_of(s)
        .records
        .into_iter()
        .filter(|r| !known.contains(&r.key.file_name()))
        .collect();
    todo.push(rec.clone());
    std::fs::create_dir_all(v1_dir(s)).unwrap();
    for r in &todo {
        let file = r.key.file_name();
        for p in r.claim().pools {
            let name = format!("p={}={file}", p.to_string().replace('/', "_"));
            std::fs::write(v1_dir(s).join(name), "").unwrap();
        }
        std::fs::write(v1_dir(s).join(format!("k={file}")), "").unwrap();
    }
    s.write(&rec.key, rec).unwrap();
}

/// The last release's DEL of `key` (index-wise): the record, then its
/// names in `claims.v1/`.
fn previous_release_del(s: &StateStore, key: &Key) {
    s.remove(key).unwrap();
    let file = key.file_name();
    if let Ok(rd) = std::fs::read_dir(v1_dir(s)) {
        for e in rd {
            let name = e.unwrap().file_name();
            if previous_release_parse(&name.to_string_lossy()).is_some_and(|(_, f)| f == file) {
                std::fs::remove_file(v1_dir(s).join(name)).unwrap();
            }
        }
    }
}

/// This release's ADD of `rec` as far as the index goes: load, catch up
/// from the state dir's names, claim, write the record.
fn this_release_add(s: &StateStore, rec: &Record) -> CaughtUp {
    let mut index = Index::load(s).unwrap();
    let caught = index.catch_up(s, &s.names().unwrap()).unwrap();
    index.claim(s, rec).unwrap();
    s.write(&rec.key, rec).unwrap();
    caught
}

#[test]
fn a_strict_record_is_indexed_by_its_table_and_strict_slot_and_read_only_for_those() {
    let strict = with_key(golden("v1-strict.json"), "s");
    let pooled = with_key(golden("v1-vpn-full.json"), "a");
    let (_tmp, s) = store("strict", &[&strict, &pooled]);
    let mut index = Index::load(&s).unwrap();
    index.catch_up(&s, &s.names().unwrap()).unwrap();
    let table = strict
        .claim()
        .table
        .expect("the golden strict record has a table");
    let file = strict.key.file_name();
    let files = index_files(&s);
    for want in [
        format!("t={table}={file}"),
        format!("s={file}"),
        format!("c={file}"),
    ] {
        assert!(files.contains(&want), "{want} missing: {files:?}");
    }
    let other = Key::new("goldennet", "new", "eth0");
    let read = |w: Wanted| -> Vec<Key> {
        Index::load(&s)
            .unwrap()
            .records(&s, &w, &other)
            .0
            .into_iter()
            .map(|r| r.key)
            .collect()
    };
    let tables = Wanted {
        tables: true,
        ..Wanted::default()
    };
    let slots = Wanted {
        strict: true,
        ..Wanted::default()
    };
    assert_eq!(read(tables), vec![strict.key.clone()]);
    assert_eq!(read(slots), vec![strict.key.clone()]);
    assert!(read(Wanted::default()).is_empty());
    // The record no longer strict (rewritten under its name): its entries
    // are not trusted.
    let mut plain = strict.clone();
    plain.routing = None;
    s.write(&plain.key, &plain).unwrap();
    assert!(read(tables).is_empty() && read(slots).is_empty());
    assert!(trusted(&s)
        .unwrap()
        .iter()
        .all(|(c, k)| *k != strict.key || matches!(c, ClaimedField::Pool(_))));
}

/// A golden index listing of the last release (`tests/claims/<name>`),
/// one name a line.
fn golden_index(name: &str) -> BTreeSet<String> {
    std::fs::read_to_string(golden_claims(name))
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

fn golden_claims(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/claims")
        .join(name)
}

/// The golden records the golden index files name: `v1-vpn-full.json`
/// as `goldennet/a/eth0` (a pool), `v1-strict.json` as `ptpnet/s/eth0`
/// (table 20000, strict).
fn golden_pair() -> [Record; 2] {
    [
        with_key(golden("v1-vpn-full.json"), "a"),
        with_key(golden("v1-strict.json"), "s"),
    ]
}

#[test]
fn this_release_writes_the_golden_index_file() {
    let [a, st] = golden_pair();
    let (_tmp, s) = store("golden-file", &[&a, &st]);
    claim(&s, &a).unwrap();
    claim(&s, &st).unwrap();
    assert_eq!(
        std::fs::read_to_string(s.dir().join(FILE)).unwrap(),
        std::fs::read_to_string(golden_claims("claims.v2")).unwrap()
    );
    assert!(!v1_dir(&s).exists(), "no claims.v1/ is written");
}

#[test]
fn an_upgrade_from_the_last_releases_index_rebuilds_it_from_the_records_and_removes_claims_v1() {
    let [a, st] = golden_pair();
    let (_tmp, s) = store("upgrade-v1", &[&a, &st]);
    std::fs::create_dir_all(v1_dir(&s)).unwrap();
    let names = golden_index("previous-release.txt");
    for name in &names {
        std::fs::write(v1_dir(&s).join(name), "").unwrap();
    }
    assert_eq!(
        previous_release_index(&s),
        previous_release_want(&[a.clone(), st.clone()]),
        "the golden listing is the last release's index of the golden pair"
    );
    let mut index = Index::load(&s).unwrap();
    assert_eq!(
        index.catch_up(&s, &s.names().unwrap()).unwrap(),
        CaughtUp {
            added: 2,
            unknown: 0
        },
        "claims.v1/'s names are not trusted: every record is read"
    );
    assert_eq!(
        std::fs::read_to_string(s.dir().join(FILE)).unwrap(),
        std::fs::read_to_string(golden_claims("claims.v2")).unwrap()
    );
    assert!(
        !v1_dir(&s).exists(),
        "claims.v1/ removed once claims.v2 is written"
    );
    assert_eq!(trusted(&s).unwrap(), from_records(&records_of(&s).records));
}

#[test]
fn after_this_release_ran_a_rollback_finds_no_claims_v1_and_the_last_release_indexes_every_record()
{
    let [a, st] = golden_pair();
    let (_tmp, s) = store("rollback-v1", &[]);
    previous_release_add(&s, &a);
    assert!(v1_dir(&s).exists());
    // Upgrade: this release adds the strict pod.
    this_release_add(&s, &st);
    assert!(!v1_dir(&s).exists());
    // Rollback: the last release adds another pooled attachment; with no
    // claims.v1/ it indexes every record first, this release's included.
    let mut b = with_key(golden("v1-vpn-full.json"), "b");
    b.node_routes[0].dst = "10.77.0.0/24".parse().unwrap();
    previous_release_add(&s, &b);
    let records = records_of(&s).records;
    assert_eq!(records.len(), 3);
    assert_eq!(previous_release_index(&s), previous_release_want(&records));
}

#[test]
fn a_roll_forward_after_a_rollback_trusts_no_entry_indexes_every_record_and_removes_claims_v1() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let (_tmp, s) = store("rollforward", &[]);
    this_release_add(&s, &a);
    assert!(index_files(&s).contains(&format!("c={}", a.key.file_name())));
    // Rollback: the last release deletes the attachment and adds it again
    // under the same name as a strict pod (this release's `c=` entry for
    // it stays in claims.v2, which the last release does not know).
    previous_release_del(&s, &a.key);
    let mut strict = golden("v1-strict.json");
    strict.key = a.key.clone();
    previous_release_add(&s, &strict);
    assert!(v1_dir(&s).exists());
    // Roll forward: claims.v1/ says the last release ran since.
    let other = with_key(golden("v1-vpn-full.json"), "b");
    assert_eq!(
        this_release_add(&s, &other).added,
        1,
        "the strict record read again"
    );
    assert!(!v1_dir(&s).exists());
    assert_eq!(trusted(&s).unwrap(), from_records(&records_of(&s).records));
    let table = strict.claim().table.unwrap();
    assert!(index_files(&s).contains(&format!("t={table}={}", a.key.file_name())));
}

#[test]
fn an_index_file_of_another_format_counts_as_empty_and_unknown_lines_are_skipped() {
    let [a, st] = golden_pair();
    let (_tmp, s) = store("format", &[&a, &st]);
    let golden = std::fs::read_to_string(golden_claims("claims.v2")).unwrap();
    let entries = golden.lines().count() - 1;
    // A later kind of entry among today's: skipped, the rest read.
    std::fs::write(
        s.dir().join(FILE),
        format!("{golden}x=later={}\n", a.key.file_name()),
    )
    .unwrap();
    assert_eq!(Index::load(&s).unwrap().entries.len(), entries);
    let mut index = Index::load(&s).unwrap();
    assert_eq!(index.catch_up(&s, &s.names().unwrap()).unwrap().added, 0);
    assert_eq!(trusted(&s).unwrap(), from_records(&records_of(&s).records));
    // Another header, or not text: no entry, every record read again.
    let other = golden.replacen(HEADER, "podgate claims v3", 1);
    let mut torn = golden.clone().into_bytes();
    torn.extend([0xff, 0xfe, b'\n']);
    for body in [other.into_bytes(), torn, Vec::new()] {
        std::fs::write(s.dir().join(FILE), &body).unwrap();
        let mut index = Index::load(&s).unwrap();
        assert!(index.entries.is_empty());
        assert_eq!(index.catch_up(&s, &s.names().unwrap()).unwrap().added, 2);
        assert_eq!(
            std::fs::read_to_string(s.dir().join(FILE)).unwrap(),
            golden,
            "rewritten from the records"
        );
    }
}

#[test]
fn a_record_that_cannot_be_read_stays_unknown_and_is_counted() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let (_tmp, s) = store("unknown", &[&a]);
    let future = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/records/v3-future.json");
    std::fs::copy(future, s.dir().join("goldennet+future+eth0.json")).unwrap();
    std::fs::write(s.dir().join("goldennet+torn+eth0.json"), "{").unwrap();
    let caught = Index::load(&s)
        .unwrap()
        .catch_up(&s, &s.names().unwrap())
        .unwrap();
    assert_eq!(
        caught,
        CaughtUp {
            added: 1,
            unknown: 2
        }
    );
}

#[test]
fn reconcile_repairs_a_record_an_earlier_release_rewrote_under_the_same_name() {
    let a = with_key(golden("v1-vpn-full.json"), "a");
    let (_tmp, s) = store("reconcile", &[&a]);
    claim(&s, &a).unwrap();
    // After a rollback to a release that keeps no index: it deleted the
    // attachment and added it again as a strict pod under the same name.
    let mut strict = golden("v1-strict.json");
    strict.key = a.key.clone();
    s.write(&strict.key, &strict).unwrap();
    // The `c=` entry says the index holds its claims: an ADD does not read
    // it again, and its table and strict slot are missing.
    let mut index = Index::load(&s).unwrap();
    assert_eq!(index.catch_up(&s, &s.names().unwrap()).unwrap().added, 0);
    assert_ne!(trusted(&s).unwrap(), from_records(&records_of(&s).records));
    // GC and the agent's sweep read every record and repair it.
    let records = records_of(&s).records;
    assert!(reconcile(&s, &records).unwrap() > 0);
    assert_eq!(trusted(&s).unwrap(), from_records(&records));
    assert!(
        !index_files(&s).iter().any(|e| e.starts_with("p=")),
        "the pool it no longer claims is gone: {:?}",
        index_files(&s)
    );
    assert_eq!(
        reconcile(&s, &records).unwrap(),
        0,
        "nothing left to repair"
    );
}

/// `Census::indexed` for `want` with every record judged live.
fn indexed_census(s: &StateStore, want: Wanted, own: &Key) -> Option<crate::lifecycle::Census> {
    let mut index = Index::load(s).unwrap();
    let caught = index.catch_up(s, &s.names().unwrap()).unwrap();
    let here = record::Here {
        boot_id: None,
        node: None,
    };
    crate::lifecycle::Census::indexed(s, &index, caught.unknown, want, own, &here, |_| {
        record::Depth::Boot
    })
}

#[test]
fn a_strict_census_from_the_index_counts_the_other_strict_pods() {
    let one = with_key(golden("v1-strict.json"), "s1");
    let two = with_key(golden("v1-strict.json"), "s2");
    let pooled = with_key(golden("v1-vpn-full.json"), "a");
    let (_tmp, s) = store("lastcensus", &[&one, &two, &pooled]);
    let slots = Wanted {
        strict: true,
        ..Wanted::default()
    };
    let c = indexed_census(&s, slots, &one.key).expect("the index answers");
    assert!(!c.last_strict(&one.key), "s2 is still there");
    let read: Vec<Key> = c.listing.records.iter().map(|r| r.key.clone()).collect();
    assert!(
        !read.contains(&pooled.key),
        "a record holding no strict slot is not read: {read:?}"
    );
    remove(&s, &two.key).unwrap();
    let c = indexed_census(&s, slots, &one.key).expect("the index answers");
    assert!(c.last_strict(&one.key), "no other strict pod");
}

#[test]
fn a_strict_census_falls_back_to_every_record_when_one_cannot_be_read() {
    let one = with_key(golden("v1-strict.json"), "s1");
    let two = with_key(golden("v1-strict.json"), "s2");
    let (_tmp, s) = store("failclosed", &[&one, &two]);
    let slots = Wanted {
        strict: true,
        ..Wanted::default()
    };
    assert!(indexed_census(&s, slots, &one.key).is_some());
    // A record the index names as strict, now unreadable (torn, or
    // rewritten by a newer release): what it holds is not known.
    std::fs::write(s.dir().join(two.key.file_name()), "{").unwrap();
    assert!(indexed_census(&s, slots, &one.key).is_none());
    // A record the index does not know, unreadable: the same.
    let (_tmp, s) = store("failclosed2", &[&one]);
    std::fs::write(s.dir().join("goldennet+torn+eth0.json"), "{").unwrap();
    assert!(indexed_census(&s, slots, &one.key).is_none());
    // Without strict settings at stake it does not matter: an ADD routing
    // a pool reads the owners the index names.
    let a = with_key(golden("v1-vpn-full.json"), "a");
    s.write(&a.key, &a).unwrap();
    let p = a.claim().pools;
    let other = Key::new("goldennet", "new", "eth0");
    let c = indexed_census(&s, pools(&p), &other).expect("pools only");
    let read: Vec<Key> = c.listing.records.iter().map(|r| r.key.clone()).collect();
    assert_eq!(read, vec![a.key.clone()]);
}

#[test]
fn a_census_from_the_index_reads_the_owners_of_the_pools_of_what_it_read() {
    // A strict pod that also routes a pool, and another attachment routing
    // the same pool (it re-claimed it after the strict pod died): removing
    // the strict pod's record must see the other one's route.
    let mut strict = with_key(golden("v1-vpn-full.json"), "s1");
    strict.routing = golden("v1-strict.json").routing;
    let reclaimed = with_key(golden("v1-vpn-full.json"), "a");
    let mut unrelated = with_key(golden("v1-vpn-full.json"), "b");
    unrelated.node_routes[0].dst = "10.77.0.0/24".parse().unwrap();
    let (_tmp, s) = store("pooled", &[&strict, &reclaimed, &unrelated]);
    let slots = Wanted {
        strict: true,
        ..Wanted::default()
    };
    let own = Key::new("goldennet", "new", "eth0");
    let c = indexed_census(&s, slots, &own).expect("the index answers");
    let mut read: Vec<String> = c
        .listing
        .records
        .iter()
        .map(|r| r.key.container_id.clone())
        .collect();
    read.sort();
    assert_eq!(read, ["a", "s1"], "not b, whose pool is another");
}

#[test]
fn an_index_file_out_of_order_or_with_repeated_lines_is_read_as_its_set_and_written_sorted() {
    let [a, st] = golden_pair();
    let (_tmp, s) = store("shuffled", &[&a, &st]);
    let golden = std::fs::read_to_string(golden_claims("claims.v2")).unwrap();
    let mut lines: Vec<&str> = golden.lines().skip(1).collect();
    lines.reverse();
    let repeated = lines[1];
    lines.push(repeated);
    lines.insert(2, "x=later=nothing");
    std::fs::write(
        s.dir().join(FILE),
        format!("{HEADER}\r\n{}\n", lines.join("\n")),
    )
    .unwrap();
    let mut index = Index::load(&s).unwrap();
    assert_eq!(index.entries.len(), golden.lines().count() - 1);
    assert_eq!(index.catch_up(&s, &s.names().unwrap()).unwrap().added, 0);
    assert_eq!(trusted(&s).unwrap(), from_records(&records_of(&s).records));
    // A change writes the set back in this release's order, once each.
    release(&s, &Key::new("gone", "c", "eth0")).unwrap();
    let mut index = Index::load(&s).unwrap();
    index.changed = true;
    index.save(&s).unwrap();
    assert_eq!(std::fs::read_to_string(s.dir().join(FILE)).unwrap(), golden);
}

#[test]
fn claims_and_releases_in_any_order_write_what_a_set_of_the_entries_would() {
    // Records claiming pools of both families, tables and strict slots,
    // claimed, released and claimed again in a scrambled order: after each
    // step the file is the header and the model's lines, sorted by kind,
    // then pool or table, then record file, each once.
    let [a, st] = golden_pair();
    let mut recs: Vec<Record> = Vec::new();
    for i in 0..24u32 {
        let mut r = with_key(
            if i % 3 == 0 { st.clone() } else { a.clone() },
            &format!("c{i}"),
        );
        if let Some(route) = r.node_routes.first_mut() {
            route.dst = if i % 4 == 1 {
                format!("fd00:{i:x}::/64").parse().unwrap()
            } else {
                format!("10.{}.{}.0/24", 9 + i % 3, i).parse().unwrap()
            };
        }
        recs.push(r);
    }
    let (_tmp, s) = store("model", &[]);
    let mut model: BTreeSet<(Kind, String)> = BTreeSet::new();
    let mut x: u32 = 7;
    for step in 0..200 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let r = &recs[(x >> 8) as usize % recs.len()];
        let file = r.key.file_name();
        if (x >> 20).is_multiple_of(3) {
            release(&s, &r.key).unwrap();
            model.retain(|(_, f)| *f != file);
        } else {
            claim(&s, r).unwrap();
            model.extend(kinds_of(r).into_iter().map(|k| (k, file.clone())));
        }
        let want: String = std::iter::once(HEADER.to_string())
            .chain(model.iter().map(|(k, f)| k.line(f)))
            .map(|l| l + "\n")
            .collect();
        let got = std::fs::read_to_string(s.dir().join(FILE)).unwrap_or_else(|_| want.clone());
        assert_eq!(got, want, "step {step}");
    }
    assert!(model
        .iter()
        .any(|(k, _)| matches!(k, Kind::Pool(IpNet::V6(_)))));
    assert!(model.iter().any(|(k, _)| matches!(k, Kind::Strict)));
}
