//! Decoding: bounds-checked attribute parsing, datagram framing, errors,
//! expressions, chains and rules as the kernel reports them.

use super::*;
pub(super) use crate::netlink::msg::{attr_string, Attrs, Msg as NlMsg};

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

pub(super) fn be_u32(b: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(b).ok().map(u32::from_be_bytes)
}

pub(super) fn be_u64(b: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(b).ok().map(u64::from_be_bytes)
}

/// `NFTA_DATA_VALUE` inside a data nest.
pub(super) fn data_value(nest: &[u8]) -> Option<Vec<u8>> {
    Attrs::parse(nest)
        .ok()?
        .get(sys::NFTA_DATA_VALUE)
        .map(<[u8]>::to_vec)
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
