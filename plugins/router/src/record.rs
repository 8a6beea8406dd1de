//! The attachment record: what ADD is about to apply (pending) or applied,
//! as kept in the state store. DEL, CHECK, GC and `podgate inspect` read
//! this, never a guess from the kernel.
//!
//! This is podgate's on-disk contract with its next release, so it is a
//! schema of its own (`"version": 1`), not the planner's types: a plan is
//! converted into a record one way ([`Record::pending`]), and the record's
//! own route/rule/routing types are converted to the kit's when applied or
//! removed. Fields are only ever added (with a default); renaming or
//! retyping one needs version 2 and a reader for version 1 kept forever.
//! Records from before versioning (the planner's `Plan` stored whole) are
//! read as version 0.

use crate::config::RoutingMode;
use crate::plan::{Claim, Plan, SysctlSetting};
use crate::routing::RoutingPlan;
use ipnet::IpNet;
use podgate_kit::netns::{NetNs, NsIdentity};
use podgate_kit::nft;
use podgate_kit::route::RouteSpec;
use podgate_kit::rule::RuleSpec;
use podgate_kit::state::{Key, StateStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The record format this binary writes, and the newest it reads.
pub const VERSION: u64 = 1;

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

/// A sysctl in the pod netns: the value podgate writes and, when podgate
/// changed it, the value it found (read before writing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sysctl {
    pub name: String,
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Masquerade {
    pub source: IpNet,
    pub oifname: String,
}

/// Which SYNs an MSS clamp rule rewrites (record format of
/// [`podgate_kit::nft::MssDirection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MssDirection {
    FromPool,
    ToPool,
}

/// What the MSS is lowered to: `"pmtu"` or `{"fixed": N}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MssValue {
    Pmtu,
    Fixed(u16),
}

/// One MSS clamp rule in the `forward` chain of [`Record::nft_table`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MssClamp {
    pub pool: IpNet,
    pub ifname: String,
    pub direction: MssDirection,
    pub mss: MssValue,
}

impl From<&nft::MssRule> for MssClamp {
    fn from(r: &nft::MssRule) -> MssClamp {
        MssClamp {
            pool: r.pool,
            ifname: r.ifname.clone(),
            direction: match r.direction {
                nft::MssDirection::FromPool => MssDirection::FromPool,
                nft::MssDirection::ToPool => MssDirection::ToPool,
            },
            mss: match r.mss {
                nft::MssValue::Pmtu => MssValue::Pmtu,
                nft::MssValue::Fixed(v) => MssValue::Fixed(v),
            },
        }
    }
}

impl MssClamp {
    pub fn rule(&self) -> nft::MssRule {
        nft::MssRule {
            pool: self.pool,
            ifname: self.ifname.clone(),
            direction: match self.direction {
                MssDirection::FromPool => nft::MssDirection::FromPool,
                MssDirection::ToPool => nft::MssDirection::ToPool,
            },
            mss: match self.mss {
                MssValue::Pmtu => nft::MssValue::Pmtu,
                MssValue::Fixed(v) => nft::MssValue::Fixed(v),
            },
        }
    }
}

/// A route (node, pod, or a per-pod table), as the record stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oif: Option<u32>,
    #[serde(default = "main_table")]
    pub table: u32,
    #[serde(default)]
    pub protocol: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
    #[serde(default)]
    pub onlink: bool,
    #[serde(default)]
    pub link_scope: bool,
}

fn main_table() -> u32 {
    podgate_kit::route::TABLE_MAIN
}

impl From<&RouteSpec> for Route {
    fn from(r: &RouteSpec) -> Route {
        Route {
            dst: r.dst,
            gateway: r.gateway,
            oif: r.oif,
            table: r.table,
            protocol: r.protocol,
            metric: r.metric,
            onlink: r.onlink,
            link_scope: r.link_scope,
        }
    }
}

impl Route {
    pub fn spec(&self) -> RouteSpec {
        RouteSpec {
            dst: self.dst,
            gateway: self.gateway,
            oif: self.oif,
            table: self.table,
            protocol: self.protocol,
            metric: self.metric,
            onlink: self.onlink,
            link_scope: self.link_scope,
        }
    }
}

/// A policy routing rule, as the record stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub v6: bool,
    pub priority: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    pub table: u32,
    #[serde(default)]
    pub protocol: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppress_prefixlen: Option<u32>,
}

