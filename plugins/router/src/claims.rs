//! `claims.v2` in the state dir: which record claims which return-route
//! pool, route table and strict slot, so that an ADD checks its claims
//! against the records that hold a claim of that kind instead of reading
//! every record.
//!
//! One text file: a first line naming the format (`podgate claims v2`),
//! then one entry a line: `p=<pool>=<record file>` says the record claims
//! the pool (`/` written as `_`), `t=<table>=<record file>` that it holds
//! a route table (routing boundary), `s=<record file>` that it is a strict
//! pod, `c=<record file>` that the index holds all of its claims (pools,
//! table, strict slot). A line it does not parse is skipped (a later
//! kind); a file with another first line, or not text, is an empty index
//! (every record is then read and indexed again: fail safe).
//!
//! The file is rewritten whole under the node-wide lock (a temp file, then
//! exchanged with it: readers see the old or the new index, never a torn
//! one): a record's entries before the record is written (write-ahead),
//! removed after it is removed, so a kill at any step leaves at worst an
//! entry whose record is gone or no longer holds that claim: an entry is
//! trusted only when its record exists and holds that claim.
//! A record without its `c=` entry (written before the index existed, by
//! an earlier release after a rollback, by another writer, or by an ADD
//! that checks no claims, whose record holds none) is read and indexed by
//! the next ADD that checks claims: an upgrade rebuilds the index from the
//! records once, under the lock.
//!
//! The last release keeps its index as names in `claims.v1/` and rebuilds
//! it from the records when that directory is absent; releases before it
//! keep none. This release ignores `claims.v1/`'s names and removes the
//! directory once `claims.v2` is written; finding it again means the last
//! release ran since (a rollback) and may have changed records this index
//! names, so the ADD that finds it trusts no entry, rebuilds the index
//! from the records, then removes it. Neither name is a record (`*.json`
//! at the top of the state dir) to any release.

use crate::record::{self, Record};
use ipnet::IpNet;
use podgate_kit::fs as kfs;
use podgate_kit::state::{Key, Names, StateStore};
use podgate_kit::Error;
use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::ops::Range;
use std::path::Path;

/// The index's file in the state dir; the version is part of the name.
pub const FILE: &str = "claims.v2";
/// The last release's index (a directory of names), removed once
/// [`FILE`] is written.
pub const V1_DIR: &str = "claims.v1";
/// The first line of [`FILE`].
const HEADER: &str = "podgate claims v2";
/// Where [`FILE`] is written before the rename: a dot name (no listing of
/// records reads it) of the state store's temp files, so that the sweep of
/// orphaned temp files under the node-wide lock (ADD, DEL, GC) removes one
/// a killed writer left.
const TMP: &str = ".tmp-claims.v2";
/// Largest index read (about 200,000 entries); a bigger file is not one
/// podgate wrote.
const MAX_FILE: u64 = 64 << 20;
const COMPLETE: &str = "c=";
const POOL: &str = "p=";
const TABLE: &str = "t=";
const STRICT: &str = "s=";

