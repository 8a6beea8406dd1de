//! Host-side record of what podgate applied, one JSON file per attachment
//! (network, container ID, ifname), under a directory-wide lock and a
//! per-pod lock (see [`StateStore::lock_pod`]).
//!
//! DEL and GC read this record instead of guessing from the kernel: an IP can
//! be reused by the next pod, a record cannot.

//!
//! The directory is reached through a [`Dir`] handle: the state dir itself
//! must not be a symbolic link, and no name in it is followed (a container
//! of the DaemonSet can write it; see [`crate::dir`]).

use crate::dir::Dir;
use crate::error::{Error, Result};
use crate::fs::{self as kfs, LockFile, WriteMode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LOCK_FILE: &str = ".lock";
/// Pod locks: `.pod-<container ID>.lock`, next to the records (hidden
/// names: listings skip them).
const POD_LOCK_PREFIX: &str = ".pod-";
const LOCK_SUFFIX: &str = ".lock";
const SUFFIX: &str = ".json";
/// Bound on waiting for the lock: a wedged peer must not hang pod creation.
const LOCK_WAIT: Duration = Duration::from_secs(20);
/// Largest record read: records are a few KiB; a bigger file is not one
/// podgate wrote.
pub const MAX_RECORD: u64 = 1 << 20;

/// What [`StateStore::purge_unless_records`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purge {
    /// Nothing removed: this many attachment records are left.
    RecordsLeft(usize),
    /// No record was left: this many entries were removed; `foreign`, the
    /// names podgate did not make, were left alone.
    Emptied {
        removed: usize,
        foreign: Vec<String>,
    },
}

#[derive(Debug, Clone)]
pub struct StateStore {
    dir: Dir,
}

/// Held while reading-then-writing the store; released on drop.
/// `waited()` is how long `lock` waited for it (contention with other CNI
/// calls).
pub type StateLock = crate::fs::FileLock;

/// Identity of one attachment.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Key {
    pub network: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

impl Key {
    pub fn new(network: &str, container_id: &str, ifname: &str) -> Key {
        Key {
            network: network.into(),
            container_id: container_id.into(),
            ifname: ifname.into(),
        }
    }

    /// A file name that cannot escape the directory: each part is escaped
    /// byte-wise (`%XX`) outside `[A-Za-z0-9_.-]`, and parts are joined by `+`.
    pub fn file_name(&self) -> String {
        format!(
            "{}+{}+{}{SUFFIX}",
            escape(&self.network),
            escape(&self.container_id),
            escape(&self.ifname)
        )
    }
}

impl Key {
    /// The key a record file is named after (the inverse of [`Key::file_name`]),
    /// so a record that no longer parses still says whose it was.
    pub fn from_file_name(name: &str) -> Option<Key> {
        let stem = name.strip_suffix(SUFFIX)?;
        let mut parts = stem.split('+');
        let (n, c, i) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        Some(Key {
            network: unescape(n)?,
            container_id: unescape(c)?,
            ifname: unescape(i)?,
        })
    }
}

fn unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// One record file as found on disk, before any parsing.
#[derive(Debug)]
pub struct Entry {
    pub path: PathBuf,
    /// From the file name; None if the name is not one the store writes.
    pub key: Option<Key>,
    pub body: Result<Vec<u8>>,
}

/// The names in a state directory, as one listing read them
/// ([`StateStore::names`]).
#[derive(Debug, Clone, Default)]
pub struct Names(Vec<std::ffi::OsString>);

impl Names {
    pub fn iter(&self) -> impl Iterator<Item = &std::ffi::OsStr> {
        self.0.iter().map(|n| n.as_os_str())
    }

