//! Before/after snapshots of a namespace's networking state.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::{Netns, TestNode};

/// Canonicalised networking state of one namespace. Every entry is one
/// compact JSON (or text) line; volatile fields (expiry timers, counters,
/// statistics, nftables handles, the nft version banner) are removed, and
/// order-insensitive lists are sorted, so two snapshots of an unchanged
/// namespace compare equal.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Snapshot {
    /// Link names, sorted.
    pub links: Vec<String>,
    /// `ifname family addr/prefixlen`, sorted.
    pub addrs: Vec<String>,
    /// `ip -4 -j -d route show table all`, sorted.
    pub routes4: Vec<String>,
    /// `ip -6 -j -d route show table all`, sorted.
    pub routes6: Vec<String>,
    /// `ip -d -j rule show`: with details (each rule's protocol), so a rule
    /// put back with another protocol than it had is a difference.
    /// Priorities are included, so sorting is lossless.
    pub rules4: Vec<String>,
    /// `ip -6 -d -j rule show`.
    pub rules6: Vec<String>,
    /// `nft -j list ruleset` entries, grouped per table in a stable order
    /// (rule order within a chain is preserved).
    pub nft: Vec<String>,
}

impl Snapshot {
    fn sections(&self) -> [(&'static str, &Vec<String>); 7] {
        [
            ("links", &self.links),
            ("addrs", &self.addrs),
            ("routes4", &self.routes4),
            ("routes6", &self.routes6),
            ("rules4", &self.rules4),
            ("rules6", &self.rules6),
            ("nft", &self.nft),
        ]
    }

    /// Human-readable difference (`-` only in `self`, `+` only in `other`);
    /// empty when equal.
    pub fn diff(&self, other: &Snapshot) -> String {
        let mut s = String::new();
        for ((name, a), (_, b)) in self.sections().into_iter().zip(other.sections()) {
            if a == b {
                continue;
            }
            let _ = writeln!(s, "[{name}]");
            let gone = multiset_minus(a, b);
            let new = multiset_minus(b, a);
            for l in &gone {
                let _ = writeln!(s, "- {l}");
            }
            for l in &new {
                let _ = writeln!(s, "+ {l}");
            }
            if gone.is_empty() && new.is_empty() {
                let _ = writeln!(s, "  (same entries, different order)");
                for l in a {
                    let _ = writeln!(s, "  before: {l}");
                }
                for l in b {
                    let _ = writeln!(s, "  after:  {l}");
                }
            }
        }
        s
    }
}

fn multiset_minus<'a>(a: &'a [String], b: &[String]) -> Vec<&'a String> {
    let mut rest: Vec<&String> = b.iter().collect();
    let mut out = Vec::new();
    for x in a {
        if let Some(pos) = rest.iter().position(|y| *y == x) {
            rest.swap_remove(pos);
        } else {
            out.push(x);
        }
    }
    out
}

/// Panics with a readable diff unless the two snapshots are equal.
#[track_caller]
pub fn assert_same(before: &Snapshot, after: &Snapshot) {
    if before != after {
        panic!(
            "namespace state changed (- before, + after):\n{}",
            before.diff(after)
        );
    }
}

/// Captures routes (v4+v6, all tables), rules (v4+v6), the nftables ruleset,
/// links and addresses of `ns`.
pub fn snapshot(ns: &Netns) -> Snapshot {
    snapshot_by(|args| ns.exec_ok(args))
}

