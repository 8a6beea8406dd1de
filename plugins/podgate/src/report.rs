//! `podgate report`: everything a maintainer asks for in a bug report, in
//! one archive (or directory), gathered on the node in one command.
//!
//! Each part is collected independently; a part that fails is named in
//! `README.txt` and the rest is still written. Commands that already exist
//! (`inspect`, `ipsec status`, `install --check`) are run as this very
//! binary, so the report shows exactly what an operator would see. Nothing
//! secret is read (no XFRM state dump, no agent keys), and everything copied
//! goes through [`scrub`] on the way in.

mod scrub;
mod tar;

use crate::error::{Error, Found, Result};
use crate::progress::Progress;
use clap::Args;
use podgate_kit::netlink::RouteSocket;
use podgate_kit::netns::NetNs;
use podgate_kit::nft::NftSocket;
use podgate_kit::route::RTPROT_PODGATE;
use podgate_router::record::Record;
use serde_json::Value;
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const ROOT: &str = "podgate-report";
/// A command of ours that takes longer than this is killed and reported.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// At most this much of the end of a log is read.
const MAX_LOG_TAIL: u64 = 16 << 20;

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Where to write: a path ending in .tar is an archive, `-` the archive
    /// on stdout, anything else a new directory
    /// [default: ./podgate-report-<host>-<time>.tar].
    // This text is the --help line, where <host> is a placeholder, not HTML.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(long, short, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// The CNI conf dir (conflists are copied, podgate's entries read).
    #[arg(long, default_value = podgate_install::DEFAULT_CONF_DIR, value_name = "DIR")]
    pub cni_conf_dir: PathBuf,
    /// The CNI bin dir (for the installer check).
    #[arg(long, default_value = podgate_install::DEFAULT_BIN_DIR, value_name = "DIR")]
    pub cni_bin_dir: PathBuf,
    /// podgate-router's stateDir (its records).
    #[arg(long, default_value = podgate_router::config::DEFAULT_STATE_DIR, value_name = "DIR")]
    pub state_dir: PathBuf,
    /// The installer's --state-dir.
    #[arg(long, default_value = podgate_install::DEFAULT_STATE_DIR, value_name = "DIR")]
    pub installer_state_dir: PathBuf,
    /// The installer's --plugins file.
    #[arg(long, default_value = podgate_install::DEFAULT_PLUGINS_FILE, value_name = "FILE")]
    pub plugins: PathBuf,
    /// The node agent's --agent-state-dir (its counters).
    #[arg(long, default_value = podgate_install::agent::DEFAULT_AGENT_STATE_DIR, value_name = "DIR")]
    pub agent_state_dir: PathBuf,
    /// Another log to include (repeatable), e.g. the agent's --log-file.
    /// The plugins' logFile settings are found by themselves.
    #[arg(long = "log", value_name = "FILE")]
    pub logs: Vec<PathBuf>,
    /// Last lines of each log.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub lines: usize,
}

struct Parts {
    files: Vec<(String, Vec<u8>)>,
    index: Vec<String>,
    problems: Vec<String>,
}

impl Parts {
    fn add(&mut self, name: &str, what: &str, body: impl Into<Vec<u8>>) {
        self.files.push((format!("{ROOT}/{name}"), body.into()));
        self.index.push(format!("{name:<40} {what}"));
    }
    fn problem(&mut self, part: &str, e: impl std::fmt::Display) {
        self.problems.push(format!("{part}: {e}"));
    }
}