    /// Is `name` among them?
    pub fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|n| n == name)
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && !out.is_empty()) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl StateStore {
    /// Open (creating with mode 0700 if needed) the store directory; a
    /// symbolic link there is refused.
    pub fn open(dir: &Path) -> Result<StateStore> {
        Dir::create(dir, 0o700)
            .map(|dir| StateStore { dir })
            .map_err(|source| Error::State {
                path: dir.into(),
                op: "open directory",
                source,
            })
    }

    /// Open without creating; None if the directory does not exist (DEL on a
    /// node that never ran ADD). A symbolic link there is an error.
    pub fn existing(dir: &Path) -> Result<Option<StateStore>> {
        match Dir::open(dir) {
            Ok(dir) => Ok(Some(StateStore { dir })),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::State {
                path: dir.into(),
                op: "open directory",
                source,
            }),
        }
    }

    /// The store of the subdirectory `name` (a plain name, not a link);
    /// None when it does not exist.
    pub fn sub(&self, name: &str) -> Result<Option<StateStore>> {
        self.dir
            .sub(name)
            .map(|d| d.map(|dir| StateStore { dir }))
            .map_err(|source| Error::State {
                path: self.dir.join(name),
                op: "open directory",
                source,
            })
    }

    /// [`StateStore::sub`], created (mode 0700) if missing.
    pub fn create_sub(&self, name: &str) -> Result<StateStore> {
        self.dir
            .create_sub(name, 0o700)
            .map(|dir| StateStore { dir })
            .map_err(|source| Error::State {
                path: self.dir.join(name),
                op: "create directory",
                source,
            })
    }

    /// The store's path, for messages (files are reached through
    /// [`StateStore::handle`]).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The directory handle every file of the store is reached through.
    pub fn handle(&self) -> &Dir {
        &self.dir
    }

    /// Exclusive lock over the whole store (flock, bounded wait).
    pub fn lock(&self) -> Result<StateLock> {
        kfs::lock_in(&self.dir, LOCK_FILE, LOCK_WAIT, LockFile::Kept).map_err(in_store)
    }

    /// Exclusive lock over one pod (container ID): every attachment of it,
    /// in every network of this store. Serialises ADD, DEL and CHECK of the
    /// same pod while the node-wide [`StateStore::lock`] is held only for
    /// what is node-wide. Take it before the node-wide lock, never after.
    ///
    /// The lock file exists only while someone holds it: it is unlinked on
    /// release (while still locked), and a waiter that then gets the lock
    /// of an unlinked file retries on the path, so one lock per pod never
    /// accumulates files.
    pub fn lock_pod(&self, container_id: &str) -> Result<StateLock> {
        kfs::lock_in(
            &self.dir,
            pod_lock_name(container_id),
            LOCK_WAIT,
            LockFile::Transient,
        )
        .map_err(in_store)
    }

    /// Under the node-wide lock (so no ADD writes a record meanwhile): if
    /// no attachment record is left, remove what podgate made in the
    /// store: its own files (the pod locks not held right now, whose
    /// holders unlink them; temp files) and the names `ours` accepts (the
    /// callers' files and subdirectories), then the lock file, last and
    /// while still held (a waiter then retries on the path). Anything else
    /// (another network's `stateDir` placed under this one, an operator's
    /// file) and the directory itself (it may be a mount point) stay. For
    /// uninstall.
    pub fn purge_unless_records(&self, ours: impl Fn(&str) -> bool) -> Result<Purge> {
        let lock = self.lock()?;
        let names = self.names()?;
        let records = self.entries_in(&names)?.len();
        if records > 0 {
            return Ok(Purge::RecordsLeft(records));
        }
        let mut removed = 0;
        let mut foreign = Vec::new();
        for raw in names.iter() {
            let name = raw.to_string_lossy();
            let pod_lock = name.starts_with(POD_LOCK_PREFIX) && name.ends_with(LOCK_SUFFIX);
            if name == LOCK_FILE || (pod_lock && kfs::lock_busy(&self.dir, raw)) {
                continue;
            }
            if !(pod_lock || name.starts_with(".tmp-") || ours(&name)) {
                foreign.push(name.into_owned());
                continue;
            }
            let path = self.dir.join(raw);
            match self.dir.remove_all(raw) {
                Ok(()) => removed += 1,
                // A pod lock its holder released meanwhile.
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(Error::State {
                        path,
                        op: "remove",
                        source,
                    })
                }
            }
        }
        let path = self.dir.join(LOCK_FILE);
        self.dir
            .remove_file(LOCK_FILE)
            .map_err(|source| Error::State {
                path,
                op: "remove",
                source,
            })?;
        drop(lock);
        foreign.sort();
        Ok(Purge::Emptied {
            removed: removed + 1,
            foreign,
        })
    }

    /// [`StateStore::lock_pod`] without waiting: None while an ADD, DEL or
    /// CHECK of the pod holds it. For GC, which holds the node-wide lock
    /// and so must not wait for a pod's (the order is pod, then node).
    pub fn try_lock_pod(&self, container_id: &str) -> Result<Option<StateLock>> {
        kfs::try_lock(&self.dir, pod_lock_name(container_id), LockFile::Transient).map_err(in_store)
    }

    /// Unlink the pod lock files killed holders left (a live holder unlinks
    /// its own on release). For GC and the periodic sweep; returns how many.
    pub fn sweep_pod_locks(&self) -> usize {
        match self.names() {
            Ok(names) => self.sweep_pod_locks_in(&names),
            Err(_) => 0,
        }
    }

    /// [`StateStore::sweep_pod_locks`] over a listing taken with the lock held.
    pub fn sweep_pod_locks_in(&self, names: &Names) -> usize {
        names
            .iter()
            .filter(|n| {
                let n = n.to_string_lossy();
                n.starts_with(POD_LOCK_PREFIX) && n.ends_with(LOCK_SUFFIX)
            })
            .filter(|n| kfs::remove_orphaned_lock(&self.dir, n))
            .count()
    }

    /// Is some process holding this pod's lock right now (an ADD or DEL of
    /// it in flight)? Never creates the lock file.
    pub fn pod_busy(&self, container_id: &str) -> bool {
        kfs::lock_busy(&self.dir, pod_lock_name(container_id))
    }

    fn path(&self, key: &Key) -> PathBuf {
        self.dir.join(key.file_name())
    }

    /// Atomic write: temp file in the same directory, then rename.
    pub fn write<T: Serialize>(&self, key: &Key, value: &T) -> Result<()> {
        self.write_file(&key.file_name(), value)
    }

    /// [`StateStore::write`] for a file that is not an attachment's record
    /// (node-wide shared state such as `node/strict.json`): a plain name in
    /// this directory, never a path or a dot file.
    pub fn write_named<T: Serialize>(&self, name: &str, value: &T) -> Result<()> {
        plain_name(&self.dir, name)?;
        self.write_file(name, value)
    }

    fn write_file<T: Serialize>(&self, name: &str, value: &T) -> Result<()> {
        self.write_file_as(name, value, false)
    }

    /// [`StateStore::write_named`], fsynced before the rename and the
    /// directory after: for a file whose loss to a power cut would stop
    /// podgate rather than describe nothing (`node/strict.json`).
    pub fn write_named_durable<T: Serialize>(&self, name: &str, value: &T) -> Result<()> {
        plain_name(&self.dir, name)?;
        self.write_file_as(name, value, true)
    }

    fn write_file_as<T: Serialize>(&self, name: &str, value: &T, durable: bool) -> Result<()> {
        let path = self.dir.join(name);
        let tmp = format!(".tmp-{}-{name}", std::process::id());
        // Compact, one line: the same schema as pretty-printed JSON at a
        // fraction of the formatting (~40k instructions per ADD, two
        // records); `podgate inspect` is the human view.
        let mut body = serde_json::to_vec(value).map_err(|e| Error::StateCorrupt {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        body.push(b'\n');
        // No fsync: a killed process loses nothing once write() returned
        // (the page cache is the kernel's), and what a record describes
        // (routes, rules, pod state) lives in kernel memory and is gone
        // after a power loss too, where the boot ID marks the record
        // stale. The rename keeps readers from ever seeing a torn record.
        // fsync cost ~0.8 ms per write, twice per ADD.
        let how = WriteMode {
            mode: 0o600,
            exact_mode: false,
            durable,
        };
        kfs::atomic_write_in(&self.dir, name, tmp, &body, how).map_err(in_store)
    }

    /// The raw bytes of a record, for readers that check a format version
    /// before parsing.
    pub fn read_raw(&self, key: &Key) -> Result<Option<Vec<u8>>> {
        self.read_named(&key.file_name(), MAX_RECORD)
    }

    /// The bytes of the regular file `name` of this directory, at most
    /// `max`; None when it does not exist.
    pub fn read_named(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        self.dir.read(name, max).map_err(|source| Error::State {
            path: self.dir.join(name),
            op: "read",
            source,
        })
    }

    /// The directory's names, listed once (one `getdents64` round): a
    /// request that both sweeps temp files and reads the records under the
    /// lock lists the directory once for both. Fails on any listing error, as [`StateStore::entries`] does.
    pub fn names(&self) -> Result<Names> {
        self.dir.names().map(Names).map_err(|source| Error::State {
            path: self.dir.path().to_path_buf(),
            op: "list",
            source,
        })
    }

    /// Every record file, unparsed (see [`StateStore::list`]).
    pub fn entries(&self) -> Result<Vec<Entry>> {
        self.entries_in(&self.names()?)
    }

    /// [`StateStore::entries`] of the record files in `names`.
    pub fn entries_in(&self, names: &Names) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        for raw in names.iter() {
            let name = raw.to_string_lossy();
            if name.starts_with('.') || !name.ends_with(SUFFIX) {
                continue;
            }
            let path = self.dir.join(raw);
            let body = match self.read_named(&name, MAX_RECORD) {
                Ok(Some(b)) => Ok(b),
                // Removed between listing and reading: not a record any more.
                Ok(None) => continue,
                Err(e) => Err(e),
            };
            out.push(Entry {
                key: Key::from_file_name(&name),
                path,
                body,
            });
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Removes temp files a killed writer left (`.tmp-*`). Call with the lock
    /// held: every writer holds it, or (records written after the node-wide
    /// lock was released) the lock of the record's pod, so a temp file seen
    /// then whose pod is not busy is orphaned. Returns how many were removed.
    pub fn sweep_temp(&self) -> Result<usize> {
        self.sweep_temp_holding(None)
    }

    /// [`StateStore::sweep_temp`] by a caller that holds the lock of pod
    /// `own`: that pod's temp files are orphaned too (no other writer of it
    /// can be alive).
    pub fn sweep_temp_holding(&self, own: Option<&str>) -> Result<usize> {
        match self.names() {
            Ok(names) => self.sweep_temp_in(&names, own),
            Err(Error::State { source, .. }) if source.kind() == ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// [`StateStore::sweep_temp_holding`] over a listing taken by this
    /// caller (before or under the lock: a temp file created since is left
    /// for the next sweep, and whether one may go is decided here, now).
    pub fn sweep_temp_in(&self, names: &Names, own: Option<&str>) -> Result<usize> {
        let mut removed = 0;
        for raw in names.iter() {
            let name = raw.to_string_lossy();
            let Some(rest) = name.strip_prefix(".tmp-") else {
                continue;
            };
            // `.tmp-PID-<record file name>`: a writer of a pod whose lock is
            // held may still be writing it.
            let pod = rest
                .split_once('-')
                .and_then(|(_, file)| Key::from_file_name(file))
                .map(|k| k.container_id);
            if pod
                .as_deref()
                .is_some_and(|c| Some(c) != own && self.pod_busy(c))
            {
                continue;
            }
            match self.dir.remove_file(raw) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(Error::State {
                        path: self.dir.join(raw),
                        op: "remove orphaned temp file",
                        source,
                    })
                }
            }
        }
        Ok(removed)
    }

    pub fn read<T: DeserializeOwned>(&self, key: &Key) -> Result<Option<T>> {
        parse(&self.path(key), self.read_raw(key)?)
    }

    /// Ok(false) when there was nothing to remove.
    pub fn remove(&self, key: &Key) -> Result<bool> {
        self.remove_named(&key.file_name())
    }

    /// [`StateStore::remove`] of the file `name`.
    pub fn remove_named(&self, name: &str) -> Result<bool> {
        let path = self.dir.join(name);
        match self.dir.remove_file(name) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(source) => Err(Error::State {
                path,
                op: "remove",
                source,
            }),
        }
    }

    /// Every record, with records that do not parse reported separately.
    pub fn list<T: DeserializeOwned>(&self) -> Result<(Vec<T>, Vec<Error>)> {
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        for e in self.entries()? {
            match e.body.and_then(|b| parse::<T>(&e.path, Some(b))) {
                Ok(Some(v)) => ok.push(v),
                Ok(None) => {}
                Err(e) => bad.push(e),
            }
        }
        Ok((ok, bad))
    }
}

/// `.pod-<container ID>.lock`.
fn pod_lock_name(container_id: &str) -> String {
    format!("{POD_LOCK_PREFIX}{}{LOCK_SUFFIX}", escape(container_id))
}

/// A plain file name of `dir`: never a path or a dot file.
fn plain_name(dir: &Dir, name: &str) -> Result<()> {
    if name.is_empty() || name.starts_with('.') || name.contains('/') {
        return Err(Error::StateCorrupt {
            path: dir.join(name),
            msg: "not a plain file name".into(),
        });
    }
    Ok(())
}

/// The store's file errors are [`Error::State`] (callers treat a failing
/// store as an I/O error of the CNI call).
fn in_store(e: Error) -> Error {
    match e {
        Error::File { op, path, source } => Error::State { path, op, source },
        e => e,
    }
}

fn parse<T: DeserializeOwned>(path: &Path, body: Option<Vec<u8>>) -> Result<Option<T>> {
    body.map(|b| {
        serde_json::from_slice(&b).map_err(|e| Error::StateCorrupt {
            path: path.into(),
            msg: e.to_string(),
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::time::Instant;

    /// A path not created yet, inside a directory removed with the
    /// returned guard.
    fn tmpdir(tag: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let (t, d) = crate::testing::scratch_dir(&format!("podgate-state-{tag}-"));
        (t, d.join("state"))
    }

    #[test]
    fn file_names_cannot_escape() {
        let k = Key::new("../../etc", "abc/../x", "eth0");
        let n = k.file_name();
        assert!(!n.contains('/'), "{n}");
        assert!(!n.starts_with('.'), "{n}");
        assert_ne!(
            Key::new("a+b", "c", "d").file_name(),
            Key::new("a", "b+c", "d").file_name()
        );
    }

    #[test]
    fn write_read_remove_list() {
        let (_tmp, d) = tmpdir("rw");
        let s = StateStore::open(&d).unwrap();
        let k = Key::new("net", "cid", "eth0");
        assert_eq!(s.read::<serde_json::Value>(&k).unwrap(), None);
        let _l = s.lock().unwrap();
        s.write(&k, &serde_json::json!({"a": 1})).unwrap();
        assert_eq!(s.read::<serde_json::Value>(&k).unwrap().unwrap()["a"], 1);
        let (all, bad) = s.list::<serde_json::Value>().unwrap();
        assert_eq!((all.len(), bad.len()), (1, 0));
        assert!(s.remove(&k).unwrap());
        assert!(!s.remove(&k).unwrap());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn file_names_map_back_to_keys() {
        for k in [
            Key::new("net", "cid", "eth0"),
            Key::new("../../etc", "abc/../x", "eth0"),
            Key::new("a+b", ".c%", "net1"),
        ] {
            assert_eq!(Key::from_file_name(&k.file_name()), Some(k.clone()));
        }
        assert_eq!(Key::from_file_name("a+b.json"), None);
        assert_eq!(Key::from_file_name("a+b+c+d.json"), None);
        assert_eq!(Key::from_file_name("a+%G0+c.json"), None);
    }

    #[test]
    fn orphaned_temp_files_are_swept() {
        let (_tmp, d) = tmpdir("sweep");
        let s = StateStore::open(&d).unwrap();
        fs::write(d.join(".tmp-1-x+y+z.json"), b"{").unwrap();
        fs::write(d.join("x+y+z.json"), b"{}").unwrap();
        assert_eq!(s.sweep_temp().unwrap(), 1);
        let e = s.entries().unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].key, Some(Key::new("x", "y", "z")));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn purge_keeps_everything_while_a_record_is_left_then_what_podgate_made_but_the_locks_in_use() {
        let (_tmp, d) = tmpdir("purge");
        let s = StateStore::open(&d).unwrap();
        let key = Key::new("n", "c1", "eth0");
        s.write(&key, &serde_json::json!({"v": 1})).unwrap();
        fs::create_dir_all(d.join("node")).unwrap();
        fs::write(d.join("node/strict.json"), b"{}").unwrap();
        fs::write(d.join("events.jsonl"), b"{}").unwrap();
        // Another network's stateDir under this one, an operator's file.
        fs::create_dir_all(d.join("net2")).unwrap();
        fs::write(d.join("net2/net2+c9+eth0.json"), b"{}").unwrap();
        fs::write(d.join("NOTES"), b"mine").unwrap();
        let ours = |n: &str| n == "node" || n == "events.jsonl";
        assert_eq!(s.purge_unless_records(ours).unwrap(), Purge::RecordsLeft(1));
        assert!(d.join("node/strict.json").exists());
        s.remove(&key).unwrap();
        let busy = s.lock_pod("busy").unwrap();
        fs::write(d.join(pod_lock_name("dead")), b"").unwrap();
        fs::write(d.join(".tmp-1-x"), b"").unwrap();
        assert_eq!(
            s.purge_unless_records(ours).unwrap(),
            Purge::Emptied {
                removed: 5,
                foreign: vec!["NOTES".into(), "net2".into()]
            }
        );
        let mut left: Vec<String> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".pod-busy.lock", "NOTES", "net2"]);
        assert!(d.join("net2/net2+c9+eth0.json").exists());
        drop(busy);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_waiter_for_the_store_lock_whose_file_was_unlinked_locks_the_path_anew() {
        let (_tmp, d) = tmpdir("relock");
        let s = StateStore::open(&d).unwrap();
        let held = s.lock().unwrap();
        let s2 = s.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let l = s2.lock().unwrap();
            tx.send(()).unwrap();
            // Held on the path's file, not on the unlinked one.
            std::thread::sleep(Duration::from_millis(200));
            drop(l);
        });
        std::thread::sleep(Duration::from_millis(100));
        // What a purge does while holding the lock.
        fs::remove_file(d.join(LOCK_FILE)).unwrap();
        drop(held);
        rx.recv().unwrap();
        assert!(d.join(LOCK_FILE).exists(), "the waiter made the file again");
        assert!(
            kfs::try_lock(s.handle(), LOCK_FILE, LockFile::Kept)
                .unwrap()
                .is_none(),
            "and holds its lock"
        );
        waiter.join().unwrap();
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn try_lock_pod_takes_a_free_pod_lock_and_never_waits_for_a_held_one() {
        let (_tmp, d) = tmpdir("trypodlock");
        let s = StateStore::open(&d).unwrap();
        let held = s.lock_pod("c1").unwrap();
        let started = std::time::Instant::now();
        assert!(s.try_lock_pod("c1").unwrap().is_none(), "held elsewhere");
        assert!(started.elapsed() < Duration::from_secs(1), "did not wait");
        let free = s.try_lock_pod("c2").unwrap().expect("a free pod's lock");
        assert!(s.pod_busy("c2"));
        drop(free);
        assert!(!s.pod_busy("c2"));
        assert!(!d.join(pod_lock_name("c2")).exists(), "unlinked on release");
        drop(held);
        assert!(
            s.try_lock_pod("c1").unwrap().is_some(),
            "free after release"
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn pod_locks_exclude_hand_over_and_leave_no_file() {
        let (_tmp, d) = tmpdir("podlock");
        let s = StateStore::open(&d).unwrap();
        let held = s.lock_pod("c/1").unwrap();
        assert!(s.pod_busy("c/1"));
        assert!(!s.pod_busy("c2"));
        // A temp file of a busy pod is not swept; of an idle one it is.
        let busy = format!(".tmp-1-{}", Key::new("n", "c/1", "eth0").file_name());
        let idle = format!(".tmp-1-{}", Key::new("n", "c2", "eth0").file_name());
        fs::write(d.join(&busy), b"{").unwrap();
        fs::write(d.join(&idle), b"{").unwrap();
        assert_eq!(s.sweep_temp().unwrap(), 1);
        assert!(d.join(&busy).exists());
        assert_eq!(s.sweep_temp_holding(Some("c/1")).unwrap(), 1);
        // A waiter blocks until the release, then holds a lock of its own.
        let s2 = s.clone();
        let waiter = std::thread::spawn(move || {
            let l = s2.lock_pod("c/1").unwrap();
            assert!(l.waited() >= Duration::from_millis(50));
            assert!(s2.pod_busy("c/1"));
        });
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
        waiter.join().unwrap();
        assert!(!s.pod_busy("c/1"));
        // Released locks unlink their files; a killed holder's is swept.
        let names = || {
            fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(POD_LOCK_PREFIX))
                .count()
        };
        assert_eq!(names(), 0);
        fs::write(d.join(pod_lock_name("dead")), b"").unwrap();
        let _busy = s.lock_pod("alive").unwrap();
        assert_eq!(names(), 2);
        assert_eq!(s.sweep_pod_locks(), 1);
        assert_eq!(names(), 1);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn node_lock_waiter_wakes_on_release() {
        let (_tmp, d) = tmpdir("wake");
        let s = StateStore::open(&d).unwrap();
        let held = s.lock().unwrap();
        let s2 = s.clone();
        let t0 = Instant::now();
        let waiter = std::thread::spawn(move || s2.lock().unwrap().waited());
        std::thread::sleep(Duration::from_millis(60));
        drop(held);
        let waited = waiter.join().unwrap();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn corrupt_records_are_reported_not_fatal() {
        let (_tmp, d) = tmpdir("corrupt");
        let s = StateStore::open(&d).unwrap();
        fs::write(d.join("x+y+z.json"), b"{not json").unwrap();
        let (all, bad) = s.list::<serde_json::Value>().unwrap();
        assert!(all.is_empty());
        assert_eq!(bad.len(), 1);
        fs::remove_dir_all(&d).unwrap();
    }
}
