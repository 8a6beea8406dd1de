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
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use ipnet::IpNet;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

/// Constants from the Linux UAPI headers. Kept private: callers deal in
/// [`MasqRule`]s, not in netlink numbers.
mod sys {
    // linux/netlink.h
    pub const NLMSG_HDRLEN: usize = 16;
    pub const NLMSG_NOOP: u16 = 0x1;
    pub const NLMSG_ERROR: u16 = 0x2;
    pub const NLMSG_DONE: u16 = 0x3;
    pub const NLMSG_OVERRUN: u16 = 0x4;
    pub const NLM_F_REQUEST: u16 = 0x01;
    pub const NLM_F_ACK: u16 = 0x04;
    pub const NLM_F_DUMP_INTR: u16 = 0x10;
    pub const NLM_F_DUMP: u16 = 0x100 | 0x200;
    pub const NLM_F_EXCL: u16 = 0x200;
    pub const NLM_F_CREATE: u16 = 0x400;
    pub const NLM_F_APPEND: u16 = 0x800;
    /// Set on an `NLMSG_ERROR` whose echoed request was cut to its header.
    pub const NLM_F_CAPPED: u16 = 0x100;
    /// Set on an `NLMSG_ERROR` that carries extended-ack TLVs.
    pub const NLM_F_ACK_TLVS: u16 = 0x200;
    pub const NLMSGERR_ATTR_MSG: u16 = 1;
    pub const NLA_F_NESTED: u16 = 0x8000;
    pub const NLA_TYPE_MASK: u16 = 0x3fff;

    // linux/netfilter/nfnetlink.h
    pub const NFNETLINK_V0: u8 = 0;
    pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
    pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
    pub const NFNL_MSG_BATCH_END: u16 = 0x11;

    // linux/netfilter.h
    pub const NFPROTO_UNSPEC: u8 = 0;
    pub const NFPROTO_INET: u8 = 1;
    pub const NFPROTO_IPV4: u8 = 2;
    pub const NFPROTO_ARP: u8 = 3;
    pub const NFPROTO_NETDEV: u8 = 5;
    pub const NFPROTO_BRIDGE: u8 = 7;
    pub const NFPROTO_IPV6: u8 = 10;
    pub const NF_INET_FORWARD: u32 = 2;
    pub const NF_INET_POST_ROUTING: u32 = 4;
    pub const NF_ACCEPT: u32 = 1;

    // linux/netfilter/nf_tables.h: enum nf_tables_msg_types
    pub const NFT_MSG_NEWTABLE: u8 = 0;
    pub const NFT_MSG_GETTABLE: u8 = 1;
    pub const NFT_MSG_DELTABLE: u8 = 2;
    pub const NFT_MSG_NEWCHAIN: u8 = 3;
    pub const NFT_MSG_GETCHAIN: u8 = 4;
    pub const NFT_MSG_NEWRULE: u8 = 6;
    pub const NFT_MSG_GETRULE: u8 = 7;

    pub const NFTA_LIST_ELEM: u16 = 1;
    pub const NFTA_HOOK_HOOKNUM: u16 = 1;
    pub const NFTA_HOOK_PRIORITY: u16 = 2;
    pub const NFTA_TABLE_NAME: u16 = 1;
    pub const NFTA_TABLE_FLAGS: u16 = 2;
    pub const NFTA_TABLE_USERDATA: u16 = 6;
    pub const NFTA_CHAIN_TABLE: u16 = 1;
    pub const NFTA_CHAIN_NAME: u16 = 3;
    pub const NFTA_CHAIN_HOOK: u16 = 4;
    pub const NFTA_CHAIN_POLICY: u16 = 5;
    pub const NFTA_CHAIN_TYPE: u16 = 7;
    pub const NFTA_RULE_TABLE: u16 = 1;
    pub const NFTA_RULE_CHAIN: u16 = 2;
    pub const NFTA_RULE_HANDLE: u16 = 3;
    pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
    pub const NFTA_RULE_USERDATA: u16 = 7;
    pub const NFTA_EXPR_NAME: u16 = 1;
    pub const NFTA_EXPR_DATA: u16 = 2;
    pub const NFTA_DATA_VALUE: u16 = 1;
    pub const NFTA_DATA_VERDICT: u16 = 2;
    pub const NFTA_VERDICT_CODE: u16 = 1;
    pub const NFTA_VERDICT_CHAIN: u16 = 2;
    pub const NFTA_IMMEDIATE_DREG: u16 = 1;
    pub const NFTA_IMMEDIATE_DATA: u16 = 2;
    pub const NFTA_BITWISE_SREG: u16 = 1;
    pub const NFTA_BITWISE_DREG: u16 = 2;
    pub const NFTA_BITWISE_LEN: u16 = 3;
    pub const NFTA_BITWISE_MASK: u16 = 4;
    pub const NFTA_BITWISE_XOR: u16 = 5;
    pub const NFTA_BITWISE_OP: u16 = 6;
    pub const NFTA_CMP_SREG: u16 = 1;
    pub const NFTA_CMP_OP: u16 = 2;
    pub const NFTA_CMP_DATA: u16 = 3;
    pub const NFTA_PAYLOAD_DREG: u16 = 1;
    pub const NFTA_PAYLOAD_BASE: u16 = 2;
    pub const NFTA_PAYLOAD_OFFSET: u16 = 3;
    pub const NFTA_PAYLOAD_LEN: u16 = 4;
    pub const NFTA_META_DREG: u16 = 1;
    pub const NFTA_META_KEY: u16 = 2;
    pub const NFTA_MASQ_FLAGS: u16 = 1;
    pub const NFTA_MASQ_REG_PROTO_MIN: u16 = 2;
    pub const NFTA_NAT_TYPE: u16 = 1;
    pub const NFTA_RT_DREG: u16 = 1;
    pub const NFTA_RT_KEY: u16 = 2;
    pub const NFTA_BYTEORDER_SREG: u16 = 1;
    pub const NFTA_BYTEORDER_DREG: u16 = 2;
    pub const NFTA_BYTEORDER_OP: u16 = 3;
    pub const NFTA_BYTEORDER_LEN: u16 = 4;
    pub const NFTA_BYTEORDER_SIZE: u16 = 5;
    pub const NFTA_EXTHDR_DREG: u16 = 1;
    pub const NFTA_EXTHDR_TYPE: u16 = 2;
    pub const NFTA_EXTHDR_OFFSET: u16 = 3;
    pub const NFTA_EXTHDR_LEN: u16 = 4;
    pub const NFTA_EXTHDR_OP: u16 = 6;
    pub const NFTA_EXTHDR_SREG: u16 = 7;
    // linux/netfilter/nf_tables_compat.h (iptables-nft's xt targets)
    pub const NFTA_TARGET_NAME: u16 = 1;

    pub const NFT_REG_VERDICT: u32 = 0;
    pub const NFT_REG_1: u32 = 1;
    pub const NFT_CMP_EQ: u32 = 0;
    pub const NFT_BITWISE_MASK_XOR: u32 = 0;
    pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
    pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
    pub const NFT_META_IIFNAME: u32 = 6;
    pub const NFT_META_OIFNAME: u32 = 7;
    pub const NFT_META_NFPROTO: u32 = 15;
    pub const NFT_META_L4PROTO: u32 = 16;
    /// `rt mtu` in nft syntax: the MSS the route MTU allows (host order).
    pub const NFT_RT_TCPMSS: u32 = 3;
    pub const NFT_BYTEORDER_HTON: u32 = 1;
    pub const NFT_EXTHDR_OP_TCPOPT: u32 = 1;
    /// linux/tcp.h TCPOPT_MAXSEG: kind 2, the 16-bit value at offset 2.
    pub const TCPOPT_MAXSEG: u8 = 2;
    pub const IPPROTO_TCP: u8 = 6;
    pub const TCP_FLAG_SYN: u8 = 0x02;
    pub const TCP_FLAG_RST: u8 = 0x04;
    pub const NFT_NAT_SNAT: u32 = 0;
    pub const NFT_JUMP: i32 = -3;
    pub const NFT_GOTO: i32 = -4;
    pub const NFT_NAME_MAXLEN: usize = 256;

    // linux/if.h
    pub const IFNAMSIZ: usize = 16;

    /// libnftnl's user-data TLV type for comments (`NFTNL_UDATA_RULE_COMMENT`
    /// and `NFTNL_UDATA_TABLE_COMMENT` are both 0). Using this layout makes
    /// our ownership tag show up as `comment "…"` in `nft list ruleset`.
    pub const NFTNL_UDATA_COMMENT: u8 = 0;
    /// `NFT_USERDATA_MAXLEN`: the kernel's cap on rule/table user data.
    pub const NFT_USERDATA_MAXLEN: usize = 256;
}

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
/// Upper bound on a single received datagram; dumps use ≤ 32 KiB skbs, so
/// anything larger means something is badly wrong.
const MAX_DATAGRAM_BYTES: usize = 1024 * 1024;
/// Upper bound on the total size of a dump we are willing to buffer.
const MAX_DUMP_BYTES: usize = 64 * 1024 * 1024;
/// How long a blocking receive may wait for the kernel. Replies are produced
/// synchronously inside `sendmsg`, so this only fires on real bugs; it exists
/// so a CNI plugin can never hang on netlink.
const RECV_TIMEOUT: Duration = Duration::from_secs(2);
/// How many times to restart a dump that the kernel flagged as inconsistent.
const DUMP_ATTEMPTS: u32 = 4;

/// Errors from [`NftSocket`]. Each variant names the object involved (table,
/// chain, rule or request) and, where the kernel answered, its errno and
/// extended-ack message.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// Creating, configuring or using the netlink socket failed.
    #[error("nftables netlink socket: {op} failed: {source}")]
    Socket {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// The kernel rejected a request.
    #[error(
        "nftables {object}: kernel returned {} ({}){}",
        errno_name(*.errno),
        io::Error::from_raw_os_error(*.errno),
        fmt_kernel_message(.message.as_deref())
    )]
    Kernel {
        object: String,
        /// Positive errno value, e.g. `libc::ENOENT`.
        errno: i32,
        /// Extended-ack message, when the kernel provided one.
        message: Option<String>,
    },
    /// A caller-provided value cannot be encoded.
    #[error("nftables {object}: invalid input: {reason}")]
    Invalid { object: String, reason: String },
    /// The kernel did not answer within the receive timeout.
    #[error("nftables {object}: no reply from the kernel within {timeout:?}")]
    Timeout { object: String, timeout: Duration },
    /// The kernel's reply could not be parsed.
    #[error("nftables {object}: malformed netlink reply: {reason}")]
    Protocol { object: String, reason: String },
    /// A dump kept being interrupted by concurrent ruleset changes.
    #[error("nftables {object}: dump interrupted by concurrent ruleset changes {attempts} times")]
    DumpInterrupted { object: String, attempts: u32 },
    /// A request or reply exceeded our size limits.
    #[error("nftables {object}: {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        object: String,
        size: usize,
        limit: usize,
    },
}

impl NftError {
    /// The errno behind this error, if the kernel or the socket reported one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NftError::Kernel { errno, .. } => Some(*errno),
            NftError::Socket { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

fn fmt_kernel_message(message: Option<&str>) -> String {
    match message {
        Some(m) if !m.is_empty() => format!(": {m}"),
        _ => String::new(),
    }
}

/// Symbolic name for the errnos nf_tables commonly returns, so logs say
/// `ENOENT` rather than only "No such file or directory".
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::E2BIG => "E2BIG",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOSPC => "ENOSPC",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::ENOBUFS => "ENOBUFS",
        libc::ETIMEDOUT => "ETIMEDOUT",
        _ => "errno",
    }
}

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

/// An MSS rule read back from chain `forward`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedMss {
    /// `None` when the rule is not exactly the shape we write.
    pub rule: Option<MssRule>,
    pub tag: Option<String>,
    pub handle: u64,
}

/// A rule read back from our chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRule {
    /// The decoded rule, or `None` when the rule's expressions are not exactly
    /// the shape [`NftSocket::replace_masquerade_table`] creates (someone else
    /// added or modified it).
    pub rule: Option<MasqRule>,
    /// The ownership tag stored as the rule's comment, if any.
    pub tag: Option<String>,
    /// Kernel rule handle (useful in diagnostics).
    pub handle: u64,
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

const fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// Appends netlink messages and attributes to a byte buffer.
///
/// Lengths are written as placeholders and patched when a message or nest is
/// closed; a length that does not fit its field marks the writer as
/// overflowed instead of silently wrapping.
#[derive(Default)]
struct MsgWriter {
    buf: Vec<u8>,
    overflow: bool,
}

