//! The expressions podgate's rules are made of, and the two rule shapes
//! (masquerade, MSS clamp) built from and recognised in them.

use super::*;

/// An nf_tables expression, as far as this module understands them. Used both
/// to build our rules and to decode rules read from the kernel, so that
/// "exactly our shape" can be checked by structural equality.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Expr {
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

/// The expressions of one masquerade rule, mirroring what `nft` generates for
/// `meta nfproto ipv4 ip saddr 10.8.0.0/24 oifname "eth0" masquerade` (except
/// that we always load the full address and mask it, instead of nft's
/// byte-aligned shortcut, which keeps one code path for every prefix length).
pub(super) fn masq_exprs(rule: &MasqRule) -> Vec<Expr> {
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

/// The prefix a `meta nfproto <family>; [bitwise & mask;] cmp == <addr>`
/// match checks (the mask's bits, else the whole address).
fn prefix_of(nfproto: &[u8], addr: &[u8], mask: Option<&Vec<u8>>) -> Option<IpNet> {
    let addr = match (nfproto, addr.len()) {
        ([sys::NFPROTO_IPV4], 4) => IpAddr::from(<[u8; 4]>::try_from(addr).ok()?),
        ([sys::NFPROTO_IPV6], 16) => IpAddr::from(<[u8; 16]>::try_from(addr).ok()?),
        _ => return None,
    };
    let prefix = match mask {
        Some(mask) => mask.iter().map(|b| b.count_ones()).sum::<u32>(),
        None => addr_bits(&addr),
    };
    IpNet::new(addr, u8::try_from(prefix).ok()?).ok()
}

/// The interface name a `meta oifname`/`iifname` compare holds (NUL-padded).
fn ifname_of(data: &[u8]) -> Option<String> {
    let len = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    String::from_utf8(data.get(..len)?.to_vec()).ok()
}

/// Recovers a [`MasqRule`] from decoded expressions, but only if re-encoding
/// it yields exactly the same expressions: anything else (extra matches,
/// flags, non-contiguous masks, nft's shortened loads…) is foreign.
pub(super) fn rule_from_exprs(exprs: &[Expr]) -> Option<MasqRule> {
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
    let source = prefix_of(nfproto, addr, mask)?;
    let oifname = ifname_of(ifname)?;
    let rule = MasqRule { source, oifname };
    (validate_rule(&rule).is_ok() && masq_exprs(&rule) == exprs).then_some(rule)
}

/// `meta nfproto <family>; <payload address> [& mask] == <prefix>`: the
/// family dependency plus a prefix match of the source (`saddr`) or
/// destination address, as masquerade rules load it.
pub(super) fn prefix_match(net: &IpNet, saddr: bool) -> Vec<Expr> {
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
pub(super) fn mss_exprs(rule: &MssRule) -> Vec<Expr> {
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
pub(super) fn mss_from_exprs(exprs: &[Expr]) -> Option<MssRule> {
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
    let direction = match (*if_key, *offset) {
        (sys::NFT_META_OIFNAME, 12 | 8) => MssDirection::FromPool,
        (sys::NFT_META_IIFNAME, 16 | 24) => MssDirection::ToPool,
        _ => return None,
    };
    let pool = prefix_of(nfproto, addr, mask)?;
    let ifname = ifname_of(ifname)?;
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

pub(super) fn addr_bits(addr: &IpAddr) -> u32 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// libnftnl-compatible user data holding a single comment TLV.
pub(super) fn encode_comment_udata(comment: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(comment.len() + 3);
    out.push(sys::NFTNL_UDATA_COMMENT);
    // validate_tag() keeps the comment under 254 bytes, so this cannot clamp.
    out.push(u8::try_from(comment.len() + 1).unwrap_or(u8::MAX));
    out.extend_from_slice(comment.as_bytes());
    out.push(0);
    out
}

/// Extracts the comment from libnftnl-style user data, if present and sane.
pub(super) fn decode_comment_udata(mut udata: &[u8]) -> Option<String> {
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
