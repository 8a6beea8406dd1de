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
//! * `args`: the command-line arguments and the node and chain they
//!   describe; `commands`: [`install`] and [`uninstall`]; `logging`: the
//!   installer's and the agent's own log lines, each at an explicit level.
//! * `watch`: `--watch` (inotify, debounce, resync, ready file, SIGTERM).
//! * [`readiness()`]: whether the chain is in place and loaded
//!   ([`Readiness`]), for `--check` and the agent's `podgate_install_ready`
//!   alike.
//! * `adopt`: the agent's scan applying the profile to sandboxes that
//!   started without the chain (evidence: `history`).
//! * [`validate`]: podgate's entries checked by the plugins' own config code
//!   (also by `podgate admission render`).
//! * `migrate`: earlier releases' records, taken as far as the conf dir
//!   confirms them.
//! * [`sysctl_broker`], [`cri_proxy`]: the containers that hold a writable
//!   `/proc/sys/net` and the runtime's socket for the agent, which has
//!   neither.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

mod adopt;
pub use adopt::unguarded;
pub mod agent;
mod args;
pub use args::{
    AgentLogArgs, ChainArgs, InstallArgs, NodeArgs, UninstallArgs, DEFAULT_BIN_DIR,
    DEFAULT_CONFLIST_NAME, DEFAULT_CONF_DIR, DEFAULT_PLUGINS_FILE, DEFAULT_STATE_DIR,
    LEGACY_STATE_DIR,
};
pub mod chain;
mod commands;
pub use commands::{install, uninstall};
pub mod cri_proxy;
mod error;
pub use error::{Daemon, Error};
pub mod fsx;
mod history;
pub mod json;
mod logging;
pub mod metrics;
mod migrate;
mod readiness;
pub use readiness::{readiness, ChainProbe, Readiness};
mod reconcile;
mod runtime;
mod socket;
mod state;
pub use state::RecordRefusal;
mod sweep;
mod sys;
pub mod sysctl_broker;
#[cfg(test)]
mod testing;
pub mod validate;
mod watch;
