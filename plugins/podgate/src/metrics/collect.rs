//! The gauges: read on every collection from the same code the CLI uses.
//!
//! Two functions are the seams other work plugs into:
//! * [`scan_records`]: attachments, stale, pending and corrupt records of a
//!   podgate-router state dir. Today it reads `podgate_router::record::Record`
//!   through the state store (stale = the recorded netns is gone; pending = 0,
//!   there is no write-ahead state yet); the router's lifecycle scan replaces
//!   its body.
//! * [`ipsec_state`]: the tunnel guard's own evaluation, as data.

use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_kit::state::StateStore;
use podgate_router::apply;
use podgate_router::record::Record;
use podgate_tunnel_guard::{evaluate, GuardConfig, Outcome, Verdict};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

/// `(network, profile, routing)` of one attachment.
pub type AttachmentLabels = (String, String, String);

#[derive(Debug, Default)]
pub struct RecordScan {
    pub attachments: BTreeMap<AttachmentLabels, u64>,
    pub stale: u64,
    pub pending: u64,
    pub corrupt: u64,
    /// Records whose pod netns exists: what the drift check looks at.
    pub live: Vec<Record>,
}

/// Every record of one router state dir, classified.
pub fn scan_records(state_dir: &Path) -> Result<RecordScan, String> {
    let mut scan = RecordScan::default();
    let Some(store) = StateStore::existing(state_dir) else {
        return Ok(scan);
    };
    let (records, corrupt) = store
        .list::<Record>()
        .map_err(|e| format!("{}: {e}", state_dir.display()))?;
    scan.corrupt = corrupt.len() as u64;
    for rec in records {
        let routing = rec
            .plan
            .routing
            .as_ref()
            .and_then(|r| serde_json::to_value(r.mode).ok())
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| "none".into());
        let labels = (rec.key.network.clone(), rec.plan.profile.clone(), routing);
        *scan.attachments.entry(labels).or_default() += 1;
        let gone = match &rec.netns {
            Some(p) => matches!(NetNs::open(p), Err(e) if e.is_not_found()),
            None => false,
        };
        if gone {
            scan.stale += 1;
        } else {
            scan.live.push(rec);
        }
    }
    Ok(scan)
}

/// `(drifted, unchecked)` of the live records: the CNI CHECK of each, from
/// the record, as `podgate inspect` does. A record that cannot be checked
/// (its netns cannot be entered, a netlink read fails) is counted apart:
/// neither "holds" nor "drifted" would be true of it.
pub fn drifted(records: &[Record]) -> Result<(u64, u64), String> {
    if records.is_empty() {
        return Ok((0, 0));
    }
    let mut node = RouteSocket::new().map_err(|e| format!("node netlink: {e}"))?;
    let (mut drifted, mut unchecked) = (0, 0);
    for rec in records {
        let checked = rec
            .netns
            .as_deref()
            .and_then(|p| NetNs::open(p).ok())
            .and_then(|ns| apply::check(rec, &mut node, &ns).ok());
        match checked {
            Some(d) if d.is_empty() => {}
            Some(_) => drifted += 1,
            None => unchecked += 1,
        }
    }
    Ok((drifted, unchecked))
}

#[derive(Debug, Default)]
pub struct IpsecState {
    pub ready: bool,
    /// Every check by name: true when it failed.
    pub checks: BTreeMap<String, bool>,
    pub expires_in_secs: Option<i64>,
}

/// The guard's evaluation of one tunnel-guard entry.
pub fn ipsec_state(entry: &serde_json::Value) -> Result<IpsecState, String> {
    let cfg = GuardConfig::from_value(entry).map_err(|e| e.to_string())?;
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
