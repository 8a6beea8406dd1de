//! Prometheus metrics of the node agent (`podgate install --watch
//! --metrics-address ADDR`): a collector thread that every
//! `--metrics-interval-secs` drains the plugins' event channel into
//! persisted counters ([`events`]) and reads the gauges ([`collect`]), and a
//! server thread that answers `GET /metrics` with the last collection
//! ([`http`]). The watch loop itself is not touched.

pub mod collect;
pub mod events;
pub mod http;
pub mod text;

use crate::ChainProbe;
use clap::Args;
use collect::{AttachmentLabels, IpsecState};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use text::Text;

#[derive(Debug, Clone, Args)]
pub struct MetricsArgs {
    /// With --watch: serve Prometheus metrics on ADDR (e.g. 0.0.0.0:9750),
    /// plain HTTP, GET /metrics only. Off by default.
    #[arg(long, value_name = "ADDR", requires = "watch")]
    pub metrics_address: Option<String>,
    /// How often the counters are drained and the gauges (records, drift,
    /// IPsec, chain) are read.
    #[arg(long, default_value_t = 15, value_name = "SECONDS")]
    pub metrics_interval_secs: u64,
}

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
    pub drift: u64,
    pub drift_unchecked: u64,
    pub ipsec: Option<IpsecState>,
    /// Collection problems by source (bounded label set).
    pub errors: BTreeMap<&'static str, u64>,
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
    crate::log_at(
        podgate_cni::log::Level::Debug,
        &format!("metrics: {what}: {msg}"),
    );
    what
}

fn collect_once(probe: &ChainProbe, spool: &mut events::Spool) -> Snapshot {
    let mut snap = Snapshot::default();
    let mut errs: Vec<&'static str> = Vec::new();
    match probe.ready() {
        Ok(_) => snap.install_ready = true,
        Err(reason) => snap.install_reason = Some(reason),
    }
    let entries = match probe.entries() {
        Ok(e) => e,
        Err(e) => {
            errs.push(error("plugins", e));
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
                live.extend(scan.live);
            }
            Err(e) => errs.push(error("records", e)),
        }
    }
    match collect::drifted(&live) {
        Ok((d, u)) => (snap.drift, snap.drift_unchecked) = (d, u),
        Err(e) => errs.push(error("drift", e)),
    }
    // One guard per chain; with several entries the first one counts.
    if let Some(g) = src.guards.first() {
        match collect::ipsec_state(g) {
            Ok(s) => snap.ipsec = Some(s),
            Err(e) => errs.push(error("ipsec", e)),
        }
    }
    for what in errs {
        *snap.errors.entry(what).or_default() += 1;
    }
    snap
}

fn split3(k: &str) -> (&str, &str, &str) {
    let mut it = k.splitn(3, '|');
    (
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
    )
}

