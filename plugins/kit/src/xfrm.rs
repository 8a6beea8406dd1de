//! XFRM policies over netlink (read-only).
//!
//! A small synchronous NETLINK_XFRM client that dumps the policy database of
//! the netns the calling thread is in (`XFRM_MSG_GETPOLICY` + `NLM_F_DUMP`).
//! It never asks for SAs: SA dumps carry keys, and nothing here needs them.
//!
//! Parsing is bounds-checked everywhere (`get`, never indexing) so a short or
//! malformed message is an error, not a panic. Layouts are those of the
//! kernel's uapi `<linux/xfrm.h>` on 64-bit targets (`xfrm_userpolicy_info`
//! is 168 bytes there; 32-bit x86 lays it out differently).

use crate::netlink::consts::{NLMSG_HDRLEN as NLMSG_HDR_LEN, NLM_F_DUMP, NLM_F_REQUEST};
use crate::netlink::msg::{align4, Msg};
use crate::netlink::{DumpEvent, NetlinkFamily, Socket, Xfrm};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

const XFRM_MSG_NEWPOLICY: u16 = 0x13;
const XFRM_MSG_GETPOLICY: u16 = 0x15;

const XFRMA_TMPL: u16 = 5;
const XFRMA_POLICY_TYPE: u16 = 16;
const XFRMA_MARK: u16 = 21;
const XFRMA_IF_ID: u16 = 31;
use crate::netlink::consts::NLA_TYPE_MASK;

const SELECTOR_LEN: usize = 56;
const USERPOLICY_INFO_LEN: usize = 168;
const USER_TMPL_LEN: usize = 64;
/// `xfrm_userpolicy_info.dir`.
const DIR_OFFSET: usize = 160;

const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;

/// Refuse to hold more than this many policies (a broken or hostile table).
pub const MAX_POLICIES: usize = 1 << 20;
/// Timeout used by [`dump_policies`]: the kit's one netlink timeout.
pub const DEFAULT_TIMEOUT: Duration = crate::netlink::DEFAULT_TIMEOUT;

/// IPPROTO_ESP: the only template protocol that encrypts.
pub const PROTO_ESP: u8 = 50;
pub const PROTO_AH: u8 = 51;
pub const PROTO_UDP: u8 = 17;

/// Errors of the XFRM code: the kit's one error type (`family` "xfrm").
pub type XfrmError = crate::Error;

const XFRM: &str = <Xfrm as NetlinkFamily>::NAME;

fn malformed(what: impl Into<String>) -> XfrmError {
    XfrmError::Protocol {
        family: XFRM,
        object: "policy dump".into(),
        reason: what.into(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    In,
    Out,
    Fwd,
    #[serde(untagged)]
    Other(u8),
}

impl From<u8> for Dir {
    fn from(v: u8) -> Dir {
        match v {
            0 => Dir::In,
            1 => Dir::Out,
            2 => Dir::Fwd,
            o => Dir::Other(o),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Block,
    #[serde(untagged)]
    Other(u8),
}

impl From<u8> for Action {
    fn from(v: u8) -> Action {
        match v {
            0 => Action::Allow,
            1 => Action::Block,
            o => Action::Other(o),
        }
    }
}

/// `XFRMA_POLICY_TYPE`; absent means main.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyType {
    Main,
    Sub,
    #[serde(untagged)]
    Other(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Transport,
    Tunnel,
    #[serde(untagged)]
    Other(u8),
}

impl From<u8> for Mode {
    fn from(v: u8) -> Mode {
        match v {
            0 => Mode::Transport,
            1 => Mode::Tunnel,
            o => Mode::Other(o),
        }
    }
}

/// `struct xfrm_selector`. Ports are host order here; a mask of 0 matches any port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Selector {
    pub src: IpNet,
    pub dst: IpNet,
    pub proto: u8,
    pub sport: u16,
    pub sport_mask: u16,
    pub dport: u16,
    pub dport_mask: u16,
    pub ifindex: i32,
    pub user: u32,
}

impl Selector {
    /// Whether a packet to destination port `port` can match this selector.
    pub fn matches_dport(&self, port: u16) -> bool {
        (self.dport ^ port) & self.dport_mask == 0
    }
}

/// `struct xfrm_lifetime_cfg` (limits; `u64::MAX` means none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct LifetimeCfg {
    pub soft_byte_limit: u64,
    pub hard_byte_limit: u64,
    pub soft_packet_limit: u64,
    pub hard_packet_limit: u64,
    pub soft_add_expires_seconds: u64,
    pub hard_add_expires_seconds: u64,
    pub soft_use_expires_seconds: u64,
    pub hard_use_expires_seconds: u64,
}

/// `struct xfrm_lifetime_cur`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct LifetimeCur {
    pub bytes: u64,
    pub packets: u64,
    pub add_time: u64,
    pub use_time: u64,
}

/// `XFRMA_MARK`: a policy matches packets whose `skb->mark & mask == value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mark {
    pub value: u32,
    pub mask: u32,
}

