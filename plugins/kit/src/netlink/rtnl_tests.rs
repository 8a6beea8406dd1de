//! The rtnetlink codec against bytes: requests compared with what
//! `netlink-packet-route` 0.34 encoded for the same calls (captured before
//! it was removed), answers decoded from rows a 6.x kernel really sent
//! (captured from a throwaway netns), malformed rows refused without panics,
//! and a round trip through the kernel checked against `ip -j`.
//!
//! The byte literals are host (little-endian) order, as netlink is.

use super::consts::*;
use super::msg::MsgWriter;
use super::route::{encode, RouteSocket};
use super::rtnl::*;
use crate::link::{self, address_of, link_of, Address, Link};
use crate::route::{self, entry_of, RouteEntry, RouteSpec};
use crate::rule::{self, spec_of, RuleSpec};
use ipnet::IpNet;
use std::process::Command;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The request as [`RouteSocket`] sends it, with sequence number `seq`.
fn request(ty: u16, flags: u16, seq: u32, body: impl FnOnce(&mut MsgWriter)) -> Vec<u8> {
    let mut w = encode(ty, flags, body);
    assert!(!w.overflow);
    w.patch(8, &seq.to_ne_bytes());
    w.buf
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

const ADD: u16 = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;

fn route_add(r: &RouteSpec, flags: u16, seq: u32) -> Vec<u8> {
    request(RTM_NEWROUTE, flags, seq, |w| r.write(w, r.scope()))
}

fn route_del(r: &RouteSpec, seq: u32) -> Vec<u8> {
    request(RTM_DELROUTE, NLM_F_ACK, seq, |w| {
        r.write(w, RT_SCOPE_NOWHERE)
    })
}

#[cfg(target_endian = "little")]
#[test]
fn route_requests_are_the_bytes_netlink_packet_route_sent() {
    let mut a = RouteSpec::new(net("10.1.2.0/24"));
    a.gateway = Some("10.9.0.1".parse().unwrap());
    a.oif = Some(7);
    a.metric = Some(100);
    a.protocol = 94;
    assert_eq!(hex(&route_add(&a, ADD, 0x11223344)), "4400000018000506443322110000000002180000fe5e000100000000080001000a010200080005000a0900010800040007000000080006006400000008000f00fe000000");
    // Link scope, a table id above 255 (rtm_table 0, RTA_TABLE 1000), replace.
    let mut b = RouteSpec::new(net("10.1.2.3/32"));
    b.oif = Some(3);
    b.link_scope = true;
    b.table = 1000;
    b.protocol = 94;
    let replace = NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
    assert_eq!(hex(&route_add(&b, replace, 5)), "3400000018000505050000000000000002200000005efd0100000000080001000a010203080004000300000008000f00e8030000");
    // A default route: no RTA_DST; onlink in rtm_flags.
    let mut c = RouteSpec::new(net("0.0.0.0/0"));
    c.gateway = Some("169.254.1.1".parse().unwrap());
    c.oif = Some(2);
    c.onlink = true;
    c.table = 200;
    assert_eq!(hex(&route_add(&c, ADD, 6)), "3400000018000506060000000000000002000000c80000010400000008000500a9fe0101080004000200000008000f00c8000000");
    let mut d = RouteSpec::new(net("fd00:1::/64"));
    d.gateway = Some("fe80::1".parse().unwrap());
    d.oif = Some(9);
    d.protocol = 94;
    d.metric = Some(1024);
    assert_eq!(hex(&route_add(&d, ADD, 7)), "5c0000001800050607000000000000000a400000fe5e00010000000014000100fd00000100000000000000000000000014000500fe8000000000000000000000000000010800040009000000080006000004000008000f00fe000000");
    // Deletes: the same key, scope "no-where".
    assert_eq!(hex(&route_del(&b, 8)), "3400000019000500080000000000000002200000005eff0100000000080001000a010203080004000300000008000f00e8030000");
    assert_eq!(hex(&route_del(&d, 9)), "5c0000001900050009000000000000000a400000fe5eff010000000014000100fd00000100000000000000000000000014000500fe8000000000000000000000000000010800040009000000080006000004000008000f00fe000000");
    // Dumps: a bare rtmsg of the family.
    for (v6, seq, want) in [
        (
            false,
            10,
            "1c0000001a0001030a00000000000000020000000000000000000000",
        ),
        (
            true,
            11,
            "1c0000001a0001030b000000000000000a0000000000000000000000",
        ),
    ] {
        let h = RtMsg {
            family: family_of(v6),
            ..RtMsg::default()
        };
        assert_eq!(
            hex(&request(RTM_GETROUTE, NLM_F_DUMP, seq, |w| h.write(w))),
            want
        );
    }
}

#[cfg(target_endian = "little")]
#[test]
fn rule_requests_are_the_bytes_netlink_packet_route_sent() {
    let full = RuleSpec {
        v6: false,
        priority: 1000,
        from: Some(net("10.1.2.0/24")),
        to: Some(net("192.168.0.0/16")),
        iif: Some("eth0".into()),
        table: 100,
        protocol: 94,
        suppress_prefixlen: Some(31),
        ..RuleSpec::default()
    };
    let add = |r: &RuleSpec, seq| request(RTM_NEWRULE, ADD, seq, |w| r.write(w));
    assert_eq!(hex(&add(&full, 20)), "5800000020000506140000000000000002101800640000010000000008000600e803000008000f0064000000080002000a01020008000100c0a80000090003006574683000000000050015005e00000008000e001f000000");
    let del = request(RTM_DELRULE, NLM_F_ACK, 21, |w| full.write(w));
    assert_eq!(hex(&del), "5800000021000500150000000000000002101800640000010000000008000600e803000008000f0064000000080002000a01020008000100c0a80000090003006574683000000000050015005e00000008000e001f000000");
    let min = RuleSpec {
        v6: false,
        priority: 32000,
        from: None,
        to: None,
        iif: None,
        table: 1000,
        protocol: 0,
        suppress_prefixlen: None,
        ..RuleSpec::default()
    };
    assert_eq!(
        hex(&add(&min, 22)),
        "2c00000020000506160000000000000002000000000000010000000008000600007d000008000f00e8030000"
    );
    let v6 = RuleSpec {
        v6: true,
        priority: 5,
        from: Some(net("fd00::/8")),
        to: None,
        iif: Some("veth-abcdef012345".into()),
        table: 254,
        protocol: 94,
        suppress_prefixlen: None,
        ..RuleSpec::default()
    };
    assert_eq!(hex(&add(&v6, 23)), "600000002000050617000000000000000a000800fe00000100000000080006000500000008000f00fe00000014000200fd00000000000000000000000000000016000300766574682d616263646566303132333435000000050015005e000000");
    for (v6, seq, want) in [
        (
            false,
            24,
            "1c000000220001031800000000000000020000000000000000000000",
        ),
        (
            true,
            25,
            "1c0000002200010319000000000000000a0000000000000000000000",
        ),
    ] {
        let h = FibRuleHdr {
            family: family_of(v6),
            ..FibRuleHdr::default()
        };
        assert_eq!(
            hex(&request(RTM_GETRULE, NLM_F_DUMP, seq, |w| h.write(w))),
            want
        );
    }
}

#[cfg(target_endian = "little")]
#[test]
fn link_and_address_requests_are_the_bytes_netlink_packet_route_sent() {
    let dump = request(RTM_GETLINK, NLM_F_DUMP, 30, |w| {
        IfInfoMsg::default().write(w)
    });
    assert_eq!(
        hex(&dump),
        "20000000120001031e0000000000000000000000000000000000000000000000"
    );
    // By name: a GET without ACK (its one answer ends it), IFLA_IFNAME with
    // its NUL, padded.
    for (name, seq, want) in [("veth-pod0", 31, "30000000120001001f00000000000000000000000000000000000000000000000e000300766574682d706f6430000000"), ("lo", 32, "2800000012000100200000000000000000000000000000000000000000000000070003006c6f0000")] {
        let get = request(RTM_GETLINK, 0, seq, |w| {
            IfInfoMsg::default().write(w);
            w.attr_str(IFLA_IFNAME, name);
        });
        assert_eq!(hex(&get), want);
    }
    let dump = request(RTM_GETADDR, NLM_F_DUMP, 33, |w| {
        IfAddrMsg::default().write(w)
    });
    assert_eq!(
        hex(&dump),
        "180000001600010321000000000000000000000000000000"
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `ip route add 10.30.0.0/16 via 10.20.0.2 dev pg-a proto 94 metric 7
/// table 1000 src 10.20.0.1` as a dump row.
const ROUTE4_ROW: &str = "02100000fc5e00010000000008000f00e8030000080001000a1e00000800060007000000080007000a140001080005000a1400020800040003000000";
/// `ip -6 route add fd00:30::/48 via fd00:20::2 dev pg-a proto 94 metric 9`:
/// also RTA_CACHEINFO and RTA_PREF, which are skipped.
const ROUTE6_ROW: &str = "0a300000fe5e00010000000008000f00fe00000014000100fd000030000000000000000000000000080006000900000014000500fd000020000000000000000000000002080004000300000024000c0000000000000000000000000000000000000000000000000000000000000000000500140000000000";
/// `ip rule add priority 1000 from 10.1.2.0/24 to 192.168.0.0/16 iif pg-a
/// lookup 1000 proto 94 suppress_prefixlength 31`.
const RULE4_ROW: &str = "02101800fc0000010000000008000f00e803000008000e001f000000050015005e0000000900030070672d610000000008000600e803000008000100c0a80000080002000a010200";
/// The kernel's own `0: from all lookup local`: no FRA_PRIORITY, "no
/// suppression" as u32::MAX, protocol kernel.
const RULE4_LOCAL_ROW: &str =
    "02000000ff0000010000000008000f00ff00000008000e00ffffffff0500150002000000";
/// `ip -6 rule add priority 5 from fd00::/8 lookup 100`.
const RULE6_ROW: &str = "0a000800640000010000000008000f006400000008000e00ffffffff0500150000000000080006000500000014000200fd000000000000000000000000000000";
/// 10.20.0.1/24 on pg-a (index 3): IFA_ADDRESS, IFA_LOCAL, IFA_LABEL, ...
const ADDR4_ROW: &str = "0218800003000000080001000a140001080002000a1400010900030070672d6100000000080008008000000014000600ffffffffffffffff11a81f0011a81f00";
/// A link-local fe80::/64 on index 2: IFA_ADDRESS only.
const ADDR6_ROW: &str = "0a40c0fd0200000014000100fe800000000000006c9771fffe73cd1b14000600ffffffffffffffff11a81f0011a81f0008000800c000000005000b0003000000";
/// `lo` as a 6.x kernel lists it (1452 bytes: stats, af_spec, xdp ...).
const LO_ROW: &[&str] = &[
    "00000403010000004900010000000000070003006c6f000008000d00e803000005001000000000000500110000000000",
    "050043000100000008000400000001000800320000000000080033000000000008001b000000000008001e0000000000",
    "08003d000000000008001f000100000008002800ffff0000080029000000010008003a000000010008003f0000000100",
    "080040000000010008003b00f8ff070008003c00ffff0000080042000000000008002000010000000500210001000000",
    "080023000000000008002f00000000000800300000000000060044000000000006004500000000000500270000000000",
    "0a00010000000000000000000a0002000000000000000000cc0017000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000640007000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000c002b0005000200",
    "000000000c0006006e6f71756575650030031a008c000200880001000000000000000000000000000100000001000000",
    "010000000100000000000000010000000000000000000000000000000000000000000000010000000100000000000000",
    "00000000000000000000000000000000000000000000000000000000000000000000000010270000e803000000000000",
    "00000000000000000000000001000000a0020a00080001000000008014000500ffff00000fa81f0028720000e8030000",
    "f400020000000000400000000000010001000000010000000100000001000000ffffffffa00f0000e8030000ffffffff",
    "803a0900805101000300000058020000100000000000000001000000010000000100000060ea00000000000000000000",
    "00000000000000000000000000000000ffffffff000000000000000010270000e8030000010000000000000000000000",
    "010000000000000000000000010000000000000000000000000000000000000080ee3600000000000000000001000000",
    "00000000000000000000000000000000000000000004000000000000ffff0000ffffffff010000000000000000000000",
    "000000003401030026000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000000000000000000000000003c0006000700000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000140007000000000000000000",
    "0000000000000000050008000000000024000e0000000000000000000000000000000000000000000000000000000000",
    "0000000004003e8004004180",
];

#[test]
fn decodes_route_rows_the_kernel_sent() {
    let e = entry_of(&unhex(ROUTE4_ROW)).unwrap().unwrap();
    assert_eq!(
        e,
        RouteEntry {
            dst: net("10.30.0.0/16"),
            gateway: Some("10.20.0.2".parse().unwrap()),
            oif: Some(3),
            table: 1000,
            protocol: 94,
            metric: Some(7),
            scope: 0,
            kind: 1,
            prefsrc: Some("10.20.0.1".parse().unwrap()),
            multipath: Vec::new(),
        }
    );
    let e = entry_of(&unhex(ROUTE6_ROW)).unwrap().unwrap();
    assert_eq!(
        e,
        RouteEntry {
            dst: net("fd00:30::/48"),
            gateway: Some("fd00:20::2".parse().unwrap()),
            oif: Some(3),
            table: 254,
            protocol: 94,
            metric: Some(9),
            scope: 0,
            kind: 1,
            prefsrc: None,
            multipath: Vec::new(),
        }
    );
    // A row of another family (AF_MPLS) is not ours to read.
    let mut mpls = unhex(ROUTE4_ROW);
    mpls[0] = 28;
    assert_eq!(entry_of(&mpls).unwrap(), None);
    // A default route has no RTA_DST: 0.0.0.0/0.
    let h = RtMsg {
        family: AF_INET,
        table: 254,
        kind: RTN_UNICAST,
        ..RtMsg::default()
    };
    let mut w = MsgWriter::default();
    h.write(&mut w);
    w.attr(RTA_GATEWAY, &[10, 0, 0, 1]);
    let e = entry_of(&w.buf).unwrap().unwrap();
    assert_eq!((e.dst, e.table, e.oif), (net("0.0.0.0/0"), 254, None));
}

#[test]
fn decodes_rule_rows_the_kernel_sent() {
    assert_eq!(
        spec_of(&unhex(RULE4_ROW)).unwrap().unwrap(),
        RuleSpec {
            v6: false,
            priority: 1000,
            from: Some(net("10.1.2.0/24")),
            to: Some(net("192.168.0.0/16")),
            iif: Some("pg-a".into()),
            table: 1000,
            protocol: 94,
            suppress_prefixlen: Some(31),
            ..RuleSpec::default()
        }
    );
    assert_eq!(
        spec_of(&unhex(RULE4_LOCAL_ROW)).unwrap().unwrap(),
        RuleSpec {
            v6: false,
            priority: 0,
            from: None,
            to: None,
            iif: None,
            table: 255,
            protocol: 2,
            suppress_prefixlen: None,
            ..RuleSpec::default()
        }
    );
    assert_eq!(
        spec_of(&unhex(RULE6_ROW)).unwrap().unwrap(),
        RuleSpec {
            v6: true,
            priority: 5,
            from: Some(net("fd00::/8")),
            to: None,
            iif: None,
            table: 100,
            protocol: 0,
            suppress_prefixlen: None,
            ..RuleSpec::default()
        }
    );
}

#[test]
fn decodes_link_and_address_rows_the_kernel_sent() {
    let lo = unhex(&LO_ROW.concat());
    assert_eq!(lo.len(), 1452);
    assert_eq!(
        link_of(&lo).unwrap(),
        Some(Link {
            index: 1,
            name: "lo".into()
        })
    );
    assert_eq!(
        address_of(&unhex(ADDR4_ROW)).unwrap(),
        Some(Address {
            index: 3,
            addr: net("10.20.0.1/24")
        })
    );
    let a = address_of(&unhex(ADDR6_ROW)).unwrap().unwrap();
    assert_eq!((a.index, a.addr.prefix_len()), (2, 64));
    assert!(a.addr.addr().to_string().starts_with("fe80::"), "{a:?}");
    // IFA_LOCAL wins over IFA_ADDRESS (a point-to-point link's peer).
    let mut w = MsgWriter::default();
    IfAddrMsg {
        family: AF_INET,
        prefix_len: 32,
        index: 4,
    }
    .write(&mut w);
    w.attr(IFA_ADDRESS, &[10, 0, 0, 2]);
    w.attr(IFA_LOCAL, &[10, 0, 0, 1]);
    assert_eq!(
        address_of(&w.buf).unwrap().unwrap().addr,
        net("10.0.0.1/32")
    );
    // Neither: skipped, as is a prefix length the address cannot have.
    let mut w = MsgWriter::default();
    IfAddrMsg::default().write(&mut w);
    assert_eq!(address_of(&w.buf).unwrap(), None);
    let mut w = MsgWriter::default();
    IfAddrMsg {
        family: AF_INET,
        prefix_len: 40,
        index: 4,
    }
    .write(&mut w);
    w.attr(IFA_LOCAL, &[10, 0, 0, 1]);
    assert_eq!(address_of(&w.buf).unwrap(), None);
}

/// Malformed kernel data is an error or a skipped row, never a panic:
/// every truncation and a corrupted length byte of every captured row, and
/// attributes of the wrong size.
#[test]
fn malformed_rows_are_errors_not_panics() {
    let lo = unhex(&LO_ROW.concat());
    let rows: Vec<Vec<u8>> = [
        ROUTE4_ROW, ROUTE6_ROW, RULE4_ROW, RULE6_ROW, ADDR4_ROW, ADDR6_ROW,
    ]
    .iter()
    .map(|r| unhex(r))
    .chain([lo])
    .collect();
    for row in &rows {
        for cut in 0..row.len() {
            let part = &row[..cut];
            let _ = entry_of(part);
            let _ = spec_of(part);
            let _ = link_of(part);
            let _ = address_of(part);
        }
        for at in 0..row.len() {
            let mut bad = row.clone();
            bad[at] = bad[at].wrapping_add(0x81);
            let _ = entry_of(&bad);
            let _ = spec_of(&bad);
            let _ = link_of(&bad);
            let _ = address_of(&bad);
        }
    }
    // A header cut short is an error naming it.
    let e = entry_of(&unhex(ROUTE4_ROW)[..11]).unwrap_err();
    assert_eq!(
        e,
        crate::ParseError::Truncated {
            what: "rtmsg",
            got: 11,
            want: 12
        }
    );
    assert!(e.to_string().contains("rtmsg truncated"), "{e}");
    let named = |e: crate::ParseError, what: &str| e.to_string().contains(what);
    assert!(named(link_of(&[0; 15]).unwrap_err(), "ifinfomsg"));
    assert!(named(address_of(&[0; 7]).unwrap_err(), "ifaddrmsg"));
    assert!(named(spec_of(&[0; 3]).unwrap_err(), "fib_rule_hdr"));
    // An attribute running past the row.
    let mut r = unhex(ROUTE4_ROW);
    r.truncate(r.len() - 2);
    assert!(entry_of(&r).is_err());
    // Attributes of the wrong size for what they carry.
    let h = RtMsg {
        family: AF_INET,
        ..RtMsg::default()
    };
    for (ty, v) in [
        (RTA_OIF, &[1u8, 0][..]),
        (RTA_GATEWAY, &[0u8; 16][..]),
        (RTA_DST, &[10u8, 0, 0][..]),
        (RTA_TABLE, &[0u8; 8][..]),
    ] {
        let mut w = MsgWriter::default();
        h.write(&mut w);
        w.attr(ty, v);
        assert!(entry_of(&w.buf).is_err(), "attribute {ty}");
    }
    let mut w = MsgWriter::default();
    FibRuleHdr {
        family: AF_INET,
        ..FibRuleHdr::default()
    }
    .write(&mut w);
    w.attr(FRA_PROTOCOL, &[1, 2]);
    assert!(named(spec_of(&w.buf).unwrap_err(), "FRA_PROTOCOL"));
    let mut w = MsgWriter::default();
    IfAddrMsg::default().write(&mut w);
    w.attr(IFA_LOCAL, &[1, 2, 3, 4, 5]);
    assert!(named(address_of(&w.buf).unwrap_err(), "IFA_LOCAL"));
}

/// Our numbers are the UAPI's, where libc carries a copy of them (the
/// FRA_* ones are checked by the request bytes above).
#[test]
fn constants_match_libc() {
    assert_eq!(RTM_NEWLINK, libc::RTM_NEWLINK);
    assert_eq!(RTM_GETLINK, libc::RTM_GETLINK);
    assert_eq!(RTM_NEWADDR, libc::RTM_NEWADDR);
    assert_eq!(RTM_GETADDR, libc::RTM_GETADDR);
    assert_eq!(RTM_NEWROUTE, libc::RTM_NEWROUTE);
    assert_eq!(RTM_DELROUTE, libc::RTM_DELROUTE);
    assert_eq!(RTM_GETROUTE, libc::RTM_GETROUTE);
    assert_eq!(RTM_NEWRULE, libc::RTM_NEWRULE);
    assert_eq!(RTM_DELRULE, libc::RTM_DELRULE);
    assert_eq!(RTM_GETRULE, libc::RTM_GETRULE);
    assert_eq!(RTA_DST, libc::RTA_DST);
    assert_eq!(RTA_OIF, libc::RTA_OIF);
    assert_eq!(RTA_GATEWAY, libc::RTA_GATEWAY);
    assert_eq!(RTA_PRIORITY, libc::RTA_PRIORITY);
    assert_eq!(RTA_PREFSRC, libc::RTA_PREFSRC);
    assert_eq!(RTA_TABLE, libc::RTA_TABLE);
    assert_eq!(RT_TABLE_UNSPEC, libc::RT_TABLE_UNSPEC);
    assert_eq!(RTN_UNICAST, libc::RTN_UNICAST);
    assert_eq!(RT_SCOPE_UNIVERSE, libc::RT_SCOPE_UNIVERSE);
    assert_eq!(RT_SCOPE_LINK, libc::RT_SCOPE_LINK);
    assert_eq!(RT_SCOPE_NOWHERE, libc::RT_SCOPE_NOWHERE);
    assert_eq!(IFA_ADDRESS, libc::IFA_ADDRESS);
    assert_eq!(IFA_LOCAL, libc::IFA_LOCAL);
    assert_eq!(i32::from(AF_INET), libc::AF_INET);
    assert_eq!(i32::from(AF_INET6), libc::AF_INET6);
    assert_eq!(NLM_F_REPLACE, libc::NLM_F_REPLACE as u16);
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn ip_json(args: &[&str]) -> Vec<serde_json::Value> {
    let mut a = vec!["-j"];
    a.extend_from_slice(args);
    serde_json::from_str(&ip(&a)).unwrap()
}

/// The codec against the kernel, in a throwaway netns of a thread of its
/// own (root; `ip` forked from that thread runs in it too): links,
/// addresses, routes and rules written and read by the kit, checked
/// against what `ip -j` lists.
#[test]
fn round_trips_through_the_kernel() {
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        kernel_round_trip();
    })
    .join()
    .unwrap();
}

fn kernel_round_trip() {
    ip(&["link", "set", "lo", "up"]);
    ip(&[
        "link", "add", "pg-a", "type", "veth", "peer", "name", "pg-b",
    ]);
    ip(&["link", "set", "pg-a", "up"]);
    ip(&["link", "set", "pg-b", "up"]);
    ip(&["addr", "add", "10.20.0.1/24", "dev", "pg-a"]);
    ip(&["addr", "add", "fd00:20::1/64", "dev", "pg-a", "nodad"]);
    let mut s = RouteSocket::new().unwrap();

    // Links and addresses: the same as ip's.
    let links = link::list(&mut s).unwrap();
    // lo and the veth pair, plus whatever fallback tunnels (tunl0, sit0 ...)
    // the host's loaded modules put into every new netns.
    let ip_links = ip_json(&["link", "show"]);
    assert_eq!(links.len(), ip_links.len(), "{links:?} vs {ip_links:?}");
    for l in ip_links {
        let name = l["ifname"].as_str().unwrap();
        let index = l["ifindex"].as_u64().unwrap() as u32;
        assert!(
            links.contains(&Link {
                index,
                name: name.into()
            }),
            "{name} in {links:?}"
        );
        assert_eq!(link::index_of(&mut s, name).unwrap(), index);
    }
    let err = link::index_of(&mut s, "pg-nothing").unwrap_err();
    assert!(
        matches!(err, crate::Error::NoSuchLink(ref n) if n == "pg-nothing"),
        "{err}"
    );
    let pg_a = link::index_of(&mut s, "pg-a").unwrap();
    let addrs = link::addresses(&mut s).unwrap();
    for a in ip_json(&["addr", "show"]) {
        let index = a["ifindex"].as_u64().unwrap() as u32;
        for info in a["addr_info"].as_array().unwrap() {
            let addr = net(&format!(
                "{}/{}",
                info["local"].as_str().unwrap(),
                info["prefixlen"].as_u64().unwrap()
            ));
            assert!(
                addrs.contains(&Address { index, addr }),
                "{addr} in {addrs:?}"
            );
        }
    }
    assert!(addrs.contains(&Address {
        index: pg_a,
        addr: net("10.20.0.1/24")
    }));
    assert!(addrs.contains(&Address {
        index: 1,
        addr: net("::1/128")
    }));
    // One family's dump is the both-family dump's rows of that family.
    for v6 in [false, true] {
        let one: Vec<Address> = addrs
            .iter()
            .filter(|a| a.addr.addr().is_ipv6() == v6)
            .cloned()
            .collect();
        assert!(
            !one.is_empty(),
            "no {} address",
            if v6 { "IPv6" } else { "IPv4" }
        );
        assert_eq!(link::addresses_of(&mut s, v6).unwrap(), one);
    }

    // Routes: every kind of spec the kit writes, listed back by ip and by
    // us; deleted once (true), then gone (false).
    let mut specs = Vec::new();
    let mut a = RouteSpec::new(net("10.30.0.0/16"));
    a.gateway = Some("10.20.0.2".parse().unwrap());
    a.oif = Some(pg_a);
    a.metric = Some(7);
    a.protocol = 94;
    a.table = 1000;
    specs.push(a);
    let mut b = RouteSpec::new(net("10.40.0.7/32"));
    b.oif = Some(pg_a);
    b.link_scope = true;
    b.protocol = 94;
    specs.push(b);
    let mut c = RouteSpec::new(net("0.0.0.0/0"));
    c.gateway = Some("169.254.1.1".parse().unwrap());
    c.oif = Some(pg_a);
    c.onlink = true;
    c.table = 200;
    c.protocol = 94;
    specs.push(c);
    let mut d = RouteSpec::new(net("fd00:30::/48"));
    d.gateway = Some("fd00:20::2".parse().unwrap());
    d.oif = Some(pg_a);
    d.metric = Some(9);
    d.protocol = 94;
    specs.push(d);
    for r in &specs {
        route::add(&mut s, r, false).unwrap();
        // EEXIST without replace, fine with it.
        assert!(route::add(&mut s, r, false).is_err());
        route::add(&mut s, r, true).unwrap();
    }
    let listed = route::list_all(&mut s).unwrap();
    for r in &specs {
        let e = route::find(&listed, r).unwrap_or_else(|| panic!("{r:?} in {listed:?}"));
        let mut want = RouteEntry::from(r);
        want.metric = r.metric.or(e.metric); // v6 routes get the kernel's default 1024
        assert_eq!(*e, want);
    }
    // One table's dump is the all-table dump's rows of that table (main,
    // local, and ids on both sides of 255).
    for v6 in [false, true] {
        for table in [route::TABLE_MAIN, 255, 200, 1000] {
            let want: Vec<RouteEntry> = route::list(&mut s, v6)
                .unwrap()
                .into_iter()
                .filter(|e| e.table == table)
                .collect();
            assert_eq!(route::list_table(&mut s, v6, table).unwrap(), want);
        }
    }
    // ... and the kernel filtered it (rows as they arrive, none dropped).
    for table in [route::TABLE_MAIN, 255, 1000] {
        let rows = s
            .rows(
                RTM_GETROUTE,
                NLM_F_DUMP,
                RTM_NEWROUTE,
                "list routes",
                |w| route::write_table_dump(w, false, table),
                route::entry_of,
            )
            .unwrap();
        assert!(
            !rows.is_empty() && rows.iter().all(|e| e.table == table),
            "{table}: {rows:?}"
        );
    }
    assert!(!route::list_table(&mut s, false, 1000).unwrap().is_empty());
    assert!(!route::list_table(&mut s, false, 200).unwrap().is_empty());
    let ours: Vec<&RouteEntry> = listed.iter().filter(|e| e.protocol == 94).collect();
    let ip4 = ip_json(&["-4", "route", "show", "table", "all", "proto", "94"]);
    let ip6 = ip_json(&["-6", "route", "show", "table", "all", "proto", "94"]);
    assert_eq!(
        ours.len(),
        ip4.len() + ip6.len(),
        "{ours:?} vs {ip4:?} {ip6:?}"
    );
    assert_eq!(ours.len(), specs.len());
    // What only ip shows: the onlink flag and the link scope were sent.
    let shown = |dst: &str| ip4.iter().find(|j| j["dst"] == dst).unwrap().clone();
    assert_eq!(shown("default")["flags"], serde_json::json!(["onlink"]));
    assert_eq!(shown("10.40.0.7")["scope"], "link");
    // A multipath route lists its next hops' gateways, in both families
    // (IPv6 next hops come back as RTA_MULTIPATH too).
    ip(&[
        "route",
        "add",
        "10.50.0.0/16",
        "nexthop",
        "via",
        "10.20.0.2",
        "dev",
        "pg-a",
        "nexthop",
        "via",
        "10.20.0.3",
        "dev",
        "pg-a",
    ]);
    ip(&[
        "-6",
        "route",
        "add",
        "fd00:50::/48",
        "nexthop",
        "via",
        "fd00:20::2",
        "dev",
        "pg-a",
        "nexthop",
        "via",
        "fd00:20::3",
        "dev",
        "pg-a",
    ]);
    let listed_now = route::list_all(&mut s).unwrap();
    for (dst, hops) in [
        ("10.50.0.0/16", ["10.20.0.2", "10.20.0.3"]),
        ("fd00:50::/48", ["fd00:20::2", "fd00:20::3"]),
    ] {
        let e = listed_now.iter().find(|e| e.dst == net(dst)).unwrap();
        let want: Vec<std::net::IpAddr> = hops.iter().map(|h| h.parse().unwrap()).collect();
        assert_eq!((e.gateway, &e.multipath), (None, &want), "{e:?}");
        assert_eq!(e.gateways().collect::<Vec<_>>(), want);
    }
    ip(&["route", "del", "10.50.0.0/16"]);
    ip(&["-6", "route", "del", "fd00:50::/48"]);
    // The kernel's own routes decode too (local table, prefsrc).
    assert!(listed.iter().any(|e| e.table == 255
        && e.dst == net("10.20.0.1/32")
        && e.prefsrc == Some("10.20.0.1".parse().unwrap())
        && e.route_type() == route::RouteType::LOCAL));
    for r in &specs {
        assert!(route::del(&mut s, r).unwrap(), "{r:?}");
        assert!(!route::del(&mut s, r).unwrap(), "{r:?}");
    }
    assert!(route::list_all(&mut s)
        .unwrap()
        .iter()
        .all(|e| e.protocol != 94));

    // Rules: every selector, both families.
    let full = RuleSpec {
        v6: false,
        priority: 1000,
        from: Some(net("10.1.2.0/24")),
        to: Some(net("192.168.0.0/16")),
        iif: Some("pg-a".into()),
        table: 1000,
        protocol: 94,
        suppress_prefixlen: Some(31),
        ..RuleSpec::default()
    };
    let v6 = RuleSpec {
        v6: true,
        priority: 5,
        from: Some(net("fd00::/8")),
        to: None,
        iif: None,
        table: 100,
        protocol: 94,
        suppress_prefixlen: None,
        ..RuleSpec::default()
    };
    for r in [&full, &v6] {
        rule::add(&mut s, r).unwrap();
        let listed = rule::list(&mut s, r.v6).unwrap();
        assert_eq!(
            listed.iter().filter(|l| l == &r).count(),
            1,
            "{r:?} in {listed:?}"
        );
        let fam = if r.v6 { "-6" } else { "-4" };
        let shown = ip_json(&[fam, "rule", "show"]);
        assert_eq!(listed.len(), shown.len(), "{listed:?} vs {shown:?}");
        let p = shown
            .iter()
            .find(|j| j["priority"].as_u64() == Some(u64::from(r.priority)))
            .unwrap();
        assert_eq!(
            p["table"].as_str(),
            Some(r.table.to_string().as_str()),
            "{p}"
        );
        assert!(rule::del(&mut s, r).unwrap());
        assert!(!rule::del(&mut s, r).unwrap());
        assert!(!rule::list(&mut s, r.v6)
            .unwrap()
            .iter()
            .any(|l| l.matches(r)));
    }

    // A protocol selector and a rule that drops: what strict routing puts
    // before an IPv6 pod's table (ICMPv6 to link-local, the rest dropped).
    let icmp6 = RuleSpec {
        v6: true,
        priority: 95,
        to: Some(net("fe80::/10")),
        iif: Some("pg-a".into()),
        table: 255,
        protocol: 94,
        ip_proto: Some(58),
        ..RuleSpec::default()
    };
    let drop = RuleSpec {
        v6: true,
        priority: 96,
        to: Some(net("fe80::/10")),
        iif: Some("pg-a".into()),
        protocol: 94,
        action: rule::RuleAction::Blackhole,
        ..RuleSpec::default()
    };
    for r in [&icmp6, &drop] {
        rule::add(&mut s, r).unwrap();
    }
    let listed = rule::list(&mut s, true).unwrap();
    for r in [&icmp6, &drop] {
        assert_eq!(
            listed.iter().filter(|l| l == &r).count(),
            1,
            "{r:?} in {listed:?}"
        );
    }
    // Told apart from each other and from a plain lookup of the same prefix.
    assert!(
        !icmp6.matches(&drop)
            && !icmp6.matches(&RuleSpec {
                ip_proto: None,
                ..icmp6.clone()
            })
    );
    let shown = ip_json(&["-6", "rule", "show"]);
    let at = |p: u64| {
        shown
            .iter()
            .find(|j| j["priority"].as_u64() == Some(p))
            .unwrap()
            .clone()
    };
    assert_eq!(at(95)["ipproto"], "ipv6-icmp", "{shown:?}");
    assert_eq!(at(95)["table"], "local", "{shown:?}");
    assert_eq!(at(96)["action"], "blackhole", "{shown:?}");
    for r in [&icmp6, &drop] {
        assert!(rule::del(&mut s, r).unwrap(), "{r:?}");
        assert!(!rule::del(&mut s, r).unwrap(), "{r:?}");
    }

    // Rules with fields a RuleSpec does not hold are listed with them, as
    // `ip rule` words; the kernel's own rules are plain.
    let listed = rule::list_all_fields(&mut s, false).unwrap();
    assert!(listed.iter().all(rule::ListedRule::is_plain), "{listed:?}");
    /// `ip rule add` words, pref, then what the listing must say (`not`,
    /// the other selectors, the action, and RuleSpec's ipproto).
    type Case<'a> = (
        &'a [&'a str],
        u32,
        bool,
        &'a [&'a str],
        Option<&'a str>,
        Option<u8>,
    );
    let cases: [Case; 5] = [
        (
            &["fwmark", "0x10/0xff", "lookup", "100"],
            50,
            false,
            &["fwmark 0x10/0xff"],
            None,
            None,
        ),
        (
            &["not", "from", "10.8.0.0/24", "lookup", "100"],
            60,
            true,
            &[],
            None,
            None,
        ),
        (
            &["from", "10.9.0.0/24", "blackhole"],
            70,
            false,
            &[],
            Some("blackhole"),
            None,
        ),
        (
            &["oif", "pg-a", "tos", "0x10", "lookup", "100"],
            80,
            false,
            &["oif pg-a", "tos 0x10"],
            None,
            None,
        ),
        (
            &[
                "uidrange", "100-200", "ipproto", "tcp", "dport", "443", "goto", "100",
            ],
            90,
            false,
            &["uidrange 100-200", "dport 443-443"],
            Some("goto 100"),
            Some(6),
        ),
    ];
    for (words, pref, invert, selectors, action, ip_proto) in cases {
        let mut args = vec!["rule", "add"];
        args.extend_from_slice(words);
        let pref_s = pref.to_string();
        args.extend_from_slice(&["pref", &pref_s]);
        ip(&args);
        let listed = rule::list_all_fields(&mut s, false).unwrap();
        let l = listed.iter().find(|l| l.spec.priority == pref).unwrap();
        // Newer kernels also list the port's mask (FRA_DPORT_MASK).
        let mut got: Vec<String> = l
            .selectors
            .iter()
            .filter(|w| w.as_str() != "dport_mask 0xffff")
            .cloned()
            .collect();
        got.sort();
        let mut want: Vec<String> = selectors.iter().map(|w| w.to_string()).collect();
        want.sort();
        assert_eq!(
            (l.invert, got, l.action().as_deref(), l.spec.ip_proto),
            (invert, want, action, ip_proto),
            "{words:?}: {l:?}"
        );
        assert!(!l.is_plain());
    }

    // What a delete takes: the kernel compares only the fields the request
    // carries and deletes the first rule that agrees. An ipproto rule
    // listed before a plain one of the same preference is taken for it; a
    // blackhole rule never is; a request without a source takes a rule
    // with one. RuleSpec::delete_takes says the same.
    for words in [
        &[
            "from",
            "10.5.0.0/24",
            "ipproto",
            "tcp",
            "lookup",
            "100",
            "pref",
            "110",
        ][..],
        &["from", "10.5.0.0/24", "lookup", "100", "pref", "110"],
        &["from", "10.9.0.0/24", "blackhole", "pref", "120"],
        &["from", "10.9.0.0/24", "lookup", "100", "pref", "120"],
        &["from", "10.6.0.0/24", "lookup", "100", "pref", "130"],
    ] {
        let mut args = vec!["rule", "add"];
        args.extend_from_slice(words);
        ip(&args);
    }
    let at = |s: &mut RouteSocket, pref: u32| -> Vec<RuleSpec> {
        let listed = rule::list(s, false).unwrap();
        listed.into_iter().filter(|r| r.priority == pref).collect()
    };
    let [tcp, plain] = &at(&mut s, 110)[..] else {
        panic!("two rules at 110")
    };
    assert_eq!((tcp.ip_proto, plain.ip_proto), (Some(6), None));
    assert!(plain.delete_takes(tcp) && !tcp.delete_takes(plain));
    assert!(rule::del(&mut s, plain).unwrap());
    assert_eq!(
        at(&mut s, 110),
        std::slice::from_ref(plain),
        "the tcp rule went"
    );
    let [blackhole, lookup] = &at(&mut s, 120)[..] else {
        panic!("two rules at 120")
    };
    assert!(!lookup.delete_takes(blackhole) && !blackhole.delete_takes(lookup));
    assert!(rule::del(&mut s, lookup).unwrap());
    assert_eq!(at(&mut s, 120), std::slice::from_ref(blackhole));
    let [six] = &at(&mut s, 130)[..] else {
        panic!("one rule at 130")
    };
    let all = RuleSpec {
        from: None,
        ..six.clone()
    };
    assert!(all.delete_takes(six) && !six.delete_takes(&all));
    assert!(rule::del(&mut s, &all).unwrap());
    assert_eq!(at(&mut s, 130), [], "the 10.6.0.0/24 rule went");
}