impl MsgWriter {
    /// Starts an nfnetlink message; returns its offset for [`Self::end_msg`].
    fn begin_msg(&mut self, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, patched later
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: 0 = let the kernel fill it
        self.buf.push(family);
        self.buf.push(sys::NFNETLINK_V0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        start
    }

    fn end_msg(&mut self, start: usize) {
        self.pad();
        let len = self.buf.len().saturating_sub(start);
        match u32::try_from(len) {
            Ok(len) => self.patch(start, &len.to_ne_bytes()),
            Err(_) => self.overflow = true,
        }
    }

    fn pad(&mut self) {
        let padded = align4(self.buf.len());
        self.buf.resize(padded, 0);
    }

    fn patch(&mut self, at: usize, bytes: &[u8]) {
        match self.buf.get_mut(at..at + bytes.len()) {
            Some(slot) => slot.copy_from_slice(bytes),
            None => self.overflow = true,
        }
    }

    fn attr(&mut self, ty: u16, payload: &[u8]) {
        let Ok(len) = u16::try_from(4 + payload.len()) else {
            self.overflow = true;
            return;
        };
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
    }

    fn attr_u32(&mut self, ty: u16, value: u32) {
        // nf_tables parses every integer attribute with ntohl().
        self.attr(ty, &value.to_be_bytes());
    }

    /// Strings are NUL-terminated, as the kernel's `NLA_STRING` policy for
    /// names expects (`nla_strcmp` tolerates the trailing NUL).
    fn attr_str(&mut self, ty: u16, value: &str) {
        let mut bytes = Vec::with_capacity(value.len() + 1);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
        self.attr(ty, &bytes);
    }

    fn begin_nest(&mut self, ty: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(ty | sys::NLA_F_NESTED).to_ne_bytes());
        start
    }

    fn end_nest(&mut self, start: usize) {
        let len = self.buf.len().saturating_sub(start);
        match u16::try_from(len) {
            Ok(len) => self.patch(start, &len.to_ne_bytes()),
            Err(_) => self.overflow = true,
        }
    }

    /// `NFTA_DATA_VALUE` wrapped in the given attribute (cmp data, masks…).
    fn data_value(&mut self, ty: u16, value: &[u8]) {
        let nest = self.begin_nest(ty);
        self.attr(sys::NFTA_DATA_VALUE, value);
        self.end_nest(nest);
    }
}

