//! When the runtime served pods with podgate's chain, as the installer's
//! watch (`install --watch`, its one writer) saw it: the time evidence for
//! sandboxes that started without podgate-router (adoption) and without an
//! enforcing tunnel guard (the unguarded count and its repair).
//!
//! Two series, each kept the same way: `router`, whether the network the
//! runtime loaded had podgate-router in it, and `guard`, whether it had a
//! podgate-tunnel-guard that enforces (`mode: enforce`, `required` not
//! `never`: a guard in audit mode, or absent, or a chain with only the
//! router, checked no pod). Each holds when it was first seen served and
//! the periods it was seen not served.
//!
//! **Evidence is an observation.** A sandbox may lack the router (or the
//! guard) only if it was created inside a period the watch saw the runtime
//! serve a network without it: after the last time before that it saw it
//! served, before it saw it served again. A history the watch has not
//! observed anything into (a missing file, another boot's, another
//! version's) says nothing, and nothing is a candidate, unguarded or
//! repaired until an observation is made; an observation that the chain is
//! served says nothing about the sandboxes created before it. The one
//! period that reaches back to the boot is opened by a watch that found
//! podgate's own conflist absent from the conf dir when it started (a
//! newly joined node, a conf dir that did not survive the reboot): no
//! runtime serves a chain from a file that does not exist.
//!
//! Kept in `<state dir>/runtime-chain.json` (format version 2, written
//! atomically on every change) so that it survives the installer's
//! restarts. The node agent only reads it: the watch asks the runtime on
//! every conf dir change and rechecks within 0.5 s while the chain is not
//! loaded, so its times bound a change far tighter than the agent's
//! collection interval would. It is per boot: sandboxes do not survive a
//! reboot, so a record of another boot (by
//! `/proc/sys/kernel/random/boot_id`) starts afresh. Times are Unix
//! nanoseconds, as CRI's `createdAt`.

use super::fsx;
use super::Error;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const FILE: &str = "runtime-chain.json";
const VERSION: u32 = 2;
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct History {
    pub version: u32,
    pub boot_id: String,
    /// podgate-router in the network the runtime served.
    pub router: Series,
    /// An enforcing podgate-tunnel-guard in the network the runtime served.
    pub guard: Series,
}

/// When one thing was seen in the network the runtime served, and when not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Series {
    /// When it was first seen served; None: not yet in this history.
    pub first_loaded: Option<u64>,
    /// Periods it was seen not served.
    pub missing: Vec<Missing>,
}

/// A period in which it was seen not served. It may have begun any time
/// after `last_seen_loaded`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Missing {
    /// None: since the boot (podgate's conflist was absent when the watch
    /// began this history).
    pub last_seen_loaded: Option<u64>,
    pub first_seen_missing: u64,
    /// None while it is still missing.
    pub seen_loaded_again: Option<u64>,
}

/// What one look at the runtime's loaded network showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub router: bool,
    /// A podgate-tunnel-guard that enforces.
    pub guard: bool,
}

impl Series {
    /// Anything observed at all (else: no evidence either way).
    pub fn observed(&self) -> bool {
        self.first_loaded.is_some() || !self.missing.is_empty()
    }

    /// Seen served at the last observation.
    pub fn served_now(&self) -> bool {
        self.first_loaded.is_some() && self.missing.iter().all(|m| m.seen_loaded_again.is_some())
    }

    /// Whether a sandbox created at `created` (Unix ns) may have been wired
    /// without it: created inside a period it was seen not served.
    pub fn lacked(&self, created: i64) -> bool {
        let Ok(created) = u64::try_from(created) else {
            return false;
        };
        self.missing.iter().any(|m| {
            m.last_seen_loaded.is_none_or(|l| l < created)
                && m.seen_loaded_again.is_none_or(|again| created < again)
        })
    }

    /// Takes in one observation at `now`; `last_seen` is when this watch
    /// last saw it served (None after a restart: the record's own last
    /// known served time is used; none either: `now`, nothing before is
    /// known). Whether the record changed.
    pub fn observe(&mut self, served: bool, now: u64, last_seen: Option<u64>) -> bool {
        let open = self
            .missing
            .last_mut()
            .filter(|m| m.seen_loaded_again.is_none());
        match (served, open) {
            (true, Some(m)) => {
                m.seen_loaded_again = Some(now);
                self.first_loaded.get_or_insert(now);
            }
            (true, None) if self.first_loaded.is_none() => self.first_loaded = Some(now),
            (false, None) => {
                let known = self
                    .missing
                    .last()
                    .and_then(|m| m.seen_loaded_again)
                    .or(self.first_loaded)
                    .unwrap_or(now);
                self.missing.push(Missing {
                    last_seen_loaded: Some(last_seen.unwrap_or(known).max(known)),
                    first_seen_missing: now,
                    seen_loaded_again: None,
                });
            }
            _ => return false,
        }
        true
    }

