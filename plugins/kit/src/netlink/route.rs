//! rtnetlink as a codec over the generic [`Socket`]: requests written with
//! the shared [`MsgWriter`], answers read by the kit's own decoders (the wire
//! format is in [`super::rtnl`]).

use super::consts::{NLM_F_DUMP, NLM_F_REQUEST};
use super::msg::{Msg, MsgWriter};
use super::socket::{Route, Socket};
use crate::error::{Error, ParseError, Result};
use crate::netns::NetNs;

/// Offset of `nlmsg_seq` in the header.
const NLMSG_SEQ_AT: usize = 8;

pub struct RouteSocket {
    sock: Socket<Route>,
    /// Which namespace this socket talks to, for error messages.
    ns: String,
}

impl RouteSocket {
    /// The netns cookie of the namespace this socket is bound to.
    pub fn netns_cookie(&self) -> Result<Option<u64>> {
        self.sock.netns_cookie()
    }

    /// A socket in the calling thread's namespace.
    pub fn new() -> Result<RouteSocket> {
        Self::new_labelled("node".to_string())
    }

    /// A socket bound to `ns` (opened there, usable from any thread).
    pub fn in_netns(ns: &NetNs) -> Result<RouteSocket> {
        let label = ns.path().display().to_string();
        ns.run(move || Self::new_labelled(label))?
    }

    /// A socket in the calling thread's namespace, named `ns` in errors (for
    /// callers already running inside a pod's namespace).
    pub fn new_labelled(ns: String) -> Result<RouteSocket> {
        let sock = Socket::new().map_err(|e| match e {
            Error::Socket { family, op, source } => Error::Socket {
                family,
                op: format!("{op} (netns {ns})"),
                source,
            },
            other => other,
        })?;
        Ok(RouteSocket { sock, ns })
    }

    /// Send one request of type `ty` whose body (family header, attributes)
    /// `body` writes; return the messages of the answer (what precedes the
    /// ACK, or a GET's one answer), or an error carrying the kernel's errno.
    /// Not a dump: [`Self::rows`] reads dumps.
    pub(crate) fn request(
        &mut self,
        ty: u16,
        flags: u16,
        what: &str,
        body: impl FnOnce(&mut MsgWriter),
    ) -> Result<Vec<Msg>> {
        let object = self.object(what);
        let mut w = encoded(ty, flags, body, &object)?;
        let seq = self.sock.next_seq();
        w.patch(NLMSG_SEQ_AT, &seq.to_ne_bytes());
        self.sock.request(&w.buf, seq, &object)
    }

    /// A dump, or [`Self::request`], then each answer of type `reply` decoded by
    /// `decode` (`None`: a row that is not ours to read, e.g. another
    /// address family). A row that does not decode fails the whole request:
    /// half a route table is worse than an error.
    pub(crate) fn rows<T>(
        &mut self,
        ty: u16,
        flags: u16,
        reply: u16,
        what: &str,
        body: impl FnOnce(&mut MsgWriter),
        decode: impl Fn(&[u8]) -> std::result::Result<Option<T>, ParseError>,
    ) -> Result<Vec<T>> {
        let object = self.object(what);
        let decode_row = |ty: u16, payload: &[u8]| {
            if ty != reply {
                return Ok(None);
            }
            decode(payload).map_err(Socket::<Route>::protocol_err(&object))
        };
        if flags & NLM_F_DUMP == NLM_F_DUMP {
            // Dump rows are decoded where they arrived, not copied first.
            let w = encoded(ty, flags, body, &object)?;
            return self.sock.dump_map(
                &object,
                |seq| with_seq(&w, seq),
                |row| decode_row(row.ty, row.payload),
            );
        }
        let rows = self.request(ty, flags, what, body)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            if let Some(v) = decode_row(row.ty, &row.payload)? {
                out.push(v);
            }
        }
        Ok(out)
    }

    fn object(&self, what: &str) -> String {
        format!("{what} (netns {})", self.ns)
    }
}

/// [`encode`], refused when a length field overflowed: a request is a
/// header and a handful of attributes, so that takes a name far beyond
/// IFNAMSIZ. Refused before the kernel sees a mangled message.
fn encoded(
    ty: u16,
    flags: u16,
    body: impl FnOnce(&mut MsgWriter),
    object: &str,
) -> Result<MsgWriter> {
    let w = encode(ty, flags, body);
    if w.overflow {
        return Err(Socket::<Route>::protocol_err(object)(
            "request too large for a netlink length field",
        ));
    }
    Ok(w)
}

/// The encoded request `w` numbered `seq` (encoded once; each (re)send of
/// a dump only gets its sequence number).
fn with_seq(w: &MsgWriter, seq: u32) -> Vec<u8> {
    let mut m = MsgWriter {
        buf: w.buf.clone(),
        overflow: false,
    };
    m.patch(NLMSG_SEQ_AT, &seq.to_ne_bytes());
    m.buf
}

/// One request message (sequence number 0, patched per send).
pub(crate) fn encode(ty: u16, flags: u16, body: impl FnOnce(&mut MsgWriter)) -> MsgWriter {
    let mut w = MsgWriter::default();
    let start = w.begin(ty, NLM_F_REQUEST | flags, 0);
    body(&mut w);
    w.end_msg(start);
    w
}
