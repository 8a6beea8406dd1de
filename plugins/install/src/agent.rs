//! `podgate agent`: the node agent. It serves the Prometheus metrics and
//! `/healthz` ([`crate::metrics::http`]), checks live attachments for drift
//! on every collection and sweeps dead pods' records ([`crate::sweep`]). It
//! reads the CNI dirs (for `podgate_install_ready`, the same test as
//! `podgate install --check`) and never writes them: that is the
//! installer's job, in a container of its own.
//!
//! With `--once` it does one adoption scan and one sweep on the calling
//! thread, prints what they did and exits (no HTTP, no worker).
//!
//! Two threads: the worker (collections and sweeps, which enter pod netns
//! and read netlink, so they stay off the server's thread) and the
//! current-thread tokio runtime serving HTTP and waiting for SIGTERM/SIGINT.

use crate::adopt::{Adopter, Repair, Scan};
use crate::history::HistoryFile;
use crate::logging::{info, warn};
use crate::metrics::{self, events::Spool, http};
use crate::sweep::Sweep;
use crate::{AgentLogArgs, ChainArgs, ChainProbe, Daemon, Error};
use clap::Args;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the agent keeps its counters: beside the installer's records, in
/// a subdir podgate-router's state store skips.
pub const DEFAULT_AGENT_STATE_DIR: &str = "/var/lib/cni/podgate/agent";
/// How long a stopping agent waits for a collection or sweep in progress.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// How long a starting agent waits for the sysctl broker's socket.
const BROKER_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Serve GET /metrics and GET /healthz here (plain HTTP): a numeric
    /// address and port, e.g. 10.0.0.5:9750 or `[fd00::5]:9750` (an IPv6
    /// address may also come unbracketed, the part after the last colon
    /// being the port, as `$(HOST_IP):9750` expands). No default: give the
    /// node's own address, not 0.0.0.0.
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_address, required_unless_present = "once")]
    pub metrics_address: Option<SocketAddr>,
    /// One adoption scan (and the unguarded count, and `--repair-unguarded`
    /// if given) and one stale sweep (unless `--sweep-secs 0`), then exit:
    /// what was adopted, undone and swept is printed on stdout. Exit 0 when
    /// the scan ran and every candidate was judged; 1 when it could not run
    /// (the runtime does not serve podgate's chain, no runtime) or a
    /// candidate failed. Serves no metrics; adoptions still count in the
    /// agent's state dir.
    #[arg(long, conflicts_with = "metrics_address")]
    pub once: bool,
    /// How often the counters are drained and the gauges (records, drift,
    /// IPsec, chain) are read (at most a day).
    #[arg(long, default_value_t = 15, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub metrics_interval_secs: u64,
    /// The agent's own state: its counters (metrics.json), so a restart
    /// neither loses nor recounts.
    #[arg(long, default_value = DEFAULT_AGENT_STATE_DIR, value_name = "DIR")]
    pub agent_state_dir: PathBuf,
    /// Sweep podgate-router's records of dead pods (earlier boot, netns
    /// gone) and what they left on the node this often (at most a year);
    /// 0: off.
    #[arg(long, default_value_t = 300, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(0..=31_536_000))]
    pub sweep_secs: u64,
    /// Adopt sandboxes that started without podgate's chain (see
    /// conf/kubernetes/README.md, Adoption) on every collection; needs the
    /// runtime (not with `--runtime-endpoint none`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub adopt: bool,
    /// Stop, through CRI, ready sandboxes that may have been wired without
    /// the tunnel guard (created while it was not in the chain the runtime
    /// served, while the node requires IPsec), so the kubelet recreates
    /// them through the chain. Excluded namespaces and host-network
    /// sandboxes never.
    #[arg(long)]
    pub repair_unguarded: bool,
    /// With --repair-unguarded: log what would be stopped, stop nothing.
    #[arg(long, requires = "repair_unguarded")]
    pub dry_run: bool,
    /// With --repair-unguarded: stop at most this many sandboxes a minute.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub repair_per_minute: usize,
    /// Open every sysctl write (adoption's, the sweep's restore of the
    /// node's strict settings) through the sysctl broker serving here
    /// (`podgate sysctl-broker`, the DaemonSet's `sysctl-broker` container:
    /// the agent's own /proc/sys is read-only). Without it, writes go
    /// through this process's /proc/sys (the agent run on a node by hand).
    #[arg(long, value_name = "PATH")]
    pub sysctl_broker: Option<PathBuf>,
    /// podgate-router's `stateDir`, for the sweep.
    #[arg(long, default_value = podgate_router::config::DEFAULT_STATE_DIR, value_name = "DIR")]
    pub router_state_dir: PathBuf,
    /// The chain `podgate_install_ready` judges: the installer's flags, read only.
    #[command(flatten)]
    pub chain: ChainArgs,
    #[command(flatten)]
    pub log: AgentLogArgs,
}

