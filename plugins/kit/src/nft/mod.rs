//! A small, synchronous nf_tables client speaking raw nfnetlink.
//!
//! Why hand-rolled: CNI plugins run on arbitrary nodes where the `nft` binary
//! may be missing or of an unexpected version, forking per ADD/DEL is slow, and
//! libnftnl/libmnl (and their Rust wrappers) are GPL. We need only a handful of
//! message types, so encoding them directly keeps behaviour predictable and the
//! dependency footprint tiny.
//!
//! The wire format follows the Linux UAPI headers `linux/netlink.h`,
//! `linux/netfilter/nfnetlink.h` and `linux/netfilter/nf_tables.h`:
//!
//! * every message is an `nlmsghdr` (host byte order) followed by an
//!   `nfgenmsg` (family, version, big-endian resource id) and netlink
//!   attributes (TLVs padded to 4 bytes);
//! * nf_tables encodes *all* integer attributes in network byte order;
//! * changes are sent as one batch (`NFNL_MSG_BATCH_BEGIN` … `_END`, resource
//!   id `NFNL_SUBSYS_NFTABLES`) that the kernel commits atomically or not at all.
//!
//! A netlink socket stays bound to the network namespace it was created in, so
//! callers create an [`NftSocket`] inside the target namespace and may then use
//! it from any thread.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;

use crate::netlink::msg::MsgWriter;
use crate::netlink::{Netfilter, NetlinkFamily, Socket};
use ipnet::IpNet;

mod batch;
mod decode;
mod encode;
mod expr;
mod snat;
mod socket;
mod sys;
#[cfg(test)]
// Tests may index and unwrap: a panic is exactly the failure report we want.
#[allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]
mod tests;

use batch::*;
use decode::*;
use expr::*;

pub use batch::{encode_masquerade_batch, encode_table_batch};
pub use snat::{Hook, SnatFinding, SnatKind};
pub use socket::NftSocket;

/// Name of the chain we own inside our table.
const CHAIN: &str = "postrouting";
/// `srcnat` priority; masquerade belongs there so filter chains see pod IPs.
const SRCNAT_PRIORITY: i32 = 100;
/// The MSS-clamp chain (filter, hook forward).
const MSS_CHAIN: &str = "forward";
/// `mangle` priority: before any filter chain at 0 sees the SYN.
const MANGLE_PRIORITY: i32 = -150;
/// Upper bound on one batch. It must fit in one `sendmsg` (the kernel commits
/// a batch only if it arrives in a single skb), which the default socket send
/// buffer (~208 KiB) allows comfortably.
const MAX_BATCH_BYTES: usize = 128 * 1024;

/// Errors of the nf_tables code: the kit's one error type (`family`
/// "nftables"), named for callers that spell it this way.
pub type NftError = crate::Error;

/// The family name nf_tables errors carry.
const NFT: &str = <Netfilter as NetlinkFamily>::NAME;

/// One masquerade rule: traffic from `source` leaving through `oifname` gets
/// the outgoing interface's address as its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasqRule {
    /// Source prefix; must not have host bits set (`10.8.0.0/24`, not
    /// `10.8.0.5/24`) so that what we list back equals what we were given.
    pub source: IpNet,
    /// Exact outgoing interface name (no wildcards), at most 15 bytes.
    pub oifname: String,
}

/// Which way the clamped SYN travels relative to the pod interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MssDirection {
    /// From the pool, leaving by the interface (`ip saddr <pool> oifname <if>`).
    FromPool,
    /// Arriving by the interface, to the pool (`iifname <if> ip daddr <pool>`).
    ToPool,
}

/// What the MSS option is lowered to (the kernel never raises it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MssValue {
    /// `rt mtu`: the smaller MTU of the route the SYN leaves by and of the
    /// route back to its sender, minus the IP and TCP headers.
    Pmtu,
    Fixed(u16),
}

/// One clamp rule in chain `forward`: `<pool match> <if match> tcp flags
/// syn / syn,rst tcp option maxseg size set <mss>`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MssRule {
    /// Pool prefix, host bits clear (as for [`MasqRule::source`]).
    pub pool: IpNet,
    /// Exact interface name, at most 15 bytes.
    pub ifname: String,
    pub direction: MssDirection,
    pub mss: MssValue,
}

/// A rule read back from one of podgate's chains: `R` is [`MasqRule`]
/// (chain `postrouting`, [`ListedRule`]) or [`MssRule`] (chain `forward`,
/// [`ListedMss`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed<R> {
    /// The decoded rule, or `None` when the rule's expressions are not exactly
    /// the shape podgate writes (someone else added or modified it).
    pub rule: Option<R>,
    /// The ownership tag stored as the rule's comment, if any.
    pub tag: Option<String>,
    /// Kernel rule handle (useful in diagnostics).
    pub handle: u64,
}

/// A rule read back from chain `postrouting`.
pub type ListedRule = Listed<MasqRule>;

/// An MSS rule read back from chain `forward`.
pub type ListedMss = Listed<MssRule>;

fn validate_name(kind: &str, name: &str) -> Result<(), NftError> {
    let reason = if name.is_empty() {
        "must not be empty".to_string()
    } else if name.len() >= sys::NFT_NAME_MAXLEN {
        format!("longer than {} bytes", sys::NFT_NAME_MAXLEN - 1)
    } else if name.contains('\0') {
        "contains a NUL byte".to_string()
    } else {
        return Ok(());
    };
    Err(NftError::Invalid {
        family: NFT,
        object: format!("{kind} {name:?}"),
        reason,
    })
}

