//! JSON-lines logging to a file (`logFile`) or stderr. Never stdout: stdout
//! belongs to the CNI protocol.
//!
//! Bounded: a line below the configured level (`logLevel`) is not written,
//! and the file is rotated to `<logFile>.1` (one copy) before a line would
//! take it past `logMaxBytes`. Many plugin processes write the same file at
//! once, so rotation is coordinated through `flock` on the file itself (see
//! [`append_line`]): appends hold a shared lock, the rename an exclusive one,
//! and an append only goes to the inode the path names while it holds its
//! lock. Two processes rotating at once therefore rotate once, no line is
//! lost or torn, and nobody writes into a file that was renamed or deleted.
//! Logging is best effort: a full disk or an unwritable file falls back to
//! stderr and never changes a CNI answer.
//!
//! The file itself is never followed as a link and must be a regular file
//! with no other name (a link, a FIFO, a device or a hard link to another
//! file there is refused and the line goes to stderr): the operator's
//! `logFile` path is trusted up to its directory, the name in it is not.

use podgate_kit::dir::{Dir, Open};
use podgate_kit::fs::{self as kfs, Flock};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `logMaxBytes` when the config does not say (10 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 10 << 20;
/// Smallest `logMaxBytes` accepted: below this a single pod's lines rotate.
pub const MIN_MAX_BYTES: u64 = 4096;
/// Bound on waiting for another writer's lock: a stopped process holding it
/// must not hold up pod creation; the line then goes to stderr.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// Rotations by others between our open and our lock before giving up.
const MAX_REOPEN: usize = 16;

/// Severity, most severe first: a logger at `Info` writes error, warn, info.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }

    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "error" => Some(Level::Error),
            "warn" => Some(Level::Warn),
            "info" => Some(Level::Info),
            "debug" => Some(Level::Debug),
            _ => None,
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The log and event settings every podgate plugin takes from its conflist
/// entry (`#[serde(flatten)]` into the plugin's config): `logLevel`,
/// `logMaxBytes`, `eventFile` (see [`crate::event`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Telemetry {
    #[serde(default)]
    pub log_level: Level,
    #[serde(default = "default_max_bytes", deserialize_with = "de_max_bytes")]
    pub log_max_bytes: u64,
    /// The node agent's event channel; default [`crate::event::file_for_entry`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_file: Option<PathBuf>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            log_level: Level::default(),
            log_max_bytes: DEFAULT_MAX_BYTES,
            event_file: None,
        }
    }
}

/// `logMaxBytes`' default, for configs that spell the telemetry keys out.
pub fn default_max_bytes() -> u64 {
    DEFAULT_MAX_BYTES
}

/// `logMaxBytes`, refusing limits below [`MIN_MAX_BYTES`].
pub fn de_max_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = u64::deserialize(d)?;
    if n < MIN_MAX_BYTES {
        return Err(serde::de::Error::custom(format!(
            "logMaxBytes {n} is below the minimum {MIN_MAX_BYTES}"
        )));
    }
    Ok(n)
}

#[derive(Debug, Clone)]
pub struct Logger {
    file: Option<PathBuf>,
    base: Map<String, Value>,
    level: Level,
    max_bytes: u64,
}

impl Logger {
    /// `file` None logs warnings and errors to stderr only. Level `info` and
    /// [`DEFAULT_MAX_BYTES`] until [`Logger::limits`] says otherwise.
    pub fn new(plugin: &str, file: Option<&Path>) -> Logger {
        let mut base = Map::new();
        base.insert("plugin".into(), Value::String(plugin.into()));
        Logger {
            file: file.map(Path::to_path_buf),
            base,
            level: Level::default(),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }

    /// The operator's `logLevel` and `logMaxBytes`.
    pub fn limits(mut self, t: &Telemetry) -> Logger {
        self.level = t.log_level;
        self.max_bytes = t.log_max_bytes.max(MIN_MAX_BYTES);
        self
    }

    /// Add a field carried by every line (container ID, command, pod).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Logger {
        self.base.insert(key.into(), value.into());
        self
    }

    pub fn enabled(&self, level: Level) -> bool {
        level <= self.level
    }

    pub fn debug(&self, msg: &str, fields: Value) {
        self.write(Level::Debug, msg, fields);
    }
    pub fn info(&self, msg: &str, fields: Value) {
        self.write(Level::Info, msg, fields);
    }
    pub fn warn(&self, msg: &str, fields: Value) {
        self.write(Level::Warn, msg, fields);
    }
    pub fn error(&self, msg: &str, fields: Value) {
        self.write(Level::Error, msg, fields);
    }

