//! The dispatcher every plugin's main calls: env + stdin in, JSON out, exit code.
//! `dispatch` is pure over its inputs so the whole protocol is unit-testable.

use crate::config::{Attachment, NetConf};
use crate::env::{self, Command, Env};
use crate::error::CniError;
use crate::event;
use crate::result::{self, Added, PrevResult};
use crate::version::{self, Version, LATEST, SUPPORTED_VERSIONS};
use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Upper bound on stdin: configs with annotations and prevResults are small;
/// anything larger is hostile or broken and must not make us allocate without bound.
pub const MAX_STDIN: u64 = 4 << 20;

/// What a verb is asked with, after the protocol layer validated it.
#[derive(Debug, Clone)]
pub struct Request {
    pub command: Command,
    pub env: Env,
    pub conf: NetConf,
    pub version: Version,
}

pub trait Plugin {
    /// The result to print: [`Added::PrevResult`] for a chained plugin that
    /// changes nothing (prevResult's own text goes out when it is in the
    /// config's shape), or a result of its own (raw JSON in any of the
    /// shapes; converted to the config's version by the dispatcher).
    fn add(&self, req: &Request) -> Result<Added, CniError>;
    fn del(&self, req: &Request) -> Result<(), CniError>;
    fn check(&self, req: &Request) -> Result<(), CniError>;
    fn status(&self, _conf: &NetConf) -> Result<(), CniError> {
        Ok(())
    }
    fn gc(&self, _conf: &NetConf, _valid: &[Attachment]) -> Result<(), CniError> {
        Ok(())
    }
}

/// What the process prints on stdout and exits with.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub stdout: String,
    pub exit: i32,
}

/// The config's version once it is known to be one of ours (index + 1 in
/// [`SUPPORTED_VERSIONS`]; 0: not yet), for the panic hook's error.
static ERROR_VERSION: AtomicUsize = AtomicUsize::new(0);

fn error_version() -> &'static str {
    ERROR_VERSION
        .load(Ordering::Relaxed)
        .checked_sub(1)
        .and_then(|i| SUPPORTED_VERSIONS.get(i))
        .copied()
        .unwrap_or(LATEST)
}

fn fail(version: &str, e: &CniError) -> Outcome {
    Outcome {
        stdout: e.to_json(version).to_string(),
        exit: 1,
    }
}

fn ok(stdout: String) -> Outcome {
    Outcome { stdout, exit: 0 }
}

/// For a chained plugin that changes the result: prevResult as a JSON
/// tree, or an empty result.
pub fn prev_or_empty(conf: &NetConf) -> Result<Map<String, Value>, CniError> {
    conf.prev_result
        .as_ref()
        .map_or_else(|| Ok(Map::new()), PrevResult::raw)
}

pub fn dispatch<P: Plugin>(
    plugin: &P,
    vars: impl Fn(&str) -> Option<String>,
    stdin: impl Read,
) -> Outcome {
    dispatch_observed(plugin, vars, stdin, &mut |_| {})
}

