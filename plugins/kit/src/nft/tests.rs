use super::*;
use crate::netlink::msg::{parse_error, split_datagram};

fn rule(src: &str, oif: &str) -> MasqRule {
    MasqRule {
        source: src.parse().unwrap(),
        oifname: oif.into(),
    }
}

/// Splits an encoded batch back into messages with our own parser.
fn messages(bytes: &[u8]) -> Vec<NlMsg> {
    split_datagram(bytes).unwrap()
}

fn rule_exprs(msg: &NlMsg) -> Vec<Expr> {
    decode_rule(msg).unwrap().exprs
}

#[test]
fn a_table_replacement_is_one_batch_that_creates_deletes_and_recreates_the_table() {
    let bytes = encode_masquerade_batch(
        "podgate",
        &[rule("10.8.0.0/24", "eth0"), rule("fd00::/64", "eth0")],
        "podgate:abc",
        100,
    )
    .unwrap();
    assert_eq!(bytes.len() % 4, 0);
    let msgs = messages(&bytes);
    let types: Vec<u16> = msgs.iter().map(|m| m.ty).collect();
    let nft = |m: u8| (10u16 << 8) | u16::from(m);
    assert_eq!(
        types,
        vec![
            0x10,
            nft(sys::NFT_MSG_NEWTABLE),
            nft(sys::NFT_MSG_DELTABLE),
            nft(sys::NFT_MSG_NEWTABLE),
            nft(sys::NFT_MSG_NEWCHAIN),
            nft(sys::NFT_MSG_NEWRULE),
            nft(sys::NFT_MSG_NEWRULE),
            0x11,
        ]
    );
    let seqs: Vec<u32> = msgs.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (100..108).collect::<Vec<_>>());
    // Batch begin: nfgenmsg AF_UNSPEC, version 0, res_id NFTABLES (BE).
    assert_eq!(&bytes[..4], &20u32.to_ne_bytes());
    assert_eq!(msgs[0].payload, vec![0, 0, 0, 10]);
    assert_eq!(msgs[7].payload, vec![0, 0, 0, 10]);
    // Real messages use family inet; only the last asks for an ACK.
    for (i, m) in msgs.iter().enumerate().take(7).skip(1) {
        assert_eq!(m.payload[0], sys::NFPROTO_INET);
        assert_ne!(m.flags & sys::NLM_F_REQUEST, 0);
        assert_eq!(m.flags & sys::NLM_F_ACK != 0, i == 6, "message {i}");
    }
    assert_eq!(msgs[0].flags, sys::NLM_F_REQUEST);
    assert_eq!(msgs[7].flags, sys::NLM_F_REQUEST);
    assert_ne!(msgs[5].flags & sys::NLM_F_APPEND, 0);
    // The "ensure exists" NEWTABLE must not carry flags (it would modify
    // an existing table) nor EXCL (it must succeed on an existing table).
    let ensure = Attrs::parse(msgs[1].nf_attrs()).unwrap();
    assert!(ensure.get(sys::NFTA_TABLE_FLAGS).is_none());
    assert_eq!(msgs[1].flags & 0x200, 0);
    let created = Attrs::parse(msgs[3].nf_attrs()).unwrap();
    assert_eq!(created.get(sys::NFTA_TABLE_NAME).unwrap(), b"podgate\0");
    assert_eq!(created.get(sys::NFTA_TABLE_FLAGS).unwrap(), &[0, 0, 0, 0]);
}

#[test]
fn the_postrouting_chain_is_a_nat_hook_at_srcnat_priority() {
    let bytes = encode_masquerade_batch("t", &[], "x", 1).unwrap();
    let msgs = messages(&bytes);
    let attrs = Attrs::parse(msgs[4].nf_attrs()).unwrap();
    assert_eq!(attrs.get(sys::NFTA_CHAIN_TABLE).unwrap(), b"t\0");
    assert_eq!(attrs.get(sys::NFTA_CHAIN_NAME).unwrap(), b"postrouting\0");
    assert_eq!(attrs.get(sys::NFTA_CHAIN_TYPE).unwrap(), b"nat\0");
    assert_eq!(attrs.get(sys::NFTA_CHAIN_POLICY).unwrap(), &[0, 0, 0, 1]);
    let hook = Attrs::parse(attrs.get(sys::NFTA_CHAIN_HOOK).unwrap()).unwrap();
    assert_eq!(hook.get(sys::NFTA_HOOK_HOOKNUM).unwrap(), &[0, 0, 0, 4]);
    assert_eq!(hook.get(sys::NFTA_HOOK_PRIORITY).unwrap(), &[0, 0, 0, 100]);
    // The hook nest is flagged NLA_F_NESTED on the wire.
    let raw = msgs[4].nf_attrs();
    let pos = raw
        .windows(2)
        .position(|w| w == (sys::NFTA_CHAIN_HOOK | sys::NLA_F_NESTED).to_ne_bytes())
        .unwrap();
    assert_eq!(u16::from_ne_bytes([raw[pos - 2], raw[pos - 1]]), 4 + 8 + 8);
}

