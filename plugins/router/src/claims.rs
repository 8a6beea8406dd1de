//! `claims.v1/` in the state dir: which record claims which return-route
//! pool, route table and strict slot, so that an ADD checks its claims
//! against the records that hold a claim of that kind instead of reading
//! every record.
//!
//! The index is names only (empty files, no content to tear):
//! `p=<pool>=<record file>` says the record claims the pool (`/` written
//! as `_`), `t=<table>=<record file>` that it holds a route table (routing
//! boundary), `s=<record file>` that it is a strict pod; `k=<record file>`
//! says the index holds that record's pools, `c=<record file>` that it
//! holds all of its claims (pools, table, strict slot). The previous
//! release knows only `p=` and `k=` and skips names it does not parse.
//! All are written under the node-wide lock before the record
//! (write-ahead, the `k=` and `c=` markers last) and removed after it, so
//! a kill at any step leaves at worst an entry whose record is gone or no
//! longer holds that claim: an entry is trusted only when its record
//! exists and holds that claim.
//! A record without its `c=` entry (written before the index existed or
//! by the previous release, which writes only `p=` and `k=`, e.g. after a
//! rollback, or by another writer) is read and indexed by the next ADD
//! that checks claims: an upgrade rebuilds the index from the records
//! once, under the lock. The version is in the directory's name; releases
//! that do not know it ignore it (records are the `*.json` files at the
//! top of the state dir).

use crate::record::{self, Record};
use ipnet::IpNet;
use podgate_kit::state::{Key, Names, StateStore};
use podgate_kit::Error;
use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// The index's directory in the state dir; the version is part of the name.
pub const DIR: &str = "claims.v1";
const COMPLETE: &str = "c=";
const KNOWN: &str = "k=";
const POOL: &str = "p=";
const TABLE: &str = "t=";
const STRICT: &str = "s=";

fn dir(store: &StateStore) -> PathBuf {
    store.dir().join(DIR)
}

fn err(path: &Path, op: &'static str, source: std::io::Error) -> Error {
    Error::State {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// One name of the index, parsed. The order is the removal order,
/// reversed: claims first, then the markers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Entry {
    /// The index holds all claims of this record (by its file name).
    Complete(String),
    /// The index holds the pools of this record (what the previous
    /// release reads).
    Known(String),
    Pool(IpNet, String),
    Table(u32, String),
    Strict(String),
}

impl Entry {
    fn parse(name: &str) -> Option<Entry> {
        if let Some(rec) = name.strip_prefix(COMPLETE) {
            return Some(Entry::Complete(rec.to_string()));
        }
        if let Some(rec) = name.strip_prefix(KNOWN) {
            return Some(Entry::Known(rec.to_string()));
        }
        if let Some(rec) = name.strip_prefix(STRICT) {
            return Some(Entry::Strict(rec.to_string()));
        }
        if let Some((table, rec)) = name.strip_prefix(TABLE).and_then(|n| n.split_once('=')) {
            return Some(Entry::Table(table.parse().ok()?, rec.to_string()));
        }
        let (pool, rec) = name.strip_prefix(POOL)?.split_once('=')?;
        let pool = pool.replace('_', "/").parse().ok()?;
        Some(Entry::Pool(pool, rec.to_string()))
    }

    fn name(&self) -> String {
        match self {
            Entry::Complete(r) => format!("{COMPLETE}{r}"),
            Entry::Known(r) => format!("{KNOWN}{r}"),
            Entry::Pool(p, r) => format!("{POOL}{}={r}", p.to_string().replace('/', "_")),
            Entry::Table(t, r) => format!("{TABLE}{t}={r}"),
            Entry::Strict(r) => format!("{STRICT}{r}"),
        }
    }

    fn record_file(&self) -> &str {
        match self {
            Entry::Complete(r)
            | Entry::Known(r)
            | Entry::Pool(_, r)
            | Entry::Table(_, r)
            | Entry::Strict(r) => r,
        }
    }

    /// The claim this entry names (None: a marker).
    fn claimed(&self) -> Option<ClaimedField> {
        match self {
            Entry::Pool(p, _) => Some(ClaimedField::Pool(*p)),
            Entry::Table(t, _) => Some(ClaimedField::Table(*t)),
            Entry::Strict(_) => Some(ClaimedField::Strict(true)),
            Entry::Complete(_) | Entry::Known(_) => None,
        }
    }

    /// The claim this entry names, if it is one: does `rec` hold it?
    /// Markers hold whenever their record exists.
    fn holds(&self, rec: &Record) -> bool {
        let c = rec.claim();
        match self {
            Entry::Complete(_) | Entry::Known(_) => true,
            Entry::Pool(p, _) => c.pools.contains(p),
            Entry::Table(t, _) => c.table == Some(*t),
            Entry::Strict(_) => c.strict,
        }
    }
}

/// Every entry the index holds for `rec`, claims first, markers last
/// (the order they are written in).
fn entries_of(rec: &Record) -> Vec<Entry> {
    let file = rec.key.file_name();
    let c = rec.claim();
    let mut out: Vec<Entry> = c
        .pools
        .iter()
        .map(|p| Entry::Pool(*p, file.clone()))
        .collect();
    out.extend(c.table.map(|t| Entry::Table(t, file.clone())));
    if c.strict {
        out.push(Entry::Strict(file.clone()));
    }
    out.push(Entry::Known(file.clone()));
    out.push(Entry::Complete(file));
    out
}

/// Which claims a request checks: the records holding any of them are
/// the ones it reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Wanted<'a> {
    /// Pools overlapping one of these.
    pub pools: &'a [IpNet],
    /// Every route table (a routing boundary picks or checks its own).
    pub tables: bool,
    /// Every strict slot (strict counting, node-wide strict settings).
    pub strict: bool,
}

