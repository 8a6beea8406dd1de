//! The result of an evaluation as plain data: every check with its outcome,
//! the durable signals found, what was read from the agent's endpoint, OVSDB
//! and the kernel, and the verdict. `Display` is for people
//! (`podgate ipsec status`), `Serialize` for logs and `--json`. Nothing in
//! here is key material: no SA is ever read, the agent status keeps only
//! known non-secret fields and the OVSDB lease text is left out.

use crate::agent::AgentStatus;
use crate::guard::{describe, FamilyGuard};
use crate::ovsdb::OvsInfo;
use crate::protection::Answer;
use crate::time::human;
use crate::udp::UdpSocket;
use podgate_kit::xfrm::XfrmPolicy;
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    /// Not run, or not part of the gate in this state.
    Skip,
    /// A diagnostic finding that never gates (the private agent status).
    Warn,
}

/// One check. `name` is stable and short (`ovsdb`, `protection.socket`,
/// `armed`, `guard.ipv6`, `bypass`, `tunnels`, ...): metrics label on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub outcome: Outcome,
    /// For failures: a self-contained reason, as it appears in the CNI error.
    pub detail: String,
}

impl Check {
    pub fn new(name: impl Into<String>, outcome: Outcome, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            outcome,
            detail: detail.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    Ready,
    NotReady,
    /// IPsec is not required on this node (`required: never`, or `auto`
    /// without any signal).
    NotRequired,
}

/// How the agent's endpoint let the node through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Protection {
    /// `/armed` 200: live protection for the current OVS database.
    Armed,
    /// `/startup` 200 with no durable intent: the controller-authorised initial
    /// preparation (agent phase `Prepared`), plaintext by design.
    Prepared,
}

/// The signals that make protection required under `required: auto`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Signals {
    pub required_file: bool,
    pub protection_socket: bool,
    /// The `ovn-ipsec-protection-*` keys set in OVSDB.
    pub ovsdb_keys: Vec<String>,
}

impl Signals {
    pub fn durable(&self) -> bool {
        self.required_file || !self.ovsdb_keys.is_empty()
    }
    pub fn any(&self) -> bool {
        self.durable() || self.protection_socket
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Evaluation {
    pub verdict: Verdict,
    /// RFC 3339, the `now` the evaluation used.
    pub checked_at: String,
    pub elapsed_ms: u64,
    pub protection_dir: PathBuf,
    pub ovsdb_socket: PathBuf,
    pub signals: Signals,
    pub protection: Option<Protection>,
    pub armed: Option<Answer>,
    pub startup: Option<Answer>,
    pub ovsdb: Option<OvsInfo>,
    pub mark: Option<u32>,
    pub reqid: Option<u32>,
    /// Outbound XFRM policies read back.
    pub policy_count: Option<usize>,
    pub guards: Vec<FamilyGuard>,
    pub bypasses: Vec<XfrmPolicy>,
    /// The private status socket, when configured; its findings never gate.
    pub agent_socket: Option<PathBuf>,
    pub agent: Option<AgentStatus>,
    /// Seconds until the certificate expires (negative: expired).
    pub expires_in_secs: Option<i64>,
    pub checks: Vec<Check>,
    /// Not filled by `evaluate` (not part of the gate); see [`crate::udp::ike_sockets`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ike_sockets: Option<Vec<UdpSocket>>,
}

impl Evaluation {
    pub fn is_ready(&self) -> bool {
        self.verdict != Verdict::NotReady
    }

    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.outcome == Outcome::Fail)
    }

    /// One line naming every failed check, e.g.
    /// `ipsec not ready: guard ipv6 mark 759815 missing; tunnel ovn-6a1f-0 lacks egress_pkt_mark`.
    pub fn summary(&self) -> String {
        match self.verdict {
            Verdict::Ready => match self.protection {
                Some(Protection::Prepared) => {
                    "ipsec ready: initial preparation (plaintext by design)".to_string()
                }
                _ => "ipsec ready".to_string(),
            },
            Verdict::NotRequired => match self.checks.iter().find(|c| c.name == "required") {
                Some(c) => format!("ipsec not required: {}", c.detail),
                None => "ipsec not required".to_string(),
            },
            Verdict::NotReady => {
                let why: Vec<&str> = self.failures().map(|c| c.detail.as_str()).collect();
                format!("ipsec not ready: {}", why.join("; "))
            }
        }
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn answer(a: &Option<Answer>) -> String {
    match a {
        None => "not asked".to_string(),
        Some(a) if a.text.is_empty() => a.code.to_string(),
        Some(a) => format!("{} ({})", a.code, a.text),
    }
}

impl fmt::Display for Evaluation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_verdict(f)?;
        self.fmt_signals(f)?;
        self.fmt_policies(f)?;
        self.fmt_agent_status(f)?;
        self.fmt_ike_sockets(f)?;
        self.fmt_checks(f)
    }
}