fn err(path: &Path, op: &'static str, source: std::io::Error) -> Error {
    Error::State {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// What one line of the index says, without the record it names: ordered
/// as the lines are written (markers, pools, tables, strict slots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// The index holds all claims of the record.
    Complete,
    Pool(IpNet),
    Table(u32),
    Strict,
}

impl Kind {
    /// The kind a line says, and where in the line the record's file name
    /// starts; None: not a line of this format (a later kind).
    fn parse(line: &str) -> Option<(Kind, usize)> {
        if line.starts_with(COMPLETE) {
            return Some((Kind::Complete, COMPLETE.len()));
        }
        if line.starts_with(STRICT) {
            return Some((Kind::Strict, STRICT.len()));
        }
        if let Some((table, _)) = line.strip_prefix(TABLE).and_then(|n| n.split_once('=')) {
            return Some((
                Kind::Table(table.parse().ok()?),
                TABLE.len() + table.len() + 1,
            ));
        }
        let (pool, _) = line.strip_prefix(POOL)?.split_once('=')?;
        let (addr, len) = pool.split_once('_')?;
        let net = IpNet::new(addr.parse().ok()?, len.parse().ok()?).ok()?;
        Some((Kind::Pool(net), POOL.len() + pool.len() + 1))
    }

    /// The line naming `file` (without its newline).
    fn line(self, file: &str) -> String {
        match self {
            Kind::Complete => format!("{COMPLETE}{file}"),
            Kind::Pool(p) => format!("{POOL}{}_{}={file}", p.addr(), p.prefix_len()),
            Kind::Table(t) => format!("{TABLE}{t}={file}"),
            Kind::Strict => format!("{STRICT}{file}"),
        }
    }

    /// The claim this kind names (None: the marker).
    fn claimed(self) -> Option<ClaimedField> {
        match self {
            Kind::Pool(p) => Some(ClaimedField::Pool(p)),
            Kind::Table(t) => Some(ClaimedField::Table(t)),
            Kind::Strict => Some(ClaimedField::Strict(true)),
            Kind::Complete => None,
        }
    }

    /// Does `rec` hold this claim? The marker holds whenever its record
    /// exists.
    fn holds(self, rec: &Record) -> bool {
        let c = rec.claim();
        match self {
            Kind::Complete => true,
            Kind::Pool(p) => c.pools.contains(&p),
            Kind::Table(t) => c.table == Some(t),
            Kind::Strict => c.strict,
        }
    }
}

/// One entry of the index: its kind, and its line and record file name as
/// byte ranges of [`Index::text`] (the file's text as read, then the lines
/// this request added): parsing the index allocates nothing per entry, and
/// writing it copies the lines instead of formatting them again.
#[derive(Debug, Clone)]
struct Entry {
    kind: Kind,
    line: Range<usize>,
    /// Where the record's file name starts (it ends with the line).
    file: usize,
}

impl Entry {
    /// The record file name it names, in `text` (its index's).
    fn file<'a>(&self, text: &'a str) -> &'a str {
        &text[self.file..self.line.end]
    }

    /// Its sort key: its kind, then its record's file name.
    fn key<'a>(&self, text: &'a str) -> (Kind, &'a str) {
        (self.kind, self.file(text))
    }
}

/// Every entry the index holds for `rec`, as kinds: its claims and the
/// marker.
fn kinds_of(rec: &Record) -> Vec<Kind> {
    let c = rec.claim();
    let mut out: Vec<Kind> = c.pools.iter().map(|p| Kind::Pool(*p)).collect();
    out.extend(c.table.map(Kind::Table));
    if c.strict {
        out.push(Kind::Strict);
    }
    out.push(Kind::Complete);
    out
}

