//! Netlink, netavark-style: one small synchronous [`Socket`] generic over the
//! family (framing, sequence numbers, acks and errors with extended-ack text,
//! multipart dumps restarted on `NLM_F_DUMP_INTR`, size caps, one timeout),
//! opened in a given netns or the current one. Each family is a message
//! codec over it: rtnetlink in [`route`] (its wire format in `rtnl`: routes,
//! rules, links, addresses), nf_tables in
//! [`crate::nft`], XFRM in [`crate::xfrm`].

pub(crate) mod consts;
pub(crate) mod msg;
pub mod route;
pub(crate) mod rtnl;
#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]
mod rtnl_tests;
mod socket;

pub use route::RouteSocket;
pub(crate) use socket::DumpEvent;
#[cfg(test)]
pub(crate) use socket::{dump_step, ours};
pub use socket::{Netfilter, NetlinkFamily, Route, Socket, Xfrm, DEFAULT_TIMEOUT, DUMP_ATTEMPTS};
