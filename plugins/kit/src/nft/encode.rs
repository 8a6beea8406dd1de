//! Encoding: netlink messages and attributes, and expressions.

use super::*;

/// Appends netlink messages and attributes to a byte buffer.
///
/// Lengths are written as placeholders and patched when a message or nest is
/// closed; a length that does not fit its field marks the writer as
/// overflowed instead of silently wrapping.
#[derive(Default)]
pub(super) struct MsgWriter {
    pub(super) buf: Vec<u8>,
    pub(super) overflow: bool,
}

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

    pub(super) fn end_msg(&mut self, start: usize) {
        self.pad();
        let len = self.buf.len().saturating_sub(start);
        match u32::try_from(len) {
            Ok(len) => self.patch(start, &len.to_ne_bytes()),
            Err(_) => self.overflow = true,
        }
    }

    pub(super) fn pad(&mut self) {
        let padded = align4(self.buf.len());
        self.buf.resize(padded, 0);
    }

    pub(super) fn patch(&mut self, at: usize, bytes: &[u8]) {
        match self.buf.get_mut(at..at + bytes.len()) {
            Some(slot) => slot.copy_from_slice(bytes),
            None => self.overflow = true,
        }
    }

    pub(super) fn attr(&mut self, ty: u16, payload: &[u8]) {
        let Ok(len) = u16::try_from(4 + payload.len()) else {
            self.overflow = true;
            return;
        };
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
    }

    pub(super) fn attr_u32(&mut self, ty: u16, value: u32) {
        // nf_tables parses every integer attribute with ntohl().
        self.attr(ty, &value.to_be_bytes());
    }

    /// Strings are NUL-terminated, as the kernel's `NLA_STRING` policy for
    /// names expects (`nla_strcmp` tolerates the trailing NUL).
    pub(super) fn attr_str(&mut self, ty: u16, value: &str) {
        let mut bytes = Vec::with_capacity(value.len() + 1);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
        self.attr(ty, &bytes);
    }

    pub(super) fn begin_nest(&mut self, ty: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(ty | sys::NLA_F_NESTED).to_ne_bytes());
        start
    }

    pub(super) fn end_nest(&mut self, start: usize) {
        let len = self.buf.len().saturating_sub(start);
        match u16::try_from(len) {
            Ok(len) => self.patch(start, &len.to_ne_bytes()),
            Err(_) => self.overflow = true,
        }
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
