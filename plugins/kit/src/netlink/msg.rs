//! Framing shared by every family: messages of a datagram, error replies
//! with their extended-ack text, attributes. Bounds-checked throughout:
//! kernel data is trusted to be well-formed but never indexed blindly.

use super::consts::*;
use crate::error::ParseError;

pub(crate) const fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// Appends netlink messages and attributes to a byte buffer: the one request
/// encoder of every family (each adds its own family header after
/// [`Self::begin`]).
///
/// Lengths are written as placeholders and patched when a message or nest is
/// closed; a length that does not fit its field marks the writer as
/// overflowed instead of silently wrapping.
#[derive(Default)]
pub(crate) struct MsgWriter {
    pub(crate) buf: Vec<u8>,
    pub(crate) overflow: bool,
}

impl MsgWriter {
    /// Starts a message with its `nlmsghdr`; returns its offset for
    /// [`Self::end_msg`].
    pub(crate) fn begin(&mut self, ty: u16, flags: u16, seq: u32) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, patched later
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: 0 = let the kernel fill it
        start
    }

    pub(crate) fn end_msg(&mut self, start: usize) {
        self.pad();
        let len = self.buf.len().saturating_sub(start);
        match u32::try_from(len) {
            Ok(len) => self.patch(start, &len.to_ne_bytes()),
            Err(_) => self.overflow = true,
        }
    }

    pub(crate) fn pad(&mut self) {
        let padded = align4(self.buf.len());
        self.buf.resize(padded, 0);
    }

    pub(crate) fn patch(&mut self, at: usize, bytes: &[u8]) {
        match self.buf.get_mut(at..at + bytes.len()) {
            Some(slot) => slot.copy_from_slice(bytes),
            None => self.overflow = true,
        }
    }

    pub(crate) fn attr(&mut self, ty: u16, payload: &[u8]) {
        let Ok(len) = u16::try_from(4 + payload.len()) else {
            self.overflow = true;
            return;
        };
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
    }

    /// A host-order integer (rtnetlink; nf_tables wants big-endian).
    pub(crate) fn attr_ne_u32(&mut self, ty: u16, value: u32) {
        self.attr(ty, &value.to_ne_bytes());
    }

    /// Strings are NUL-terminated, as the kernel's `NLA_STRING` policy for
    /// names expects (`nla_strcmp` tolerates the trailing NUL).
    pub(crate) fn attr_str(&mut self, ty: u16, value: &str) {
        let mut bytes = Vec::with_capacity(value.len() + 1);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
        self.attr(ty, &bytes);
    }

    pub(crate) fn begin_nest(&mut self, ty: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        start
    }

    pub(crate) fn end_nest(&mut self, start: usize) {
        let len = self.buf.len().saturating_sub(start);
        match u16::try_from(len) {
            Ok(len) => self.patch(start, &len.to_ne_bytes()),
            Err(_) => self.overflow = true,
        }
    }
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
    pub(crate) fn view(&self) -> MsgRef<'_> {
        MsgRef {
            ty: self.ty,
            flags: self.flags,
            seq: self.seq,
            port: self.port,
            payload: &self.payload,
        }
    }

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

/// One netlink message borrowed from the datagram it arrived in: what a dump
/// visits, so a row that is only looked at is never copied.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MsgRef<'a> {
    pub(crate) ty: u16,
    pub(crate) flags: u16,
    pub(crate) seq: u32,
    pub(crate) port: u32,
    /// Everything after the 16-byte `nlmsghdr`.
    pub(crate) payload: &'a [u8],
}

impl MsgRef<'_> {
    pub(crate) fn to_owned(self) -> Msg {
        Msg {
            ty: self.ty,
            flags: self.flags,
            seq: self.seq,
            port: self.port,
            payload: self.payload.to_vec(),
        }
    }
}

/// The messages of a datagram, borrowed from it, in order.
pub(crate) fn messages(mut data: &[u8]) -> Result<Vec<MsgRef<'_>>, ParseError> {
    let mut out = Vec::new();
    while !data.is_empty() {
        if data.len() < NLMSG_HDRLEN {
            return Err(ParseError::ShortHeader(data.len()));
        }
        let len = ne_u32(data, 0).unwrap_or(0) as usize;
        if len < NLMSG_HDRLEN {
            return Err(ParseError::LenBelowHeader(len));
        }
        let got = data.len();
        let payload = data
            .get(NLMSG_HDRLEN..len)
            .ok_or(ParseError::LenBeyond { len, got })?;
        out.push(MsgRef {
            ty: ne_u16(data, 4).unwrap_or(0),
            flags: ne_u16(data, 6).unwrap_or(0),
            seq: ne_u32(data, 8).unwrap_or(0),
            port: ne_u32(data, 12).unwrap_or(0),
            payload,
        });
        data = data.get(align4(len)..).unwrap_or_default();
    }
    Ok(out)
}

/// Splits a datagram into its messages, copied out of it.
#[cfg(test)]
pub(crate) fn split_datagram(data: &[u8]) -> Result<Vec<Msg>, ParseError> {
    Ok(messages(data)?.into_iter().map(MsgRef::to_owned).collect())
}

