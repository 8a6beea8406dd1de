//! What the installer wrote: one record per conf-dir file it wrote, holding
//! the exact text written. podgate's own conflist's record names the primary
//! it was rendered from. Records of files an earlier podgate chained in place
//! also hold the primary's original text: they are given back by restoring
//! the original while the file still holds exactly what was written, else by
//! removing podgate's entries and keeping everything else.

use super::chain::{converted_name, kind_of, Kind};
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

/// A name the installer writes in the conf dir: a file name (no path, not
/// hidden) that a runtime would load.
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\0'])
        && kind_of(name).is_some()
}

/// Why an installer record is refused: it names a conf-dir file the
/// installer could not have written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordRefusal {
    #[error("its file {file:?} is not the one its name says ({key:?})")]
    NotItsName { file: String, key: String },
    #[error("file {0:?} is not a plain .conflist name of the conf dir")]
    NotPlainConflist(String),
    #[error(
        "convertedFrom {conf:?} is not the plain .conf or .json name {file:?} is converted from"
    )]
    BadConvertedFrom { conf: String, file: String },
    #[error("renderedFrom {0:?} is not a plain file name of the conf dir")]
    BadRenderedFrom(String),
}

impl Backup {
    /// The record, kept under `key`, names only conf-dir files the
    /// installer could have written: `file` is `key`, a plain `.conflist`
    /// name; `convertedFrom` the plain `.conf`/`.json` it was converted
    /// from (`file` being its conversion's name); `renderedFrom` a plain
    /// name. Records are joined to the conf dir's path, so a `../` or an
    /// absolute name would make the installer write outside it.
    pub fn check(&self, key: &str) -> Result<(), RecordRefusal> {
        if self.file != key {
            return Err(RecordRefusal::NotItsName {
                file: self.file.clone(),
                key: key.into(),
            });
        }
        if !plain(&self.file) || kind_of(&self.file) != Some(Kind::List) {
            return Err(RecordRefusal::NotPlainConflist(self.file.clone()));
        }
        if let Some(conf) = &self.converted_from {
            if !plain(conf)
                || kind_of(conf) != Some(Kind::Single)
                || converted_name(conf) != self.file
            {
                return Err(RecordRefusal::BadConvertedFrom {
                    conf: conf.clone(),
                    file: self.file.clone(),
                });
            }
        }
        if let Some(from) = &self.rendered_from {
            if !plain(from) {
                return Err(RecordRefusal::BadRenderedFrom(from.clone()));
            }
        }
        Ok(())
    }
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

    /// The record of conf-dir file `file`; one naming a file the installer
    /// could not have written is refused ([`Backup::check`]).
    pub fn load(&self, file: &str) -> Result<Option<Backup>, Error> {
        let path = self.path_of(file);
        let Some(bytes) = fsx::read_opt(&path)? else {
            return Ok(None);
        };
        let b: Backup = serde_json::from_slice(&bytes).map_err(|source| Error::StateCorrupt {
            path: path.clone(),
            source,
        })?;
        b.check(file)
            .map_err(|why| Error::RecordRefused { path, why })?;
        Ok(Some(b))
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

    /// Once no record is left (uninstalled): remove the lock and the
    /// runtime's history, keeping the dir itself (it may be a mount
    /// point). Whether it was emptied.
    pub fn purge_unless_records(&self) -> Result<bool, Error> {
        if !self.list()?.is_empty() {
            return Ok(false);
        }
        fsx::remove(&self.dir.join(crate::history::FILE))?;
        if let Ok(dir) = podgate_kit::dir::Dir::open(&self.dir) {
            kfs::remove_orphaned_lock(&dir, ".lock");
        }
        Ok(true)
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
        let (_tmp, d) = crate::testing::scratch_dir("podgate-state-");
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

    fn record(file: &str, converted_from: Option<&str>, rendered_from: Option<&str>) -> Backup {
        Backup {
            file: file.into(),
            written: "w".into(),
            original: Some("o".into()),
            converted_from: converted_from.map(String::from),
            rendered_from: rendered_from.map(String::from),
        }
    }

    #[test]
    fn a_record_names_only_plain_files_the_installer_could_have_written() {
        for ok in [
            record("00-podgate.conflist", None, Some("10-calico.conflist")),
            record("10-x.conflist", None, None),
            record("10-x.conflist", Some("10-x.conf"), None),
            record("10-x.conflist", Some("10-x.json"), None),
        ] {
            assert_eq!(ok.check(&ok.file.clone()), Ok(()), "{ok:?}");
        }
        let refused = [
            (record("10-x.conflist", None, None), "10-y.conflist"),
            (record("../10-x.conflist", None, None), "../10-x.conflist"),
            (
                record("/etc/cni/net.d/10-x.conflist", None, None),
                "/etc/cni/net.d/10-x.conflist",
            ),
            (record(".10-x.conflist", None, None), ".10-x.conflist"),
            (record("10-x.conf", None, None), "10-x.conf"),
            (record("10-x", None, None), "10-x"),
            (
                record("10-x.conflist", Some("../../../opt/cni/bin/bridge"), None),
                "10-x.conflist",
            ),
            (
                record("10-x.conflist", Some("00-other.conf"), None),
                "10-x.conflist",
            ),
            (
                record("10-x.conflist", Some("10-x.conflist"), None),
                "10-x.conflist",
            ),
            (
                record("00-podgate.conflist", None, Some("../10-calico.conflist")),
                "00-podgate.conflist",
            ),
        ];
        for (b, key) in refused {
            assert!(b.check(key).is_err(), "{key}: {b:?}");
        }
    }

    #[test]
    fn a_refused_record_fails_the_load_naming_the_rule() {
        let (_tmp, d) = crate::testing::scratch_dir("podgate-state-refused-");
        let forged = record("10-x.conflist", Some("../../../opt/cni/bin/bridge"), None);
        std::fs::write(
            d.join("10-x.conflist.podgate-backup"),
            serde_json::to_vec(&forged).unwrap(),
        )
        .unwrap();
        let e = StateDir::new(&d).list().unwrap_err().to_string();
        assert!(
            e.contains("convertedFrom") && e.contains("refusing it"),
            "{e}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