/// `ADDR:PORT`, IPv6 bracketed or not (the port is required, so the last
/// colon separates it; an unbracketed `::` is refused as ambiguous).
fn parse_address(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.rsplit_once(':')
        .and_then(|(ip, port)| {
            Some(SocketAddr::new(
                ip.parse::<IpAddr>().ok()?,
                port.parse().ok()?,
            ))
        })
        // `::1` is not "[::]:1".
        .filter(|a| !a.ip().is_unspecified())
        .ok_or_else(|| {
            format!("{s:?}: give a numeric ADDR:PORT, e.g. 10.0.0.5:9750 or [fd00::5]:9750")
        })
}

/// The collections and sweeps, on a thread of their own.
struct Worker {
    stop: mpsc::Sender<()>,
    done: mpsc::Receiver<()>,
}

impl Worker {
    fn start(
        probe: ChainProbe,
        mut spool: Spool,
        interval: Duration,
        mut sweep: Option<Sweep>,
        mut adopter: Option<Adopter>,
        pages: Arc<http::Pages>,
    ) -> Result<Worker, Error> {
        let (stop, stopped) = mpsc::channel::<()>();
        let (finished, done) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("agent-worker".into())
            .spawn(move || {
                let watched = Arc::clone(&pages);
                let mut next_collection = Instant::now();
                supervised(&watched, move || loop {
                    let now = Instant::now();
                    if next_collection <= now {
                        let scan = adopter.as_mut().map(|a| adopt_round(a, &probe, &mut spool));
                        let mut snap = metrics::collect_once(&probe, &mut spool);
                        if let Some(scan) = scan {
                            snap.take_scan(&scan);
                        }
                        pages.publish(metrics::exposition::render(snap));
                        next_collection = now + interval;
                    }
                    if let Some(s) = sweep.as_mut() {
                        s.tick(now);
                        pages.alive();
                    }
                    let wake = sweep
                        .as_ref()
                        .map_or(next_collection, |s| s.next().min(next_collection));
                    let wait = wake.saturating_duration_since(Instant::now());
                    match stopped.recv_timeout(wait) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                });
                let _ = finished.send(());
            })
            .map_err(Error::sys(Daemon::Agent, "worker thread"))?;
        Ok(Worker { stop, done })
    }

    /// Ask the worker to stop; wait for a round in progress, boundedly (its
    /// files are written atomically, so exiting during one loses nothing).
    fn stop(self) {
        let _ = self.stop.send(());
        if self.done.recv_timeout(STOP_WAIT).is_err() {
            warn(format!(
                "a collection or sweep was still running after {}s; exiting anyway",
                STOP_WAIT.as_secs()
            ));
        }
    }
}

/// Runs `body` (the worker's loop) and, should it panic, fails the pages at
/// once: `/healthz` answers 503 and `/metrics` shows
/// `podgate_install_ready 0` with the collection error `worker`, instead
/// of the last collection served as if current until the liveness probe
/// sees no new round (minutes; forever when run by hand). The process
/// keeps serving that until it is restarted (the liveness probe) or
/// stopped.
fn supervised(pages: &http::Pages, body: impl FnOnce()) {
    let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) else {
        return;
    };
    let why = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into());
    info(format!(
        "error: the collection worker panicked: {why}; /healthz fails and podgate_install_ready is 0 until the agent is restarted"
    ));
    let mut snap = metrics::Snapshot {
        install_reason: Some(format!("the agent's collection worker panicked: {why}")),
        ..Default::default()
    };
    snap.errors.insert("worker", 1);
    pages.fail(&why, metrics::exposition::render(snap));
}

