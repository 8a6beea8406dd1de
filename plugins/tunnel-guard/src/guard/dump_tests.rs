//! The dump's filter ([`may_guard_or_bypass`]) against the judge: a policy
//! it leaves unparsed must be one the judge would not have counted, for
//! every shape of policy, every family and every lease mark.

use super::tests::policy;
use super::*;
use podgate_kit::xfrm::{self, Mark, PolicyDump, PROTO_AH, PROTO_ESP};
use std::process::Command;

const MARK: u32 = 759_815;
const AF_INET6: u16 = 10;

/// `p` as the kernel sends it (`xfrm_userpolicy_info` on 64-bit, then
/// `XFRMA_TMPL` and `XFRMA_MARK`); lifetimes, addresses and if_id stay zero.
fn wire(p: &XfrmPolicy) -> Vec<u8> {
    let s = &p.selector;
    let mut b = vec![0u8; 168];
    let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| {
        if let Some(slot) = b.get_mut(at..at + v.len()) {
            slot.copy_from_slice(v);
        }
    };
    put(&mut b, 32, &s.dport.to_be_bytes());
    put(&mut b, 34, &s.dport_mask.to_be_bytes());
    put(&mut b, 40, &p.family.to_ne_bytes());
    put(
        &mut b,
        42,
        &[s.dst.prefix_len(), s.src.prefix_len(), s.proto],
    );
    put(&mut b, 152, &p.priority.to_ne_bytes());
    put(&mut b, 156, &p.index.to_ne_bytes());
    let code = |dir: Dir| match dir {
        Dir::In => 0,
        Dir::Out => 1,
        Dir::Fwd => 2,
        Dir::Other(d) => d,
    };
    let action = match p.action {
        Action::Allow => 0,
        Action::Block => 1,
        Action::Other(a) => a,
    };
    put(&mut b, 160, &[code(p.dir), action]);
    let mut attr = |ty: u16, v: &[u8]| {
        let len = u16::try_from(4 + v.len()).unwrap_or(u16::MAX);
        b.extend_from_slice(&len.to_ne_bytes());
        b.extend_from_slice(&ty.to_ne_bytes());
        b.extend_from_slice(v);
        b.resize(b.len().next_multiple_of(4), 0);
    };
    if !p.templates.is_empty() {
        let mut t = vec![0u8; 64 * p.templates.len()];
        for (i, tmpl) in p.templates.iter().enumerate() {
            put(&mut t, 64 * i + 20, &[tmpl.proto]);
            put(&mut t, 64 * i + 24, &tmpl.family.to_ne_bytes());
            put(&mut t, 64 * i + 50, &[u8::from(tmpl.optional)]);
        }
        attr(5, &t);
    }
    if let Some(m) = p.mark {
        let mut v = m.value.to_ne_bytes().to_vec();
        v.extend_from_slice(&m.mask.to_ne_bytes());
        attr(21, &v);
    }
    b
}

fn tmpl(proto: u8, optional: bool) -> Template {
    Template {
        proto,
        family: Family::Ipv4.af(),
        src: None,
        dst: None,
        spi: 0,
        reqid: 0,
        mode: podgate_kit::xfrm::Mode::Transport,
        share: 0,
        optional,
        aalgos: 0,
        ealgos: 0,
        calgos: 0,
    }
}

