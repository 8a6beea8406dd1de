//! The verdict over what [`crate::observe()`] read (pure: no I/O): every check
//! with a stable name, its outcome and a message, in the order made.

use crate::evaluation::{Check, Evaluation, Outcome, Protection, Signals, Verdict};
use crate::guard::{assess, bypasses, conditional, describe, FULL_MASK};
use crate::observe::{Observations, OvsRead};
use crate::ovsdb::{self, OvsInfo};
use crate::protection::Presence;
use crate::{config, time, Family, GuardConfig, Required};
use std::time::{Duration, SystemTime};

/// Checks in the order they are made.
#[derive(Default)]
struct Checks(Vec<Check>);

impl Checks {
    fn add(&mut self, name: &str, outcome: Outcome, detail: impl Into<String>) {
        self.0.push(Check::new(name, outcome, detail));
    }
    fn pass(&mut self, name: &str, detail: impl Into<String>) {
        self.add(name, Outcome::Pass, detail);
    }
    fn fail(&mut self, name: &str, detail: impl Into<String>) {
        self.add(name, Outcome::Fail, detail);
    }
    fn skip(&mut self, name: &str, detail: impl Into<String>) {
        self.add(name, Outcome::Skip, detail);
    }
    fn warn(&mut self, name: &str, detail: impl Into<String>) {
        self.add(name, Outcome::Warn, detail);
    }
}

fn list(items: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut out: Vec<String> = items.iter().take(SHOWN).cloned().collect();
    if items.len() > SHOWN {
        out.push(format!("and {} more", items.len() - SHOWN));
    }
    out.join(", ")
}

/// The verdict over `obs` (pure: no I/O).
pub fn judge(cfg: &GuardConfig, obs: &Observations, now: SystemTime) -> Evaluation {
    let mut r = unjudged(cfg, obs, now);
    let mut c = Checks::default();
    if cfg.required == Required::Never {
        c.skip(
            "required",
            "required: never; IPsec protection is not checked",
        );
        r.verdict = Verdict::NotRequired;
        r.checks = c.0;
        return r;
    }
    let info = match &obs.ovsdb {
        Some(OvsRead::Ok(i)) => Some(i),
        _ => None,
    };
    r.signals = signals(obs, info);
    r.ovsdb = info.cloned();
    if let Some(unused) = not_in_use(cfg, obs, &r.signals) {
        c.skip("required", unused);
        r.verdict = Verdict::NotRequired;
        r.checks = c.0;
        return r;
    }
    c.pass("required", required_because(cfg, &r.signals));
    check_ovsdb(cfg, obs, &mut c);

    let prepared = check_endpoint(cfg, obs, &r.signals, info, &mut c);
    r.protection = if prepared {
        Some(Protection::Prepared)
    } else if matches!(&obs.armed, Some(Ok(a)) if a.code == 200) {
        Some(Protection::Armed)
    } else {
        None
    };
    check_readback(obs, info, !prepared, &mut c, &mut r);
    if cfg.agent_socket.is_some() {
        check_agent(cfg, obs, info, now, &mut c, &mut r);
    }
    r.verdict = if c.0.iter().any(|c| c.outcome == Outcome::Fail) {
        Verdict::NotReady
    } else {
        Verdict::Ready
    };
    r.checks = c.0;
    r
}

/// The evaluation before any check: what was asked, the agent's answers.
fn unjudged(cfg: &GuardConfig, obs: &Observations, now: SystemTime) -> Evaluation {
    Evaluation {
        verdict: Verdict::Ready,
        checked_at: time::format_rfc3339(now),
        elapsed_ms: u64::try_from(obs.elapsed.as_millis()).unwrap_or(u64::MAX),
        protection_dir: cfg.protection_dir.clone(),
        ovsdb_socket: cfg.ovsdb_socket.clone(),
        signals: Signals::default(),
        protection: None,
        armed: obs.armed.clone().and_then(Result::ok),
        startup: obs.startup.clone().and_then(Result::ok),
        ovsdb: None,
        mark: None,
        reqid: None,
        policy_count: None,
        guards: Vec::new(),
        bypasses: Vec::new(),
        agent_socket: cfg.agent_socket.clone(),
        agent: None,
        expires_in_secs: None,
        checks: Vec::new(),
        ike_sockets: None,
    }
}

