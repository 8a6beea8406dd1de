//! JSON-lines logging to a file (`logFile`) or stderr. Never stdout: stdout
//! belongs to the CNI protocol.

use serde_json::{json, Map, Value};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone)]
pub struct Logger {
    file: Option<PathBuf>,
    base: Map<String, Value>,
}

impl Logger {
    /// `file` None logs warnings and errors to stderr only.
    pub fn new(plugin: &str, file: Option<&Path>) -> Logger {
        let mut base = Map::new();
        base.insert("plugin".into(), Value::String(plugin.into()));
        Logger {
            file: file.map(Path::to_path_buf),
            base,
        }
    }

    /// Add a field carried by every line (container ID, command, pod).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Logger {
        self.base.insert(key.into(), value.into());
        self
    }

    pub fn info(&self, msg: &str, fields: Value) {
        self.write("info", msg, fields);
    }
    pub fn warn(&self, msg: &str, fields: Value) {
        self.write("warn", msg, fields);
    }
    pub fn error(&self, msg: &str, fields: Value) {
        self.write("error", msg, fields);
    }

    fn write(&self, level: &str, msg: &str, fields: Value) {
        let mut line = self.base.clone();
        line.insert("ts".into(), Value::String(rfc3339_now()));
        line.insert("level".into(), Value::String(level.into()));
        line.insert("msg".into(), Value::String(msg.into()));
        if let Value::Object(f) = fields {
            line.extend(f);
        }
        let text = Value::Object(line).to_string();
        match &self.file {
            Some(path) => {
                // Append-only single write per line: concurrent plugin processes
                // interleave whole lines, not fragments.
                let res = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|mut f| f.write_all(format!("{text}\n").as_bytes()));
                if let Err(e) = res {
                    stderr_line(&format!("log file {}: {e}; {text}", path.display()));
                }
            }
            None if level != "info" => stderr_line(&text),
            None => {}
        }
    }
}

/// Best effort: a closed or full stderr must not turn logging into a panic.
pub fn stderr_line(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// UTC time as RFC 3339 with milliseconds, without pulling a date crate.
pub fn rfc3339_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_rfc3339(d.as_secs() as i64, d.subsec_millis())
}

pub fn format_rfc3339(secs: i64, millis: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Convenience for call sites: `fields!{"k": v}` is just `json!`.
pub fn fields(v: Value) -> Value {
    if v.is_object() {
        v
    } else {
        json!({ "value": v })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339(1_796_000_000, 5), "2026-11-30T00:53:20.005Z");
        assert_eq!(format_rfc3339(951_782_400, 0), "2000-02-29T00:00:00.000Z");
    }
}
