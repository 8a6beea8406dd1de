//! The attachment record: what ADD is about to apply (pending) or applied,
//! as kept in the state store. DEL, CHECK, GC and `podgate inspect` read
//! this, never a guess from the kernel.
//!
//! This is podgate's on-disk contract with its next release, so it is a
//! schema of its own (`"version"`), not the planner's types: a plan is
//! converted into a record one way ([`Record::pending`]), and the record's
//! own route/rule/routing types are converted to the kit's when applied or
//! removed. Fields are only ever added (with a default); renaming or
//! retyping one needs a new version and a reader for the old one kept
//! forever. Records from before versioning (the planner's `Plan` stored
//! whole) are read as version 0.
//!
//! Version 2 adds what a release that reads only version 1 could not
//! remove: rules with an `ipproto` or a non-lookup action, and main-table
//! swaps after the first (a strict pod with IPv6 or several addresses). A
//! record is written in the oldest version that holds it, so records of
//! every other pod stay readable by that release after a rollback; version
//! 1 is version 2 without those fields and is read by the same code.

mod parts;
#[cfg(test)]
mod tests;
mod v0;

pub use parts::*;

use crate::plan::{Claim, Plan};
use ipnet::IpNet;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::{NetNs, NsIdentity};
use podgate_kit::state::{Key, Names, StateStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The newest record format this binary writes and reads.
pub const VERSION: u64 = 2;
/// The format of a record that needs nothing version 2 added.
pub const VERSION_1: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Written before ADD changed anything: some or all of it may exist.
    Pending,
    /// ADD finished: all of it was applied.
    Applied,
}

/// A namespace as the record knows it (see [`NsIdentity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<u64>,
}

impl From<NsIdentity> for NsId {
    fn from(i: NsIdentity) -> NsId {
        NsId {
            dev: i.dev,
            ino: i.ino,
            cookie: i.cookie,
        }
    }
}

impl From<NsId> for NsIdentity {
    fn from(i: NsId) -> NsIdentity {
        NsIdentity {
            dev: i.dev,
            ino: i.ino,
            cookie: i.cookie,
        }
    }
}

/// One attachment's record, format version 1 or 2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// [`VERSION_1`] or [`VERSION`] when written by this binary: the
    /// oldest that holds the record ([`Record::pending`]).
    pub version: u64,
    pub status: Status,
    pub key: Key,
    pub created: String,
    /// `/proc/sys/kernel/random/boot_id` at ADD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// CNI_NETNS at ADD, and which namespace it was then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_id: Option<NsId>,
    /// The node's namespace (the plugin's own) at ADD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_netns_id: Option<NsId>,
    pub profile: String,
    /// Which rule selected the profile (e.g. `assign[0]`).
    pub source: String,
    #[serde(default)]
    pub pod_ips: Vec<IpNet>,
    /// In the pod netns.
    #[serde(default)]
    pub sysctls: Vec<Sysctl>,
    /// `inet <table>` in the pod netns: podgate's own, removed whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nft_table: Option<String>,
    #[serde(default)]
    pub masquerade: Vec<Masquerade>,
    /// MSS clamp rules in chain `forward` of `nft_table`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mss_clamp: Vec<MssClamp>,
    /// In the pod netns (oif resolved).
    #[serde(default)]
    pub pod_routes: Vec<Route>,
    /// Return routes in the node netns.
    #[serde(default)]
    pub node_routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<Routing>,
    /// Noticed at ADD (e.g. IPVS present), shown by inspect.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Applied by the node agent to a sandbox that was running before the
    /// runtime served podgate's chain (adoption), not by the runtime's ADD.
    /// Absent (false) in records written by ADD and by older releases.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

/// What ADD knows about where it runs, for the record.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub created: String,
    pub boot_id: Option<String>,
    pub netns: Option<PathBuf>,
    pub node_netns_id: Option<NsIdentity>,
    pub warnings: Vec<String>,
    /// Applied by the agent's adoption scan, not by the runtime's ADD.
    pub adopted: bool,
}