/// Which presence signals the node gives.
fn signals(obs: &Observations, info: Option<&OvsInfo>) -> Signals {
    let exists = |p: &Option<Presence>| p.as_ref().is_some_and(Presence::exists);
    Signals {
        required_file: exists(&obs.required_file),
        protection_socket: exists(&obs.socket),
        ovsdb_keys: info.map_or_else(Vec::new, |i| {
            i.lease_keys_set().into_iter().map(String::from).collect()
        }),
    }
}

/// With `required: auto`, why IPsec is not in use on this node: no signal
/// at all, and OVSDB read (an unreadable OVSDB cannot rule its keys out).
fn not_in_use(cfg: &GuardConfig, obs: &Observations, signals: &Signals) -> Option<String> {
    let ovs_unknown = matches!(&obs.ovsdb, Some(OvsRead::Failed(_)) | None);
    if cfg.required != Required::Auto || signals.any() || ovs_unknown {
        return None;
    }
    let dir = cfg.protection_dir.display();
    let ovs_note = match &obs.ovsdb {
        Some(OvsRead::Absent) => format!("no OVSDB at {}", cfg.ovsdb_socket.display()),
        _ => "no ovn-ipsec-protection-* key in OVSDB".to_string(),
    };
    Some(format!(
        "IPsec not in use on this node (required: auto): no {dir}/required, \
         no {dir}/protection.sock, {ovs_note}"
    ))
}

/// Why protection is required: the config and every signal present.
fn required_because(cfg: &GuardConfig, signals: &Signals) -> String {
    let dir = cfg.protection_dir.display();
    let mut why: Vec<String> = Vec::new();
    if cfg.required == Required::Always {
        why.push("required: always".into());
    }
    if signals.required_file {
        why.push(format!("{dir}/required"));
    }
    if !signals.ovsdb_keys.is_empty() {
        why.push(format!("ovsdb {}", signals.ovsdb_keys.join(", ")));
    }
    if signals.protection_socket {
        why.push(format!("{dir}/protection.sock"));
    }
    if why.is_empty() {
        why.push("OVSDB unreadable, so its protection keys cannot be ruled out".into());
    }
    format!("IPsec protection required: {}", why.join(", "))
}

/// OVSDB read: its `_uuid` and system-id, or why not.
fn check_ovsdb(cfg: &GuardConfig, obs: &Observations, c: &mut Checks) {
    match &obs.ovsdb {
        Some(OvsRead::Ok(i)) => c.pass(
            "ovsdb",
            format!(
                "ovs _uuid {} system-id {}",
                i.uuid,
                i.system_id.as_deref().unwrap_or("-")
            ),
        ),
        Some(OvsRead::Absent) => c.fail(
            "ovsdb",
            format!("ovsdb socket {} absent", cfg.ovsdb_socket.display()),
        ),
        Some(OvsRead::Failed(e)) => c.fail("ovsdb", e.as_str()),
        None => c.fail("ovsdb", "ovsdb not read"),
    }
}

