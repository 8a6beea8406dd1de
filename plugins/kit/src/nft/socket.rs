//! The socket-facing operations.

use super::*;

/// A NETLINK_NETFILTER socket bound to the network namespace that was current
/// (for the calling thread) when [`NftSocket::new`] ran.
#[derive(Debug)]
pub struct NftSocket {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

pub(super) fn sock_err(op: &'static str) -> impl FnOnce(io::Error) -> NftError {
    move |source| NftError::Socket { op, source }
}

pub(super) fn protocol_err(object: &str) -> impl FnOnce(String) -> NftError + '_ {
    move |reason| NftError::Protocol {
        object: object.to_string(),
        reason,
    }
}

impl NftSocket {
    /// Opens a socket in the calling thread's current network namespace.
    pub fn new() -> Result<Self, NftError> {
        let mut sock =
            Socket::new(NETLINK_NETFILTER).map_err(sock_err("socket(NETLINK_NETFILTER)"))?;
        sock.bind_auto().map_err(sock_err("bind"))?;
        // Both are conveniences (kernel error strings, small error replies)
        // that old kernels lack; failing to enable them is not fatal.
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_cap_ack(true);
        set_timeout(&sock, libc::SO_RCVTIMEO, RECV_TIMEOUT)
            .map_err(sock_err("setsockopt(SO_RCVTIMEO)"))?;
        set_timeout(&sock, libc::SO_SNDTIMEO, RECV_TIMEOUT)
            .map_err(sock_err("setsockopt(SO_SNDTIMEO)"))?;
        // Seed sequence numbers from the clock like libmnl does, so replies to
        // a previous process' socket can never be mistaken for ours.
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        Ok(NftSocket {
            sock,
            seq,
            buf: vec![0; 64 * 1024],
        })
    }

    /// Atomically (one batch) (re)creates `inet <table>`: deletes the table if
    /// it exists, creates it, adds chain `postrouting` (type nat, hook
    /// postrouting, priority srcnat/100, policy accept) and one rule per
    /// [`MasqRule`], in order, each carrying `tag` as its comment (user data)
    /// so ownership can be verified later. Nothing changes if any step fails.
    pub fn replace_masquerade_table(
        &mut self,
        table: &str,
        rules: &[MasqRule],
        tag: &str,
    ) -> Result<(), NftError> {
        self.replace_table(
            table,
            &TableRules {
                masquerade: Some(rules),
                mss: &[],
            },
            tag,
        )
    }

    /// Like [`NftSocket::replace_masquerade_table`] for a table holding any
    /// of podgate's chains: `postrouting` (masquerade) and `forward` (MSS
    /// clamp, type filter, hook forward, priority mangle/-150), in one batch.
    pub fn replace_table(
        &mut self,
        table: &str,
        rules: &TableRules<'_>,
        tag: &str,
    ) -> Result<(), NftError> {
        let first = self.reserve_seqs(rules.messages());
        let fresh = build_table_batch(table, rules, tag, first, false)?;
        match self.run_batch(&fresh) {
            Err(NftError::Kernel { errno, .. }) if errno == libc::EEXIST => {
                // The table is there already (a repeated ADD): replace it atomically.
                let first = self.reserve_seqs(rules.messages());
                let batch = build_replace_batch(table, rules, tag, first)?;
                self.run_batch(&batch)
            }
            other => other,
        }
    }

