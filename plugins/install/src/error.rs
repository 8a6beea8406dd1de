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
    #[error("watch: {0}")]
    Watch(String),
    #[error("agent: {0}")]
    Agent(String),
    /// The agent's metrics counters could not be loaded.
    #[error("agent: {0}")]
    Spool(#[from] crate::metrics::events::SpoolError),
    #[error("sysctl broker: {0}")]
    Broker(String),
    #[error("CRI proxy: {0}")]
    CriProxy(String),
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

impl From<podgate_kit::Error> for Error {
    fn from(e: podgate_kit::Error) -> Error {
        match e {
            podgate_kit::Error::File { op, path, source } => Error::Io { op, path, source },
            other => Error::Kit(other),
        }
    }
}

impl Error {
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