/// An nf_tables expression, as far as this module understands them. Used both
/// to build our rules and to decode rules read from the kernel, so that
/// "exactly our shape" can be checked by structural equality.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    /// `meta load <key> => reg <dreg>`
    Meta { key: u32, dreg: u32 },
    /// `cmp <op> reg <sreg> <data>`
    Cmp { sreg: u32, op: u32, data: Vec<u8> },
    /// `payload load <len>b @ <base> + <offset> => reg <dreg>`
    Payload {
        base: u32,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    /// `bitwise reg <dreg> = (reg <sreg> & mask) ^ xor`
    Bitwise {
        sreg: u32,
        dreg: u32,
        len: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// `masq` with optional flags (random, persistent, …).
    Masq { flags: u32, has_proto_regs: bool },
    /// `nat snat|dnat …`
    Nat { nat_type: u32 },
    /// `immediate`; `verdict` is set for loads into the verdict register.
    Immediate {
        dreg: u32,
        verdict: Option<(i32, Option<String>)>,
    },
    /// `immediate reg <dreg> <data>` (a value, not a verdict).
    ImmediateData { dreg: u32, data: Vec<u8> },
    /// `rt load <key> => reg <dreg>`
    Rt { key: u32, dreg: u32 },
    /// `byteorder reg <dreg> = <op>(reg <sreg>, <size>, <len>)`
    Byteorder {
        sreg: u32,
        dreg: u32,
        op: u32,
        len: u32,
        size: u32,
    },
    /// `exthdr write <op> reg <sreg> => <len>b @ <type> + <offset>`
    ExthdrWrite {
        op: u32,
        kind: u8,
        offset: u32,
        len: u32,
        sreg: u32,
    },
    /// iptables-nft's xtables compat target (`MASQUERADE`, `SNAT`, …).
    Target { name: String },
    /// Anything else (or a known expression in a form we do not model).
    Other { name: String },
}

impl Expr {
    fn encode(&self, w: &mut MsgWriter) {
        let elem = w.begin_nest(sys::NFTA_LIST_ELEM);
        let name = match self {
            Expr::Meta { .. } => "meta",
            Expr::Cmp { .. } => "cmp",
            Expr::Payload { .. } => "payload",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Masq { .. } => "masq",
            Expr::Nat { .. } => "nat",
            Expr::Immediate { .. } | Expr::ImmediateData { .. } => "immediate",
            Expr::Rt { .. } => "rt",
            Expr::Byteorder { .. } => "byteorder",
            Expr::ExthdrWrite { .. } => "exthdr",
            Expr::Target { .. } => "target",
            Expr::Other { name } => name.as_str(),
        };
        w.attr_str(sys::NFTA_EXPR_NAME, name);
        let data = w.begin_nest(sys::NFTA_EXPR_DATA);
        match self {
            Expr::Meta { key, dreg } => {
                w.attr_u32(sys::NFTA_META_KEY, *key);
                w.attr_u32(sys::NFTA_META_DREG, *dreg);
            }
            Expr::Cmp { sreg, op, data } => {
                w.attr_u32(sys::NFTA_CMP_SREG, *sreg);
                w.attr_u32(sys::NFTA_CMP_OP, *op);
                w.data_value(sys::NFTA_CMP_DATA, data);
            }
            Expr::Payload {
                base,
                offset,
                len,
                dreg,
            } => {
                w.attr_u32(sys::NFTA_PAYLOAD_DREG, *dreg);
                w.attr_u32(sys::NFTA_PAYLOAD_BASE, *base);
                w.attr_u32(sys::NFTA_PAYLOAD_OFFSET, *offset);
                w.attr_u32(sys::NFTA_PAYLOAD_LEN, *len);
            }
            Expr::Bitwise {
                sreg,
                dreg,
                len,
                mask,
                xor,
            } => {
                // NFTA_BITWISE_OP is omitted: absent means MASK_XOR on every
                // kernel, while kernels before 5.6 do not know the attribute.
                w.attr_u32(sys::NFTA_BITWISE_SREG, *sreg);
                w.attr_u32(sys::NFTA_BITWISE_DREG, *dreg);
                w.attr_u32(sys::NFTA_BITWISE_LEN, *len);
                w.data_value(sys::NFTA_BITWISE_MASK, mask);
                w.data_value(sys::NFTA_BITWISE_XOR, xor);
            }
            Expr::Masq { flags, .. } => {
                if *flags != 0 {
                    w.attr_u32(sys::NFTA_MASQ_FLAGS, *flags);
                }
            }
            Expr::Nat { nat_type } => w.attr_u32(sys::NFTA_NAT_TYPE, *nat_type),
            Expr::Immediate { dreg, verdict } => {
                w.attr_u32(sys::NFTA_IMMEDIATE_DREG, *dreg);
                if let Some((code, chain)) = verdict {
                    let d = w.begin_nest(sys::NFTA_IMMEDIATE_DATA);
                    let v = w.begin_nest(sys::NFTA_DATA_VERDICT);
                    w.attr(sys::NFTA_VERDICT_CODE, &code.to_be_bytes());
                    if let Some(chain) = chain {
                        w.attr_str(sys::NFTA_VERDICT_CHAIN, chain);
                    }
                    w.end_nest(v);
                    w.end_nest(d);
                }
            }
            Expr::ImmediateData { dreg, data } => {
                w.attr_u32(sys::NFTA_IMMEDIATE_DREG, *dreg);
                w.data_value(sys::NFTA_IMMEDIATE_DATA, data);
            }
            Expr::Rt { key, dreg } => {
                w.attr_u32(sys::NFTA_RT_DREG, *dreg);
                w.attr_u32(sys::NFTA_RT_KEY, *key);
            }
            Expr::Byteorder {
                sreg,
                dreg,
                op,
                len,
                size,
            } => {
                w.attr_u32(sys::NFTA_BYTEORDER_SREG, *sreg);
                w.attr_u32(sys::NFTA_BYTEORDER_DREG, *dreg);
                w.attr_u32(sys::NFTA_BYTEORDER_OP, *op);
                w.attr_u32(sys::NFTA_BYTEORDER_LEN, *len);
                w.attr_u32(sys::NFTA_BYTEORDER_SIZE, *size);
            }
            Expr::ExthdrWrite {
                op,
                kind,
                offset,
                len,
                sreg,
            } => {
                w.attr_u32(sys::NFTA_EXTHDR_SREG, *sreg);
                w.attr(sys::NFTA_EXTHDR_TYPE, &[*kind]);
                w.attr_u32(sys::NFTA_EXTHDR_OFFSET, *offset);
                w.attr_u32(sys::NFTA_EXTHDR_LEN, *len);
                w.attr_u32(sys::NFTA_EXTHDR_OP, *op);
            }
            Expr::Target { name } => w.attr_str(sys::NFTA_TARGET_NAME, name),
            Expr::Other { .. } => {}
        }
        w.end_nest(data);
        w.end_nest(elem);
    }

    /// Decodes one `NFTA_LIST_ELEM` payload. Unknown or partially understood
    /// expressions become [`Expr::Other`] rather than errors: a foreign rule
    /// must never make listing fail.
    fn decode(elem: &[u8]) -> Result<Expr, String> {
        let attrs = Attrs::parse(elem)?;
        let name = attrs
            .get(sys::NFTA_EXPR_NAME)
            .map(attr_string)
            .ok_or("expression without NFTA_EXPR_NAME")?;
        let data = Attrs::parse(attrs.get(sys::NFTA_EXPR_DATA).unwrap_or_default())?;
        let u32_of = |ty| data.get(ty).and_then(be_u32);
        let value_of = |ty| data.get(ty).and_then(data_value);
        let other = || Expr::Other { name: name.clone() };
        let expr = match name.as_str() {
            "meta" => match (u32_of(sys::NFTA_META_KEY), u32_of(sys::NFTA_META_DREG)) {
                (Some(key), Some(dreg)) => Expr::Meta { key, dreg },
                _ => other(), // `meta set`
            },
            "cmp" => match (
                u32_of(sys::NFTA_CMP_SREG),
                u32_of(sys::NFTA_CMP_OP),
                value_of(sys::NFTA_CMP_DATA),
            ) {
                (Some(sreg), Some(op), Some(data)) => Expr::Cmp { sreg, op, data },
                _ => other(),
            },
            "payload" => match (
                u32_of(sys::NFTA_PAYLOAD_BASE),
                u32_of(sys::NFTA_PAYLOAD_OFFSET),
                u32_of(sys::NFTA_PAYLOAD_LEN),
                u32_of(sys::NFTA_PAYLOAD_DREG),
            ) {
                (Some(base), Some(offset), Some(len), Some(dreg)) => Expr::Payload {
                    base,
                    offset,
                    len,
                    dreg,
                },
                _ => other(), // payload set
            },
            "bitwise" => {
                let op = u32_of(sys::NFTA_BITWISE_OP).unwrap_or(sys::NFT_BITWISE_MASK_XOR);
                match (
                    op,
                    u32_of(sys::NFTA_BITWISE_SREG),
                    u32_of(sys::NFTA_BITWISE_DREG),
                    u32_of(sys::NFTA_BITWISE_LEN),
                    value_of(sys::NFTA_BITWISE_MASK),
                    value_of(sys::NFTA_BITWISE_XOR),
                ) {
                    (
                        sys::NFT_BITWISE_MASK_XOR,
                        Some(sreg),
                        Some(dreg),
                        Some(len),
                        Some(mask),
                        Some(xor),
                    ) => Expr::Bitwise {
                        sreg,
                        dreg,
                        len,
                        mask,
                        xor,
                    },
                    _ => other(), // shifts and newer boolean ops
                }
            }
            "masq" => Expr::Masq {
                flags: u32_of(sys::NFTA_MASQ_FLAGS).unwrap_or(0),
                has_proto_regs: data.get(sys::NFTA_MASQ_REG_PROTO_MIN).is_some(),
            },
            "nat" => match u32_of(sys::NFTA_NAT_TYPE) {
                Some(nat_type) => Expr::Nat { nat_type },
                None => other(),
            },
            "immediate" => match (
                u32_of(sys::NFTA_IMMEDIATE_DREG),
                value_of(sys::NFTA_IMMEDIATE_DATA),
            ) {
                (Some(dreg), Some(data)) => Expr::ImmediateData { dreg, data },
                (Some(dreg), None) => Expr::Immediate {
                    dreg,
                    verdict: data.get(sys::NFTA_IMMEDIATE_DATA).and_then(decode_verdict),
                },
                (None, _) => other(),
            },
            "rt" => match (u32_of(sys::NFTA_RT_KEY), u32_of(sys::NFTA_RT_DREG)) {
                (Some(key), Some(dreg)) => Expr::Rt { key, dreg },
                _ => other(),
            },
            "byteorder" => match (
                u32_of(sys::NFTA_BYTEORDER_SREG),
                u32_of(sys::NFTA_BYTEORDER_DREG),
                u32_of(sys::NFTA_BYTEORDER_OP),
                u32_of(sys::NFTA_BYTEORDER_LEN),
                u32_of(sys::NFTA_BYTEORDER_SIZE),
            ) {
                (Some(sreg), Some(dreg), Some(op), Some(len), Some(size)) => Expr::Byteorder {
                    sreg,
                    dreg,
                    op,
                    len,
                    size,
                },
                _ => other(),
            },
            "exthdr" => match (
                u32_of(sys::NFTA_EXTHDR_SREG),
                data.get(sys::NFTA_EXTHDR_TYPE),
                u32_of(sys::NFTA_EXTHDR_OFFSET),
                u32_of(sys::NFTA_EXTHDR_LEN),
                u32_of(sys::NFTA_EXTHDR_OP),
                data.get(sys::NFTA_EXTHDR_DREG),
            ) {
                (Some(sreg), Some([kind]), Some(offset), Some(len), Some(op), None) => {
                    Expr::ExthdrWrite {
                        op,
                        kind: *kind,
                        offset,
                        len,
                        sreg,
                    }
                }
                _ => other(), // exthdr loads (matches), or a shape we do not write
            },
            "target" => match data.get(sys::NFTA_TARGET_NAME) {
                Some(n) => Expr::Target {
                    name: attr_string(n),
                },
                None => other(),
            },
            _ => other(),
        };
        Ok(expr)
    }
}

/// Decodes `NFTA_IMMEDIATE_DATA` → `NFTA_DATA_VERDICT` → (code, chain).
fn decode_verdict(data: &[u8]) -> Option<(i32, Option<String>)> {
    let outer = Attrs::parse(data).ok()?;
    let verdict = Attrs::parse(outer.get(sys::NFTA_DATA_VERDICT)?).ok()?;
    let code = verdict.get(sys::NFTA_VERDICT_CODE).and_then(be_u32)?;
    let chain = verdict.get(sys::NFTA_VERDICT_CHAIN).map(attr_string);
    Some((i32::from_be_bytes(code.to_be_bytes()), chain))
}

/// The expressions of one masquerade rule, mirroring what `nft` generates for
/// `meta nfproto ipv4 ip saddr 10.8.0.0/24 oifname "eth0" masquerade` (except
/// that we always load the full address and mask it, instead of nft's
/// byte-aligned shortcut, which keeps one code path for every prefix length).
fn masq_exprs(rule: &MasqRule) -> Vec<Expr> {
    // In an inet table the same chain sees IPv4 and IPv6; the nfproto
    // dependency keeps a load at offset 12 from matching IPv6 bytes.
    let mut exprs = prefix_match(&rule.source, true);
    let mut ifname = rule.oifname.as_bytes().to_vec();
    // nft compares the whole IFNAMSIZ buffer for exact (non-wildcard) names.
    ifname.resize(sys::IFNAMSIZ, 0);
    exprs.extend([
        Expr::Meta {
            key: sys::NFT_META_OIFNAME,
            dreg: sys::NFT_REG_1,
        },
        Expr::Cmp {
            sreg: sys::NFT_REG_1,
            op: sys::NFT_CMP_EQ,
            data: ifname,
        },
        Expr::Masq {
            flags: 0,
            has_proto_regs: false,
        },
    ]);
    exprs
}

/// Recovers a [`MasqRule`] from decoded expressions, but only if re-encoding
/// it yields exactly the same expressions: anything else (extra matches,
/// flags, non-contiguous masks, nft's shortened loads…) is foreign.
fn rule_from_exprs(exprs: &[Expr]) -> Option<MasqRule> {
    let [_, Expr::Cmp { data: nfproto, .. }, Expr::Payload { .. }, rest @ ..] = exprs else {
        return None;
    };
    let (mask, rest) = match rest {
        [Expr::Bitwise { mask, .. }, rest @ ..] => (Some(mask), rest),
        rest => (None, rest),
    };
    let [Expr::Cmp { data: addr, .. }, _, Expr::Cmp { data: ifname, .. }, _] = rest else {
        return None;
    };
    let addr = match (nfproto.as_slice(), addr.len()) {
        ([sys::NFPROTO_IPV4], 4) => IpAddr::from(<[u8; 4]>::try_from(addr.as_slice()).ok()?),
        ([sys::NFPROTO_IPV6], 16) => IpAddr::from(<[u8; 16]>::try_from(addr.as_slice()).ok()?),
        _ => return None,
    };
    let prefix = match mask {
        Some(mask) => mask.iter().map(|b| b.count_ones()).sum::<u32>(),
        None => addr_bits(&addr),
    };
    let source = IpNet::new(addr, u8::try_from(prefix).ok()?).ok()?;
    let name_len = ifname.iter().position(|&b| b == 0).unwrap_or(ifname.len());
    let oifname = String::from_utf8(ifname.get(..name_len)?.to_vec()).ok()?;
    let rule = MasqRule { source, oifname };
    (validate_rule(&rule).is_ok() && masq_exprs(&rule) == exprs).then_some(rule)
}

/// `meta nfproto <family>; <payload address> [& mask] == <prefix>`: the
/// family dependency plus a prefix match of the source (`saddr`) or
/// destination address, as masquerade rules load it.
fn prefix_match(net: &IpNet, saddr: bool) -> Vec<Expr> {
    let (nfproto, offset, addr): (u8, u32, Vec<u8>) = match net.network() {
        IpAddr::V4(a) => (
            sys::NFPROTO_IPV4,
            if saddr { 12 } else { 16 },
            a.octets().to_vec(),
        ),
        IpAddr::V6(a) => (
            sys::NFPROTO_IPV6,
            if saddr { 8 } else { 24 },
            a.octets().to_vec(),
        ),
    };
    let len = addr.len() as u32;
    let mut exprs = vec![
        Expr::Meta {
            key: sys::NFT_META_NFPROTO,
            dreg: sys::NFT_REG_1,
        },
        Expr::Cmp {
            sreg: sys::NFT_REG_1,
            op: sys::NFT_CMP_EQ,
            data: vec![nfproto],
        },
        Expr::Payload {
            base: sys::NFT_PAYLOAD_NETWORK_HEADER,
            offset,
            len,
            dreg: sys::NFT_REG_1,
        },
    ];
    if net.prefix_len() < net.max_prefix_len() {
        let mask = match net.netmask() {
            IpAddr::V4(m) => m.octets().to_vec(),
            IpAddr::V6(m) => m.octets().to_vec(),
        };
        exprs.push(Expr::Bitwise {
            sreg: sys::NFT_REG_1,
            dreg: sys::NFT_REG_1,
            len,
            xor: vec![0; mask.len()],
            mask,
        });
    }
    exprs.push(Expr::Cmp {
        sreg: sys::NFT_REG_1,
        op: sys::NFT_CMP_EQ,
        data: addr,
    });
    exprs
}

/// The expressions of one MSS clamp rule, mirroring what `nft` generates for
/// `ip saddr 10.8.0.0/24 oifname "eth0" tcp flags syn / syn,rst tcp option
/// maxseg size set rt mtu` (`ip daddr … iifname …` for [`MssDirection::ToPool`];
/// `set 1360` loads an immediate instead of `rt` + `byteorder`).
fn mss_exprs(rule: &MssRule) -> Vec<Expr> {
    let from_pool = rule.direction == MssDirection::FromPool;
    let mut exprs = prefix_match(&rule.pool, from_pool);
    let mut ifname = rule.ifname.as_bytes().to_vec();
    ifname.resize(sys::IFNAMSIZ, 0);
    exprs.extend([
        Expr::Meta {
            key: if from_pool {
                sys::NFT_META_OIFNAME
            } else {
                sys::NFT_META_IIFNAME
            },
            dreg: sys::NFT_REG_1,
        },
        Expr::Cmp {
            sreg: sys::NFT_REG_1,
            op: sys::NFT_CMP_EQ,
            data: ifname,
        },
        // tcp flags & (syn|rst) == syn: SYN and SYN-ACK, never a reset.
        Expr::Meta {
            key: sys::NFT_META_L4PROTO,
            dreg: sys::NFT_REG_1,
        },
        Expr::Cmp {
            sreg: sys::NFT_REG_1,
            op: sys::NFT_CMP_EQ,
            data: vec![sys::IPPROTO_TCP],
        },
        Expr::Payload {
            base: sys::NFT_PAYLOAD_TRANSPORT_HEADER,
            offset: 13,
            len: 1,
            dreg: sys::NFT_REG_1,
        },
        Expr::Bitwise {
            sreg: sys::NFT_REG_1,
            dreg: sys::NFT_REG_1,
            len: 1,
            mask: vec![sys::TCP_FLAG_SYN | sys::TCP_FLAG_RST],
            xor: vec![0],
        },
        Expr::Cmp {
            sreg: sys::NFT_REG_1,
            op: sys::NFT_CMP_EQ,
            data: vec![sys::TCP_FLAG_SYN],
        },
    ]);
    match rule.mss {
        MssValue::Pmtu => exprs.extend([
            Expr::Rt {
                key: sys::NFT_RT_TCPMSS,
                dreg: sys::NFT_REG_1,
            },
            // rt stores the MSS in host order; the option is big-endian.
            Expr::Byteorder {
                sreg: sys::NFT_REG_1,
                dreg: sys::NFT_REG_1,
                op: sys::NFT_BYTEORDER_HTON,
                len: 2,
                size: 2,
            },
        ]),
        MssValue::Fixed(v) => exprs.push(Expr::ImmediateData {
            dreg: sys::NFT_REG_1,
            data: v.to_be_bytes().to_vec(),
        }),
    }
    exprs.push(Expr::ExthdrWrite {
        op: sys::NFT_EXTHDR_OP_TCPOPT,
        kind: sys::TCPOPT_MAXSEG,
        offset: 2,
        len: 2,
        sreg: sys::NFT_REG_1,
    });
    exprs
}

/// Recovers an [`MssRule`] only if re-encoding yields exactly `exprs`.
fn mss_from_exprs(exprs: &[Expr]) -> Option<MssRule> {
    let [_, Expr::Cmp { data: nfproto, .. }, Expr::Payload { offset, .. }, rest @ ..] = exprs
    else {
        return None;
    };
    let (mask, rest) = match rest {
        [Expr::Bitwise { mask, .. }, rest @ ..] => (Some(mask), rest),
        rest => (None, rest),
    };
    let [Expr::Cmp { data: addr, .. }, Expr::Meta { key: if_key, .. }, Expr::Cmp { data: ifname, .. }, rest @ ..] =
        rest
    else {
        return None;
    };
    let addr = match (nfproto.as_slice(), addr.len()) {
        ([sys::NFPROTO_IPV4], 4) => IpAddr::from(<[u8; 4]>::try_from(addr.as_slice()).ok()?),
        ([sys::NFPROTO_IPV6], 16) => IpAddr::from(<[u8; 16]>::try_from(addr.as_slice()).ok()?),
        _ => return None,
    };
    let direction = match (*if_key, *offset) {
        (sys::NFT_META_OIFNAME, 12 | 8) => MssDirection::FromPool,
        (sys::NFT_META_IIFNAME, 16 | 24) => MssDirection::ToPool,
        _ => return None,
    };
    let prefix = match mask {
        Some(mask) => mask.iter().map(|b| b.count_ones()).sum::<u32>(),
        None => addr_bits(&addr),
    };
    let pool = IpNet::new(addr, u8::try_from(prefix).ok()?).ok()?;
    let name_len = ifname.iter().position(|&b| b == 0).unwrap_or(ifname.len());
    let ifname = String::from_utf8(ifname.get(..name_len)?.to_vec()).ok()?;
    let mss = match rest.iter().rev().nth(1)? {
        Expr::ImmediateData { data, .. } => MssValue::Fixed(u16::from_be_bytes(
            <[u8; 2]>::try_from(data.as_slice()).ok()?,
        )),
        Expr::Byteorder { .. } => MssValue::Pmtu,
        _ => return None,
    };
    let rule = MssRule {
        pool,
        ifname,
        direction,
        mss,
    };
    (validate_mss(&rule).is_ok() && mss_exprs(&rule) == exprs).then_some(rule)
}

fn addr_bits(addr: &IpAddr) -> u32 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// libnftnl-compatible user data holding a single comment TLV.
fn encode_comment_udata(comment: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(comment.len() + 3);
    out.push(sys::NFTNL_UDATA_COMMENT);
    // validate_tag() keeps the comment under 254 bytes, so this cannot clamp.
    out.push(u8::try_from(comment.len() + 1).unwrap_or(u8::MAX));
    out.extend_from_slice(comment.as_bytes());
    out.push(0);
    out
}

/// Extracts the comment from libnftnl-style user data, if present and sane.
fn decode_comment_udata(mut udata: &[u8]) -> Option<String> {
    while let [ty, len, rest @ ..] = udata {
        let value = rest.get(..usize::from(*len))?;
        if *ty == sys::NFTNL_UDATA_COMMENT {
            let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
            return String::from_utf8(value.get(..end)?.to_vec()).ok();
        }
        udata = rest.get(usize::from(*len)..)?;
    }
    None
}

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

/// A fully encoded batch plus what each sequence number refers to, so kernel
/// errors can name the object that failed.
struct Batch {
    bytes: Vec<u8>,
    first_seq: u32,
    last_seq: u32,
    objects: Vec<(u32, String)>,
}

impl Batch {
    fn object(&self, seq: u32) -> String {
        self.objects
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, o)| o.clone())
            .unwrap_or_else(|| format!("batch message seq {seq}"))
    }

    fn contains(&self, seq: u32) -> bool {
        seq.wrapping_sub(self.first_seq) <= self.last_seq.wrapping_sub(self.first_seq)
    }
}

