//! podgate-router: chained after the primary plugin, it makes a pod a router
//! (namespaced sysctls, masquerade in the pod, return routes on the node).
//!
//! ADD reads as: config → intent + policy → observe node (only what the
//! plan checks) → plan → apply → record.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod apply;
pub mod claims;
pub mod config;
mod error;
pub mod intent;
pub mod kernel;
pub mod lifecycle;
mod model;
mod mss;
mod observe;
pub mod plan;
pub mod plugin;
pub mod record;
mod refusal;
pub mod routing;
mod strict_node;

pub use plugin::Router;
