//! Does the kernel's policy database really hold the agent's output guards,
//! and nothing that lets tunnel traffic around them? Pure functions over a
//! policy dump, so every case is testable without root. Both definitions are
//! the agent's (`pkg/ipsec/protection.go`).
//!
//! The guard (`protectionOwner.guard`, `sameGuard`): one OUT policy per
//! family, selector `0.0.0.0/0 -> 0.0.0.0/0` resp. `::/0 -> ::/0` (no proto,
//! no ports, no interface, no if_id), action block, priority
//! [`GUARD_PRIORITY`], mark `<lease mark>/0xffffffff`, no template, an OUT
//! index. OVN marks tunnel packets (`egress_pkt_mark`), so without an
//! SA-bound policy in front of the guard they are dropped.
//!
//! A bypass (`protectionBypassed`): an OUT allow policy, proto any or UDP,
//! destination port any, 6081 or 4789, whose mark admits the lease mark (or
//! which has none), without a required (non-optional) ESP template, at *any*
//! priority and in *any* family: the agent refuses to arm over one, whatever
//! its precedence against the guard. The guard additionally counts a port
//! mask that admits a tunnel port (`6080/0xfffe`), which the agent's
//! value-only comparison misses: stricter, so fail closed.

use crate::config::Family;
use podgate_kit::xfrm::{Action, Dir, RawPolicy, Selector, Template, XfrmPolicy, PROTO_UDP};
use serde::Serialize;
use std::fmt::Write as _;

pub const GUARD_PRIORITY: u32 = 2_147_483_647;
pub const FULL_MASK: u32 = 0xffff_ffff;
/// Geneve and VXLAN: the only tunnel ports the agent supports.
pub const TUNNEL_PORTS: [u16; 2] = [6081, 4789];
/// The kernel encodes the direction in the low 3 bits of a policy index.
const INDEX_DIR_MASK: u32 = 7;
const XFRM_POLICY_OUT: u32 = 1;

/// The kernel readback of one family's guard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FamilyGuard {
    pub family: Family,
    pub mark: u32,
    /// The guard policy, when present.
    pub guard: Option<XfrmPolicy>,
    /// Block policies shaped like the guard that are not it: another mark,
    /// or a condition on what they block ([`conditional`]).
    pub lookalikes: Vec<XfrmPolicy>,
}

/// Shape of the guard, whatever its mark.
fn guard_shaped(p: &XfrmPolicy, family: Family) -> bool {
    let s = &p.selector;
    p.dir == Dir::Out
        && p.action == Action::Block
        && p.family == family.af()
        && p.priority == GUARD_PRIORITY
        && s.src.prefix_len() == 0
        && s.dst.prefix_len() == 0
        && s.proto == 0
        && s.dport_mask == 0
        && s.sport_mask == 0
        && s.dport == 0
        && s.sport == 0
        && s.ifindex == 0
        && p.if_id.unwrap_or(0) == 0
        && p.templates.is_empty()
        && p.index != 0
        && p.index & INDEX_DIR_MASK == XFRM_POLICY_OUT
}

/// Why a guard-shaped policy would not block every flow it selects for as
/// long as it is there, if so: the agent's guard has none of these.
pub fn conditional(p: &XfrmPolicy) -> Option<&'static str> {
    if p.sec_ctx {
        Some("it carries a security context (it blocks only flows whose label matches)")
    } else if p.offload {
        Some("it carries a device offload")
    } else if p.lifetime.expires() {
        Some("it has a hard expiry (the kernel deletes it)")
    } else {
        None
    }
}

pub fn is_guard(p: &XfrmPolicy, family: Family, mark: u32) -> bool {
    guard_shaped(p, family)
        && conditional(p).is_none()
        && p.mark
            .is_some_and(|m| m.value == mark && m.mask == FULL_MASK)
}

/// See the module docs.
pub fn is_bypass(p: &XfrmPolicy, mark: u32) -> bool {
    let esp_required = p.templates.iter().any(Template::requires_esp);
    bypass_shaped(p.dir, p.action, &p.selector, esp_required)
        && p.mark.is_none_or(|m| mark & m.mask == m.value & m.mask)
}

