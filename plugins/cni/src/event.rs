//! The event channel from the short-lived plugins to the node agent's
//! metrics (`podgate agent --metrics-address`).
//!
//! Two parts, both in files the agent owns (it creates them; a plugin never
//! does, so without the agent nothing is written):
//!
//! * `<eventFile>`: one JSON line per finished request ([`Event`]), appended
//!   with [`crate::log::append_line`] under a shared lock and dropped once the
//!   file holds [`MAX_EVENT_FILE`] bytes (the agent drains and replaces it).
//!   The agent keeps a read cursor (file id from the header line + offset)
//!   next to its counters, so a restart resumes exactly where it stopped.
//! * `<eventFile>.inflight/<id>.json`: written when a request starts and held
//!   under an exclusive `flock` for the life of the process. The kernel drops
//!   the lock when the process dies however it dies, so a file nobody holds
//!   and no finished event names is a plugin that crashed half-way.
//!
//! Everything here is best effort: a full disk, a missing or unwritable
//! channel never changes a CNI answer.
//!
//! Both live where a container writes (the agent's, by default in the
//! router's state dir), so a plugin reaches them through a handle of the
//! event file's directory opened without following a link, and follows no
//! link there: a link planted as the event file or as the in-flight
//! directory makes the plugin record nothing, never write to its target
//! (see `podgate_kit::dir`).

use crate::config::NetConf;
use crate::log::{append_line_in, dir_of, flock, rfc3339_now, Limit};
use podgate_kit::dir::{Dir, Open};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Where events go when the entry names neither `eventFile` nor `stateDir`
/// (podgate-router's default state dir).
pub const DEFAULT_EVENT_FILE: &str = "/var/lib/cni/podgate/events.jsonl";
pub const EVENT_FILE_NAME: &str = "events.jsonl";
/// Plugins stop appending past this size (about 40,000 requests): the agent
/// is not draining, and the channel must not fill the disk.
pub const MAX_EVENT_FILE: u64 = 8 << 20;
/// Version of the [`Event`] and [`Started`] line format.
pub const EVENT_VERSION: u32 = 1;

/// The event file a plugin entry writes to: `eventFile`, else
/// `<stateDir>/events.jsonl`, else [`DEFAULT_EVENT_FILE`]. The agent resolves
/// the entries of its plugins file with the same function.
pub fn file_for_entry(entry: &Value) -> PathBuf {
    let field = |k: &str| {
        entry
            .get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    if let Some(f) = field("eventFile") {
        return PathBuf::from(f);
    }
    match field("stateDir") {
        Some(d) => Path::new(d).join(EVENT_FILE_NAME),
        None => PathBuf::from(DEFAULT_EVENT_FILE),
    }
}

/// `<eventFile>.inflight`: one locked file per request in progress.
pub fn inflight_dir(event_file: &Path) -> PathBuf {
    PathBuf::from(inflight_name(event_file.as_os_str()))
}

fn inflight_name(event_file: &OsStr) -> OsString {
    let mut s = event_file.to_os_string();
    s.push(".inflight");
    s
}

/// A finished request, one line of the event file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub v: u32,
    pub id: String,
    pub ts: String,
    pub plugin: String,
    /// ADD, DEL, CHECK, STATUS, GC.
    pub command: String,
    /// `ok`, `refused` (policy, code 100; the tunnel guard's not-ready, 11),
    /// `error`.
    pub outcome: String,
    /// The CNI error code, 0 on success.
    pub code: u32,
    /// For refusals: the operator rule that refused (`allow.pools`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    pub seconds: f64,
    /// Conditions the request met that the operator should know about even
    /// when it succeeded ([`warn`]), as bounded labels (`noAnnotations`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Labels of [`warn`] for this process's request. A plugin process answers
/// one request, so its warnings are the process's; a set of `'static`
/// labels stays bounded where a long-lived process calls a plugin's code
/// (the node agent's adoption), which records no event.
static WARNINGS: std::sync::Mutex<std::collections::BTreeSet<&'static str>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Note a condition of this request for the agent's metrics
/// (`podgate_cni_warnings_total{plugin, warning}`), next to the log line
/// that explains it. `label` is one of a fixed set, camelCase.
pub fn warn(label: &'static str) {
    WARNINGS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(label);
}

fn take_warnings() -> Vec<String> {
    std::mem::take(
        &mut *WARNINGS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
    .into_iter()
    .map(str::to_string)
    .collect()
}

/// What the in-flight file holds: enough to count a crash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Started {
    pub v: u32,
    pub id: String,
    pub ts: String,
    pub plugin: String,
    pub command: String,
}

/// `(outcome, rule)` of a plugin's answer.
pub fn classify(plugin: &str, code: u32, msg: &str) -> (&'static str, Option<String>) {
    match code {
        0 => ("ok", None),
        crate::error::code::POLICY_REFUSED => ("refused", Some(refusal_rule(msg))),
        crate::error::code::TRY_AGAIN_LATER if plugin == "podgate-tunnel-guard" => {
            ("refused", Some("ipsec".into()))
        }
        _ => ("error", None),
    }
}

/// The rule a refusal names, as a bounded label: `refused by assign[2]: ...`
/// is `assign`; refusals phrased otherwise are grouped by what they concern.
pub fn refusal_rule(msg: &str) -> String {
    if let Some(rest) = msg.strip_prefix("refused by ") {
        let rule: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
            .collect();
        if !rule.is_empty() {
            return rule;
        }
    }
    if msg.starts_with("return route ") {
        return "returnRoutes".into();
    }
    if msg.starts_with("annotation ") || msg.starts_with("pool annotations") {
        return "annotations".into();
    }
    "policy".into()
}

/// A request being recorded: created at the start, finished once.
pub struct Recorder {
    /// The event file's directory and its name there.
    dir: Dir,
    name: OsString,
    id: String,
    plugin: String,
    command: String,
    started: Instant,
    /// The in-flight directory, the mark's name there, and the mark held.
    inflight: Option<(Dir, String, File)>,
}

/// Time, pid and a per-process sequence number: the agent de-duplicates by
/// id, so two requests must never share one. The clock alone is not enough:
/// two threads of one process (the agent's own tests; a future long-lived
/// caller) can read the same nanosecond, and a coarse virtual clock makes
/// that common.
fn unique_id() -> String {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "{:x}{:08x}-{}-{seq}",
        now.as_secs(),
        now.subsec_nanos(),
        std::process::id()
    )
}

