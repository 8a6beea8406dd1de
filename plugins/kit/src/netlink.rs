//! A small synchronous rtnetlink socket (NETLINK_ROUTE), netavark-style:
//! one request at a time, sequence-checked, multipart dumps, bounded waits.

use crate::error::{Error, Result};
use crate::netns::NetNs;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::os::fd::AsRawFd;

const RECV_BUF: usize = 64 * 1024;
/// A kernel that does not answer within this is broken; never hang a CNI call.
const RECV_TIMEOUT_SECS: libc::time_t = 5;

pub struct RouteSocket {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
    /// Which namespace this socket talks to, for error messages.
    ns: String,
}

/// Set SO_RCVTIMEO so a lost answer turns into EAGAIN instead of a hang.
pub(crate) fn set_recv_timeout(fd: i32, secs: libc::time_t) -> std::io::Result<()> {
    let tv = libc::timeval {
        tv_sec: secs,
        tv_usec: 0,
    };
    // SAFETY: valid fd and a correctly sized timeval.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl RouteSocket {
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
        let err = |what: &str, source| Error::Netlink {
            what: format!("{what} (netns {ns})"),
            source,
        };
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| err("socket", e))?;
        sock.bind_auto().map_err(|e| err("bind", e))?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(|e| err("connect", e))?;
        // Strict checking makes the kernel honour dump filters (table, family).
        let _ = sock.set_netlink_get_strict_chk(true);
        let _ = sock.set_ext_ack(true);
        set_recv_timeout(sock.as_raw_fd(), RECV_TIMEOUT_SECS).map_err(|e| err("SO_RCVTIMEO", e))?;
        Ok(RouteSocket {
            sock,
            seq: 0,
            buf: vec![0; RECV_BUF],
            ns,
        })
    }

    /// Send one request; return the inner messages of the answer (dump rows),
    /// or an error carrying the kernel's errno.
    pub fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        what: &str,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        let what = format!("{what} (netns {})", self.ns);
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        nl.finalize();
        let mut out = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut out);
        self.sock.send(&out, 0).map_err(|source| Error::Netlink {
            what: what.clone(),
            source,
        })?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let ack = flags & NLM_F_ACK == NLM_F_ACK;
        let mut rows = Vec::new();
        loop {
            let n = self
                .sock
                .recv(&mut &mut self.buf[..], 0)
                .map_err(|source| Error::Netlink {
                    what: what.clone(),
                    source,
                })?;
            let mut off = 0usize;
            while off < n {
                let Some(chunk) = self.buf.get(off..n) else {
                    break;
                };
                let msg =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(chunk).map_err(|e| {
                        Error::Decode {
                            what: what.clone(),
                            msg: e.to_string(),
                        }
                    })?;
                let len = msg.header.length as usize;
                if len == 0 {
                    return Err(Error::Decode {
                        what,
                        msg: "zero-length message".into(),
                    });
                }
                off += (len + 3) & !3;
                if msg.header.sequence_number != seq {
                    // A stale answer to an earlier timed-out request: skip it.
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(rows),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(rows),
                            Some(_) => Err(Error::Netlink {
                                what,
                                source: e.to_io(),
                            }),
                        };
                    }
                    NetlinkPayload::InnerMessage(m) => {
                        rows.push(m);
                        if !dump && !ack {
                            return Ok(rows);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
