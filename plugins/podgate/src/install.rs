//! `podgate install` / `podgate uninstall`: put podgate's plugin binaries into
//! the node's CNI bin dir and chain podgate's entries at the end of the
//! primary network's conflist (the file the runtime loads first), keeping
//! every other byte of it the primary's; and take both out again.
//!
//! * [`chain`]: pure conflist transformations (merge, strip, `.conf`
//!   conversion); [`json`]: a key-order-preserving JSON value for them.
//! * [`reconcile`]: one install / check / uninstall pass over the dirs.
//! * [`state`]: the primary's original bytes, for a byte-exact uninstall.
//! * [`watch`]: `--watch` (inotify, debounce, resync, readiness, SIGTERM).
//! * [`validate`]: podgate's entries checked by the plugins' own config code.

mod chain;
mod fsx;
mod json;
mod reconcile;
mod state;
mod sweep;
mod sys;
mod validate;
mod watch;

use clap::Args;
use reconcile::{Node, Source};
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// Under podgate-router's default stateDir, in a subdir its state store skips.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni/podgate/installer";
/// Where the DaemonSet mounts the ConfigMap's `plugins.json`.
pub const DEFAULT_PLUGINS_FILE: &str = "/etc/podgate/plugins.json";

#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    /// Where the container runtime looks for CNI binaries.
    #[arg(long, default_value = DEFAULT_BIN_DIR, value_name = "DIR")]
    pub cni_bin_dir: PathBuf,
    /// Where the container runtime looks for CNI configs.
    #[arg(long, default_value = DEFAULT_CONF_DIR, value_name = "DIR")]
    pub cni_conf_dir: PathBuf,
    /// Directory holding the podgate-router and podgate-tunnel-guard binaries
    /// to install [default: the directory of this executable].
    #[arg(long, value_name = "DIR")]
    pub source_dir: Option<PathBuf>,
    /// podgate's plugin entries: a JSON array of plugin objects (each of type
    /// podgate-*), e.g. a mounted ConfigMap key. Re-read on every pass.
    #[arg(long, default_value = DEFAULT_PLUGINS_FILE, value_name = "FILE")]
    pub plugins: PathBuf,
    /// Chain into this file of --cni-conf-dir instead of the first
    /// .conflist/.conf/.json in lexical order (the one runtimes load).
    #[arg(long, value_name = "FILE")]
    pub primary: Option<String>,
    /// Where the primary's original bytes are kept for uninstall.
    #[arg(long, default_value = DEFAULT_STATE_DIR, value_name = "DIR")]
    pub state_dir: PathBuf,
    /// Keep running and re-chain whenever the conf dir, the binaries or the
    /// plugins file change; stop on SIGTERM/SIGINT (SIGHUP: re-check now).
    #[arg(long)]
    pub watch: bool,
    /// File present only while the chain is in place (written after a
    /// successful pass, removed when a pass fails and on exit).
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<PathBuf>,
    /// Change nothing: exit 0 if the chain and binaries are in place and
    /// current, 1 otherwise (for a readiness probe).
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
    /// With --watch: sweep podgate-router's records of dead pods (earlier
    /// boot, netns gone) and what they left on the node this often; 0: off.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub sweep_secs: u64,
    /// With --watch: podgate-router's `stateDir`, for the sweep.
    #[arg(long, default_value = podgate_router::config::DEFAULT_STATE_DIR, value_name = "DIR")]
    pub router_state_dir: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct UninstallArgs {
    /// Where the container runtime looks for CNI binaries.
    #[arg(long, default_value = DEFAULT_BIN_DIR, value_name = "DIR")]
    pub cni_bin_dir: PathBuf,
    /// Where the container runtime looks for CNI configs.
    #[arg(long, default_value = DEFAULT_CONF_DIR, value_name = "DIR")]
    pub cni_conf_dir: PathBuf,
    /// Where install kept the primary's original bytes.
    #[arg(long, default_value = DEFAULT_STATE_DIR, value_name = "DIR")]
    pub state_dir: PathBuf,
    /// Also remove podgate-router and podgate-tunnel-guard from --cni-bin-dir
    /// (only once no pod on the node still needs them for its DEL).
    #[arg(long)]
    pub remove_binaries: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Io(#[from] fsx::IoError),
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error(transparent)]
    Chain(#[from] chain::ChainError),
    #[error("plugins file {}: {msg}", path.display())]
    PluginsFile { path: PathBuf, msg: String },
    #[error("no CNI config (*.conflist, *.conf, *.json) in {}: the primary CNI has not written one yet", .0.display())]
    NoPrimary(PathBuf),
    #[error("--primary {name}: no such file in {}", dir.display())]
    PrimaryMissing { name: String, dir: PathBuf },
    #[error("--primary {0:?}: give a file name inside --cni-conf-dir")]
    BadPrimary(String),
    #[error("{0} vanished while being read (its writer is replacing it)")]
    Vanished(String),
    #[error("{0} is not UTF-8 text")]
    NotUtf8(String),
    #[error("cannot convert {conf}: {target} already exists and was not written by podgate")]
    Conflict { conf: String, target: String },
    #[error("encoding JSON: {0}")]
    Encode(serde_json::Error),
    #[error("--source-dir not given and this executable's directory is unknown: {0}")]
    SourceDir(std::io::Error),
    #[error("not chained: {0}")]
    NotChained(String),
    #[error("watch: {0}")]
    Watch(String),
}

impl InstallError {
    /// Whether `--watch` keeps waiting (something the primary or the operator
    /// fixes by writing a file) rather than exiting for a restart.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            InstallError::Chain(_)
                | InstallError::PluginsFile { .. }
                | InstallError::NoPrimary(_)
                | InstallError::PrimaryMissing { .. }
                | InstallError::Vanished(_)
                | InstallError::NotUtf8(_)
                | InstallError::Conflict { .. }
        )
    }
}