/// The byte range of each line of `text` after its first (the header),
/// as `str::lines` splits them (`\n`, a `\r` before it dropped).
fn line_ranges(text: &str) -> impl Iterator<Item = Range<usize>> + '_ {
    let base = text.as_ptr() as usize;
    text.lines().skip(1).map(move |l| {
        let start = l.as_ptr() as usize - base;
        start..start + l.len()
    })
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
    fn covers(&self, k: Kind) -> bool {
        match k {
            Kind::Pool(p) => self.pools.iter().any(|q| crate::model::overlaps(&p, q)),
            Kind::Table(_) => self.tables,
            Kind::Strict => self.strict,
            Kind::Complete => false,
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

/// The index as read from its file, and what this request changed.
#[derive(Debug, Default)]
pub struct Index {
    /// The file's text, then each line this request added (a line no
    /// entry refers to any more stays here unused until the request ends).
    text: String,
    /// Sorted by kind, then record file name, each once: the markers
    /// first, so that "is this record indexed" is a binary search.
    entries: Vec<Entry>,
    /// Entries differ from the file's.
    changed: bool,
    /// `claims.v1/` was found: removed after the next save.
    v1: bool,
}

impl Index {
    /// Read the index (empty if it does not exist yet).
    pub fn load(store: &StateStore) -> Result<Index, Error> {
        Ok(store
            .read_named(FILE, MAX_FILE)?
            .map(Index::parse)
            .unwrap_or_default())
    }

    /// The entries of an index file's text; another first line or bytes
    /// that are not text: none. A line that does not parse is skipped (a
    /// later kind) and not written back; a line is otherwise kept as it
    /// was read. Written by this release the lines are sorted and unique
    /// already; otherwise they are sorted and deduplicated here.
    fn parse(bytes: Vec<u8>) -> Index {
        let Ok(text) = String::from_utf8(bytes) else {
            return Index::default();
        };
        if text.lines().next() != Some(HEADER) {
            return Index::default();
        }
        let mut entries: Vec<Entry> = Vec::new();
        let mut sorted = true;
        for line in line_ranges(&text) {
            let Some((kind, at)) = Kind::parse(&text[line.clone()]) else {
                continue;
            };
            let e = Entry {
                kind,
                file: line.start + at,
                line,
            };
            if let Some(last) = entries.last() {
                sorted &= last.key(&text) < e.key(&text);
            }
            entries.push(e);
        }
        if !sorted {
            entries.sort_by(|a, b| a.key(&text).cmp(&b.key(&text)));
            entries.dedup_by(|a, b| a.key(&text) == b.key(&text));
        }
        Index {
            text,
            entries,
            ..Index::default()
        }
    }

    /// Is `file` a record whose claims the index holds completely?
    fn is_complete(&self, file: &str) -> bool {
        let markers = self.entries.partition_point(|e| e.kind == Kind::Complete);
        self.entries
            .get(..markers)
            .is_some_and(|m| m.binary_search_by(|e| e.file(&self.text).cmp(file)).is_ok())
    }

    /// Index the records in `names` (a listing of the state dir, taken
    /// under the node-wide lock) whose claims the index does not hold
    /// completely yet, and save it if that changed it; a record that
    /// cannot be read stays unknown (its claims are not known either
    /// way). With `claims.v1/` among `names` the last release ran since
    /// the index was written: no entry is trusted, every record is read,
    /// and `claims.v1/` is removed once the index is saved.
    pub fn catch_up(&mut self, store: &StateStore, names: &Names) -> Result<CaughtUp, Error> {
        if names.contains(V1_DIR) {
            self.entries.clear();
            self.changed = true;
            self.v1 = true;
        }
        let unindexed: Vec<Key> = names
            .iter()
            .filter_map(|raw| raw.to_str())
            .filter(|name| !name.starts_with('.') && !self.is_complete(name))
            .filter_map(Key::from_file_name)
            .collect();
        let mut out = CaughtUp::default();
        for key in unindexed {
            match record::read(store, &key) {
                Ok(Some(rec)) => {
                    self.insert(&rec);
                    out.added += 1;
                }
                Ok(None) => {}
                Err(_) => out.unknown += 1,
            }
        }
        self.save(store)?;
        Ok(out)
    }

    /// Add `rec`'s entries (in memory).
    fn insert(&mut self, rec: &Record) {
        let file = rec.key.file_name();
        for kind in kinds_of(rec) {
            let at = self
                .entries
                .binary_search_by(|e| e.key(&self.text).cmp(&(kind, file.as_str())));
            if let Err(at) = at {
                let line = kind.line(&file);
                let start = self.text.len();
                self.text.push_str(&line);
                let end = self.text.len();
                let e = Entry {
                    kind,
                    line: start..end,
                    file: end - file.len(),
                };
                self.entries.insert(at, e);
                self.changed = true;
            }
        }
    }

    /// Drop the entries `gone` says of (kind, record file name), in memory.
    fn drop_where(&mut self, gone: impl Fn(Kind, &str) -> bool) -> usize {
        let before = self.entries.len();
        let text = &self.text;
        self.entries.retain(|e| !gone(e.kind, e.file(text)));
        let dropped = before - self.entries.len();
        self.changed |= dropped > 0;
        dropped
    }

    /// Write the index if this request changed it (the whole file, exchanged
    /// with the old one), then remove `claims.v1/` if it was found.
    pub fn save(&mut self, store: &StateStore) -> Result<(), Error> {
        if self.changed {
            let lines: usize = self.entries.iter().map(|e| e.line.len() + 1).sum();
            let mut body = String::with_capacity(HEADER.len() + 1 + lines);
            body.push_str(HEADER);
            body.push('\n');
            for e in &self.entries {
                body.push_str(&self.text[e.line.clone()]);
                body.push('\n');
            }
            // No fsync, as the state store's records; an exchange, not a
            // rename over it (ext4 would write the data out first): what a
            // power cut leaves is rebuilt from the records (per boot anyway).
            kfs::swap_write(store.handle(), FILE, TMP, body.as_bytes(), 0o600)?;
            self.changed = false;
        }
        if self.v1 {
            remove_v1(store)?;
            self.v1 = false;
        }
        Ok(())
    }

    /// Write-ahead, under the node-wide lock, before `rec` is written: its
    /// claims and that the index holds them, saved.
    pub fn claim(&mut self, store: &StateStore, rec: &Record) -> Result<(), Error> {
        self.insert(rec);
        self.save(store)
    }

    /// The records other than `except`'s that hold a claim `want` covers,
    /// each once: only entries whose record exists and still holds that
    /// claim count. Also returns how many named records exist but could
    /// not be read (what they hold is not known either way).
    pub fn records(&self, store: &StateStore, want: &Wanted, except: &Key) -> (Vec<Record>, usize) {
        let own = except.file_name();
        let mut named: Vec<(Kind, &str)> = self
            .entries
            .iter()
            .map(|e| e.key(&self.text))
            .filter(|(kind, file)| *file != own && want.covers(*kind))
            .collect();
        named.sort_unstable_by(|a, b| a.1.cmp(b.1));
        let mut out: Vec<Record> = Vec::new();
        let mut unreadable = 0;
        let mut read: Option<(&str, Option<Record>)> = None;
        for (kind, file) in named {
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
                if kind.holds(rec) {
                    out.push(rec.clone());
                }
            }
        }
        (out, unreadable)
    }
}

/// Remove the last release's index: its markers first (a kill meanwhile
/// must not leave a `k=` marker whose pools are gone: the last release
/// would trust it), then the rest with the directory.
fn remove_v1(store: &StateStore) -> Result<(), Error> {
    let Some(v1) = store.sub(V1_DIR)? else {
        return Ok(());
    };
    let dir = v1.handle();
    let names = dir.names().map_err(|e| err(dir.path(), "list", e))?;
    for name in names {
        let n = name.to_string_lossy();
        if !(n.starts_with("k=") || n.starts_with(COMPLETE)) {
            continue;
        }
        match dir.remove_file(&name) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(err(&dir.join(&name), "remove", e)),
        }
    }
    match store.handle().remove_all(V1_DIR) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(err(dir.path(), "remove", e)),
    }
}