/// Longest tag we store: user data holds type + length + tag + NUL.
///
/// This exceeds the 127 characters the `nft` CLI accepts for comments it
/// parses, but not what it displays, and callers' tags (network name +
/// 64-hex container id + ifname) easily need more.
const MAX_TAG_BYTES: usize = sys::NFT_USERDATA_MAXLEN - 3;

fn validate_tag(tag: &str) -> Result<(), NftError> {
    let reason = if tag.len() > MAX_TAG_BYTES {
        format!("longer than {MAX_TAG_BYTES} bytes (kernel user data limit)")
    } else if tag.contains('\0') {
        "contains a NUL byte".to_string()
    } else {
        return Ok(());
    };
    Err(NftError::Invalid {
        family: NFT,
        object: format!("tag {tag:?}"),
        reason,
    })
}

fn validate_rule(rule: &MasqRule) -> Result<(), NftError> {
    let reason = if rule.source != rule.source.trunc() {
        format!(
            "source has host bits set; use {} instead",
            rule.source.trunc()
        )
    } else if rule.oifname.is_empty() || rule.oifname.len() >= sys::IFNAMSIZ {
        format!("oifname must be 1 to {} bytes long", sys::IFNAMSIZ - 1)
    } else if rule.oifname.contains('\0') {
        "oifname contains a NUL byte".to_string()
    } else {
        return Ok(());
    };
    Err(NftError::Invalid {
        family: NFT,
        object: format!("rule {}", describe_rule(rule)),
        reason,
    })
}

fn validate_mss(rule: &MssRule) -> Result<(), NftError> {
    let reason = if rule.pool != rule.pool.trunc() {
        format!("pool has host bits set; use {} instead", rule.pool.trunc())
    } else if rule.ifname.is_empty() || rule.ifname.len() >= sys::IFNAMSIZ {
        format!(
            "interface name must be 1 to {} bytes long",
            sys::IFNAMSIZ - 1
        )
    } else if rule.ifname.contains('\0') {
        "interface name contains a NUL byte".to_string()
    } else if rule.mss == MssValue::Fixed(0) {
        "MSS 0".to_string()
    } else {
        return Ok(());
    };
    Err(NftError::Invalid {
        family: NFT,
        object: format!("rule {}", describe_mss(rule)),
        reason,
    })
}

/// The rule in `nft` syntax.
pub fn describe_mss(rule: &MssRule) -> String {
    let proto = match rule.pool {
        IpNet::V4(_) => "ip",
        IpNet::V6(_) => "ip6",
    };
    let m = match rule.mss {
        MssValue::Pmtu => "rt mtu".to_string(),
        MssValue::Fixed(v) => v.to_string(),
    };
    match rule.direction {
        MssDirection::FromPool => format!(
            "{proto} saddr {} oifname {:?} tcp flags syn / syn,rst tcp option maxseg size set {m}",
            rule.pool, rule.ifname
        ),
        MssDirection::ToPool => format!(
            "{proto} daddr {} iifname {:?} tcp flags syn / syn,rst tcp option maxseg size set {m}",
            rule.pool, rule.ifname
        ),
    }
}

fn describe_rule(rule: &MasqRule) -> String {
    let proto = match rule.source {
        IpNet::V4(_) => "ip",
        IpNet::V6(_) => "ip6",
    };
    format!(
        "{proto} saddr {} oifname {:?} masquerade",
        rule.source, rule.oifname
    )
}

/// What podgate's table in a pod holds. A chain exists only for what is
/// asked for (`masquerade: None` = no nat chain at all), because creating a
/// nat chain is the most expensive part of an ADD.
#[derive(Debug, Clone, Copy, Default)]
pub struct TableRules<'a> {
    /// Chain `postrouting` (nat) with these rules; `Some(&[])` = empty chain.
    pub masquerade: Option<&'a [MasqRule]>,
    /// Chain `forward` (filter, priority mangle) when not empty.
    pub mss: &'a [MssRule],
}

impl TableRules<'_> {
    /// Messages in a replace batch (begin, ensure, delete, table, chains,
    /// rules, end), for reserving sequence numbers.
    fn messages(&self) -> usize {
        5 + self.masquerade.map_or(0, |m| m.len() + 1)
            + self.mss.len()
            + usize::from(!self.mss.is_empty())
    }
}

/// An nf_tables address family (`NFPROTO_*`), named as `nft` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    Inet,
    Ip,
    Ip6,
    Arp,
    Bridge,
    Netdev,
    Other(u8),
}

impl From<u8> for Family {
    fn from(nfproto: u8) -> Family {
        match nfproto {
            sys::NFPROTO_INET => Family::Inet,
            sys::NFPROTO_IPV4 => Family::Ip,
            sys::NFPROTO_IPV6 => Family::Ip6,
            sys::NFPROTO_ARP => Family::Arp,
            sys::NFPROTO_BRIDGE => Family::Bridge,
            sys::NFPROTO_NETDEV => Family::Netdev,
            other => Family::Other(other),
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Family::Inet => f.write_str("inet"),
            Family::Ip => f.write_str("ip"),
            Family::Ip6 => f.write_str("ip6"),
            Family::Arp => f.write_str("arp"),
            Family::Bridge => f.write_str("bridge"),
            Family::Netdev => f.write_str("netdev"),
            Family::Other(n) => write!(f, "family{n}"),
        }
    }
}

fn family_name(family: u8) -> String {
    Family::from(family).to_string()
}
