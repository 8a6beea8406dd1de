//! The router's typed error, and its one conversion into a CNI error: the
//! code, the message and the details all come from the same value. A
//! failing kernel call keeps its errno and object up to the CNI error's
//! `details` (JSON: `errno`, `errnoName`, `family`, `object`, `netns`).
//! Every CNI error the router returns is built here, from an [`Error`]; the
//! protocol's own (stdin, the `CNI_*` variables it checks, `cniVersion`)
//! come from `podgate-cni`.

use crate::apply::{ApplyError, Failures};
use crate::config::ConfigError;
use crate::intent::DecodeError;
use crate::plan::NoRouteToPod;
use crate::record::ReadError;
use crate::refusal::Refusal;
use podgate_cni::{code, CniError};
use podgate_kit::error::errno_name;
use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The state directory: records, the claims index, locks.
    #[error("{0}")]
    State(#[source] podgate_kit::Error),
    /// A record that could not be read (the state dir, or a newer format).
    #[error("{0}")]
    Record(#[from] ReadError),
    /// A kernel call the router made: what it was doing, and kit's error.
    #[error("{what}: {source}")]
    Kernel {
        what: &'static str,
        #[source]
        source: Box<ApplyError>,
    },
    /// Applying a profile failed and was rolled back; `left` is what the
    /// rollback could not undo (the pending record then stays for DEL).
    #[error("applying profile {profile:?}: {source}{}", rollback_left(.left))]
    Apply {
        profile: String,
        #[source]
        source: Box<ApplyError>,
        left: Failures,
    },
    /// What could not be removed or undone (a teardown, a sweep).
    #[error("{what}: {left}")]
    Left { what: &'static str, left: Failures },
    /// The policy refuses the pod (the refusal names the rule).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// CHECK: what of the record no longer holds (one line each).
    #[error("drift: {}", .0.join("; "))]
    Drift(Vec<String>),
    /// CHECK: a profile applies to the pod but no record says it was applied.
    #[error("profile {0:?} applies to this pod but podgate has no record of applying it")]
    NotRecorded(String),
    /// A return route's pod address is not reachable from the node.
    #[error(transparent)]
    NoRoute(#[from] NoRouteToPod),
    /// The conflist, or the request against it, is invalid (operator's).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The pod's annotations or CNI `args` do not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// What the runtime gave does not name a pod the router can work on.
    #[error("{0}")]
    Env(String),
    /// The pod's netns could not be opened: not there, or not a netns.
    #[error("{0}")]
    Netns(#[source] podgate_kit::Error),
    /// An adopted sandbox's netns went away while it was being read.
    #[error("sandbox {id} netns {}: {source}", .netns.display())]
    SandboxGone {
        id: String,
        netns: std::path::PathBuf,
        #[source]
        source: podgate_kit::Error,
    },
    /// The node lacks what the router needs: a capability, its state dir.
    #[error("{}{source}", .what.map(|w| format!("{w}: ")).unwrap_or_default())]
    Unavailable {
        what: Option<&'static str>,
        #[source]
        source: podgate_kit::Error,
    },
}

fn rollback_left(left: &Failures) -> String {
    if left.is_empty() {
        String::new()
    } else {
        format!("; rollback left (record kept pending for DEL): {left}")
    }
}

impl Error {
    /// A kernel call failed while the router was doing `what`.
    pub fn kernel(what: &'static str) -> impl FnOnce(podgate_kit::Error) -> Error {
        move |e| Error::Kernel {
            what,
            source: Box::new(ApplyError::Kit(e)),
        }
    }

    /// The CNI error code of this error.
    pub fn code(&self) -> u32 {
        match self {
            Error::State(_) | Error::Record(_) => code::IO_FAILURE,
            Error::Refused(_) => code::POLICY_REFUSED,
            Error::Apply { source, .. } if source.is_state() => code::IO_FAILURE,
            Error::Kernel { .. }
            | Error::Apply { .. }
            | Error::Left { .. }
            | Error::Drift(_)
            | Error::NotRecorded(_)
            | Error::NoRoute(_) => code::APPLY_FAILED,
            Error::Config(_) => code::INVALID_CONFIG,
            Error::Decode(_) => code::DECODE,
            Error::Env(_) => code::INVALID_ENV,
            Error::Netns(e) if e.is_not_found() => code::UNKNOWN_CONTAINER,
            Error::Netns(_) => code::INVALID_ENV,
            Error::SandboxGone { .. } => code::UNKNOWN_CONTAINER,
            Error::Unavailable { .. } => code::NOT_AVAILABLE,
        }
    }

    /// The first typed kit error behind this one (a list's first failure).
    fn kit(&self) -> Option<(&podgate_kit::Error, Option<&str>)> {
        match self {
            Error::State(e)
            | Error::Record(ReadError::Io(e))
            | Error::Netns(e)
            | Error::SandboxGone { source: e, .. }
            | Error::Unavailable { source: e, .. } => Some((e, None)),
            Error::Record(_)
            | Error::Drift(_)
            | Error::Refused(_)
            | Error::NotRecorded(_)
            | Error::NoRoute(_)
            | Error::Config(_)
            | Error::Decode(_)
            | Error::Env(_) => None,
            Error::Kernel { source, .. } | Error::Apply { source, .. } => Some(source.kit()),
            Error::Left { left, .. } => left.iter().next().map(ApplyError::kit),
        }
    }
}

/// A refusal is a CNI error through [`Error`]'s conversion below; so are
/// the errors of the modules `Error` builds on (config, intent, plan).
impl From<Refusal> for CniError {
    fn from(r: Refusal) -> CniError {
        Error::from(r).into()
    }
}

impl From<ConfigError> for CniError {
    fn from(e: ConfigError) -> CniError {
        Error::from(e).into()
    }
}

impl From<DecodeError> for CniError {
    fn from(e: DecodeError) -> CniError {
        Error::from(e).into()
    }
}

impl From<NoRouteToPod> for CniError {
    fn from(e: NoRouteToPod) -> CniError {
        Error::from(e).into()
    }
}

impl From<Error> for CniError {
    fn from(e: Error) -> CniError {
        let details = e.kit().map(details_of).unwrap_or_default();
        CniError::new(e.code(), e.to_string()).with_details(details)
    }
}

/// The CNI error's details for a kit error: its errno, the netlink family
/// and the object (or the file, the sysctl) it names, the pod's netns. An
/// empty string when there is nothing beyond the message.
fn details_of((e, netns): (&podgate_kit::Error, Option<&str>)) -> String {
    use podgate_kit::Error as K;
    let mut d = Map::new();
    if let Some(errno) = e.errno() {
        d.insert("errno".into(), errno.into());
        d.insert("errnoName".into(), errno_name(errno).into());
    }
    let (family, object) = match e {
        K::Kernel { family, object, .. }
        | K::Invalid { family, object, .. }
        | K::Timeout { family, object, .. }
        | K::Protocol { family, object, .. }
        | K::DumpInterrupted { family, object, .. }
        | K::TooLarge { family, object, .. }
        | K::TooMany { family, object, .. } => (Some(*family), Some(object.clone())),
        K::Socket { family, .. } => (Some(*family), None),
        K::Netns { path, .. }
        | K::NotNetns { path }
        | K::File { path, .. }
        | K::State { path, .. }
        | K::StateCorrupt { path, .. } => (None, Some(path.display().to_string())),
        K::Sysctl { name, .. } | K::SysctlRefused { name, .. } => {
            (None, Some(format!("sysctl {name}")))
        }
        K::MissingCapability { cap, .. } => (None, Some((*cap).to_string())),
        K::NoSuchLink(name) => (None, Some(format!("interface {name}"))),
    };
    if let Some(f) = family {
        d.insert("family".into(), f.into());
    }
    if let Some(o) = object {
        d.insert("object".into(), o.into());
    }
    if let Some(n) = netns {
        d.insert("netns".into(), n.into());
    }
    if d.is_empty() {
        String::new()
    } else {
        Value::Object(d).to_string()
    }
}