/// Run this binary with `args`; (exit code, stdout, stderr).
fn run_self(args: &[OsString]) -> std::result::Result<(Option<i32>, String, String), String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let child = std::process::Command::new(&exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(COMMAND_TIMEOUT) {
        Ok(r) => r.map_err(|e| e.to_string())?,
        Err(_) => {
            // Our own child, not reaped yet (the waiting thread still holds it).
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            return Err(format!("timed out after {}s", COMMAND_TIMEOUT.as_secs()));
        }
    };
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn os(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    args.iter().map(|a| a.as_ref().to_os_string()).collect()
}

/// A command's output as a part: `.json` parts hold its stdout alone (one
/// JSON document, stderr noted in README.txt), text parts the command line,
/// exit code, stdout and stderr.
fn command_part(parts: &mut Parts, name: &str, what: &str, args: Vec<OsString>) {
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match run_self(&args) {
        Ok((code, out, err)) => {
            let code = code.map_or("killed".to_string(), |c| c.to_string());
            if name.ends_with(".json") {
                if !err.trim().is_empty() {
                    parts.problem(name, format!("exit {code}: {}", scrub::text(err.trim())));
                }
                parts.add(name, what, scrub::file(out.as_bytes()));
                return;
            }
            let mut text = format!("$ podgate {}\n(exit {code})\n{out}", shown.join(" "));
            if !err.trim().is_empty() {
                text += &format!("--- stderr ---\n{err}");
            }
            parts.add(name, what, scrub::text(&text));
        }
        Err(e) => parts.problem(name, e),
    }
}

fn uname() -> String {
    let Ok(u) = nix::sys::utsname::uname() else {
        return "uname failed".into();
    };
    let f = |b: &std::ffi::OsStr| String::from_utf8_lossy(b.as_bytes()).into_owned();
    format!(
        "sysname:  {}\nnodename: {}\nrelease:  {}\nversion:  {}\nmachine:  {}\n",
        f(u.sysname()),
        f(u.nodename()),
        f(u.release()),
        f(u.version()),
        f(u.machine())
    )
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn version_part(parts: &mut Parts, now: u64) {
    let os_release = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let text = format!(
        "podgate {}\ncreated: {}\nos: {os_release}\n{}",
        env!("CARGO_PKG_VERSION"),
        podgate_cni::log::format_rfc3339(now as i64, 0),
        uname()
    );
    parts.add("version.txt", "podgate and kernel versions", text);
}

fn is_config(name: &str) -> bool {
    [".conflist", ".conf", ".json", ".podgate-orig"]
        .iter()
        .any(|s| name.ends_with(s))
}

/// Every regular file in `dir` for which `want(name)`, sorted, scrubbed.
fn copy_dir(parts: &mut Parts, dir: &Path, into: &str, what: &str, want: impl Fn(&str) -> bool) {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => return parts.problem(into, format!("{}: {e}", dir.display())),
    };
    let mut names: Vec<(String, PathBuf)> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .filter(|(n, _)| want(n))
        .collect();
    names.sort();
    for (name, path) in names {
        match std::fs::read(&path) {
            Ok(b) => parts.add(
                &format!("{into}/{name}"),
                &format!("{what} ({})", path.display()),
                scrub::file(&b),
            ),
            Err(e) => parts.problem(&format!("{into}/{name}"), e),
        }
    }
}

/// podgate's entries in the conf dir's configs and in the plugins file.
fn podgate_entries(a: &ReportArgs) -> Vec<Value> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&a.cni_conf_dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.push(a.plugins.clone());
    for f in files {
        let Ok(v) = std::fs::read(&f).map(|b| serde_json::from_slice::<Value>(&b)) else {
            continue;
        };
        let Ok(v) = v else { continue };
        let list: Vec<Value> = match &v {
            Value::Array(a) => a.clone(),
            Value::Object(o) => match o.get("plugins") {
                Some(Value::Array(p)) => p.clone(),
                _ => vec![v.clone()],
            },
            _ => Vec::new(),
        };
        out.extend(list.into_iter().filter(|e| {
            e.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.starts_with("podgate-"))
        }));
    }
    out
}

fn tail(path: &Path, n: usize) -> std::io::Result<Vec<String>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let from = len.saturating_sub(MAX_LOG_TAIL);
    f.seek(SeekFrom::Start(from))?;
    let mut buf = Vec::new();
    f.take(MAX_LOG_TAIL).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<&str> = text.lines().collect();
    if from > 0 && !lines.is_empty() {
        lines.remove(0); // cut mid-line
    }
    let skip = lines.len().saturating_sub(n);
    Ok(lines.into_iter().skip(skip).map(str::to_string).collect())
}

fn logs_part(parts: &mut Parts, a: &ReportArgs, entries: &[Value]) {
    let mut logs: Vec<PathBuf> = entries
        .iter()
        .filter_map(|e| e.get("logFile").and_then(Value::as_str).map(PathBuf::from))
        .collect();
    logs.extend(a.logs.iter().cloned());
    logs.sort();
    logs.dedup();
    for log in logs {
        let name: String = log
            .display()
            .to_string()
            .trim_start_matches('/')
            .replace('/', "_");
        let mut lines = match tail(&log, a.lines) {
            Ok(l) => l,
            Err(e) => {
                parts.problem(&format!("logs/{name}"), format!("{}: {e}", log.display()));
                continue;
            }
        };
        // Short of N lines: the rotated copy holds the ones before.
        if lines.len() < a.lines {
            if let Ok(mut older) =
                tail(&podgate_cni::log::rotated_path(&log), a.lines - lines.len())
            {
                older.append(&mut lines);
                lines = older;
            }
        }
        let text = scrub::lines(&lines.join("\n"));
        parts.add(
            &format!("logs/{name}"),
            &format!("last {} lines of {} (and .1)", lines.len(), log.display()),
            text,
        );
    }
}