impl Record {
    /// The write-ahead record of `plan`. The pod side (previous sysctl values,
    /// pod route interfaces, the pod netns identity) is filled in by apply
    /// before the record is first written.
    pub fn pending(key: &Key, plan: &Plan, origin: Origin) -> Record {
        let routing = plan.routing.as_ref().map(Routing::from);
        let version = if routing.as_ref().is_some_and(Routing::needs_v2) {
            VERSION
        } else {
            VERSION_1
        };
        Record {
            version,
            status: Status::Pending,
            key: key.clone(),
            created: origin.created,
            boot_id: origin.boot_id,
            netns: origin.netns,
            netns_id: None,
            node_netns_id: origin.node_netns_id.map(NsId::from),
            profile: plan.profile.clone(),
            source: plan.source.clone(),
            pod_ips: plan.pod_ips.clone(),
            sysctls: plan
                .sysctls
                .iter()
                .map(|s| Sysctl {
                    name: s.name.clone(),
                    value: s.value.clone(),
                    previous: None,
                })
                .collect(),
            nft_table: plan.nft_table.clone(),
            masquerade: plan
                .masquerade
                .iter()
                .map(|m| Masquerade {
                    source: m.source,
                    oifname: m.oifname.clone(),
                })
                .collect(),
            mss_clamp: plan.mss_clamp.iter().map(MssClamp::from).collect(),
            pod_routes: plan
                .pod_routes
                .iter()
                .map(|r| Route {
                    dst: r.dst.trunc(),
                    gateway: r.gw,
                    oif: None,
                    table: podgate_kit::route::TABLE_MAIN,
                    protocol: podgate_kit::route::RTPROT_PODGATE,
                    metric: None,
                    onlink: false,
                    link_scope: false,
                })
                .collect(),
            node_routes: plan.node_routes.iter().map(Route::from).collect(),
            routing,
            warnings: origin.warnings,
            adopted: origin.adopted,
        }
    }

    pub fn is_strict(&self) -> bool {
        self.routing
            .as_ref()
            .is_some_and(|r| r.mode == Mode::Strict)
    }

    /// What this record holds on to node-wide.
    pub fn claim(&self) -> Claim {
        Claim {
            key: self.key.clone(),
            pools: self.node_routes.iter().map(|r| r.dst).collect(),
            table: self.routing.as_ref().map(|r| r.table),
            strict: self.is_strict(),
        }
    }

    /// nf_tables userdata tag: which attachment owns the table.
    pub fn nft_tag(&self) -> String {
        nft_tag(&self.key)
    }

    /// Does the pod namespace this record was written for still exist, as
    /// far as `depth` looks? [`Depth::Boot`] compares the boot ID and node
    /// netns (no syscall); [`Depth::Path`] also opens the netns path and
    /// compares device and inode; [`Depth::Precise`] also the netns cookie
    /// (one trip into the namespace), which tells a new namespace at the same
    /// path from the old one even when the kernel reused the inode number.
    /// Whatever a shallower check calls stale is stale.
    pub fn liveness(&self, here: &Here, depth: Depth) -> Liveness {
        self.liveness_opened(here, depth, None)
    }

    /// [`Record::liveness`] with the record's namespace path already opened
    /// by this request (`opened`, used when its path is the recorded one):
    /// the same question without opening the path a second time.
    pub fn liveness_opened(&self, here: &Here, depth: Depth, opened: Option<&NetNs>) -> Liveness {
        if let (Some(then), Some(now)) = (&self.boot_id, &here.boot_id) {
            if then != now {
                return Liveness::Stale {
                    reason: format!("written in an earlier boot ({then})"),
                    node_gone: true,
                };
            }
        }
        if let (Some(then), Some(now)) = (self.node_netns_id, here.node) {
            if !NsIdentity::from(then).same_as(&now) {
                return Liveness::Stale {
                    reason: "written in another node network namespace".into(),
                    node_gone: true,
                };
            }
        }
        if depth == Depth::Boot {
            return Liveness::Live;
        }
        let Some(path) = &self.netns else {
            return Liveness::Live;
        };
        let reopened;
        let ns = match opened.filter(|o| o.path() == path) {
            Some(o) => Ok(o),
            None => {
                reopened = NetNs::open(path);
                reopened.as_ref()
            }
        };
        let ns = match ns {
            Ok(ns) => ns,
            // Only where the namespace directory itself is visible: a reader
            // in a container without it mounted cannot tell (fail safe).
            Err(e)
                if (e.is_not_found() || matches!(e, podgate_kit::Error::NotNetns { .. }))
                    && path.parent().is_some_and(Path::is_dir) =>
            {
                return Liveness::Stale {
                    reason: format!("netns {} is gone", path.display()),
                    node_gone: false,
                }
            }
            // Cannot tell (permissions, ...): fail closed, the pod may live.
            Err(_) => return Liveness::Live,
        };
        let Some(id) = self.netns_id else {
            return Liveness::Live;
        };
        let other = || Liveness::Stale {
            reason: format!("netns {} is another namespace now", path.display()),
            node_gone: false,
        };
        if ns.dev_ino() != (id.dev, id.ino) {
            return other();
        }
        if depth == Depth::Precise && id.cookie.is_some() {
            if let Ok(now) = ns.identity() {
                if !NsIdentity::from(id).same_as(&now) {
                    return other();
                }
            }
        }
        Liveness::Live
    }
}