/// [`dispatch`], calling `on_request` once the request is valid and before
/// the verb runs (where [`run`] starts recording the event). stdin is read
/// only once the verb is known: a binary run by hand without `CNI_COMMAND`
/// answers without waiting for a terminal's end of input.
pub fn dispatch_observed<P: Plugin>(
    plugin: &P,
    vars: impl Fn(&str) -> Option<String>,
    stdin: impl Read,
    on_request: &mut dyn FnMut(&Request),
) -> Outcome {
    let Some(cmd_str) = vars("CNI_COMMAND").filter(|s| !s.is_empty()) else {
        return fail(
            LATEST,
            &CniError::invalid_env("required env variable CNI_COMMAND is missing"),
        );
    };
    let Some(command) = Command::parse(&cmd_str) else {
        return fail(
            LATEST,
            &CniError::invalid_env(format!(
                "unknown CNI_COMMAND {:?}",
                env::truncate(&cmd_str, 40)
            )),
        );
    };

    let mut bytes = Vec::new();
    if let Err(e) = stdin.take(MAX_STDIN + 1).read_to_end(&mut bytes) {
        return fail(LATEST, &CniError::io(format!("reading stdin: {e}")));
    }
    if bytes.len() as u64 > MAX_STDIN {
        return fail(
            LATEST,
            &CniError::decode(format!("stdin is larger than {MAX_STDIN} bytes")),
        );
    }

    if command == Command::Version {
        return ok(version_answer(&bytes));
    }

    let conf = match NetConf::parse(&bytes) {
        Ok(c) => c,
        Err(e) => return fail(LATEST, &e),
    };
    let version = match version::require_supported(&conf.cni_version) {
        Ok(v) => v,
        Err(e) => return fail(LATEST, &e),
    };
    let v = conf.cni_version.clone();
    if let Some(i) = SUPPORTED_VERSIONS.iter().position(|s| *s == v) {
        ERROR_VERSION.store(i + 1, Ordering::Relaxed);
    }

    let min = match command {
        Command::Check => Some(Version::V0_4_0),
        Command::Status | Command::Gc => Some(Version::V1_1_0),
        _ => None,
    };
    if let Some(min) = min.filter(|m| version < *m) {
        return fail(
            &v,
            &CniError::incompatible_version(format!(
                "{cmd_str} needs cniVersion >= {}.{}.{}, config is {v}",
                min.0, min.1, min.2
            )),
        );
    }

    let env = match env::from_vars(command, &vars) {
        Ok(e) => e,
        Err(e) => return fail(&v, &e),
    };
    if matches!(command, Command::Add | Command::Check | Command::Del) && conf.name.is_empty() {
        return fail(&v, &CniError::invalid_config("network config has no name"));
    }

    let req = Request {
        command,
        env,
        conf,
        version,
    };
    on_request(&req);
    let res = match command {
        Command::Add => plugin
            .add(&req)
            .and_then(|added| result::render(added, req.conf.prev_result.as_ref(), &v)),
        Command::Del => plugin.del(&req).map(|_| String::new()),
        Command::Check => plugin.check(&req).map(|_| String::new()),
        Command::Status => plugin.status(&req.conf).map(|_| String::new()),
        Command::Gc => req
            .conf
            .valid_attachments()
            .and_then(|valid| plugin.gc(&req.conf, &valid))
            .map(|_| String::new()),
        // Answered before the config is parsed (stdin may be empty).
        Command::Version => Ok(version_answer(&bytes)),
    };
    match res {
        Ok(out) => ok(out),
        Err(e) => fail(&v, &e),
    }
}

/// The VERSION answer, in the asked version when we speak it.
fn version_answer(stdin: &[u8]) -> String {
    let asked = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| LATEST.to_string());
    json!({"cniVersion": asked, "supportedVersions": SUPPORTED_VERSIONS}).to_string()
}

/// A panic must still answer the runtime with a CNI error on stdout.
pub fn install_panic_hook(plugin_name: &'static str) {
    std::panic::set_hook(Box::new(move |info| {
        let where_ = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let version = error_version();
        let e = CniError::new(
            crate::error::code::INTERNAL,
            format!("{plugin_name}: internal error (panic)"),
        )
        .with_details(format!("{payload}{where_}"));
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", e.to_json(version));
        let _ = out.flush();
        crate::log::stderr_line(&format!("{plugin_name}: panic: {payload}{where_}"));
        std::process::exit(1);
    }));
}

/// `(code, msg)` of an answer: 0 on success, else the error JSON's.
fn answer_code(o: &Outcome) -> (u32, String) {
    if o.exit == 0 {
        return (0, String::new());
    }
    let v: Value = serde_json::from_str(&o.stdout).unwrap_or(Value::Null);
    let code = v
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u32::try_from(c).ok())
        .unwrap_or(crate::error::code::INTERNAL);
    let msg = v
        .get("msg")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    (code, msg)
}

/// Print `stdout` and its newline. With the newline last, std's line-buffered
/// stdout hands the whole text to one `write(2)` (more only if the pipe
/// takes part of it), so a reader sees the whole result or none of it. A
/// closed stdout is not a panic (std ignores SIGPIPE, the write gets
/// `EPIPE`): the exit code still tells the runtime what happened.
fn answer(stdout: &str) {
    if stdout.is_empty() {
        return;
    }
    let mut line = String::with_capacity(stdout.len() + 1);
    line.push_str(stdout);
    line.push('\n');
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
}

/// The whole main of a plugin binary: `fn main() { podgate_cni::run(...) }`.
pub fn run<P: Plugin>(plugin: P, plugin_name: &'static str, about: &str) -> ! {
    install_panic_hook(plugin_name);
    if std::env::var_os("CNI_COMMAND").is_none() {
        crate::log::stderr_line(&format!("{about}, version {}", crate::build_version()));
    }
    let started = std::time::Instant::now();
    let mut recorder = None;
    let outcome = dispatch_observed(
        &plugin,
        |k| std::env::var(k).ok(),
        std::io::stdin().lock(),
        &mut |req| {
            recorder = event::Recorder::start(
                &event::file_for(&req.conf),
                plugin_name,
                req.command.as_str(),
                started,
            );
        },
    );
    answer(&outcome.stdout);
    // After the answer: recording is best effort and must not delay it.
    if let Some(r) = recorder {
        let (code, msg) = answer_code(&outcome);
        r.finish(code, &msg);
    }
    std::process::exit(outcome.exit)
}
