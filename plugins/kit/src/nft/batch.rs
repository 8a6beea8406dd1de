//! Batches: the transactions that create, replace and delete a table.

use super::*;

/// A fully encoded batch plus what each sequence number refers to, so kernel
/// errors can name the object that failed.
pub(super) struct Batch {
    pub(super) bytes: Vec<u8>,
    pub(super) first_seq: u32,
    pub(super) last_seq: u32,
    pub(super) objects: Vec<(u32, String)>,
}

impl Batch {
    pub(super) fn object(&self, seq: u32) -> String {
        self.objects
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, o)| o.clone())
            .unwrap_or_else(|| format!("batch message seq {seq}"))
    }

    pub(super) fn contains(&self, seq: u32) -> bool {
        seq.wrapping_sub(self.first_seq) <= self.last_seq.wrapping_sub(self.first_seq)
    }
}

/// Builds `BATCH_BEGIN, msg…, BATCH_END`. Only the last real message asks for
/// an ACK: the kernel reports every failing message anyway, and a single
/// positive ACK at the end tells us the whole batch was committed (errors,
/// including commit-time ones, are always delivered before it).
pub(super) struct BatchBuilder {
    pub(super) w: MsgWriter,
    pub(super) seq: u32,
    pub(super) first_seq: u32,
    pub(super) objects: Vec<(u32, String)>,
    pub(super) last_msg: Option<usize>,
    pub(super) batch_object: String,
}

impl BatchBuilder {
    pub(super) fn new(first_seq: u32, batch_object: String) -> Self {
        let mut w = MsgWriter::default();
        let start = w.begin_msg(
            sys::NFNL_MSG_BATCH_BEGIN,
            sys::NLM_F_REQUEST,
            first_seq,
            sys::NFPROTO_UNSPEC,
            sys::NFNL_SUBSYS_NFTABLES,
        );
        w.end_msg(start);
        BatchBuilder {
            w,
            seq: first_seq,
            first_seq,
            // Commit failures are reported against the BATCH_BEGIN sequence.
            objects: vec![(first_seq, format!("{batch_object} (commit)"))],
            last_msg: None,
            batch_object,
        }
    }

    pub(super) fn msg(
        &mut self,
        msg_type: u8,
        flags: u16,
        family: u8,
        object: String,
        body: impl FnOnce(&mut MsgWriter),
    ) {
        self.seq = self.seq.wrapping_add(1);
        let ty = (sys::NFNL_SUBSYS_NFTABLES << 8) | u16::from(msg_type);
        let start = self.w.begin_msg(
            ty,
            sys::NLM_F_REQUEST | flags,
            self.seq,
            family,
            // res_id is unused for nf_tables messages inside a batch.
            0,
        );
        body(&mut self.w);
        self.w.end_msg(start);
        self.objects.push((self.seq, object));
        self.last_msg = Some(start);
    }

    pub(super) fn finish(mut self) -> Result<Batch, NftError> {
        if let Some(start) = self.last_msg {
            // nlmsg_flags sit at offset 6 of the header.
            let flags_at = start + 6;
            let flags = self
                .w
                .buf
                .get(flags_at..flags_at + 2)
                .and_then(|b| <[u8; 2]>::try_from(b).ok())
                .map(u16::from_ne_bytes)
                .unwrap_or(0);
            self.w
                .patch(flags_at, &(flags | sys::NLM_F_ACK).to_ne_bytes());
        }
        self.seq = self.seq.wrapping_add(1);
        let start = self.w.begin_msg(
            sys::NFNL_MSG_BATCH_END,
            sys::NLM_F_REQUEST,
            self.seq,
            sys::NFPROTO_UNSPEC,
            sys::NFNL_SUBSYS_NFTABLES,
        );
        self.w.end_msg(start);
        if self.w.overflow || self.w.buf.len() > MAX_BATCH_BYTES {
            return Err(NftError::TooLarge {
                family: NFT,
                object: self.batch_object,
                size: self.w.buf.len(),
                limit: MAX_BATCH_BYTES,
            });
        }
        Ok(Batch {
            bytes: self.w.buf,
            first_seq: self.first_seq,
            // The ACK-carrying message is the one before BATCH_END.
            last_seq: self.seq.wrapping_sub(1),
            objects: self.objects,
        })
    }
}

