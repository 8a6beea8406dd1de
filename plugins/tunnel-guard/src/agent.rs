//! The agent's *private* status socket (`--runtime-dir`/status.sock,
//! `pkg/ipsec/agent.go` `serveStatus`): `GET /readyz` (200 / 503) and
//! `GET /status` (JSON, always 200). On a node it lives in a 0700 directory of
//! the agent's own container, so the guard uses it only where an operator made
//! it reachable (`agentSocket`), for diagnostics: phase, expiry, identity.

use crate::io::{self, Deadline, IoError};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub use crate::http::parse_response;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("agent {path}: {err}")]
    Io { path: &'static str, err: IoError },
    #[error("agent /status answered {code} with a body that is not status JSON: {why}")]
    Json { code: u16, why: String },
}

/// `agent.go` `Status`: it "deliberately excludes certificate contents,
/// private keys and SA keys"; only these fields are read, anything else is
/// dropped unseen. Empty fields are omitted by the agent (`omitempty`,
/// `omitzero`); `generation`, `certificateHash`, `trustHash` are bare
/// lowercase SHA-256 hex digests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub phase: String,
    #[serde(default)]
    pub reason: String,
    #[serde(rename = "nodeUID", default)]
    pub node_uid: String,
    #[serde(default)]
    pub chassis: String,
    #[serde(default)]
    pub generation: String,
    #[serde(default)]
    pub certificate_hash: String,
    #[serde(default)]
    pub trust_hash: String,
    #[serde(default)]
    pub configuration_applied: bool,
    #[serde(default)]
    pub runtime_healthy: bool,
    #[serde(default)]
    pub protection_armed: bool,
    /// RFC 3339 (Go `time.Time`); absent before a certificate exists.
    #[serde(default)]
    pub expires: String,
}

/// A SHA-256 digest as the agent prints it: 64 lowercase hex digits.
pub fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl AgentStatus {
    /// Identity fields that are empty or malformed (`preparation.go`
    /// `identityPrepared` needs all of them).
    pub fn missing_identity(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (k, v) in [("nodeUID", &self.node_uid), ("chassis", &self.chassis)] {
            if v.trim().is_empty() {
                out.push(k);
            }
        }
        for (k, v) in [
            ("generation", &self.generation),
            ("certificateHash", &self.certificate_hash),
            ("trustHash", &self.trust_hash),
        ] {
            if !is_digest(v) {
                out.push(k);
            }
        }
        out
    }
}

/// `GET /readyz`: the status code.
pub fn readyz(socket: &Path, dl: &Deadline) -> Result<u16, AgentError> {
    get(socket, "/readyz", dl).map(|(code, _)| code)
}

/// `GET /status`, parsed.
pub fn status(socket: &Path, dl: &Deadline) -> Result<AgentStatus, AgentError> {
    let (code, body) = get(socket, "/status", dl)?;
    serde_json::from_slice(&body).map_err(|e| AgentError::Json {
        code,
        why: e.to_string(),
    })
}

fn get(socket: &Path, path: &'static str, dl: &Deadline) -> Result<(u16, Vec<u8>), AgentError> {
    let io_err = |err| AgentError::Io { path, err };
    let s = io::connect(socket, dl).map_err(io_err)?;
    crate::http::get(s, path, dl).map_err(io_err)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_status_lacks_identity_until_generation_and_both_hashes_are_set() {
        let s: AgentStatus = serde_json::from_str(
            r#"{"phase":"Running","reason":"","nodeUID":"u1","chassis":"c1","generation":"GEN",
                "certificateHash":"CERT","trustHash":"TRUST","configurationApplied":true,
                "runtimeHealthy":true,"protectionArmed":true,"expires":"2030-01-01T00:00:00Z",
                "privateKey":"must be ignored"}"#,
        )
        .unwrap();
        assert_eq!(s.generation, "GEN");
        assert_eq!(
            s.missing_identity(),
            ["generation", "certificateHash", "trustHash"]
        );
        let hex = "a".repeat(64);
        let json = format!(
            r#"{{"phase":"Running","nodeUID":"u1","chassis":"c1","generation":"{hex}",
                "certificateHash":"{hex}","trustHash":"{hex}","configurationApplied":true,
                "runtimeHealthy":true,"protectionArmed":true,"expires":"2030-01-01T00:00:00Z"}}"#
        );
        let s: AgentStatus = serde_json::from_str(&json).unwrap();
        assert!(s.missing_identity().is_empty());
        let s: AgentStatus = serde_json::from_str(r#"{"phase":"WaitingTrust"}"#).unwrap();
        assert_eq!(
            s.missing_identity(),
            [
                "nodeUID",
                "chassis",
                "generation",
                "certificateHash",
                "trustHash"
            ]
        );
        assert!(serde_json::from_str::<AgentStatus>(r#"{"phase":1}"#).is_err());
        assert!(!serde_json::to_string(&s).unwrap().contains("privateKey"));
    }
}