/// Builds `BATCH_BEGIN, msg…, BATCH_END`. Only the last real message asks for
/// an ACK: the kernel reports every failing message anyway, and a single
/// positive ACK at the end tells us the whole batch was committed (errors,
/// including commit-time ones, are always delivered before it).
struct BatchBuilder {
    w: MsgWriter,
    seq: u32,
    first_seq: u32,
    objects: Vec<(u32, String)>,
    last_msg: Option<usize>,
    batch_object: String,
}

impl BatchBuilder {
    fn new(first_seq: u32, batch_object: String) -> Self {
        let mut w = MsgWriter::default();
        let start = w.begin_msg(
            sys::NFNL_MSG_BATCH_BEGIN,
            sys::NLM_F_REQUEST,
            first_seq,
            sys::NFPROTO_UNSPEC,
            sys::NFNL_SUBSYS_NFTABLES,
        );
        w.end_msg(start);
        BatchBuilder {
            w,
            seq: first_seq,
            first_seq,
            // Commit failures are reported against the BATCH_BEGIN sequence.
            objects: vec![(first_seq, format!("{batch_object} (commit)"))],
            last_msg: None,
            batch_object,
        }
    }

    fn msg(
        &mut self,
        msg_type: u8,
        flags: u16,
        family: u8,
        object: String,
        body: impl FnOnce(&mut MsgWriter),
    ) {
        self.seq = self.seq.wrapping_add(1);
        let ty = (sys::NFNL_SUBSYS_NFTABLES << 8) | u16::from(msg_type);
        let start = self.w.begin_msg(
            ty,
            sys::NLM_F_REQUEST | flags,
            self.seq,
            family,
            // res_id is unused for nf_tables messages inside a batch.
            0,
        );
        body(&mut self.w);
        self.w.end_msg(start);
        self.objects.push((self.seq, object));
        self.last_msg = Some(start);
    }

    fn finish(mut self) -> Result<Batch, NftError> {
        if let Some(start) = self.last_msg {
            // nlmsg_flags sit at offset 6 of the header.
            let flags_at = start + 6;
            let flags = self
                .w
                .buf
                .get(flags_at..flags_at + 2)
                .and_then(|b| <[u8; 2]>::try_from(b).ok())
                .map(u16::from_ne_bytes)
                .unwrap_or(0);
            self.w
                .patch(flags_at, &(flags | sys::NLM_F_ACK).to_ne_bytes());
        }
        self.seq = self.seq.wrapping_add(1);
        let start = self.w.begin_msg(
            sys::NFNL_MSG_BATCH_END,
            sys::NLM_F_REQUEST,
            self.seq,
            sys::NFPROTO_UNSPEC,
            sys::NFNL_SUBSYS_NFTABLES,
        );
        self.w.end_msg(start);
        if self.w.overflow || self.w.buf.len() > MAX_BATCH_BYTES {
            return Err(NftError::TooLarge {
                object: self.batch_object,
                size: self.w.buf.len(),
                limit: MAX_BATCH_BYTES,
            });
        }
        Ok(Batch {
            bytes: self.w.buf,
            first_seq: self.first_seq,
            // The ACK-carrying message is the one before BATCH_END.
            last_seq: self.seq.wrapping_sub(1),
            objects: self.objects,
        })
    }
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

fn build_replace_batch(
    table: &str,
    rules: &TableRules<'_>,
    tag: &str,
    first_seq: u32,
) -> Result<Batch, NftError> {
    build_table_batch(table, rules, tag, first_seq, true)
}

/// `replace`: delete any existing table first, in the same transaction.
/// Otherwise create with NLM_F_EXCL (fails with EEXIST if the table exists).
/// A transaction that deletes anything makes the socket's close wait for a
/// kernel grace period (8-16 ms measured), so the common case of a fresh pod
/// netns uses the create-only form.
fn build_table_batch(
    table: &str,
    spec: &TableRules<'_>,
    tag: &str,
    first_seq: u32,
    replace: bool,
) -> Result<Batch, NftError> {
    validate_name("table", table)?;
    validate_tag(tag)?;
    for rule in spec.masquerade.unwrap_or_default() {
        validate_rule(rule)?;
    }
    for rule in spec.mss {
        validate_mss(rule)?;
    }
    let table_obj = format!("table inet {table}");
    let mut b = BatchBuilder::new(
        first_seq,
        format!("{} {table_obj}", if replace { "replace" } else { "create" }),
    );
    if replace {
        // "Delete if it exists" without a racy lookup: creating without
        // NLM_F_EXCL is a no-op for an existing table (we send no flags, so its
        // state is untouched), after which the delete cannot fail with ENOENT.
        // This is what `nft -f` does for `table x; delete table x; table x {…}`.
        b.msg(
            sys::NFT_MSG_NEWTABLE,
            sys::NLM_F_CREATE,
            sys::NFPROTO_INET,
            format!("{table_obj} (ensure exists before delete)"),
            |w| w.attr_str(sys::NFTA_TABLE_NAME, table),
        );
        b.msg(
            sys::NFT_MSG_DELTABLE,
            0,
            sys::NFPROTO_INET,
            format!("{table_obj} (delete old)"),
            |w| w.attr_str(sys::NFTA_TABLE_NAME, table),
        );
    }
    b.msg(
        sys::NFT_MSG_NEWTABLE,
        if replace {
            sys::NLM_F_CREATE
        } else {
            sys::NLM_F_CREATE | sys::NLM_F_EXCL
        },
        sys::NFPROTO_INET,
        format!("{table_obj} (create)"),
        |w| {
            w.attr_str(sys::NFTA_TABLE_NAME, table);
            // Never NFT_TABLE_F_OWNER: that would tie the table's lifetime to
            // this socket, while the masquerade must outlive the plugin.
            w.attr_u32(sys::NFTA_TABLE_FLAGS, 0);
            w.attr(sys::NFTA_TABLE_USERDATA, &encode_comment_udata(tag));
        },
    );
    let udata = encode_comment_udata(tag);
    if let Some(rules) = spec.masquerade {
        base_chain(
            &mut b,
            table,
            CHAIN,
            sys::NF_INET_POST_ROUTING,
            SRCNAT_PRIORITY,
            "nat",
        );
        for (i, rule) in rules.iter().enumerate() {
            b.msg(
                sys::NFT_MSG_NEWRULE,
                // APPEND keeps the rules in the caller's order.
                sys::NLM_F_CREATE | sys::NLM_F_APPEND,
                sys::NFPROTO_INET,
                format!(
                    "rule #{} ({}) in chain inet {table} {CHAIN}",
                    i + 1,
                    describe_rule(rule)
                ),
                |w| {
                    w.attr_str(sys::NFTA_RULE_TABLE, table);
                    w.attr_str(sys::NFTA_RULE_CHAIN, CHAIN);
                    let list = w.begin_nest(sys::NFTA_RULE_EXPRESSIONS);
                    for expr in masq_exprs(rule) {
                        expr.encode(w);
                    }
                    w.end_nest(list);
                    w.attr(sys::NFTA_RULE_USERDATA, &udata);
                },
            );
        }
    }
    if !spec.mss.is_empty() {
        base_chain(
            &mut b,
            table,
            MSS_CHAIN,
            sys::NF_INET_FORWARD,
            MANGLE_PRIORITY,
            "filter",
        );
        for (i, rule) in spec.mss.iter().enumerate() {
            b.msg(
                sys::NFT_MSG_NEWRULE,
                sys::NLM_F_CREATE | sys::NLM_F_APPEND,
                sys::NFPROTO_INET,
                format!(
                    "rule #{} ({}) in chain inet {table} {MSS_CHAIN}",
                    i + 1,
                    describe_mss(rule)
                ),
                |w| {
                    w.attr_str(sys::NFTA_RULE_TABLE, table);
                    w.attr_str(sys::NFTA_RULE_CHAIN, MSS_CHAIN);
                    let list = w.begin_nest(sys::NFTA_RULE_EXPRESSIONS);
                    for expr in mss_exprs(rule) {
                        expr.encode(w);
                    }
                    w.end_nest(list);
                    w.attr(sys::NFTA_RULE_USERDATA, &udata);
                },
            );
        }
    }
    b.finish()
}

/// `chain inet <table> <name> { type <ty> hook <hook> priority <prio>; policy accept; }`
fn base_chain(b: &mut BatchBuilder, table: &str, name: &str, hook: u32, prio: i32, ty: &str) {
    b.msg(
        sys::NFT_MSG_NEWCHAIN,
        sys::NLM_F_CREATE,
        sys::NFPROTO_INET,
        format!("chain inet {table} {name}"),
        |w| {
            w.attr_str(sys::NFTA_CHAIN_TABLE, table);
            w.attr_str(sys::NFTA_CHAIN_NAME, name);
            let h = w.begin_nest(sys::NFTA_CHAIN_HOOK);
            w.attr_u32(sys::NFTA_HOOK_HOOKNUM, hook);
            w.attr(sys::NFTA_HOOK_PRIORITY, &prio.to_be_bytes());
            w.end_nest(h);
            w.attr_u32(sys::NFTA_CHAIN_POLICY, sys::NF_ACCEPT);
            w.attr_str(sys::NFTA_CHAIN_TYPE, ty);
        },
    );
}

fn build_delete_batch(table: &str, first_seq: u32) -> Result<Batch, NftError> {
    validate_name("table", table)?;
    let table_obj = format!("table inet {table}");
    let mut b = BatchBuilder::new(first_seq, format!("delete {table_obj}"));
    b.msg(
        sys::NFT_MSG_DELTABLE,
        0,
        sys::NFPROTO_INET,
        table_obj,
        |w| w.attr_str(sys::NFTA_TABLE_NAME, table),
    );
    b.finish()
}

/// Encodes the batch [`NftSocket::replace_masquerade_table`] sends, with
/// sequence numbers starting at `first_seq`. Pure, so the wire format can be
/// unit-tested without privileges.
pub fn encode_masquerade_batch(
    table: &str,
    rules: &[MasqRule],
    tag: &str,
    first_seq: u32,
) -> Result<Vec<u8>, NftError> {
    encode_table_batch(
        table,
        &TableRules {
            masquerade: Some(rules),
            mss: &[],
        },
        tag,
        first_seq,
    )
}

/// Encodes the batch [`NftSocket::replace_table`] sends when the table
/// exists (delete and recreate), for unit tests of the wire format.
pub fn encode_table_batch(
    table: &str,
    rules: &TableRules<'_>,
    tag: &str,
    first_seq: u32,
) -> Result<Vec<u8>, NftError> {
    build_replace_batch(table, rules, tag, first_seq).map(|b| b.bytes)
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

/// Attributes of one nesting level, in wire order. Parsing is bounds-checked
/// throughout: kernel data is trusted to be well-formed but never indexed
/// blindly.
struct Attrs<'a> {
    items: Vec<(u16, &'a [u8])>,
}

impl<'a> Attrs<'a> {
    fn parse(mut data: &'a [u8]) -> Result<Self, String> {
        let mut items = Vec::new();
        while !data.is_empty() {
            let (len, ty) = match data {
                [l0, l1, t0, t1, ..] => (
                    usize::from(u16::from_ne_bytes([*l0, *l1])),
                    u16::from_ne_bytes([*t0, *t1]),
                ),
                // Trailing padding shorter than an attribute header.
                _ if data.iter().all(|&b| b == 0) => break,
                _ => return Err(format!("truncated attribute header ({} bytes)", data.len())),
            };
            let payload = data
                .get(4..len)
                .ok_or_else(|| format!("attribute type {ty} length {len} out of bounds"))?;
            items.push((ty & sys::NLA_TYPE_MASK, payload));
            data = data.get(align4(len)..).unwrap_or_default();
        }
        Ok(Attrs { items })
    }

    /// Last occurrence of `ty` (the kernel's nla_parse semantics).
    fn get(&self, ty: u16) -> Option<&'a [u8]> {
        self.items
            .iter()
            .rev()
            .find(|(t, _)| *t == ty)
            .map(|(_, p)| *p)
    }

    fn all(&self, ty: u16) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.items
            .iter()
            .filter(move |(t, _)| *t == ty)
            .map(|(_, p)| *p)
    }
}

fn be_u32(b: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(b).ok().map(u32::from_be_bytes)
}

fn be_u64(b: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(b).ok().map(u64::from_be_bytes)
}

fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map(u32::from_ne_bytes)
}

fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2)
        .and_then(|s| <[u8; 2]>::try_from(s).ok())
        .map(u16::from_ne_bytes)
}

/// A NUL-terminated (or not) string attribute.
fn attr_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(b.get(..end).unwrap_or_default()).into_owned()
}

