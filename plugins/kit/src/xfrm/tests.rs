#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use super::*;
use crate::netlink::consts::{NLMSG_DONE, NLMSG_ERROR, NLM_F_MULTI};
use crate::netlink::msg::{messages, nlmsg};
use crate::netlink::{dump_step, ours};

/// One datagram of a policy dump through the same steps as
/// [`dump`]: framing, sequence and port filter, dump end and errors,
/// then [`keep_policy`] with `keep`. True once the dump is complete.
fn parse_datagram_where(
    data: &[u8],
    seq: u32,
    port: u32,
    dir: Option<Dir>,
    keep: impl Fn(&RawPolicy<'_>) -> bool,
    out: &mut PolicyDump,
) -> Result<bool, XfrmError> {
    let msgs = messages(data).map_err(|e| malformed(e.to_string()))?;
    let mut interrupted = false;
    let mut failed = None;
    let done = dump_step::<Xfrm>(
        ours(msgs, |s| s == seq, port),
        "policy dump",
        &mut interrupted,
        |msg| {
            if failed.is_none() {
                failed = keep_policy(msg, dir, &keep, out).err();
            }
        },
    )?;
    match failed {
        Some(e) => Err(e),
        None => Ok(done),
    }
}

/// [`parse_datagram_where`] keeping every policy.
fn parse_datagram(
    data: &[u8],
    seq: u32,
    port: u32,
    dir: Option<Dir>,
    out: &mut Vec<XfrmPolicy>,
) -> Result<bool, XfrmError> {
    let mut dump = PolicyDump::from(std::mem::take(out));
    let done = parse_datagram_where(data, seq, port, dir, |_| true, &mut dump);
    *out = dump.kept;
    done
}

/// A policy as the kernel would encode it.
struct Fixture {
    info: Vec<u8>,
    attrs: Vec<u8>,
}

impl Fixture {
    fn v4(dir: u8, action: u8, priority: u32) -> Fixture {
        let mut info = vec![0u8; USERPOLICY_INFO_LEN];
        info[40..42].copy_from_slice(&AF_INET.to_ne_bytes());
        info[152..156].copy_from_slice(&priority.to_ne_bytes());
        info[156..160].copy_from_slice(&7u32.to_ne_bytes());
        info[160] = dir;
        info[161] = action;
        // lifetime cfg: "no limit"
        for i in 0..8 {
            let o = SELECTOR_LEN + 8 * i;
            info[o..o + 8].copy_from_slice(&u64::MAX.to_ne_bytes());
        }
        Fixture {
            info,
            attrs: Vec::new(),
        }
    }

    fn selector(
        mut self,
        src: [u8; 4],
        ps: u8,
        dst: [u8; 4],
        pd: u8,
        proto: u8,
        dport: u16,
    ) -> Self {
        self.info[0..4].copy_from_slice(&dst);
        self.info[16..20].copy_from_slice(&src);
        self.info[32..34].copy_from_slice(&dport.to_be_bytes());
        let mask: u16 = if dport == 0 { 0 } else { 0xffff };
        self.info[34..36].copy_from_slice(&mask.to_be_bytes());
        self.info[42] = pd;
        self.info[43] = ps;
        self.info[44] = proto;
        self
    }

    fn attr(mut self, ty: u16, v: &[u8]) -> Self {
        let len = 4 + v.len();
        self.attrs.extend_from_slice(&(len as u16).to_ne_bytes());
        self.attrs.extend_from_slice(&ty.to_ne_bytes());
        self.attrs.extend_from_slice(v);
        self.attrs.resize(align4(self.attrs.len()), 0);
        self
    }

    fn mark(self, value: u32, mask: u32) -> Self {
        let mut v = value.to_ne_bytes().to_vec();
        v.extend_from_slice(&mask.to_ne_bytes());
        self.attr(XFRMA_MARK, &v)
    }

    fn payload(&self) -> Vec<u8> {
        let mut p = self.info.clone();
        p.extend_from_slice(&self.attrs);
        p
    }
}

fn tmpl(proto: u8, optional: bool, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut t = vec![0u8; USER_TMPL_LEN];
    t[0..4].copy_from_slice(&dst);
    t[16..20].copy_from_slice(&0x1234u32.to_be_bytes());
    t[20] = proto;
    t[24..26].copy_from_slice(&AF_INET.to_ne_bytes());
    t[28..32].copy_from_slice(&src);
    t[44..48].copy_from_slice(&9u32.to_ne_bytes());
    t[48] = 0;
    t[50] = optional as u8;
    t[52..56].copy_from_slice(&u32::MAX.to_ne_bytes());
    t
}

#[test]
fn parses_guard_policy() {
    let f = Fixture::v4(1, 1, 2_147_483_647).mark(759_815, 0xffff_ffff);
    let p = parse_policy(&f.payload()).unwrap();
    assert_eq!(p.dir, Dir::Out);
    assert_eq!(p.action, Action::Block);
    assert_eq!(p.priority, 2_147_483_647);
    assert_eq!(p.index, 7);
    assert_eq!(p.family, AF_INET);
    assert_eq!(p.selector.dst, "0.0.0.0/0".parse::<IpNet>().unwrap());
    assert_eq!(
        p.mark,
        Some(Mark {
            value: 759_815,
            mask: 0xffff_ffff
        })
    );
    assert!(p.templates.is_empty());
    assert_eq!(p.ptype, PolicyType::Main);
    assert_eq!(p.lifetime.hard_use_expires_seconds, u64::MAX);
}

#[test]
fn a_security_context_and_an_offload_are_seen() {
    let plain = parse_policy(&Fixture::v4(1, 1, 10).payload()).unwrap();
    assert!(!plain.sec_ctx && !plain.offload);
    let f = Fixture::v4(1, 1, 10)
        .attr(XFRMA_SEC_CTX, &[0u8; 12])
        .attr(XFRMA_OFFLOAD_DEV, &[0u8; 8]);
    let p = parse_policy(&f.payload()).unwrap();
    assert!(p.sec_ctx && p.offload);
}

#[test]
fn parses_selector_ports_and_templates() {
    let mut tmpls = tmpl(PROTO_ESP, false, [10, 0, 0, 1], [10, 0, 0, 2]);
    tmpls.extend(tmpl(PROTO_AH, true, [10, 0, 0, 1], [10, 0, 0, 2]));
    let f = Fixture::v4(1, 0, 10)
        .selector([10, 0, 0, 1], 32, [10, 0, 0, 2], 32, PROTO_UDP, 6081)
        .attr(XFRMA_TMPL, &tmpls)
        .attr(XFRMA_IF_ID, &5u32.to_ne_bytes())
        .attr(XFRMA_POLICY_TYPE, &[1, 0, 0, 0]);
    let p = parse_policy(&f.payload()).unwrap();
    assert_eq!(p.selector.src, "10.0.0.1/32".parse::<IpNet>().unwrap());
    assert_eq!(p.selector.dst, "10.0.0.2/32".parse::<IpNet>().unwrap());
    assert_eq!((p.selector.proto, p.selector.dport), (PROTO_UDP, 6081));
    assert!(p.selector.matches_dport(6081) && !p.selector.matches_dport(4789));
    assert_eq!(p.templates.len(), 2);
    let t = &p.templates[0];
    assert!(t.requires_esp());
    assert_eq!(t.spi, 0x1234);
    assert_eq!(t.reqid, 9);
    assert_eq!(t.mode, Mode::Transport);
    assert_eq!(t.src, Some("10.0.0.1".parse().unwrap()));
    assert_eq!(t.dst, Some("10.0.0.2".parse().unwrap()));
    assert!(p.templates[1].optional && !p.templates[1].requires_esp());
    assert_eq!(p.if_id, Some(5));
    assert_eq!(p.ptype, PolicyType::Sub);
}

#[test]
fn an_ipv6_selector_reads_its_prefixes() {
    let mut f = Fixture::v4(1, 1, 1);
    f.info[40..42].copy_from_slice(&AF_INET6.to_ne_bytes());
    f.info[0] = 0xfd;
    f.info[42] = 8;
    let p = parse_policy(&f.payload()).unwrap();
    assert_eq!(p.selector.dst, "fd00::/8".parse::<IpNet>().unwrap());
    assert_eq!(p.selector.src, "::/0".parse::<IpNet>().unwrap());
}

#[test]
fn short_and_broken_buffers_are_errors_not_panics() {
    let good = Fixture::v4(1, 0, 0)
        .attr(XFRMA_TMPL, &tmpl(PROTO_ESP, false, [1; 4], [2; 4]))
        .mark(1, 1)
        .payload();
    for n in 0..good.len() {
        // Every prefix either parses (attributes dropped at a boundary) or errors.
        let _ = parse_policy(&good[..n]);
    }
    assert!(parse_policy(&good[..100]).is_err());
    // Bad prefix length.
    let mut f = Fixture::v4(1, 0, 0);
    f.info[42] = 33;
    assert!(parse_policy(&f.payload()).is_err());
    // Template array of an odd size.
    let f = Fixture::v4(1, 0, 0).attr(XFRMA_TMPL, &[0u8; 10]);
    assert!(parse_policy(&f.payload()).is_err());
    // Attribute length below its header.
    let mut p = Fixture::v4(1, 0, 0).payload();
    p.extend_from_slice(&[2, 0, 5, 0]);
    assert!(parse_policy(&p).is_err());
    // Datagram-level garbage.
    let mut out = Vec::new();
    assert!(parse_datagram(&[1, 2, 3], 1, 0, None, &mut out).is_err());
    let mut m = nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 1, 0, &good);
    m[0] = m[0].wrapping_add(40); // length beyond the datagram
    assert!(parse_datagram(&m, 1, 0, None, &mut out).is_err());
    assert!(parse_datagram(&nlmsg(3, 0, 1, 0, &[])[..8], 1, 0, None, &mut out).is_err());
}

