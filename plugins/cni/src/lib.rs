//! podgate's CNI protocol layer: spec 0.3.0 through 1.1.0.
//!
//! Why our own layer: the `cni-plugin` crate is archived, claims 1.1.0 in
//! VERSION without implementing it, rejects STATUS and fails on prevResults
//! without `dns`. The protocol is small; owning it lets us test every verb and
//! error path without a runtime.
//!
//! No `unsafe` here: the protocol layer parses input a pod can influence,
//! and std's stdin, stdout and exit (and the kit's file locks) do all it
//! needs.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod config;
pub mod env;
pub mod error;
pub mod event;
pub mod log;
pub mod result;
pub mod skel;
pub mod version;

pub use config::{Attachment, NetConf};
pub use env::{Command, Env};
pub use error::{code, CniError};
pub use result::{Added, CniResult, PrevResult};
pub use skel::{dispatch, dispatch_observed, prev_or_empty, run, Plugin, Request};

/// podgate's release and, when the build was given one (the image's
/// `PODGATE_COMMIT` build argument), the commit it was built from, e.g.
/// `0.1.0 (commit 1c58541...)`. Every podgate binary says it (`podgate
/// --version`, a plugin run without `CNI_COMMAND`), so binaries built from
/// two commits differ and an operator can tell which build ran.
pub fn build_version() -> &'static str {
    static VERSION: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| match option_env!("PODGATE_COMMIT") {
            Some(commit) if !commit.is_empty() => {
                format!("{} (commit {commit})", env!("CARGO_PKG_VERSION"))
            }
            _ => env!("CARGO_PKG_VERSION").to_string(),
        });
    VERSION.as_str()
}