/// `NFTA_DATA_VALUE` inside a data nest.
fn data_value(nest: &[u8]) -> Option<Vec<u8>> {
    Attrs::parse(nest)
        .ok()?
        .get(sys::NFTA_DATA_VALUE)
        .map(<[u8]>::to_vec)
}

/// One netlink message from a received datagram.
#[derive(Debug)]
struct NlMsg {
    ty: u16,
    flags: u16,
    seq: u32,
    /// Everything after the 16-byte `nlmsghdr`.
    payload: Vec<u8>,
}

impl NlMsg {
    /// The attributes of an nfnetlink data message (after `nfgenmsg`).
    fn nf_attrs(&self) -> &[u8] {
        self.payload.get(4..).unwrap_or_default()
    }

    fn nf_family(&self) -> u8 {
        self.payload.first().copied().unwrap_or(sys::NFPROTO_UNSPEC)
    }
}

fn split_datagram(mut data: &[u8]) -> Result<Vec<NlMsg>, String> {
    let mut out = Vec::new();
    while data.len() >= sys::NLMSG_HDRLEN {
        let len = ne_u32(data, 0).unwrap_or(0) as usize;
        let ty = ne_u16(data, 4).unwrap_or(0);
        let flags = ne_u16(data, 6).unwrap_or(0);
        let seq = ne_u32(data, 8).unwrap_or(0);
        if len < sys::NLMSG_HDRLEN {
            return Err(format!("nlmsg_len {len} shorter than the header"));
        }
        let payload = data
            .get(sys::NLMSG_HDRLEN..len)
            .ok_or_else(|| format!("nlmsg_len {len} exceeds datagram ({} bytes)", data.len()))?;
        out.push(NlMsg {
            ty,
            flags,
            seq,
            payload: payload.to_vec(),
        });
        data = data.get(align4(len)..).unwrap_or_default();
    }
    Ok(out)
}

/// Decodes an `NLMSG_ERROR` payload into (positive errno, extack message).
/// errno 0 is an ACK.
fn parse_error(msg: &NlMsg) -> Result<(i32, Option<String>), String> {
    let raw = ne_u32(&msg.payload, 0).ok_or("NLMSG_ERROR shorter than its error code")?;
    let errno = i32::from_ne_bytes(raw.to_ne_bytes()).saturating_neg();
    let mut message = None;
    if msg.flags & sys::NLM_F_ACK_TLVS != 0 {
        // The echoed request is only its header with NETLINK_CAP_ACK, else
        // the whole (padded) request; the TLVs follow it.
        let echoed = if msg.flags & sys::NLM_F_CAPPED != 0 {
            sys::NLMSG_HDRLEN
        } else {
            align4(ne_u32(&msg.payload, 4).unwrap_or(0) as usize)
        };
        if let Some(tlvs) = msg.payload.get(4 + echoed..) {
            if let Ok(attrs) = Attrs::parse(tlvs) {
                message = attrs.get(sys::NLMSGERR_ATTR_MSG).map(attr_string);
            }
        }
    }
    Ok((errno, message))
}

/// A base or regular chain as reported by a chain dump.
struct ChainInfo {
    family: u8,
    table: String,
    name: String,
    hooknum: Option<u32>,
    chain_type: Option<String>,
}

/// A rule as reported by a rule dump.
struct RuleInfo {
    chain: String,
    handle: u64,
    exprs: Vec<Expr>,
    userdata: Option<Vec<u8>>,
}

fn decode_chain(msg: &NlMsg) -> Result<ChainInfo, String> {
    let attrs = Attrs::parse(msg.nf_attrs())?;
    let hook = match attrs.get(sys::NFTA_CHAIN_HOOK) {
        Some(h) => Some(Attrs::parse(h)?),
        None => None,
    };
    Ok(ChainInfo {
        family: msg.nf_family(),
        table: attrs
            .get(sys::NFTA_CHAIN_TABLE)
            .map(attr_string)
            .unwrap_or_default(),
        name: attrs
            .get(sys::NFTA_CHAIN_NAME)
            .map(attr_string)
            .unwrap_or_default(),
        hooknum: hook
            .as_ref()
            .and_then(|h| h.get(sys::NFTA_HOOK_HOOKNUM))
            .and_then(be_u32),
        chain_type: attrs.get(sys::NFTA_CHAIN_TYPE).map(attr_string),
    })
}

fn decode_rule(msg: &NlMsg) -> Result<RuleInfo, String> {
    let attrs = Attrs::parse(msg.nf_attrs())?;
    let exprs = match attrs.get(sys::NFTA_RULE_EXPRESSIONS) {
        // A malformed expression makes the rule foreign, not the listing
        // fail: CHECK must still be able to report drift.
        Some(list) => Attrs::parse(list)?
            .all(sys::NFTA_LIST_ELEM)
            .map(|e| {
                Expr::decode(e).unwrap_or_else(|_| Expr::Other {
                    name: "<malformed>".into(),
                })
            })
            .collect(),
        None => Vec::new(),
    };
    Ok(RuleInfo {
        chain: attrs
            .get(sys::NFTA_RULE_CHAIN)
            .map(attr_string)
            .unwrap_or_default(),
        handle: attrs
            .get(sys::NFTA_RULE_HANDLE)
            .and_then(be_u64)
            .unwrap_or(0),
        exprs,
        userdata: attrs.get(sys::NFTA_RULE_USERDATA).map(<[u8]>::to_vec),
    })
}

fn family_name(family: u8) -> String {
    match family {
        sys::NFPROTO_INET => "inet".into(),
        sys::NFPROTO_IPV4 => "ip".into(),
        sys::NFPROTO_IPV6 => "ip6".into(),
        sys::NFPROTO_ARP => "arp".into(),
        sys::NFPROTO_BRIDGE => "bridge".into(),
        sys::NFPROTO_NETDEV => "netdev".into(),
        other => format!("family{other}"),
    }
}