/// Directory, socket, peer, `/armed`, `/startup`. True when the node passes
/// as initial preparation (`/startup` 200 without durable intent).
fn check_endpoint(
    cfg: &GuardConfig,
    obs: &Observations,
    signals: &Signals,
    info: Option<&OvsInfo>,
    c: &mut Checks,
) -> bool {
    let sock = cfg.protection_socket();
    let sock = sock.display();
    if !signals.protection_socket {
        let why = if signals.durable() {
            " (durable intent present: the node stays closed until the agent is armed again)"
        } else {
            ""
        };
        c.fail(
            "protection.socket",
            format!("{sock} absent: agent not serving{why}"),
        );
        return false;
    }
    match &obs.dir_check {
        Some(Ok(())) => c.pass(
            "protection.dir",
            format!(
                "{} root-owned, not writable by others",
                cfg.protection_dir.display()
            ),
        ),
        Some(Err(e)) => c.fail("protection.dir", e.as_str()),
        None => c.fail("protection.dir", "protection directory not checked"),
    }
    match &obs.socket_check {
        Some(Ok(())) => c.pass(
            "protection.socket",
            format!("{sock} is a root-owned socket"),
        ),
        Some(Err(e)) => c.fail("protection.socket", e.as_str()),
        None => c.fail("protection.socket", format!("{sock} not checked")),
    }
    let uuid = info.map_or("-", |i| i.uuid.as_str());
    match &obs.armed {
        Some(Ok(a)) if a.code == 200 => {
            c.pass(
                "armed",
                format!("agent /armed answered 200 for ovs-uuid {uuid}"),
            );
            return false;
        }
        Some(Ok(a)) => {
            let text = if a.text.is_empty() {
                String::new()
            } else {
                format!(": {}", a.text)
            };
            let d = format!("agent /armed answered {} for ovs-uuid {uuid}{text}", a.code);
            if obs.startup.is_some() {
                c.skip("armed", d);
            } else {
                c.fail("armed", d);
            }
        }
        Some(Err(e)) => c.fail("armed", e.as_str()),
        None if info.is_none() => c.fail(
            "armed",
            "agent /armed not asked: no OVS _uuid to bind it to",
        ),
        None => c.skip(
            "armed",
            "agent /armed not asked: the endpoint did not pass its checks",
        ),
    }
    match &obs.startup {
        None if signals.durable() => {
            c.skip(
                "startup",
                "agent /startup not asked: durable intent requires live protection",
            );
            false
        }
        None => false,
        Some(Ok(a)) if a.code == 200 && !signals.durable() => {
            c.pass(
                "startup",
                format!("agent /startup answered 200 for ovs-uuid {uuid}: initial preparation, plaintext allowed by design"),
            );
            true
        }
        Some(Ok(a)) => {
            let text = if a.text.is_empty() {
                String::new()
            } else {
                format!(": {}", a.text)
            };
            c.fail(
                "startup",
                format!("not armed and agent /startup answered {}{text}", a.code),
            );
            false
        }
        Some(Err(e)) => {
            c.fail("startup", format!("not armed and {e}"));
            false
        }
    }
}

/// A number from the OVSDB lease (`external_ids`): None when absent or
/// empty; one that does not parse or fails `valid` is reported in `bad`
/// (worded by `complaint`) and is None too.
fn lease_number(
    raw: Option<&str>,
    valid: impl Fn(u32) -> bool,
    bad: &mut Vec<String>,
    complaint: impl Fn(&str) -> String,
) -> Option<u32> {
    let raw = raw.filter(|m| !m.is_empty())?;
    match config::parse_mark(raw) {
        Some(n) if valid(n) => Some(n),
        _ => {
            bad.push(complaint(raw));
            None
        }
    }
}

/// The lease keys as the agent validates them (`pkg/ovs` `tunnelOptions`).
fn check_lease(
    info: &OvsInfo,
    gating: Outcome,
    suffix: &str,
    c: &mut Checks,
) -> Option<(u32, u32)> {
    let mut bad = Vec::new();
    let set: Vec<&str> = info.lease_keys_set();
    for k in ovsdb::LEASE_KEYS {
        if !set.contains(&k) {
            bad.push(format!("{k} missing"));
        }
    }
    let mark = lease_number(
        info.protection_mark.as_deref(),
        |m| m != 0,
        &mut bad,
        |raw| {
            format!(
                "{} {raw:?} is not a non-zero 32-bit number",
                ovsdb::PROTECTION_MARK
            )
        },
    );
    let reqid = lease_number(
        info.reqid.as_deref(),
        |q| (1..=0x7fff_ffff).contains(&q),
        &mut bad,
        |raw| format!("{} {raw:?} is not within 1..2^31-1", ovsdb::REQID),
    );
    if info.system_id.as_deref().is_none_or(str::is_empty) {
        bad.push("system-id missing".into());
    }
    if bad.is_empty() {
        c.pass(
            "lease",
            format!(
                "ovsdb lease: mark {} reqid {}",
                mark.unwrap_or(0),
                reqid.unwrap_or(0)
            ),
        );
    } else {
        c.add(
            "lease",
            gating,
            format!("ovsdb lease incomplete: {}{suffix}", bad.join(", ")),
        );
    }
    mark.map(|m| (m, reqid.unwrap_or(0)))
}