/// A bypass of some mark: everything of [`is_bypass`] but the mark.
fn bypass_shaped(dir: Dir, action: Action, s: &Selector, esp_required: bool) -> bool {
    // Port 0 too: a tunnel flow whose route lookup carries no ports (older
    // kernels) matches a selector whose masked port is 0.
    let port_admitted = s.dport_mask == 0
        || s.dport == 0
        || s.matches_dport(0)
        || TUNNEL_PORTS
            .iter()
            .any(|&port| s.dport == port || s.matches_dport(port));
    dir == Dir::Out
        && action == Action::Allow
        && (s.proto == 0 || s.proto == PROTO_UDP)
        && port_admitted
        && !esp_required
}

/// Whether a policy still in the dump buffer could be a guard of any family
/// and mark ([`guard_shaped`] starts with these three fields) or a bypass of
/// any mark ([`bypass_shaped`]): the dump parses only those, the judge
/// decides on them as on any parsed policy, and the rest are only counted.
/// The lease mark is read from OVSDB while the dump runs, so it cannot take
/// part. A selector or template that cannot be read keeps the policy, so its
/// parse fails the dump.
pub fn may_guard_or_bypass(p: &RawPolicy<'_>) -> bool {
    let (dir, action) = (p.dir(), p.action());
    if dir == Dir::Out && action == Action::Block && p.priority() == GUARD_PRIORITY {
        return true;
    }
    let Ok(selector) = p.selector() else {
        return true;
    };
    let esp_required = p
        .templates()
        .any(|t| t.as_ref().is_ok_and(Template::requires_esp));
    bypass_shaped(dir, action, &selector, esp_required)
}

pub fn assess(policies: &[XfrmPolicy], family: Family, mark: u32) -> FamilyGuard {
    FamilyGuard {
        family,
        mark,
        guard: policies.iter().find(|p| is_guard(p, family, mark)).cloned(),
        lookalikes: policies
            .iter()
            .filter(|p| guard_shaped(p, family) && !is_guard(p, family, mark))
            .cloned()
            .collect(),
    }
}

/// Every bypass of `mark` in the dump, any family, any priority.
pub fn bypasses(policies: &[XfrmPolicy], mark: u32) -> Vec<XfrmPolicy> {
    policies
        .iter()
        .filter(|p| is_bypass(p, mark))
        .cloned()
        .collect()
}