#[test]
fn multipart_sequence_and_done() {
    let pol = Fixture::v4(1, 1, 5).payload();
    let mut d = nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 42, 7, &pol);
    d.extend(nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 41, 7, &pol)); // stale: skipped
    d.extend(nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 42, 8, &pol)); // not our port
    d.extend(nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 42, 7, &pol));
    let mut out = Vec::new();
    assert!(!parse_datagram(&d, 42, 7, None, &mut out).unwrap());
    assert_eq!(out.len(), 2);
    let done = nlmsg(NLMSG_DONE, NLM_F_MULTI, 42, 7, &0u32.to_ne_bytes());
    assert!(parse_datagram(&done, 42, 7, None, &mut out).unwrap());
    let err = nlmsg(NLMSG_ERROR, 0, 42, 7, &(-libc::EPERM).to_ne_bytes());
    match parse_datagram(&err, 42, 7, None, &mut out) {
        Err(XfrmError::Kernel { errno, .. }) => assert_eq!(errno, libc::EPERM),
        other => panic!("{other:?}"),
    }
}

#[test]
fn direction_filter_skips_before_parsing() {
    let out_pol = Fixture::v4(1, 1, 5).payload();
    let in_pol = Fixture::v4(0, 0, 5).payload();
    let mut d = nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 1, 0, &in_pol);
    d.extend(nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 1, 0, &out_pol));
    // A broken IN policy (bad prefix length) is not even looked at.
    let mut bad = Fixture::v4(0, 0, 5);
    bad.info[42] = 99;
    d.extend(nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 1, 0, &bad.payload()));
    let mut out = Vec::new();
    parse_datagram(&d, 1, 0, Some(Dir::Out), &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].dir, Dir::Out);
    assert!(parse_datagram(&d, 1, 0, None, &mut out).is_err());
}

