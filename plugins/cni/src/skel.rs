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
/// [`SUPPORTED_VERSIONS`]; 0: not yet), for the panic hook's error. An
/// atomic in `.bss`, not a `OnceLock<String>` in `.data`: that one cost two
/// page faults per call (its page read, then written).
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
/// the verb runs (where [`run`] starts recording the event).
pub fn dispatch_observed<P: Plugin>(
    plugin: &P,
    vars: impl Fn(&str) -> Option<String>,
    stdin: impl Read,
    on_request: &mut dyn FnMut(&Request),
) -> Outcome {
    let read = || {
        let mut bytes = Vec::new();
        stdin
            .take(MAX_STDIN + 1)
            .read_to_end(&mut bytes)
            .map(|_| bytes)
    };
    dispatch_read(plugin, vars, read, on_request)
}

/// stdin to its end, at most `max` bytes and one more (to tell "too
/// large"), with `read(2)` on fd 0 straight into the buffer: std's
/// `read_to_end` over a plain `Read` zero-fills the room before every read
/// (8 KiB at a time: two pages touched for an 800-byte config), and its
/// `Stdin` adds a lock and a buffer of its own.
fn read_stdin(max: u64) -> std::io::Result<Vec<u8>> {
    // Room for a usual config and its prevResult: read in one call.
    let mut buf: Vec<u8> = Vec::with_capacity(16 << 10);
    while buf.len() as u64 <= max {
        if buf.len() == buf.capacity() {
            buf.reserve(buf.capacity());
        }
        let room = buf.spare_capacity_mut();
        // SAFETY: read(2) writes at most room.len() bytes into the
        // vector's spare capacity; only what it wrote is counted in.
        let n = unsafe { libc::read(0, room.as_mut_ptr().cast(), room.len()) };
        match usize::try_from(n) {
            Ok(0) => break,
            // SAFETY: the first n bytes of the spare capacity were written.
            Ok(n) => unsafe { buf.set_len(buf.len() + n) },
            Err(_) => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    // What was not used goes back (the bump arena shrinks its last block
    // in place), so what is allocated next shares the page.
    buf.shrink_to_fit();
    Ok(buf)
}

/// [`dispatch_observed`] with stdin read by `read`, once the verb is known
/// (a binary run by hand without `CNI_COMMAND` answers without waiting
/// for a terminal's end of input).
fn dispatch_read<P: Plugin>(
    plugin: &P,
    vars: impl Fn(&str) -> Option<String>,
    read: impl FnOnce() -> std::io::Result<Vec<u8>>,
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

    let bytes = match read() {
        Ok(b) => b,
        Err(e) => return fail(LATEST, &CniError::io(format!("reading stdin: {e}"))),
    };
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

/// What std's runtime start would have done before `main` and a plugin
/// needs. The plugin binaries are `#![no_main]` (their C `main` calls
/// [`run`]), which skips std's start-up: reading `/proc/self/maps` through
/// `pthread_getattr_np` for the main thread's stack guard (43k of the 93k
/// instructions of a bare start), an alternate signal stack and
/// SIGSEGV/SIGBUS handlers, about 15 syscalls (README "Where a masquerade
/// ADD's time goes"). The price is that a stack overflow is a plain SIGSEGV
/// without std's message. Two parts of std's start stay, because without
/// them a plugin can do harm:
///
/// * fds 0-2 that are closed are reopened on `/dev/null`, as std does:
///   otherwise the next file or socket opened gets fd 1 or 2. Today every
///   file is closed before the answer is written, but a warning logged to
///   stderr while, say, the guard's agent socket sat on fd 2 would go into
///   that socket; one `poll` per call keeps that from ever mattering.
/// * SIGPIPE is ignored: a runtime that closed our stdout, or an agent that
///   hung up its socket, must be an `EPIPE` the plugin handles (the event is
///   still recorded, the guard still answers), not a silent death by signal.
///
/// Harmless if std's start-up did run (an ordinary `fn main`): it then finds
/// the fds open and SIGPIPE already ignored.
pub fn process_start() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: poll reads and writes only the three pollfds it is given.
    let polled = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
    if polled != 0 {
        for pfd in fds
            .iter()
            .filter(|p| polled < 0 || p.revents & libc::POLLNVAL != 0)
        {
            // poll itself failed: ask each fd whether it exists.
            // SAFETY: fcntl(F_GETFD) only reads the fd's flags.
            if polled < 0 && unsafe { libc::fcntl(pfd.fd, libc::F_GETFD) } != -1 {
                continue;
            }
            // The lowest free fd is the closed one (they are visited in order).
            // SAFETY: open(2) of a constant NUL-terminated path.
            let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
            if fd != pfd.fd {
                // No stdout to answer on, and no /dev/null to stand in for it.
                std::process::exit(1);
            }
        }
    }
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Print `stdout` and its newline in one `write(2)` on fd 1 (more only if
/// the pipe takes part of it), so a reader sees the whole result or none
/// of it. Not through std's `Stdout`: its line buffer writes up to the
/// last newline inside the text (a prevResult passed through keeps the
/// caller's line breaks) and the rest separately, and it costs a lock and a
/// buffer for one write.
fn answer(stdout: &str) {
    if stdout.is_empty() {
        return;
    }
    let mut line = String::with_capacity(stdout.len() + 1);
    line.push_str(stdout);
    line.push('\n');
    let _ = RawFd(1).write_all(line.as_bytes());
}

/// Our own stdout (fd 1), written with `write(2)` and nothing in between.
struct RawFd(libc::c_int);

impl Write for RawFd {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // SAFETY: write(2) reads at most buf.len() bytes from buf.
        let n = unsafe { libc::write(self.0, buf.as_ptr().cast(), buf.len()) };
        usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The whole main of a plugin binary.
pub fn run<P: Plugin>(plugin: P, plugin_name: &'static str, about: &str) -> ! {
    process_start();
    install_panic_hook(plugin_name);
    if std::env::var_os("CNI_COMMAND").is_none() {
        crate::log::stderr_line(about);
    }
    let started = std::time::Instant::now();
    let mut recorder = None;
    let outcome = dispatch_read(
        &plugin,
        |k| std::env::var(k).ok(),
        || read_stdin(MAX_STDIN),
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
    // C's exit, not std's: `std::process::exit` first runs std's clean-up,
    // which sets up std's stdout only to flush it (two page faults of a
    // `.data` page, read then written, for nothing: the answer went out on
    // fd 1 directly and nothing else writes through std's stdout). The
    // panic hook, which does, flushes it itself.
    // SAFETY: exit(3) runs the C at-exit handlers and ends the process; no
    // other thread is running here.
    unsafe { libc::exit(outcome.exit) }
}
