//! The socket-facing operations: nf_tables requests over the kit's one
//! netlink [`Socket`].

use super::*;

/// A NETLINK_NETFILTER socket bound to the network namespace that was current
/// (for the calling thread) when [`NftSocket::new`] ran.
#[derive(Debug)]
pub struct NftSocket {
    sock: Socket<Netfilter>,
}

pub(super) fn protocol_err<R: std::fmt::Display>(object: &str) -> impl FnOnce(R) -> NftError + '_ {
    Socket::<Netfilter>::protocol_err(object)
}

impl NftSocket {
    /// Opens a socket in the calling thread's current network namespace.
    pub fn new() -> Result<Self, NftError> {
        Ok(NftSocket {
            sock: Socket::new()?,
        })
    }

    /// The netns cookie of the namespace this socket is bound to (the one
    /// that was current when it was opened).
    pub fn netns_cookie(&self) -> crate::Result<Option<u64>> {
        self.sock.netns_cookie()
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
        self.list_decoded(table, CHAIN, rule_from_exprs)
    }

    /// Lists the rules of chain `forward` (MSS clamp) in `inet <table>`;
    /// `Ok(None)` if the table does not exist, empty without that chain.
    pub fn list_mss(&mut self, table: &str) -> Result<Option<Vec<ListedMss>>, NftError> {
        self.list_decoded(table, MSS_CHAIN, mss_from_exprs)
    }

    /// The rules of `chain`, each decoded as the shape podgate writes there.
    fn list_decoded<R>(
        &mut self,
        table: &str,
        chain: &str,
        decode: fn(&[Expr]) -> Option<R>,
    ) -> Result<Option<Vec<Listed<R>>>, NftError> {
        Ok(self.list_chain(table, chain)?.map(|rules| {
            rules
                .iter()
                .map(|rule| Listed {
                    rule: decode(&rule.exprs),
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

    fn reserve_seqs(&mut self, n: usize) -> u32 {
        self.sock.reserve_seqs(n)
    }

    /// Sends a batch and waits for its outcome (the first error names the
    /// object of the message that failed).
    fn run_batch(&mut self, batch: &Batch) -> Result<(), NftError> {
        let whole = batch.object(batch.first_seq);
        self.sock.batch(
            &batch.bytes,
            |seq| batch.contains(seq),
            batch.last_seq,
            &whole,
            |seq| batch.object(seq),
        )
    }

    /// Whether `<family> <name>` exists (a non-dump GETTABLE).
    fn table_exists(&mut self, family: u8, name: &str) -> Result<bool, NftError> {
        let object = format!("table {} {name}", family_name(family));
        let seq = self.sock.next_seq();
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
        match self.sock.request(&w.buf, seq, &object) {
            Ok(rows) => Ok(!rows.is_empty()),
            Err(NftError::Kernel { errno, .. }) if errno == libc::ENOENT => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Runs a dump request, restarted if the kernel reports that the
    /// ruleset changed underneath it (`NLM_F_DUMP_INTR`).
    pub(super) fn dump(
        &mut self,
        msg_type: u8,
        family: u8,
        object: &str,
        attrs: impl Fn(&mut MsgWriter),
    ) -> Result<Vec<NlMsg>, NftError> {
        self.sock.dump(object, |seq| {
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
            w.buf
        })
    }
}