impl Mark {
    pub fn matches(&self, skb_mark: u32) -> bool {
        skb_mark & self.mask == self.value
    }
}

/// `struct xfrm_user_tmpl`: what the kernel needs an SA for before it lets a packet out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Template {
    /// IPPROTO_ESP (50), IPPROTO_AH (51) or IPPROTO_COMP (108).
    pub proto: u8,
    pub family: u16,
    /// `None` when the address family is not IPv4/IPv6 (e.g. left to the selector).
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    pub spi: u32,
    pub reqid: u32,
    pub mode: Mode,
    pub share: u8,
    /// An optional template (`level use`) is skipped when no SA exists.
    pub optional: bool,
    pub aalgos: u32,
    pub ealgos: u32,
    pub calgos: u32,
}

impl Template {
    /// A template that forces ESP: the packet cannot leave without encryption.
    pub fn requires_esp(&self) -> bool {
        self.proto == PROTO_ESP && !self.optional
    }
}

/// One entry of the kernel's SPD, as `ip xfrm policy` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct XfrmPolicy {
    pub dir: Dir,
    pub action: Action,
    pub priority: u32,
    pub index: u32,
    /// The selector's address family (AF_INET 2, AF_INET6 10).
    pub family: u16,
    pub selector: Selector,
    pub lifetime: LifetimeCfg,
    pub current: LifetimeCur,
    pub flags: u8,
    pub share: u8,
    pub ptype: PolicyType,
    pub mark: Option<Mark>,
    pub if_id: Option<u32>,
    pub templates: Vec<Template>,
}

/// Dump every policy of the calling thread's netns (main and sub types),
/// waiting at most [`DEFAULT_TIMEOUT`].
pub fn dump_policies() -> Result<Vec<XfrmPolicy>, XfrmError> {
    dump_policies_timeout(DEFAULT_TIMEOUT)
}

/// As [`dump_policies`], bounded by `timeout` in total.
pub fn dump_policies_timeout(timeout: Duration) -> Result<Vec<XfrmPolicy>, XfrmError> {
    dump(timeout, None)
}

/// As [`dump_policies_timeout`], keeping only the policies of direction `dir`.
/// The direction is checked before a policy is parsed, which matters on nodes
/// with thousands of per-peer policies.
pub fn dump_policies_dir(dir: Dir, timeout: Duration) -> Result<Vec<XfrmPolicy>, XfrmError> {
    dump(timeout, Some(dir))
}

fn dump(timeout: Duration, dir: Option<Dir>) -> Result<Vec<XfrmPolicy>, XfrmError> {
    let mut sock = Socket::<Xfrm>::with_timeout(timeout)?;
    let mut policies = Vec::new();
    sock.dump_each("policy dump", dump_request, |event| match event {
        DumpEvent::Restart => {
            policies.clear();
            Ok(())
        }
        DumpEvent::Row(msg) => keep_policy(&msg, dir, &mut policies),
    })?;
    Ok(policies)
}

fn dump_request(seq: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(NLMSG_HDR_LEN);
    m.extend_from_slice(&(NLMSG_HDR_LEN as u32).to_ne_bytes());
    m.extend_from_slice(&XFRM_MSG_GETPOLICY.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m
}

/// One row of the dump: a policy of direction `dir` (if given) is parsed
/// into `out`. The direction is checked before parsing.
fn keep_policy(msg: &Msg, dir: Option<Dir>, out: &mut Vec<XfrmPolicy>) -> Result<(), XfrmError> {
    if msg.ty != XFRM_MSG_NEWPOLICY {
        return Ok(());
    }
    let policy_dir = msg.payload.get(DIR_OFFSET).copied().map(Dir::from);
    if dir.is_some() && policy_dir != dir {
        return Ok(());
    }
    if out.len() >= MAX_POLICIES {
        return Err(XfrmError::TooMany {
            family: XFRM,
            object: "policy dump".into(),
            limit: MAX_POLICIES,
        });
    }
    out.push(parse_policy(&msg.payload)?);
    Ok(())
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn be16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn be32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(off..off + 8)?.try_into().ok()?))
}
fn u8_at(b: &[u8], off: usize) -> Option<u8> {
    b.get(off).copied()
}

