//! podgate-install: the node-side jobs of the `podgate` binary, split by
//! privilege.
//!
//! The installer (`podgate install` / `podgate uninstall`) puts podgate's
//! plugin binaries into the node's CNI bin dir and writes podgate's own
//! conflist, sorting before the primary network's file: the primary's
//! plugins followed by podgate's, re-rendered whenever the primary's file
//! changes (the primary's file itself is never written); and takes both out
//! again. It is the only writer of the CNI dirs and of its records, and
//! needs no capability.
//!
//! The node agent (`podgate agent`, [`agent`]) serves the Prometheus
//! metrics ([`metrics`]), checks attachments for drift and sweeps dead pods'
//! records; it reads the CNI dirs and never writes them.
//!
//! * [`chain`]: pure conflist transformations (merge, strip, `.conf`
//!   conversion); [`json`]: a key-order-preserving JSON value for them.
//! * `reconcile`: one install / check / uninstall pass over the dirs.
//! * `state`: what was written (and, for files an earlier podgate chained
//!   in place, the primary's original bytes).
//! * `runtime`: readiness, from what the container runtime loaded (CRI).
//! * `history`: when the installer saw the runtime serve the chain (per boot).
//! * `watch`: `--watch` (inotify, debounce, resync, ready file, SIGTERM).
//! * [`readiness`]: whether the chain is in place and loaded, for `--check`
//!   and the agent's `podgate_install_ready` alike.
//! * `adopt`: the agent's scan applying the profile to sandboxes that
//!   started without the chain (evidence: `history`).
//! * [`validate`]: podgate's entries checked by the plugins' own config code
//!   (also by `podgate admission render`).
//! * `migrate`: earlier releases' records, taken as far as the conf dir
//!   confirms them.
//! * [`sysctl_broker`], [`cri_proxy`]: the containers that hold a writable
//!   `/proc/sys/net` and the runtime's socket for the agent, which has
//!   neither.

#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

mod adopt;
pub use adopt::unguarded;
pub mod agent;
pub mod chain;
pub mod cri_proxy;
mod error;
pub mod fsx;
mod history;
pub mod json;
pub mod metrics;
mod migrate;
mod reconcile;
mod runtime;
mod socket;
mod state;
mod sweep;
mod sys;
pub mod sysctl_broker;
pub mod validate;
mod watch;

use clap::Args;
pub use error::Error;
use reconcile::{Node, Source};
use runtime::Runtime;
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// Apart from podgate-router's state dir (which the node agent, a container
/// with capabilities, writes): the records say which conf-dir files to
/// write, and with what.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/podgate/installer";
/// Where earlier releases kept the installer's records: inside
/// podgate-router's default stateDir (`install --migrate-state-from`; the
/// uninstall purge of that dir removes it).
pub const LEGACY_STATE_DIR: &str = "/var/lib/cni/podgate/installer";
/// Where the DaemonSet mounts the ConfigMap's `plugins.json`.
pub const DEFAULT_PLUGINS_FILE: &str = "/etc/podgate/plugins.json";
/// podgate's own conflist: `00-` sorts before every primary we know of
/// (Kube-OVN `01-`, Cilium `05-`, Calico/Flannel `10-`).
pub const DEFAULT_CONFLIST_NAME: &str = "00-podgate.conflist";

/// The node's CNI directories and podgate's files in them, the same for
/// install and uninstall.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Where the container runtime looks for CNI binaries.
    #[arg(long, default_value = DEFAULT_BIN_DIR, value_name = "DIR")]
    pub cni_bin_dir: PathBuf,
    /// Where the container runtime looks for CNI configs.
    #[arg(long, default_value = DEFAULT_CONF_DIR, value_name = "DIR")]
    pub cni_conf_dir: PathBuf,
    /// podgate's own conflist in --cni-conf-dir; must sort before the
    /// primary's file (runtimes load the first file in lexical order).
    #[arg(long, default_value = DEFAULT_CONFLIST_NAME, value_name = "NAME")]
    pub conflist_name: String,
    /// Where install keeps its records (and the primary's original bytes,
    /// for uninstall).
    #[arg(long, default_value = DEFAULT_STATE_DIR, value_name = "DIR")]
    pub state_dir: PathBuf,
}