fn node_part(parts: &mut Parts, a: &ReportArgs) {
    let mut sock = match RouteSocket::new() {
        Ok(s) => s,
        Err(e) => return parts.problem("node", format!("netlink: {e}")),
    };
    let links = podgate_kit::link::list(&mut sock).unwrap_or_default();
    match podgate_kit::route::list_all(&mut sock) {
        Ok(routes) => {
            let text: String = routes
                .iter()
                .filter(|r| r.protocol == RTPROT_PODGATE)
                .map(|r| format!("{}\n", crate::routes::row_of(r, &links).line()))
                .collect();
            parts.add(
                "node/routes.txt",
                "routes with podgate's protocol (94), every table",
                if text.is_empty() {
                    "none\n".to_string()
                } else {
                    text
                },
            );
        }
        Err(e) => parts.problem("node/routes.txt", e),
    }
    let mut rules = String::new();
    for v6 in [false, true] {
        match podgate_kit::rule::list(&mut sock, v6) {
            Ok(rs) => {
                for r in rs.iter().filter(|r| r.protocol == RTPROT_PODGATE) {
                    rules += &format!("{}\n", r.describe());
                }
            }
            Err(e) => parts.problem("node/rules.txt", e),
        }
    }
    parts.add(
        "node/rules.txt",
        "policy rules with podgate's protocol (94)",
        if rules.is_empty() {
            "none\n".to_string()
        } else {
            rules
        },
    );
    parts.add(
        "node/nftables.txt",
        "nf_tables tables on the node and podgate's tables in each recorded pod",
        nft_text(a),
    );
}

fn family_name(f: u8) -> &'static str {
    match f {
        1 => "inet",
        2 => "ip",
        3 => "arp",
        5 => "netdev",
        7 => "bridge",
        10 => "ip6",
        _ => "?",
    }
}

fn nft_text(a: &ReportArgs) -> String {
    let mut s = String::from("node:\n");
    match NftSocket::new().and_then(|mut n| n.list_tables()) {
        Ok(tables) if tables.is_empty() => s += "  no tables\n",
        Ok(tables) => {
            for (f, name) in tables {
                s += &format!("  table {} {name}\n", family_name(f));
            }
        }
        Err(e) => s += &format!("  error: {e}\n"),
    }
    let records: Vec<Record> = podgate_router::record::scan(&a.state_dir)
        .map(|infos| infos.into_iter().filter_map(|i| i.record).collect())
        .unwrap_or_default();
    for rec in records {
        let Some(table) = rec.nft_table.clone() else {
            continue;
        };
        s += &format!(
            "pod {}/{}/{} table inet {table}:\n",
            rec.key.network, rec.key.container_id, rec.key.ifname
        );
        let listed = rec
            .netns
            .as_deref()
            .ok_or_else(|| "no netns recorded".to_string())
            .and_then(|p| NetNs::open(p).map_err(|e| e.to_string()))
            .and_then(|ns| {
                ns.run(move || NftSocket::new().and_then(|mut n| n.list_masquerade(&table)))
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
            });
        match listed {
            Ok(None) => s += "  missing\n",
            Ok(Some(rules)) => {
                for r in rules {
                    s += &format!("  {r:?}\n");
                }
            }
            Err(e) => s += &format!("  {e}\n"),
        }
    }
    s
}

pub fn run(a: &ReportArgs) -> Result<Found> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut parts = Parts {
        files: Vec::new(),
        index: Vec::new(),
        problems: Vec::new(),
    };
    let mut progress = Progress::new();
    progress.step("versions ...");
    version_part(&mut parts, now);
    progress.step("CNI configs ...");
    copy_dir(&mut parts, &a.cni_conf_dir, "cni", "CNI config", is_config);
    progress.step("installer ...");
    installer_part(&mut parts, a);
    progress.step("records and drift ...");
    inspect_part(&mut parts, a);
    progress.step("ipsec status ...");
    ipsec_part(&mut parts, a);
    progress.step("node routes, rules, nf_tables ...");
    node_part(&mut parts, a);
    progress.step("logs ...");
    logs_part(&mut parts, a, &podgate_entries(a));
    progress.done();

    let readme = readme(&parts, now);
    parts
        .files
        .insert(0, (format!("{ROOT}/README.txt"), readme.into_bytes()));
    let output = a.output.clone().unwrap_or_else(|| default_output(now));
    let summary = |shown: String| {
        format!(
            "{shown} ({} files{})",
            parts.files.len(),
            if parts.problems.is_empty() {
                String::new()
            } else {
                format!("; {} parts missing, see README.txt", parts.problems.len())
            }
        )
    };
    if output.as_os_str() == "-" {
        // The archive itself on stdout (kubectl exec ... > report.tar).
        let mut out = std::io::stdout().lock();
        tar::write(&mut out, &parts.files, now)?;
        podgate_cni::log::stderr_line(&summary("tar on stdout".into()));
        return Ok(Found::Ok);
    }
    write_out(&output, &parts.files, now)?;
    println!("{}", summary(output.display().to_string()));
    Ok(Found::Ok)
}