fn cmp_eq(data: &[u8]) -> Expr {
    Expr::Cmp {
        sreg: 1,
        op: 0,
        data: data.to_vec(),
    }
}

fn payload(offset: u32, len: u32) -> Expr {
    let (base, dreg) = (1, 1);
    Expr::Payload {
        base,
        offset,
        len,
        dreg,
    }
}

#[test]
fn ipv4_prefix_uses_bitwise() {
    let bytes = encode_masquerade_batch("t", &[rule("10.8.0.0/24", "eth0")], "x", 1).unwrap();
    let exprs = rule_exprs(&messages(&bytes)[5]);
    let mut ifname = b"eth0".to_vec();
    ifname.resize(16, 0);
    let mask = vec![0xff, 0xff, 0xff, 0];
    let xor = vec![0; 4];
    let (sreg, dreg, len) = (1, 1, 4);
    let expected = vec![
        Expr::Meta { key: 15, dreg: 1 },
        cmp_eq(&[2]),
        payload(12, 4),
        Expr::Bitwise {
            sreg,
            dreg,
            len,
            mask,
            xor,
        },
        cmp_eq(&[10, 8, 0, 0]),
        Expr::Meta { key: 7, dreg: 1 },
        cmp_eq(&ifname),
        Expr::Masq {
            flags: 0,
            has_proto_regs: false,
        },
    ];
    assert_eq!(exprs, expected);
}

#[test]
fn ipv6_prefix_offsets() {
    let bytes = encode_masquerade_batch("t", &[rule("fd00:1::/64", "uplink")], "x", 1).unwrap();
    let exprs = rule_exprs(&messages(&bytes)[5]);
    assert_eq!(exprs[1], cmp_eq(&[10]));
    assert_eq!(exprs[2], payload(8, 16));
    let Expr::Bitwise { mask, len, .. } = &exprs[3] else {
        panic!("expected bitwise, got {:?}", exprs[3]);
    };
    assert_eq!(*len, 16);
    assert_eq!(mask[..8], [0xff; 8]);
    assert_eq!(mask[8..], [0; 8]);
    let mut addr = vec![0xfd, 0, 0, 1];
    addr.resize(16, 0);
    assert_eq!(exprs[4], cmp_eq(&addr));
}

#[test]
fn full_length_prefix_has_no_bitwise() {
    for src in ["10.8.0.7/32", "fd00::7/128"] {
        let exprs = masq_exprs(&rule(src, "eth0"));
        assert_eq!(exprs.len(), 7, "{src}");
        assert!(!exprs.iter().any(|e| matches!(e, Expr::Bitwise { .. })));
    }
}

#[test]
fn exact_expression_bytes() {
    // Pin the on-wire layout of one expression independently of the decoder:
    // LIST_ELEM{ NAME "payload", DATA{ DREG 1, BASE 1, OFFSET 12, LEN 4 } }.
    let mut w = MsgWriter::default();
    payload(12, 4).encode(&mut w);
    let mut expect = Vec::new();
    let nla = |ty: u16, len: u16| [len.to_ne_bytes(), ty.to_ne_bytes()].concat();
    expect.extend(nla(1 | 0x8000, 4 + 12 + 4 + 32));
    expect.extend(nla(1, 12));
    expect.extend(b"payload\0");
    expect.extend(nla(2 | 0x8000, 4 + 32));
    for (ty, v) in [(1u16, 1u32), (2, 1), (3, 12), (4, 4)] {
        expect.extend(nla(ty, 8));
        expect.extend(v.to_be_bytes());
    }
    assert_eq!(w.buf, expect);
    assert!(!w.overflow);
}