impl Recorder {
    /// None when there is no channel (no agent collects metrics here).
    pub fn start(file: &Path, plugin: &str, command: &str, started: Instant) -> Option<Recorder> {
        let (dir, name) = dir_of(file, Dir::open).ok()?;
        if !dir.is_file(name) {
            return None;
        }
        let id = unique_id();
        let inflight = mark_inflight(&dir, name, &id, plugin, command);
        Some(Recorder {
            name: name.to_os_string(),
            dir,
            id,
            plugin: plugin.into(),
            command: command.into(),
            started,
            inflight,
        })
    }

    /// Record the answer (`code` 0 for success) and clear the in-flight mark.
    pub fn finish(self, code: u32, msg: &str) {
        let (outcome, rule) = classify(&self.plugin, code, msg);
        let ev = Event {
            v: EVENT_VERSION,
            id: self.id,
            ts: rfc3339_now(),
            plugin: self.plugin,
            command: self.command,
            outcome: outcome.into(),
            code,
            rule,
            seconds: self.started.elapsed().as_secs_f64(),
            warnings: take_warnings(),
        };
        if let Ok(line) = serde_json::to_string(&ev) {
            let _ = append_line_in(&self.dir, &self.name, &line, Limit::Drop(MAX_EVENT_FILE));
        }
        // After the event: a crash in between leaves a mark the agent finds
        // named by a finished event, not a crash.
        if let Some((dir, mark, _lock)) = self.inflight {
            let _ = dir.remove_file(mark);
        }
    }
}

/// Write `<inflight>/<id>.json` under an exclusive lock held until exit:
/// created under a temp name and renamed once locked and written, so the
/// agent never sees an unlocked file of a live request.
fn mark_inflight(
    dir: &Dir,
    file: &OsStr,
    id: &str,
    plugin: &str,
    command: &str,
) -> Option<(Dir, String, File)> {
    let dir = dir.sub(inflight_name(file)).ok()??;
    let tmp = format!(".tmp-{id}");
    let mark = format!("{id}.json");
    let body = serde_json::to_vec(&Started {
        v: EVENT_VERSION,
        id: id.into(),
        ts: rfc3339_now(),
        plugin: plugin.into(),
        command: command.into(),
    })
    .ok()?;
    let mut f = dir.open_file(&tmp, Open::CreateNew(0o600)).ok()?;
    let done = flock(&f, libc::LOCK_EX)
        .and_then(|()| f.write_all(&body))
        .and_then(|()| dir.rename(&tmp, &mark));
    match done {
        Ok(()) => Some((dir, mark, f)),
        Err(_) => {
            let _ = dir.remove_file(&tmp);
            None
        }
    }
}

