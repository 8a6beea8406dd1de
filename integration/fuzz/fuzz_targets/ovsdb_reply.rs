//! OVSDB's JSON-RPC stream (no framing): `ovsdb::find_reply` over raw bytes
//! and `ovsdb::parse_reply` over what it returns, then the protection-mark
//! parser on the external_ids value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podgate_tunnel_guard::config::parse_mark;
use podgate_tunnel_guard::ovsdb::{find_reply, parse_reply};

fuzz_target!(|data: &[u8]| {
    if data.len() > 256 * 1024 {
        return;
    }
    let Ok(Some(v)) = find_reply(data) else {
        return;
    };
    if let Ok(info) = parse_reply(&v) {
        for v in [&info.protection_mark, &info.reqid].into_iter().flatten() {
            let _ = parse_mark(v);
        }
        let _ = info.lease_keys_set();
        let _ = podgate_tunnel_guard::ovsdb::is_uuid(&info.uuid);
    }
});
