//! One error type for the kit; every variant names the object and the netns.
//! Netlink failures of every family (rtnetlink, nf_tables, XFRM) share the
//! variants below; `family` says which subsystem answered.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// What was wrong with a netlink message the kernel sent: which header or
/// attribute, and how. Becomes [`Error::Protocol`]'s reason, naming the
/// family and the object asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("short netlink header ({0} bytes)")]
    ShortHeader(usize),
    #[error("nlmsg_len {0} shorter than the header")]
    LenBelowHeader(usize),
    #[error("nlmsg_len {len} exceeds datagram ({got} bytes)")]
    LenBeyond { len: usize, got: usize },
    #[error("NLMSG_ERROR shorter than its error code")]
    ShortError,
    #[error("truncated attribute header ({0} bytes)")]
    AttrHeader(usize),
    #[error("attribute type {ty} length {len} out of bounds")]
    AttrBounds { ty: u16, len: usize },
    /// A fixed header (`rtmsg`, `ifinfomsg`, ...) shorter than its struct.
    #[error("{what} truncated ({got} of {want} bytes)")]
    Truncated {
        what: &'static str,
        got: usize,
        want: usize,
    },
    /// The attributes after header `what`.
    #[error("{what} attributes: {source}")]
    Attributes {
        what: &'static str,
        source: Box<ParseError>,
    },
    /// An address attribute of the wrong length (`family`: IPv4, IPv6, or
    /// IP when the length says the family).
    #[error("{name}: {got} bytes, not an {family} address")]
    NotAddress {
        name: &'static str,
        got: usize,
        family: &'static str,
    },
    /// A fixed-size attribute of the wrong length.
    #[error("{name}: {got} bytes, want {want}")]
    Length {
        name: &'static str,
        got: usize,
        want: usize,
    },
    /// A range attribute (two u16 or two u32) of another length.
    #[error("{name}: {got} bytes")]
    RangeLength { name: &'static str, got: usize },
    #[error("route prefix length {len} for {addr}")]
    PrefixLength { len: u8, addr: std::net::IpAddr },
    #[error("RTA_MULTIPATH: next hop length {0} out of bounds")]
    NextHopBounds(usize),
    #[error("RTA_MULTIPATH: {0}")]
    Multipath(Box<ParseError>),
    #[error("expression without NFTA_EXPR_NAME")]
    NoExprName,
}

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
