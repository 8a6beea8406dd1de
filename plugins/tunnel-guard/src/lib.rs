//! Is this node's IPsec tunnel protection really in place?
//!
//! [`evaluate`] gathers what the node offers (the IPsec agent's status socket,
//! OVSDB, and the kernel's XFRM policies read back over netlink) under one
//! time budget, and [`judge`] turns those observations into a [`Report`]: each
//! check with its outcome and a verdict. The CNI plugin (`main.rs`) gates pod
//! ADDs on it; `podgate ipsec status` prints it.
//!
//! Ready means all of: `/readyz` answers 200; `/status` parses, names this
//! chassis (the OVSDB system-id when OVSDB is configured), has its identity
//! fields and a certificate valid for at least `minCertValidity`; and either
//! the phase is `Prepared` (first enable: plaintext allowed by design), or the
//! phase is `Configured`/`Running`/`Restored` with configurationApplied,
//! runtimeHealthy and protectionArmed true AND the kernel shows the guard for
//! every configured family with the node's mark and no bypass policy. The
//! agent's word alone never passes.

pub mod agent;
pub mod config;
pub mod guard;
pub mod io;
pub mod ovsdb;
pub mod report;
pub mod time;
pub mod udp;

pub use config::{Family, GuardConfig, Mode, Required};
pub use report::{Check, Outcome, Report, Verdict};

use agent::AgentStatus;
use guard::{assess, describe};
use io::Deadline;
use ovsdb::OvsInfo;
use podgate_kit::xfrm::{self, Dir, XfrmPolicy};
use std::thread::{Builder, Scope, ScopedJoinHandle};
use std::time::{Duration, Instant, SystemTime};

/// Phases in which the agent says protection is (being) enforced.
const ARMED_PHASES: [&str; 3] = ["Configured", "Running", "Restored"];
const PREPARED: &str = "Prepared";

/// Everything read from the node, errors as text. `None` = not asked.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    pub agent_present: bool,
    pub readyz: Option<Result<u16, String>>,
    pub status: Option<Result<AgentStatus, String>>,
    pub ovsdb: Option<Result<OvsInfo, String>>,
    /// The OUT policies of the calling thread's netns.
    pub policies: Option<Result<Vec<XfrmPolicy>, String>>,
    pub elapsed: Duration,
}

/// Read the node and judge it. All I/O shares one deadline (`timeoutMs`); the
/// agent and OVSDB are asked concurrently, the XFRM dump runs on the calling
/// thread, i.e. in its network namespace (the node's, for a CNI plugin).
/// `required: never` asks nothing.
pub fn evaluate(cfg: &GuardConfig, now: SystemTime) -> Report {
    judge(cfg, &observe(cfg), now)
}

