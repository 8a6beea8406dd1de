//! The installer's command-line arguments (clap), their defaults, and the
//! node and chain they describe.

use crate::reconcile::{Node, Source};
use crate::{chain, state, validate, Error};
use clap::Args;
use std::path::PathBuf;

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
    pub(crate) fn node(&self) -> Result<Node, Error> {
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
/// `--check` and the agent only judge it ([`crate::readiness()`]).
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

/// The running executable's directory: /proc/self/exe, else `argv[0]` when it
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

pub(crate) fn source_of(args: &ChainArgs) -> Result<Source, Error> {
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