fn addr(b: &[u8], off: usize, family: u16) -> Option<Option<IpAddr>> {
    let raw: [u8; 16] = b.get(off..off + 16)?.try_into().ok()?;
    Some(match family {
        AF_INET => {
            let [a, b, c, d, ..] = raw;
            Some(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
        }
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(raw))),
        _ => None,
    })
}

fn net(b: &[u8], off: usize, family: u16, prefix: u8) -> Result<IpNet, XfrmError> {
    let bad = || malformed(format!("selector prefix /{prefix} for family {family}"));
    match addr(b, off, family).ok_or_else(|| malformed("short selector"))? {
        Some(IpAddr::V4(a)) => Ok(IpNet::V4(Ipv4Net::new(a, prefix).map_err(|_| bad())?)),
        Some(IpAddr::V6(a)) => Ok(IpNet::V6(Ipv6Net::new(a, prefix).map_err(|_| bad())?)),
        // AF_UNSPEC selectors match nothing in particular; show them as "any".
        None => Ok(IpNet::V4(Ipv4Net::default())),
    }
}

fn parse_selector(b: &[u8]) -> Result<Selector, XfrmError> {
    let short = || malformed("short xfrm_selector");
    let family = u16_at(b, 40).ok_or_else(short)?;
    let prefix_d = u8_at(b, 42).ok_or_else(short)?;
    let prefix_s = u8_at(b, 43).ok_or_else(short)?;
    Ok(Selector {
        dst: net(b, 0, family, prefix_d)?,
        src: net(b, 16, family, prefix_s)?,
        dport: be16_at(b, 32).ok_or_else(short)?,
        dport_mask: be16_at(b, 34).ok_or_else(short)?,
        sport: be16_at(b, 36).ok_or_else(short)?,
        sport_mask: be16_at(b, 38).ok_or_else(short)?,
        proto: u8_at(b, 44).ok_or_else(short)?,
        ifindex: u32_at(b, 48).ok_or_else(short)? as i32,
        user: u32_at(b, 52).ok_or_else(short)?,
    })
}

fn parse_template(b: &[u8], sel_family: u16) -> Option<Template> {
    let family = u16_at(b, 24)?;
    let addr_family = if family == 0 { sel_family } else { family };
    Some(Template {
        dst: addr(b, 0, addr_family)?,
        spi: be32_at(b, 16)?,
        proto: u8_at(b, 20)?,
        family,
        src: addr(b, 28, addr_family)?,
        reqid: u32_at(b, 44)?,
        mode: Mode::from(u8_at(b, 48)?),
        share: u8_at(b, 49)?,
        optional: u8_at(b, 50)? != 0,
        aalgos: u32_at(b, 52)?,
        ealgos: u32_at(b, 56)?,
        calgos: u32_at(b, 60)?,
    })
}