    /// The first observation of a watch that found podgate's conflist
    /// absent: not served since the boot. Nothing if already observed.
    fn absent_since_boot(&mut self, now: u64) -> bool {
        if self.observed() {
            return false;
        }
        self.missing.push(Missing {
            last_seen_loaded: None,
            first_seen_missing: now,
            seen_loaded_again: None,
        });
        true
    }
}

impl History {
    fn fresh(boot_id: &str) -> History {
        History {
            version: VERSION,
            boot_id: boot_id.into(),
            router: Series::default(),
            guard: Series::default(),
        }
    }

    /// Takes in one observation at `now` into both series (`last_seen`:
    /// when this watch last saw each served). Whether the record changed.
    pub fn observe(&mut self, seen: Seen, now: u64, last_seen: LastServed) -> bool {
        let r = self.router.observe(seen.router, now, last_seen.router);
        let g = self.guard.observe(seen.guard, now, last_seen.guard);
        r || g
    }

    /// The watch found podgate's conflist absent from the conf dir when it
    /// began: a history with no observation yet records both series not
    /// served since the boot. Whether the record changed.
    pub fn absent_since_boot(&mut self, now: u64) -> bool {
        let r = self.router.absent_since_boot(now);
        let g = self.guard.absent_since_boot(now);
        r || g
    }
}

/// When the watch last saw each series served (None: not since it started).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LastServed {
    pub router: Option<u64>,
    pub guard: Option<u64>,
}

impl LastServed {
    /// After an observation at `now`.
    pub fn update(&mut self, seen: Seen, now: u64) {
        if seen.router {
            self.router = Some(now);
        }
        if seen.guard {
            self.guard = Some(now);
        }
    }
}

/// The history file of a state dir, with this boot's id.
#[derive(Debug, Clone)]
pub struct HistoryFile {
    path: PathBuf,
    boot_id: String,
}

impl HistoryFile {
    pub fn new(state_dir: &Path) -> Result<HistoryFile, Error> {
        let boot = Path::new(BOOT_ID);
        let id = std::fs::read_to_string(boot).map_err(|e| Error::io("reading", boot, e))?;
        Ok(HistoryFile {
            path: state_dir.join(FILE),
            boot_id: id.trim().to_string(),
        })
    }

    /// This boot's record; a missing file, another boot's or another
    /// version's record is a history with no observation (no evidence: see
    /// the module doc). A corrupt one is an error: the evidence is not
    /// silently dropped.
    pub fn load(&self) -> Result<History, Error> {
        let Some(bytes) = fsx::read_opt(&self.path)? else {
            return Ok(History::fresh(&self.boot_id));
        };
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| self.corrupt(e))?;
        let same_boot = v.get("bootId").and_then(|b| b.as_str()) == Some(self.boot_id.as_str());
        let same_version = v.get("version").and_then(|b| b.as_u64()) == Some(u64::from(VERSION));
        if !(same_boot && same_version) {
            return Ok(History::fresh(&self.boot_id));
        }
        serde_json::from_value(v).map_err(|e| self.corrupt(e))
    }

    pub fn save(&self, h: &History) -> Result<(), Error> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
        }
        let text = serde_json::to_vec_pretty(h).map_err(|e| self.corrupt(e))?;
        fsx::atomic_write(&self.path, &text, 0o644)
    }

    fn corrupt(&self, source: serde_json::Error) -> Error {
        Error::StateCorrupt {
            path: self.path.clone(),
            source,
        }
    }
}