#[test]
fn rules_round_trip_through_decoder() {
    for (src, oif) in [
        ("10.8.0.0/24", "eth0"),
        ("10.0.0.0/8", "a"),
        ("0.0.0.0/0", "eth0"),
        ("192.168.1.1/32", "veth1234567890a"),
        ("fd00::/64", "eth0"),
        ("2001:db8::1/128", "eth1"),
        ("2001:db8::/29", "eth1"),
    ] {
        let r = rule(src, oif);
        assert_eq!(rule_from_exprs(&masq_exprs(&r)), Some(r.clone()), "{src}");
        // And through the wire encoding.
        let bytes = encode_masquerade_batch("t", std::slice::from_ref(&r), "x", 1).unwrap();
        assert_eq!(rule_from_exprs(&rule_exprs(&messages(&bytes)[5])), Some(r));
    }
}

#[test]
fn foreign_shapes_are_rejected() {
    let base = masq_exprs(&rule("10.8.0.0/24", "eth0"));
    // Masquerade with flags (e.g. `masquerade random`).
    let mut flagged = base.clone();
    *flagged.last_mut().unwrap() = Expr::Masq {
        flags: 4,
        has_proto_regs: false,
    };
    assert_eq!(rule_from_exprs(&flagged), None);
    // nft's byte-aligned shortcut (payload 3 bytes, no bitwise).
    let mut short = base.clone();
    short.remove(3);
    short[2] = payload(12, 3);
    short[3] = cmp_eq(&[10, 8, 0]);
    assert_eq!(rule_from_exprs(&short), None);
    // Non-contiguous mask.
    let mut holey = base.clone();
    holey[3] = Expr::Bitwise {
        sreg: 1,
        dreg: 1,
        len: 4,
        mask: vec![0xff, 0, 0xff, 0],
        xor: vec![0; 4],
    };
    assert_eq!(rule_from_exprs(&holey), None);
    // Not-equal comparison on the interface.
    let mut neq = base.clone();
    neq[6] = match &neq[6] {
        Expr::Cmp { data, .. } => Expr::Cmp {
            sreg: 1,
            op: 1,
            data: data.clone(),
        },
        other => other.clone(),
    };
    assert_eq!(rule_from_exprs(&neq), None);
    // Extra expression (a counter).
    let mut extra = base.clone();
    extra.insert(
        7,
        Expr::Other {
            name: "counter".into(),
        },
    );
    assert_eq!(rule_from_exprs(&extra), None);
    assert_eq!(rule_from_exprs(&[]), None);
    // Family / address length mismatch.
    let mut mismatch = base;
    mismatch[1] = cmp_eq(&[10]);
    assert_eq!(rule_from_exprs(&mismatch), None);
}

#[test]
fn a_rule_comment_round_trips_through_udata_and_a_truncated_tlv_is_none() {
    let u = encode_comment_udata("podgate:ctr1");
    assert_eq!(u[0], 0);
    assert_eq!(usize::from(u[1]), "podgate:ctr1".len() + 1);
    assert_eq!(decode_comment_udata(&u).as_deref(), Some("podgate:ctr1"));
    // A comment after another TLV type.
    let mut two = vec![1, 2, 9, 9];
    two.extend(&u);
    assert_eq!(decode_comment_udata(&two).as_deref(), Some("podgate:ctr1"));
    // Truncated TLV.
    assert_eq!(decode_comment_udata(&[0, 10, b'a']), None);
    assert_eq!(decode_comment_udata(&[]), None);
}

#[test]
fn a_source_with_host_bits_set_is_refused_naming_its_network() {
    let err = encode_masquerade_batch("t", &[rule("10.8.0.5/24", "eth0")], "x", 1).unwrap_err();
    assert!(err.to_string().contains("10.8.0.0/24"), "{err}");
}

#[test]
fn an_interface_name_must_be_1_to_15_bytes() {
    assert!(encode_masquerade_batch("t", &[rule("10.8.0.0/24", "")], "x", 1).is_err());
    assert!(
        encode_masquerade_batch("t", &[rule("10.8.0.0/24", "sixteen-chars-xx")], "x", 1).is_err()
    );
    assert!(
        encode_masquerade_batch("t", &[rule("10.8.0.0/24", "fifteen-chars-x")], "x", 1).is_ok()
    );
}

