//! The CNI_* environment a runtime sets for every call.

use crate::error::CniError;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            _ => return None,
        })
    }

    /// The verb as `CNI_COMMAND` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }
}

/// Everything a plugin learns from its environment.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub container_id: String,
    pub netns: Option<PathBuf>,
    pub ifname: String,
    /// CNI_ARGS as ordered key/value pairs. Untrusted: comes from the runtime on behalf of the pod.
    pub args: Vec<(String, String)>,
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Look up one CNI_ARGS key (e.g. `K8S_POD_NAMESPACE`).
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parse `K=V;K2=V2`. Keys we do not know are kept (IgnoreUnknown or not: a
/// chained plugin must tolerate keys meant for other plugins).
pub fn parse_cni_args(s: &str) -> Result<Vec<(String, String)>, CniError> {
    let mut out = Vec::new();
    for pair in s.split(';').filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(CniError::invalid_env(format!(
                "CNI_ARGS: {pair:?} is not KEY=VALUE"
            )));
        };
        if k.is_empty() {
            return Err(CniError::invalid_env("CNI_ARGS: empty key"));
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// Container IDs per spec: non-empty, alphanumerics plus `_ . -`.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    if id.is_empty() {
        return Err(CniError::invalid_env("CNI_CONTAINERID is empty"));
    }
    if id.len() > 1024
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(CniError::invalid_env(format!(
            "CNI_CONTAINERID {:?} has characters outside [A-Za-z0-9_.-]",
            truncate(id, 80)
        )));
    }
    Ok(())
}

/// Interface names as the kernel accepts them (IFNAMSIZ 16 incl. NUL).
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let bad = name.is_empty()
        || name.len() > 15
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    if bad {
        return Err(CniError::invalid_env(format!(
            "CNI_IFNAME {:?} is not a valid interface name (1-15 chars, no '/', ':' or spaces)",
            truncate(name, 80)
        )));
    }
    Ok(())
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Read the environment for `cmd`, requiring what the spec requires for it.
pub fn from_vars(cmd: Command, get: impl Fn(&str) -> Option<String>) -> Result<Env, CniError> {
    let required = |name: &str| -> Result<String, CniError> {
        match get(name) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(CniError::invalid_env(format!(
                "required env variable {name} is missing"
            ))),
        }
    };
    let mut env = Env {
        path: get("CNI_PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default(),
        ..Env::default()
    };
    if matches!(cmd, Command::Add | Command::Del | Command::Check) {
        env.container_id = required("CNI_CONTAINERID")?;
        validate_container_id(&env.container_id)?;
        env.ifname = required("CNI_IFNAME")?;
        validate_ifname(&env.ifname)?;
        env.netns = match cmd {
            // DEL must work when the sandbox's netns is already gone.
            Command::Del => get("CNI_NETNS")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            _ => Some(PathBuf::from(required("CNI_NETNS")?)),
        };
        if let Some(a) = get("CNI_ARGS") {
            env.args = parse_cni_args(&a)?;
        }
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn args_parse_and_tolerate_unknown_keys() {
        let a = parse_cni_args(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=vpn;K8S_POD_NAME=openvpn-0;FOO=bar=baz",
        )
        .unwrap();
        assert_eq!(a.len(), 4);
        assert_eq!(a[3], ("FOO".into(), "bar=baz".into()));
        assert!(parse_cni_args("novalue").is_err());
        assert!(parse_cni_args("=x").is_err());
        assert!(parse_cni_args("").unwrap().is_empty());
    }

    #[test]
    fn command_names_round_trip() {
        for c in [
            Command::Add,
            Command::Del,
            Command::Check,
            Command::Version,
            Command::Status,
            Command::Gc,
        ] {
            assert_eq!(Command::parse(c.as_str()), Some(c));
        }
    }

    #[test]
    fn add_needs_netns_del_does_not() {
        let base = [("CNI_CONTAINERID", "abc"), ("CNI_IFNAME", "eth0")];
        let e = from_vars(Command::Add, vars(&base)).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("CNI_NETNS"));
        let env = from_vars(Command::Del, vars(&base)).unwrap();
        assert!(env.netns.is_none());
        assert!(from_vars(Command::Status, vars(&[])).is_ok());
    }

    #[test]
    fn rejects_bad_names() {
        assert!(validate_ifname("0123456789abcdef").is_err());
        assert!(validate_ifname("eth/0").is_err());
        assert!(validate_ifname("..").is_err());
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_container_id("a b").is_err());
        assert!(validate_container_id("ab-1_2.3").is_ok());
    }
}
