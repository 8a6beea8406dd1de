//! When the runtime served pods with podgate's chain, as the installer's
//! watch (`install --watch`, its one writer) saw it:
//! the time evidence for sandboxes that started without the chain (a
//! sandbox created before the chain was first seen loaded, or inside a
//! period it was seen missing, may lack podgate; one created while it was
//! loaded went through it).
//!
//! Kept in `<state dir>/runtime-chain.json` (format version 1, written
//! atomically on every change) so that it survives the installer's restarts.
//! The node agent only reads it (adoption, unguarded sandboxes): the watch
//! asks the runtime on every conf dir change and rechecks within 0.5 s
//! while the chain is not loaded, so its times bound a change far tighter
//! than the agent's collection interval would.
//! It is per boot: sandboxes do not survive a reboot, so a record of another
//! boot (by `/proc/sys/kernel/random/boot_id`) is started afresh. Times are
//! Unix nanoseconds, as CRI's `createdAt`.

use super::fsx;
use super::Error;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const FILE: &str = "runtime-chain.json";
const VERSION: u32 = 1;
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct History {
    pub version: u32,
    pub boot_id: String,
    /// When the installer first saw the runtime's loaded network carry podgate's
    /// entries; None: not yet this boot.
    pub first_loaded: Option<u64>,
    /// Periods after `first_loaded` in which it was seen missing.
    pub missing: Vec<Missing>,
}

/// A period, after `first_loaded`, in which the chain was seen missing. It
/// may have begun any time after `last_seen_loaded`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Missing {
    pub last_seen_loaded: u64,
    pub first_seen_missing: u64,
    /// None while it is still missing.
    pub seen_loaded_again: Option<u64>,
}

impl History {
    fn fresh(boot_id: &str) -> History {
        History {
            version: VERSION,
            boot_id: boot_id.into(),
            first_loaded: None,
            missing: Vec::new(),
        }
    }

    /// Takes in one observation at `now`; `last_seen` is when this watch
    /// last saw the chain loaded (None after a restart: the record's own
    /// last known loaded time is used). Whether the record changed.
    pub fn observe(&mut self, loaded: bool, now: u64, last_seen: Option<u64>) -> bool {
        let open = self
            .missing
            .last_mut()
            .filter(|m| m.seen_loaded_again.is_none());
        match (loaded, self.first_loaded, open) {
            (true, None, _) => self.first_loaded = Some(now),
            (true, Some(_), Some(m)) => m.seen_loaded_again = Some(now),
            (false, Some(first), None) => {
                let known = self
                    .missing
                    .last()
                    .and_then(|m| m.seen_loaded_again)
                    .unwrap_or(first);
                self.missing.push(Missing {
                    last_seen_loaded: last_seen.unwrap_or(known).max(known),
                    first_seen_missing: now,
                    seen_loaded_again: None,
                });
            }
            _ => return false,
        }
        true
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
    /// version's record starts afresh (a corrupt one is an error: the
    /// evidence is not silently dropped).
    pub fn load(&self) -> Result<History, Error> {
        let Some(bytes) = fsx::read_opt(&self.path)? else {
            return Ok(History::fresh(&self.boot_id));
        };
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| self.corrupt(e.to_string()))?;
        let same_boot = v.get("bootId").and_then(|b| b.as_str()) == Some(self.boot_id.as_str());
        let same_version = v.get("version").and_then(|b| b.as_u64()) == Some(u64::from(VERSION));
        if !(same_boot && same_version) {
            return Ok(History::fresh(&self.boot_id));
        }
        serde_json::from_value(v).map_err(|e| self.corrupt(e.to_string()))
    }

    pub fn save(&self, h: &History) -> Result<(), Error> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
        }
        let text = serde_json::to_vec_pretty(h).map_err(|e| self.corrupt(e.to_string()))?;
        fsx::atomic_write(&self.path, &text, 0o644)
    }

    fn corrupt(&self, msg: String) -> Error {
        Error::Watch(format!("{}: {msg}", self.path.display()))
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

    #[test]
    fn the_first_loaded_time_stays_and_missing_periods_open_and_close() {
        let mut h = History::fresh("b");
        assert!(
            !h.observe(false, 5, None),
            "missing before ever loaded: nothing to add"
        );
        assert!(h.observe(true, 10, None));
        assert!(!h.observe(true, 20, Some(10)), "still loaded: no write");
        assert_eq!(h.first_loaded, Some(10));
        assert!(h.observe(false, 30, Some(20)));
        assert!(!h.observe(false, 35, Some(20)), "one period per gap");
        assert!(h.observe(true, 40, Some(20)));
        assert_eq!(
            h.missing,
            [Missing {
                last_seen_loaded: 20,
                first_seen_missing: 30,
                seen_loaded_again: Some(40)
            }]
        );
        // After a restart the watch knows no last-seen time of its own: the
        // period may have begun when the record last saw it loaded.
        assert!(h.observe(false, 50, None));
        assert_eq!(h.missing[1].last_seen_loaded, 40);
        assert_eq!(h.first_loaded, Some(10));
    }

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("podgate-history-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn the_record_survives_a_restart_and_another_boots_record_starts_afresh() {
        let dir = tmp("file");
        let f = HistoryFile::new(&dir).unwrap();
        let mut h = f.load().unwrap();
        assert_eq!(h.first_loaded, None);
        h.observe(true, 7, None);
        f.save(&h).unwrap();
        assert_eq!(HistoryFile::new(&dir).unwrap().load().unwrap(), h);
        let text = std::fs::read_to_string(dir.join(FILE)).unwrap();
        assert!(
            text.contains("\"version\": 1") && text.contains("\"firstLoaded\": 7"),
            "{text}"
        );

        let other = HistoryFile {
            path: dir.join(FILE),
            boot_id: "another-boot".into(),
        };
        assert_eq!(other.load().unwrap().first_loaded, None);
        std::fs::write(dir.join(FILE), b"{not json").unwrap();
        assert!(f.load().is_err(), "corrupt evidence is an error");
    }
}