/// Decodes an `NLMSG_ERROR` payload into (positive errno, extack message).
/// errno 0 is an ACK.
pub(crate) fn parse_error(msg: MsgRef<'_>) -> Result<(i32, Option<String>), ParseError> {
    let raw = ne_u32(msg.payload, 0).ok_or(ParseError::ShortError)?;
    let errno = i32::from_ne_bytes(raw.to_ne_bytes()).saturating_neg();
    let mut message = None;
    if msg.flags & NLM_F_ACK_TLVS != 0 {
        // The echoed request is only its header with NETLINK_CAP_ACK, else
        // the whole (padded) request; the TLVs follow it.
        let echoed = if msg.flags & NLM_F_CAPPED != 0 {
            NLMSG_HDRLEN
        } else {
            align4(ne_u32(msg.payload, 4).unwrap_or(0) as usize)
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
    pub(crate) fn parse(mut data: &'a [u8]) -> Result<Self, ParseError> {
        let mut items = Vec::new();
        while !data.is_empty() {
            let (len, ty) = match data {
                [l0, l1, t0, t1, ..] => (
                    usize::from(u16::from_ne_bytes([*l0, *l1])),
                    u16::from_ne_bytes([*t0, *t1]),
                ),
                // Trailing padding shorter than an attribute header.
                _ if data.iter().all(|&b| b == 0) => break,
                _ => return Err(ParseError::AttrHeader(data.len())),
            };
            let payload = data.get(4..len).ok_or(ParseError::AttrBounds { ty, len })?;
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

    /// Every attribute, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u16, &'a [u8])> + '_ {
        self.items.iter().copied()
    }

    pub(crate) fn all(&self, ty: u16) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.items
            .iter()
            .filter(move |(t, _)| *t == ty)
            .map(|(_, p)| *p)
    }
}

/// One netlink message as the kernel frames it (header + payload, padded):
/// the test datagram builder of every family's codec tests.
#[cfg(test)]
pub(crate) fn nlmsg(ty: u16, flags: u16, seq: u32, port: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&port.to_ne_bytes());
    m.extend_from_slice(payload);
    m.resize(align4(m.len()), 0);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ty: u16, v: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&ty.to_ne_bytes());
        a.extend_from_slice(v);
        a.resize(align4(a.len()), 0);
        a
    }

    #[test]
    fn a_datagram_splits_into_its_messages_and_a_bad_length_is_an_error() {
        let mut d = nlmsg(20, NLM_F_MULTI, 7, 9, &[1, 2, 3]);
        d.extend(nlmsg(NLMSG_DONE, NLM_F_MULTI, 7, 9, &0u32.to_ne_bytes()));
        let msgs = split_datagram(&d).unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            (msgs[0].ty, msgs[0].flags, msgs[0].seq, msgs[0].port),
            (20, NLM_F_MULTI, 7, 9)
        );
        assert_eq!(msgs[0].payload, vec![1, 2, 3]);
        assert_eq!(msgs[1].ty, NLMSG_DONE);
        // A trailing fragment shorter than a header, a length beyond the
        // datagram and a length below the header are errors, not panics.
        assert!(split_datagram(&d[..d.len() - 12]).is_err());
        let mut long = nlmsg(20, 0, 1, 0, &[0; 4]);
        long[0] = long[0].wrapping_add(8);
        assert!(split_datagram(&long).is_err());
        let mut short = nlmsg(20, 0, 1, 0, &[]);
        short[0] = 8;
        assert!(split_datagram(&short).is_err());
    }

    #[test]
    fn error_replies_with_and_without_extended_ack() {
        let request = nlmsg(20, NLM_F_REQUEST | NLM_F_ACK, 5, 0, &[0; 8]);
        // Uncapped: the whole request is echoed, the TLVs follow it.
        let mut payload = (-libc::EEXIST).to_ne_bytes().to_vec();
        payload.extend(&request);
        payload.extend(attr(NLMSGERR_ATTR_MSG, b"exists already\0"));
        let d = nlmsg(NLMSG_ERROR, NLM_F_ACK_TLVS, 5, 0, &payload);
        let msg = split_datagram(&d).unwrap().remove(0);
        assert_eq!(
            parse_error(msg.view()).unwrap(),
            (libc::EEXIST, Some("exists already".into()))
        );
        // Capped: only the header is echoed.
        let mut payload = (-libc::EPERM).to_ne_bytes().to_vec();
        payload.extend(request.get(..NLMSG_HDRLEN).unwrap());
        payload.extend(attr(NLMSGERR_ATTR_MSG, b"no\0"));
        let d = nlmsg(NLMSG_ERROR, NLM_F_ACK_TLVS | NLM_F_CAPPED, 5, 0, &payload);
        let msg = split_datagram(&d).unwrap().remove(0);
        assert_eq!(
            parse_error(msg.view()).unwrap(),
            (libc::EPERM, Some("no".into()))
        );
        // An ACK, and an error reply too short to hold its code.
        let d = nlmsg(NLMSG_ERROR, NLM_F_CAPPED, 5, 0, &[0; 20]);
        let msg = split_datagram(&d).unwrap().remove(0);
        assert_eq!(parse_error(msg.view()).unwrap(), (0, None));
        let d = nlmsg(NLMSG_ERROR, 0, 5, 0, &[0; 2]);
        let msg = split_datagram(&d).unwrap().remove(0);
        assert!(parse_error(msg.view()).is_err());
    }

    #[test]
    fn attributes_last_wins_and_bounds() {
        let mut a = attr(1, b"x\0");
        a.extend(attr(2 | NLA_F_NESTED, &attr(1, &[7])));
        a.extend(attr(1, b"y\0"));
        let attrs = Attrs::parse(&a).unwrap();
        assert_eq!(attrs.get(1).map(attr_string).as_deref(), Some("y"));
        assert_eq!(attrs.all(1).count(), 2);
        let nested = Attrs::parse(attrs.get(2).unwrap()).unwrap();
        assert_eq!(nested.get(1), Some(&[7u8][..]));
        assert!(Attrs::parse(&[200, 0, 1, 0, 1]).is_err());
        assert!(Attrs::parse(&[2, 0, 1, 0]).is_err());
        assert!(Attrs::parse(&[0, 0]).unwrap().get(1).is_none());
    }
}
