//! CNI errors as the spec defines them: a numeric code, a message, details,
//! printed as JSON on stdout with a non-zero exit.

use serde_json::{json, Value};

/// Well-known error codes (CNI spec, "Error" section). 1-99 are reserved for
/// the spec; podgate's own codes start at 100.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// A podgate plugin refused what the pod asked for (policy).
    pub const POLICY_REFUSED: u32 = 100;
    /// Applying a change to the kernel failed.
    pub const APPLY_FAILED: u32 = 101;
    /// The plugin panicked; the panic hook still answers with JSON.
    pub const INTERNAL: u32 = 999;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CNI error {code}: {msg}{}", if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    pub fn incompatible_version(msg: impl Into<String>) -> Self {
        Self::new(code::INCOMPATIBLE_VERSION, msg)
    }
    pub fn invalid_env(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_ENV, msg)
    }
    pub fn io(msg: impl Into<String>) -> Self {
        Self::new(code::IO_FAILURE, msg)
    }
    pub fn decode(msg: impl Into<String>) -> Self {
        Self::new(code::DECODE, msg)
    }
    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_CONFIG, msg)
    }
    pub fn try_again(msg: impl Into<String>) -> Self {
        Self::new(code::TRY_AGAIN_LATER, msg)
    }
    pub fn not_available(msg: impl Into<String>) -> Self {
        Self::new(code::NOT_AVAILABLE, msg)
    }
    pub fn policy(msg: impl Into<String>) -> Self {
        Self::new(code::POLICY_REFUSED, msg)
    }
    pub fn apply(msg: impl Into<String>) -> Self {
        Self::new(code::APPLY_FAILED, msg)
    }

    /// The JSON object the spec asks for on stdout.
    pub fn to_json(&self, cni_version: &str) -> Value {
        let mut v = json!({"cniVersion": cni_version, "code": self.code, "msg": self.msg});
        if !self.details.is_empty() {
            if let Some(o) = v.as_object_mut() {
                o.insert("details".into(), Value::String(self.details.clone()));
            }
        }
        v
    }
}
