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
use crate::netlink::msg::{align4, MsgRef};
use crate::netlink::{DumpEvent, NetlinkFamily, Socket, Xfrm};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

const XFRM_MSG_NEWPOLICY: u16 = 0x13;
const XFRM_MSG_GETPOLICY: u16 = 0x15;

const XFRMA_TMPL: u16 = 5;
const XFRMA_SEC_CTX: u16 = 8;
const XFRMA_POLICY_TYPE: u16 = 16;
const XFRMA_MARK: u16 = 21;
const XFRMA_OFFLOAD_DEV: u16 = 28;
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

impl LifetimeCfg {
    /// Whether the kernel deletes the policy after a time (a hard expiry
    /// since it was added or last used; a policy's byte and packet limits
    /// are not enforced, its soft expiries only notify).
    pub fn expires(&self) -> bool {
        self.hard_add_expires_seconds != 0 || self.hard_use_expires_seconds != 0
    }
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
    /// Carries a security context (`XFRMA_SEC_CTX`): the kernel applies it
    /// only to flows whose label passes the LSM's check.
    pub sec_ctx: bool,
    /// Carries a device offload (`XFRMA_OFFLOAD_DEV`).
    pub offload: bool,
}

/// Dump every policy of the calling thread's netns (main and sub types),
/// waiting at most [`DEFAULT_TIMEOUT`].
pub fn dump_policies() -> Result<Vec<XfrmPolicy>, XfrmError> {
    Ok(dump(DEFAULT_TIMEOUT, None, |_| true)?.kept)
}

/// What [`dump_policies_where`] read: how many policies of the direction
/// the kernel holds, and those the filter kept, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyDump {
    pub count: usize,
    pub kept: Vec<XfrmPolicy>,
}

impl From<Vec<XfrmPolicy>> for PolicyDump {
    /// Every policy kept.
    fn from(kept: Vec<XfrmPolicy>) -> PolicyDump {
        PolicyDump {
            count: kept.len(),
            kept,
        }
    }
}

