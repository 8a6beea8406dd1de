//! One error type for the kit; every variant names the object and the netns.
//! Netlink failures of every family (rtnetlink, nf_tables, XFRM) share the
//! variants below; `family` says which subsystem answered.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

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
    /// Creating, configuring or using a netlink socket failed.
    #[error("{family} netlink socket: {op} failed: {source}")]
    Socket {
        family: &'static str,
        op: String,
        #[source]
        source: io::Error,
    },
    /// The kernel rejected a request.
    #[error(
        "{family} {object}: kernel returned {} ({}){}",
        errno_name(*.errno),
        io::Error::from_raw_os_error(*.errno),
        fmt_kernel_message(.message.as_deref())
    )]
    Kernel {
        family: &'static str,
        object: String,
        /// Positive errno value, e.g. `libc::ENOENT`.
        errno: i32,
        /// Extended-ack message, when the kernel provided one.
        message: Option<String>,
    },
    /// A caller-provided value cannot be encoded.
    #[error("{family} {object}: invalid input: {reason}")]
    Invalid {
        family: &'static str,
        object: String,
        reason: String,
    },
    /// The kernel did not answer within the socket's timeout.
    #[error("{family} {object}: no reply from the kernel within {timeout:?}")]
    Timeout {
        family: &'static str,
        object: String,
        timeout: Duration,
    },
    /// The kernel's reply could not be parsed.
    #[error("{family} {object}: malformed netlink reply: {reason}")]
    Protocol {
        family: &'static str,
        object: String,
        reason: String,
    },
    /// A dump kept being interrupted by concurrent changes.
    #[error("{family} {object}: dump interrupted by concurrent ruleset changes {attempts} times")]
    DumpInterrupted {
        family: &'static str,
        object: String,
        attempts: u32,
    },
    /// A request or reply exceeded our size limits.
    #[error("{family} {object}: {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        family: &'static str,
        object: String,
        size: usize,
        limit: usize,
    },
    /// More entries than we are willing to hold.
    #[error("{family} {object}: more than {limit} entries")]
    TooMany {
        family: &'static str,
        object: String,
        limit: usize,
    },
    #[error("sysctl {name}: {msg}")]
    SysctlRefused { name: String, msg: String },
    #[error("sysctl {name}: {op}: {source}")]
    Sysctl {
        name: String,
        op: &'static str,
        source: io::Error,
    },
    /// A file podgate keeps (records, locks, the installer's files).
    #[error("{op} {}: {source}", path.display())]
    File {
        op: &'static str,
        path: PathBuf,
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
            Error::Kernel { errno, .. } => Some(*errno),
            Error::Netns { source, .. }
            | Error::Socket { source, .. }
            | Error::Sysctl { source, .. }
            | Error::State { source, .. }
            | Error::File { source, .. } => source.raw_os_error(),
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

fn fmt_kernel_message(message: Option<&str>) -> String {
    match message {
        Some(m) if !m.is_empty() => format!(": {m}"),
        _ => String::new(),
    }
}

/// Symbolic name for the errnos netlink commonly returns, so logs say
/// `ENOENT` rather than only "No such file or directory".
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::E2BIG => "E2BIG",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOSPC => "ENOSPC",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ENOBUFS => "ENOBUFS",
        libc::ETIMEDOUT => "ETIMEDOUT",
        _ => "errno",
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
