//! The installer's one error type: file system, installer state, conflists,
//! the plugins file and the run itself. Every message names the file or
//! flag it is about.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O failure with what was being done to which path.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("installer state {}: {source}", path.display())]
    StateCorrupt {
        path: PathBuf,
        source: serde_json::Error,
    },

    // A CNI config file that is not chained (refused untouched).
    #[error("{file} is not valid JSON ({source}); refusing to touch it")]
    ConfNotJson {
        file: String,
        source: serde_json::Error,
    },
    #[error("{file} is not a JSON object; refusing to touch it")]
    ConfNotObject { file: String },
    #[error("{file} has no plugins (a conflist needs a non-empty \"plugins\" array); refusing to touch it")]
    NoPlugins { file: String },
    #[error("{file}: plugins[{index}] is not an object; refusing to touch it")]
    PluginNotObject { file: String, index: usize },
    #[error("{file} has no \"type\": not a single-plugin config; refusing to touch it")]
    NoType { file: String },
    #[error("{file} has only podgate plugins: there is no primary network to chain after")]
    OnlyPodgate { file: String },
    #[error("{file}: cniVersion {version:?}; chaining needs 0.3.0 or later")]
    OldVersion { file: String, version: String },

    // podgate's entries (the `--plugins` file).
    #[error("plugins file is not valid JSON: {0}")]
    EntriesNotJson(serde_json::Error),
    #[error("plugins file must hold an array of plugin objects (or an object with \"plugins\")")]
    EntriesShape,
    #[error("plugins file: entry {index} is not an object with a \"type\"")]
    EntryNoType { index: usize },
    #[error("plugins file: entry {index} has type {ty:?}; only podgate-* plugins may be chained by the installer (they are what it removes again)")]
    EntryNotPodgate { index: usize, ty: String },
    #[error("plugins file lists no plugin")]
    EntriesEmpty,
    #[error("plugins[{index}] ({ty}): {msg}")]
    EntryInvalid {
        index: usize,
        ty: String,
        msg: String,
    },
    #[error(
        "plugins[{index}]: unknown podgate plugin type {ty:?} (known: {}, {})",
        crate::validate::ROUTER,
        crate::validate::TUNNEL_GUARD
    )]
    EntryUnknownType { index: usize, ty: String },

    // The run.
    #[error("plugins file {}: {msg}", path.display())]
    PluginsFile { path: PathBuf, msg: String },
    /// Under Kubernetes: the `podgate-plugins` ConfigMap (mounted optional)
    /// has not been applied yet.
    #[error("plugins file {} missing: apply podgate-config.yaml (the podgate-plugins ConfigMap) or pass --plugins", .0.display())]
    PluginsFileMissing(PathBuf),
    #[error("no CNI config (*.conflist, *.conf, *.json) in {}: the primary CNI has not written one yet", .0.display())]
    NoPrimary(PathBuf),
    #[error("--primary {name}: no such file in {}", dir.display())]
    PrimaryMissing { name: String, dir: PathBuf },
    #[error("--primary {0:?}: give a file name inside --cni-conf-dir")]
    BadPrimary(String),
    #[error("{0} vanished while being read (its writer is replacing it)")]
    Vanished(String),
    #[error("encoding JSON: {0}")]
    Encode(serde_json::Error),
    #[error("--source-dir not given and this executable's directory is unknown: {0}")]
    SourceDir(std::io::Error),
    #[error("not chained: {0}")]
    NotChained(String),
    #[error("not uninstalled: {0} left")]
    NotUninstalled(String),
    #[error("--conflist-name {0:?}: give a file name ending in .conflist (no path, not hidden)")]
    BadConflistName(String),
    #[error("podgate's {own} would not be loaded first: the primary {primary} sorts before it; pass --conflist-name with a name that sorts earlier")]
    SortsAfter { own: String, primary: String },
    #[error("{0} exists and was not written by podgate; pass another --conflist-name")]
    OwnTaken(String),
    /// A system call of one of the long-running commands (signalfd, poll,
    /// inotify, a thread, a runtime, a listener).
    #[error("{daemon}: {what}: {source}")]
    Sys {
        daemon: Daemon,
        what: &'static str,
        source: std::io::Error,
    },
    /// The watched conf dir itself was removed or moved.
    #[error("watch: {} went away (inotify mask {mask:#x}); exiting so the watcher restarts on the new directory", dir.display())]
    ConfDirGone { dir: PathBuf, mask: u32 },
    /// The agent's metrics counters could not be loaded.
    #[error("agent: {0}")]
    Spool(#[from] crate::metrics::events::SpoolError),
    /// What failed in one agent pass (adoption, repair, sweep), each named.
    #[error("agent: {}", .0.join("; "))]
    PassFailed(Vec<String>),
    #[error("agent: --metrics-address is required without --once")]
    NoMetricsAddress,
    #[error("agent: --metrics-address {addr}: {source}")]
    MetricsBind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    /// The agent repairs unguarded sandboxes by the installer's history,
    /// which is not there.
    #[error("agent: {} does not exist: no installer (install --watch) recorded when the runtime served the chain there", .0.display())]
    NoHistory(PathBuf),
    /// A CRI call of the agent or the CRI proxy.
    #[error("{daemon}: {source}")]
    Cri {
        daemon: Daemon,
        source: podgate_cri::CriError,
    },
    /// An installer record that names a file the installer could not have
    /// written (not a plain file name of the conf dir, or not the one its
    /// own file name says).
    #[error("installer record {}: {why}; refusing it", path.display())]
    RecordRefused {
        path: PathBuf,
        why: crate::state::RecordRefusal,
    },
    /// Any other failure of a kit call (file errors become [`Error::Io`]).
    #[error(transparent)]
    Kit(podgate_kit::Error),
}