/// The event file of this request's plugin entry.
pub fn file_for(conf: &NetConf) -> PathBuf {
    if let Some(f) = &conf.event_file {
        return PathBuf::from(f);
    }
    match &conf.state_dir {
        Some(d) => Path::new(d).join(EVENT_FILE_NAME),
        None => PathBuf::from(DEFAULT_EVENT_FILE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resolves_the_event_file_like_the_agent() {
        assert_eq!(
            file_for_entry(&json!({"eventFile": "/e/x.jsonl", "stateDir": "/s"})),
            PathBuf::from("/e/x.jsonl")
        );
        assert_eq!(
            file_for_entry(&json!({"stateDir": "/s"})),
            PathBuf::from("/s/events.jsonl")
        );
        assert_eq!(
            file_for_entry(&json!({})),
            PathBuf::from(DEFAULT_EVENT_FILE)
        );
        assert_eq!(
            inflight_dir(Path::new("/s/events.jsonl")),
            PathBuf::from("/s/events.jsonl.inflight")
        );
    }

    #[test]
    fn refusals_name_a_bounded_rule() {
        let r = |m: &str| refusal_rule(m);
        assert_eq!(r("refused by allow.pools: 10.9.0.0/24 ..."), "allow.pools");
        assert_eq!(r("refused by assign[3]: the operator ..."), "assign");
        assert_eq!(
            r("refused by maxStrictPods: this node ..."),
            "maxStrictPods"
        );
        assert_eq!(r("return route 10.8.0.0/24 refused: ..."), "returnRoutes");
        assert_eq!(r("annotation podgate.dev/masquerade: x"), "annotations");
        assert_eq!(r("something else"), "policy");
        assert_eq!(classify("podgate-router", 0, ""), ("ok", None));
        assert_eq!(classify("podgate-router", 101, "x").0, "error");
        assert_eq!(
            classify("podgate-tunnel-guard", 11, "ipsec not ready: ..."),
            ("refused", Some("ipsec".into()))
        );
        assert_eq!(classify("podgate-router", 11, "x").0, "error");
    }

    #[test]
    fn records_only_where_the_agent_made_the_channel() {
        let tmp = tempfile::Builder::new()
            .prefix("podgate-event-")
            .tempdir()
            .unwrap();
        let d = tmp.path().to_path_buf();
        let f = d.join(EVENT_FILE_NAME);
        assert!(Recorder::start(&f, "p", "ADD", Instant::now()).is_none());
        std::fs::write(&f, "").unwrap();
        std::fs::create_dir_all(inflight_dir(&f)).unwrap();
        let r = Recorder::start(&f, "p", "ADD", Instant::now()).unwrap();
        let marks: Vec<_> = std::fs::read_dir(inflight_dir(&f)).unwrap().collect();
        assert_eq!(marks.len(), 1);
        // Held: another open file description cannot take the lock.
        let path = marks[0].as_ref().unwrap().path();
        let other = File::open(&path).unwrap();
        assert!(matches!(
            other.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        r.finish(100, "refused by allow.pools: no");
        assert!(!path.exists());
        let ev: Event = serde_json::from_str(std::fs::read_to_string(&f).unwrap().trim()).unwrap();
        assert_eq!(
            (ev.outcome.as_str(), ev.rule.as_deref(), ev.command.as_str()),
            ("refused", Some("allow.pools"), "ADD")
        );
        assert!(ev.warnings.is_empty());
        // A warning goes out with the request's event, once.
        std::fs::write(&f, "").unwrap();
        let r = Recorder::start(&f, "p", "ADD", Instant::now()).unwrap();
        warn("noAnnotations");
        warn("noAnnotations");
        r.finish(0, "");
        let r = Recorder::start(&f, "p", "DEL", Instant::now()).unwrap();
        r.finish(0, "");
        let lines: Vec<Event> = std::fs::read_to_string(&f)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0].warnings, vec!["noAnnotations".to_string()]);
        assert!(lines[1].warnings.is_empty());
        // Lines of agents and plugins without the field read as none.
        let old: Event = serde_json::from_str(
            r#"{"v":1,"id":"x","ts":"t","plugin":"p","command":"ADD","outcome":"ok","code":0,"seconds":0.1}"#,
        )
        .unwrap();
        assert!(old.warnings.is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A container that can write the state dir plants links: as the
    /// event file (to a file of the node) and as the in-flight directory
    /// (to a directory of the node). The plugin records nothing there and
    /// writes nothing to either target.
    #[test]
    fn links_planted_as_the_channel_are_never_written_through() {
        let tmp = tempfile::Builder::new()
            .prefix("podgate-event-links-")
            .tempdir()
            .unwrap();
        let d = tmp.path().to_path_buf();
        let (state, node) = (d.join("state"), d.join("node"));
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(node.join("etc")).unwrap();
        let target = node.join("etc/passwd");
        std::fs::write(&target, "root:x:0:0\n").unwrap();
        let f = state.join(EVENT_FILE_NAME);
        std::os::unix::fs::symlink(&target, &f).unwrap();
        std::fs::create_dir_all(inflight_dir(&f)).unwrap();
        assert!(Recorder::start(&f, "p", "ADD", Instant::now()).is_none());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "root:x:0:0\n");

        // A real event file, its in-flight directory a link.
        std::fs::remove_file(&f).unwrap();
        std::fs::write(&f, "").unwrap();
        std::fs::remove_dir(inflight_dir(&f)).unwrap();
        std::os::unix::fs::symlink(node.join("etc"), inflight_dir(&f)).unwrap();
        let r = Recorder::start(&f, "p", "ADD", Instant::now()).unwrap();
        r.finish(0, "");
        let in_etc: Vec<_> = std::fs::read_dir(node.join("etc")).unwrap().collect();
        assert_eq!(in_etc.len(), 1, "no mark written through the link");
        assert_eq!(std::fs::read_to_string(&f).unwrap().lines().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