impl From<&RuleSpec> for Rule {
    fn from(r: &RuleSpec) -> Rule {
        Rule {
            v6: r.v6,
            priority: r.priority,
            from: r.from,
            to: r.to,
            iif: r.iif.clone(),
            table: r.table,
            protocol: r.protocol,
            suppress_prefixlen: r.suppress_prefixlen,
        }
    }
}

impl Rule {
    pub fn spec(&self) -> RuleSpec {
        RuleSpec {
            v6: self.v6,
            priority: self.priority,
            from: self.from,
            to: self.to,
            iif: self.iif.clone(),
            table: self.table,
            protocol: self.protocol,
            suppress_prefixlen: self.suppress_prefixlen,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Strict,
    Standard,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSysctl {
    pub name: String,
    pub value: String,
}

impl From<&SysctlSetting> for NodeSysctl {
    fn from(s: &SysctlSetting) -> NodeSysctl {
        NodeSysctl {
            name: s.name.clone(),
            value: s.value.clone(),
        }
    }
}

impl NodeSysctl {
    pub fn setting(&self) -> SysctlSetting {
        SysctlSetting {
            name: self.name.clone(),
            value: self.value.clone(),
        }
    }
}

/// The node side of a routing boundary: a table of its own, rules, and (strict)
/// the main-table route to the pod replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Routing {
    pub mode: Mode,
    pub uplink: String,
    pub gateway: IpAddr,
    pub table: u32,
    pub pod_ip: IpNet,
    pub host_if: String,
    #[serde(default)]
    pub table_routes: Vec<Route>,
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_original: Option<Route>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_replacement: Option<Route>,
    #[serde(default)]
    pub node_sysctls: Vec<NodeSysctl>,
    /// strict: sysctls of the pod's host-side interface (proxy ARP for the
    /// pod's gateway).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_if_sysctls: Vec<NodeSysctl>,
    /// strict: what `host_if_sysctls` held before ADD wrote them (only those
    /// it changed), read before the pending record is written.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_if_previous: BTreeMap<String, String>,
}

impl From<&RoutingPlan> for Routing {
    fn from(p: &RoutingPlan) -> Routing {
        Routing {
            mode: match p.mode {
                RoutingMode::Strict => Mode::Strict,
                RoutingMode::Standard => Mode::Standard,
            },
            uplink: p.uplink.clone(),
            gateway: p.gateway,
            table: p.table,
            pod_ip: p.pod_ip,
            host_if: p.host_if.clone(),
            table_routes: p.table_routes.iter().map(Route::from).collect(),
            rules: p.rules.iter().map(Rule::from).collect(),
            main_original: p.main_original.as_ref().map(Route::from),
            main_replacement: p.main_replacement.as_ref().map(Route::from),
            node_sysctls: p.node_sysctls.iter().map(NodeSysctl::from).collect(),
            host_if_sysctls: p.host_if_sysctls.iter().map(NodeSysctl::from).collect(),
            host_if_previous: p.host_if_previous.clone(),
        }
    }
}

impl Routing {
    /// The kit-level plan the routing module applies and removes.
    pub fn plan(&self) -> RoutingPlan {
        RoutingPlan {
            mode: match self.mode {
                Mode::Strict => RoutingMode::Strict,
                Mode::Standard => RoutingMode::Standard,
            },
            uplink: self.uplink.clone(),
            gateway: self.gateway,
            table: self.table,
            pod_ip: self.pod_ip,
            host_if: self.host_if.clone(),
            table_routes: self.table_routes.iter().map(Route::spec).collect(),
            rules: self.rules.iter().map(Rule::spec).collect(),
            main_original: self.main_original.as_ref().map(Route::spec),
            main_replacement: self.main_replacement.as_ref().map(Route::spec),
            node_sysctls: self.node_sysctls.iter().map(NodeSysctl::setting).collect(),
            host_if_sysctls: self
                .host_if_sysctls
                .iter()
                .map(NodeSysctl::setting)
                .collect(),
            host_if_previous: self.host_if_previous.clone(),
        }
    }
}

/// One attachment's record, format version 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Always [`VERSION`] when written by this binary.
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
}

/// What ADD knows about where it runs, for the record.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub created: String,
    pub boot_id: Option<String>,
    pub netns: Option<PathBuf>,
    pub node_netns_id: Option<NsIdentity>,
    pub warnings: Vec<String>,
}