    /// Deletes `inet <table>` with everything in it. Returns `Ok(false)` if it
    /// did not exist.
    pub fn delete_table(&mut self, table: &str) -> Result<bool, NftError> {
        let first = self.reserve_seqs(3);
        let batch = build_delete_batch(table, first)?;
        match self.run_batch(&batch) {
            Ok(()) => Ok(true),
            Err(NftError::Kernel { errno, .. }) if errno == libc::ENOENT => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Lists the rules of chain `postrouting` in `inet <table>`, in chain
    /// order. Returns `Ok(None)` if the table does not exist, and an empty
    /// list if the table exists without that chain.
    pub fn list_masquerade(&mut self, table: &str) -> Result<Option<Vec<ListedRule>>, NftError> {
        Ok(self.list_chain(table, CHAIN)?.map(|rules| {
            rules
                .iter()
                .map(|rule| ListedRule {
                    rule: rule_from_exprs(&rule.exprs),
                    tag: rule.userdata.as_deref().and_then(decode_comment_udata),
                    handle: rule.handle,
                })
                .collect()
        }))
    }

    /// Lists the rules of chain `forward` (MSS clamp) in `inet <table>`;
    /// `Ok(None)` if the table does not exist, empty without that chain.
    pub fn list_mss(&mut self, table: &str) -> Result<Option<Vec<ListedMss>>, NftError> {
        Ok(self.list_chain(table, MSS_CHAIN)?.map(|rules| {
            rules
                .iter()
                .map(|rule| ListedMss {
                    rule: mss_from_exprs(&rule.exprs),
                    tag: rule.userdata.as_deref().and_then(decode_comment_udata),
                    handle: rule.handle,
                })
                .collect()
        }))
    }

    pub(super) fn list_chain(
        &mut self,
        table: &str,
        chain: &str,
    ) -> Result<Option<Vec<RuleInfo>>, NftError> {
        validate_name("table", table)?;
        if !self.table_exists(sys::NFPROTO_INET, table)? {
            return Ok(None);
        }
        let object = format!("list rules of chain inet {table} {chain}");
        let msgs = self.dump(sys::NFT_MSG_GETRULE, sys::NFPROTO_INET, &object, |w| {
            w.attr_str(sys::NFTA_RULE_TABLE, table);
            w.attr_str(sys::NFTA_RULE_CHAIN, chain);
        });
        let msgs = match msgs {
            // The table exists without this chain.
            Err(NftError::Kernel { errno, .. }) if errno == libc::ENOENT => {
                return Ok(Some(Vec::new()))
            }
            other => other?,
        };
        let mut out = Vec::with_capacity(msgs.len());
        for msg in &msgs {
            let rule = decode_rule(msg).map_err(protocol_err(&object))?;
            if rule.chain != chain {
                continue; // old kernels may ignore the chain filter
            }
            out.push(rule);
        }
        Ok(Some(out))
    }

    /// Lists all tables of all families as `(nfproto family, name)`; family
    /// numbers are `NFPROTO_*` (1 inet, 2 ip, 10 ip6, …).
    pub fn list_tables(&mut self) -> Result<Vec<(u8, String)>, NftError> {
        let object = "list tables";
        let msgs = self.dump(sys::NFT_MSG_GETTABLE, sys::NFPROTO_UNSPEC, object, |_| {})?;
        let mut out = Vec::with_capacity(msgs.len());
        for msg in &msgs {
            let attrs = Attrs::parse(msg.nf_attrs()).map_err(protocol_err(object))?;
            if let Some(name) = attrs.get(sys::NFTA_TABLE_NAME) {
                out.push((msg.nf_family(), attr_string(name)));
            }
        }
        Ok(out)
    }

    /// Lists the `inet` tables whose name starts with `prefix`, with the
    /// comment each carries in its user data (podgate's ownership tag), as
    /// `(name, tag)`. For sweeping by ownership when no record says which.
    pub fn list_inet_tables_tagged(
        &mut self,
        prefix: &str,
    ) -> Result<Vec<(String, Option<String>)>, NftError> {
        let object = "list inet tables";
        let msgs = self.dump(sys::NFT_MSG_GETTABLE, sys::NFPROTO_INET, object, |_| {})?;
        let mut out = Vec::new();
        for msg in &msgs {
            if msg.nf_family() != sys::NFPROTO_INET {
                continue;
            }
            let attrs = Attrs::parse(msg.nf_attrs()).map_err(protocol_err(object))?;
            let Some(name) = attrs.get(sys::NFTA_TABLE_NAME).map(attr_string) else {
                continue;
            };
            if name.starts_with(prefix) {
                let tag = attrs
                    .get(sys::NFTA_TABLE_USERDATA)
                    .and_then(decode_comment_udata);
                out.push((name, tag));
            }
        }
        Ok(out)
    }

    // -- plumbing ----------------------------------------------------------

    pub(super) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Reserves `n` consecutive sequence numbers and returns the first.
    pub(super) fn reserve_seqs(&mut self, n: usize) -> u32 {
        let first = self.seq.wrapping_add(1);
        self.seq = self.seq.wrapping_add(u32::try_from(n).unwrap_or(u32::MAX));
        first
    }

    pub(super) fn send(&self, bytes: &[u8], object: &str) -> Result<(), NftError> {
        let kernel = SocketAddr::new(0, 0);
        let sent = self
            .sock
            .send_to(bytes, &kernel, 0)
            .map_err(sock_err("sendto"))?;
        if sent != bytes.len() {
            return Err(NftError::Protocol {
                object: object.to_string(),
                reason: format!("short send: {sent} of {} bytes", bytes.len()),
            });
        }
        Ok(())
    }

    /// Receives one datagram. Blocking receives time out after
    /// [`RECV_TIMEOUT`]; non-blocking ones return `Ok(None)` when the queue is
    /// empty. The datagram is peeked first so that an oversized one grows the
    /// buffer instead of being truncated.
    pub(super) fn recv_msgs(
        &mut self,
        nonblocking: bool,
        object: &str,
    ) -> Result<Option<Vec<NlMsg>>, NftError> {
        let base_flags = if nonblocking { libc::MSG_DONTWAIT } else { 0 };
        loop {
            let peeked = {
                let mut slice: &mut [u8] = self.buf.as_mut_slice();
                self.sock
                    .recv(&mut slice, base_flags | libc::MSG_PEEK | libc::MSG_TRUNC)
            };
            let size = match peeked {
                Ok(size) => size,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    return if nonblocking {
                        Ok(None)
                    } else {
                        Err(NftError::Timeout {
                            object: object.to_string(),
                            timeout: RECV_TIMEOUT,
                        })
                    };
                }
                Err(e) => {
                    return Err(NftError::Socket {
                        op: "recv",
                        source: e,
                    })
                }
            };
            if size > MAX_DATAGRAM_BYTES {
                // Consume it so the socket stays usable, then give up.
                let mut slice: &mut [u8] = self.buf.as_mut_slice();
                let _ = self.sock.recv(&mut slice, libc::MSG_DONTWAIT);
                return Err(NftError::TooLarge {
                    object: object.to_string(),
                    size,
                    limit: MAX_DATAGRAM_BYTES,
                });
            }
            if size > self.buf.len() {
                self.buf.resize(size, 0);
            }
            let got = {
                let mut slice: &mut [u8] = self.buf.as_mut_slice();
                // The datagram is already queued, so this cannot block.
                self.sock.recv(&mut slice, libc::MSG_DONTWAIT)
            };
            let got = match got {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(NftError::Socket {
                        op: "recv",
                        source: e,
                    })
                }
            };
            let data = self.buf.get(..got).unwrap_or_default();
            return split_datagram(data).map(Some).map_err(protocol_err(object));
        }
    }

