//! What the installer wrote: one record per conf-dir file it wrote, holding
//! the exact text written. podgate's own conflist's record names the primary
//! it was rendered from. Records of files an earlier podgate chained in place
//! also hold the primary's original text: they are given back by restoring
//! the original while the file still holds exactly what was written, else by
//! removing podgate's entries and keeping everything else.

use super::fsx;
use crate::Error;
use podgate_kit::fs::{self as kfs, FileLock, LockFile};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Held while a pass runs (an exclusive `flock` on `<state-dir>/.lock`).
pub type StateLock = FileLock;

/// Bound on waiting for another installer's pass. A pass takes
/// milliseconds (it rewrites a few small files); a peer holding the lock
/// this long is wedged, and an error naming the lock file tells the
/// operator more than a by-hand `podgate install` hanging forever.
const LOCK_WAIT: Duration = Duration::from_secs(120);

const SUFFIX: &str = ".podgate-backup";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    /// The chained conflist's file name in the conf dir.
    pub file: String,
    /// Exactly what the installer wrote there.
    pub written: String,
    /// The primary's bytes before podgate touched them (the `.conf`'s for a
    /// conversion). None when the file already held podgate entries.
    pub original: Option<String>,
    /// The single-plugin `.conf` this conflist was converted from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converted_from: Option<String>,
    /// For podgate's own conflist: the primary's file it was rendered from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendered_from: Option<String>,
}

/// The `--state-dir`: `<file>.podgate-backup` JSON records.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    pub fn new(dir: &Path) -> StateDir {
        StateDir { dir: dir.into() }
    }

    fn path_of(&self, file: &str) -> PathBuf {
        self.dir.join(format!("{file}{SUFFIX}"))
    }

    pub fn load(&self, file: &str) -> Result<Option<Backup>, Error> {
        let path = self.path_of(file);
        let Some(bytes) = fsx::read_opt(&path)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| Error::StateCorrupt { path, source })
    }

    pub fn save(&self, b: &Backup) -> Result<(), Error> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io("creating", &self.dir, e))?;
        let path = self.path_of(&b.file);
        let text = serde_json::to_vec_pretty(b).map_err(|source| Error::StateCorrupt {
            path: path.clone(),
            source,
        })?;
        fsx::atomic_write(&path, &text, 0o600)?;
        Ok(())
    }

    /// Serialise install/uninstall passes of concurrent installers (the
    /// DaemonSet's watcher and a by-hand run) on this node; released on drop.
    pub fn lock(&self) -> Result<StateLock, Error> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io("creating", &self.dir, e))?;
        Ok(kfs::lock(
            &self.dir.join(".lock"),
            LOCK_WAIT,
            LockFile::Kept,
        )?)
    }

    pub fn remove(&self, file: &str) -> Result<(), Error> {
        fsx::remove(&self.path_of(file))?;
        Ok(())
    }

    /// Every record, by file name. A missing state dir holds none.
    pub fn list(&self) -> Result<Vec<Backup>, Error> {
        let names = match fsx::list_files(&self.dir) {
            Ok(n) => n,
            Err(e) if e.not_found() => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for name in names {
            if let Some(file) = name.strip_suffix(SUFFIX) {
                if let Some(b) = self.load(file)? {
                    out.push(b);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_saved_loads_back_lists_and_is_gone_once_removed() {
        let d = std::env::temp_dir().join(format!("podgate-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let s = StateDir::new(&d.join("installer"));
        assert!(s.list().unwrap().is_empty());
        let b = Backup {
            file: "10-x.conflist".into(),
            written: "w".into(),
            original: Some("o".into()),
            converted_from: None,
            rendered_from: None,
        };
        s.save(&b).unwrap();
        assert_eq!(s.load("10-x.conflist").unwrap(), Some(b.clone()));
        assert_eq!(s.list().unwrap(), vec![b]);
        s.remove("10-x.conflist").unwrap();
        assert!(s.list().unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