impl NodeArgs {
    /// The node these paths describe; refuses a conflist name that is not
    /// a plain `*.conflist` file name.
    fn node(&self) -> Result<Node, Error> {
        let own = &self.conflist_name;
        let plain = !own.contains('/') && !own.starts_with('.') && own.len() > ".conflist".len();
        if !plain || chain::kind_of(own) != Some(chain::Kind::List) {
            return Err(Error::BadConflistName(own.clone()));
        }
        Ok(Node {
            conf_dir: self.cni_conf_dir.clone(),
            bin_dir: self.cni_bin_dir.clone(),
            state: state::StateDir::new(&self.state_dir),
            own_file: own.clone(),
        })
    }
}

/// What podgate's chain on this node is made of: the node's dirs, the
/// binaries and entries to chain, the primary. The installer writes it;
/// `--check` and the agent only judge it ([`readiness`]).
#[derive(Debug, Clone, Args)]
pub struct ChainArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Directory holding the podgate-router and podgate-tunnel-guard binaries
    /// to install [default: the directory of this executable].
    #[arg(long, value_name = "DIR")]
    pub source_dir: Option<PathBuf>,
    /// podgate's plugin entries: a JSON array of plugin objects (each of type
    /// podgate-*), e.g. a mounted ConfigMap key. Re-read on every pass.
    #[arg(long, default_value = DEFAULT_PLUGINS_FILE, value_name = "FILE")]
    pub plugins: PathBuf,
    /// Render from this file of --cni-conf-dir instead of the first
    /// .conflist/.conf/.json in lexical order besides podgate's own (the one
    /// runtimes would load).
    #[arg(long, value_name = "FILE")]
    pub primary: Option<String>,
    /// The CRI socket readiness asks what the runtime loaded (--check, the
    /// ready file, podgate_install_ready) [default: crictl's, first that
    /// answers: unix:///run/containerd/containerd.sock,
    /// unix:///run/crio/crio.sock, unix:///var/run/cri-dockerd.sock];
    /// `none`: trust the conf dir alone.
    #[arg(long, value_name = "ENDPOINT")]
    pub runtime_endpoint: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub chain: ChainArgs,
    /// Keep running and re-chain whenever the conf dir, the binaries or the
    /// plugins file change; stop on SIGTERM/SIGINT (SIGHUP: re-check now).
    #[arg(long)]
    pub watch: bool,
    /// File present only while the chain is in place (written after a
    /// successful pass, removed when a pass fails and on exit).
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<PathBuf>,
    /// Change nothing: exit 0 if the chain and binaries are in place and
    /// current and the runtime loaded the chain, 1 otherwise (one line
    /// saying why; for a readiness probe).
    #[arg(long, conflicts_with_all = ["watch", "uninstall_on_exit"])]
    pub check: bool,
    /// With --watch: take podgate out of the chain on SIGTERM. Off by default:
    /// during a DaemonSet rolling update it would let pods start without podgate.
    #[arg(long, requires = "watch")]
    pub uninstall_on_exit: bool,
    /// With --watch: quiet time after the last change before re-chaining.
    #[arg(long, default_value_t = 200, value_name = "MS")]
    pub debounce_ms: u64,
    /// With --watch: re-check this often even without events.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub resync_secs: u64,
    /// Also accept the entries' host paths (stateDir, logFile, eventFile,
    /// protectionDir, ovsdbSocket, agentSocket) under DIR, besides
    /// podgate's, Kube-OVN's and Open vSwitch's own directories (repeatable;
    /// a node laid out otherwise, tests). An argument of the DaemonSet, not
    /// of the ConfigMap: who may edit the DaemonSet is root on the node.
    #[arg(long, value_name = "DIR")]
    pub plugin_path_root: Vec<PathBuf>,
    /// Before the first pass, take what can be trusted of the records an
    /// earlier release kept in DIR (/var/lib/cni/podgate/installer, which
    /// the node agent can write): only records of files chained in place
    /// whose content checks out against the conf dir; never
    /// runtime-chain.json. DIR is only read.
    #[arg(long, value_name = "DIR", conflicts_with = "check")]
    pub migrate_state_from: Option<PathBuf>,
    #[command(flatten)]
    pub log: AgentLogArgs,
}