/// Every combination of the fields the filter or the judge look at.
fn shapes() -> Vec<XfrmPolicy> {
    let marks = [
        None,
        Some((MARK, FULL_MASK)),
        Some((1, FULL_MASK)),
        Some((MARK & 0xff, 0xff)),
        Some((0, 0)),
    ];
    let templates = [
        vec![],
        vec![tmpl(PROTO_ESP, false)],
        vec![tmpl(PROTO_ESP, true)],
        vec![tmpl(PROTO_AH, false)],
        vec![tmpl(PROTO_ESP, true), tmpl(PROTO_ESP, false)],
        vec![tmpl(PROTO_AH, false), tmpl(PROTO_ESP, true)],
    ];
    // (dport, mask): any, the tunnel ports, another port, masks that do and
    // do not admit 6081, a zero port under a full mask.
    let ports = [
        (0, 0),
        (6081, 0xffff),
        (4789, 0xffff),
        (53, 0xffff),
        (6080, 0xfffe),
        (6082, 0xfffe),
        (0, 0xffff),
        (6081, 0),
        (0x8000, 0x7fff),
    ];
    let mut out = Vec::new();
    for family in [Family::Ipv4, Family::Ipv6] {
        for af in [family.af(), 0] {
            for dir in [Dir::In, Dir::Out, Dir::Fwd] {
                for action in [Action::Allow, Action::Block, Action::Other(2)] {
                    for priority in [0, 100, GUARD_PRIORITY, u32::MAX] {
                        for proto in [0, PROTO_UDP, 6, PROTO_ESP] {
                            for (dport, dport_mask) in ports {
                                for mark in marks {
                                    for t in &templates {
                                        let mut p = policy(family, dir, action, priority);
                                        p.family = af;
                                        p.selector.proto = proto;
                                        p.selector.dport = dport;
                                        p.selector.dport_mask = dport_mask;
                                        p.mark = mark.map(|(value, mask)| Mark { value, mask });
                                        p.templates = t.clone();
                                        out.push(p);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Would the judge count `p` (as parsed) for some family or lease mark?
fn judged(p: &XfrmPolicy) -> bool {
    let marks = [MARK, 0, 1, p.mark.map_or(MARK, |m| m.value)];
    Family::BOTH.iter().any(|&f| guard_shaped(p, f)) || marks.iter().any(|&m| is_bypass(p, m))
}

#[test]
fn the_dump_filter_never_skips_a_policy_the_judge_would_count_in_any_family_or_mark() {
    let (mut skipped, mut counted) = (0, 0);
    for p in shapes() {
        let bytes = wire(&p);
        let raw = RawPolicy::new(&bytes).unwrap();
        let parsed = raw.to_policy().unwrap();
        // The wire form is the policy (what the judge sees is what was meant).
        assert_eq!(
            (parsed.dir, parsed.action, parsed.priority, parsed.family),
            (p.dir, p.action, p.priority, p.family)
        );
        assert_eq!(
            (
                parsed.selector.proto,
                parsed.selector.dport,
                parsed.selector.dport_mask
            ),
            (p.selector.proto, p.selector.dport, p.selector.dport_mask)
        );
        assert_eq!(parsed.mark, p.mark);
        let shape = |t: &Template| (t.proto, t.optional);
        assert!(parsed
            .templates
            .iter()
            .map(shape)
            .eq(p.templates.iter().map(shape)));
        if judged(&parsed) {
            counted += 1;
            assert!(may_guard_or_bypass(&raw), "skipped: {}", describe(&parsed));
        }
        if !may_guard_or_bypass(&raw) {
            skipped += 1;
        }
    }
    // Neither side is empty: the filter skips, and the judge counts.
    assert!(skipped > 1_000 && counted > 1_000, "{skipped} {counted}");
}

#[test]
fn the_boundaries_of_the_filter() {
    let keeps = |p: &XfrmPolicy| may_guard_or_bypass(&RawPolicy::new(&wire(p)).unwrap());
    let tunnel = |proto: u8, dport: u16, mask: u16, templates: Vec<Template>| {
        let mut p = policy(Family::Ipv4, Dir::Out, Action::Allow, 100);
        p.selector.proto = proto;
        p.selector.dport = dport;
        p.selector.dport_mask = mask;
        p.templates = templates;
        p
    };
    // Kept: could be a bypass (proto any or UDP, a port admitting 6081 or
    // 4789, no required ESP template), or has the guard's dir, action and priority.
    assert!(keeps(&tunnel(0, 0, 0, vec![])));
    assert!(keeps(&tunnel(PROTO_UDP, 6081, 0xffff, vec![])));
    assert!(keeps(&tunnel(PROTO_UDP, 4789, 0xffff, vec![])));
    assert!(keeps(&tunnel(PROTO_UDP, 6080, 0xfffe, vec![])));
    // Masks under which port 0 matches (a flow that carries no port).
    for (dport, mask) in [(0x8000, 0x7fff), (1, 0xfffe)] {
        let p = tunnel(PROTO_UDP, dport, mask, vec![]);
        assert!(keeps(&p) && is_bypass(&p, MARK), "{}", describe(&p));
    }
    assert!(keeps(&tunnel(
        PROTO_UDP,
        6081,
        0xffff,
        vec![tmpl(PROTO_ESP, true)]
    )));
    assert!(keeps(&tunnel(
        PROTO_UDP,
        6081,
        0xffff,
        vec![tmpl(PROTO_AH, false)]
    )));
    let mut v6 = tunnel(PROTO_UDP, 6081, 0xffff, vec![]);
    v6.family = AF_INET6;
    assert!(keeps(&v6));
    let mut unspec = tunnel(PROTO_UDP, 6081, 0xffff, vec![]);
    unspec.family = 0;
    assert!(keeps(&unspec));
    let mut guard = tunnel(0, 0, 0, vec![tmpl(PROTO_ESP, false)]);
    guard.action = Action::Block;
    guard.priority = GUARD_PRIORITY;
    assert!(keeps(&guard), "the guard's head is kept whatever the rest");
    // Skipped: a required ESP template, another protocol or port, a block
    // below the guard's priority, another direction.
    assert!(!keeps(&tunnel(
        PROTO_UDP,
        6081,
        0xffff,
        vec![tmpl(PROTO_ESP, false)]
    )));
    assert!(!keeps(&tunnel(6, 6081, 0xffff, vec![])));
    assert!(!keeps(&tunnel(PROTO_UDP, 53, 0xffff, vec![])));
    assert!(!keeps(&tunnel(PROTO_UDP, 6082, 0xfffe, vec![])));
    let mut block = tunnel(0, 0, 0, vec![]);
    block.action = Action::Block;
    assert!(!keeps(&block));
    let mut inbound = tunnel(0, 0, 0, vec![]);
    inbound.dir = Dir::In;
    assert!(!keeps(&inbound));
}

/// Run `f` on a thread of its own in a brand new netns (gone with the
/// thread). Root only, and loudly so.
fn in_new_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let euid = nix::unistd::geteuid();
    assert!(euid.is_root(), "needs root for a netns (euid {euid})");
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// `ip -batch` of `lines` (from a file: thousands of policies in one process).
fn ip_batch(lines: &str) {
    let file = tempfile::Builder::new()
        .prefix("podgate-guard-xfrm-")
        .suffix(".batch")
        .tempfile()
        .unwrap();
    std::fs::write(file.path(), lines).unwrap();
    let st = Command::new("ip").arg("-batch").arg(file.path()).status();
    assert!(st.unwrap().success(), "ip -batch");
}

#[test]
fn bypasses_hidden_among_thousands_of_encrypted_peers_are_still_found() {
    let dump: PolicyDump = in_new_netns(|| {
        let mut lines = String::new();
        for any in ["0.0.0.0/0", "::/0"] {
            lines.push_str(&format!("xfrm policy add dir out src {any} dst {any} action block priority 2147483647 mark {MARK} mask 0xffffffff\n"));
        }
        // Peers as strongSwan installs them: out + in, udp/6081, required ESP.
        for i in 0..1500u32 {
            let peer = format!("172.16.{}.{}", i / 250, i % 250 + 1);
            lines.push_str(&format!("xfrm policy add dir out src 10.0.0.1/32 dst {peer}/32 proto udp dport 6081 mark {MARK} mask 0xffffffff tmpl src 10.0.0.1 dst {peer} proto esp reqid 7 mode transport\n"));
            lines.push_str(&format!("xfrm policy add dir in src {peer}/32 dst 10.0.0.1/32 proto udp dport 6081 tmpl src {peer} dst 10.0.0.1 proto esp reqid 7 mode transport\n"));
            // In their midst: a plaintext peer, an optional-ESP one (IPv6),
            // and one for any protocol and port under a mask admitting the mark.
            match i {
                500 => lines.push_str("xfrm policy add dir out src 10.0.0.1/32 dst 192.0.2.2/32 proto udp dport 6081 priority 100\n"),
                900 => lines.push_str("xfrm policy add dir out src fd00::1/128 dst fd00::2/128 proto udp dport 4789 tmpl src fd00::1 dst fd00::2 proto esp reqid 7 mode transport level use\n"),
                1200 => lines.push_str(&format!("xfrm policy add dir out src 10.0.0.1/32 dst 192.0.2.3/32 mark {} mask 0xff\n", MARK & 0xff)),
                _ => {}
            }
        }
        ip_batch(&lines);
        xfrm::dump_policies_where(Dir::Out, xfrm::DEFAULT_TIMEOUT, may_guard_or_bypass).unwrap()
    });
    assert_eq!(dump.count, 2 + 1500 + 3, "every OUT policy counted");
    assert_eq!(dump.kept.len(), 2 + 3, "only guards and bypasses parsed");
    for family in Family::BOTH {
        assert!(assess(&dump.kept, family, MARK).guard.is_some());
    }
    let found: Vec<String> = bypasses(&dump.kept, MARK).iter().map(describe).collect();
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(
        found
            .iter()
            .any(|d| d.contains("192.0.2.2/32 udp dport 6081")),
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|d| d.contains("fd00::2/128 udp dport 4789")),
        "{found:#?}"
    );
    assert!(
        found.iter().any(|d| d.contains("192.0.2.3/32 priority 0")),
        "{found:#?}"
    );
}
