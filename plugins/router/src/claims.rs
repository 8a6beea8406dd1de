//! `claims.v1/` in the state dir: which record claims which return-route
//! pool, so that an ADD checks a pool against the owners of the pools it
//! overlaps instead of reading every record.
//!
//! The index is names only (empty files, no content to tear):
//! `p=<pool>=<record file>` says the record claims the pool (`/` written
//! as `_`), `k=<record file>` says the index holds that record's claims.
//! Both are written under the node-wide lock before the record
//! (write-ahead) and removed after it, so a kill at any step leaves at
//! worst an entry whose record is gone or no longer claims the pool: an
//! entry is trusted only when its record exists and claims that pool.
//! A record without its `k=` entry (written before the index existed, by
//! an earlier release after a rollback, or by another writer) is read and
//! indexed by the next ADD that checks claims: an upgrade rebuilds the
//! index from the records once, under the lock. The version is in the
//! directory's name; releases that do not know it ignore it (records are
//! the `*.json` files at the top of the state dir).

use crate::record::{self, Record};
use ipnet::IpNet;
use podgate_kit::state::{Key, Names, StateStore};
use podgate_kit::Error;
use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// The index's directory in the state dir; the version is part of the name.
pub const DIR: &str = "claims.v1";
const KNOWN: &str = "k=";
const POOL: &str = "p=";

fn dir(store: &StateStore) -> PathBuf {
    store.dir().join(DIR)
}

fn pool_name(pool: &IpNet, record_file: &str) -> String {
    format!("{POOL}{}={record_file}", pool.to_string().replace('/', "_"))
}

fn err(path: &Path, op: &'static str, source: std::io::Error) -> Error {
    Error::State {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// One name of the index, parsed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Entry {
    /// The index holds the claims of this record (by its file name).
    Known(String),
    Pool(IpNet, String),
}

impl Entry {
    fn parse(name: &str) -> Option<Entry> {
        if let Some(rec) = name.strip_prefix(KNOWN) {
            return Some(Entry::Known(rec.to_string()));
        }
        let (pool, rec) = name.strip_prefix(POOL)?.split_once('=')?;
        let pool = pool.replace('_', "/").parse().ok()?;
        Some(Entry::Pool(pool, rec.to_string()))
    }

    fn record_file(&self) -> &str {
        match self {
            Entry::Known(r) | Entry::Pool(_, r) => r,
        }
    }
}

/// The index as one listing read it.
#[derive(Debug, Default)]
pub struct Index {
    entries: Vec<(String, Entry)>,
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
            let name = name.to_string_lossy().into_owned();
            if let Some(parsed) = Entry::parse(&name) {
                entries.push((name, parsed));
            }
        }
        Ok(Index { entries })
    }

    /// Index the records in `names` (a listing of the state dir) that the
    /// index does not know yet; a record that cannot be read stays unknown
    /// (its claims are not known either way). Returns how many were added.
    pub fn catch_up(&mut self, store: &StateStore, names: &Names) -> Result<usize, Error> {
        let known: BTreeSet<String> = self
            .entries
            .iter()
            .filter_map(|(_, e)| match e {
                Entry::Known(r) => Some(r.clone()),
                Entry::Pool(..) => None,
            })
            .collect();
        let mut added = 0;
        for raw in names.iter() {
            let name = raw.to_string_lossy();
            if name.starts_with('.') || known.contains(name.as_ref()) {
                continue;
            }
            let Some(key) = Key::from_file_name(&name) else {
                continue;
            };
            if let Ok(Some(rec)) = record::read(store, &key) {
                claim(store, &rec)?;
                self.entries
                    .push((format!("{KNOWN}{name}"), Entry::Known(name.into_owned())));
                added += 1;
            }
        }
        Ok(added)
    }

    /// The records other than `except`'s that claim a pool overlapping one
    /// of `pools`, each once: only entries whose record exists and still
    /// claims that pool count.
    pub fn owners(&self, store: &StateStore, pools: &[IpNet], except: &Key) -> Vec<Record> {
        let own = except.file_name();
        let mut files: Vec<(&IpNet, &str)> = self
            .entries
            .iter()
            .filter_map(|(_, e)| match e {
                Entry::Pool(p, r)
                    if r != &own && pools.iter().any(|q| crate::model::overlaps(p, q)) =>
                {
                    Some((p, r.as_str()))
                }
                _ => None,
            })
            .collect();
        files.sort_unstable_by(|a, b| a.1.cmp(b.1));
        let mut out: Vec<Record> = Vec::new();
        for (pool, file) in files {
            if out.iter().any(|r| r.key.file_name() == file) {
                continue;
            }
            let Some(key) = Key::from_file_name(file) else {
                continue;
            };
            if let Ok(Some(rec)) = record::read(store, &key) {
                if rec.claim().pools.contains(pool) {
                    out.push(rec);
                }
            }
        }
        out
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
/// pools, then that the index holds its claims.
pub fn claim(store: &StateStore, rec: &Record) -> Result<(), Error> {
    let d = dir(store);
    let file = rec.key.file_name();
    let mut names: Vec<String> = rec
        .claim()
        .pools
        .iter()
        .map(|p| pool_name(p, &file))
        .collect();
    names.push(format!("{KNOWN}{file}"));
    for name in names {
        let path = d.join(&name);
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

/// Remove the index's entries for `key` (its pools first, then that the
/// index knows it). Called after its record is removed.
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

fn remove_where(store: &StateStore, gone: impl Fn(&Entry) -> bool) -> Result<(), Error> {
    let d = dir(store);
    let mut doomed: Vec<(String, Entry)> = Index::load(store)?
        .entries
        .into_iter()
        .filter(|(_, e)| gone(e))
        .collect();
    // Pools before the `k=` entry (Known sorts first: reverse).
    doomed.sort_by(|a, b| b.1.cmp(&a.1));
    for (name, _) in doomed {
        let path = d.join(&name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(err(&path, "remove", e)),
        }
    }
    Ok(())
}

/// One pool entry of the index, for `podgate inspect`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolClaim {
    pub pool: IpNet,
    /// The record it names (None: not a record's file name).
    pub owner: Option<Key>,
    /// Its record exists and claims that pool.
    pub trusted: bool,
}

/// Every pool entry of the index, judged (reads each named record).
pub fn pool_claims(store: &StateStore) -> Result<Vec<PoolClaim>, Error> {
    let mut out = Vec::new();
    for (_, e) in Index::load(store)?.entries {
        let Entry::Pool(pool, file) = e else { continue };
        let owner = Key::from_file_name(&file);
        let trusted = owner.as_ref().is_some_and(|k| {
            matches!(record::read(store, k), Ok(Some(rec)) if rec.claim().pools.contains(&pool))
        });
        out.push(PoolClaim {
            pool,
            owner,
            trusted,
        });
    }
    out.sort_by(|a, b| (a.pool, &a.owner).cmp(&(b.pool, &b.owner)));
    Ok(out)
}

/// The index's trusted claims: (pool, record) pairs whose record exists and
/// claims that pool.
pub fn trusted(store: &StateStore) -> Result<BTreeSet<(IpNet, Key)>, Error> {
    Ok(pool_claims(store)?
        .into_iter()
        .filter(|c| c.trusted)
        .filter_map(|c| Some((c.pool, c.owner?)))
        .collect())
}

/// The claims the records themselves describe (what the index must hold).
pub fn from_records(records: &[Record]) -> BTreeSet<(IpNet, Key)> {
    records
        .iter()
        .flat_map(|r| r.claim().pools.into_iter().map(|p| (p, r.key.clone())))
        .collect()
}

#[cfg(test)]
mod tests;
