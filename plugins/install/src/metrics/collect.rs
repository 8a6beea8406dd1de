//! The gauges: read on every collection from the same code the CLI uses.
//!
//! Two functions are the seams other work plugs into:
//! * [`scan_records`]: attachments, stale, pending and corrupt records of a
//!   podgate-router state dir, from the router's lifecycle scan
//!   (`podgate_router::record::scan`: pending = write-ahead records of an ADD
//!   that has not finished, stale = a dead pod's record).
//! * [`ipsec_state`]: the tunnel guard's own evaluation, as data.

use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_router::apply;
use podgate_router::kernel::{ListedOnce, Live};
use podgate_router::record::{self, Record, RecordStatus};
use podgate_tunnel_guard::{evaluate, GuardConfig, Outcome, Verdict};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Why a gauge could not be read this collection.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// The router state dir could not be scanned.
    #[error("{}: {source}", .dir.display())]
    Records {
        dir: PathBuf,
        source: podgate_kit::Error,
    },
    /// The node's rtnetlink socket could not be opened.
    #[error("node netlink: {0}")]
    Netlink(podgate_kit::Error),
    /// The tunnel-guard entry is not a valid guard configuration.
    #[error("{0}")]
    GuardConfig(#[from] podgate_tunnel_guard::config::ConfigError),
}

/// `(network, profile, routing)` of one attachment.
pub type AttachmentLabels = (String, String, String);

#[derive(Debug, Default)]
pub struct RecordScan {
    pub attachments: BTreeMap<AttachmentLabels, u64>,
    pub stale: u64,
    pub pending: u64,
    pub corrupt: u64,
    /// Unreadable records the sweep moved to `quarantine/`.
    pub quarantined: u64,
    /// Records whose pod netns exists: what the drift check looks at.
    pub live: Vec<Record>,
}

/// Every record of one router state dir, classified by the router's own
/// lifecycle scan (boot ID and pod netns identity decide staleness).
pub fn scan_records(state_dir: &Path) -> Result<RecordScan, CollectError> {
    let mut scan = RecordScan::default();
    let infos = record::scan(state_dir).map_err(|source| CollectError::Records {
        dir: state_dir.to_path_buf(),
        source,
    })?;
    for info in infos {
        if info.status == RecordStatus::Quarantined {
            scan.quarantined += 1;
            continue;
        }
        let Some(rec) = info.record else {
            // Unreadable, or written by a newer podgate: this release cannot
            // account for it either way.
            scan.corrupt += 1;
            continue;
        };
        let routing = match rec.routing.as_ref().map(|r| r.mode) {
            Some(record::Mode::Strict) => "strict",
            Some(record::Mode::Standard) => "standard",
            None => "none",
        };
        let labels = (
            rec.key.network.clone(),
            rec.profile.clone(),
            routing.to_string(),
        );
        *scan.attachments.entry(labels).or_default() += 1;
        match info.status {
            RecordStatus::Stale { .. } => scan.stale += 1,
            RecordStatus::Pending => {
                scan.pending += 1;
                scan.live.push(rec);
            }
            _ => scan.live.push(rec),
        }
    }
    Ok(scan)
}

/// What the periodic CHECK of the live records found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Records whose recorded state no longer holds.
    pub drifted: u64,
    /// Records that could not be checked (their netns cannot be entered, a
    /// netlink read fails): neither "holds" nor "drifted" would be true.
    pub unchecked: u64,
    /// Distinct node rules before a strict pod's boundary that can take
    /// its traffic past it (each is drift of that pod too).
    pub rules_ahead: u64,
}

/// The CNI CHECK of each live record, from the record, as `podgate
/// inspect` does.
pub fn drifted(records: &[Record]) -> Result<Drift, CollectError> {
    let mut out = Drift::default();
    if records.is_empty() {
        return Ok(out);
    }
    let mut sock = RouteSocket::new().map_err(CollectError::Netlink)?;
    // The node's routes and rules dumped once for every record.
    let mut node = ListedOnce::new(Live::on(&mut sock));
    let mut ahead = std::collections::BTreeSet::new();
    for rec in records {
        let checked = rec
            .netns
            .as_deref()
            .and_then(|p| NetNs::open(p).ok())
            .and_then(|ns| apply::check_with(rec, &mut node, &ns).ok());
        match checked {
            Some(d) if d.is_empty() => {}
            Some(_) => out.drifted += 1,
            None => out.unchecked += 1,
        }
        // One rule before several strict pods is one rule. A listing that
        // fails made the record's check fail too (counted as unchecked).
        if let Ok(found) = apply::rules_ahead(&mut node, rec) {
            ahead.extend(
                found
                    .iter()
                    .map(|a| (a.rule.v6, a.rule.describe(), a.rule.protocol)),
            );
        }
    }
    out.rules_ahead = u64::try_from(ahead.len()).unwrap_or(u64::MAX);
    Ok(out)
}

#[derive(Debug, Default)]
pub struct IpsecState {
    pub ready: bool,
    /// Every check by name: true when it failed.
    pub checks: BTreeMap<String, bool>,
    pub expires_in_secs: Option<i64>,
}

/// The guard's evaluation of one tunnel-guard entry.
pub fn ipsec_state(entry: &serde_json::Value) -> Result<IpsecState, CollectError> {
    let cfg = GuardConfig::from_value(entry)?;
    let report = evaluate(&cfg, SystemTime::now());
    let mut checks = BTreeMap::new();
    for c in &report.checks {
        let failed = c.outcome == Outcome::Fail;
        let e = checks.entry(c.name.clone()).or_insert(false);
        *e |= failed;
    }
    Ok(IpsecState {
        ready: report.verdict != Verdict::NotReady,
        checks,
        expires_in_secs: report.expires_in_secs,
    })
}