/// The long-running command an [`Error::Sys`] or [`Error::Cri`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemon {
    Watch,
    Agent,
    Broker,
    CriProxy,
}

impl std::fmt::Display for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Daemon::Watch => "watch",
            Daemon::Agent => "agent",
            Daemon::Broker => "sysctl broker",
            Daemon::CriProxy => "CRI proxy",
        })
    }
}

impl From<podgate_kit::Error> for Error {
    fn from(e: podgate_kit::Error) -> Error {
        match e {
            podgate_kit::Error::File { op, path, source } => Error::Io { op, path, source },
            other => Error::Kit(other),
        }
    }
}

impl Error {
    /// A failed system call of `daemon`.
    pub fn sys(daemon: Daemon, what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
        move |source| Error::Sys {
            daemon,
            what,
            source,
        }
    }

    pub fn io(op: &'static str, path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// An I/O failure because the path does not exist.
    pub fn not_found(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == ErrorKind::NotFound)
    }

    /// A CNI config file the installer refuses to chain.
    pub fn is_conf_refusal(&self) -> bool {
        matches!(
            self,
            Error::ConfNotJson { .. }
                | Error::ConfNotObject { .. }
                | Error::NoPlugins { .. }
                | Error::PluginNotObject { .. }
                | Error::NoType { .. }
                | Error::OnlyPodgate { .. }
                | Error::OldVersion { .. }
        )
    }

    /// Whether `--watch` keeps waiting (something the primary or the operator
    /// fixes by writing a file) rather than exiting for a restart.
    pub fn is_transient(&self) -> bool {
        self.is_conf_refusal()
            || matches!(
                self,
                Error::PluginsFile { .. }
                    | Error::PluginsFileMissing(_)
                    | Error::NoPrimary(_)
                    | Error::PrimaryMissing { .. }
                    | Error::Vanished(_)
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// A daemon's failed system call names the daemon and the call and
    /// keeps the OS error as its source (errno for whoever matches on it).
    #[test]
    fn a_system_call_failure_keeps_its_os_error() {
        let e = Error::sys(Daemon::Broker, "poll")(std::io::Error::from_raw_os_error(libc::EBADF));
        assert!(e.to_string().starts_with("sysctl broker: poll: "), "{e}");
        let source = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            source.and_then(|s| s.raw_os_error()),
            Some(libc::EBADF),
            "{e:?}"
        );
    }

    /// A CRI failure keeps the CRI error, typed.
    #[test]
    fn a_cri_failure_keeps_the_cri_error() {
        let e = Error::Cri {
            daemon: Daemon::CriProxy,
            source: podgate_cri::CriError::BadEndpoint("tcp://x".into()),
        };
        assert!(
            e.to_string().starts_with("CRI proxy: --runtime-endpoint"),
            "{e}"
        );
        let source = e
            .source()
            .and_then(|s| s.downcast_ref::<podgate_cri::CriError>());
        assert!(
            matches!(source, Some(podgate_cri::CriError::BadEndpoint(_))),
            "{e:?}"
        );
    }
}
