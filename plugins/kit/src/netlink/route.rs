//! rtnetlink as a codec over the generic [`Socket`]: requests and answers
//! are `netlink-packet-route` messages.

use super::consts::{NLM_F_DUMP, NLM_F_REQUEST};
use super::socket::{Route, Socket};
use crate::error::{Error, Result};
use crate::netns::NetNs;
use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;

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

    /// Send one request; return the inner messages of the answer (dump rows,
    /// what precedes the ACK, or a GET's one answer), or an error carrying
    /// the kernel's errno.
    pub fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        what: &str,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        let object = format!("{what} (netns {})", self.ns);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let encode = |seq: u32| {
            let mut header = NetlinkHeader::default();
            header.flags = NLM_F_REQUEST | flags;
            header.sequence_number = seq;
            let mut nl = NetlinkMessage::new(header, NetlinkPayload::from(msg.clone()));
            nl.finalize();
            let mut out = vec![0u8; nl.buffer_len()];
            nl.serialize(&mut out);
            out
        };
        let rows = if dump {
            self.sock.dump(&object, encode)?
        } else {
            let seq = self.sock.next_seq();
            self.sock.request(&encode(seq), seq, &object)?
        };
        rows.iter()
            .map(|row| {
                let mut bytes = Vec::with_capacity(16 + row.payload.len());
                bytes.extend_from_slice(&(16 + row.payload.len() as u32).to_ne_bytes());
                bytes.extend_from_slice(&row.ty.to_ne_bytes());
                bytes.extend_from_slice(&row.flags.to_ne_bytes());
                bytes.extend_from_slice(&row.seq.to_ne_bytes());
                bytes.extend_from_slice(&row.port.to_ne_bytes());
                bytes.extend_from_slice(&row.payload);
                NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes)
                    .map_err(|e| Socket::<Route>::protocol_err(&object)(e.to_string()))
                    .and_then(|m| match m.payload {
                        NetlinkPayload::InnerMessage(m) => Ok(m),
                        other => Err(Socket::<Route>::protocol_err(&object)(format!(
                            "unexpected message type {}",
                            other.message_type()
                        ))),
                    })
            })
            .collect()
    }
}