pub fn observe(cfg: &GuardConfig) -> Observations {
    let started = Instant::now();
    let mut obs = Observations::default();
    if cfg.required == Required::Never {
        return obs;
    }
    // Only "no such file" means no agent: any other error (e.g. EACCES) must
    // not turn `required: auto` into "not required"; connect will name it.
    obs.agent_present = !matches!(
        cfg.agent_socket.symlink_metadata(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound
    );
    if !obs.agent_present {
        obs.elapsed = started.elapsed();
        return obs;
    }
    let dl = Deadline::after(cfg.timeout());
    std::thread::scope(|s| {
        let readyz = spawn(s, || agent::readyz(&cfg.agent_socket, &dl));
        let status = spawn(s, || agent::status(&cfg.agent_socket, &dl));
        let ovs = cfg
            .ovsdb_socket
            .as_deref()
            .map(|p| spawn(s, move || ovsdb::query(p, &dl)));
        let budget = dl.remaining().unwrap_or(Duration::from_millis(1));
        // Only OUT policies can guard or bypass output; skipping the rest early
        // halves the work on nodes with per-peer in/out policy pairs.
        obs.policies = Some(xfrm::dump_policies_dir(Dir::Out, budget).map_err(|e| e.to_string()));
        obs.readyz = Some(join(readyz));
        obs.status = Some(join(status));
        obs.ovsdb = ovs.map(join);
    });
    obs.elapsed = started.elapsed();
    obs
}

type Job<'s, T, E> = std::io::Result<ScopedJoinHandle<'s, Result<T, E>>>;

fn spawn<'s, 'e, T, E, F>(s: &'s Scope<'s, 'e>, f: F) -> Job<'s, T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 's,
    T: Send + 's,
    E: Send + 's,
{
    Builder::new().spawn_scoped(s, f)
}

fn join<T, E: std::fmt::Display>(job: Job<'_, T, E>) -> Result<T, String> {
    job.map_err(|e| format!("cannot start a thread: {e}"))?
        .join()
        .map_err(|_| "check panicked".to_string())?
        .map_err(|e| e.to_string())
}

/// Checks in the order they are made.
#[derive(Default)]
struct Checks(Vec<Check>);

impl Checks {
    fn add(&mut self, name: impl Into<String>, outcome: Outcome, detail: impl Into<String>) {
        self.0.push(Check::new(name, outcome, detail));
    }
    fn pass(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.add(name, Outcome::Pass, detail);
    }
    fn fail(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.add(name, Outcome::Fail, detail);
    }
    fn skip(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.add(name, Outcome::Skip, detail);
    }
}

/// The verdict over `obs` (pure: no I/O).
pub fn judge(cfg: &GuardConfig, obs: &Observations, now: SystemTime) -> Report {
    let mut r = Report {
        verdict: Verdict::Ready,
        checked_at: time::format_rfc3339(now),
        elapsed_ms: u64::try_from(obs.elapsed.as_millis()).unwrap_or(u64::MAX),
        agent_socket: cfg.agent_socket.clone(),
        agent: None,
        expires_in_secs: None,
        min_cert_validity_secs: cfg.min_cert_validity.as_secs(),
        ovsdb: None,
        mark: None,
        mark_source: None,
        policy_count: None,
        guards: Vec::new(),
        checks: Vec::new(),
        ike_sockets: None,
    };
    let mut c = Checks::default();
    let socket = cfg.agent_socket.display();
    if cfg.required == Required::Never {
        c.skip(
            "required",
            "required: never; IPsec protection is not checked",
        );
        r.verdict = Verdict::NotRequired;
    } else if !obs.agent_present && cfg.required == Required::Auto {
        c.skip(
            "required",
            format!(
                "agent socket {socket} absent: IPsec not enabled on this node (required: auto)"
            ),
        );
        r.verdict = Verdict::NotRequired;
    } else if !obs.agent_present {
        c.fail(
            "agent",
            format!("agent socket {socket} absent (required: always)"),
        );
        r.verdict = Verdict::NotReady;
    } else {
        let status = check_agent(cfg, obs, now, &mut c, &mut r);
        // The kernel readback gates every phase but Prepared (first enable).
        let kernel_gates = status.is_none_or(|s| s.phase != PREPARED);
        let ovs = check_ovsdb(obs, status, &mut c);
        check_kernel(cfg, obs, ovs, kernel_gates, &mut c, &mut r);
        r.agent = status.cloned();
        r.ovsdb = ovs.and_then(Result::ok).cloned();
        r.verdict = if c.0.iter().any(|c| c.outcome == Outcome::Fail) {
            Verdict::NotReady
        } else {
            Verdict::Ready
        };
    }
    r.checks = c.0;
    r
}

/// /readyz, /status, phase, identity, certificate. Returns the status if it parsed.
fn check_agent<'o>(
    cfg: &GuardConfig,
    obs: &'o Observations,
    now: SystemTime,
    c: &mut Checks,
    r: &mut Report,
) -> Option<&'o AgentStatus> {
    match &obs.readyz {
        Some(Ok(200)) => c.pass("agent.readyz", "/readyz answered 200"),
        Some(Ok(code)) => c.fail("agent.readyz", format!("agent /readyz answered {code}")),
        Some(Err(e)) => c.fail("agent.readyz", e.as_str()),
        None => c.fail("agent.readyz", "agent /readyz not asked"),
    }
    let s = match &obs.status {
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            c.fail("agent.status", e.as_str());
            c.skip("phase", "agent status unavailable");
            return None;
        }
        None => {
            c.fail("agent.status", "agent /status not asked");
            return None;
        }
    };
    c.pass(
        "agent.status",
        format!("/status parsed (phase {})", s.phase),
    );

    let reason = if s.reason.is_empty() {
        String::new()
    } else {
        format!(" (reason: {})", s.reason)
    };
    if s.phase == PREPARED {
        c.pass(
            "phase",
            format!("phase Prepared{reason}: first enable, plaintext allowed by design"),
        );
    } else if ARMED_PHASES.contains(&s.phase.as_str()) {
        let off: Vec<&str> = [
            ("configurationApplied", s.configuration_applied),
            ("runtimeHealthy", s.runtime_healthy),
            ("protectionArmed", s.protection_armed),
        ]
        .into_iter()
        .filter(|(_, on)| !on)
        .map(|(k, _)| k)
        .collect();
        if off.is_empty() {
            c.pass(
                "phase",
                format!("phase {}: applied, healthy, armed", s.phase),
            );
        } else {
            c.fail(
                "phase",
                format!("phase {} but {} false{reason}", s.phase, off.join(", ")),
            );
        }
    } else {
        c.fail("phase", format!("phase {}{reason}", s.phase));
    }

    let missing = s.missing_identity();
    if missing.is_empty() {
        c.pass(
            "identity",
            format!("node {} generation {}", s.node_uid, s.generation),
        );
    } else {
        c.fail(
            "identity",
            format!("agent status lacks {}", missing.join(", ")),
        );
    }

    let Some(expires) = time::parse_rfc3339(&s.expires) else {
        c.fail(
            "certificate",
            if s.expires.is_empty() {
                "agent status has no certificate expiry".to_string()
            } else {
                format!("certificate expiry {:?} is not RFC 3339", s.expires)
            },
        );
        return Some(s);
    };
    let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    match expires.duration_since(now) {
        Err(ago) => {
            r.expires_in_secs = Some(-secs(ago.duration()));
            c.fail(
                "certificate",
                format!("certificate expired {} ago", time::human(ago.duration())),
            );
        }
        Ok(left) => {
            r.expires_in_secs = Some(secs(left));
            let min = cfg.min_cert_validity;
            if left.is_zero() {
                c.fail("certificate", "certificate expires now");
            } else if left < min {
                c.fail(
                    "certificate",
                    format!(
                        "certificate expires in {} < {}",
                        time::human(left),
                        time::human(min)
                    ),
                );
            } else {
                c.pass(
                    "certificate",
                    format!("certificate expires in {}", time::human(left)),
                );
            }
        }
    }
    Some(s)
}