    fn write(&self, level: Level, msg: &str, fields: Value) {
        if !self.enabled(level) {
            return;
        }
        let text = self.line(level, msg, &rfc3339_now(), &fields);
        match &self.file {
            Some(path) => {
                if let Err(e) = append_line(path, &text, Limit::Rotate(self.max_bytes)) {
                    stderr_line(&format!("log file {}: {e}; {text}", path.display()));
                }
            }
            None if level <= Level::Warn => stderr_line(&text),
            None => {}
        }
    }

    /// One line: the base fields, `ts`, `level`, `msg`, then `fields`, a
    /// later key replacing an earlier one, keys in sorted order (the
    /// layout a `serde_json::Map` of them printed). Written straight into
    /// one buffer: the base fields are not copied into a map per line.
    fn line(&self, level: Level, msg: &str, ts: &str, fields: &Value) -> String {
        enum V<'a> {
            Str(&'a str),
            Json(&'a Value),
        }
        let extra = fields.as_object();
        let mut entries: Vec<(&str, V)> =
            Vec::with_capacity(self.base.len() + 3 + extra.map_or(0, Map::len));
        entries.extend(self.base.iter().map(|(k, v)| (k.as_str(), V::Json(v))));
        entries.push(("ts", V::Str(ts)));
        entries.push(("level", V::Str(level.as_str())));
        entries.push(("msg", V::Str(msg)));
        if let Some(f) = extra {
            entries.extend(f.iter().map(|(k, v)| (k.as_str(), V::Json(v))));
        }
        // Stable: of equal keys the one pushed last stays last.
        entries.sort_by(|a, b| a.0.cmp(b.0));
        let mut buf: Vec<u8> = Vec::with_capacity(512);
        buf.push(b'{');
        let mut first = true;
        for (i, (k, v)) in entries.iter().enumerate() {
            if entries.get(i + 1).is_some_and(|(next, _)| next == k) {
                continue;
            }
            if !first {
                buf.push(b',');
            }
            first = false;
            // Writing JSON into a Vec cannot fail: strings and Values only.
            let _ = serde_json::to_writer(&mut buf, k);
            buf.push(b':');
            let _ = match v {
                V::Str(s) => serde_json::to_writer(&mut buf, s),
                V::Json(j) => serde_json::to_writer(&mut buf, j),
            };
        }
        buf.push(b'}');
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// What [`append_line`] does when the file is full or missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A log: create the file if missing; before a line would take it past
    /// the limit, rename it to `<path>.1` (replacing the older copy).
    Rotate(u64),
    /// A channel someone else owns and drains: never create it; past the
    /// limit, drop the line.
    Drop(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    Written,
    /// [`Limit::Drop`] and the file is full.
    Dropped,
    /// [`Limit::Drop`] and the file does not exist.
    Absent,
}

/// `<path>.1`: the one rotated copy.
pub fn rotated_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".1");
    PathBuf::from(s)
}

/// Append one line (a newline is added) in a single `write` on an
/// `O_APPEND` descriptor, under a shared `flock` of the file, to the file
/// `path` names at that moment. Rotation renames under an exclusive lock,
/// so: lines never interleave or tear, a rotation waits for appends in
/// progress, an append that raced a rotation re-opens the new file, and two
/// writers that both see the file full rotate it once. `path`'s directory
/// is followed as given (the operator's); [`append_line_in`] for a
/// directory a container may write.
pub fn append_line(path: &Path, line: &str, limit: Limit) -> io::Result<Appended> {
    let (dir, name) = dir_of(path, Dir::open_following)?;
    append_line_in(&dir, name, line, limit)
}

/// `path`'s directory, opened by `open`, and its file name.
pub fn dir_of(path: &Path, open: fn(&Path) -> io::Result<Dir>) -> io::Result<(Dir, &OsStr)> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(ErrorKind::InvalidInput, "no file name"))?;
    let parent = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Ok((open(parent)?, name))
}

/// [`append_line`] to the file `name` of `dir`: a regular file with no
/// other name, never reached through a link.
pub fn append_line_in(dir: &Dir, name: &OsStr, line: &str, limit: Limit) -> io::Result<Appended> {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line.as_bytes());
    buf.push(b'\n');
    let len = buf.len() as u64;
    for _ in 0..MAX_REOPEN {
        let create = matches!(limit, Limit::Rotate(_));
        let file = match dir.open_file(name, Open::Append(create.then_some(0o640))) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound && !create => return Ok(Appended::Absent),
            Err(e) => return Err(e),
        };
        flock(&file, libc::LOCK_SH)?;
        let Some(size) = size_if_named(dir, name, &file)? else {
            continue; // rotated (or replaced) between our open and our lock
        };
        match limit {
            Limit::Drop(max) if size + len > max => return Ok(Appended::Dropped),
            Limit::Rotate(max) if size > 0 && size + len > max => {
                flock(&file, libc::LOCK_UN)?;
                flock(&file, libc::LOCK_EX)?;
                // Someone else may have rotated while we waited.
                if size_if_named(dir, name, &file)?.is_some_and(|size| size + len > max) {
                    dir.rename(name, rotated_name(name))?;
                }
                continue; // closing drops the lock; the next round appends
            }
            _ => {}
        }
        (&file).write_all(&buf)?;
        return Ok(Appended::Written);
    }
    Err(io::Error::other(
        "the file was rotated under every attempt to append",
    ))
}