/// [`snapshot`] of the netns bound at `path` (one this harness did not make,
/// e.g. a node of [`crate::k8s::Cluster`]), read through `nsenter --net=`.
pub fn snapshot_at(path: &Path) -> Snapshot {
    snapshot_by(|args| {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={}", path.display()))
            .arg("--")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("nsenter {args:?}: {e}"));
        assert!(
            out.status.success(),
            "in {}: {args:?} failed\n{}",
            path.display(),
            crate::output_text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
}

fn snapshot_by(exec_ok: impl Fn(&[&str]) -> String) -> Snapshot {
    let json = |args: &[&str]| -> Value {
        let out = exec_ok(args);
        if out.trim().is_empty() {
            return Value::Array(Vec::new());
        }
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("parsing output of {args:?}: {e}\n{out}"))
    };
    let sorted_entries = |v: Value| -> Vec<String> {
        let mut out: Vec<String> = as_vec(v)
            .into_iter()
            .map(|mut e| {
                strip_volatile(&mut e);
                e.to_string()
            })
            .collect();
        out.sort();
        out
    };

    let links_json = json(&["ip", "-j", "addr", "show"]);
    let mut links = Vec::new();
    let mut addrs = Vec::new();
    for link in as_vec(links_json) {
        let Some(ifname) = link.get("ifname").and_then(Value::as_str) else {
            continue;
        };
        links.push(ifname.to_string());
        for a in link
            .get("addr_info")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if a["local"].as_str().is_some_and(|l| l.starts_with("fe80:")) {
                continue;
            }
            addrs.push(format!(
                "{ifname} {} {}/{}",
                a["family"].as_str().unwrap_or("?"),
                a["local"].as_str().unwrap_or("?"),
                a["prefixlen"]
            ));
        }
    }
    links.sort();
    addrs.sort();

    Snapshot {
        links,
        addrs,
        routes4: sorted_entries(json(&[
            "ip", "-4", "-j", "-d", "route", "show", "table", "all",
        ])),
        routes6: sorted_entries(json(&[
            "ip", "-6", "-j", "-d", "route", "show", "table", "all",
        ]))
        .into_iter()
        .filter(|r| !is_kernel_link_local(r))
        .collect(),
        rules4: sorted_entries(json(&["ip", "-d", "-j", "rule", "show"])),
        rules6: sorted_entries(json(&["ip", "-6", "-d", "-j", "rule", "show"])),
        nft: nft_entries(json(&["nft", "-j", "list", "ruleset"])),
    }
}

/// IPv6 link-local addresses (and their local-table routes) come and go with
/// carrier and DAD timing, on the kernel's own schedule; podgate never
/// manages them, so they are not part of a before/after comparison.
fn is_kernel_link_local(route: &str) -> bool {
    route.contains(r#""dst":"fe80:"#) && route.contains(r#""protocol":"kernel""#)
}

fn as_vec(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a,
        Value::Null => Vec::new(),
        other => vec![other],
    }
}

/// Keys whose values change without any configuration change.
const VOLATILE_KEYS: &[&str] = &[
    "expires", "stats", "stats64", "handle", "packets", "bytes", "age", "used",
];

/// Route/nexthop flags that follow carrier or hardware state, not config
/// (e.g. a bridge's routes are `linkdown` a moment after its last port goes).
const VOLATILE_FLAGS: &[&str] = &["linkdown", "dead", "offload", "trap", "offload_failed"];

fn strip_volatile(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|k, _| !VOLATILE_KEYS.contains(&k.as_str()));
            if let Some(Value::Array(flags)) = map.get_mut("flags") {
                flags.retain(|f| !f.as_str().is_some_and(|f| VOLATILE_FLAGS.contains(&f)));
            }
            for val in map.values_mut() {
                strip_volatile(val);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_volatile),
        _ => {}
    }
}