/// One adoption scan, logged and counted.
fn adopt_round(a: &mut Adopter, probe: &ChainProbe, spool: &mut Spool) -> crate::adopt::Scan {
    let scan = a.scan(probe);
    for e in &scan.errors {
        warn(format!("adoption: {e}"));
    }
    for e in count(spool, &scan) {
        warn(e);
    }
    scan
}

/// Count a scan's adoptions (by profile) and refused candidates (by rule);
/// what could not be counted.
fn count(spool: &mut Spool, scan: &Scan) -> Vec<String> {
    let mut failed = Vec::new();
    for (_, profile) in &scan.adopted {
        if let Err(e) = spool.count_adopted(profile) {
            failed.push(format!("counting an adoption: {e}"));
        }
    }
    for rule in &scan.refused {
        if let Err(e) = spool.count_refusal(rule) {
            failed.push(format!("counting a refused adoption: {e}"));
        }
    }
    failed
}

/// `--once`: one adoption scan (counted as the daemon counts) and one
/// sweep, each outcome a line on stdout; Err when the scan could not run,
/// a candidate failed or the sweep failed.
fn once(
    probe: &ChainProbe,
    mut spool: Spool,
    adopter: Option<Adopter>,
    sweep: Option<&Sweep>,
) -> Result<(), Error> {
    let mut failed = Vec::new();
    match adopter {
        None => failed.push("no runtime (--runtime-endpoint none): no sandboxes to adopt".into()),
        Some(mut a) => {
            let scan = a.scan(probe);
            for (pod, profile) in &scan.adopted {
                println!("adopted {pod}: profile {profile:?}");
            }
            failed.extend(count(&mut spool, &scan));
            for line in &scan.stopped_meanwhile {
                println!("{line}");
            }
            if let Some(n) = scan.unguarded {
                println!("unguarded sandboxes: {n}");
            }
            for id in &scan.stopped {
                println!("stopped unguarded sandbox {id}");
            }
            if scan.adopted.is_empty() && scan.skipped.is_none() && scan.errors.is_empty() {
                println!("adoption: nothing to adopt");
            }
            failed.extend(scan.skipped.map(|why| format!("not adopting: {why}")));
            failed.extend(scan.errors);
        }
    }
    if let Some(s) = sweep {
        let swept = s.sweep();
        for r in &swept.removed {
            println!("swept {r}");
        }
        for q in &swept.quarantined {
            println!("swept: {q}");
        }
        failed.extend(swept.failures.iter().map(|f| format!("sweep: {f}")));
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(Error::PassFailed(failed)),
    }
}