#[test]
fn a_filtered_dump_counts_every_policy_of_its_direction_and_parses_only_those_kept() {
    let esp = tmpl(PROTO_ESP, false, [10, 0, 0, 1], [10, 0, 0, 2]);
    let kept = Fixture::v4(1, 0, 7).mark(5, 0xff).payload();
    let mut d = nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 1, 0, &kept);
    for (dir, priority) in [(1, 8), (1, 9), (0, 7), (2, 7)] {
        let p = Fixture::v4(dir, 0, priority)
            .attr(XFRMA_TMPL, &esp)
            .payload();
        d.extend(nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 1, 0, &p));
    }
    let mut out = PolicyDump::default();
    let keep = |p: &RawPolicy<'_>| p.priority() == 7;
    parse_datagram_where(&d, 1, 0, Some(Dir::Out), keep, &mut out).unwrap();
    assert_eq!(out.count, 3, "every OUT policy is counted");
    assert_eq!(out.kept, vec![parse_policy(&kept).unwrap()]);
    // A restarted dump starts counting again.
    let mut again = PolicyDump::default();
    parse_datagram_where(&d, 1, 0, None, |_| false, &mut again).unwrap();
    assert_eq!((again.count, again.kept.len()), (5, 0));
}

#[test]
fn a_policy_the_filter_would_skip_still_fails_the_dump_when_its_attributes_are_broken() {
    let mut broken = Fixture::v4(1, 0, 0).attr(XFRMA_TMPL, &[0u8; 63]).payload();
    let d = nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 1, 0, &broken);
    let mut out = PolicyDump::default();
    assert!(parse_datagram_where(&d, 1, 0, Some(Dir::Out), |_| false, &mut out).is_err());
    broken.truncate(100);
    let d = nlmsg(XFRM_MSG_NEWPOLICY, NLM_F_MULTI, 1, 0, &broken);
    assert!(parse_datagram_where(&d, 1, 0, Some(Dir::Out), |_| false, &mut out).is_err());
}