/// What kind of source NAT an expression performs, if any.
fn snat_kind(expr: &Expr) -> Option<&'static str> {
    match expr {
        Expr::Masq { .. } => Some("masquerade"),
        Expr::Nat { nat_type } if *nat_type == sys::NFT_NAT_SNAT => Some("snat"),
        Expr::Target { name } if name == "MASQUERADE" => Some("masquerade (xt MASQUERADE)"),
        Expr::Target { name } if name == "SNAT" => Some("snat (xt SNAT)"),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Socket
// ---------------------------------------------------------------------------

/// A NETLINK_NETFILTER socket bound to the network namespace that was current
/// (for the calling thread) when [`NftSocket::new`] ran.
#[derive(Debug)]
pub struct NftSocket {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

fn sock_err(op: &'static str) -> impl FnOnce(io::Error) -> NftError {
    move |source| NftError::Socket { op, source }
}

fn protocol_err(object: &str) -> impl FnOnce(String) -> NftError + '_ {
    move |reason| NftError::Protocol {
        object: object.to_string(),
        reason,
    }
}

impl NftSocket {
    /// Opens a socket in the calling thread's current network namespace.
    pub fn new() -> Result<Self, NftError> {
        let mut sock =
            Socket::new(NETLINK_NETFILTER).map_err(sock_err("socket(NETLINK_NETFILTER)"))?;
        sock.bind_auto().map_err(sock_err("bind"))?;
        // Both are conveniences (kernel error strings, small error replies)
        // that old kernels lack; failing to enable them is not fatal.
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_cap_ack(true);
        set_timeout(&sock, libc::SO_RCVTIMEO, RECV_TIMEOUT)
            .map_err(sock_err("setsockopt(SO_RCVTIMEO)"))?;
        set_timeout(&sock, libc::SO_SNDTIMEO, RECV_TIMEOUT)
            .map_err(sock_err("setsockopt(SO_SNDTIMEO)"))?;
        // Seed sequence numbers from the clock like libmnl does, so replies to
        // a previous process' socket can never be mistaken for ours.
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        Ok(NftSocket {
            sock,
            seq,
            buf: vec![0; 64 * 1024],
        })
    }

    /// Atomically (one batch) (re)creates `inet <table>`: deletes the table if
    /// it exists, creates it, adds chain `postrouting` (type nat, hook
    /// postrouting, priority srcnat/100, policy accept) and one rule per
    /// [`MasqRule`], in order, each carrying `tag` as its comment (user data)
    /// so ownership can be verified later. Nothing changes if any step fails.
    pub fn replace_masquerade_table(
        &mut self,
        table: &str,
        rules: &[MasqRule],
        tag: &str,
    ) -> Result<(), NftError> {
        self.replace_table(
            table,
            &TableRules {
                masquerade: Some(rules),
                mss: &[],
            },
            tag,
        )
    }

    /// Like [`NftSocket::replace_masquerade_table`] for a table holding any
    /// of podgate's chains: `postrouting` (masquerade) and `forward` (MSS
    /// clamp, type filter, hook forward, priority mangle/-150), in one batch.
    pub fn replace_table(
        &mut self,
        table: &str,
        rules: &TableRules<'_>,
        tag: &str,
    ) -> Result<(), NftError> {
        let first = self.reserve_seqs(rules.messages());
        let fresh = build_table_batch(table, rules, tag, first, false)?;
        match self.run_batch(&fresh) {
            Err(NftError::Kernel { errno, .. }) if errno == libc::EEXIST => {
                // The table is there already (a repeated ADD): replace it atomically.
                let first = self.reserve_seqs(rules.messages());
                let batch = build_replace_batch(table, rules, tag, first)?;
                self.run_batch(&batch)
            }
            other => other,
        }
    }

    /// Deletes `inet <table>` with everything in it. Returns `Ok(false)` if it
    /// did not exist.
    pub fn delete_table(&mut self, table: &str) -> Result<bool, NftError> {
        let first = self.reserve_seqs(3);
        let batch = build_delete_batch(table, first)?;
        match self.run_batch(&batch) {
            Ok(()) => Ok(true),
            Err(NftError::Kernel { errno, .. }) if errno == libc::ENOENT => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Lists the rules of chain `postrouting` in `inet <table>`, in chain
    /// order. Returns `Ok(None)` if the table does not exist, and an empty
    /// list if the table exists without that chain.
    pub fn list_masquerade(&mut self, table: &str) -> Result<Option<Vec<ListedRule>>, NftError> {
        Ok(self.list_chain(table, CHAIN)?.map(|rules| {
            rules
                .iter()
                .map(|rule| ListedRule {
                    rule: rule_from_exprs(&rule.exprs),
                    tag: rule.userdata.as_deref().and_then(decode_comment_udata),
                    handle: rule.handle,
                })
                .collect()
        }))
    }

    /// Lists the rules of chain `forward` (MSS clamp) in `inet <table>`;
    /// `Ok(None)` if the table does not exist, empty without that chain.
    pub fn list_mss(&mut self, table: &str) -> Result<Option<Vec<ListedMss>>, NftError> {
        Ok(self.list_chain(table, MSS_CHAIN)?.map(|rules| {
            rules
                .iter()
                .map(|rule| ListedMss {
                    rule: mss_from_exprs(&rule.exprs),
                    tag: rule.userdata.as_deref().and_then(decode_comment_udata),
                    handle: rule.handle,
                })
                .collect()
        }))
    }

    fn list_chain(&mut self, table: &str, chain: &str) -> Result<Option<Vec<RuleInfo>>, NftError> {
        validate_name("table", table)?;
        if !self.table_exists(sys::NFPROTO_INET, table)? {
            return Ok(None);
        }
        let object = format!("list rules of chain inet {table} {chain}");
        let msgs = self.dump(sys::NFT_MSG_GETRULE, sys::NFPROTO_INET, &object, |w| {
            w.attr_str(sys::NFTA_RULE_TABLE, table);
            w.attr_str(sys::NFTA_RULE_CHAIN, chain);
        });
        let msgs = match msgs {
            // The table exists without this chain.
            Err(NftError::Kernel { errno, .. }) if errno == libc::ENOENT => {
                return Ok(Some(Vec::new()))
            }
            other => other?,
        };
        let mut out = Vec::with_capacity(msgs.len());
        for msg in &msgs {
            let rule = decode_rule(msg).map_err(protocol_err(&object))?;
            if rule.chain != chain {
                continue; // old kernels may ignore the chain filter
            }
            out.push(rule);
        }
        Ok(Some(out))
    }

    /// Lists all tables of all families as `(nfproto family, name)`; family
    /// numbers are `NFPROTO_*` (1 inet, 2 ip, 10 ip6, …).
    pub fn list_tables(&mut self) -> Result<Vec<(u8, String)>, NftError> {
        let object = "list tables";
        let msgs = self.dump(sys::NFT_MSG_GETTABLE, sys::NFPROTO_UNSPEC, object, |_| {})?;
        let mut out = Vec::with_capacity(msgs.len());
        for msg in &msgs {
            let attrs = Attrs::parse(msg.nf_attrs()).map_err(protocol_err(object))?;
            if let Some(name) = attrs.get(sys::NFTA_TABLE_NAME) {
                out.push((msg.nf_family(), attr_string(name)));
            }
        }
        Ok(out)
    }

    /// Lists the `inet` tables whose name starts with `prefix`, with the
    /// comment each carries in its user data (podgate's ownership tag), as
    /// `(name, tag)`. For sweeping by ownership when no record says which.
    pub fn list_inet_tables_tagged(
        &mut self,
        prefix: &str,
    ) -> Result<Vec<(String, Option<String>)>, NftError> {
        let object = "list inet tables";
        let msgs = self.dump(sys::NFT_MSG_GETTABLE, sys::NFPROTO_INET, object, |_| {})?;
        let mut out = Vec::new();
        for msg in &msgs {
            if msg.nf_family() != sys::NFPROTO_INET {
                continue;
            }
            let attrs = Attrs::parse(msg.nf_attrs()).map_err(protocol_err(object))?;
            let Some(name) = attrs.get(sys::NFTA_TABLE_NAME).map(attr_string) else {
                continue;
            };
            if name.starts_with(prefix) {
                let tag = attrs
                    .get(sys::NFTA_TABLE_USERDATA)
                    .and_then(decode_comment_udata);
                out.push((name, tag));
            }
        }
        Ok(out)
    }

    /// Finds source NAT in other tables: every ip/ip6/inet chain of type nat
    /// hooked at postrouting (and, best effort, regular chains reached from it
    /// via jump/goto) is scanned for `masq`, `nat snat` and iptables-nft's
    /// `MASQUERADE`/`SNAT` targets. Returns descriptions such as
    /// `"ip nat POSTROUTING: masquerade (handle 4)"`.
    ///
    /// `exclude_table` skips the inet table of that name (our own). Rules of
    /// legacy (non-nft) iptables are invisible to nf_tables and not reported.
    pub fn find_snat_rules(
        &mut self,
        exclude_table: Option<&str>,
    ) -> Result<Vec<String>, NftError> {
        let object = "list chains";
        let msgs = self.dump(sys::NFT_MSG_GETCHAIN, sys::NFPROTO_UNSPEC, object, |_| {})?;
        // (family, table) → base chains of interest.
        let mut candidates: BTreeMap<(u8, String), Vec<String>> = BTreeMap::new();
        for msg in &msgs {
            let chain = decode_chain(msg).map_err(protocol_err(object))?;
            let relevant_family = matches!(
                chain.family,
                sys::NFPROTO_INET | sys::NFPROTO_IPV4 | sys::NFPROTO_IPV6
            );
            let ours =
                chain.family == sys::NFPROTO_INET && Some(chain.table.as_str()) == exclude_table;
            if relevant_family
                && !ours
                && chain.hooknum == Some(sys::NF_INET_POST_ROUTING)
                && chain.chain_type.as_deref() == Some("nat")
            {
                candidates
                    .entry((chain.family, chain.table))
                    .or_default()
                    .push(chain.name);
            }
        }

        let mut found = Vec::new();
        for ((family, table), base_chains) in candidates {
            let object = format!("list rules of table {} {table}", family_name(family));
            let msgs = self.dump(sys::NFT_MSG_GETRULE, family, &object, |w| {
                w.attr_str(sys::NFTA_RULE_TABLE, &table);
            })?;
            let mut by_chain: BTreeMap<String, Vec<RuleInfo>> = BTreeMap::new();
            for msg in &msgs {
                let rule = decode_rule(msg).map_err(protocol_err(&object))?;
                by_chain.entry(rule.chain.clone()).or_default().push(rule);
            }
            // Breadth-first over jump/goto targets so that e.g. kube-proxy's
            // POSTROUTING → KUBE-POSTROUTING → MASQUERADE is found too.
            let mut seen: BTreeSet<String> = BTreeSet::new();
            let mut queue: VecDeque<(String, Option<String>)> =
                base_chains.into_iter().map(|c| (c, None)).collect();
            while let Some((chain, via)) = queue.pop_front() {
                if !seen.insert(chain.clone()) {
                    continue;
                }
                let origin = via.clone().unwrap_or_else(|| chain.clone());
                for rule in by_chain.get(&chain).map(Vec::as_slice).unwrap_or_default() {
                    for expr in &rule.exprs {
                        if let Some(kind) = snat_kind(expr) {
                            let reached = match &via {
                                Some(base) => format!(" (reached from {base})"),
                                None => String::new(),
                            };
                            found.push(format!(
                                "{} {table} {chain}{reached}: {kind} (handle {})",
                                family_name(family),
                                rule.handle
                            ));
                        }
                        if let Expr::Immediate {
                            dreg: sys::NFT_REG_VERDICT,
                            verdict: Some((code, Some(target))),
                        } = expr
                        {
                            if *code == sys::NFT_JUMP || *code == sys::NFT_GOTO {
                                queue.push_back((target.clone(), Some(origin.clone())));
                            }
                        }
                    }
                }
            }
        }
        Ok(found)
    }

    // -- plumbing ----------------------------------------------------------

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Reserves `n` consecutive sequence numbers and returns the first.
    fn reserve_seqs(&mut self, n: usize) -> u32 {
        let first = self.seq.wrapping_add(1);
        self.seq = self.seq.wrapping_add(u32::try_from(n).unwrap_or(u32::MAX));
        first
    }

    fn send(&self, bytes: &[u8], object: &str) -> Result<(), NftError> {
        let kernel = SocketAddr::new(0, 0);
        let sent = self
            .sock
            .send_to(bytes, &kernel, 0)
            .map_err(sock_err("sendto"))?;
        if sent != bytes.len() {
            return Err(NftError::Protocol {
                object: object.to_string(),
                reason: format!("short send: {sent} of {} bytes", bytes.len()),
            });
        }
        Ok(())
    }

    /// Receives one datagram. Blocking receives time out after
    /// [`RECV_TIMEOUT`]; non-blocking ones return `Ok(None)` when the queue is
    /// empty. The datagram is peeked first so that an oversized one grows the
    /// buffer instead of being truncated.
    fn recv_msgs(
        &mut self,
        nonblocking: bool,
        object: &str,
    ) -> Result<Option<Vec<NlMsg>>, NftError> {
        let base_flags = if nonblocking { libc::MSG_DONTWAIT } else { 0 };
        loop {
            let peeked = {
                let mut slice: &mut [u8] = self.buf.as_mut_slice();
                self.sock
                    .recv(&mut slice, base_flags | libc::MSG_PEEK | libc::MSG_TRUNC)
            };
            let size = match peeked {
                Ok(size) => size,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    return if nonblocking {
                        Ok(None)
                    } else {
                        Err(NftError::Timeout {
                            object: object.to_string(),
                            timeout: RECV_TIMEOUT,
                        })
                    };
                }
                Err(e) => {
                    return Err(NftError::Socket {
                        op: "recv",
                        source: e,
                    })
                }
            };
            if size > MAX_DATAGRAM_BYTES {
                // Consume it so the socket stays usable, then give up.
                let mut slice: &mut [u8] = self.buf.as_mut_slice();
                let _ = self.sock.recv(&mut slice, libc::MSG_DONTWAIT);
                return Err(NftError::TooLarge {
                    object: object.to_string(),
                    size,
                    limit: MAX_DATAGRAM_BYTES,
                });
            }
            if size > self.buf.len() {
                self.buf.resize(size, 0);
            }
            let got = {
                let mut slice: &mut [u8] = self.buf.as_mut_slice();
                // The datagram is already queued, so this cannot block.
                self.sock.recv(&mut slice, libc::MSG_DONTWAIT)
            };
            let got = match got {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(NftError::Socket {
                        op: "recv",
                        source: e,
                    })
                }
            };
            let data = self.buf.get(..got).unwrap_or_default();
            return split_datagram(data).map(Some).map_err(protocol_err(object));
        }
    }

    /// Sends a batch and waits for its outcome.
    ///
    /// The kernel processes a batch synchronously inside `sendmsg`, so all
    /// replies (errors for failing messages, a commit error against
    /// BATCH_BEGIN, the final ACK) are queued once `send` returns. We block
    /// for the final ACK; as soon as an error shows up we only drain what is
    /// already queued, which also covers batch-level failures that produce no
    /// final ACK at all.
    fn run_batch(&mut self, batch: &Batch) -> Result<(), NftError> {
        let whole = batch.object(batch.first_seq);
        self.send(&batch.bytes, &whole)?;
        let mut errors: Vec<NftError> = Vec::new();
        let mut done = false;
        while !done {
            let Some(msgs) = self.recv_msgs(!errors.is_empty(), &whole)? else {
                break; // drained after an error
            };
            for msg in msgs {
                if !batch.contains(msg.seq) {
                    continue; // stale reply to an earlier, abandoned request
                }
                match msg.ty {
                    sys::NLMSG_ERROR => {
                        let (errno, message) = parse_error(&msg).map_err(protocol_err(&whole))?;
                        if errno != 0 {
                            errors.push(NftError::Kernel {
                                object: batch.object(msg.seq),
                                errno,
                                message,
                            });
                        } else if msg.seq == batch.last_seq {
                            done = true;
                        }
                    }
                    sys::NLMSG_OVERRUN => {
                        return Err(NftError::Protocol {
                            object: whole,
                            reason: "NLMSG_OVERRUN".into(),
                        })
                    }
                    _ => {}
                }
            }
        }
        // The first error is the root cause; later ones are usually
        // consequences of the aborted transaction.
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Whether `<family> <name>` exists (a non-dump GETTABLE).
    fn table_exists(&mut self, family: u8, name: &str) -> Result<bool, NftError> {
        let object = format!("table {} {name}", family_name(family));
        let seq = self.next_seq();
        let mut w = MsgWriter::default();
        let start = w.begin_msg(
            (sys::NFNL_SUBSYS_NFTABLES << 8) | u16::from(sys::NFT_MSG_GETTABLE),
            sys::NLM_F_REQUEST | sys::NLM_F_ACK,
            seq,
            family,
            0,
        );
        w.attr_str(sys::NFTA_TABLE_NAME, name);
        w.end_msg(start);
        self.send(&w.buf, &object)?;
        let mut found = false;
        loop {
            let msgs = self.recv_msgs(false, &object)?.unwrap_or_default();
            for msg in msgs.iter().filter(|m| m.seq == seq) {
                match msg.ty {
                    sys::NLMSG_ERROR => {
                        let (errno, message) = parse_error(msg).map_err(protocol_err(&object))?;
                        return match errno {
                            0 => Ok(found),
                            libc::ENOENT => Ok(false),
                            _ => Err(NftError::Kernel {
                                object,
                                errno,
                                message,
                            }),
                        };
                    }
                    sys::NLMSG_DONE | sys::NLMSG_NOOP => {}
                    _ => found = true,
                }
            }
        }
    }

    /// Runs a dump request, restarting it if the kernel reports that the
    /// ruleset changed underneath it (`NLM_F_DUMP_INTR`).
    fn dump(
        &mut self,
        msg_type: u8,
        family: u8,
        object: &str,
        attrs: impl Fn(&mut MsgWriter),
    ) -> Result<Vec<NlMsg>, NftError> {
        for _ in 0..DUMP_ATTEMPTS {
            let seq = self.next_seq();
            let mut w = MsgWriter::default();
            let start = w.begin_msg(
                (sys::NFNL_SUBSYS_NFTABLES << 8) | u16::from(msg_type),
                sys::NLM_F_REQUEST | sys::NLM_F_DUMP,
                seq,
                family,
                0,
            );
            attrs(&mut w);
            w.end_msg(start);
            self.send(&w.buf, object)?;
            if let Some(msgs) = self.read_dump(seq, object)? {
                return Ok(msgs);
            }
        }
        Err(NftError::DumpInterrupted {
            object: object.to_string(),
            attempts: DUMP_ATTEMPTS,
        })
    }

    /// Reads one dump to its `NLMSG_DONE`. Returns `Ok(None)` if it was
    /// interrupted. Always reads to the end (unless the kernel errs) so the
    /// socket is left without a half-finished dump, which would make the next
    /// dump fail with EBUSY.
    fn read_dump(&mut self, seq: u32, object: &str) -> Result<Option<Vec<NlMsg>>, NftError> {
        let mut out = Vec::new();
        let mut total = 0usize;
        let mut interrupted = false;
        loop {
            let msgs = self.recv_msgs(false, object)?.unwrap_or_default();
            for msg in msgs {
                if msg.seq != seq {
                    continue; // stale reply to an earlier, abandoned request
                }
                interrupted |= msg.flags & sys::NLM_F_DUMP_INTR != 0;
                match msg.ty {
                    sys::NLMSG_DONE => {
                        // NLMSG_DONE carries the dump's final status.
                        let status =
                            ne_u32(&msg.payload, 0).map(|v| i32::from_ne_bytes(v.to_ne_bytes()));
                        if let Some(status) = status.filter(|s| *s < 0) {
                            return Err(NftError::Kernel {
                                object: object.to_string(),
                                errno: status.saturating_neg(),
                                message: None,
                            });
                        }
                        if total > MAX_DUMP_BYTES {
                            return Err(NftError::TooLarge {
                                object: object.to_string(),
                                size: total,
                                limit: MAX_DUMP_BYTES,
                            });
                        }
                        return Ok((!interrupted).then_some(out));
                    }
                    sys::NLMSG_ERROR => {
                        let (errno, message) = parse_error(&msg).map_err(protocol_err(object))?;
                        if errno != 0 {
                            return Err(NftError::Kernel {
                                object: object.to_string(),
                                errno,
                                message,
                            });
                        }
                    }
                    sys::NLMSG_NOOP => {}
                    sys::NLMSG_OVERRUN => {
                        return Err(NftError::Protocol {
                            object: object.to_string(),
                            reason: "NLMSG_OVERRUN".into(),
                        })
                    }
                    _ => {
                        total = total.saturating_add(msg.payload.len());
                        // Past the cap keep reading (to finish the dump) but
                        // stop buffering.
                        if total <= MAX_DUMP_BYTES {
                            out.push(msg);
                        }
                    }
                }
            }
        }
    }
}

fn set_timeout(sock: &Socket, opt: libc::c_int, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
    };
    // SAFETY: `tv` is a valid timeval that outlives the call, and the length
    // passed matches its size; the fd is owned by `sock`.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            std::ptr::addr_of!(tv).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
// Tests may index and unwrap: a panic is exactly the failure report we want.
#[allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn rule(src: &str, oif: &str) -> MasqRule {
        MasqRule {
            source: src.parse().unwrap(),
            oifname: oif.into(),
        }
    }

    /// Splits an encoded batch back into messages with our own parser.
    fn messages(bytes: &[u8]) -> Vec<NlMsg> {
        split_datagram(bytes).unwrap()
    }

    fn rule_exprs(msg: &NlMsg) -> Vec<Expr> {
        decode_rule(msg).unwrap().exprs
    }

    #[test]
    fn batch_framing() {
        let bytes = encode_masquerade_batch(
            "podgate",
            &[rule("10.8.0.0/24", "eth0"), rule("fd00::/64", "eth0")],
            "podgate:abc",
            100,
        )
        .unwrap();
        assert_eq!(bytes.len() % 4, 0);
        let msgs = messages(&bytes);
        let types: Vec<u16> = msgs.iter().map(|m| m.ty).collect();
        let nft = |m: u8| (10u16 << 8) | u16::from(m);
        assert_eq!(
            types,
            vec![
                0x10,
                nft(sys::NFT_MSG_NEWTABLE),
                nft(sys::NFT_MSG_DELTABLE),
                nft(sys::NFT_MSG_NEWTABLE),
                nft(sys::NFT_MSG_NEWCHAIN),
                nft(sys::NFT_MSG_NEWRULE),
                nft(sys::NFT_MSG_NEWRULE),
                0x11,
            ]
        );
        let seqs: Vec<u32> = msgs.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, (100..108).collect::<Vec<_>>());
        // Batch begin: nfgenmsg AF_UNSPEC, version 0, res_id NFTABLES (BE).
        assert_eq!(&bytes[..4], &20u32.to_ne_bytes());
        assert_eq!(msgs[0].payload, vec![0, 0, 0, 10]);
        assert_eq!(msgs[7].payload, vec![0, 0, 0, 10]);
        // Real messages use family inet; only the last asks for an ACK.
        for (i, m) in msgs.iter().enumerate().take(7).skip(1) {
            assert_eq!(m.payload[0], sys::NFPROTO_INET);
            assert_ne!(m.flags & sys::NLM_F_REQUEST, 0);
            assert_eq!(m.flags & sys::NLM_F_ACK != 0, i == 6, "message {i}");
        }
        assert_eq!(msgs[0].flags, sys::NLM_F_REQUEST);
        assert_eq!(msgs[7].flags, sys::NLM_F_REQUEST);
        assert_ne!(msgs[5].flags & sys::NLM_F_APPEND, 0);
        // The "ensure exists" NEWTABLE must not carry flags (it would modify
        // an existing table) nor EXCL (it must succeed on an existing table).
        let ensure = Attrs::parse(msgs[1].nf_attrs()).unwrap();
        assert!(ensure.get(sys::NFTA_TABLE_FLAGS).is_none());
        assert_eq!(msgs[1].flags & 0x200, 0);
        let created = Attrs::parse(msgs[3].nf_attrs()).unwrap();
        assert_eq!(created.get(sys::NFTA_TABLE_NAME).unwrap(), b"podgate\0");
        assert_eq!(created.get(sys::NFTA_TABLE_FLAGS).unwrap(), &[0, 0, 0, 0]);
    }

    #[test]
    fn chain_attributes() {
        let bytes = encode_masquerade_batch("t", &[], "x", 1).unwrap();
        let msgs = messages(&bytes);
        let attrs = Attrs::parse(msgs[4].nf_attrs()).unwrap();
        assert_eq!(attrs.get(sys::NFTA_CHAIN_TABLE).unwrap(), b"t\0");
        assert_eq!(attrs.get(sys::NFTA_CHAIN_NAME).unwrap(), b"postrouting\0");
        assert_eq!(attrs.get(sys::NFTA_CHAIN_TYPE).unwrap(), b"nat\0");
        assert_eq!(attrs.get(sys::NFTA_CHAIN_POLICY).unwrap(), &[0, 0, 0, 1]);
        let hook = Attrs::parse(attrs.get(sys::NFTA_CHAIN_HOOK).unwrap()).unwrap();
        assert_eq!(hook.get(sys::NFTA_HOOK_HOOKNUM).unwrap(), &[0, 0, 0, 4]);
        assert_eq!(hook.get(sys::NFTA_HOOK_PRIORITY).unwrap(), &[0, 0, 0, 100]);
        // The hook nest is flagged NLA_F_NESTED on the wire.
        let raw = msgs[4].nf_attrs();
        let pos = raw
            .windows(2)
            .position(|w| w == (sys::NFTA_CHAIN_HOOK | sys::NLA_F_NESTED).to_ne_bytes())
            .unwrap();
        assert_eq!(u16::from_ne_bytes([raw[pos - 2], raw[pos - 1]]), 4 + 8 + 8);
    }

    fn cmp_eq(data: &[u8]) -> Expr {
        Expr::Cmp {
            sreg: 1,
            op: 0,
            data: data.to_vec(),
        }
    }

    fn payload(offset: u32, len: u32) -> Expr {
        let (base, dreg) = (1, 1);
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        }
    }

    #[test]
    fn ipv4_prefix_uses_bitwise() {
        let bytes = encode_masquerade_batch("t", &[rule("10.8.0.0/24", "eth0")], "x", 1).unwrap();
        let exprs = rule_exprs(&messages(&bytes)[5]);
        let mut ifname = b"eth0".to_vec();
        ifname.resize(16, 0);
        let mask = vec![0xff, 0xff, 0xff, 0];
        let xor = vec![0; 4];
        let (sreg, dreg, len) = (1, 1, 4);
        let expected = vec![
            Expr::Meta { key: 15, dreg: 1 },
            cmp_eq(&[2]),
            payload(12, 4),
            Expr::Bitwise {
                sreg,
                dreg,
                len,
                mask,
                xor,
            },
            cmp_eq(&[10, 8, 0, 0]),
            Expr::Meta { key: 7, dreg: 1 },
            cmp_eq(&ifname),
            Expr::Masq {
                flags: 0,
                has_proto_regs: false,
            },
        ];
        assert_eq!(exprs, expected);
    }

    #[test]
    fn ipv6_prefix_offsets() {
        let bytes = encode_masquerade_batch("t", &[rule("fd00:1::/64", "uplink")], "x", 1).unwrap();
        let exprs = rule_exprs(&messages(&bytes)[5]);
        assert_eq!(exprs[1], cmp_eq(&[10]));
        assert_eq!(exprs[2], payload(8, 16));
        let Expr::Bitwise { mask, len, .. } = &exprs[3] else {
            panic!("expected bitwise, got {:?}", exprs[3]);
        };
        assert_eq!(*len, 16);
        assert_eq!(mask[..8], [0xff; 8]);
        assert_eq!(mask[8..], [0; 8]);
        let mut addr = vec![0xfd, 0, 0, 1];
        addr.resize(16, 0);
        assert_eq!(exprs[4], cmp_eq(&addr));
    }

    #[test]
    fn full_length_prefix_has_no_bitwise() {
        for src in ["10.8.0.7/32", "fd00::7/128"] {
            let exprs = masq_exprs(&rule(src, "eth0"));
            assert_eq!(exprs.len(), 7, "{src}");
            assert!(!exprs.iter().any(|e| matches!(e, Expr::Bitwise { .. })));
        }
    }

    #[test]
    fn exact_expression_bytes() {
        // Pin the on-wire layout of one expression independently of the decoder:
        // LIST_ELEM{ NAME "payload", DATA{ DREG 1, BASE 1, OFFSET 12, LEN 4 } }.
        let mut w = MsgWriter::default();
        payload(12, 4).encode(&mut w);
        let mut expect = Vec::new();
        let nla = |ty: u16, len: u16| [len.to_ne_bytes(), ty.to_ne_bytes()].concat();
        expect.extend(nla(1 | 0x8000, 4 + 12 + 4 + 32));
        expect.extend(nla(1, 12));
        expect.extend(b"payload\0");
        expect.extend(nla(2 | 0x8000, 4 + 32));
        for (ty, v) in [(1u16, 1u32), (2, 1), (3, 12), (4, 4)] {
            expect.extend(nla(ty, 8));
            expect.extend(v.to_be_bytes());
        }
        assert_eq!(w.buf, expect);
        assert!(!w.overflow);
    }

    #[test]
    fn rules_round_trip_through_decoder() {
        for (src, oif) in [
            ("10.8.0.0/24", "eth0"),
            ("10.0.0.0/8", "a"),
            ("0.0.0.0/0", "eth0"),
            ("192.168.1.1/32", "veth1234567890a"),
            ("fd00::/64", "eth0"),
            ("2001:db8::1/128", "eth1"),
            ("2001:db8::/29", "eth1"),
        ] {
            let r = rule(src, oif);
            assert_eq!(rule_from_exprs(&masq_exprs(&r)), Some(r.clone()), "{src}");
            // And through the wire encoding.
            let bytes = encode_masquerade_batch("t", std::slice::from_ref(&r), "x", 1).unwrap();
            assert_eq!(rule_from_exprs(&rule_exprs(&messages(&bytes)[5])), Some(r));
        }
    }

    #[test]
    fn foreign_shapes_are_rejected() {
        let base = masq_exprs(&rule("10.8.0.0/24", "eth0"));
        // Masquerade with flags (e.g. `masquerade random`).
        let mut flagged = base.clone();
        *flagged.last_mut().unwrap() = Expr::Masq {
            flags: 4,
            has_proto_regs: false,
        };
        assert_eq!(rule_from_exprs(&flagged), None);
        // nft's byte-aligned shortcut (payload 3 bytes, no bitwise).
        let mut short = base.clone();
        short.remove(3);
        short[2] = payload(12, 3);
        short[3] = cmp_eq(&[10, 8, 0]);
        assert_eq!(rule_from_exprs(&short), None);
        // Non-contiguous mask.
        let mut holey = base.clone();
        holey[3] = Expr::Bitwise {
            sreg: 1,
            dreg: 1,
            len: 4,
            mask: vec![0xff, 0, 0xff, 0],
            xor: vec![0; 4],
        };
        assert_eq!(rule_from_exprs(&holey), None);
        // Not-equal comparison on the interface.
        let mut neq = base.clone();
        neq[6] = match &neq[6] {
            Expr::Cmp { data, .. } => Expr::Cmp {
                sreg: 1,
                op: 1,
                data: data.clone(),
            },
            other => other.clone(),
        };
        assert_eq!(rule_from_exprs(&neq), None);
        // Extra expression (a counter).
        let mut extra = base.clone();
        extra.insert(
            7,
            Expr::Other {
                name: "counter".into(),
            },
        );
        assert_eq!(rule_from_exprs(&extra), None);
        assert_eq!(rule_from_exprs(&[]), None);
        // Family / address length mismatch.
        let mut mismatch = base;
        mismatch[1] = cmp_eq(&[10]);
        assert_eq!(rule_from_exprs(&mismatch), None);
    }

    #[test]
    fn comment_udata() {
        let u = encode_comment_udata("podgate:ctr1");
        assert_eq!(u[0], 0);
        assert_eq!(usize::from(u[1]), "podgate:ctr1".len() + 1);
        assert_eq!(decode_comment_udata(&u).as_deref(), Some("podgate:ctr1"));
        // A comment after another TLV type.
        let mut two = vec![1, 2, 9, 9];
        two.extend(&u);
        assert_eq!(decode_comment_udata(&two).as_deref(), Some("podgate:ctr1"));
        // Truncated TLV.
        assert_eq!(decode_comment_udata(&[0, 10, b'a']), None);
        assert_eq!(decode_comment_udata(&[]), None);
    }

    #[test]
    fn validation() {
        let err = encode_masquerade_batch("t", &[rule("10.8.0.5/24", "eth0")], "x", 1).unwrap_err();
        assert!(err.to_string().contains("10.8.0.0/24"), "{err}");
        assert!(encode_masquerade_batch("t", &[rule("10.8.0.0/24", "")], "x", 1).is_err());
        assert!(
            encode_masquerade_batch("t", &[rule("10.8.0.0/24", "sixteen-chars-xx")], "x", 1)
                .is_err()
        );
        assert!(
            encode_masquerade_batch("t", &[rule("10.8.0.0/24", "fifteen-chars-x")], "x", 1).is_ok()
        );
        assert!(encode_masquerade_batch("", &[], "x", 1).is_err());
        assert!(encode_masquerade_batch("a\0b", &[], "x", 1).is_err());
        assert!(encode_masquerade_batch(&"t".repeat(256), &[], "x", 1).is_err());
        assert!(encode_masquerade_batch("t", &[], &"x".repeat(254), 1).is_err());
        assert!(encode_masquerade_batch("t", &[], &"x".repeat(253), 1).is_ok());
        assert!(encode_masquerade_batch("t", &[], "a\0", 1).is_err());
    }

    #[test]
    fn oversized_batch_is_refused() {
        let rules: Vec<MasqRule> = (0..2000u32)
            .map(|i| rule(&format!("10.{}.{}.0/24", i / 256, i % 256), "eth0"))
            .collect();
        let err = encode_masquerade_batch("t", &rules, "x", 1).unwrap_err();
        assert!(matches!(err, NftError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn error_replies() {
        // NLMSG_ERROR, capped, with an extack message TLV.
        let mut payload = (-libc::EINVAL).to_ne_bytes().to_vec();
        payload.extend([0u8; 16]); // echoed request header
        let mut w = MsgWriter::default();
        w.attr_str(sys::NLMSGERR_ATTR_MSG, "bad thing");
        payload.extend(&w.buf);
        let msg = NlMsg {
            ty: sys::NLMSG_ERROR,
            flags: sys::NLM_F_CAPPED | sys::NLM_F_ACK_TLVS,
            seq: 1,
            payload,
        };
        let (errno, message) = parse_error(&msg).unwrap();
        assert_eq!(errno, libc::EINVAL);
        assert_eq!(message.as_deref(), Some("bad thing"));
        let err = NftError::Kernel {
            object: "table inet x".into(),
            errno,
            message,
        };
        let text = err.to_string();
        assert!(
            text.contains("table inet x") && text.contains("EINVAL") && text.contains("bad thing"),
            "{text}"
        );
        assert_eq!(err.errno(), Some(libc::EINVAL));

        // Plain ACK.
        let ack = NlMsg {
            ty: sys::NLMSG_ERROR,
            flags: 0,
            seq: 1,
            payload: [0u8; 20].to_vec(),
        };
        assert_eq!(parse_error(&ack).unwrap(), (0, None));
        // Too short.
        let short = NlMsg {
            ty: sys::NLMSG_ERROR,
            flags: 0,
            seq: 1,
            payload: vec![0, 0],
        };
        assert!(parse_error(&short).is_err());
    }

    #[test]
    fn malformed_input_does_not_panic() {
        assert!(split_datagram(&[0xff; 16]).is_err());
        assert!(split_datagram(&[8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(split_datagram(&[]).unwrap().is_empty());
        assert!(Attrs::parse(&[200, 0, 1, 0, 1]).is_err());
        assert!(Attrs::parse(&[2, 0, 1, 0]).is_err());
        assert!(Expr::decode(&[]).is_err());
        // Random-ish garbage through every decoder.
        let mut x: u32 = 12345;
        for _ in 0..2000 {
            let len = (x % 64) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (x >> 16) as u8
                })
                .collect();
            let _ = split_datagram(&bytes);
            let _ = Expr::decode(&bytes);
            let _ = decode_verdict(&bytes);
            let _ = decode_comment_udata(&bytes);
            let msg = NlMsg {
                ty: 0x0a07,
                flags: 0,
                seq: 0,
                payload: bytes,
            };
            let _ = decode_rule(&msg);
            let _ = decode_chain(&msg);
            let _ = parse_error(&msg);
        }
    }

    #[test]
    fn batch_seq_range_wraps() {
        let b = build_delete_batch("t", u32::MAX).unwrap();
        assert_eq!(b.first_seq, u32::MAX);
        assert_eq!(b.last_seq, 0);
        assert!(b.contains(u32::MAX) && b.contains(0));
        assert!(!b.contains(1) && !b.contains(u32::MAX - 1));
        assert_eq!(b.object(0), "table inet t");
        assert!(b.object(u32::MAX).contains("commit"));
    }

    #[test]
    fn verdict_decoding() {
        let mut w = MsgWriter::default();
        Expr::Immediate {
            dreg: 0,
            verdict: Some((sys::NFT_JUMP, Some("KUBE-POSTROUTING".into()))),
        }
        .encode(&mut w);
        let attrs = Attrs::parse(&w.buf).unwrap();
        let elem = attrs.get(sys::NFTA_LIST_ELEM).unwrap();
        assert_eq!(
            Expr::decode(elem).unwrap(),
            Expr::Immediate {
                dreg: 0,
                verdict: Some((-3, Some("KUBE-POSTROUTING".into())))
            }
        );
    }

    fn mss(pool: &str, dir: MssDirection, v: MssValue) -> MssRule {
        MssRule {
            pool: pool.parse().unwrap(),
            ifname: "eth0".into(),
            direction: dir,
            mss: v,
        }
    }

    #[test]
    fn mss_rule_matches_what_nft_generates() {
        // `nft --debug=netlink` for `ip saddr 10.8.0.0/24 oifname "eth0" tcp
        // flags syn / syn,rst tcp option maxseg size set rt mtu` (nft 1.0.6),
        // except the address: we load 4 bytes and mask, nft loads 3.
        let r = mss("10.8.0.0/24", MssDirection::FromPool, MssValue::Pmtu);
        let mut eth0 = b"eth0".to_vec();
        eth0.resize(16, 0);
        let meta = |key| Expr::Meta { key, dreg: 1 };
        let want = vec![
            meta(15),
            cmp_eq(&[2]),
            payload(12, 4),
            Expr::Bitwise {
                sreg: 1,
                dreg: 1,
                len: 4,
                mask: vec![255, 255, 255, 0],
                xor: vec![0; 4],
            },
            cmp_eq(&[10, 8, 0, 0]),
            meta(7),
            cmp_eq(&eth0),
            meta(16),
            cmp_eq(&[6]),
            Expr::Payload {
                base: 2,
                offset: 13,
                len: 1,
                dreg: 1,
            },
            Expr::Bitwise {
                sreg: 1,
                dreg: 1,
                len: 1,
                mask: vec![0x06],
                xor: vec![0],
            },
            cmp_eq(&[0x02]),
            Expr::Rt { key: 3, dreg: 1 },
            Expr::Byteorder {
                sreg: 1,
                dreg: 1,
                op: 1,
                len: 2,
                size: 2,
            },
            Expr::ExthdrWrite {
                op: 1,
                kind: 2,
                offset: 2,
                len: 2,
                sreg: 1,
            },
        ];
        assert_eq!(mss_exprs(&r), want);
        // The other direction matches iifname and the destination (offset 16);
        // a fixed value is an immediate of 2 big-endian bytes.
        let back = mss_exprs(&mss(
            "10.8.0.0/24",
            MssDirection::ToPool,
            MssValue::Fixed(1300),
        ));
        assert_eq!(back[2], payload(16, 4));
        assert_eq!(back[5], meta(6));
        assert_eq!(
            back[back.len() - 2],
            Expr::ImmediateData {
                dreg: 1,
                data: vec![0x05, 0x14]
            }
        );
        // IPv6 pools: saddr at 8, daddr at 24.
        let v6 = mss_exprs(&mss("fd00::/64", MssDirection::ToPool, MssValue::Pmtu));
        assert_eq!(v6[2], payload(24, 16));
    }

    #[test]
    fn mss_expression_bytes() {
        let nla = |ty: u16, len: u16| [len.to_ne_bytes(), ty.to_ne_bytes()].concat();
        let u32_attr = |ty: u16, v: u32| [nla(ty, 8), v.to_be_bytes().to_vec()].concat();
        // exthdr: SREG 1, TYPE u8 2 (padded), OFFSET 2, LEN 2, OP tcpopt.
        let mut w = MsgWriter::default();
        Expr::ExthdrWrite {
            op: 1,
            kind: 2,
            offset: 2,
            len: 2,
            sreg: 1,
        }
        .encode(&mut w);
        let mut data = u32_attr(7, 1);
        data.extend(nla(2, 5));
        data.extend([2, 0, 0, 0]);
        data.extend(u32_attr(3, 2));
        data.extend(u32_attr(4, 2));
        data.extend(u32_attr(6, 1));
        let mut expect = nla(1 | 0x8000, (4 + 12 + 4 + data.len()) as u16);
        expect.extend(nla(1, 11));
        expect.extend(b"exthdr\0\0");
        expect.extend(nla(2 | 0x8000, (4 + data.len()) as u16));
        expect.extend(&data);
        assert_eq!(w.buf, expect);
        // rt: DREG 1, KEY tcpmss (3).
        let mut w = MsgWriter::default();
        Expr::Rt { key: 3, dreg: 1 }.encode(&mut w);
        assert!(w.buf.ends_with(&[u32_attr(1, 1), u32_attr(2, 3)].concat()));
        // immediate data: DREG 1, DATA{ VALUE 05 14 }.
        let mut w = MsgWriter::default();
        Expr::ImmediateData {
            dreg: 1,
            data: vec![0x05, 0x14],
        }
        .encode(&mut w);
        let tail = [
            u32_attr(1, 1),
            nla(2 | 0x8000, 12),
            nla(1, 6),
            vec![5, 0x14, 0, 0],
        ]
        .concat();
        assert!(w.buf.ends_with(&tail), "{:?}", w.buf);
    }

    #[test]
    fn mss_rules_round_trip_and_table_layout() {
        let rules = vec![
            mss("10.8.0.0/24", MssDirection::FromPool, MssValue::Pmtu),
            mss("10.8.0.0/24", MssDirection::ToPool, MssValue::Pmtu),
            mss("10.9.0.7/32", MssDirection::FromPool, MssValue::Fixed(1360)),
            mss("fd00::/64", MssDirection::ToPool, MssValue::Fixed(1220)),
        ];
        for r in &rules {
            assert_eq!(mss_from_exprs(&mss_exprs(r)).as_ref(), Some(r));
            // A masquerade rule is not an MSS rule and vice versa.
            assert_eq!(rule_from_exprs(&mss_exprs(r)), None);
        }
        assert_eq!(
            mss_from_exprs(&masq_exprs(&rule("10.8.0.0/24", "eth0"))),
            None
        );
        // MSS only: table, chain forward, rules; no nat chain.
        let spec = TableRules {
            masquerade: None,
            mss: &rules,
        };
        let msgs = messages(&encode_table_batch("t", &spec, "x", 1).unwrap());
        assert_eq!(msgs.len(), spec.messages());
        let chains: Vec<_> = msgs
            .iter()
            .filter(|m| m.ty == (10 << 8) | u16::from(sys::NFT_MSG_NEWCHAIN))
            .collect();
        assert_eq!(chains.len(), 1);
        let attrs = Attrs::parse(chains[0].nf_attrs()).unwrap();
        assert_eq!(attrs.get(sys::NFTA_CHAIN_NAME).unwrap(), b"forward\0");
        assert_eq!(attrs.get(sys::NFTA_CHAIN_TYPE).unwrap(), b"filter\0");
        let hook = Attrs::parse(attrs.get(sys::NFTA_CHAIN_HOOK).unwrap()).unwrap();
        assert_eq!(hook.get(sys::NFTA_HOOK_HOOKNUM).unwrap(), &[0, 0, 0, 2]);
        assert_eq!(
            hook.get(sys::NFTA_HOOK_PRIORITY).unwrap(),
            &(-150i32).to_be_bytes()
        );
        let decoded: Vec<_> = msgs[5..9]
            .iter()
            .map(|m| mss_from_exprs(&rule_exprs(m)).unwrap())
            .collect();
        assert_eq!(decoded, rules);
        // Both chains.
        let masq = [rule("10.8.0.0/24", "eth0")];
        let both = TableRules {
            masquerade: Some(&masq),
            mss: &rules[..1],
        };
        let msgs = messages(&encode_table_batch("t", &both, "x", 1).unwrap());
        assert_eq!(msgs.len(), both.messages());
        assert_eq!(msgs.len(), 9);
        // Invalid input is refused before anything is sent.
        let mut bad = rules[0].clone();
        bad.pool = "10.8.0.1/24".parse().unwrap();
        let spec = TableRules {
            masquerade: None,
            mss: std::slice::from_ref(&bad),
        };
        assert!(matches!(
            encode_table_batch("t", &spec, "x", 1),
            Err(NftError::Invalid { .. })
        ));
    }
}
