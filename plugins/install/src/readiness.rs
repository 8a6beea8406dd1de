//! Whether podgate's chain is in place as configured and the runtime loaded
//! it: the one readiness test, asked by `podgate install --check` (the
//! readiness probe), the `--ready-file`, the agent's
//! `podgate_install_ready` and its adoption.

use crate::args::source_of;
use crate::reconcile::{self, Node, Source};
use crate::runtime::{self, Runtime};
use crate::{ChainArgs, Error};

/// The readiness test's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The chain is in place and loaded: podgate's chained file.
    Chained(String),
    /// Why it is not, in one line.
    NotReady(String),
}

impl Readiness {
    pub fn is_chained(&self) -> bool {
        matches!(self, Readiness::Chained(_))
    }
}

/// Whether podgate's chain is in place as configured and the runtime
/// loaded it, or an error reading the node. The one readiness test: `podgate
/// install --check` (the readiness probe) and the agent's
/// `podgate_install_ready` both ask it.
pub fn readiness(args: &ChainArgs) -> Result<Readiness, Error> {
    ChainProbe::new(args)?.readiness()
}

/// What the metrics read from the chain: its [`readiness`] and podgate's
/// entries.
#[derive(Debug, Clone)]
pub struct ChainProbe {
    pub(crate) node: Node,
    pub(crate) src: Source,
    pub(crate) runtime: Runtime,
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
    fn readiness(&self) -> Result<Readiness, Error> {
        let entries = reconcile::load_entries(&self.src.plugins_file)?;
        runtime::ready(&self.node, &self.src, &entries, &self.runtime)
    }

    /// [`readiness`] of this chain, an error reading the node as the
    /// reason it is not ready.
    pub fn ready(&self) -> Readiness {
        self.readiness()
            .unwrap_or_else(|e| Readiness::NotReady(e.to_string()))
    }

    /// podgate's plugin entries as configured (the plugins file).
    pub fn entries(&self) -> Result<Vec<serde_json::Value>, Error> {
        reconcile::load_entries(&self.src.plugins_file)?
            .iter()
            .map(|j| j.to_value().map_err(Error::Encode))
            .collect()
    }
}
