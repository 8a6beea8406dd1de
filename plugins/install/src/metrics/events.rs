//! The agent's side of the plugins' event channel (`podgate_cni::event`):
//! create the channel, drain it into counters, and keep counters and read
//! cursors in one versioned file so a restart neither loses nor recounts.
//!
//! Order of one pass, and why it is exact across a kill at any point:
//! 1. list the in-flight marks nobody holds (their process is dead);
//! 2. read every complete event line after the cursor (a dead process's
//!    event, if it wrote one, is in the file before step 2 reads it);
//! 3. a dead mark whose id no event names is a crash;
//! 4. write counters + cursors + recent ids atomically (temp + rename);
//! 5. only then remove the dead marks and, past [`ROTATE_AT`], replace the
//!    event file (under its exclusive lock, after a last drain).
//!
//! A kill before 4 repeats the pass from the old state; after 4 the marks and
//! the old file are already counted, and the ids in `recent` keep a
//! mark that survived from being counted again.

use crate::fsx;
use nix::fcntl::{Flock, FlockArg};
use podgate_cni::event::{inflight_dir, Event, Started, MAX_EVENT_FILE};
use podgate_cni::log::flock;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

pub const STATE_FILE: &str = "metrics.json";
const STATE_VERSION: u32 = 1;
/// Replace the event file once this much of it is consumed.
pub const ROTATE_AT: u64 = 1 << 20;
/// Ids of counted events and crashes remembered for late-seen marks.
const RECENT: usize = 4096;
/// A temp mark nobody holds this long is a plugin killed while creating it.
const TEMP_MARK_AGE: Duration = Duration::from_secs(60);
/// Histogram bounds of `podgate_cni_request_duration_seconds`.
pub const BUCKETS: [f64; 12] = [
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// `counts[i]`: observations in `(BUCKETS[i-1], BUCKETS[i]]`; the last one above.
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        if self.counts.len() != BUCKETS.len() + 1 {
            self.counts.resize(BUCKETS.len() + 1, 0);
        }
        let i = BUCKETS
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(BUCKETS.len());
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum += v;
    }
}

/// Label tuples are joined with `|` (no label value here can contain it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// `plugin|command|outcome` -> requests.
    pub requests: BTreeMap<String, u64>,
    /// rule -> refusals.
    pub refusals: BTreeMap<String, u64>,
    /// `plugin|command` -> durations.
    pub durations: BTreeMap<String, Histogram>,
    /// profile -> sandboxes the agent adopted.
    #[serde(default)]
    pub adopted: BTreeMap<String, u64>,
    /// `plugin|warning` -> requests that noted it (`Event::warnings`).
    #[serde(default)]
    pub warnings: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Cursor {
    id: String,
    offset: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct State {
    v: u32,
    counters: Counters,
    /// Event file path -> how far it is read.
    cursors: BTreeMap<String, Cursor>,
    recent: VecDeque<String>,
}

/// First line of an event file: names this generation of the file.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    #[serde(rename = "podgateEvents")]
    version: u32,
    id: String,
}

/// Why the counters could not be loaded or saved, or an event file not read,
/// naming the file.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("locking {}: {source}", .path.display())]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", .path.display())]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: version {found} (this podgate reads {STATE_VERSION})", .path.display())]
    Version { path: PathBuf, found: u32 },
    #[error("{0}")]
    Encode(#[from] serde_json::Error),
    /// Writing the counters or an event file ([`fsx::atomic_write`]); boxed:
    /// [`crate::Error`] holds a `SpoolError` in turn.
    #[error("{0}")]
    Write(Box<crate::Error>),
}

impl From<crate::Error> for SpoolError {
    fn from(e: crate::Error) -> SpoolError {
        SpoolError::Write(Box::new(e))
    }
}

impl SpoolError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
        move |source| SpoolError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

pub struct Spool {
    state_path: PathBuf,
    state: State,
}

fn label(s: &str) -> String {
    s.replace('|', "_")
}