/// The policies of direction `dir` (checked before anything else is read),
/// bounded by `timeout` in total, parsing only those `keep` selects while
/// they are still in the receive buffer ([`RawPolicy`]: no copy, no
/// allocation); the others are only counted. A policy too malformed to be
/// read in place fails the dump as it would when parsed.
pub fn dump_policies_where(
    dir: Dir,
    timeout: Duration,
    keep: impl Fn(&RawPolicy<'_>) -> bool,
) -> Result<PolicyDump, XfrmError> {
    dump(timeout, Some(dir), keep)
}

fn dump(
    timeout: Duration,
    dir: Option<Dir>,
    keep: impl Fn(&RawPolicy<'_>) -> bool,
) -> Result<PolicyDump, XfrmError> {
    let mut sock = Socket::<Xfrm>::with_timeout(timeout)?;
    let mut out = PolicyDump::default();
    sock.dump_each("policy dump", dump_request, |event| match event {
        DumpEvent::Restart => {
            out = PolicyDump::default();
            Ok(())
        }
        DumpEvent::Row(msg) => keep_policy(msg, dir, &keep, &mut out),
    })?;
    Ok(out)
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

/// One row of the dump: a policy of direction `dir` (if given) is counted,
/// and parsed into `out` when `keep` selects it. The direction is checked
/// before anything else is read; a row too short to hold one is an error.
fn keep_policy(
    msg: MsgRef<'_>,
    dir: Option<Dir>,
    keep: impl Fn(&RawPolicy<'_>) -> bool,
    out: &mut PolicyDump,
) -> Result<(), XfrmError> {
    if msg.ty != XFRM_MSG_NEWPOLICY {
        return Ok(());
    }
    let Some(&policy_dir) = msg.payload.get(DIR_OFFSET) else {
        return Err(malformed(format!("policy of {} bytes", msg.payload.len())));
    };
    if dir.is_some_and(|d| d != Dir::from(policy_dir)) {
        return Ok(());
    }
    out.count += 1;
    let raw = RawPolicy::new(msg.payload)?;
    if !keep(&raw) {
        return Ok(());
    }
    if out.kept.len() >= MAX_POLICIES {
        return Err(XfrmError::TooMany {
            family: XFRM,
            object: "policy dump".into(),
            limit: MAX_POLICIES,
        });
    }
    out.kept.push(raw.to_policy()?);
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
    RawPolicy::new(p)?.to_policy()
}

/// One `XFRM_MSG_NEWPOLICY` payload read where it lies: the fixed
/// `xfrm_userpolicy_info` and its attributes located and bounds-checked,
/// nothing copied. [`RawPolicy::to_policy`] parses the rest.
#[derive(Debug, Clone, Copy)]
pub struct RawPolicy<'a> {
    info: &'a [u8],
    /// The `XFRMA_TMPL` payload, a whole number of `xfrm_user_tmpl`.
    tmpl: &'a [u8],
    mark: Option<Mark>,
    if_id: Option<u32>,
    ptype: PolicyType,
    sec_ctx: bool,
    offload: bool,
}

impl<'a> RawPolicy<'a> {
    /// Checks the sizes of the fixed part and of every attribute, as parsing does.
    pub fn new(p: &'a [u8]) -> Result<RawPolicy<'a>, XfrmError> {
        let info = p
            .get(..USERPOLICY_INFO_LEN)
            .ok_or_else(|| malformed(format!("policy of {} bytes", p.len())))?;
        let mut raw = RawPolicy {
            info,
            tmpl: &[],
            mark: None,
            if_id: None,
            ptype: PolicyType::Main,
            sec_ctx: false,
            offload: false,
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
                    raw.tmpl = v;
                }
                XFRMA_MARK => {
                    let bad = || malformed("short XFRMA_MARK");
                    raw.mark = Some(Mark {
                        value: u32_at(v, 0).ok_or_else(bad)?,
                        mask: u32_at(v, 4).ok_or_else(bad)?,
                    });
                }
                XFRMA_IF_ID => {
                    raw.if_id = Some(u32_at(v, 0).ok_or_else(|| malformed("short XFRMA_IF_ID"))?);
                }
                XFRMA_SEC_CTX => raw.sec_ctx = true,
                XFRMA_OFFLOAD_DEV => raw.offload = true,
                XFRMA_POLICY_TYPE => {
                    raw.ptype = match u8_at(v, 0).ok_or_else(|| malformed("short policy type"))? {
                        0 => PolicyType::Main,
                        1 => PolicyType::Sub,
                        o => PolicyType::Other(o),
                    };
                }
                _ => {}
            }
            off += align4(len);
        }
        Ok(raw)
    }

    pub fn dir(&self) -> Dir {
        Dir::from(u8_at(self.info, DIR_OFFSET).unwrap_or_default())
    }

    pub fn action(&self) -> Action {
        Action::from(u8_at(self.info, 161).unwrap_or_default())
    }

    pub fn priority(&self) -> u32 {
        u32_at(self.info, 152).unwrap_or_default()
    }

    /// The selector's address family (AF_INET 2, AF_INET6 10).
    pub fn family(&self) -> u16 {
        u16_at(self.info, 40).unwrap_or_default()
    }

    pub fn selector(&self) -> Result<Selector, XfrmError> {
        parse_selector(self.info.get(..SELECTOR_LEN).unwrap_or_default())
    }

    pub fn mark(&self) -> Option<Mark> {
        self.mark
    }

    /// The templates in order; one is an error only if it cannot be read.
    pub fn templates(&self) -> impl Iterator<Item = Result<Template, XfrmError>> + 'a {
        let family = self.family();
        self.tmpl.chunks_exact(USER_TMPL_LEN).map(move |t| {
            parse_template(t, family).ok_or_else(|| malformed("short xfrm_user_tmpl"))
        })
    }

    /// The whole policy, parsed.
    pub fn to_policy(&self) -> Result<XfrmPolicy, XfrmError> {
        let info = self.info;
        let short = || malformed("short xfrm_userpolicy_info");
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
        Ok(XfrmPolicy {
            dir: self.dir(),
            action: self.action(),
            priority: self.priority(),
            index: u32_at(info, 156).ok_or_else(short)?,
            family: self.family(),
            selector: self.selector()?,
            lifetime,
            current,
            flags: u8_at(info, 162).ok_or_else(short)?,
            share: u8_at(info, 163).ok_or_else(short)?,
            ptype: self.ptype,
            mark: self.mark,
            if_id: self.if_id,
            templates: self.templates().collect::<Result<_, _>>()?,
            sec_ctx: self.sec_ctx,
            offload: self.offload,
        })
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod kernel_tests;