/// One line on stderr: `<RFC 3339 time> podgate installer: <msg>`.
pub(crate) fn log(msg: impl std::fmt::Display) {
    eprintln!(
        "{} podgate installer: {msg}",
        podgate_cni::log::rfc3339_now()
    );
}

/// The running executable's directory: /proc/self/exe, else argv[0] when it
/// is a path (no /proc, e.g. in a bare chroot).
fn exe_dir() -> Result<PathBuf, InstallError> {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => std::env::args_os()
            .next()
            .map(PathBuf::from)
            .filter(|p| p.components().count() > 1)
            .ok_or(InstallError::SourceDir(e))?,
    };
    exe.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| InstallError::SourceDir(std::io::Error::from(std::io::ErrorKind::NotFound)))
}

fn source_of(args: &InstallArgs) -> Result<Source, InstallError> {
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
                .ok_or_else(|| InstallError::BadPrimary(p.clone()))?;
            // A path is fine when it points into the conf dir.
            let parent = path.parent().filter(|d| !d.as_os_str().is_empty());
            if let Some(dir) = parent {
                let same = dir.canonicalize().ok() == args.cni_conf_dir.canonicalize().ok();
                if !same {
                    return Err(InstallError::BadPrimary(p.clone()));
                }
            }
            Some(name)
        }
    };
    Ok(Source {
        binaries_dir,
        plugins_file: args.plugins.clone(),
        primary,
    })
}

fn node_of(bin: &std::path::Path, conf: &std::path::Path, state: &std::path::Path) -> Node {
    Node {
        conf_dir: conf.into(),
        bin_dir: bin.into(),
        state: state::StateDir::new(state),
    }
}

pub fn install(args: &InstallArgs) -> Result<(), InstallError> {
    let node = node_of(&args.cni_bin_dir, &args.cni_conf_dir, &args.state_dir);
    let src = source_of(args)?;
    if args.check {
        let entries = reconcile::load_entries(&src.plugins_file)?;
        return match reconcile::status(&node, &src, &entries)? {
            Ok(file) => {
                println!("chained: {file}");
                Ok(())
            }
            Err(reason) => Err(InstallError::NotChained(reason)),
        };
    }
    if args.watch {
        let opts = watch::WatchOpts {
            debounce: Duration::from_millis(args.debounce_ms),
            max_delay: Duration::from_millis(args.debounce_ms.saturating_mul(10).max(1000)),
            resync: Duration::from_secs(args.resync_secs.max(1)),
            ready_file: args.ready_file.clone(),
            uninstall_on_exit: args.uninstall_on_exit,
            sweep: sweep::Sweep::new(args.router_state_dir.clone(), args.sweep_secs),
        };
        return watch::run(&node, &src, &opts);
    }
    match reconcile::install_once(&node, &src) {
        Ok(applied) => {
            log(&applied);
            if let Some(ready) = &args.ready_file {
                watch::write_ready_file(ready, applied.file())?;
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

pub fn uninstall(args: &UninstallArgs) -> Result<(), InstallError> {
    let node = node_of(&args.cni_bin_dir, &args.cni_conf_dir, &args.state_dir);
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
    Ok(())
}
