//! podgate's kit: one module per kernel object podgate manages.
//!
//! Every netlink socket is opened inside the namespace it talks to (a socket
//! stays bound to the netns it was created in) and then used from the calling
//! thread, so no thread ever runs in the wrong namespace. There is one netlink
//! socket type, [`netlink::Socket`], generic over the family; route, rule and
//! link, nf_tables ([`nft`]) and XFRM ([`xfrm`]) are message codecs over it,
//! and [`Error`] is the one error type.
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod caps;
pub mod dir;
pub mod error;
pub mod fs;
pub mod link;
pub mod netlink;
pub mod netns;
pub mod nft;
pub mod route;
pub mod rule;
pub mod state;
pub mod sysctl;
#[cfg(test)]
mod testing;
pub mod xfrm;

pub use error::{Error, ParseError, Result};