/// Canonical nft entries: drop `metainfo`, strip volatile fields, then a
/// stable sort by (family, table, kind, chain/name) so table/chain creation
/// order doesn't matter but rule order within a chain does.
fn nft_entries(ruleset: Value) -> Vec<String> {
    let entries = match ruleset {
        Value::Object(mut m) => as_vec(m.remove("nftables").unwrap_or(Value::Null)),
        other => as_vec(other),
    };
    let mut keyed: Vec<((String, String, u8, String), String)> = Vec::new();
    for entry in entries {
        let Value::Object(map) = entry else {
            continue;
        };
        for (kind, mut body) in map {
            if kind == "metainfo" {
                continue;
            }
            strip_volatile(&mut body);
            let s = |k: &str| {
                body.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let (table, rank, sub) = match kind.as_str() {
                "table" => (s("name"), 0, String::new()),
                "chain" => (s("table"), 2, s("name")),
                "rule" => (s("table"), 3, s("chain")),
                "set" | "map" | "element" => (s("table"), 1, s("name")),
                _ => (s("table"), 4, s("name")),
            };
            let key = (s("family"), table, rank, sub);
            let mut obj = serde_json::Map::new();
            obj.insert(kind, body);
            keyed.push((key, Value::Object(obj).to_string()));
        }
    }
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    keyed.into_iter().map(|(_, s)| s).collect()
}

/// Files (not directories) under the node's `state/`, as sorted paths
/// relative to it.
pub fn state_files(node: &TestNode) -> Vec<String> {
    state_files_in(&node.state_dir())
}

/// Files under a podgate state dir (`stateDir`), sorted, relative to it,
/// without the store's permanent lock file and with the claims index
/// (`claims.v2`) as its entries of records that are not there, one
/// `claims.v2/<entry>` each, as if it were a directory (an entry of a
/// record that is there is part of that record's state; one whose record
/// is gone leaked).
pub fn state_files_in(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    walk(root, root, &mut out);
    // The store's lock file is permanent by design; records are what leak.
    out.retain(|f| f != ".lock" && f != CLAIMS);
    let records: Vec<String> = out.iter().filter(|f| !f.contains('/')).cloned().collect();
    out.extend(
        claims_entries(root)
            .into_iter()
            .filter(|e| !records.iter().any(|r| e.ends_with(&format!("={r}"))))
            .map(|e| format!("{CLAIMS}/{e}")),
    );
    out.sort();
    out
}

/// The claims index's file in a state dir.
const CLAIMS: &str = "claims.v2";

/// The entries of a state dir's claims index (its lines after the header;
/// none without the file).
fn claims_entries(dir: &Path) -> std::collections::BTreeSet<String> {
    let Ok(text) = std::fs::read_to_string(dir.join(CLAIMS)) else {
        return Default::default();
    };
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("podgate claims v2"),
        "{}: the claims index's header",
        dir.display()
    );
    lines.map(String::from).collect()
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => walk(root, &path, out),
            Ok(_) => {
                if let Ok(rel) = path.strip_prefix(root) {
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
            Err(_) => {}
        }
    }
}

/// The claims index (`claims.v2` in the state dir) holds exactly the
/// claims the records describe: every record is known to it (`c=`) and
/// each of its pools, its route table and its strict slot names it; the
/// last release's `claims.v1/` is gone. Entries whose record is gone are
/// allowed (a kill between the index and the record): the router does
/// not trust them.
pub fn claims_index_matches_records(dir: &Path, what: &str) {
    let mut want = std::collections::BTreeSet::new();
    let mut records = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(".json") {
            continue;
        }
        let v: Value = serde_json::from_slice(&std::fs::read(dir.join(&name)).unwrap()).unwrap();
        for r in v
            .get("nodeRoutes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let dst = r.get("dst").and_then(Value::as_str).unwrap();
            want.insert(format!("p={}={name}", dst.replace('/', "_")));
        }
        let routing = v.get("routing");
        if let Some(t) = routing.and_then(|r| r.get("table")).and_then(Value::as_u64) {
            want.insert(format!("t={t}={name}"));
        }
        if routing.and_then(|r| r.get("mode")).and_then(Value::as_str) == Some("strict") {
            want.insert(format!("s={name}"));
        }
        records.push(name);
    }
    let entries = claims_entries(dir);
    assert!(
        !dir.join("claims.v1").exists(),
        "{what}: the last release's claims.v1/ is left"
    );
    let got: std::collections::BTreeSet<String> = entries
        .iter()
        .filter(|e| records.iter().any(|r| e.ends_with(&format!("={r}"))))
        .filter(|e| ["p=", "t=", "s="].iter().any(|k| e.starts_with(k)))
        .cloned()
        .collect();
    assert_eq!(got, want, "{what}: claims index (all entries: {entries:?})");
    for r in &records {
        assert!(
            entries.contains(&format!("c={r}")),
            "{what}: record {r} not known (c=) to the index: {entries:?}"
        );
    }
}