/// The installer's and the agent's own log: always stderr (the container log), optionally
/// also a size-bounded JSON-lines file.
#[derive(Debug, Clone, Args)]
pub struct AgentLogArgs {
    /// error, warn, info or debug.
    #[arg(long, default_value = "info", value_parser = parse_level, value_name = "LEVEL")]
    pub log_level: podgate_cni::log::Level,
    /// Also write JSON lines here, rotated to FILE.1 at --log-max-bytes.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    #[arg(long, default_value_t = podgate_cni::log::DEFAULT_MAX_BYTES, value_name = "BYTES")]
    pub log_max_bytes: u64,
}

fn parse_level(s: &str) -> Result<podgate_cni::log::Level, String> {
    podgate_cni::log::Level::parse(s)
        .ok_or_else(|| format!("{s:?}: use error, warn, info or debug"))
}

/// The log settings and the component name (`installer` or `agent`).
static AGENT_LOG: std::sync::OnceLock<(AgentLogArgs, &'static str)> = std::sync::OnceLock::new();

pub(crate) fn set_log(args: &AgentLogArgs, component: &'static str) {
    let _ = AGENT_LOG.set((args.clone(), component));
}

#[derive(Debug, Clone, Args)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Also remove podgate-router and podgate-tunnel-guard from --cni-bin-dir
    /// (only once no pod on the node still needs them for its DEL).
    #[arg(long)]
    pub remove_binaries: bool,
    /// Change nothing: exit 0 if nothing of podgate's is left in the conf dir
    /// (and, with --remove-binaries, the bin dir), 1 otherwise (for a
    /// readiness probe).
    #[arg(long, conflicts_with = "wait")]
    pub check: bool,
    /// After uninstalling, keep running until SIGTERM/SIGINT: the container
    /// of an uninstall DaemonSet stays up (and ready) instead of restarting.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: on SIGTERM, remove what podgate made in this dir
    /// (podgate-router's `stateDir`, with the agent's subdir and earlier
    /// releases' installer subdir; other names stay) if it holds no
    /// attachment record any more; kept, with a warning, while one is left.
    /// The installer's --state-dir loses its lock and runtime-chain.json
    /// once it holds no installer record.
    #[arg(long, requires = "wait", value_name = "DIR")]
    pub purge_state_dir: Option<PathBuf>,
}

/// One line on stderr: `<RFC 3339 time> podgate <component>: <msg>`, and in
/// `--log-file` if given; messages starting with `warning` are level warn.
pub(crate) fn log(msg: impl std::fmt::Display) {
    let msg = msg.to_string();
    let level = if msg.starts_with("warning") {
        podgate_cni::log::Level::Warn
    } else {
        podgate_cni::log::Level::Info
    };
    log_at(level, &msg);
}

pub(crate) fn log_at(level: podgate_cni::log::Level, msg: &str) {
    use podgate_cni::log::{append_line, rfc3339_now, Limit};
    let (cfg, component) = match AGENT_LOG.get() {
        Some((c, name)) => (Some(c), *name),
        None => (None, "installer"),
    };
    if level > cfg.map_or(podgate_cni::log::Level::Info, |c| c.log_level) {
        return;
    }
    let ts = rfc3339_now();
    podgate_cni::log::stderr_line(&format!("{ts} podgate {component}: {msg}"));
    if let Some((file, max)) = cfg.and_then(|c| c.log_file.as_ref().map(|f| (f, c.log_max_bytes))) {
        let line = serde_json::json!({"ts": ts, "level": level.as_str(), "component": format!("podgate-{component}"), "msg": msg});
        let max = max.max(podgate_cni::log::MIN_MAX_BYTES);
        if let Err(e) = append_line(file, &line.to_string(), Limit::Rotate(max)) {
            podgate_cni::log::stderr_line(&format!(
                "{ts} podgate {component}: log file {}: {e}",
                file.display()
            ));
        }
    }
}

/// Whether podgate's chain is in place as configured and the runtime
/// loaded it: `Ok(Ok(file))` with podgate's chained file, `Ok(Err(why
/// not))`, or an error reading the node. The one readiness test: `podgate
/// install --check` (the readiness probe) and the agent's
/// `podgate_install_ready` both ask it.
pub fn readiness(args: &ChainArgs) -> Result<Result<String, String>, Error> {
    ChainProbe::new(args)?.readiness()
}

/// What the metrics read from the chain: its [`readiness`] and podgate's
/// entries.
#[derive(Debug, Clone)]
pub struct ChainProbe {
    node: Node,
    src: Source,
    runtime: Runtime,
}