/// OVSDB and the chassis cross-check. Returns the OVSDB outcome (None: not configured).
fn check_ovsdb<'o>(
    obs: &'o Observations,
    status: Option<&AgentStatus>,
    c: &mut Checks,
) -> Option<Result<&'o OvsInfo, ()>> {
    let ovs = match &obs.ovsdb {
        None => None,
        Some(Ok(info)) => {
            let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            c.pass(
                "ovsdb",
                format!(
                    "system-id {}, protection mark {}",
                    show(&info.system_id),
                    show(&info.protection_mark)
                ),
            );
            Some(Ok(info))
        }
        Some(Err(e)) => {
            c.fail("ovsdb", e.as_str());
            Some(Err(()))
        }
    };
    let Some(s) = status else {
        return ovs;
    };
    match ovs {
        None => c.skip(
            "chassis",
            format!("chassis {} not cross-checked (no ovsdbSocket)", s.chassis),
        ),
        Some(Err(())) => c.skip("chassis", "ovsdb unavailable"),
        Some(Ok(OvsInfo {
            system_id: None, ..
        })) => c.fail("chassis", "ovsdb has no external_ids:system-id"),
        Some(Ok(OvsInfo {
            system_id: Some(id),
            ..
        })) if *id == s.chassis => {
            c.pass("chassis", format!("chassis {id} matches ovsdb system-id"));
        }
        Some(Ok(OvsInfo {
            system_id: Some(id),
            ..
        })) => c.fail(
            "chassis",
            format!(
                "chassis mismatch: agent reports {:?}, ovsdb system-id is {id:?}",
                s.chassis
            ),
        ),
    }
    ovs
}

