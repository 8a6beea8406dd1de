//! OVSDB's JSON-RPC stream (no framing): `ovsdb::find_reply` over raw bytes
//! and `ovsdb::parse_reply` over what it returns, then the protection-mark
//! parser on the external_ids value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podgate_tunnel_guard::config::parse_mark;
use podgate_tunnel_guard::ovsdb::{find_reply, parse_reply};

fuzz_target!(|data: &[u8]| {
    if data.len() > 70 * 1024 {
        return;
    }
    let Ok(Some(v)) = find_reply(data) else {
        return;
    };
    if let Ok(info) = parse_reply(&v) {
        if let Some(m) = &info.protection_mark {
            let _ = parse_mark(m);
        }
    }
});
