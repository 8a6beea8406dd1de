//! The installer's and the agent's own log: one line on stderr
//! (`<RFC 3339 time> podgate <component>: <msg>`) and, with `--log-file`, a
//! JSON line in a size-bounded file; every line at an explicit level.

use crate::AgentLogArgs;
use podgate_cni::log::Level;

/// The log settings and the component name (`installer` or `agent`).
static AGENT_LOG: std::sync::OnceLock<(AgentLogArgs, &'static str)> = std::sync::OnceLock::new();

pub(crate) fn set(args: &AgentLogArgs, component: &'static str) {
    let _ = AGENT_LOG.set((args.clone(), component));
}

/// A line at level info.
pub(crate) fn info(msg: impl std::fmt::Display) {
    at(Level::Info, &msg.to_string());
}

/// A line at level warn, its message after `warning: `.
pub(crate) fn warn(msg: impl std::fmt::Display) {
    at(Level::Warn, &format!("warning: {msg}"));
}

/// A line at `level`, unless `--log-level` is below it.
pub(crate) fn at(level: Level, msg: &str) {
    use podgate_cni::log::{append_line, rfc3339_now, Limit};
    let (cfg, component) = match AGENT_LOG.get() {
        Some((c, name)) => (Some(c), *name),
        None => (None, "installer"),
    };
    if level > cfg.map_or(podgate_cni::log::Level::Info, |c| c.log_level) {
        return;
    }
    let ts = rfc3339_now();
    podgate_cni::log::stderr_line(&format!("{ts} podgate {component}: {msg}"));
    if let Some((file, max)) = cfg.and_then(|c| c.log_file.as_ref().map(|f| (f, c.log_max_bytes))) {
        let line = serde_json::json!({"ts": ts, "level": level.as_str(), "component": format!("podgate-{component}"), "msg": msg});
        let max = max.max(podgate_cni::log::MIN_MAX_BYTES);
        if let Err(e) = append_line(file, &line.to_string(), Limit::Rotate(max)) {
            podgate_cni::log::stderr_line(&format!(
                "{ts} podgate {component}: log file {}: {e}",
                file.display()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The level is the caller's, not guessed from the text: an info line
    /// that happens to start with "warning" (a pod in a namespace named
    /// so) stays below `--log-level warn`; a warning is at warn, its
    /// message after `warning: `. (The settings are set once per process:
    /// lines of other tests may be in the file too.)
    #[test]
    fn the_level_is_the_callers() {
        let (_tmp, dir) = crate::testing::scratch_dir("podgate-logging-");
        let file = dir.join("installer.log");
        set(
            &AgentLogArgs {
                log_level: Level::Warn,
                log_file: Some(file.clone()),
                log_max_bytes: podgate_cni::log::DEFAULT_MAX_BYTES,
            },
            "installer",
        );
        info("warning-ns/web-0: stopped before it was adopted: nothing applied");
        warn("sweep /s: a record nobody can read");
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(
            !lines
                .iter()
                .any(|l| l["msg"].as_str().unwrap().starts_with("warning-ns/web-0")),
            "{text}"
        );
        let warned: Vec<&serde_json::Value> = lines
            .iter()
            .filter(|l| l["msg"] == "warning: sweep /s: a record nobody can read")
            .collect();
        assert_eq!(warned.len(), 1, "{text}");
        assert_eq!(warned[0]["level"], "warn");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