pub(super) fn build_replace_batch(
    table: &str,
    rules: &TableRules<'_>,
    tag: &str,
    first_seq: u32,
) -> Result<Batch, NftError> {
    build_table_batch(table, rules, tag, first_seq, true)
}

/// `replace`: delete any existing table first, in the same transaction.
/// Otherwise create with NLM_F_EXCL (fails with EEXIST if the table exists).
/// A transaction that deletes anything makes the socket's close wait for a
/// kernel grace period (8-16 ms measured), so the common case of a fresh pod
/// netns uses the create-only form.
pub(super) fn build_table_batch(
    table: &str,
    spec: &TableRules<'_>,
    tag: &str,
    first_seq: u32,
    replace: bool,
) -> Result<Batch, NftError> {
    validate_name("table", table)?;
    validate_tag(tag)?;
    for rule in spec.masquerade.unwrap_or_default() {
        validate_rule(rule)?;
    }
    for rule in spec.mss {
        validate_mss(rule)?;
    }
    let table_obj = format!("table inet {table}");
    let mut b = BatchBuilder::new(
        first_seq,
        format!("{} {table_obj}", if replace { "replace" } else { "create" }),
    );
    if replace {
        // "Delete if it exists" without a racy lookup: creating without
        // NLM_F_EXCL is a no-op for an existing table (we send no flags, so its
        // state is untouched), after which the delete cannot fail with ENOENT.
        // This is what `nft -f` does for `table x; delete table x; table x {…}`.
        b.msg(
            sys::NFT_MSG_NEWTABLE,
            sys::NLM_F_CREATE,
            sys::NFPROTO_INET,
            format!("{table_obj} (ensure exists before delete)"),
            |w| w.attr_str(sys::NFTA_TABLE_NAME, table),
        );
        b.msg(
            sys::NFT_MSG_DELTABLE,
            0,
            sys::NFPROTO_INET,
            format!("{table_obj} (delete old)"),
            |w| w.attr_str(sys::NFTA_TABLE_NAME, table),
        );
    }
    b.msg(
        sys::NFT_MSG_NEWTABLE,
        if replace {
            sys::NLM_F_CREATE
        } else {
            sys::NLM_F_CREATE | sys::NLM_F_EXCL
        },
        sys::NFPROTO_INET,
        format!("{table_obj} (create)"),
        |w| {
            w.attr_str(sys::NFTA_TABLE_NAME, table);
            // Never NFT_TABLE_F_OWNER: that would tie the table's lifetime to
            // this socket, while the masquerade must outlive the plugin.
            w.attr_u32(sys::NFTA_TABLE_FLAGS, 0);
            w.attr(sys::NFTA_TABLE_USERDATA, &encode_comment_udata(tag));
        },
    );
    let udata = encode_comment_udata(tag);
    if let Some(rules) = spec.masquerade {
        base_chain(
            &mut b,
            table,
            CHAIN,
            sys::NF_INET_POST_ROUTING,
            SRCNAT_PRIORITY,
            "nat",
        );
        let rules = rules.iter().map(|r| (describe_rule(r), masq_exprs(r)));
        append_rules(&mut b, table, CHAIN, &udata, rules);
    }
    if !spec.mss.is_empty() {
        base_chain(
            &mut b,
            table,
            MSS_CHAIN,
            sys::NF_INET_FORWARD,
            MANGLE_PRIORITY,
            "filter",
        );
        let rules = spec.mss.iter().map(|r| (describe_mss(r), mss_exprs(r)));
        append_rules(&mut b, table, MSS_CHAIN, &udata, rules);
    }
    b.finish()
}