impl ChainProbe {
    pub fn new(args: &ChainArgs) -> Result<ChainProbe, Error> {
        Ok(ChainProbe {
            node: args.node.node()?,
            src: source_of(args)?,
            runtime: Runtime::from_arg(args.runtime_endpoint.as_deref()),
        })
    }

    /// [`readiness`] of this chain.
    fn readiness(&self) -> Result<Result<String, String>, Error> {
        let entries = reconcile::load_entries(&self.src.plugins_file)?;
        runtime::ready(&self.node, &self.src, &entries, &self.runtime)
    }

    /// Ok(chained file) or Err(why not).
    pub fn ready(&self) -> Result<String, String> {
        self.readiness().map_err(|e| e.to_string())?
    }

    /// podgate's plugin entries as configured (the plugins file).
    pub fn entries(&self) -> Result<Vec<serde_json::Value>, String> {
        reconcile::load_entries(&self.src.plugins_file)
            .map_err(|e| e.to_string())?
            .iter()
            .map(|j| j.to_value().map_err(|e| e.to_string()))
            .collect()
    }
}

/// The running executable's directory: /proc/self/exe, else argv[0] when it
/// is a path (no /proc, e.g. in a bare chroot).
fn exe_dir() -> Result<PathBuf, Error> {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => std::env::args_os()
            .next()
            .map(PathBuf::from)
            .filter(|p| p.components().count() > 1)
            .ok_or(Error::SourceDir(e))?,
    };
    exe.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| Error::SourceDir(std::io::Error::from(std::io::ErrorKind::NotFound)))
}

fn source_of(args: &ChainArgs) -> Result<Source, Error> {
    let binaries_dir = match &args.source_dir {
        Some(d) => d.clone(),
        None => exe_dir()?,
    };
    let primary = match &args.primary {
        None => None,
        Some(p) => {
            let path = std::path::Path::new(p);
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| Error::BadPrimary(p.clone()))?;
            // A path is fine when it points into the conf dir.
            let parent = path.parent().filter(|d| !d.as_os_str().is_empty());
            if let Some(dir) = parent {
                let same = dir.canonicalize().ok() == args.node.cni_conf_dir.canonicalize().ok();
                if !same {
                    return Err(Error::BadPrimary(p.clone()));
                }
            }
            Some(name)
        }
    };
    Ok(Source {
        binaries_dir,
        plugins_file: args.plugins.clone(),
        primary,
        host_paths: validate::HostPaths {
            extra_roots: Vec::new(),
            installer_state: args.node.state_dir.clone(),
        },
    })
}

/// How long a one-shot install with --ready-file gives the runtime to load
/// the chain it just wrote.
const ONE_SHOT_WAIT: Duration = Duration::from_secs(10);

pub fn install(args: &InstallArgs) -> Result<(), Error> {
    set_log(&args.log, "installer");
    if args.check {
        return match readiness(&args.chain)? {
            Ok(file) => {
                println!("chained: {file}");
                Ok(())
            }
            Err(reason) => Err(Error::NotChained(reason)),
        };
    }
    let node = args.chain.node.node()?;
    let mut src = source_of(&args.chain)?;
    src.host_paths.extra_roots = args.plugin_path_root.clone();
    let runtime = Runtime::from_arg(args.chain.runtime_endpoint.as_deref());
    if let Some(old) = &args.migrate_state_from {
        if old != &args.chain.node.state_dir {
            for line in migrate::from(old, &node)? {
                log(line);
            }
        }
    }
    if args.watch {
        let opts = watch::WatchOpts {
            debounce: Duration::from_millis(args.debounce_ms),
            max_delay: Duration::from_millis(args.debounce_ms.saturating_mul(10).max(1000)),
            resync: Duration::from_secs(args.resync_secs.max(1)),
            ready_file: args.ready_file.clone(),
            uninstall_on_exit: args.uninstall_on_exit,
            history: match runtime {
                Runtime::FileOnly => None,
                _ => Some(history::HistoryFile::new(&args.chain.node.state_dir)?),
            },
            runtime,
        };
        return watch::run(&node, &src, &opts);
    }
    match reconcile::install_once(&node, &src) {
        Ok(applied) => {
            log(&applied);
            if let Some(ready) = &args.ready_file {
                match runtime::wait_ready(&node, &src, &runtime, ONE_SHOT_WAIT)? {
                    Ok(file) => watch::write_ready_file(ready, &file)?,
                    Err(why) => {
                        watch::remove_ready_file(ready);
                        log(format!("not ready: {why}"));
                    }
                }
            }
            Ok(())
        }
        Err(e) => {
            if let Some(ready) = &args.ready_file {
                watch::remove_ready_file(ready);
            }
            Err(e)
        }
    }
}

