//! The result of an evaluation as plain data: every check with its outcome,
//! what was read from the agent, OVSDB and the kernel, and the verdict.
//! `Display` is for people (`podgate ipsec status`), `Serialize` for logs and
//! `--json`. Nothing in here is key material: the agent status keeps only
//! known non-secret fields and no SA is ever read.

use crate::agent::AgentStatus;
use crate::guard::{describe, FamilyGuard};
use crate::ovsdb::OvsInfo;
use crate::time::human;
use crate::udp::UdpSocket;
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    /// Not run, or informational only (not part of the gate in this state).
    Skip,
}

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
    /// IPsec is not required on this node (`required: never`, or `auto` without an agent).
    NotRequired,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub verdict: Verdict,
    /// RFC 3339, the `now` the evaluation used.
    pub checked_at: String,
    pub elapsed_ms: u64,
    pub agent_socket: PathBuf,
    pub agent: Option<AgentStatus>,
    /// Seconds until the certificate expires (negative: expired).
    pub expires_in_secs: Option<i64>,
    pub min_cert_validity_secs: u64,
    pub ovsdb: Option<OvsInfo>,
    pub mark: Option<u32>,
    pub mark_source: Option<String>,
    /// Outbound XFRM policies read back.
    pub policy_count: Option<usize>,
    pub guards: Vec<FamilyGuard>,
    pub checks: Vec<Check>,
    /// Not filled by `evaluate` (not part of the gate); see [`crate::udp::ike_sockets`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ike_sockets: Option<Vec<UdpSocket>>,
}

impl Report {
    pub fn is_ready(&self) -> bool {
        self.verdict != Verdict::NotReady
    }

    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.outcome == Outcome::Fail)
    }

    /// One line naming every failed check, e.g.
    /// `ipsec not ready: guard ipv4 mark 759815 missing; certificate expires in 4m < 10m`.
    pub fn summary(&self) -> String {
        match self.verdict {
            Verdict::Ready => "ipsec ready".to_string(),
            Verdict::NotRequired => "ipsec not required".to_string(),
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
        "NO"
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.verdict {
            Verdict::Ready => "READY",
            Verdict::NotReady => "NOT READY",
            Verdict::NotRequired => "NOT REQUIRED",
        };
        writeln!(
            f,
            "IPsec tunnel protection: {verdict} (checked {} in {}ms)",
            self.checked_at, self.elapsed_ms
        )?;
        writeln!(f, "  agent:       {}", self.agent_socket.display())?;
        if let Some(a) = &self.agent {
            let reason = if a.reason.is_empty() { "-" } else { &a.reason };
            writeln!(f, "  phase:       {} (reason: {reason})", a.phase)?;
            writeln!(
                f,
                "  state:       configurationApplied={} runtimeHealthy={} protectionArmed={}",
                yes(a.configuration_applied),
                yes(a.runtime_healthy),
                yes(a.protection_armed)
            )?;
            writeln!(
                f,
                "  identity:    node {} generation {} chassis {}",
                a.node_uid, a.generation, a.chassis
            )?;
            let system_id = self.ovsdb.as_ref().and_then(|o| o.system_id.as_deref());
            match system_id {
                Some(id) if id == a.chassis => {
                    writeln!(f, "  chassis:     matches ovsdb system-id")?
                }
                Some(id) => writeln!(f, "  chassis:     MISMATCH: ovsdb system-id is {id}")?,
                None => writeln!(f, "  chassis:     not cross-checked with ovsdb")?,
            }
            writeln!(
                f,
                "  digests:     certificate {} trust {}",
                a.certificate_hash, a.trust_hash
            )?;
            let min = human(Duration::from_secs(self.min_cert_validity_secs));
            match self.expires_in_secs {
                Some(s) if s > 0 => writeln!(
                    f,
                    "  certificate: expires {} (in {}; minimum {min})",
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
        match (self.mark, &self.mark_source) {
            (Some(m), Some(src)) => writeln!(f, "  mark:        {m} ({m:#x}) from {src}")?,
            (Some(m), None) => writeln!(f, "  mark:        {m} ({m:#x})")?,
            _ => writeln!(f, "  mark:        unknown")?,
        }
        if let Some(n) = self.policy_count {
            writeln!(f, "  xfrm:        {n} outbound policies")?;
        }
        for g in &self.guards {
            match &g.guard {
                Some(p) => writeln!(f, "  guard {}:  present ({})", g.family, describe(p))?,
                None => writeln!(f, "  guard {}:  MISSING for mark {}", g.family, g.mark)?,
            }
            for p in &g.other_marks {
                writeln!(f, "    other mark: {}", describe(p))?;
            }
            if g.bypasses.is_empty() {
                writeln!(f, "  bypass {}: none", g.family)?;
            }
            for p in &g.bypasses {
                writeln!(f, "  bypass {}: {}", g.family, describe(p))?;
            }
        }
        if let Some(socks) = &self.ike_sockets {
            let list: Vec<String> = socks.iter().map(|s| s.local.to_string()).collect();
            let list = if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            };
            writeln!(f, "  ike sockets: {list}")?;
        }
        writeln!(f, "checks:")?;
        for c in &self.checks {
            let o = match c.outcome {
                Outcome::Pass => "ok  ",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
            };
            writeln!(f, "  [{o}] {:<16} {}", c.name, c.detail)?;
        }
        Ok(())
    }
}
