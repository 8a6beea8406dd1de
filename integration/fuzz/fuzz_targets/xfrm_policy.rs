//! One XFRM policy as the kernel sends it in a dump (xfrm_userpolicy_info +
//! attributes): `podgate_kit::xfrm::parse_policy`, then what the guard
//! derives from it. Kernel input, but a node can hold policies of any shape.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podgate_kit::xfrm::parse_policy;
use podgate_tunnel_guard::guard::{assess, bypasses, describe};
use podgate_tunnel_guard::Family;

fuzz_target!(|data: &[u8]| {
    if data.len() > 64 * 1024 {
        return;
    }
    if let Ok(p) = parse_policy(data) {
        let _ = describe(&p);
        let _ = p.templates.iter().any(|t| t.requires_esp());
        let _ = p.selector.matches_dport(6081);
        let _ = p.mark.map(|m| m.matches(759_815));
        let ps = [p];
        let _ = assess(&ps, Family::Ipv4, 759_815);
        let _ = assess(&ps, Family::Ipv6, 0);
        let _ = bypasses(&ps, 759_815);
    }
});