impl Evaluation {
    /// The verdict line and the endpoint asked.
    fn fmt_verdict(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match (self.verdict, self.protection) {
            (Verdict::Ready, Some(Protection::Prepared)) => "READY (initial preparation)",
            (Verdict::Ready, _) => "READY",
            (Verdict::NotReady, _) => "NOT READY",
            (Verdict::NotRequired, _) => "NOT REQUIRED",
        };
        writeln!(
            f,
            "IPsec tunnel protection: {verdict} (checked {} in {}ms)",
            self.checked_at, self.elapsed_ms
        )?;
        writeln!(f, "  endpoint:    {}", self.protection_dir.display())?;
        Ok(())
    }

    /// The presence signals, the agent's answers, OVSDB.
    fn fmt_signals(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.signals;
        let keys = if s.ovsdb_keys.is_empty() {
            "none".to_string()
        } else {
            s.ovsdb_keys.join(", ")
        };
        writeln!(
            f,
            "  signals:     required file {}, protection.sock {}, ovsdb keys {keys}",
            yes(s.required_file),
            yes(s.protection_socket)
        )?;
        writeln!(
            f,
            "  agent:       /armed {}, /startup {}",
            answer(&self.armed),
            answer(&self.startup)
        )?;
        match &self.ovsdb {
            Some(o) => writeln!(
                f,
                "  ovsdb:       {} _uuid {} system-id {}, {} OVN tunnel port(s)",
                self.ovsdb_socket.display(),
                o.uuid,
                o.system_id.as_deref().unwrap_or("-"),
                o.tunnel_count
            )?,
            None => writeln!(
                f,
                "  ovsdb:       {} unavailable",
                self.ovsdb_socket.display()
            )?,
        }
        Ok(())
    }

    /// The lease, the XFRM guards (and look-alikes) and bypasses.
    fn fmt_policies(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.mark, self.reqid) {
            (Some(m), Some(r)) => writeln!(f, "  lease:       mark {m} ({m:#x}) reqid {r}")?,
            (Some(m), None) => writeln!(f, "  lease:       mark {m} ({m:#x}), no reqid")?,
            _ => writeln!(f, "  lease:       none")?,
        }
        if let Some(n) = self.policy_count {
            writeln!(f, "  xfrm:        {n} outbound policies")?;
        }
        for g in &self.guards {
            match &g.guard {
                Some(p) => writeln!(f, "  guard {}:  present ({})", g.family, describe(p))?,
                None => writeln!(f, "  guard {}:  MISSING for mark {}", g.family, g.mark)?,
            }
            for p in &g.lookalikes {
                writeln!(f, "    not the guard: {}", describe(p))?;
            }
        }
        if self.mark.is_some() && self.policy_count.is_some() && self.bypasses.is_empty() {
            writeln!(f, "  bypass:      none")?;
        }
        for p in &self.bypasses {
            writeln!(f, "  bypass:      {}", describe(p))?;
        }
        Ok(())
    }

    /// The agent's private status (with `agentSocket`): phase, state,
    /// identity, certificate.
    fn fmt_agent_status(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(path), Some(a)) = (&self.agent_socket, &self.agent) {
            let reason = if a.reason.is_empty() { "-" } else { &a.reason };
            writeln!(
                f,
                "  status:      {} phase {} (reason: {reason})",
                path.display(),
                a.phase
            )?;
            writeln!(
                f,
                "  state:       configurationApplied={} runtimeHealthy={} protectionArmed={}",
                yes(a.configuration_applied),
                yes(a.runtime_healthy),
                yes(a.protection_armed)
            )?;
            writeln!(
                f,
                "  identity:    node {} chassis {} generation {}",
                a.node_uid, a.chassis, a.generation
            )?;
            match self.expires_in_secs {
                Some(s) if s > 0 => writeln!(
                    f,
                    "  certificate: expires {} (in {})",
                    a.expires,
                    human(Duration::from_secs(s.unsigned_abs()))
                )?,
                Some(s) => writeln!(
                    f,
                    "  certificate: EXPIRED {} ({} ago)",
                    a.expires,
                    human(Duration::from_secs(s.unsigned_abs()))
                )?,
                None => writeln!(f, "  certificate: expiry unknown ({:?})", a.expires)?,
            }
        }
        Ok(())
    }

    /// The IKE sockets seen.
    fn fmt_ike_sockets(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(socks) = &self.ike_sockets {
            let list: Vec<String> = socks.iter().map(|s| s.local.to_string()).collect();
            let list = if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            };
            writeln!(f, "  ike sockets: {list}")?;
        }
        Ok(())
    }

    /// Each check with its outcome.
    fn fmt_checks(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "checks:")?;
        for c in &self.checks {
            let o = match c.outcome {
                Outcome::Pass => "ok  ",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
                Outcome::Warn => "warn",
            };
            writeln!(f, "  [{o}] {:<17} {}", c.name, c.detail)?;
        }
        Ok(())
    }
}