impl Record {
    /// The write-ahead record of `plan`. The pod side (previous sysctl values,
    /// pod route interfaces, the pod netns identity) is filled in by apply
    /// before the record is first written.
    pub fn pending(key: &Key, plan: &Plan, origin: Origin) -> Record {
        Record {
            version: VERSION,
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
            routing: plan.routing.as_ref().map(Routing::from),
            warnings: origin.warnings,
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
        let ns = match NetNs::open(path) {
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
    // The common case in one pass: a record of this version.
    if let Ok(r) = serde_json::from_slice::<Record>(body) {
        if r.version == VERSION {
            return Ok(r);
        }
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    match v.get("version") {
        None => serde_json::from_value::<v0::Record>(v)
            .map(v0::Record::upgrade)
            .map_err(|e| bad(format!("unversioned (version 0) record: {e}"))),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(VERSION) => {
                serde_json::from_value::<Record>(v).map_err(|e| bad(format!("version 1: {e}")))
            }
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

impl Listing {
    /// Some record cannot be judged (unreadable or too new): node-wide
    /// settings must then be left as they are.
    pub fn has_unknown(&self) -> bool {
        !self.newer.is_empty() || !self.unreadable.is_empty()
    }
}

pub fn list(store: &StateStore) -> Result<Listing, podgate_kit::Error> {
    let mut out = Listing {
        records: Vec::new(),
        newer: Vec::new(),
        unreadable: Vec::new(),
    };
    for e in store.entries()? {
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
    let Some(store) = StateStore::existing(state_dir) else {
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
    Ok(out)
}

/// Records written before the format was versioned: the planner's `Plan`
/// stored whole. Frozen here as it was, read only to be upgraded.
mod v0 {
    use super::*;

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Record {
        key: Key,
        #[serde(default)]
        netns: Option<PathBuf>,
        #[serde(default)]
        created: String,
        plan: Plan,
        #[serde(default)]
        sysctl_previous: BTreeMap<String, String>,
        #[serde(default)]
        pod_routes: Vec<Route>,
        #[serde(default)]
        warnings: Vec<String>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Plan {
        profile: String,
        source: String,
        #[serde(default)]
        pod_ips: Vec<IpNet>,
        #[serde(default)]
        sysctls: Vec<NodeSysctl>,
        #[serde(default)]
        nft_table: Option<String>,
        #[serde(default)]
        masquerade: Vec<Masquerade>,
        #[serde(default)]
        node_routes: Vec<Route>,
        #[serde(default)]
        routing: Option<Routing>,
    }

    impl Record {
        pub fn upgrade(self) -> super::Record {
            let previous = self.sysctl_previous;
            super::Record {
                version: VERSION,
                status: Status::Applied,
                key: self.key,
                created: self.created,
                boot_id: None,
                netns: self.netns,
                netns_id: None,
                node_netns_id: None,
                profile: self.plan.profile,
                source: self.plan.source,
                pod_ips: self.plan.pod_ips,
                sysctls: self
                    .plan
                    .sysctls
                    .into_iter()
                    .map(|s| Sysctl {
                        previous: previous.get(&s.name).cloned(),
                        name: s.name,
                        value: s.value,
                    })
                    .collect(),
                nft_table: self.plan.nft_table,
                masquerade: self.plan.masquerade,
                mss_clamp: Vec::new(),
                pod_routes: self.pod_routes,
                node_routes: self.plan.node_routes,
                routing: self.plan.routing,
                warnings: self.warnings,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden(name: &str) -> (PathBuf, Vec<u8>) {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/records")
            .join(name);
        let b = std::fs::read(&p).unwrap();
        (p, b)
    }

    #[test]
    fn golden_v1_records_parse_and_round_trip() {
        for name in ["v1-vpn-full.json", "v1-strict.json", "v1-pending.json"] {
            let (p, b) = golden(name);
            let r = parse(&p, &b).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(r.version, 1);
            let again = serde_json::to_vec(&r).unwrap();
            assert_eq!(parse(&p, &again).unwrap(), r, "{name}");
        }
        let (p, b) = golden("v1-vpn-full.json");
        let r = parse(&p, &b).unwrap();
        assert_eq!(r.status, Status::Applied);
        assert_eq!(r.node_routes.len(), 1);
        assert_eq!(r.sysctls[0].previous.as_deref(), Some("0"));
        let (p, b) = golden("v1-strict.json");
        assert!(parse(&p, &b).unwrap().is_strict());
    }

    #[test]
    fn scan_reports_each_record_with_its_status() {
        let d = std::env::temp_dir().join(format!("podgate-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for (file, g) in [
            ("goldennet+golden-pending+eth0.json", "v1-pending.json"),
            ("goldennet+golden-v2+eth0.json", "v2-future.json"),
        ] {
            std::fs::write(d.join(file), golden(g).1).unwrap();
        }
        std::fs::write(d.join("a+b+c.json"), b"{").unwrap();
        let mut live = parse(Path::new("x"), &golden("v1-vpn-full.json").1).unwrap();
        live.netns = None;
        live.status = Status::Pending;
        std::fs::write(
            d.join(live.key.file_name()),
            serde_json::to_vec(&live).unwrap(),
        )
        .unwrap();
        let infos = scan(&d).unwrap();
        let status = |id: &str| {
            infos
                .iter()
                .find(|i| i.key.as_ref().is_some_and(|k| k.container_id == id))
                .map(|i| i.status.clone())
                .unwrap()
        };
        assert!(matches!(
            status("golden-pending"),
            RecordStatus::Stale { .. }
        ));
        assert_eq!(
            status("golden-v2"),
            RecordStatus::NewerVersion { version: 2 }
        );
        assert!(matches!(status("b"), RecordStatus::Unreadable { .. }));
        assert_eq!(status("golden-v1"), RecordStatus::Pending);
        assert_eq!(infos.len(), 4);
        assert!(scan(&d.join("missing")).unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn unversioned_records_are_upgraded() {
        let (p, b) = golden("v0-vpn-routed.json");
        let r = parse(&p, &b).unwrap();
        assert_eq!(r.status, Status::Applied);
        assert_eq!(r.profile, "vpn-routed");
        assert_eq!(r.sysctls[0].previous.as_deref(), Some("0"));
        assert_eq!(r.node_routes[0].dst.to_string(), "10.9.0.0/24");
    }

    #[test]
    fn newer_and_broken_records_are_told_apart() {
        let p = Path::new("/x/a+b+c.json");
        let newer = parse(p, br#"{"version": 2, "whatever": true}"#).unwrap_err();
        assert!(matches!(newer, ReadError::Newer { version: 2, .. }));
        assert!(newer.to_string().contains("format version 2"), "{newer}");
        for body in [
            &b"{not json"[..],
            br#"{"version": "1"}"#,
            br#"{"version": 1}"#,
        ] {
            let e = parse(p, body).unwrap_err();
            assert!(matches!(e, ReadError::Unreadable { .. }), "{e}");
        }
    }

    #[test]
    fn a_reboot_or_another_namespace_makes_a_record_stale() {
        let (p, b) = golden("v1-vpn-full.json");
        let mut r = parse(&p, &b).unwrap();
        r.netns = Some(PathBuf::from("/proc/self/ns/net"));
        let here = Here::now();
        let me = NetNs::current().unwrap().identity().unwrap();
        r.netns_id = Some(me.into());
        r.node_netns_id = here.node.map(NsId::from);
        r.boot_id = here.boot_id.clone();
        assert_eq!(r.liveness(&here, Depth::Precise), Liveness::Live);
        let mut reused = r.clone();
        reused.netns_id = Some(NsId {
            cookie: me.cookie.map(|c| c + 1),
            ..me.into()
        });
        assert!(!reused.liveness(&here, Depth::Path).is_stale());
        assert!(reused.liveness(&here, Depth::Precise).is_stale() || me.cookie.is_none());
        let mut old = r.clone();
        old.boot_id = Some("00000000-0000-0000-0000-000000000000".into());
        assert!(matches!(
            old.liveness(&here, Depth::Boot),
            Liveness::Stale {
                node_gone: true,
                ..
            }
        ));
        let mut unseen = r.clone();
        unseen.netns = Some(PathBuf::from("/nonexistent/netns"));
        assert_eq!(unseen.liveness(&here, Depth::Path), Liveness::Live);
        let mut gone = r.clone();
        gone.netns = Some(PathBuf::from("/proc/self/ns/nonexistent"));
        assert!(matches!(
            gone.liveness(&here, Depth::Path),
            Liveness::Stale {
                node_gone: false,
                ..
            }
        ));
    }
}