impl Wanted<'_> {
    fn covers(&self, e: &Entry) -> bool {
        match e {
            Entry::Pool(p, _) => self.pools.iter().any(|q| crate::model::overlaps(p, q)),
            Entry::Table(..) => self.tables,
            Entry::Strict(_) => self.strict,
            Entry::Complete(_) | Entry::Known(_) => false,
        }
    }
}

/// What [`Index::catch_up`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaughtUp {
    /// Records indexed now.
    pub added: usize,
    /// Records that could not be read (unparseable, a newer format): their
    /// claims are not known either way.
    pub unknown: usize,
}

/// The index as one listing read it.
#[derive(Debug, Default)]
pub struct Index {
    entries: Vec<Entry>,
}

impl Index {
    /// List the index (empty if it does not exist yet).
    pub fn load(store: &StateStore) -> Result<Index, Error> {
        let d = dir(store);
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Index::default()),
            Err(e) => return Err(err(&d, "list", e)),
        };
        let mut entries = Vec::new();
        for e in rd {
            let name = e.map_err(|e| err(&d, "list", e))?.file_name();
            entries.extend(Entry::parse(&name.to_string_lossy()));
        }
        Ok(Index { entries })
    }

    /// Index the records in `names` (a listing of the state dir) whose
    /// claims the index does not hold completely yet; a record that cannot
    /// be read stays unknown (its claims are not known either way).
    pub fn catch_up(&mut self, store: &StateStore, names: &Names) -> Result<CaughtUp, Error> {
        let complete: BTreeSet<String> = self
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::Complete(r) => Some(r.clone()),
                _ => None,
            })
            .collect();
        let mut out = CaughtUp::default();
        for raw in names.iter() {
            let name = raw.to_string_lossy();
            if name.starts_with('.') || complete.contains(name.as_ref()) {
                continue;
            }
            let Some(key) = Key::from_file_name(&name) else {
                continue;
            };
            match record::read(store, &key) {
                Ok(Some(rec)) => {
                    claim(store, &rec)?;
                    self.entries.extend(entries_of(&rec));
                    out.added += 1;
                }
                Ok(None) => {}
                Err(_) => out.unknown += 1,
            }
        }
        Ok(out)
    }

    /// The records other than `except`'s that hold a claim `want` covers,
    /// each once: only entries whose record exists and still holds that
    /// claim count. Also returns how many named records exist but could
    /// not be read (what they hold is not known either way).
    pub fn records(&self, store: &StateStore, want: &Wanted, except: &Key) -> (Vec<Record>, usize) {
        let own = except.file_name();
        let mut named: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.record_file() != own && want.covers(e))
            .collect();
        named.sort_unstable_by(|a, b| a.record_file().cmp(b.record_file()));
        let mut out: Vec<Record> = Vec::new();
        let mut unreadable = 0;
        let mut read: Option<(&str, Option<Record>)> = None;
        for e in named {
            let file = e.record_file();
            if out.iter().any(|r| r.key.file_name() == file) {
                continue;
            }
            if read.as_ref().is_none_or(|(f, _)| *f != file) {
                let rec = match Key::from_file_name(file).map(|key| record::read(store, &key)) {
                    Some(Ok(rec)) => rec,
                    Some(Err(_)) => {
                        unreadable += 1;
                        None
                    }
                    None => None,
                };
                read = Some((file, rec));
            }
            if let Some((_, Some(rec))) = &read {
                if e.holds(rec) {
                    out.push(rec.clone());
                }
            }
        }
        (out, unreadable)
    }
}

fn create(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map(drop)
}

/// Write-ahead, under the node-wide lock, before `rec` is written: its
/// claims, then that the index holds them.
pub fn claim(store: &StateStore, rec: &Record) -> Result<(), Error> {
    let d = dir(store);
    for e in entries_of(rec) {
        let path = d.join(e.name());
        match create(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                match std::fs::create_dir(&d) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(err(&d, "create", e)),
                }
                create(&path).map_err(|e| err(&path, "create", e))?;
            }
            Err(e) => return Err(err(&path, "create", e)),
        }
    }
    Ok(())
}

