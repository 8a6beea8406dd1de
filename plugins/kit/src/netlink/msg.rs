//! Framing shared by every family: messages of a datagram, error replies
//! with their extended-ack text, attributes. Bounds-checked throughout:
//! kernel data is trusted to be well-formed but never indexed blindly.

use super::consts::*;

pub(crate) const fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// One netlink message from a received datagram.
#[derive(Debug)]
pub(crate) struct Msg {
    pub(crate) ty: u16,
    pub(crate) flags: u16,
    pub(crate) seq: u32,
    pub(crate) port: u32,
    /// Everything after the 16-byte `nlmsghdr`.
    pub(crate) payload: Vec<u8>,
}

impl Msg {
    /// The attributes of an nfnetlink data message (after `nfgenmsg`).
    pub(crate) fn nf_attrs(&self) -> &[u8] {
        self.payload.get(4..).unwrap_or_default()
    }

    /// The family byte of an nfnetlink data message (`NFPROTO_UNSPEC` if absent).
    pub(crate) fn nf_family(&self) -> u8 {
        self.payload.first().copied().unwrap_or(0)
    }
}

pub(crate) fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map(u32::from_ne_bytes)
}

pub(crate) fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2)
        .and_then(|s| <[u8; 2]>::try_from(s).ok())
        .map(u16::from_ne_bytes)
}

/// A NUL-terminated (or not) string attribute.
pub(crate) fn attr_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(b.get(..end).unwrap_or_default()).into_owned()
}

/// Splits a datagram into its messages.
pub(crate) fn split_datagram(mut data: &[u8]) -> Result<Vec<Msg>, String> {
    let mut out = Vec::new();
    while !data.is_empty() {
        if data.len() < NLMSG_HDRLEN {
            return Err(format!("short netlink header ({} bytes)", data.len()));
        }
        let len = ne_u32(data, 0).unwrap_or(0) as usize;
        let ty = ne_u16(data, 4).unwrap_or(0);
        let flags = ne_u16(data, 6).unwrap_or(0);
        let seq = ne_u32(data, 8).unwrap_or(0);
        let port = ne_u32(data, 12).unwrap_or(0);
        if len < NLMSG_HDRLEN {
            return Err(format!("nlmsg_len {len} shorter than the header"));
        }
        let payload = data
            .get(NLMSG_HDRLEN..len)
            .ok_or_else(|| format!("nlmsg_len {len} exceeds datagram ({} bytes)", data.len()))?;
        out.push(Msg {
            ty,
            flags,
            seq,
            port,
            payload: payload.to_vec(),
        });
        data = data.get(align4(len)..).unwrap_or_default();
    }
    Ok(out)
}

/// Decodes an `NLMSG_ERROR` payload into (positive errno, extack message).
/// errno 0 is an ACK.
pub(crate) fn parse_error(msg: &Msg) -> Result<(i32, Option<String>), String> {
    let raw = ne_u32(&msg.payload, 0).ok_or("NLMSG_ERROR shorter than its error code")?;
    let errno = i32::from_ne_bytes(raw.to_ne_bytes()).saturating_neg();
    let mut message = None;
    if msg.flags & NLM_F_ACK_TLVS != 0 {
        // The echoed request is only its header with NETLINK_CAP_ACK, else
        // the whole (padded) request; the TLVs follow it.
        let echoed = if msg.flags & NLM_F_CAPPED != 0 {
            NLMSG_HDRLEN
        } else {
            align4(ne_u32(&msg.payload, 4).unwrap_or(0) as usize)
        };
        if let Some(tlvs) = msg.payload.get(4 + echoed..) {
            if let Ok(attrs) = Attrs::parse(tlvs) {
                message = attrs.get(NLMSGERR_ATTR_MSG).map(attr_string);
            }
        }
    }
    Ok((errno, message))
}

/// Attributes of one nesting level, in wire order.
pub(crate) struct Attrs<'a> {
    items: Vec<(u16, &'a [u8])>,
}

impl<'a> Attrs<'a> {
    pub(crate) fn parse(mut data: &'a [u8]) -> Result<Self, String> {
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
            items.push((ty & NLA_TYPE_MASK, payload));
            data = data.get(align4(len)..).unwrap_or_default();
        }
        Ok(Attrs { items })
    }

    /// Last occurrence of `ty` (the kernel's nla_parse semantics).
    pub(crate) fn get(&self, ty: u16) -> Option<&'a [u8]> {
        self.items
            .iter()
            .rev()
            .find(|(t, _)| *t == ty)
            .map(|(_, p)| *p)
    }

    pub(crate) fn all(&self, ty: u16) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.items
            .iter()
            .filter(move |(t, _)| *t == ty)
            .map(|(_, p)| *p)
    }
}