pub fn uninstall(args: &UninstallArgs) -> Result<(), Error> {
    let node = args.node.node()?;
    if args.check {
        let left = reconcile::leftovers(&node, args.remove_binaries)?;
        if !left.is_empty() {
            return Err(Error::NotUninstalled(left.join(", ")));
        }
        println!("uninstalled: nothing of podgate's left");
        return Ok(());
    }
    // Signals blocked before the work, so a SIGTERM during it is not lost.
    let signals = match args.wait {
        true => Some(sys::Signals::new().map_err(|e| Error::Watch(format!("signalfd: {e}")))?),
        false => None,
    };
    for msg in reconcile::unchain_all(&node)? {
        log(msg);
    }
    if args.remove_binaries {
        let removed = reconcile::remove_binaries(&node)?;
        if !removed.is_empty() {
            log(format!(
                "removed {} from {}",
                removed.join(", "),
                node.bin_dir.display()
            ));
        }
    }
    if let Some(signals) = signals {
        log("uninstalled; waiting for SIGTERM");
        loop {
            sys::poll_readable([signals.fd()], Duration::from_secs(3600))
                .map_err(|e| Error::Watch(format!("poll: {e}")))?;
            match signals.read() {
                Ok(Some(libc::SIGHUP)) | Ok(None) => {}
                Ok(Some(sig)) => {
                    log(format!("signal {sig}: stopping"));
                    break;
                }
                Err(e) => return Err(Error::Watch(format!("signalfd: {e}"))),
            }
        }
        if let Some(dir) = &args.purge_state_dir {
            purge_state_dir(dir, &args.node.state_dir)?;
            if node.state.purge_unless_records()? {
                log(format!(
                    "emptied {}: no installer record left",
                    args.node.state_dir.display()
                ));
            }
        }
    }
    Ok(())
}

/// Removes what podgate made in `dir` (keeps the dir itself, which may be a
/// mount point, and every name podgate did not make: another network's
/// `stateDir` placed under it, an operator's file) unless podgate-router
/// still holds an attachment record there; under podgate-router's
/// node-wide lock, so an ADD still running from the old chain is either
/// seen or runs after. The subdirectories it removes: the agent's default
/// state dir, the installer's of earlier releases ([`LEGACY_STATE_DIR`])
/// and `installer_dir`, the installer's own, when it is a subdirectory of
/// `dir`.
fn purge_state_dir(dir: &std::path::Path, installer_dir: &std::path::Path) -> Result<(), Error> {
    let Some(store) = podgate_kit::state::StateStore::existing(dir)? else {
        return Ok(());
    };
    let inflight = format!("{}.inflight", podgate_cni::event::EVENT_FILE_NAME);
    let name = |p: &std::path::Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let defaults = [LEGACY_STATE_DIR, agent::DEFAULT_AGENT_STATE_DIR].map(std::path::Path::new);
    let configured = (installer_dir.parent() == Some(dir))
        .then(|| name(installer_dir))
        .flatten();
    let subdirs: Vec<String> = defaults
        .into_iter()
        .filter_map(name)
        .chain(configured)
        .collect();
    let ours = |name: &str| {
        podgate_router::lifecycle::STATE_DIR_NAMES.contains(&name)
            || name == podgate_cni::event::EVENT_FILE_NAME
            || name == inflight
            || fsx::is_temp_name(name)
            || subdirs.iter().any(|s| s == name)
    };
    let (removed, foreign) = match store.purge_unless_records(ours)? {
        podgate_kit::state::Purge::RecordsLeft(n) => {
            log(format!(
                "warning: {n} attachment record(s) left in {}: kept (their pods still run; the agent's sweep removes them once they are gone)",
                dir.display()
            ));
            return Ok(());
        }
        podgate_kit::state::Purge::Emptied { removed, foreign } => (removed, foreign),
    };
    log(format!(
        "emptied {}: no attachment record left; {removed} entries podgate made removed",
        dir.display()
    ));
    if !foreign.is_empty() {
        log(format!(
            "left in {}: {} (not podgate's)",
            dir.display(),
            foreign.join(", ")
        ));
    }
    Ok(())
}