impl Spool {
    /// Load the counters (a missing file is a fresh start; a corrupt one is
    /// an error: silently restarting counters would hide the problem).
    pub fn open(state_dir: &Path) -> Result<Spool, SpoolError> {
        let state_path = state_dir.join(STATE_FILE);
        let state = match std::fs::read(&state_path) {
            Ok(b) => {
                let s: State = match serde_json::from_slice(&b) {
                    Ok(s) => s,
                    Err(source) => {
                        let path = state_path;
                        return Err(SpoolError::Corrupt { path, source });
                    }
                };
                if s.v != STATE_VERSION {
                    let (path, found) = (state_path, s.v);
                    return Err(SpoolError::Version { path, found });
                }
                s
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State {
                v: STATE_VERSION,
                ..State::default()
            },
            Err(e) => return Err(SpoolError::io(&state_path)(e)),
        };
        Ok(Spool { state_path, state })
    }

    pub fn counters(&self) -> &Counters {
        &self.state.counters
    }

    fn save(&self) -> Result<(), SpoolError> {
        let body = serde_json::to_vec(&self.state)?;
        if let Some(dir) = self.state_path.parent() {
            std::fs::create_dir_all(dir).map_err(SpoolError::io(dir))?;
        }
        Ok(fsx::atomic_write(&self.state_path, &body, 0o600)?)
    }

    /// One sandbox adopted with `profile`, kept across restarts.
    pub fn count_adopted(&mut self, profile: &str) -> Result<(), SpoolError> {
        *self
            .state
            .counters
            .adopted
            .entry(label(profile))
            .or_default() += 1;
        self.save()
    }

    /// One refusal by `rule` that no plugin call recorded (the agent's
    /// adoption), kept across restarts.
    pub fn count_refusal(&mut self, rule: &str) -> Result<(), SpoolError> {
        self.refused(rule);
        self.save()
    }

    fn refused(&mut self, rule: &str) {
        *self.state.counters.refusals.entry(label(rule)).or_default() += 1;
    }

    fn remember(&mut self, id: &str) {
        self.state.recent.push_back(id.to_string());
        while self.state.recent.len() > RECENT {
            self.state.recent.pop_front();
        }
    }

    fn count(&mut self, plugin: &str, command: &str, outcome: &str) {
        let key = format!("{}|{}|{}", label(plugin), label(command), label(outcome));
        *self.state.counters.requests.entry(key).or_default() += 1;
    }

    fn count_event(&mut self, ev: &Event) {
        self.count(&ev.plugin, &ev.command, &ev.outcome);
        if let Some(rule) = &ev.rule {
            self.refused(rule);
        }
        for w in &ev.warnings {
            let key = format!("{}|{}", label(&ev.plugin), label(w));
            *self.state.counters.warnings.entry(key).or_default() += 1;
        }
        if ev.seconds.is_finite() && ev.seconds >= 0.0 {
            let key = format!("{}|{}", label(&ev.plugin), label(&ev.command));
            self.state
                .counters
                .durations
                .entry(key)
                .or_default()
                .observe(ev.seconds);
        }
        self.remember(&ev.id);
    }

    /// One pass over the event files (see the module docs). Errors name the
    /// file; counting what could be read goes on.
    pub fn drain(&mut self, files: &[PathBuf]) -> Vec<String> {
        let mut errors = Vec::new();
        let mut dead: Vec<(PathBuf, Option<Started>)> = Vec::new();
        for f in files {
            if let Err(e) = ensure_channel(f) {
                errors.push(e.to_string());
            }
            dead.extend(dead_marks(&inflight_dir(f)));
        }
        let mut seen: BTreeSet<String> = self.state.recent.iter().cloned().collect();
        let mut rotate = Vec::new();
        for f in files {
            match self.read_new(f, &mut seen) {
                Ok(true) => rotate.push(f.clone()),
                Ok(false) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        for (_, started) in &dead {
            if let Some(s) = started {
                if !seen.contains(&s.id) {
                    self.count(&s.plugin, &s.command, "crashed");
                    self.remember(&s.id);
                    seen.insert(s.id.clone());
                }
            }
        }
        if let Err(e) = self.save() {
            errors.push(format!("saving metrics state: {e}"));
            return errors; // nothing removed: the next pass redoes this one
        }
        for (path, _) in dead {
            let _ = std::fs::remove_file(path);
        }
        for f in rotate {
            if let Err(e) = self.rotate(&f, &mut seen) {
                errors.push(e.to_string());
            }
        }
        errors
    }

    /// Count the complete lines after the cursor; Ok(true) when the file is
    /// consumed past [`ROTATE_AT`].
    fn read_new(&mut self, path: &Path, seen: &mut BTreeSet<String>) -> Result<bool, SpoolError> {
        let mut f = File::open(path).map_err(SpoolError::io(path))?;
        let consumed = self.consume(path, &mut f, seen)?;
        Ok(consumed > ROTATE_AT)
    }

    /// Read from the cursor to the last complete line of an open event file.
    fn consume(
        &mut self,
        path: &Path,
        f: &mut File,
        seen: &mut BTreeSet<String>,
    ) -> Result<u64, SpoolError> {
        let err = |e| SpoolError::io(path)(e);
        let (id, header_len) = read_header(f).map_err(err)?;
        let key = path.display().to_string();
        let cursor = self.state.cursors.get(&key).cloned().unwrap_or_default();
        let size = f.metadata().map_err(err)?.len();
        let mut offset = if cursor.id == id {
            cursor.offset
        } else {
            header_len
        };
        if offset > size || offset < header_len {
            offset = header_len;
        }
        f.seek(SeekFrom::Start(offset)).map_err(err)?;
        let mut buf = Vec::new();
        f.take(MAX_EVENT_FILE + (1 << 20))
            .read_to_end(&mut buf)
            .map_err(err)?;
        let complete = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        for line in buf
            .get(..complete)
            .unwrap_or_default()
            .split(|b| *b == b'\n')
        {
            if line.is_empty() {
                continue;
            }
            // A line that does not parse (another version, damage) is skipped:
            // one bad line must not stop the channel.
            if let Ok(ev) = serde_json::from_slice::<Event>(line) {
                if seen.insert(ev.id.clone()) {
                    self.count_event(&ev);
                }
            }
        }
        let offset = offset + complete as u64;
        self.state.cursors.insert(key, Cursor { id, offset });
        Ok(offset)
    }

    /// Replace a consumed event file: under its exclusive lock (no plugin
    /// appends meanwhile) drain the tail, save, then rename a fresh file over it.
    fn rotate(&mut self, path: &Path, seen: &mut BTreeSet<String>) -> Result<(), SpoolError> {
        let mut f = File::open(path).map_err(SpoolError::io(path))?;
        flock(&f, libc::LOCK_EX).map_err(|source| SpoolError::Lock {
            path: path.to_path_buf(),
            source,
        })?;
        self.consume(path, &mut f, seen)?;
        self.save()?;
        create_event_file(path)?;
        let (id, header_len) = File::open(path)
            .and_then(|mut n| read_header(&mut n))
            .map_err(SpoolError::io(path))?;
        self.state.cursors.insert(
            path.display().to_string(),
            Cursor {
                id,
                offset: header_len,
            },
        );
        self.save()
    }
}

fn read_header(f: &mut File) -> std::io::Result<(String, u64)> {
    f.seek(SeekFrom::Start(0))?;
    let mut buf = vec![0u8; 256];
    let n = f.read(&mut buf)?;
    let head = buf.get(..n).unwrap_or_default();
    let end = head
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no header line"))?;
    let h: Header = serde_json::from_slice(head.get(..end).unwrap_or_default())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok((h.id, end as u64 + 1))
}

fn random_id() -> String {
    let mut b = [0u8; 16];
    let read = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if read.is_err() {
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        return format!("{:x}-{}", t.as_nanos(), std::process::id());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A fresh event file (header only), atomically in place of any old one.
fn create_event_file(path: &Path) -> Result<(), SpoolError> {
    let header = serde_json::to_string(&Header {
        version: podgate_cni::event::EVENT_VERSION,
        id: random_id(),
    })?;
    Ok(fsx::atomic_write(
        path,
        format!("{header}\n").as_bytes(),
        0o600,
    )?)
}

/// The event file and its in-flight dir exist (plugins never create them).
fn ensure_channel(path: &Path) -> Result<(), SpoolError> {
    let dir = inflight_dir(path);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(SpoolError::io(&dir))?;
    let valid = File::open(path)
        .and_then(|mut f| read_header(&mut f))
        .is_ok();
    if !valid {
        // Missing, or damaged beyond its header: start a new generation.
        create_event_file(path)?;
    }
    Ok(())
}

/// In-flight marks whose process is gone: the lock is free. Temp marks
/// (a plugin killed while creating one) are returned without content once old.
fn dead_marks(dir: &Path) -> Vec<(PathBuf, Option<Started>)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in rd.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(f) = File::open(&path) else {
            continue;
        };
        // Held by a running request; the lock goes with `f`.
        let Ok(mut f) = Flock::lock(f, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        if name.starts_with(".tmp-") {
            let old = f
                .metadata()
                .map(|m| m.mtime())
                .ok()
                .and_then(|t| {
                    let now = SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .ok()?
                        .as_secs() as i64;
                    Some(now - t > TEMP_MARK_AGE.as_secs() as i64)
                })
                .unwrap_or(false);
            if old {
                out.push((path, None));
            }
            continue;
        }
        let mut body = Vec::new();
        let started = f
            .read_to_end(&mut body)
            .ok()
            .and_then(|_| serde_json::from_slice::<Started>(&body).ok());
        out.push((path, started));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use podgate_cni::event::Recorder;
    use std::time::Instant;

    /// A fresh directory, removed with the returned guard.
    fn tmp(tag: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        crate::testing::scratch_dir(&format!("podgate-spool-{tag}-"))
    }

    fn total(s: &Spool) -> u64 {
        s.counters().requests.values().sum()
    }

    #[test]
    fn counts_once_across_restarts_and_rotation() {
        let (_tmp, d) = tmp("restart");
        let ev = d.join("events.jsonl");
        let mut s = Spool::open(&d).unwrap();
        assert!(s.drain(std::slice::from_ref(&ev)).is_empty());
        for i in 0..5 {
            let r = Recorder::start(&ev, "podgate-router", "ADD", Instant::now()).unwrap();
            r.finish(if i == 0 { 100 } else { 0 }, "refused by allow.pools: x");
        }
        s.drain(std::slice::from_ref(&ev));
        assert_eq!(total(&s), 5);
        assert_eq!(s.counters().refusals.get("allow.pools"), Some(&1));
        // A restart reads the saved cursor: nothing counted twice.
        let mut s = Spool::open(&d).unwrap();
        s.drain(std::slice::from_ref(&ev));
        assert_eq!(total(&s), 5);
        // Past the rotation size the file is replaced; events keep counting.
        let pad = format!("{}\n", " ".repeat(1000));
        let mut f = std::fs::OpenOptions::new().append(true).open(&ev).unwrap();
        for _ in 0..1100 {
            std::io::Write::write_all(&mut f, pad.as_bytes()).unwrap();
        }
        s.drain(std::slice::from_ref(&ev));
        assert!(std::fs::metadata(&ev).unwrap().len() < 200, "rotated");
        Recorder::start(&ev, "podgate-router", "DEL", Instant::now())
            .unwrap()
            .finish(0, "");
        let mut s = Spool::open(&d).unwrap();
        s.drain(std::slice::from_ref(&ev));
        assert_eq!(total(&s), 6);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Writers append while the agent drains, rotates (more than 1 MiB of
    /// events) and restarts (a fresh Spool from disk every few passes):
    /// every event is counted exactly once and nothing is taken for a crash.
    #[test]
    fn concurrent_writers_rotation_and_restarts_count_exactly() {
        let (_tmp, d) = tmp("concurrent");
        let ev = d.join("events.jsonl");
        Spool::open(&d).unwrap().drain(std::slice::from_ref(&ev));
        const THREADS: u64 = 4;
        const EACH: u64 = 3000;
        let done = std::sync::atomic::AtomicU64::new(0);
        let mut generations = std::collections::BTreeSet::new();
        generations.insert(read_header(&mut File::open(&ev).unwrap()).unwrap().0);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..EACH {
                        let r =
                            Recorder::start(&ev, "podgate-router", "ADD", Instant::now()).unwrap();
                        r.finish(0, "");
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
            let mut passes = 0;
            while done.load(std::sync::atomic::Ordering::SeqCst) < THREADS {
                let mut spool = Spool::open(&d).unwrap();
                for _ in 0..3 {
                    assert!(spool.drain(std::slice::from_ref(&ev)).is_empty());
                    passes += 1;
                }
                let mut f = File::open(&ev).unwrap();
                generations.insert(read_header(&mut f).unwrap().0);
            }
            assert!(passes > 0);
        });
        let mut spool = Spool::open(&d).unwrap();
        spool.drain(std::slice::from_ref(&ev));
        generations.insert(read_header(&mut File::open(&ev).unwrap()).unwrap().0);
        assert_eq!(
            spool.counters().requests.get("podgate-router|ADD|ok"),
            Some(&(THREADS * EACH)),
            "{:?}",
            spool.counters().requests
        );
        assert_eq!(total(&spool), THREADS * EACH, "no crashes");
        assert!(generations.len() > 1, "the file was rotated at least once");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_unheld_mark_without_an_event_is_a_crash() {
        let (_tmp, d) = tmp("crash");
        let ev = d.join("events.jsonl");
        let mut s = Spool::open(&d).unwrap();
        s.drain(std::slice::from_ref(&ev));
        // A live request: its mark is held, nothing counted.
        let live = Recorder::start(&ev, "podgate-router", "ADD", Instant::now()).unwrap();
        s.drain(std::slice::from_ref(&ev));
        assert_eq!(total(&s), 0);
        // A crashed one: the mark stays, its lock is gone (here: written by hand).
        let mark = inflight_dir(&ev).join("dead-1.json");
        std::fs::write(
            &mark,
            r#"{"v":1,"id":"dead-1","ts":"x","plugin":"podgate-router","command":"ADD"}"#,
        )
        .unwrap();
        s.drain(std::slice::from_ref(&ev));
        assert_eq!(
            s.counters().requests.get("podgate-router|ADD|crashed"),
            Some(&1)
        );
        assert!(!mark.exists());
        live.finish(0, "");
        s.drain(std::slice::from_ref(&ev));
        assert_eq!(s.counters().requests.get("podgate-router|ADD|ok"), Some(&1));
        assert_eq!(total(&s), 2);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