/// The marks on every OVN tunnel interface (`pkg/ovs` `tunnelOptions`).
fn tunnel_problems(info: &OvsInfo, mark: u32, reqid: u32) -> Vec<String> {
    let want_mark = mark.to_string();
    let want_out = format!("{mark}/{FULL_MASK:#x}");
    let want_reqid = reqid.to_string();
    let mut out = Vec::new();
    for t in &info.tunnels {
        let port = &t.port;
        if t.evpn || t.chassis == "flow" || t.interfaces.len() != 1 || t.dangling != 0 {
            out.push(format!(
                "tunnel port {port} is not an ordinary OVN tunnel (unsupported by the agent)"
            ));
            continue;
        }
        let Some(i) = t.interfaces.first() else {
            continue;
        };
        let name = &i.name;
        if !matches!(i.kind.as_str(), "geneve" | "vxlan") || i.option("remote_ip") == "flow" {
            out.push(format!(
                "tunnel {name} is type {:?}, not an ordinary Geneve/VXLAN tunnel",
                i.kind
            ));
            continue;
        }
        let port_ok = match (i.kind.as_str(), i.option("dst_port")) {
            (_, "") => true,
            ("geneve", p) => p == "6081",
            (_, p) => p == "4789",
        };
        if !port_ok {
            out.push(format!(
                "tunnel {name} uses custom dst_port {}",
                i.option("dst_port")
            ));
            continue;
        }
        let mut want = vec![("egress_pkt_mark", want_mark.as_str())];
        if !i.option("remote_name").is_empty() {
            want.push(("ipsec_mark_out", want_out.as_str()));
            want.push(("ipsec_reqid", want_reqid.as_str()));
        }
        for (k, v) in want {
            match i.option(k) {
                "" => out.push(format!("tunnel {name} lacks {k}")),
                got if got != v => out.push(format!("tunnel {name} has {k}={got}, want {v}")),
                _ => {}
            }
        }
    }
    out
}

/// The guard's own readback: lease, XFRM guards and bypasses, tunnel marks.
/// When `gates` is false (initial preparation) findings are reported, not enforced.
fn check_readback(
    obs: &Observations,
    info: Option<&OvsInfo>,
    gates: bool,
    c: &mut Checks,
    r: &mut Evaluation,
) {
    let gating = if gates { Outcome::Fail } else { Outcome::Skip };
    let suffix = if gates {
        ""
    } else {
        " (initial preparation: not enforced)"
    };
    let lease = match info {
        Some(i) => check_lease(i, gating, suffix, c),
        None => {
            c.skip("lease", "ovsdb unavailable");
            None
        }
    };
    r.mark = lease.map(|(m, _)| m);
    r.reqid = lease.map(|(_, q)| q).filter(|q| *q != 0);
    let policies = match &obs.policies {
        Some(Ok(p)) => {
            r.policy_count = Some(p.count);
            c.pass(
                "xfrm",
                format!("{} outbound xfrm policies read back", p.count),
            );
            Some(&p.kept)
        }
        Some(Err(e)) => {
            c.add("xfrm", gating, format!("xfrm policy dump: {e}{suffix}"));
            None
        }
        None => {
            c.add("xfrm", gating, format!("xfrm policies not read{suffix}"));
            None
        }
    };
    let (Some((mark, reqid)), Some(policies)) = (lease, policies) else {
        for name in ["guard.ipv4", "guard.ipv6", "bypass", "tunnels"] {
            c.skip(name, "not checked: no lease mark or no xfrm readback");
        }
        return;
    };
    for family in Family::BOTH {
        let g = assess(policies, family, mark);
        let name = match family {
            Family::Ipv4 => "guard.ipv4",
            Family::Ipv6 => "guard.ipv6",
        };
        match &g.guard {
            Some(p) => c.pass(
                name,
                format!("guard {family} mark {mark} present (index {})", p.index),
            ),
            None => {
                // Lookalikes: another mark, or a condition on what it blocks.
                let marks: Vec<String> = g
                    .lookalikes
                    .iter()
                    .filter_map(|p| p.mark.filter(|m| m.value != mark))
                    .map(|m| m.value.to_string())
                    .collect();
                let mut found = String::new();
                if !marks.is_empty() {
                    found = format!(" (guard installed with mark {})", marks.join(", "));
                }
                if let Some(why) = g.lookalikes.iter().find_map(conditional) {
                    found += &format!(" (a guard-shaped policy is not counted: {why})");
                }
                c.add(
                    name,
                    gating,
                    format!("guard {family} mark {mark} missing{found}{suffix}"),
                );
            }
        }
        r.guards.push(g);
    }
    r.bypasses = bypasses(policies, mark);
    if r.bypasses.is_empty() {
        c.pass("bypass", "no bypass policy");
    } else {
        let shown: Vec<String> = r.bypasses.iter().map(describe).collect();
        c.add(
            "bypass",
            gating,
            format!(
                "bypass policy without required ESP template: {}{suffix}",
                list(&shown)
            ),
        );
    }
    let Some(info) = info else { return };
    let problems = tunnel_problems(info, mark, reqid);
    if problems.is_empty() {
        c.pass(
            "tunnels",
            format!(
                "{} OVN tunnel interface(s) carry mark {mark}",
                info.tunnels.len()
            ),
        );
    } else {
        c.add("tunnels", gating, format!("{}{suffix}", list(&problems)));
    }
}