/// The broker's container starts beside the agent's: give it a moment to
/// make its socket before the first adoption needs it (writes fail, naming
/// the socket, while it is missing).
fn wait_for_broker(socket: &std::path::Path) {
    let start = Instant::now();
    while !socket.exists() {
        if start.elapsed() > BROKER_WAIT {
            warn(format!(
                "no sysctl broker at {} after {}s; sysctl writes fail until it is there",
                socket.display(),
                BROKER_WAIT.as_secs()
            ));
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn terminated(mut term: tokio::signal::unix::Signal, mut int: tokio::signal::unix::Signal) {
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    info(format!("{name}: stopping"));
}

pub fn run(args: &AgentArgs) -> Result<(), Error> {
    crate::logging::set(&args.log, "agent");
    let probe = ChainProbe::new(&args.chain)?;
    let spool = Spool::open(&args.agent_state_dir)?;
    let interval = Duration::from_secs(args.metrics_interval_secs.max(1));
    // Unhealthy once no round finished for three intervals (a collection
    // or sweep stuck on the kernel), but never under a minute.
    let pages = http::Pages::new((interval * 3).max(Duration::from_secs(60)));
    let sweep = Sweep::new(args.router_state_dir.clone(), args.sweep_secs);
    let repair = args
        .repair_unguarded
        .then(|| Repair::new(args.dry_run, args.repair_per_minute.max(1)));
    if let Some(socket) = &args.sysctl_broker {
        wait_for_broker(socket);
        podgate_kit::sysctl::use_broker(socket.clone());
    }
    // Without a runtime there are no sandboxes to look at.
    let adopter = if args.chain.runtime_endpoint.as_deref() == Some("none") {
        None
    } else {
        Some(Adopter::new(
            HistoryFile::new(&args.chain.node.state_dir)?,
            args.adopt,
            repair,
        ))
    };
    if args.once {
        return once(&probe, spool, adopter, sweep.as_ref());
    }
    let addr = args.metrics_address.ok_or(Error::NoMetricsAddress)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::sys(Daemon::Agent, "tokio runtime"))?;
    rt.block_on(async {
        let listener = http::bind(addr).map_err(|source| Error::MetricsBind { addr, source })?;
        let signal =
            |kind| tokio::signal::unix::signal(kind).map_err(Error::sys(Daemon::Agent, "signals"));
        let term = signal(tokio::signal::unix::SignalKind::terminate())?;
        let int = signal(tokio::signal::unix::SignalKind::interrupt())?;
        let adopting = adopter.is_some();
        let worker = Worker::start(
            probe,
            spool,
            interval,
            sweep.clone(),
            adopter,
            Arc::clone(&pages),
        )?;
        info(format!(
            "serving http://{addr}/metrics and /healthz, collecting every {}s; {}; {}",
            interval.as_secs(),
            match &sweep {
                Some(s) => format!(
                    "sweeping {} every {}s",
                    s.state_dir.display(),
                    s.every.as_secs()
                ),
                None => "sweep off".into(),
            },
            match (adopting, args.adopt) {
                (true, true) => "adopting",
                _ => "adoption off",
            }
        ));
        http::serve(listener, pages, http::LIMITS, terminated(term, int)).await;
        worker.stop();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker round that panics (the closure below is the fixture):
    /// `/healthz` fails and `/metrics` says not ready at once, although a
    /// collection was published a moment before.
    #[test]
    fn a_panicking_worker_fails_healthz_and_readiness_at_once() {
        let pages = http::Pages::new(Duration::from_secs(3600));
        pages.publish("podgate_install_ready 1\n".into());
        assert_eq!(pages.health(), Ok(()));
        let watched = Arc::clone(&pages);
        std::thread::spawn(move || supervised(&watched, || panic!("fixture: a round panics")))
            .join()
            .unwrap();
        let why = pages.health().unwrap_err().to_string();
        assert!(why.contains("fixture: a round panics"), "{why}");
        let page = String::from_utf8(pages.metrics().unwrap().to_vec()).unwrap();
        assert!(page.contains("podgate_install_ready 0\n"), "{page}");
        assert!(
            page.contains("podgate_metrics_collect_errors{source=\"worker\"} 1\n"),
            "{page}"
        );
        // A later round cannot make it look alive again.
        pages.alive();
        assert!(pages.health().is_err());
    }

    #[test]
    fn the_address_takes_a_port_after_ipv4_and_bracketed_or_bare_ipv6() {
        let ok = |s: &str| parse_address(s).unwrap().to_string();
        assert_eq!(ok("10.0.0.5:9750"), "10.0.0.5:9750");
        assert_eq!(ok("[fd00::5]:9750"), "[fd00::5]:9750");
        assert_eq!(ok("fd00::5:9750"), "[fd00::5]:9750");
        for bad in [
            "",
            "9750",
            "10.0.0.5",
            "node-1:9750",
            ":9750",
            "::1",
            "10.0.0.5:99999",
        ] {
            assert!(parse_address(bad).is_err(), "{bad}");
        }
    }
}
