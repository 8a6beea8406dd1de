//! Decoding: bounds-checked attribute parsing, datagram framing, errors,
//! expressions, chains and rules as the kernel reports them.

use super::*;
use crate::error::ParseError;
pub(super) use crate::netlink::msg::{attr_string, Attrs, Msg as NlMsg};

impl Expr {
    /// Decodes one `NFTA_LIST_ELEM` payload. Unknown or partially understood
    /// expressions become [`Expr::Other`] rather than errors: a foreign rule
    /// must never make listing fail.
    pub(super) fn decode(elem: &[u8]) -> Result<Expr, ParseError> {
        let attrs = Attrs::parse(elem)?;
        let name = attrs
            .get(sys::NFTA_EXPR_NAME)
            .map(attr_string)
            .ok_or(ParseError::NoExprName)?;
        let data = Attrs::parse(attrs.get(sys::NFTA_EXPR_DATA).unwrap_or_default())?;
        let d = Data(&data);
        let known = match name.as_str() {
            "meta" => d.meta(),
            "cmp" => d.cmp(),
            "payload" => d.payload(),
            "bitwise" => d.bitwise(),
            "masq" => Some(Expr::Masq {
                flags: d.u32(sys::NFTA_MASQ_FLAGS).unwrap_or(0),
                has_proto_regs: data.get(sys::NFTA_MASQ_REG_PROTO_MIN).is_some(),
            }),
            "nat" => d
                .u32(sys::NFTA_NAT_TYPE)
                .map(|nat_type| Expr::Nat { nat_type }),
            "immediate" => d.immediate(),
            "rt" => d.rt(),
            "byteorder" => d.byteorder(),
            "exthdr" => d.exthdr(),
            "target" => data.get(sys::NFTA_TARGET_NAME).map(|n| Expr::Target {
                name: attr_string(n),
            }),
            _ => None,
        };
        Ok(known.unwrap_or(Expr::Other { name }))
    }
}

/// An expression's `NFTA_EXPR_DATA`, decoded by kind: `None` for a shape
/// podgate does not write (it becomes [`Expr::Other`]).
struct Data<'d, 'a>(&'d Attrs<'a>);

impl Data<'_, '_> {
    fn u32(&self, ty: u16) -> Option<u32> {
        self.0.get(ty).and_then(be_u32)
    }

    fn value(&self, ty: u16) -> Option<Vec<u8>> {
        self.0.get(ty).and_then(data_value)
    }

    /// `None` for `meta set`.
    fn meta(&self) -> Option<Expr> {
        let (key, dreg) = (
            self.u32(sys::NFTA_META_KEY)?,
            self.u32(sys::NFTA_META_DREG)?,
        );
        Some(Expr::Meta { key, dreg })
    }

    fn cmp(&self) -> Option<Expr> {
        Some(Expr::Cmp {
            sreg: self.u32(sys::NFTA_CMP_SREG)?,
            op: self.u32(sys::NFTA_CMP_OP)?,
            data: self.value(sys::NFTA_CMP_DATA)?,
        })
    }

    /// `None` for payload set.
    fn payload(&self) -> Option<Expr> {
        Some(Expr::Payload {
            base: self.u32(sys::NFTA_PAYLOAD_BASE)?,
            offset: self.u32(sys::NFTA_PAYLOAD_OFFSET)?,
            len: self.u32(sys::NFTA_PAYLOAD_LEN)?,
            dreg: self.u32(sys::NFTA_PAYLOAD_DREG)?,
        })
    }

    /// Mask-and-xor only; `None` for shifts and newer boolean ops.
    fn bitwise(&self) -> Option<Expr> {
        let op = self
            .u32(sys::NFTA_BITWISE_OP)
            .unwrap_or(sys::NFT_BITWISE_MASK_XOR);
        if op != sys::NFT_BITWISE_MASK_XOR {
            return None;
        }
        Some(Expr::Bitwise {
            sreg: self.u32(sys::NFTA_BITWISE_SREG)?,
            dreg: self.u32(sys::NFTA_BITWISE_DREG)?,
            len: self.u32(sys::NFTA_BITWISE_LEN)?,
            mask: self.value(sys::NFTA_BITWISE_MASK)?,
            xor: self.value(sys::NFTA_BITWISE_XOR)?,
        })
    }

    /// Data into a register, or a verdict.
    fn immediate(&self) -> Option<Expr> {
        let dreg = self.u32(sys::NFTA_IMMEDIATE_DREG)?;
        Some(match self.value(sys::NFTA_IMMEDIATE_DATA) {
            Some(data) => Expr::ImmediateData { dreg, data },
            None => Expr::Immediate {
                dreg,
                verdict: self
                    .0
                    .get(sys::NFTA_IMMEDIATE_DATA)
                    .and_then(decode_verdict),
            },
        })
    }

    fn rt(&self) -> Option<Expr> {
        let (key, dreg) = (self.u32(sys::NFTA_RT_KEY)?, self.u32(sys::NFTA_RT_DREG)?);
        Some(Expr::Rt { key, dreg })
    }

    fn byteorder(&self) -> Option<Expr> {
        Some(Expr::Byteorder {
            sreg: self.u32(sys::NFTA_BYTEORDER_SREG)?,
            dreg: self.u32(sys::NFTA_BYTEORDER_DREG)?,
            op: self.u32(sys::NFTA_BYTEORDER_OP)?,
            len: self.u32(sys::NFTA_BYTEORDER_LEN)?,
            size: self.u32(sys::NFTA_BYTEORDER_SIZE)?,
        })
    }

    /// An exthdr write; `None` for exthdr loads (matches), or a shape
    /// podgate does not write.
    fn exthdr(&self) -> Option<Expr> {
        let sreg = self.u32(sys::NFTA_EXTHDR_SREG)?;
        let [kind] = self.0.get(sys::NFTA_EXTHDR_TYPE)? else {
            return None;
        };
        let offset = self.u32(sys::NFTA_EXTHDR_OFFSET)?;
        let len = self.u32(sys::NFTA_EXTHDR_LEN)?;
        let op = self.u32(sys::NFTA_EXTHDR_OP)?;
        if self.0.get(sys::NFTA_EXTHDR_DREG).is_some() {
            return None;
        }
        Some(Expr::ExthdrWrite {
            op,
            kind: *kind,
            offset,
            len,
            sreg,
        })
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

pub(super) fn decode_chain(msg: &NlMsg) -> Result<ChainInfo, ParseError> {
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

pub(super) fn decode_rule(msg: &NlMsg) -> Result<RuleInfo, ParseError> {
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
