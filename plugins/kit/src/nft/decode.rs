//! Decoding: bounds-checked attribute parsing, datagram framing, errors,
//! expressions, chains and rules as the kernel reports them.

use super::*;

impl Expr {
    /// Decodes one `NFTA_LIST_ELEM` payload. Unknown or partially understood
    /// expressions become [`Expr::Other`] rather than errors: a foreign rule
    /// must never make listing fail.
    pub(super) fn decode(elem: &[u8]) -> Result<Expr, String> {
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
pub(super) fn decode_verdict(data: &[u8]) -> Option<(i32, Option<String>)> {
    let outer = Attrs::parse(data).ok()?;
    let verdict = Attrs::parse(outer.get(sys::NFTA_DATA_VERDICT)?).ok()?;
    let code = verdict.get(sys::NFTA_VERDICT_CODE).and_then(be_u32)?;
    let chain = verdict.get(sys::NFTA_VERDICT_CHAIN).map(attr_string);
    Some((i32::from_be_bytes(code.to_be_bytes()), chain))
}

/// Attributes of one nesting level, in wire order. Parsing is bounds-checked
/// throughout: kernel data is trusted to be well-formed but never indexed
/// blindly.
pub(super) struct Attrs<'a> {
    pub(super) items: Vec<(u16, &'a [u8])>,
}

impl<'a> Attrs<'a> {
    pub(super) fn parse(mut data: &'a [u8]) -> Result<Self, String> {
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
    pub(super) fn get(&self, ty: u16) -> Option<&'a [u8]> {
        self.items
            .iter()
            .rev()
            .find(|(t, _)| *t == ty)
            .map(|(_, p)| *p)
    }

    pub(super) fn all(&self, ty: u16) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.items
            .iter()
            .filter(move |(t, _)| *t == ty)
            .map(|(_, p)| *p)
    }
}

pub(super) fn be_u32(b: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(b).ok().map(u32::from_be_bytes)
}

pub(super) fn be_u64(b: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(b).ok().map(u64::from_be_bytes)
}

pub(super) fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map(u32::from_ne_bytes)
}

pub(super) fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2)
        .and_then(|s| <[u8; 2]>::try_from(s).ok())
        .map(u16::from_ne_bytes)
}

/// A NUL-terminated (or not) string attribute.
pub(super) fn attr_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(b.get(..end).unwrap_or_default()).into_owned()
}

/// `NFTA_DATA_VALUE` inside a data nest.
pub(super) fn data_value(nest: &[u8]) -> Option<Vec<u8>> {
    Attrs::parse(nest)
        .ok()?
        .get(sys::NFTA_DATA_VALUE)
        .map(<[u8]>::to_vec)
}

/// One netlink message from a received datagram.
#[derive(Debug)]
pub(super) struct NlMsg {
    pub(super) ty: u16,
    pub(super) flags: u16,
    pub(super) seq: u32,
    /// Everything after the 16-byte `nlmsghdr`.
    pub(super) payload: Vec<u8>,
}

impl NlMsg {
    /// The attributes of an nfnetlink data message (after `nfgenmsg`).
    pub(super) fn nf_attrs(&self) -> &[u8] {
        self.payload.get(4..).unwrap_or_default()
    }

    pub(super) fn nf_family(&self) -> u8 {
        self.payload.first().copied().unwrap_or(sys::NFPROTO_UNSPEC)
    }
}

pub(super) fn split_datagram(mut data: &[u8]) -> Result<Vec<NlMsg>, String> {
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
pub(super) fn parse_error(msg: &NlMsg) -> Result<(i32, Option<String>), String> {
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
pub(super) struct ChainInfo {
    pub(super) family: u8,
    pub(super) table: String,
    pub(super) name: String,
    pub(super) hooknum: Option<u32>,
    pub(super) chain_type: Option<String>,
}

/// A rule as reported by a rule dump.
pub(super) struct RuleInfo {
    pub(super) chain: String,
    pub(super) handle: u64,
    pub(super) exprs: Vec<Expr>,
    pub(super) userdata: Option<Vec<u8>>,
}

pub(super) fn decode_chain(msg: &NlMsg) -> Result<ChainInfo, String> {
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

pub(super) fn decode_rule(msg: &NlMsg) -> Result<RuleInfo, String> {
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