    /// Sends a batch and waits for its outcome.
    ///
    /// The kernel processes a batch synchronously inside `sendmsg`, so all
    /// replies (errors for failing messages, a commit error against
    /// BATCH_BEGIN, the final ACK) are queued once `send` returns. We block
    /// for the final ACK; as soon as an error shows up we only drain what is
    /// already queued, which also covers batch-level failures that produce no
    /// final ACK at all.
    pub(super) fn run_batch(&mut self, batch: &Batch) -> Result<(), NftError> {
        let whole = batch.object(batch.first_seq);
        self.send(&batch.bytes, &whole)?;
        let mut errors: Vec<NftError> = Vec::new();
        let mut done = false;
        while !done {
            let Some(msgs) = self.recv_msgs(!errors.is_empty(), &whole)? else {
                break; // drained after an error
            };
            for msg in msgs {
                if !batch.contains(msg.seq) {
                    continue; // stale reply to an earlier, abandoned request
                }
                match msg.ty {
                    sys::NLMSG_ERROR => {
                        let (errno, message) = parse_error(&msg).map_err(protocol_err(&whole))?;
                        if errno != 0 {
                            errors.push(NftError::Kernel {
                                object: batch.object(msg.seq),
                                errno,
                                message,
                            });
                        } else if msg.seq == batch.last_seq {
                            done = true;
                        }
                    }
                    sys::NLMSG_OVERRUN => {
                        return Err(NftError::Protocol {
                            object: whole,
                            reason: "NLMSG_OVERRUN".into(),
                        })
                    }
                    _ => {}
                }
            }
        }
        // The first error is the root cause; later ones are usually
        // consequences of the aborted transaction.
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Whether `<family> <name>` exists (a non-dump GETTABLE).
    pub(super) fn table_exists(&mut self, family: u8, name: &str) -> Result<bool, NftError> {
        let object = format!("table {} {name}", family_name(family));
        let seq = self.next_seq();
        let mut w = MsgWriter::default();
        let start = w.begin_msg(
            (sys::NFNL_SUBSYS_NFTABLES << 8) | u16::from(sys::NFT_MSG_GETTABLE),
            sys::NLM_F_REQUEST | sys::NLM_F_ACK,
            seq,
            family,
            0,
        );
        w.attr_str(sys::NFTA_TABLE_NAME, name);
        w.end_msg(start);
        self.send(&w.buf, &object)?;
        let mut found = false;
        loop {
            let msgs = self.recv_msgs(false, &object)?.unwrap_or_default();
            for msg in msgs.iter().filter(|m| m.seq == seq) {
                match msg.ty {
                    sys::NLMSG_ERROR => {
                        let (errno, message) = parse_error(msg).map_err(protocol_err(&object))?;
                        return match errno {
                            0 => Ok(found),
                            libc::ENOENT => Ok(false),
                            _ => Err(NftError::Kernel {
                                object,
                                errno,
                                message,
                            }),
                        };
                    }
                    sys::NLMSG_DONE | sys::NLMSG_NOOP => {}
                    _ => found = true,
                }
            }
        }
    }

    /// Runs a dump request, restarting it if the kernel reports that the
    /// ruleset changed underneath it (`NLM_F_DUMP_INTR`).
    pub(super) fn dump(
        &mut self,
        msg_type: u8,
        family: u8,
        object: &str,
        attrs: impl Fn(&mut MsgWriter),
    ) -> Result<Vec<NlMsg>, NftError> {
        for _ in 0..DUMP_ATTEMPTS {
            let seq = self.next_seq();
            let mut w = MsgWriter::default();
            let start = w.begin_msg(
                (sys::NFNL_SUBSYS_NFTABLES << 8) | u16::from(msg_type),
                sys::NLM_F_REQUEST | sys::NLM_F_DUMP,
                seq,
                family,
                0,
            );
            attrs(&mut w);
            w.end_msg(start);
            self.send(&w.buf, object)?;
            if let Some(msgs) = self.read_dump(seq, object)? {
                return Ok(msgs);
            }
        }
        Err(NftError::DumpInterrupted {
            object: object.to_string(),
            attempts: DUMP_ATTEMPTS,
        })
    }

    /// Reads one dump to its `NLMSG_DONE`. Returns `Ok(None)` if it was
    /// interrupted. Always reads to the end (unless the kernel errs) so the
    /// socket is left without a half-finished dump, which would make the next
    /// dump fail with EBUSY.
    pub(super) fn read_dump(
        &mut self,
        seq: u32,
        object: &str,
    ) -> Result<Option<Vec<NlMsg>>, NftError> {
        let mut out = Vec::new();
        let mut total = 0usize;
        let mut interrupted = false;
        loop {
            let msgs = self.recv_msgs(false, object)?.unwrap_or_default();
            for msg in msgs {
                if msg.seq != seq {
                    continue; // stale reply to an earlier, abandoned request
                }
                interrupted |= msg.flags & sys::NLM_F_DUMP_INTR != 0;
                match msg.ty {
                    sys::NLMSG_DONE => {
                        // NLMSG_DONE carries the dump's final status.
                        let status =
                            ne_u32(&msg.payload, 0).map(|v| i32::from_ne_bytes(v.to_ne_bytes()));
                        if let Some(status) = status.filter(|s| *s < 0) {
                            return Err(NftError::Kernel {
                                object: object.to_string(),
                                errno: status.saturating_neg(),
                                message: None,
                            });
                        }
                        if total > MAX_DUMP_BYTES {
                            return Err(NftError::TooLarge {
                                object: object.to_string(),
                                size: total,
                                limit: MAX_DUMP_BYTES,
                            });
                        }
                        return Ok((!interrupted).then_some(out));
                    }
                    sys::NLMSG_ERROR => {
                        let (errno, message) = parse_error(&msg).map_err(protocol_err(object))?;
                        if errno != 0 {
                            return Err(NftError::Kernel {
                                object: object.to_string(),
                                errno,
                                message,
                            });
                        }
                    }
                    sys::NLMSG_NOOP => {}
                    sys::NLMSG_OVERRUN => {
                        return Err(NftError::Protocol {
                            object: object.to_string(),
                            reason: "NLMSG_OVERRUN".into(),
                        })
                    }
                    _ => {
                        total = total.saturating_add(msg.payload.len());
                        // Past the cap keep reading (to finish the dump) but
                        // stop buffering.
                        if total <= MAX_DUMP_BYTES {
                            out.push(msg);
                        }
                    }
                }
            }
        }
    }
}

pub(super) fn set_timeout(sock: &Socket, opt: libc::c_int, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
    };
    // SAFETY: `tv` is a valid timeval that outlives the call, and the length
    // passed matches its size; the fd is owned by `sock`.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            std::ptr::addr_of!(tv).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
