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
    /// Anything else, already phrased for the operator.
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