/// `<name>.1`.
fn rotated_name(name: &OsStr) -> OsString {
    let mut s = name.to_os_string();
    s.push(".1");
    s
}

/// The size of the file `f` is open on, if `name` in `dir` still names it
/// (one `fstat` for both questions). A file with another name too (a hard
/// link to some other file of the filesystem) is not written.
fn size_if_named(dir: &Dir, name: &OsStr, f: &File) -> io::Result<Option<u64>> {
    let open = f.metadata()?;
    if open.nlink() > 1 {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            "the file has another name too (a hard link): not written",
        ));
    }
    Ok(dir.names_file(name, f).then_some(open.len()))
}

/// `flock(op)` (`libc::LOCK_SH`, `LOCK_EX` or `LOCK_UN`) waiting at most
/// two seconds: the kit's bounded [`podgate_kit::fs::flock`].
pub fn flock(f: &File, op: libc::c_int) -> io::Result<()> {
    let kind = match op {
        libc::LOCK_UN => return f.unlock(),
        libc::LOCK_SH => Flock::Shared,
        libc::LOCK_EX => Flock::Exclusive,
        _ => {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!("flock: unknown operation {op}"),
            ))
        }
    };
    kfs::flock(f, kind, LOCK_WAIT)
}

/// Best effort: a closed or full stderr must not turn logging into a panic.
pub fn stderr_line(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// UTC time as RFC 3339 with milliseconds, without pulling a date crate.
pub fn rfc3339_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_rfc3339(d.as_secs() as i64, d.subsec_millis())
}