/// Now, in Unix nanoseconds.
pub fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn missing(last: Option<u64>, first: u64, again: Option<u64>) -> Missing {
        Missing {
            last_seen_loaded: last,
            first_seen_missing: first,
            seen_loaded_again: again,
        }
    }

    #[test]
    fn a_series_records_when_first_served_and_each_period_not_served() {
        let mut s = Series::default();
        assert!(!s.observed() && !s.served_now());
        assert!(s.observe(true, 10, None));
        assert!(!s.observe(true, 20, Some(10)), "still served: no write");
        assert_eq!(s.first_loaded, Some(10));
        assert!(s.served_now());
        assert!(s.observe(false, 30, Some(20)));
        assert!(!s.observe(false, 35, Some(20)), "one period per gap");
        assert!(!s.served_now());
        assert!(s.observe(true, 40, Some(20)));
        assert_eq!(s.missing, [missing(Some(20), 30, Some(40))]);
        // After a restart the watch knows no last-seen time of its own: the
        // period may have begun when the record last saw it served.
        assert!(s.observe(false, 50, None));
        assert_eq!(s.missing[1].last_seen_loaded, Some(40));
        assert_eq!(s.first_loaded, Some(10));
    }

    /// A history without observations (a deleted or another version's
    /// file) is no evidence: nothing lacked anything. Seen served first,
    /// it still says nothing of what was created before.
    #[test]
    fn no_observation_and_a_first_observation_of_the_chain_served_are_no_evidence() {
        let mut s = Series::default();
        assert!(!s.lacked(5) && !s.lacked(i64::MAX));
        s.observe(true, 100, None);
        assert!(!s.lacked(5), "created before the first look: unknown");
        assert!(!s.lacked(150), "created while served");
        // Not served at the first look, podgate's file present: from then
        // on only.
        let mut t = Series::default();
        t.observe(false, 100, None);
        assert_eq!(t.missing, [missing(Some(100), 100, None)]);
        assert!(!t.lacked(50));
        assert!(t.lacked(150));
        assert!(!t.served_now());
    }

    #[test]
    fn podgates_file_absent_at_the_start_opens_a_period_back_to_the_boot() {
        let mut h = History::fresh("b");
        assert!(h.absent_since_boot(100));
        assert!(h.router.lacked(1) && h.guard.lacked(99));
        let seen = Seen {
            router: true,
            guard: false,
        };
        assert!(h.observe(seen, 200, LastServed::default()));
        assert_eq!(h.router.first_loaded, Some(200));
        assert_eq!(h.router.missing, [missing(None, 100, Some(200))]);
        assert!(h.router.lacked(150) && !h.router.lacked(250));
        assert!(h.router.served_now());
        // The guard was not in the chain served: still open.
        assert!(h.guard.lacked(250) && !h.guard.served_now());
        assert!(
            !h.absent_since_boot(300),
            "only for a history not observed yet"
        );
        assert!(!h.router.lacked(-1));
    }

    /// A path not created yet, inside a directory removed with the
    /// returned guard.
    fn tmp(tag: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let (t, d) = crate::testing::scratch_dir(&format!("podgate-history-{tag}-"));
        (t, d.join("history"))
    }

    #[test]
    fn the_record_survives_a_restart_and_another_boots_or_versions_record_is_no_evidence() {
        let (_tmp, dir) = tmp("file");
        let f = HistoryFile::new(&dir).unwrap();
        let mut h = f.load().unwrap();
        assert!(!h.router.observed() && !h.guard.observed());
        let both = Seen {
            router: true,
            guard: true,
        };
        h.observe(both, 7, LastServed::default());
        f.save(&h).unwrap();
        assert_eq!(HistoryFile::new(&dir).unwrap().load().unwrap(), h);
        let text = std::fs::read_to_string(dir.join(FILE)).unwrap();
        assert!(
            text.contains("\"version\": 2") && text.contains("\"firstLoaded\": 7"),
            "{text}"
        );

        let other = HistoryFile {
            path: dir.join(FILE),
            boot_id: "another-boot".into(),
        };
        assert!(!other.load().unwrap().router.observed());
        let v1 = format!(
            r#"{{"version": 1, "bootId": "{}", "firstLoaded": 7, "missing": []}}"#,
            f.boot_id
        );
        std::fs::write(dir.join(FILE), v1).unwrap();
        let h = f.load().unwrap();
        assert!(!h.router.observed() && !h.guard.observed(), "{h:?}");
        std::fs::write(dir.join(FILE), b"{not json").unwrap();
        match f.load() {
            Err(Error::StateCorrupt { path, source }) => {
                assert_eq!(path, dir.join(FILE));
                assert!(source.is_syntax(), "{source}");
            }
            other => panic!("corrupt evidence is an error naming the file: {other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