/// Parse the payload of one `XFRM_MSG_NEWPOLICY` (after the netlink header).
pub fn parse_policy(p: &[u8]) -> Result<XfrmPolicy, XfrmError> {
    let info = p
        .get(..USERPOLICY_INFO_LEN)
        .ok_or_else(|| malformed(format!("policy of {} bytes", p.len())))?;
    let short = || malformed("short xfrm_userpolicy_info");
    let selector = parse_selector(info.get(..SELECTOR_LEN).ok_or_else(short)?)?;
    let family = u16_at(info, 40).ok_or_else(short)?;
    let q = |i: usize| u64_at(info, SELECTOR_LEN + 8 * i).ok_or_else(short);
    let lifetime = LifetimeCfg {
        soft_byte_limit: q(0)?,
        hard_byte_limit: q(1)?,
        soft_packet_limit: q(2)?,
        hard_packet_limit: q(3)?,
        soft_add_expires_seconds: q(4)?,
        hard_add_expires_seconds: q(5)?,
        soft_use_expires_seconds: q(6)?,
        hard_use_expires_seconds: q(7)?,
    };
    let current = LifetimeCur {
        bytes: q(8)?,
        packets: q(9)?,
        add_time: q(10)?,
        use_time: q(11)?,
    };
    let mut pol = XfrmPolicy {
        dir: Dir::from(u8_at(info, DIR_OFFSET).ok_or_else(short)?),
        action: Action::from(u8_at(info, 161).ok_or_else(short)?),
        priority: u32_at(info, 152).ok_or_else(short)?,
        index: u32_at(info, 156).ok_or_else(short)?,
        family,
        selector,
        lifetime,
        current,
        flags: u8_at(info, 162).ok_or_else(short)?,
        share: u8_at(info, 163).ok_or_else(short)?,
        ptype: PolicyType::Main,
        mark: None,
        if_id: None,
        templates: Vec::new(),
    };

    let mut off = align4(USERPOLICY_INFO_LEN);
    while off + 4 <= p.len() {
        let len = u16_at(p, off).unwrap_or(0) as usize;
        let ty = u16_at(p, off + 2).unwrap_or(0) & NLA_TYPE_MASK;
        if len < 4 {
            return Err(malformed(format!("attribute length {len}")));
        }
        let v = p
            .get(off + 4..off + len)
            .ok_or_else(|| malformed(format!("attribute {ty} overruns policy")))?;
        match ty {
            XFRMA_TMPL => {
                if v.len() % USER_TMPL_LEN != 0 {
                    return Err(malformed(format!("XFRMA_TMPL of {} bytes", v.len())));
                }
                for t in v.chunks_exact(USER_TMPL_LEN) {
                    pol.templates.push(
                        parse_template(t, family)
                            .ok_or_else(|| malformed("short xfrm_user_tmpl"))?,
                    );
                }
            }
            XFRMA_MARK => {
                let bad = || malformed("short XFRMA_MARK");
                pol.mark = Some(Mark {
                    value: u32_at(v, 0).ok_or_else(bad)?,
                    mask: u32_at(v, 4).ok_or_else(bad)?,
                });
            }
            XFRMA_IF_ID => {
                pol.if_id = Some(u32_at(v, 0).ok_or_else(|| malformed("short XFRMA_IF_ID"))?);
            }
            XFRMA_POLICY_TYPE => {
                pol.ptype = match u8_at(v, 0).ok_or_else(|| malformed("short policy type"))? {
                    0 => PolicyType::Main,
                    1 => PolicyType::Sub,
                    o => PolicyType::Other(o),
                };
            }
            _ => {}
        }
        off += align4(len);
    }
    Ok(pol)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::netlink::consts::{NLMSG_DONE, NLMSG_ERROR, NLM_F_MULTI};
    use crate::netlink::msg::split_datagram;
    use crate::netlink::{dump_step, ours};

    /// One datagram of a policy dump through the same steps as
    /// [`dump`]: framing, sequence and port filter, dump end and errors,
    /// then [`keep_policy`]. True once the dump is complete.
    fn parse_datagram(
        data: &[u8],
        seq: u32,
        port: u32,
        dir: Option<Dir>,
        out: &mut Vec<XfrmPolicy>,
    ) -> Result<bool, XfrmError> {
        let msgs = split_datagram(data).map_err(malformed)?;
        let mut interrupted = false;
        let mut failed = None;
        let done = dump_step::<Xfrm>(
            ours(msgs, |s| s == seq, port),
            "policy dump",
            &mut interrupted,
            |msg| {
                if failed.is_none() {
                    failed = keep_policy(&msg, dir, out).err();
                }
            },
        )?;
        match failed {
            Some(e) => Err(e),
            None => Ok(done),
        }
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

    fn nlmsg(ty: u16, flags: u16, seq: u32, port: u32, payload: &[u8]) -> Vec<u8> {
        let len = NLMSG_HDR_LEN + payload.len();
        let mut m = Vec::new();
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&port.to_ne_bytes());
        m.extend_from_slice(payload);
        m.resize(align4(m.len()), 0);
        m
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
    fn ipv6_selector() {
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
    fn mark_semantics() {
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
}

/// Root-only tests against the kernel, each inside a fresh netns of its own thread.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod kernel_tests {
    use super::*;
    use std::process::Command;

    fn is_root() -> bool {
        nix::unistd::Uid::effective().is_root()
    }

    /// Run `f` on a new thread moved into a brand new netns (gone when the thread ends).
    fn in_new_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            f()
        })
        .join()
        .expect("netns thread")
    }

    fn ip(args: &str) {
        let st = Command::new("ip")
            .args(args.split_whitespace())
            .status()
            .expect("run ip");
        assert!(st.success(), "ip {args}");
    }

    #[test]
    fn dumps_policies_made_by_iproute2() {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let pols = in_new_netns(|| {
            assert!(dump_policies().unwrap().is_empty());
            ip("xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action block priority 2147483647 mark 759815 mask 0xffffffff");
            ip("-6 xfrm policy add dir out src ::/0 dst ::/0 action block priority 2147483647 mark 0xb9807 mask 0xffffffff");
            ip("xfrm policy add dir out src 10.0.0.1/32 dst 10.0.0.2/32 proto udp dport 6081 priority 100 tmpl src 10.0.0.1 dst 10.0.0.2 proto esp reqid 1 mode transport");
            ip("xfrm policy add dir in src 10.0.0.2/32 dst 10.0.0.1/32 proto udp sport 4789 tmpl src 10.0.0.2 dst 10.0.0.1 proto esp reqid 2 mode tunnel level use");
            ip("xfrm policy add dir out src 10.1.0.0/16 dst 10.2.0.0/16 if_id 9");
            let out = dump_policies_dir(Dir::Out, DEFAULT_TIMEOUT).unwrap();
            assert_eq!(out.len(), 4);
            assert!(out.iter().all(|p| p.dir == Dir::Out));
            dump_policies().unwrap()
        });
        assert_eq!(pols.len(), 5, "{pols:#?}");
        let guard4 = pols
            .iter()
            .find(|p| p.family == AF_INET && p.action == Action::Block)
            .unwrap();
        assert_eq!(guard4.dir, Dir::Out);
        assert_eq!(guard4.priority, 2_147_483_647);
        assert_eq!(
            guard4.mark,
            Some(Mark {
                value: 759_815,
                mask: 0xffff_ffff
            })
        );
        assert_eq!(guard4.selector.dst.prefix_len(), 0);
        let guard6 = pols.iter().find(|p| p.family == AF_INET6).unwrap();
        assert_eq!(guard6.selector.src, "::/0".parse::<IpNet>().unwrap());
        assert_eq!(guard6.mark.map(|m| m.value), Some(759_815));

        let esp = pols.iter().find(|p| p.priority == 100).unwrap();
        assert_eq!(esp.action, Action::Allow);
        assert_eq!(esp.selector.proto, PROTO_UDP);
        assert_eq!(
            (esp.selector.dport, esp.selector.dport_mask),
            (6081, 0xffff)
        );
        assert_eq!(esp.selector.src, "10.0.0.1/32".parse::<IpNet>().unwrap());
        assert_eq!(esp.templates.len(), 1);
        assert!(esp.templates[0].requires_esp());
        assert_eq!(esp.templates[0].reqid, 1);
        assert_eq!(esp.templates[0].dst, Some("10.0.0.2".parse().unwrap()));
        assert_eq!(esp.mark, None);

        let inbound = pols.iter().find(|p| p.dir == Dir::In).unwrap();
        assert_eq!(
            (inbound.selector.sport, inbound.selector.sport_mask),
            (4789, 0xffff)
        );
        assert_eq!(inbound.templates[0].mode, Mode::Tunnel);
        assert!(inbound.templates[0].optional);

        let xfrmi = pols.iter().find(|p| p.if_id.is_some()).unwrap();
        assert_eq!(xfrmi.if_id, Some(9));
        assert!(xfrmi.templates.is_empty());
    }

    #[test]
    fn dumps_many_policies_across_datagrams() {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let n = in_new_netns(|| {
            let mut batch = String::new();
            for i in 0..600u32 {
                batch.push_str(&format!(
                    "xfrm policy add dir out src 10.0.0.1/32 dst 10.{}.{}.1/32 tmpl src 10.0.0.1 dst 10.{}.{}.1 proto esp reqid {i} mode transport\n",
                    i / 256, i % 256, i / 256, i % 256
                ));
            }
            let mut child = Command::new("ip")
                .args(["-batch", "-"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(batch.as_bytes())
                .unwrap();
            assert!(child.wait().unwrap().success());
            dump_policies().unwrap().len()
        });
        assert_eq!(n, 600);
    }
}