/// One line per policy, in the spirit of `ip xfrm policy`.
pub fn describe(p: &XfrmPolicy) -> String {
    let s = &p.selector;
    let dir = match p.dir {
        Dir::In => "in".to_string(),
        Dir::Out => "out".to_string(),
        Dir::Fwd => "fwd".to_string(),
        Dir::Other(d) => format!("dir{d}"),
    };
    let action = match p.action {
        Action::Allow => "allow".to_string(),
        Action::Block => "block".to_string(),
        Action::Other(a) => format!("action{a}"),
    };
    let mut out = format!("{dir} {action} {} -> {}", s.src, s.dst);
    match s.proto {
        0 => {}
        PROTO_UDP => out.push_str(" udp"),
        6 => out.push_str(" tcp"),
        n => {
            let _ = write!(out, " proto {n}");
        }
    }
    if s.dport_mask != 0 {
        let _ = write!(out, " dport {}", s.dport);
    }
    let _ = write!(out, " priority {} index {}", p.priority, p.index);
    if let Some(m) = p.mark {
        let _ = write!(out, " mark {:#x}/{:#x}", m.value, m.mask);
    }
    if let Some(id) = p.if_id.filter(|&i| i != 0) {
        let _ = write!(out, " if_id {id}");
    }
    if p.sec_ctx {
        out.push_str(" security context");
    }
    if p.offload {
        out.push_str(" offload");
    }
    if p.lifetime.expires() {
        let l = &p.lifetime;
        let _ = write!(
            out,
            " expires add {}s use {}s",
            l.hard_add_expires_seconds, l.hard_use_expires_seconds
        );
    }
    if p.templates.is_empty() {
        out.push_str(" no template");
    }
    for t in &p.templates {
        let proto = match t.proto {
            50 => "esp".to_string(),
            51 => "ah".to_string(),
            108 => "comp".to_string(),
            n => format!("proto {n}"),
        };
        let _ = write!(
            out,
            " tmpl {proto}{}",
            if t.optional { " (optional)" } else { "" }
        );
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod dump_tests;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
pub(crate) mod tests {
    use super::*;
    use ipnet::IpNet;
    use podgate_kit::xfrm::{
        LifetimeCfg, LifetimeCur, Mark, Mode, PolicyType, PROTO_AH, PROTO_ESP,
    };

    const MARK: u32 = 759_815;

    fn any(family: Family) -> IpNet {
        match family {
            Family::Ipv4 => "0.0.0.0/0".parse().unwrap(),
            Family::Ipv6 => "::/0".parse().unwrap(),
        }
    }

    /// An allow/block policy with an any-to-any selector (shared with the crate's tests).
    pub(crate) fn policy(family: Family, dir: Dir, action: Action, priority: u32) -> XfrmPolicy {
        XfrmPolicy {
            dir,
            action,
            priority,
            index: 1,
            family: family.af(),
            selector: Selector {
                src: any(family),
                dst: any(family),
                proto: 0,
                sport: 0,
                sport_mask: 0,
                dport: 0,
                dport_mask: 0,
                ifindex: 0,
                user: 0,
            },
            lifetime: LifetimeCfg::default(),
            current: LifetimeCur::default(),
            flags: 0,
            share: 0,
            ptype: PolicyType::Main,
            mark: None,
            if_id: None,
            templates: Vec::new(),
            sec_ctx: false,
            offload: false,
        }
    }

    /// The guard as the agent installs it.
    pub(crate) fn guard(family: Family, mark: u32) -> XfrmPolicy {
        let mut p = policy(family, Dir::Out, Action::Block, GUARD_PRIORITY);
        p.mark = Some(Mark {
            value: mark,
            mask: FULL_MASK,
        });
        p
    }

    fn tmpl(proto: u8, optional: bool) -> Template {
        Template {
            proto,
            family: 2,
            src: None,
            dst: None,
            spi: 0,
            reqid: 1,
            mode: Mode::Transport,
            share: 0,
            optional,
            aalgos: 0,
            ealgos: 0,
            calgos: 0,
        }
    }

    /// An OUT allow policy for udp/`port` between two hosts with the given templates.
    fn tunnel(port: u16, templates: Vec<Template>) -> XfrmPolicy {
        let mut p = policy(Family::Ipv4, Dir::Out, Action::Allow, 0);
        p.selector.src = "10.0.0.1/32".parse().unwrap();
        p.selector.dst = "10.0.0.2/32".parse().unwrap();
        p.selector.proto = PROTO_UDP;
        p.selector.dport = port;
        p.selector.dport_mask = 0xffff;
        p.templates = templates;
        p
    }

    fn check(pols: &[XfrmPolicy]) -> FamilyGuard {
        assess(pols, Family::Ipv4, MARK)
    }

    fn is_bypass(p: XfrmPolicy) -> bool {
        !bypasses(&[guard(Family::Ipv4, MARK), p], MARK).is_empty()
    }

    #[test]
    fn guard_present_and_clean() {
        let pols = vec![
            guard(Family::Ipv4, MARK),
            guard(Family::Ipv6, MARK),
            tunnel(6081, vec![tmpl(PROTO_ESP, false)]),
            tunnel(4789, vec![tmpl(PROTO_AH, false), tmpl(PROTO_ESP, false)]),
        ];
        for f in Family::BOTH {
            let g = assess(&pols, f, MARK);
            assert!(g.guard.is_some(), "{g:#?}");
            assert!(g.lookalikes.is_empty());
        }
        assert!(bypasses(&pols, MARK).is_empty());
    }

    #[test]
    fn a_guard_with_a_security_context_an_offload_or_a_hard_expiry_is_not_the_guard() {
        let changes: [fn(&mut XfrmPolicy); 4] = [
            |p| p.sec_ctx = true,
            |p| p.offload = true,
            |p| p.lifetime.hard_add_expires_seconds = 60,
            |p| p.lifetime.hard_use_expires_seconds = 60,
        ];
        for change in changes {
            let mut p = guard(Family::Ipv4, MARK);
            change(&mut p);
            let why = conditional(&p).unwrap();
            let g = check(std::slice::from_ref(&p));
            assert!(g.guard.is_none(), "{why}: {}", describe(&p));
            assert_eq!(g.lookalikes, vec![p], "{why}");
        }
        // What only notifies or is not enforced on a policy does not count.
        let mut p = guard(Family::Ipv4, MARK);
        p.lifetime.soft_add_expires_seconds = 60;
        p.lifetime.hard_byte_limit = 1 << 20;
        assert!(conditional(&p).is_none());
        assert!(check(&[p]).guard.is_some());
    }

    #[test]
    fn guard_missing_or_wrong() {
        assert!(check(&[]).guard.is_none());
        let g = check(&[guard(Family::Ipv4, 1)]);
        assert!(g.guard.is_none());
        assert_eq!(g.lookalikes.len(), 1);
        // The IPv6 guard does not stand in for IPv4, and vice versa.
        assert!(check(&[guard(Family::Ipv6, MARK)]).guard.is_none());
        assert!(assess(&[guard(Family::Ipv6, MARK)], Family::Ipv6, MARK)
            .guard
            .is_some());
        assert!(assess(&[guard(Family::Ipv4, MARK)], Family::Ipv6, MARK)
            .guard
            .is_none());
        let wrong = |f: fn(&mut XfrmPolicy)| {
            let mut p = guard(Family::Ipv4, MARK);
            f(&mut p);
            check(&[p]).guard.is_none()
        };
        assert!(wrong(|p| p.dir = Dir::In));
        assert!(wrong(|p| p.dir = Dir::Fwd));
        assert!(wrong(|p| p.action = Action::Allow));
        assert!(wrong(|p| p.priority = 100));
        assert!(wrong(|p| p.mark = None));
        assert!(wrong(|p| p.mark = Some(Mark {
            value: MARK,
            mask: 0xffff
        })));
        assert!(wrong(|p| p.selector.dst = "10.0.0.0/8".parse().unwrap()));
        assert!(wrong(|p| p.selector.src = "10.0.0.0/8".parse().unwrap()));
        assert!(wrong(|p| p.selector.proto = PROTO_UDP));
        assert!(wrong(|p| {
            p.selector.dport = 6081;
            p.selector.dport_mask = 0xffff;
        }));
        assert!(wrong(|p| p.selector.ifindex = 3));
        assert!(wrong(|p| p.if_id = Some(4)));
        assert!(wrong(|p| p.templates = vec![tmpl(PROTO_ESP, false)]));
        assert!(wrong(|p| p.index = 0));
        assert!(wrong(|p| p.index = 10)); // an IN index (10 & 7 == 2)
        assert!(!wrong(|p| p.if_id = Some(0)));
        assert!(!wrong(|p| p.index = 9));
    }

    #[test]
    fn bypasses_as_the_agent_defines_them() {
        // No template at all: plaintext allowed.
        assert!(is_bypass(tunnel(6081, vec![])));
        assert!(is_bypass(tunnel(4789, vec![])));
        // Templates that do not force encryption.
        assert!(is_bypass(tunnel(6081, vec![tmpl(PROTO_ESP, true)])));
        assert!(is_bypass(tunnel(6081, vec![tmpl(PROTO_AH, false)])));
        assert!(is_bypass(tunnel(6081, vec![tmpl(108, false)])));
        // Any proto, any port.
        let mut p = tunnel(0, vec![]);
        p.selector.proto = 0;
        p.selector.dport_mask = 0;
        assert!(is_bypass(p));
        // A port mask that admits 6081 (6080/0xfffe): stricter than the agent.
        let mut p = tunnel(6080, vec![]);
        p.selector.dport_mask = 0xfffe;
        assert!(is_bypass(p));
        // Marks: the protection mark, a mask that ignores it, no mark.
        let mut p = tunnel(6081, vec![]);
        p.mark = Some(Mark {
            value: MARK,
            mask: FULL_MASK,
        });
        assert!(is_bypass(p.clone()));
        p.mark = Some(Mark {
            value: MARK & 0xff,
            mask: 0xff,
        });
        assert!(is_bypass(p));
        // Any family (AF_UNSPEC and IPv6 included), any priority: the agent
        // refuses to arm over a bypass whatever its precedence.
        let mut p = tunnel(6081, vec![]);
        p.family = 0;
        assert!(is_bypass(p));
        let mut p = policy(Family::Ipv6, Dir::Out, Action::Allow, 0);
        p.selector.proto = PROTO_UDP;
        assert!(is_bypass(p));
        let mut p = tunnel(6081, vec![]);
        p.priority = u32::MAX;
        assert!(is_bypass(p));
        // Found without a guard too.
        assert_eq!(bypasses(&[tunnel(6081, vec![])], MARK).len(), 1);
    }

    #[test]
    fn esp_traffic_other_ports_ike_foreign_marks_and_blocks_are_not_bypasses() {
        assert!(!is_bypass(tunnel(6081, vec![tmpl(PROTO_ESP, false)])));
        assert!(!is_bypass(tunnel(
            6081,
            vec![tmpl(PROTO_ESP, true), tmpl(PROTO_ESP, false)]
        )));
        // Other ports, other protocols: not tunnel traffic.
        assert!(!is_bypass(tunnel(53, vec![])));
        let mut p = tunnel(6081, vec![]);
        p.selector.proto = 6;
        assert!(!is_bypass(p));
        // IKE itself (udp/500, 4500) must flow in plaintext.
        assert!(!is_bypass(tunnel(500, vec![])));
        assert!(!is_bypass(tunnel(4500, vec![])));
        // A mark the tunnel packets do not carry.
        let mut p = tunnel(6081, vec![]);
        p.mark = Some(Mark {
            value: 1,
            mask: FULL_MASK,
        });
        assert!(!is_bypass(p));
        // Other directions, block actions.
        let mut p = tunnel(6081, vec![]);
        p.dir = Dir::In;
        assert!(!is_bypass(p));
        let mut p = tunnel(6081, vec![]);
        p.dir = Dir::Fwd;
        assert!(!is_bypass(p));
        let mut p = tunnel(6081, vec![]);
        p.action = Action::Block;
        assert!(!is_bypass(p));
    }

    #[test]
    fn many_peers_scale() {
        let mut pols = vec![guard(Family::Ipv4, MARK), guard(Family::Ipv6, MARK)];
        for i in 0..4000u32 {
            let mut p = tunnel(6081, vec![tmpl(PROTO_ESP, false)]);
            p.index = i * 8 + 1;
            if i % 2 == 1 {
                p.dir = Dir::In;
            }
            pols.push(p);
        }
        assert!(check(&pols).guard.is_some());
        assert!(bypasses(&pols, MARK).is_empty());
    }

    #[test]
    fn describes_policies() {
        let d = describe(&tunnel(6081, vec![tmpl(PROTO_ESP, true)]));
        assert_eq!(
            d,
            "out allow 10.0.0.1/32 -> 10.0.0.2/32 udp dport 6081 priority 0 index 1 tmpl esp (optional)"
        );
        let d = describe(&guard(Family::Ipv4, MARK));
        assert_eq!(
            d,
            "out block 0.0.0.0/0 -> 0.0.0.0/0 priority 2147483647 index 1 mark 0xb9807/0xffffffff no template"
        );
    }
}
