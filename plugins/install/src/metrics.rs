//! Prometheus metrics of the node agent (`podgate agent`): one collection
//! drains the plugins' event channel into persisted counters ([`events`])
//! and reads the gauges ([`collect`]); [`exposition`] writes it in the text
//! format and [`http`] serves the last one.

pub mod collect;
pub mod events;
pub mod exposition;
pub mod http;

use crate::logging;
use crate::{ChainProbe, Readiness};
use collect::{AttachmentLabels, IpsecState};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

const ROUTER: &str = "podgate-router";
const GUARD: &str = "podgate-tunnel-guard";
const DEFAULT_ROUTER_STATE_DIR: &str = "/var/lib/cni/podgate";

/// One collection: everything `/metrics` shows.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub install_ready: bool,
    pub install_reason: Option<String>,
    pub counters: events::Counters,
    pub attachments: BTreeMap<AttachmentLabels, u64>,
    pub stale: u64,
    pub pending: u64,
    pub corrupt: u64,
    pub quarantined: u64,
    pub drift: u64,
    pub drift_unchecked: u64,
    /// Node rules before a strict pod's boundary that can take its traffic
    /// past it.
    pub strict_rules_ahead: u64,
    pub ipsec: Option<IpsecState>,
    /// Sandboxes that may have been wired without the tunnel guard (None:
    /// no guard in the chain, IPsec not required, or no runtime).
    pub unguarded: Option<u64>,
    /// Collection problems by source (bounded label set).
    pub errors: BTreeMap<&'static str, u64>,
}

impl Snapshot {
    /// What an adoption scan found: the unguarded count, and a runtime
    /// that could not list its sandboxes as the collection error `runtime`
    /// (the count is then unknown: no sample rather than a 0).
    pub fn take_scan(&mut self, scan: &crate::adopt::Scan) {
        self.unguarded = scan.unguarded;
        if scan.runtime_failed {
            self.unguarded = None;
            *self.errors.entry("runtime").or_default() += 1;
        }
    }
}

/// What to read, from podgate's entries: event files, router state dirs,
/// tunnel-guard entries.
#[derive(Debug, Default)]
struct Sources {
    event_files: Vec<PathBuf>,
    state_dirs: Vec<PathBuf>,
    guards: Vec<serde_json::Value>,
}

fn sources(entries: &[serde_json::Value]) -> Sources {
    let mut events = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    let mut guards = Vec::new();
    for e in entries {
        let kind = e.get("type").and_then(|t| t.as_str()).unwrap_or("");
        events.insert(podgate_cni::event::file_for_entry(e));
        match kind {
            ROUTER => {
                let d = e
                    .get("stateDir")
                    .and_then(|d| d.as_str())
                    .unwrap_or(DEFAULT_ROUTER_STATE_DIR);
                dirs.insert(PathBuf::from(d));
            }
            GUARD => guards.push(e.clone()),
            _ => {}
        }
    }
    Sources {
        event_files: events.into_iter().collect(),
        state_dirs: dirs.into_iter().collect(),
        guards,
    }
}

/// A source the collection could not read: logged at debug, counted.
fn error(what: &'static str, msg: String) -> &'static str {
    logging::at(
        podgate_cni::log::Level::Debug,
        &format!("metrics: {what}: {msg}"),
    );
    what
}

pub(crate) fn collect_once(probe: &ChainProbe, spool: &mut events::Spool) -> Snapshot {
    let mut snap = Snapshot::default();
    let mut errs: Vec<&'static str> = Vec::new();
    match probe.ready() {
        Readiness::Chained(_) => snap.install_ready = true,
        Readiness::NotReady(reason) => snap.install_reason = Some(reason),
    }
    let entries = match probe.entries() {
        Ok(e) => e,
        Err(e) => {
            errs.push(error("plugins", e.to_string()));
            Vec::new()
        }
    };
    let src = sources(&entries);
    for e in spool.drain(&src.event_files) {
        errs.push(error("events", e));
    }
    snap.counters = spool.counters().clone();
    let mut live = Vec::new();
    for dir in &src.state_dirs {
        match collect::scan_records(dir) {
            Ok(scan) => {
                for (k, v) in scan.attachments {
                    *snap.attachments.entry(k).or_default() += v;
                }
                snap.stale += scan.stale;
                snap.pending += scan.pending;
                snap.corrupt += scan.corrupt;
                snap.quarantined += scan.quarantined;
                live.extend(scan.live);
            }
            Err(e) => errs.push(error("records", e.to_string())),
        }
    }
    match collect::drifted(&live) {
        Ok(d) => {
            snap.drift = d.drifted;
            snap.drift_unchecked = d.unchecked;
            snap.strict_rules_ahead = d.rules_ahead;
        }
        Err(e) => errs.push(error("drift", e.to_string())),
    }
    // One guard per chain; with several entries the first one counts.
    if let Some(g) = src.guards.first() {
        match collect::ipsec_state(g) {
            Ok(s) => snap.ipsec = Some(s),
            Err(e) => errs.push(error("ipsec", e.to_string())),
        }
    }
    for what in errs {
        *snap.errors.entry(what).or_default() += 1;
    }
    snap
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sources_follow_the_entries() {
        let s = sources(&[
            json!({"type": ROUTER, "stateDir": "/s"}),
            json!({"type": GUARD, "eventFile": "/e/g.jsonl"}),
        ]);
        assert_eq!(
            s.event_files,
            vec![
                PathBuf::from("/e/g.jsonl"),
                PathBuf::from("/s/events.jsonl")
            ]
        );
        assert_eq!(s.state_dirs, vec![PathBuf::from("/s")]);
        assert_eq!(s.guards.len(), 1);
    }
}