#[test]
fn a_table_name_must_be_1_to_255_bytes_without_nul() {
    assert!(encode_masquerade_batch("", &[], "x", 1).is_err());
    assert!(encode_masquerade_batch("a\0b", &[], "x", 1).is_err());
    assert!(encode_masquerade_batch(&"t".repeat(256), &[], "x", 1).is_err());
}

#[test]
fn a_rule_tag_must_be_at_most_253_bytes_without_nul() {
    assert!(encode_masquerade_batch("t", &[], &"x".repeat(254), 1).is_err());
    assert!(encode_masquerade_batch("t", &[], &"x".repeat(253), 1).is_ok());
    assert!(encode_masquerade_batch("t", &[], "a\0", 1).is_err());
}

#[test]
fn oversized_batch_is_refused() {
    let rules: Vec<MasqRule> = (0..2000u32)
        .map(|i| rule(&format!("10.{}.{}.0/24", i / 256, i % 256), "eth0"))
        .collect();
    let err = encode_masquerade_batch("t", &rules, "x", 1).unwrap_err();
    assert!(matches!(err, NftError::TooLarge { .. }), "{err}");
}

#[test]
fn a_kernel_error_reply_carries_its_errno_and_extended_ack_message() {
    // NLMSG_ERROR, capped, with an extack message TLV.
    let mut payload = (-libc::EINVAL).to_ne_bytes().to_vec();
    payload.extend([0u8; 16]); // echoed request header
    let mut w = MsgWriter::default();
    w.attr_str(sys::NLMSGERR_ATTR_MSG, "bad thing");
    payload.extend(&w.buf);
    let msg = NlMsg {
        ty: sys::NLMSG_ERROR,
        flags: sys::NLM_F_CAPPED | sys::NLM_F_ACK_TLVS,
        seq: 1,
        port: 0,
        payload,
    };
    let (errno, message) = parse_error(msg.view()).unwrap();
    assert_eq!(errno, libc::EINVAL);
    assert_eq!(message.as_deref(), Some("bad thing"));
    let err = NftError::Kernel {
        family: NFT,
        object: "table inet x".into(),
        errno,
        message,
    };
    let text = err.to_string();
    assert!(
        text.contains("table inet x") && text.contains("EINVAL") && text.contains("bad thing"),
        "{text}"
    );
    assert_eq!(err.errno(), Some(libc::EINVAL));

    // Plain ACK.
    let ack = NlMsg {
        ty: sys::NLMSG_ERROR,
        flags: 0,
        seq: 1,
        port: 0,
        payload: [0u8; 20].to_vec(),
    };
    assert_eq!(parse_error(ack.view()).unwrap(), (0, None));
    // Too short.
    let short = NlMsg {
        ty: sys::NLMSG_ERROR,
        flags: 0,
        seq: 1,
        port: 0,
        payload: vec![0, 0],
    };
    assert!(parse_error(short.view()).is_err());
}

