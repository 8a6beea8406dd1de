//! Is this node's IPsec tunnel protection really in place?
//!
//! The guard speaks the node interface of Kube-OVN's IPsec agent
//! (`kube-ovn-ipsec`, `pkg/ipsec/`): the public protection endpoint
//! ([`protection`]), OVSDB ([`ovsdb`]) and the kernel's XFRM policies read back
//! over netlink ([`guard`]). [`evaluate`] is the two steps: [`observe()`] gathers
//! what the node offers under one time budget and [`judge()`] turns those
//! observations into an [`Evaluation`]: each check with a stable name, its
//! outcome and a message, plus a verdict. The
//! CNI plugin ([`plugin`]) gates pod ADDs on it; `podgate ipsec status` prints
//! it; node metrics count its failed checks.
//!
//! Required (`required: auto`) means any durable or live signal: the
//! `required` file, any `ovn-ipsec-protection-*` key in OVSDB, or
//! `protection.sock` (`preparation.go` `protectionRequired`). A signal that
//! cannot be ruled out (OVSDB there but not answering) counts as required.
//!
//! Ready means: the endpoint directory and socket are root-owned and not
//! writable by others, the server's `SO_PEERCRED` uid is 0, and either
//! `/armed?ovs-uuid=<current _uuid>` answers 200 AND the guard's own readback
//! passes (both guard families with the lease mark, no bypass, the four lease
//! keys, the marks on every OVN tunnel interface), or there is no durable
//! intent and `/startup` answers 200 (initial preparation). The agent's word
//! alone never passes the gate.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod agent;
pub mod config;
pub mod evaluation;
pub mod guard;
pub mod http;
pub mod io;
pub mod judge;
pub mod observe;
pub mod ovsdb;
pub mod plugin;
pub mod protection;
pub mod time;
pub mod udp;

pub use config::{Family, GuardConfig, Mode, Required};
pub use evaluation::{Check, Evaluation, Outcome, Protection, Signals, Verdict};
pub use judge::judge;
pub use observe::{observe, Asked, Observations, OvsRead};
pub use plugin::TunnelGuard;

use std::time::SystemTime;

/// Read the node and judge it: the library entry point for the plugin, the
/// helper's `ipsec status` and metrics. All I/O shares one deadline (`timeoutMs`).
pub fn evaluate(cfg: &GuardConfig, now: SystemTime) -> Evaluation {
    judge(cfg, &observe(cfg), now)
}