/// [`Index::claim`] on the index as saved (load, add, save).
pub fn claim(store: &StateStore, rec: &Record) -> Result<(), Error> {
    Index::load(store)?.claim(store, rec)
}

/// Remove the index's entries for `key`. Called after its record is
/// removed.
pub fn release(store: &StateStore, key: &Key) -> Result<(), Error> {
    let file = key.file_name();
    remove_where(store, |_, f| f == file)
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
    let present: BTreeSet<String> = names
        .iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    remove_where(store, |_, f| !present.contains(f))
}

/// Make the index hold exactly what `records` (every readable record,
/// read under the node-wide lock by GC or the node agent's sweep) claim:
/// entries a record does not hold are removed, missing ones written. This
/// repairs what an index-unaware writer did to a record the index already
/// knew (an earlier release re-adding an attachment under the same name
/// after a rollback, with other claims). Returns how many entries changed.
pub fn reconcile(store: &StateStore, records: &[Record]) -> Result<usize, Error> {
    let mut index = Index::load(store)?;
    let by_file: BTreeMap<String, &Record> =
        records.iter().map(|r| (r.key.file_name(), r)).collect();
    let mut changed = index.drop_where(|kind, f| by_file.get(f).is_some_and(|r| !kind.holds(r)));
    let before = index.entries.len();
    for r in records {
        index.insert(r);
    }
    changed += index.entries.len() - before;
    index.save(store)?;
    Ok(changed)
}

fn remove_where(store: &StateStore, gone: impl Fn(Kind, &str) -> bool) -> Result<(), Error> {
    let mut index = Index::load(store)?;
    index.drop_where(gone);
    index.save(store)
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

/// What an index entry ([`IndexClaim`]) claims, as inspect's JSON shows it: a pool entry keeps the shape
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
    let index = Index::load(store)?;
    for e in &index.entries {
        let Some(claim) = e.kind.claimed() else {
            continue;
        };
        let owner = Key::from_file_name(e.file(&index.text));
        let trusted = owner
            .as_ref()
            .is_some_and(|k| matches!(record::read(store, k), Ok(Some(rec)) if e.kind.holds(&rec)));
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
            kinds_of(r)
                .into_iter()
                .filter_map(|k| Some((k.claimed()?, r.key.clone())))
        })
        .collect()
}

#[cfg(test)]
mod tests;