/// The protection mark, the XFRM readback, the guard and bypasses per family.
/// When `gates` is false (phase Prepared) findings are reported but skipped.
fn check_kernel(
    cfg: &GuardConfig,
    obs: &Observations,
    ovs: Option<Result<&OvsInfo, ()>>,
    gates: bool,
    c: &mut Checks,
    r: &mut Report,
) {
    let gating = if gates { Outcome::Fail } else { Outcome::Skip };
    let suffix = if gates {
        ""
    } else {
        " (phase Prepared: not enforced)"
    };

    let mark = match (cfg.guard_mark, ovs) {
        (Some(m), _) => Ok((m, "guardMark")),
        (
            None,
            Some(Ok(OvsInfo {
                protection_mark: Some(raw),
                ..
            })),
        ) => config::parse_mark(raw)
            .map(|m| (m, "ovsdb"))
            .ok_or_else(|| format!("ovsdb {} {raw:?} is not a number", ovsdb::PROTECTION_MARK)),
        (None, Some(Ok(_))) => Err(format!(
            "no protection mark known (ovsdb has no external_ids:{})",
            ovsdb::PROTECTION_MARK
        )),
        (None, Some(Err(()))) => Err("no protection mark known (ovsdb unavailable)".into()),
        (None, None) => Err("no protection mark known (no guardMark, no ovsdbSocket)".into()),
    };
    let mark = match mark {
        Ok((m, source)) => {
            c.pass("mark", format!("protection mark {m} from {source}"));
            r.mark = Some(m);
            r.mark_source = Some(source.to_string());
            Some(m)
        }
        Err(e) => {
            c.add("mark", gating, format!("{e}{suffix}"));
            None
        }
    };

    let policies = match &obs.policies {
        Some(Ok(p)) => {
            r.policy_count = Some(p.len());
            c.pass(
                "xfrm",
                format!("{} outbound xfrm policies read back", p.len()),
            );
            Some(p)
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

    for family in cfg.families() {
        let (Some(mark), Some(policies)) = (mark, policies) else {
            c.skip(
                format!("guard.{family}"),
                format!("guard {family} not checked"),
            );
            continue;
        };
        let g = assess(policies, family, mark, &cfg.tunnel_ports);
        match &g.guard {
            Some(p) => c.pass(
                format!("guard.{family}"),
                format!("guard {family} mark {mark} present (index {})", p.index),
            ),
            None => {
                let others: Vec<String> = g
                    .other_marks
                    .iter()
                    .filter_map(|p| p.mark.map(|m| m.value.to_string()))
                    .collect();
                let found = if others.is_empty() {
                    String::new()
                } else {
                    format!(" (guard installed with mark {})", others.join(", "))
                };
                c.add(
                    format!("guard.{family}"),
                    gating,
                    format!("guard {family} mark {mark} missing{found}{suffix}"),
                );
            }
        }
        if g.bypasses.is_empty() {
            c.pass(
                format!("bypass.{family}"),
                format!("no {family} bypass policy"),
            );
        } else {
            const SHOWN: usize = 3;
            let mut list: Vec<String> = g.bypasses.iter().take(SHOWN).map(describe).collect();
            if g.bypasses.len() > SHOWN {
                list.push(format!("and {} more", g.bypasses.len() - SHOWN));
            }
            c.add(
                format!("bypass.{family}"),
                gating,
                format!(
                    "{family} bypass policy without ESP template: {}{suffix}",
                    list.join(", ")
                ),
            );
        }
        r.guards.push(g);
    }
}

#[cfg(test)]
mod tests;