/// One rule per `(description, expressions)` at the end of chain
/// `inet <table> <chain>`, each tagged with `udata`; APPEND keeps the
/// caller's order.
fn append_rules(
    b: &mut BatchBuilder,
    table: &str,
    chain: &str,
    udata: &[u8],
    rules: impl Iterator<Item = (String, Vec<Expr>)>,
) {
    for (i, (what, exprs)) in rules.enumerate() {
        b.msg(
            sys::NFT_MSG_NEWRULE,
            sys::NLM_F_CREATE | sys::NLM_F_APPEND,
            sys::NFPROTO_INET,
            format!("rule #{} ({what}) in chain inet {table} {chain}", i + 1),
            |w| {
                w.attr_str(sys::NFTA_RULE_TABLE, table);
                w.attr_str(sys::NFTA_RULE_CHAIN, chain);
                let list = w.begin_nest(sys::NFTA_RULE_EXPRESSIONS);
                for expr in &exprs {
                    expr.encode(w);
                }
                w.end_nest(list);
                w.attr(sys::NFTA_RULE_USERDATA, udata);
            },
        );
    }
}

/// `chain inet <table> <name> { type <ty> hook <hook> priority <prio>; policy accept; }`
pub(super) fn base_chain(
    b: &mut BatchBuilder,
    table: &str,
    name: &str,
    hook: u32,
    prio: i32,
    ty: &str,
) {
    b.msg(
        sys::NFT_MSG_NEWCHAIN,
        sys::NLM_F_CREATE,
        sys::NFPROTO_INET,
        format!("chain inet {table} {name}"),
        |w| {
            w.attr_str(sys::NFTA_CHAIN_TABLE, table);
            w.attr_str(sys::NFTA_CHAIN_NAME, name);
            let h = w.begin_nest(sys::NFTA_CHAIN_HOOK);
            w.attr_u32(sys::NFTA_HOOK_HOOKNUM, hook);
            w.attr(sys::NFTA_HOOK_PRIORITY, &prio.to_be_bytes());
            w.end_nest(h);
            w.attr_u32(sys::NFTA_CHAIN_POLICY, sys::NF_ACCEPT);
            w.attr_str(sys::NFTA_CHAIN_TYPE, ty);
        },
    );
}

pub(super) fn build_delete_batch(table: &str, first_seq: u32) -> Result<Batch, NftError> {
    validate_name("table", table)?;
    let table_obj = format!("table inet {table}");
    let mut b = BatchBuilder::new(first_seq, format!("delete {table_obj}"));
    b.msg(
        sys::NFT_MSG_DELTABLE,
        0,
        sys::NFPROTO_INET,
        table_obj,
        |w| w.attr_str(sys::NFTA_TABLE_NAME, table),
    );
    b.finish()
}

/// Encodes the batch [`NftSocket::replace_masquerade_table`] sends, with
/// sequence numbers starting at `first_seq`. Pure, so the wire format can be
/// unit-tested without privileges.
pub fn encode_masquerade_batch(
    table: &str,
    rules: &[MasqRule],
    tag: &str,
    first_seq: u32,
) -> Result<Vec<u8>, NftError> {
    encode_table_batch(
        table,
        &TableRules {
            masquerade: Some(rules),
            mss: &[],
        },
        tag,
        first_seq,
    )
}

/// Encodes the batch [`NftSocket::replace_table`] sends when the table
/// exists (delete and recreate), for unit tests of the wire format.
pub fn encode_table_batch(
    table: &str,
    rules: &TableRules<'_>,
    tag: &str,
    first_seq: u32,
) -> Result<Vec<u8>, NftError> {
    build_replace_batch(table, rules, tag, first_seq).map(|b| b.bytes)
}