#[test]
fn a_policy_read_in_place_shows_what_its_parse_holds() {
    let mut tmpls = tmpl(PROTO_AH, false, [10, 0, 0, 1], [10, 0, 0, 2]);
    tmpls.extend(tmpl(PROTO_ESP, true, [10, 0, 0, 1], [10, 0, 0, 2]));
    let payloads = [
        Fixture::v4(1, 1, 2_147_483_647)
            .mark(759_815, 0xffff_ffff)
            .payload(),
        Fixture::v4(1, 0, 10)
            .selector([10, 0, 0, 1], 32, [10, 0, 0, 2], 32, PROTO_UDP, 6081)
            .attr(XFRMA_TMPL, &tmpls)
            .attr(XFRMA_IF_ID, &5u32.to_ne_bytes())
            .payload(),
    ];
    for payload in payloads {
        let raw = RawPolicy::new(&payload).unwrap();
        let p = parse_policy(&payload).unwrap();
        assert_eq!(raw.to_policy().unwrap(), p);
        assert_eq!(
            (raw.dir(), raw.action(), raw.priority(), raw.family()),
            (p.dir, p.action, p.priority, p.family)
        );
        assert_eq!(raw.selector().unwrap(), p.selector);
        assert_eq!(raw.mark(), p.mark);
        let templates: Vec<Template> = raw.templates().map(Result::unwrap).collect();
        assert_eq!(templates, p.templates);
    }
}

#[test]
fn a_mark_matches_under_its_mask_and_a_zero_mask_matches_all() {
    let m = Mark {
        value: 0x10,
        mask: 0xf0,
    };
    assert!(m.matches(0x1f) && !m.matches(0x20));
    assert!(Mark { value: 0, mask: 0 }.matches(12345));
}

#[test]
fn layout_matches_kernel() {
    assert_eq!(
        std::mem::size_of::<usize>(),
        8,
        "layouts assume a 64-bit target"
    );
}