#[test]
fn malformed_input_does_not_panic() {
    assert!(split_datagram(&[0xff; 16]).is_err());
    assert!(split_datagram(&[8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    assert!(split_datagram(&[]).unwrap().is_empty());
    assert!(Attrs::parse(&[200, 0, 1, 0, 1]).is_err());
    assert!(Attrs::parse(&[2, 0, 1, 0]).is_err());
    assert!(Expr::decode(&[]).is_err());
    // Random-ish garbage through every decoder.
    let mut x: u32 = 12345;
    for _ in 0..2000 {
        let len = (x % 64) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (x >> 16) as u8
            })
            .collect();
        let _ = split_datagram(&bytes);
        let _ = Expr::decode(&bytes);
        let _ = decode_verdict(&bytes);
        let _ = decode_comment_udata(&bytes);
        let msg = NlMsg {
            ty: 0x0a07,
            flags: 0,
            seq: 0,
            port: 0,
            payload: bytes,
        };
        let _ = decode_rule(&msg);
        let _ = decode_chain(&msg);
        let _ = parse_error(msg.view());
    }
}

#[test]
fn batch_seq_range_wraps() {
    let b = build_delete_batch("t", u32::MAX).unwrap();
    assert_eq!(b.first_seq, u32::MAX);
    assert_eq!(b.last_seq, 0);
    assert!(b.contains(u32::MAX) && b.contains(0));
    assert!(!b.contains(1) && !b.contains(u32::MAX - 1));
    assert_eq!(b.object(0), "table inet t");
    assert!(b.object(u32::MAX).contains("commit"));
}

#[test]
fn a_jump_verdict_decodes_with_its_chain_name() {
    let mut w = MsgWriter::default();
    Expr::Immediate {
        dreg: 0,
        verdict: Some((sys::NFT_JUMP, Some("KUBE-POSTROUTING".into()))),
    }
    .encode(&mut w);
    let attrs = Attrs::parse(&w.buf).unwrap();
    let elem = attrs.get(sys::NFTA_LIST_ELEM).unwrap();
    assert_eq!(
        Expr::decode(elem).unwrap(),
        Expr::Immediate {
            dreg: 0,
            verdict: Some((-3, Some("KUBE-POSTROUTING".into())))
        }
    );
}

fn mss(pool: &str, dir: MssDirection, v: MssValue) -> MssRule {
    MssRule {
        pool: pool.parse().unwrap(),
        ifname: "eth0".into(),
        direction: dir,
        mss: v,
    }
}

#[test]
fn mss_rule_matches_what_nft_generates() {
    // `nft --debug=netlink` for `ip saddr 10.8.0.0/24 oifname "eth0" tcp
    // flags syn / syn,rst tcp option maxseg size set rt mtu` (nft 1.0.6),
    // except the address: we load 4 bytes and mask, nft loads 3.
    let r = mss("10.8.0.0/24", MssDirection::FromPool, MssValue::Pmtu);
    let mut eth0 = b"eth0".to_vec();
    eth0.resize(16, 0);
    let meta = |key| Expr::Meta { key, dreg: 1 };
    let want = vec![
        meta(15),
        cmp_eq(&[2]),
        payload(12, 4),
        Expr::Bitwise {
            sreg: 1,
            dreg: 1,
            len: 4,
            mask: vec![255, 255, 255, 0],
            xor: vec![0; 4],
        },
        cmp_eq(&[10, 8, 0, 0]),
        meta(7),
        cmp_eq(&eth0),
        meta(16),
        cmp_eq(&[6]),
        Expr::Payload {
            base: 2,
            offset: 13,
            len: 1,
            dreg: 1,
        },
        Expr::Bitwise {
            sreg: 1,
            dreg: 1,
            len: 1,
            mask: vec![0x06],
            xor: vec![0],
        },
        cmp_eq(&[0x02]),
        Expr::Rt { key: 3, dreg: 1 },
        Expr::Byteorder {
            sreg: 1,
            dreg: 1,
            op: 1,
            len: 2,
            size: 2,
        },
        Expr::ExthdrWrite {
            op: 1,
            kind: 2,
            offset: 2,
            len: 2,
            sreg: 1,
        },
    ];
    assert_eq!(mss_exprs(&r), want);
    // The other direction matches iifname and the destination (offset 16);
    // a fixed value is an immediate of 2 big-endian bytes.
    let back = mss_exprs(&mss(
        "10.8.0.0/24",
        MssDirection::ToPool,
        MssValue::Fixed(1300),
    ));
    assert_eq!(back[2], payload(16, 4));
    assert_eq!(back[5], meta(6));
    assert_eq!(
        back[back.len() - 2],
        Expr::ImmediateData {
            dreg: 1,
            data: vec![0x05, 0x14]
        }
    );
    // IPv6 pools: saddr at 8, daddr at 24.
    let v6 = mss_exprs(&mss("fd00::/64", MssDirection::ToPool, MssValue::Pmtu));
    assert_eq!(v6[2], payload(24, 16));
}

#[test]
fn mss_expression_bytes() {
    let nla = |ty: u16, len: u16| [len.to_ne_bytes(), ty.to_ne_bytes()].concat();
    let u32_attr = |ty: u16, v: u32| [nla(ty, 8), v.to_be_bytes().to_vec()].concat();
    // exthdr: SREG 1, TYPE u8 2 (padded), OFFSET 2, LEN 2, OP tcpopt.
    let mut w = MsgWriter::default();
    Expr::ExthdrWrite {
        op: 1,
        kind: 2,
        offset: 2,
        len: 2,
        sreg: 1,
    }
    .encode(&mut w);
    let mut data = u32_attr(7, 1);
    data.extend(nla(2, 5));
    data.extend([2, 0, 0, 0]);
    data.extend(u32_attr(3, 2));
    data.extend(u32_attr(4, 2));
    data.extend(u32_attr(6, 1));
    let mut expect = nla(1 | 0x8000, (4 + 12 + 4 + data.len()) as u16);
    expect.extend(nla(1, 11));
    expect.extend(b"exthdr\0\0");
    expect.extend(nla(2 | 0x8000, (4 + data.len()) as u16));
    expect.extend(&data);
    assert_eq!(w.buf, expect);
    // rt: DREG 1, KEY tcpmss (3).
    let mut w = MsgWriter::default();
    Expr::Rt { key: 3, dreg: 1 }.encode(&mut w);
    assert!(w.buf.ends_with(&[u32_attr(1, 1), u32_attr(2, 3)].concat()));
    // immediate data: DREG 1, DATA{ VALUE 05 14 }.
    let mut w = MsgWriter::default();
    Expr::ImmediateData {
        dreg: 1,
        data: vec![0x05, 0x14],
    }
    .encode(&mut w);
    let tail = [
        u32_attr(1, 1),
        nla(2 | 0x8000, 12),
        nla(1, 6),
        vec![5, 0x14, 0, 0],
    ]
    .concat();
    assert!(w.buf.ends_with(&tail), "{:?}", w.buf);
}

#[test]
fn mss_rules_round_trip_and_table_layout() {
    let rules = vec![
        mss("10.8.0.0/24", MssDirection::FromPool, MssValue::Pmtu),
        mss("10.8.0.0/24", MssDirection::ToPool, MssValue::Pmtu),
        mss("10.9.0.7/32", MssDirection::FromPool, MssValue::Fixed(1360)),
        mss("fd00::/64", MssDirection::ToPool, MssValue::Fixed(1220)),
    ];
    for r in &rules {
        assert_eq!(mss_from_exprs(&mss_exprs(r)).as_ref(), Some(r));
        // A masquerade rule is not an MSS rule and vice versa.
        assert_eq!(rule_from_exprs(&mss_exprs(r)), None);
    }
    assert_eq!(
        mss_from_exprs(&masq_exprs(&rule("10.8.0.0/24", "eth0"))),
        None
    );
    // MSS only: table, chain forward, rules; no nat chain.
    let spec = TableRules {
        masquerade: None,
        mss: &rules,
    };
    let msgs = messages(&encode_table_batch("t", &spec, "x", 1).unwrap());
    assert_eq!(msgs.len(), spec.messages());
    let chains: Vec<_> = msgs
        .iter()
        .filter(|m| m.ty == (10 << 8) | u16::from(sys::NFT_MSG_NEWCHAIN))
        .collect();
    assert_eq!(chains.len(), 1);
    let attrs = Attrs::parse(chains[0].nf_attrs()).unwrap();
    assert_eq!(attrs.get(sys::NFTA_CHAIN_NAME).unwrap(), b"forward\0");
    assert_eq!(attrs.get(sys::NFTA_CHAIN_TYPE).unwrap(), b"filter\0");
    let hook = Attrs::parse(attrs.get(sys::NFTA_CHAIN_HOOK).unwrap()).unwrap();
    assert_eq!(hook.get(sys::NFTA_HOOK_HOOKNUM).unwrap(), &[0, 0, 0, 2]);
    assert_eq!(
        hook.get(sys::NFTA_HOOK_PRIORITY).unwrap(),
        &(-150i32).to_be_bytes()
    );
    let decoded: Vec<_> = msgs[5..9]
        .iter()
        .map(|m| mss_from_exprs(&rule_exprs(m)).unwrap())
        .collect();
    assert_eq!(decoded, rules);
    // Both chains.
    let masq = [rule("10.8.0.0/24", "eth0")];
    let both = TableRules {
        masquerade: Some(&masq),
        mss: &rules[..1],
    };
    let msgs = messages(&encode_table_batch("t", &both, "x", 1).unwrap());
    assert_eq!(msgs.len(), both.messages());
    assert_eq!(msgs.len(), 9);
    // Invalid input is refused before anything is sent.
    let mut bad = rules[0].clone();
    bad.pool = "10.8.0.1/24".parse().unwrap();
    let spec = TableRules {
        masquerade: None,
        mss: std::slice::from_ref(&bad),
    };
    assert!(matches!(
        encode_table_batch("t", &spec, "x", 1),
        Err(NftError::Invalid { .. })
    ));
}