pub fn format_rfc3339(secs: i64, millis: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339(1_796_000_000, 5), "2026-11-30T00:53:20.005Z");
        assert_eq!(format_rfc3339(951_782_400, 0), "2000-02-29T00:00:00.000Z");
    }

    /// A fresh directory, removed with the returned guard.
    fn tmp(tag: &str) -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::Builder::new()
            .prefix(&format!("podgate-log-{tag}-"))
            .tempdir()
            .unwrap();
        let d = t.path().to_path_buf();
        (t, d)
    }

    fn lines(p: &Path) -> Vec<String> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The line is what a Map of the same fields printed, later keys
    /// replacing earlier ones.
    #[test]
    fn line_is_the_map_layout() {
        let log = Logger::new("p", None)
            .with("cmd", "ADD")
            .with("zeta", json!({"b": [1, "x\"y"]}))
            .with("msg", "base msg loses");
        let fields = json!({"cmd": "DEL", "a": 1.5, "level": "x"});
        let got = log.line(Level::Warn, "m\n", "T", &fields);
        let mut want = log.base.clone();
        want.insert("ts".into(), "T".into());
        want.insert("level".into(), "warn".into());
        want.insert("msg".into(), "m\n".into());
        want.extend(fields.as_object().unwrap().clone());
        assert_eq!(got, Value::Object(want).to_string());
    }

    #[test]
    fn level_filters_lines() {
        let (_tmp, d) = tmp("level");
        let f = d.join("x.log");
        let t = Telemetry {
            log_level: Level::Warn,
            ..Telemetry::default()
        };
        let log = Logger::new("p", Some(&f)).limits(&t);
        log.debug("d", json!({}));
        log.info("i", json!({}));
        log.warn("w", json!({}));
        log.error("e", json!({}));
        let got: Vec<String> = lines(&f)
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["msg"].to_string())
            .collect();
        assert_eq!(got, vec!["\"w\"", "\"e\""]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn settings_parse_and_refuse_tiny_limits() {
        let t: Telemetry = serde_json::from_value(json!({})).unwrap();
        assert_eq!(t, Telemetry::default());
        let t: Telemetry =
            serde_json::from_value(json!({"logLevel": "debug", "logMaxBytes": 8192})).unwrap();
        assert_eq!((t.log_level, t.log_max_bytes), (Level::Debug, 8192));
        assert!(serde_json::from_value::<Telemetry>(json!({"logMaxBytes": 10})).is_err());
        assert!(serde_json::from_value::<Telemetry>(json!({"logLevel": "loud"})).is_err());
    }

    /// Threads with their own descriptors contend on flock exactly as
    /// processes do. With room for everything in the file plus one rotated
    /// copy, every line must be found exactly once, whole.
    #[test]
    fn concurrent_rotation_loses_and_duplicates_nothing() {
        let (_tmp, d) = tmp("rotate");
        let f = d.join("x.log");
        // Almost full: the first appends of every thread race to rotate.
        const LIMIT: u64 = 24 * 1024;
        let filler = "p".repeat(LIMIT as usize - 40);
        std::fs::write(&f, format!("{filler}\n")).unwrap();
        std::thread::scope(|s| {
            for t in 0..8 {
                let f = &f;
                s.spawn(move || {
                    for i in 0..40 {
                        let line =
                            format!("{{\"t\":{t},\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(30));
                        assert_eq!(
                            append_line(f, &line, Limit::Rotate(LIMIT)).unwrap(),
                            Appended::Written
                        );
                    }
                });
            }
        });
        let mut all = lines(&rotated_path(&f));
        assert!(all == vec![filler], "rotated exactly once, the filler only");
        all = lines(&f);
        assert_eq!(all.len(), 320);
        let mut seen = std::collections::BTreeSet::new();
        for l in &all {
            let v: Value = serde_json::from_str(l).unwrap();
            assert!(
                seen.insert((v["t"].as_u64(), v["i"].as_u64())),
                "duplicate {l}"
            );
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn drop_limit_never_creates_and_drops_when_full() {
        let (_tmp, d) = tmp("drop");
        let f = d.join("events");
        assert_eq!(
            append_line(&f, "a", Limit::Drop(10)).unwrap(),
            Appended::Absent
        );
        assert!(!f.exists());
        std::fs::write(&f, "").unwrap();
        assert_eq!(
            append_line(&f, "12345678", Limit::Drop(10)).unwrap(),
            Appended::Written
        );
        assert_eq!(
            append_line(&f, "12345678", Limit::Drop(10)).unwrap(),
            Appended::Dropped
        );
        assert_eq!(lines(&f), vec!["12345678"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn small_limit_keeps_one_copy() {
        let (_tmp, d) = tmp("small");
        let f = d.join("x.log");
        for i in 0..100 {
            append_line(&f, &format!("{i:0>100}"), Limit::Rotate(MIN_MAX_BYTES)).unwrap();
        }
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        assert!(size(&f) <= MIN_MAX_BYTES && size(&rotated_path(&f)) <= MIN_MAX_BYTES);
        assert_eq!(lines(&f).last().unwrap(), &format!("{:0>100}", 99));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A name planted where the log goes (the directory may be one a
    /// container writes): a link is never written through (nor its
    /// missing target created), a FIFO never blocks, a hard link to
    /// another file is not appended to; each is an error (the caller
    /// writes the line to stderr).
    #[test]
    fn a_link_fifo_or_hard_link_at_the_log_is_refused_and_its_target_untouched() {
        let (_tmp, d) = tmp("planted");
        let target = d.join("target");
        std::fs::write(&target, "keep\n").unwrap();
        let link = d.join("link.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dangling = d.join("dangling.log");
        std::os::unix::fs::symlink(d.join("created"), &dangling).unwrap();
        let fifo = d.join("fifo.log");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let hard = d.join("hard.log");
        std::fs::hard_link(&target, &hard).unwrap();
        for (f, limit) in [
            (&link, Limit::Rotate(DEFAULT_MAX_BYTES)),
            (&link, Limit::Drop(MAX)),
            (&dangling, Limit::Rotate(DEFAULT_MAX_BYTES)),
            (&fifo, Limit::Rotate(DEFAULT_MAX_BYTES)),
            (&hard, Limit::Rotate(DEFAULT_MAX_BYTES)),
            (&hard, Limit::Drop(MAX)),
        ] {
            let started = std::time::Instant::now();
            let e = append_line(f, "line", limit).unwrap_err();
            assert!(started.elapsed() < Duration::from_secs(1), "{f:?} blocked");
            // A FIFO without a reader: ENXIO at the non-blocking open.
            let msg = e.to_string();
            assert!(
                msg.contains("symbolic link")
                    || msg.contains("regular")
                    || msg.contains("hard link")
                    || e.raw_os_error() == Some(libc::ENXIO),
                "{f:?}: {msg}"
            );
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n");
        assert!(!d.join("created").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
    const MAX: u64 = 1 << 20;
}
