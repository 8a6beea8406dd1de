//! The IPsec agent's answers on its protection endpoint and status socket (a
//! local daemon, but the guard must survive anything it sends): the HTTP/1.x
//! response parser (Content-Length, chunked, close-delimited), the /status
//! JSON and the pure `judge` over what was parsed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podgate_tunnel_guard::agent::{parse_response, AgentStatus};
use podgate_tunnel_guard::ovsdb::OvsInfo;
use podgate_tunnel_guard::protection::{Answer, Presence};
use podgate_tunnel_guard::time::parse_rfc3339;
use podgate_tunnel_guard::{judge, GuardConfig, Observations, OvsRead};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fuzz_target!(|data: &[u8]| {
    // The guard reads at most 64 KiB from the agent.
    if data.len() > 70 * 1024 {
        return;
    }
    let Some((flags, buf)) = data.split_first() else {
        return;
    };
    let eof = flags & 1 == 1;
    let parsed = parse_response(buf, eof);
    if let Ok(Some((code, body))) = &parsed {
        assert!((100..=599).contains(code));
        assert!(body.len() <= buf.len(), "body larger than the input");
    }
    // A complete response stays complete when more bytes follow (no EOF).
    if let Ok(Some(_)) = parse_response(buf, false) {
        let mut more = buf.to_vec();
        more.extend_from_slice(b"trailing");
        assert!(parse_response(&more, false).is_ok_and(|r| r.is_some()));
    }
    let body = match parsed {
        Ok(Some((_, body))) => body,
        _ => buf.to_vec(),
    };
    let status = serde_json::from_slice::<AgentStatus>(&body);
    if let Ok(s) = &status {
        let _ = s.missing_identity();
        let _ = parse_rfc3339(&s.expires);
    }
    // The same bytes as the protection endpoint's answer and as the private
    // status, judged with everything else ready.
    let answer = match parse_response(buf, true) {
        Ok(Some((code, body))) => Ok(Answer {
            code,
            text: String::from_utf8_lossy(&body).chars().take(120).collect(),
        }),
        _ => Err("malformed".to_string()),
    };
    let obs = Observations {
        required_file: Some(Presence::Present),
        socket: Some(Presence::Present),
        dir_check: Some(Ok(())),
        socket_check: Some(Ok(())),
        ovsdb: Some(OvsRead::Ok(OvsInfo {
            uuid: "0d9a3c5e-1b2f-4c6d-8e7f-9a0b1c2d3e4f".into(),
            protection_mark: Some("1".into()),
            ..OvsInfo::default()
        })),
        armed: Some(answer.clone()),
        startup: Some(answer),
        policies: Some(Ok(Vec::new().into())),
        readyz: Some(Ok(200)),
        status: Some(status.map_err(|e| e.to_string())),
        elapsed: Duration::from_millis(1),
    };
    let cfg = GuardConfig {
        agent_socket: Some("/run/kube-ovn-ipsec/status.sock".into()),
        ..GuardConfig::default()
    };
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let report = judge(&cfg, &obs, now);
    let _ = report.summary();
    let _ = serde_json::to_string(&report);
    let _ = SystemTime::now();
});