/// The exposition text of one snapshot.
pub fn render(s: &Snapshot) -> String {
    let mut t = Text::default();
    let b = |v: bool| if v { 1.0 } else { 0.0 };
    t.family(
        "podgate_build_info",
        "gauge",
        "podgate version of the running agent (always 1).",
    );
    t.sample(
        "podgate_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    t.family(
        "podgate_install_ready",
        "gauge",
        "1 while podgate's binaries and chain entries are in place as configured, else 0.",
    );
    t.sample("podgate_install_ready", &[], b(s.install_ready));
    t.family(
        "podgate_attachments",
        "gauge",
        "Attachments podgate-router has a record of, by network, profile and routing mode.",
    );
    for ((network, profile, routing), n) in &s.attachments {
        t.sample(
            "podgate_attachments",
            &[
                ("network", network),
                ("profile", profile),
                ("routing", routing),
            ],
            *n as f64,
        );
    }
    t.family(
        "podgate_records_stale",
        "gauge",
        "Records whose pod network namespace no longer exists (DEL never came).",
    );
    t.sample("podgate_records_stale", &[], s.stale as f64);
    t.family(
        "podgate_records_pending",
        "gauge",
        "Records of changes begun and not yet completed (write-ahead).",
    );
    t.sample("podgate_records_pending", &[], s.pending as f64);
    t.family(
        "podgate_records_corrupt",
        "gauge",
        "Record files that could not be read.",
    );
    t.sample("podgate_records_corrupt", &[], s.corrupt as f64);
    t.family(
        "podgate_attachment_drift",
        "gauge",
        "Live attachments whose recorded state no longer holds (periodic CHECK).",
    );
    t.sample("podgate_attachment_drift", &[], s.drift as f64);
    t.family(
        "podgate_attachment_drift_unchecked",
        "gauge",
        "Live attachments the periodic CHECK could not examine (netns not enterable, netlink error).",
    );
    t.sample(
        "podgate_attachment_drift_unchecked",
        &[],
        s.drift_unchecked as f64,
    );

    t.family(
        "podgate_cni_requests_total",
        "counter",
        "CNI requests the podgate plugins answered, by plugin, command and outcome (ok, refused, error, crashed).",
    );
    for (k, n) in &s.counters.requests {
        let (plugin, command, outcome) = split3(k);
        t.sample(
            "podgate_cni_requests_total",
            &[
                ("plugin", plugin),
                ("command", command),
                ("outcome", outcome),
            ],
            *n as f64,
        );
    }
    t.family(
        "podgate_refusals_total",
        "counter",
        "Requests refused by operator policy, by the rule that refused.",
    );
    for (rule, n) in &s.counters.refusals {
        t.sample("podgate_refusals_total", &[("rule", rule)], *n as f64);
    }
    t.family(
        "podgate_cni_request_duration_seconds",
        "histogram",
        "Time from a plugin's start to its answer.",
    );
    for (k, h) in &s.counters.durations {
        let (plugin, command, _) = split3(k);
        t.histogram(
            "podgate_cni_request_duration_seconds",
            &[("plugin", plugin), ("command", command)],
            &events::BUCKETS,
            &h.counts,
            h.sum,
        );
    }
    if let Some(ip) = &s.ipsec {
        t.family(
            "podgate_ipsec_ready",
            "gauge",
            "1 while the tunnel guard would let pods through (ready or not required), else 0.",
        );
        t.sample("podgate_ipsec_ready", &[], b(ip.ready));
        t.family(
            "podgate_ipsec_checks_failed",
            "gauge",
            "1 for each tunnel-guard check that fails, 0 for those that pass or are skipped.",
        );
        for (check, failed) in &ip.checks {
            t.sample(
                "podgate_ipsec_checks_failed",
                &[("check", check)],
                b(*failed),
            );
        }
        if let Some(secs) = ip.expires_in_secs {
            t.family(
                "podgate_ipsec_certificate_expiry_seconds",
                "gauge",
                "Seconds until the IPsec agent's certificate expires (negative: expired).",
            );
            t.sample("podgate_ipsec_certificate_expiry_seconds", &[], secs as f64);
        }
    }
    t.family(
        "podgate_metrics_collect_errors",
        "gauge",
        "Sources the last collection could not read (see the agent log at debug level).",
    );
    for (what, n) in &s.errors {
        t.sample(
            "podgate_metrics_collect_errors",
            &[("source", what)],
            *n as f64,
        );
    }
    t.finish()
}

/// Bind `addr` and start the collector and the server. Errors (bad address,
/// port taken, unreadable counters) stop the agent from starting.
pub fn start(
    addr: &str,
    args: &MetricsArgs,
    state_dir: &Path,
    probe: ChainProbe,
) -> Result<(), String> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|e| format!("--metrics-address {addr}: {e}"))?;
    let mut spool = events::Spool::open(state_dir)?;
    let interval = Duration::from_secs(args.metrics_interval_secs.max(1));
    let shown = Arc::new(Mutex::new(render(&collect_once(&probe, &mut spool))));
    crate::log(format!(
        "metrics on http://{}/metrics (every {}s)",
        listener
            .local_addr()
            .map_or(addr.to_string(), |a| a.to_string()),
        interval.as_secs()
    ));
    let collector = Arc::clone(&shown);
    std::thread::Builder::new()
        .name("metrics-collect".into())
        .spawn(move || loop {
            std::thread::sleep(interval);
            let text = render(&collect_once(&probe, &mut spool));
            if let Ok(mut g) = collector.lock() {
                *g = text;
            }
        })
        .map_err(|e| format!("metrics thread: {e}"))?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            http::serve(listener, &|| {
                shown
                    .lock()
                    .map(|g| g.clone())
                    .unwrap_or_else(|p| p.into_inner().clone())
            })
        })
        .map_err(|e| format!("metrics server thread: {e}"))?;
    Ok(())
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

    #[test]
    fn renders_every_family() {
        let mut s = Snapshot {
            install_ready: true,
            ..Snapshot::default()
        };
        s.counters
            .requests
            .insert("podgate-router|ADD|ok".into(), 3);
        s.attachments
            .insert(("n".into(), "p".into(), "none".into()), 2);
        let out = render(&s);
        assert!(out.contains("podgate_install_ready 1\n"), "{out}");
        assert!(out.contains(
            "podgate_cni_requests_total{plugin=\"podgate-router\",command=\"ADD\",outcome=\"ok\"} 3\n"
        ));
        assert!(
            out.contains("podgate_attachments{network=\"n\",profile=\"p\",routing=\"none\"} 2\n")
        );
    }
}
