//! One XFRM policy as the kernel sends it in a dump (xfrm_userpolicy_info +
//! attributes): `podgate_kit::xfrm::parse_policy`, then what the guard
//! derives from it. Kernel input, but a node can hold policies of any shape.
//! Also the dump's filter: a policy the judge would count (a guard of some
//! mark, a bypass of some mark) must never be one it leaves unparsed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podgate_kit::xfrm::{parse_policy, RawPolicy};
use podgate_tunnel_guard::guard::{assess, bypasses, describe, is_bypass, may_guard_or_bypass};
use podgate_tunnel_guard::Family;

const MARK: u32 = 759_815;

fuzz_target!(|data: &[u8]| {
    if data.len() > 64 * 1024 {
        return;
    }
    let kept = RawPolicy::new(data).map(|raw| may_guard_or_bypass(&raw));
    if let Ok(p) = parse_policy(data) {
        let _ = describe(&p);
        let _ = p.templates.iter().any(|t| t.requires_esp());
        let _ = p.selector.matches_dport(6081);
        let _ = p.mark.map(|m| m.matches(MARK));
        let own = p.mark.map_or(MARK, |m| m.value);
        let bypass = [MARK, 0, own].iter().any(|&m| is_bypass(&p, m));
        let ps = [p];
        let guard = Family::BOTH.iter().any(|&f| {
            let g = assess(&ps, f, own);
            g.guard.is_some() || !g.lookalikes.is_empty()
        });
        assert!(kept.is_ok(), "parsed but not readable in place");
        assert!(!(guard || bypass) || matches!(kept, Ok(true)), "the filter skipped a counted policy");
        let _ = assess(&ps, Family::Ipv4, MARK);
        let _ = assess(&ps, Family::Ipv6, 0);
        let _ = bypasses(&ps, MARK);
    }
});