/// Remove the index's entries for `key` (its claims first, then the
/// markers). Called after its record is removed.
pub fn release(store: &StateStore, key: &Key) -> Result<(), Error> {
    let file = key.file_name();
    remove_where(store, |e| e.record_file() == file)
}

/// Remove `key`'s record, then its index entries.
pub fn remove(store: &StateStore, key: &Key) -> Result<bool, Error> {
    let removed = store.remove(key)?;
    release(store, key)?;
    Ok(removed)
}

/// Remove the entries of records not in `names` (a listing of the state
/// dir taken under the node-wide lock): what a killed ADD or DEL left.
pub fn prune(store: &StateStore, names: &Names) -> Result<(), Error> {
    remove_where(store, |e| !names.contains(e.record_file()))
}

/// Make the index hold exactly what `records` (every readable record,
/// read under the node-wide lock by GC or the node agent's sweep) claim:
/// entries a record does not hold are removed, missing ones written. This
/// repairs what an index-unaware writer did to a record the index already
/// knew (the previous release re-adding an attachment under the same name
/// after a rollback, with other claims). Returns how many entries changed.
pub fn reconcile(store: &StateStore, records: &[Record]) -> Result<usize, Error> {
    let present: BTreeSet<Entry> = Index::load(store)?.entries.into_iter().collect();
    let by_file: std::collections::BTreeMap<String, &Record> =
        records.iter().map(|r| (r.key.file_name(), r)).collect();
    let mut changed = 0;
    for e in &present {
        if by_file.get(e.record_file()).is_some_and(|r| !e.holds(r)) {
            remove_entry(store, e)?;
            changed += 1;
        }
    }
    for r in records {
        let missing = entries_of(r)
            .iter()
            .filter(|e| !present.contains(e))
            .count();
        if missing > 0 {
            claim(store, r)?;
            changed += missing;
        }
    }
    Ok(changed)
}

fn remove_entry(store: &StateStore, e: &Entry) -> Result<(), Error> {
    let path = dir(store).join(e.name());
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(err(&path, "remove", e)),
    }
}

fn remove_where(store: &StateStore, gone: impl Fn(&Entry) -> bool) -> Result<(), Error> {
    let mut doomed: Vec<Entry> = Index::load(store)?
        .entries
        .into_iter()
        .filter(|e| gone(e))
        .collect();
    // Claims before the markers (markers sort first: reverse).
    doomed.sort_by(|a, b| b.cmp(a));
    for e in &doomed {
        remove_entry(store, e)?;
    }
    Ok(())
}

/// One claim entry of the index, for `podgate inspect`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexClaim {
    /// The claim: `"pool": <pool>`, `"table": <id>` or `"strict": true`.
    #[serde(flatten)]
    pub claim: ClaimedField,
    /// The record it names (None: not a record's file name).
    pub owner: Option<Key>,
    /// Its record exists and holds that claim.
    pub trusted: bool,
}

/// [`Claimed`] as inspect's JSON shows it: a pool entry keeps the shape
/// the previous release showed (`"pool": "10.9.0.0/24"`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ClaimedField {
    Pool(IpNet),
    Table(u32),
    Strict(bool),
}

impl std::fmt::Display for ClaimedField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClaimedField::Pool(p) => write!(f, "pool {p}"),
            ClaimedField::Table(t) => write!(f, "table {t}"),
            ClaimedField::Strict(_) => write!(f, "strict slot"),
        }
    }
}

/// Every claim entry of the index, judged (reads each named record).
pub fn index_claims(store: &StateStore) -> Result<Vec<IndexClaim>, Error> {
    let mut out = Vec::new();
    for e in Index::load(store)?.entries {
        let Some(claim) = e.claimed() else { continue };
        let owner = Key::from_file_name(e.record_file());
        let trusted = owner
            .as_ref()
            .is_some_and(|k| matches!(record::read(store, k), Ok(Some(rec)) if e.holds(&rec)));
        out.push(IndexClaim {
            claim,
            owner,
            trusted,
        });
    }
    out.sort_by(|a, b| (&a.claim, &a.owner).cmp(&(&b.claim, &b.owner)));
    Ok(out)
}

/// The index's trusted claims: (claim, record) pairs whose record exists
/// and holds that claim.
pub fn trusted(store: &StateStore) -> Result<BTreeSet<(ClaimedField, Key)>, Error> {
    Ok(index_claims(store)?
        .into_iter()
        .filter(|c| c.trusted)
        .filter_map(|c| Some((c.claim, c.owner?)))
        .collect())
}

/// The claims the records themselves describe (what the index must hold).
pub fn from_records(records: &[Record]) -> BTreeSet<(ClaimedField, Key)> {
    records
        .iter()
        .flat_map(|r| {
            entries_of(r)
                .into_iter()
                .filter_map(|e| Some((e.claimed()?, r.key.clone())))
        })
        .collect()
}

#[cfg(test)]
mod tests;
