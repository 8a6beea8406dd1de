//! One error type for the kit; every variant names the object and the netns.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("netns {path}: {op}: {source}")]
    Netns {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    #[error("{path} is not a network namespace")]
    NotNetns { path: PathBuf },
    #[error("netlink {what}: {source}")]
    Netlink { what: String, source: io::Error },
    #[error("netlink {what}: cannot decode kernel answer: {msg}")]
    Decode { what: String, msg: String },
    #[error("sysctl {name}: {msg}")]
    SysctlRefused { name: String, msg: String },
    #[error("sysctl {name}: {op}: {source}")]
    Sysctl {
        name: String,
        op: &'static str,
        source: io::Error,
    },
    #[error("state {path}: {op}: {source}")]
    State {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    #[error("state {path}: corrupt record: {msg}")]
    StateCorrupt { path: PathBuf, msg: String },
    #[error("missing capability {cap}: {why}")]
    MissingCapability { cap: &'static str, why: String },
    #[error("interface {0} not found")]
    NoSuchLink(String),
}

impl Error {
    /// The errno behind a netlink or syscall failure, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Netns { source, .. }
            | Error::Netlink { source, .. }
            | Error::Sysctl { source, .. }
            | Error::State { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// "Already gone" as DEL understands it.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::ENOENT) | Some(libc::ESRCH) | Some(libc::ENODEV)
        ) || matches!(self, Error::NoSuchLink(_))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