/// The installer's plugins file and state, the agent's counters, and what
/// `podgate install --check` says.
fn installer_part(parts: &mut Parts, a: &ReportArgs) {
    if let Ok(b) = std::fs::read(&a.plugins) {
        parts.add(
            "installer/plugins.json",
            "the installer's plugins file",
            scrub::file(&b),
        );
    }
    copy_dir(
        parts,
        &a.installer_state_dir,
        "installer/state",
        "installer state",
        |n| !n.starts_with('.'),
    );
    copy_dir(
        parts,
        &a.agent_state_dir,
        "agent/state",
        "the node agent's counters",
        |n| !n.starts_with('.'),
    );
    command_part(
        parts,
        "installer/check.txt",
        "podgate install --check",
        os(&[
            &"install",
            &"--check",
            &"--cni-conf-dir",
            &a.cni_conf_dir,
            &"--cni-bin-dir",
            &a.cni_bin_dir,
            &"--plugins",
            &a.plugins,
            &"--state-dir",
            &a.installer_state_dir,
        ]),
    );
}

/// `podgate inspect --all`, as text and as JSON.
fn inspect_part(parts: &mut Parts, a: &ReportArgs) {
    for (name, json) in [
        ("records/inspect.txt", false),
        ("records/inspect.json", true),
    ] {
        let mut args = os(&[&"inspect", &"--all", &"--state-dir", &a.state_dir]);
        if json {
            args.push("--json".into());
        }
        command_part(
            parts,
            name,
            "podgate inspect --all: every record with its drift",
            args,
        );
    }
}

/// `podgate ipsec status`, as text and as JSON.
fn ipsec_part(parts: &mut Parts, a: &ReportArgs) {
    for (name, json) in [("ipsec/status.txt", false), ("ipsec/status.json", true)] {
        let mut args = os(&[&"ipsec", &"status", &"--cni-conf-dir", &a.cni_conf_dir]);
        if json {
            args.push("--json".into());
        }
        command_part(
            parts,
            name,
            "podgate ipsec status (never key material)",
            args,
        );
    }
}

/// README.txt: when and where, the contents, what was left out and why.
fn readme(parts: &Parts, now: u64) -> String {
    let mut readme = format!(
        "podgate report, {} on {}\n\nContents:\n",
        podgate_cni::log::format_rfc3339(now as i64, 0),
        hostname()
    );
    for line in &parts.index {
        readme += &format!("  {line}\n");
    }
    readme += "\nKey material is never read (no XFRM state dump, no agent keys); PEM blocks, \
               secret-named JSON values and 0x-hex keys in copied files are redacted.\n";
    if !parts.problems.is_empty() {
        readme += "\nParts that could not be collected:\n";
        for p in &parts.problems {
            readme += &format!("  {p}\n");
        }
    }
    readme
}

/// `podgate-report-<host>-<time>.tar` in the current directory.
fn default_output(now: u64) -> PathBuf {
    PathBuf::from(format!(
        "podgate-report-{}-{}.tar",
        hostname(),
        podgate_cni::log::format_rfc3339(now as i64, 0)
            .replace([':', '-'], "")
            .replace(".000", "")
    ))
}

fn write_out(output: &Path, files: &[(String, Vec<u8>)], now: u64) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |p: &Path, source: std::io::Error| Error::File {
        op: "writing",
        path: p.to_path_buf(),
        source,
    };
    if output.extension().is_some_and(|e| e == "tar") {
        let mut tmp = output.as_os_str().to_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| err(&tmp, e))?;
        let written = tar::write(&mut f, files, now);
        let done = written.and_then(|()| std::fs::rename(&tmp, output).map_err(|e| err(output, e)));
        if done.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        return done;
    }
    std::fs::create_dir(output).map_err(|e| err(output, e))?;
    for (name, body) in files {
        let rel = name.strip_prefix(&format!("{ROOT}/")).unwrap_or(name);
        let path = output.join(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, body))
            .map_err(|e| err(&path, e))?;
    }
    Ok(())
}
