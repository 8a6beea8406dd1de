//! Encoding: netlink messages and attributes, and expressions.

use super::*;

/// nfnetlink's parts of the shared [`MsgWriter`]: the `nfgenmsg` after the
/// header and big-endian integers.
impl MsgWriter {
    /// Starts an nfnetlink message; returns its offset for [`Self::end_msg`].
    pub(super) fn begin_msg(
        &mut self,
        ty: u16,
        flags: u16,
        seq: u32,
        family: u8,
        res_id: u16,
    ) -> usize {
        let start = self.begin(ty, flags, seq);
        self.buf.push(family);
        self.buf.push(sys::NFNETLINK_V0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        start
    }

    pub(super) fn attr_u32(&mut self, ty: u16, value: u32) {
        // nf_tables parses every integer attribute with ntohl().
        self.attr(ty, &value.to_be_bytes());
    }

    /// `NFTA_DATA_VALUE` wrapped in the given attribute (cmp data, masks…).
    pub(super) fn data_value(&mut self, ty: u16, value: &[u8]) {
        let nest = self.begin_nest(ty);
        self.attr(sys::NFTA_DATA_VALUE, value);
        self.end_nest(nest);
    }
}

impl Expr {
    /// One `NFTA_LIST_ELEM` of a rule's expression list.
    pub(super) fn encode(&self, w: &mut MsgWriter) {
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
}
