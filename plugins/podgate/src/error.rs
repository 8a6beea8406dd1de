//! One error type for the CLI, and the exit code each kind maps to.

/// Exit codes (also listed in `podgate --help`).
pub mod exit {
    /// Done; every check passed.
    pub const OK: i32 = 0;
    /// Could not do what was asked (netns not found, netlink failure, ...).
    pub const ERROR: i32 = 1;
    /// A check or diagnosis found a problem (silent hop, drift, IPsec not ready).
    pub const PROBLEM: i32 = 2;
    /// Refused: the request is not allowed (e.g. a node-wide sysctl).
    pub const REFUSED: i32 = 3;
    /// Bad command line.
    pub const USAGE: i32 = 64;
}

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Kit(#[from] podgate_kit::Error),
    #[error("{0}")]
    Router(#[from] podgate_router::apply::ApplyError),
    /// The command line is well-formed for clap but not for us.
    #[error("{0}")]
    Usage(String),
    /// Not allowed by design.
    #[error("{0}")]
    Refused(String),
    /// The installer, the agent and their helpers (podgate-install's errors).
    #[error(transparent)]
    Install(#[from] podgate_install::Error),
    /// Finding a pod's sandbox over CRI.
    #[error(transparent)]
    Cri(#[from] podgate_cri::CriError),
    /// A network namespace that could not be opened (`what` names whose).
    #[error("{what}: {source}")]
    Netns {
        what: String,
        source: podgate_kit::Error,
    },
    /// A file the command reads or writes.
    #[error("{op} {}: {source}", path.display())]
    File {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file that is not the JSON expected.
    #[error("{}: {source}", path.display())]
    FileJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// The plugins file an admission policy is rendered from.
    #[error("{}: {source}", path.display())]
    Policy {
        path: PathBuf,
        source: crate::admission::RenderError,
    },
    /// Writing the report's tar stream (`entry`: the file being added).
    #[error("report archive{}: {source}", entry.as_deref().map(|e| format!(" entry {e}")).unwrap_or_default())]
    Archive {
        entry: Option<String>,
        source: std::io::Error,
    },
    /// A sysctl the namespace does not have.
    #[error("{0}: no such sysctl in this netns")]
    NoSuchSysctl(podgate_kit::Error),
    /// Whether a sysctl is per network namespace could not be told.
    #[error("{name}: cannot tell whether it is per network namespace (a new namespace: {source}); nothing written")]
    SysctlProbe {
        name: String,
        source: std::io::Error,
    },
    /// Anything else, already phrased for the operator (no underlying
    /// error: a lookup that found nothing, an ambiguous ID).
    #[error("{0}")]
    Msg(String),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    pub fn msg(s: impl Into<String>) -> Error {
        Error::Msg(s.into())
    }

    pub fn usage(s: impl Into<String>) -> Error {
        Error::Usage(s.into())
    }

    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => exit::USAGE,
            Error::Refused(_) | Error::Kit(podgate_kit::Error::SysctlRefused { .. }) => {
                exit::REFUSED
            }
            _ => exit::ERROR,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a command found: nothing wrong, or a problem worth exit code 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Ok,
    Problem,
}

impl Found {
    pub fn problem_if(cond: bool) -> Found {
        if cond {
            Found::Problem
        } else {
            Found::Ok
        }
    }

    pub fn exit_code(self) -> i32 {
        match self {
            Found::Ok => exit::OK,
            Found::Problem => exit::PROBLEM,
        }
    }
}