/// The ownership tag podgate puts on everything it can tag (nf_tables).
pub fn nft_tag(key: &Key) -> String {
    format!(
        "podgate:{}:{}:{}",
        key.network, key.container_id, key.ifname
    )
}

/// How far [`Record::liveness`] looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    Boot,
    Path,
    Precise,
}

/// Facts about the running node that records are judged against.
#[derive(Debug, Clone, Default)]
pub struct Here {
    pub boot_id: Option<String>,
    pub node: Option<NsIdentity>,
}

impl Here {
    /// The current boot and the calling thread's (the node's) namespace.
    /// What cannot be read stays unknown, and unknown never makes a record
    /// stale.
    pub fn now() -> Here {
        Here {
            boot_id: podgate_kit::netns::boot_id().ok(),
            node: podgate_kit::netns::current_identity().ok(),
        }
    }

    /// [`Here::now`] with the node's netns cookie read from `node`, a
    /// netlink socket of the calling thread's namespace the request opened
    /// anyway (saves the throwaway socket).
    pub fn with_socket(node: &RouteSocket) -> Here {
        let identity = match node.netns_cookie() {
            Ok(cookie) => podgate_kit::netns::current_identity_with(cookie),
            Err(_) => podgate_kit::netns::current_identity(),
        };
        Here {
            boot_id: podgate_kit::netns::boot_id().ok(),
            node: identity.ok(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    Live,
    /// The pod is dead. `node_gone`: the node namespace it was applied in is
    /// gone too (a reboot), so nothing of it remains anywhere.
    Stale {
        reason: String,
        node_gone: bool,
    },
}

impl Liveness {
    pub fn is_stale(&self) -> bool {
        matches!(self, Liveness::Stale { .. })
    }
}

/// Why a record file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] podgate_kit::Error),
    #[error("record {path} has format version {version}, newer than this podgate-router understands (up to {VERSION}): kept; upgrade podgate-router to remove it")]
    Newer { path: PathBuf, version: u64 },
    #[error("record {path} is unreadable: {msg}")]
    Unreadable { path: PathBuf, msg: String },
}

/// Parse a record file of any known version.
pub fn parse(path: &Path, body: &[u8]) -> Result<Record, ReadError> {
    let bad = |msg: String| ReadError::Unreadable {
        path: path.into(),
        msg,
    };
    // The common case in one pass: a record of a version this binary writes.
    if let Ok(r) = serde_json::from_slice::<Record>(body) {
        if (VERSION_1..=VERSION).contains(&r.version) {
            return Ok(r);
        }
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    match v.get("version") {
        None => serde_json::from_value::<v0::Record>(v)
            .map(v0::Record::upgrade)
            .map_err(|e| bad(format!("unversioned (version 0) record: {e}"))),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(version @ VERSION_1..=VERSION) => serde_json::from_value::<Record>(v)
                .map_err(|e| bad(format!("version {version}: {e}"))),
            Some(version) if version > VERSION => Err(ReadError::Newer {
                path: path.into(),
                version,
            }),
            _ => Err(bad(format!("unknown format version {n}"))),
        },
        Some(other) => Err(bad(format!("format version is not a number: {other}"))),
    }
}

fn path_of(store: &StateStore, key: &Key) -> PathBuf {
    store.dir().join(key.file_name())
}

/// The record of `key`, if there is one.
pub fn read(store: &StateStore, key: &Key) -> Result<Option<Record>, ReadError> {
    match store.read_raw(key)? {
        None => Ok(None),
        Some(body) => parse(&path_of(store, key), &body).map(Some),
    }
}

pub fn write(store: &StateStore, rec: &Record) -> Result<(), podgate_kit::Error> {
    store.write(&rec.key, rec)
}

/// Every record file: parsed, or why not (with the key from its name).
pub struct Listing {
    pub records: Vec<Record>,
    pub newer: Vec<(Option<Key>, ReadError)>,
    pub unreadable: Vec<(Option<Key>, ReadError)>,
}

pub fn list(store: &StateStore) -> Result<Listing, podgate_kit::Error> {
    list_in(store, &store.names()?)
}

/// [`list`] of the record files in `names` (one listing of the directory,
/// shared with the temp-file sweep of the same request).
pub fn list_in(store: &StateStore, names: &Names) -> Result<Listing, podgate_kit::Error> {
    let mut out = Listing {
        records: Vec::new(),
        newer: Vec::new(),
        unreadable: Vec::new(),
    };
    for e in store.entries_in(names)? {
        let parsed = e
            .body
            .map_err(ReadError::from)
            .and_then(|b| parse(&e.path, &b));
        match parsed {
            Ok(r) => out.records.push(r),
            Err(err @ ReadError::Newer { .. }) => out.newer.push((e.key, err)),
            Err(err) => out.unreadable.push((e.key, err)),
        }
    }
    Ok(out)
}

/// A record's state for reports (`podgate inspect`, metrics, the sweep).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "status")]
pub enum RecordStatus {
    Applied,
    /// ADD has not finished (running now, or killed half-way).
    Pending,
    /// Its pod is dead (see `reason`); the next ADD, DEL or GC removes it.
    Stale {
        reason: String,
    },
    Unreadable {
        error: String,
    },
    NewerVersion {
        version: u64,
    },
    /// An unreadable record the agent's sweep moved to `quarantine/`: it
    /// counts nowhere; the attachment's DEL removes it.
    Quarantined,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordInfo {
    pub file: PathBuf,
    /// From the record, else from its file name.
    pub key: Option<Key>,
    pub profile: Option<String>,
    #[serde(flatten)]
    pub status: RecordStatus,
    /// The record itself, when it could be read.
    #[serde(skip)]
    pub record: Option<Record>,
}

/// Every record under `state_dir` with its status, for reporting (metrics,
/// the installer daemon). A missing state dir is an empty list; an
/// unlistable one is an error. Judged by the boot ID and the pods'
/// namespaces, not by the caller's own netns (as the installer's sweep), so
/// a reporter running outside the node netns still reports correctly.
pub fn scan(state_dir: &Path) -> Result<Vec<RecordInfo>, podgate_kit::Error> {
    let Some(store) = StateStore::existing(state_dir)? else {
        return Ok(Vec::new());
    };
    let here = Here {
        node: None,
        ..Here::now()
    };
    let mut out = Vec::new();
    for e in store.entries()? {
        let parsed = e
            .body
            .map_err(ReadError::from)
            .and_then(|b| parse(&e.path, &b));
        let (key, profile, status, record) = match parsed {
            Ok(r) => {
                let status = match (r.liveness(&here, Depth::Precise), r.status) {
                    (Liveness::Stale { reason, .. }, _) => RecordStatus::Stale { reason },
                    (Liveness::Live, Status::Pending) => RecordStatus::Pending,
                    (Liveness::Live, Status::Applied) => RecordStatus::Applied,
                };
                (
                    Some(r.key.clone()),
                    Some(r.profile.clone()),
                    status,
                    Some(r),
                )
            }
            Err(ReadError::Newer { version, .. }) => {
                (e.key, None, RecordStatus::NewerVersion { version }, None)
            }
            Err(err) => (
                e.key,
                None,
                RecordStatus::Unreadable {
                    error: err.to_string(),
                },
                None,
            ),
        };
        out.push(RecordInfo {
            file: e.path,
            key,
            profile,
            status,
            record,
        });
    }
    for (key, file) in crate::lifecycle::quarantine_listing(&store)? {
        out.push(RecordInfo {
            file: store.dir().join(crate::lifecycle::QUARANTINE).join(file),
            key,
            profile: None,
            status: RecordStatus::Quarantined,
            record: None,
        });
    }
    Ok(out)
}