/// The private status socket, when configured: diagnostics only (warn).
fn check_agent(
    cfg: &GuardConfig,
    obs: &Observations,
    info: Option<&OvsInfo>,
    now: SystemTime,
    c: &mut Checks,
    r: &mut Evaluation,
) {
    match &obs.readyz {
        Some(Ok(200)) => c.pass("agent.readyz", "agent /readyz answered 200"),
        Some(Ok(code)) => c.warn("agent.readyz", format!("agent /readyz answered {code}")),
        Some(Err(e)) => c.warn("agent.readyz", e.as_str()),
        None => c.warn("agent.readyz", "agent /readyz not asked"),
    }
    let s = match &obs.status {
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            c.warn("agent.status", e.as_str());
            return;
        }
        None => {
            c.warn("agent.status", "agent /status not asked");
            return;
        }
    };
    r.agent = Some(s.clone());
    let reason = if s.reason.is_empty() {
        String::new()
    } else {
        format!(" (reason: {})", s.reason)
    };
    c.pass("agent.status", format!("phase {}{reason}", s.phase));
    let missing = s.missing_identity();
    if missing.is_empty() {
        c.pass(
            "agent.identity",
            format!("node {} chassis {}", s.node_uid, s.chassis),
        );
    } else {
        c.warn(
            "agent.identity",
            format!("agent status lacks {}", missing.join(", ")),
        );
    }
    if let Some(id) = info.and_then(|i| i.system_id.as_deref()) {
        if !s.chassis.is_empty() && s.chassis != id {
            c.warn(
                "agent.chassis",
                format!(
                    "agent reports chassis {:?}, ovsdb system-id is {id:?}",
                    s.chassis
                ),
            );
        }
    }
    let Some(expires) = time::parse_rfc3339(&s.expires) else {
        c.warn(
            "agent.certificate",
            if s.expires.is_empty() {
                "agent status has no certificate expiry".to_string()
            } else {
                format!("certificate expiry {:?} is not RFC 3339", s.expires)
            },
        );
        return;
    };
    let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    match expires.duration_since(now) {
        Err(ago) => {
            r.expires_in_secs = Some(-secs(ago.duration()));
            c.warn(
                "agent.certificate",
                format!("certificate expired {} ago", time::human(ago.duration())),
            );
        }
        Ok(left) => {
            r.expires_in_secs = Some(secs(left));
            let min = cfg.min_cert_validity;
            if left < min {
                c.warn(
                    "agent.certificate",
                    format!(
                        "certificate expires in {} < {}",
                        time::human(left),
                        time::human(min)
                    ),
                );
            } else {
                c.pass(
                    "agent.certificate",
                    format!("certificate expires in {}", time::human(left)),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
