//! The docs checked against the code, over every `*.md` file git tracks:
//!
//! * every relative link resolves to a tracked file or directory, and every
//!   `#anchor` to a heading of the file it names;
//! * every `podgate ...` command line in a code block parses: its
//!   subcommand path exists and each `--flag` it uses is in that
//!   subcommand's `--help` (the built binary's);
//! * every metric `podgate_*` the docs name appears in a real scrape of the
//!   node agent (root: the agent runs in a test node netns).
//!
//! Which lines count as command lines: in `sh`/`bash`/`console`/`ini` and
//! unlabelled code blocks every line; in `text` blocks (transcripts) only
//! lines starting with `$ ` (the rest is output); in any code block an
//! exec-form array whose first item is podgate (`["podgate", "install"]`);
//! and inline code spans that start with `podgate `. A command is the words
//! after the `podgate` binary (bare, as a path, or after `=`) where a shell
//! runs it (first, after an operator, `sudo`, `exec` or `--`), up to a shell
//! operator.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::agent::{self, Agent};
use podgate_integration::{require_root, workspace_root, TestNode};
use serde_json::json;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// Code-block lines that show `podgate` but are deliberately not a command
/// line of the binary. Keep this tiny.
const NOT_COMMANDS: &[&str] = &[];

struct Doc {
    /// Relative to the workspace root.
    path: PathBuf,
    text: String,
}

/// Every tracked file (for links) and every tracked `*.md` (the docs).
fn tracked() -> Vec<String> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(workspace_root())
        .output()
        .expect("running git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .split('\0')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn docs() -> Vec<Doc> {
    let docs: Vec<Doc> = tracked()
        .into_iter()
        .filter(|p| p.ends_with(".md"))
        .map(|p| Doc {
            text: std::fs::read_to_string(workspace_root().join(&p))
                .unwrap_or_else(|e| panic!("{p}: {e}")),
            path: PathBuf::from(p),
        })
        .collect();
    assert!(
        docs.iter().any(|d| d.path == Path::new("README.md")),
        "no tracked README.md: is this a git checkout?"
    );
    docs
}

/// A fenced code block: its info string and its lines with line numbers.
struct Block {
    lang: String,
    lines: Vec<(usize, String)>,
}

/// Splits a markdown text into prose lines and fenced code blocks.
fn split(text: &str) -> (Vec<(usize, &str)>, Vec<Block>) {
    let mut prose = Vec::new();
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                open = Some(Block {
                    lang: info.trim().to_string(),
                    lines: Vec::new(),
                });
            }
            (Some(_), Some(_)) => blocks.push(open.take().unwrap()),
            (Some(b), None) => b.lines.push((n, line.to_string())),
            (None, None) => prose.push((n, line)),
        }
    }
    assert!(open.is_none(), "unclosed code block");
    (prose, blocks)
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces
/// to dashes; repeats get `-1`, `-2`, ...
fn anchors(text: &str) -> HashSet<String> {
    let (prose, _) = split(text);
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    for (_, line) in prose {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        let Some(title) = line.get(hashes..).and_then(|t| t.strip_prefix(' ')) else {
            continue;
        };
        if hashes == 0 || hashes > 6 {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// Targets of inline links `[text](target)` in a prose line (code spans
/// removed first).
fn link_targets(line: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            plain.push(c);
        }
    }
    let mut out = Vec::new();
    let mut rest = plain.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        out.push(rest[..end].trim().to_string());
        rest = &rest[end..];
    }
    out
}

/// `base/rel` with `.` and `..` resolved; None when it leaves the root.
fn resolve(base: &Path, rel: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in base.join(rel).components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// Every broken relative link or anchor, as "file:line: why".
fn broken_links(docs: &[Doc], files: &[String]) -> Vec<String> {
    let files: HashSet<&str> = files.iter().map(String::as_str).collect();
    let is_dir = |p: &str| {
        let prefix = format!("{}/", p.trim_end_matches('/'));
        p.is_empty() || files.iter().any(|f| f.starts_with(&prefix))
    };
    let by_path: HashMap<&Path, &Doc> = docs.iter().map(|d| (d.path.as_path(), d)).collect();
    let mut bad = Vec::new();
    for doc in docs {
        let (prose, _) = split(&doc.text);
        for (n, line) in prose {
            for target in link_targets(line) {
                let at = format!("{}:{n}: ({target})", doc.path.display());
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let dir = doc.path.parent().unwrap_or(Path::new(""));
                let Some(path) = (if file.is_empty() {
                    Some(doc.path.clone())
                } else {
                    resolve(dir, file)
                }) else {
                    bad.push(format!("{at} leaves the repository"));
                    continue;
                };
                let p = path.to_string_lossy().to_string();
                if !files.contains(p.as_str()) && !is_dir(&p) {
                    bad.push(format!("{at}: no tracked file or directory {p}"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                match by_path.get(path.as_path()) {
                    Some(target_doc) if anchors(&target_doc.text).contains(anchor) => {}
                    Some(_) => bad.push(format!("{at}: no heading #{anchor} in {p}")),
                    None => bad.push(format!("{at}: an anchor into {p}, which is not markdown")),
                }
            }
        }
    }
    bad
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let docs = docs();
    let bad = broken_links(&docs, &tracked());
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn a_broken_link_or_anchor_is_reported() {
    let doc = |path: &str, text: &str| Doc {
        path: PathBuf::from(path),
        text: text.to_string(),
    };
    let files = vec!["README.md".to_string(), "a/b.md".to_string()];
    let docs = vec![
        doc(
            "README.md",
            "# Top\n[ok](a/b.md#the-part) [ok](#top) [dir](a/) [web](https://x.y/z)\n\
             [gone](a/c.md) [bad anchor](a/b.md#nope) [up](../x.md)\n```sh\n[not a link](nowhere)\n```\n",
        ),
        doc("a/b.md", "## The part\n[back](../README.md#top)\n"),
    ];
    let bad = broken_links(&docs, &files);
    assert_eq!(bad.len(), 3, "{bad:#?}");
    assert!(
        bad[0].contains("no tracked file or directory a/c.md"),
        "{bad:#?}"
    );
    assert!(bad[1].contains("no heading #nope"), "{bad:#?}");
    assert!(bad[2].contains("leaves the repository"), "{bad:#?}");
}

/// `podgate <path> --help` of the built binary, cached.
struct Helps {
    bin: PathBuf,
    cache: HashMap<Vec<String>, String>,
}

impl Helps {
    fn new() -> Helps {
        let bin = podgate_integration::built(&["podgate"], &["-p", "podgate"]).remove(0);
        Helps {
            bin,
            cache: HashMap::new(),
        }
    }

    fn help(&mut self, path: &[String]) -> &str {
        let bin = self.bin.clone();
        self.cache.entry(path.to_vec()).or_insert_with(|| {
            let out = Command::new(&bin)
                .args(path)
                .arg("--help")
                .output()
                .expect("running podgate --help");
            assert!(
                out.status.success(),
                "podgate {} --help failed: {}",
                path.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        })
    }
}

/// The subcommands a `--help` lists (names and aliases), each with its name.
fn subcommands(help: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Some(start) = help.find("\nCommands:\n") else {
        return out;
    };
    for line in help[start + 11..].lines() {
        if line.trim().is_empty() {
            break;
        }
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        out.insert(name.to_string(), name.to_string());
        for tag in ["[aliases: ", "[alias: "] {
            if let Some(i) = line.find(tag) {
                let list = &line[i + tag.len()..];
                for alias in list.trim_end_matches(']').split(',') {
                    out.insert(alias.trim().to_string(), name.to_string());
                }
            }
        }
    }
    out
}

/// Whether `flag` (`--name` or `-x`) is one of the options a `--help` lists.
fn help_has_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let before = help[..i].chars().next_back();
        let after = help[i + flag.len()..].chars().next();
        matches!(before, Some(' ' | '\n' | '[' | '('))
            && matches!(after, None | Some(' ' | ',' | '=' | '\n' | '<' | ']' | ')'))
    })
}

/// The words of each `podgate` command in a shell line.
fn podgate_commands(line: &str) -> Vec<Vec<String>> {
    let line = match line.find(" #") {
        Some(i) => &line[..i],
        None => line,
    };
    let words: Vec<String> = line
        .split_whitespace()
        .map(|w| w.trim_matches(|c| c == '"' || c == '\''))
        .map(str::to_string)
        .collect();
    // The binary itself, bare or as a path (`ExecStart=/usr/local/bin/podgate`).
    let is_podgate = |w: &str| {
        let w = w.rsplit('=').next().unwrap_or(w);
        let w = w.trim_start_matches("$(");
        w == "podgate" || w.ends_with("/podgate")
    };
    let is_operator = |w: &str| {
        matches!(w, "|" | "||" | "&&" | ";" | "&" | ")" | "<")
            || w.starts_with('>')
            || w.starts_with("2>")
            || w.starts_with('|')
    };
    // Where a word is run, not passed: first, after an operator, `sudo`,
    // `exec` or kubectl's `--`, or in `$(...)`.
    let runs = |i: usize| {
        i == 0
            || words[i].starts_with("$(")
            || words.get(i - 1).is_some_and(|p| {
                is_operator(p) || p.ends_with(';') || matches!(p.as_str(), "sudo" | "exec" | "--")
            })
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        if is_podgate(&words[i]) && runs(i) {
            let mut cmd = Vec::new();
            i += 1;
            while i < words.len() && !is_operator(&words[i]) {
                let w = words[i].trim_end_matches([';', ')']);
                cmd.push(w.to_string());
                let ends = words[i].ends_with(';') || words[i].ends_with(')');
                i += 1;
                if ends {
                    break;
                }
            }
            out.push(cmd);
        } else {
            i += 1;
        }
    }
    out
}

/// Why a command does not parse against the binary's help, if it does not.
fn command_problem(helps: &mut Helps, words: &[String]) -> Option<String> {
    let shown = |path: &[String]| {
        std::iter::once("podgate")
            .chain(path.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut path: Vec<String> = Vec::new();
    let mut rest = words.iter().peekable();
    loop {
        let subs = subcommands(helps.help(&path));
        if subs.is_empty() {
            break;
        }
        let Some(word) = rest.next() else {
            return Some(format!("`{}` needs a subcommand", shown(&path)));
        };
        match subs.get(word.as_str()) {
            Some(name) => path.push(name.clone()),
            None => {
                return Some(format!(
                    "`{word}` is not a subcommand of `{}`",
                    shown(&path)
                ))
            }
        }
    }
    let help = helps.help(&path).to_string();
    for word in rest {
        let word = word.trim_start_matches('[').trim_end_matches(']');
        let flag = if word.starts_with("--") && word.len() > 2 {
            word.split('=').next().unwrap_or(word)
        } else if word.len() == 2 && word.starts_with('-') && word != "--" {
            word
        } else {
            continue;
        };
        if !help_has_flag(&help, flag) {
            return Some(format!("`{flag}` is not an option of `{}`", shown(&path)));
        }
    }
    None
}

/// Inline code spans of the prose (a span may continue on the next line of
/// its paragraph), with the line each starts on.
fn code_spans(prose: &[(usize, &str)]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String)> = None;
    let mut last = 0;
    for (n, line) in prose {
        if *n != last + 1 || line.trim().is_empty() {
            open = None; // a new paragraph: an unclosed backtick was literal
        }
        last = *n;
        for (i, part) in line.split('`').enumerate() {
            if i > 0 {
                open = match open.take() {
                    Some((start, text)) => {
                        out.push((start, text.trim().to_string()));
                        None
                    }
                    None => Some((*n, String::new())),
                };
            }
            if let Some((_, text)) = &mut open {
                text.push_str(part);
            }
        }
        if let Some((_, text)) = &mut open {
            text.push(' ');
        }
    }
    out
}

/// An exec-form array that runs podgate, in any code block (a manifest's
/// `command: ["/usr/local/bin/podgate", "uninstall"]`), as a command line.
fn exec_array(line: &str) -> Option<String> {
    let start = line.find('[')?;
    let end = start + line[start..].find(']')?;
    let items: Vec<&str> = line[start + 1..end]
        .split(',')
        .map(|i| i.trim().trim_matches('"'))
        .collect();
    let first = items.first()?;
    (*first == "podgate" || first.ends_with("/podgate")).then(|| items.join(" "))
}

/// Every command line the docs show, as (where, the line): in code blocks
/// and in inline code spans that start with `podgate `.
fn command_lines(docs: &[Doc]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for doc in docs {
        let (prose, blocks) = split(&doc.text);
        for (n, span) in code_spans(&prose) {
            if span.starts_with("podgate ") {
                out.push((format!("{}:{n}", doc.path.display()), span));
            }
        }
        for b in blocks {
            for (n, line) in &b.lines {
                if let Some(cmd) = exec_array(line) {
                    out.push((format!("{}:{n}", doc.path.display()), cmd));
                }
            }
            let lang = b.lang.split_whitespace().next().unwrap_or("");
            let transcript = lang == "text";
            if !transcript && !matches!(lang, "" | "sh" | "bash" | "console" | "shell" | "ini") {
                continue;
            }
            let mut joined: Option<(usize, String)> = None;
            for (n, line) in &b.lines {
                let (start, mut text) = joined.take().unwrap_or((*n, String::new()));
                text.push_str(line.trim());
                if let Some(cut) = text.strip_suffix('\\') {
                    joined = Some((start, format!("{cut} ")));
                    continue;
                }
                let cmd = if transcript {
                    match text.strip_prefix("$ ") {
                        Some(c) => c.to_string(),
                        None => continue,
                    }
                } else {
                    text.strip_prefix("$ ").unwrap_or(&text).to_string()
                };
                out.push((format!("{}:{start}", doc.path.display()), cmd));
            }
        }
    }
    out
}

/// Every command line that does not parse, as "file:line: `line`: why".
fn unparsed_commands(helps: &mut Helps, lines: &[(String, String)]) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut bad = Vec::new();
    for (at, line) in lines {
        if NOT_COMMANDS.contains(&line.as_str()) {
            continue;
        }
        for words in podgate_commands(line) {
            checked += 1;
            if let Some(why) = command_problem(helps, &words) {
                bad.push(format!("{at}: `{line}`: {why}"));
            }
        }
    }
    (checked, bad)
}

#[test]
fn every_podgate_command_line_in_the_docs_parses_against_its_help() {
    let docs = docs();
    let mut helps = Helps::new();
    let (checked, bad) = unparsed_commands(&mut helps, &command_lines(&docs));
    assert!(
        bad.is_empty(),
        "{} of {checked} podgate command lines in the docs do not parse:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(
        checked >= 20,
        "only {checked} podgate command lines found in the docs: is the extraction broken?"
    );
}

#[test]
fn a_wrong_subcommand_or_flag_in_a_doc_is_reported() {
    let text = "```sh\nsudo podgate install --check --source-dir /x   # ok\n\
                kubectl exec pod -- podgate sysctl get --k8s-pod a/b x | head\n\
                sudo install -m 0755 target/release/podgate /usr/local/bin/\n\
                podgate sysctl frob\npodgate install --no-such-flag\n\
                podgate diagnose --netns /n \\\n  --pol 10.8.0.0/24\n```\n\
                ```text\n$ podgate route ls --json\npodgate diagnose: this is output\n```\n\
                Run `podgate inspect --all` or `podgate ipsec status\n--no-such-ipsec-flag`; `podgate` alone is a name.\n\
                ```yaml\ncommand: [\"/usr/local/bin/podgate\", \"uninstal\"]\nname: podgate\n```\n";
    let docs = vec![Doc {
        path: PathBuf::from("x.md"),
        text: text.to_string(),
    }];
    let mut helps = Helps::new();
    let (checked, bad) = unparsed_commands(&mut helps, &command_lines(&docs));
    assert_eq!(checked, 9, "{bad:#?}");
    assert_eq!(bad.len(), 5, "{bad:#?}");
    assert!(
        bad[0].starts_with("x.md:14:") && bad[0].contains("`--no-such-ipsec-flag`"),
        "{bad:#?}"
    );
    let bad = &bad[1..];
    assert!(
        bad[0].contains("`frob` is not a subcommand of `podgate sysctl`"),
        "{bad:#?}"
    );
    assert!(
        bad[1].contains("`--no-such-flag` is not an option of `podgate install`"),
        "{bad:#?}"
    );
    assert!(
        bad[2].starts_with("x.md:7:") && bad[2].contains("`--pol`"),
        "{bad:#?}"
    );
    assert!(
        bad[3].starts_with("x.md:17:") && bad[3].contains("`uninstal` is not a subcommand"),
        "{bad:#?}"
    );
}

/// Metric names the docs mention: `podgate_` words that are not a Rust
/// path or one of the workspace's crate names.
fn metric_names(docs: &[Doc]) -> BTreeSet<String> {
    let crates: HashSet<String> = tracked()
        .iter()
        .filter(|p| p.ends_with("Cargo.toml"))
        .filter_map(|p| std::fs::read_to_string(workspace_root().join(p)).ok())
        .filter_map(|t| {
            let line = t.lines().find(|l| l.trim_start().starts_with("name = "))?;
            Some(line.split('"').nth(1)?.replace('-', "_"))
        })
        .collect();
    let mut out = BTreeSet::new();
    for doc in docs {
        let t = &doc.text;
        for (i, _) in t.match_indices("podgate_") {
            if t[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
            {
                continue;
            }
            let name: String = t[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let after = &t[i + name.len()..];
            // `podgate_*`, `podgate_ipsec_*`: a family of names, not one.
            if after.starts_with("::") || name.ends_with('_') || crates.contains(&name) {
                continue;
            }
            out.insert(name);
        }
    }
    out
}

/// Names a scrape shows: sample names and the families of `# HELP`/`# TYPE`.
fn scraped_names(body: &str) -> HashSet<String> {
    body.lines()
        .filter_map(|l| {
            let l = l
                .strip_prefix("# HELP ")
                .or_else(|| l.strip_prefix("# TYPE "))
                .unwrap_or(l);
            if l.starts_with('#') {
                return None;
            }
            l.split(['{', ' ']).next().map(str::to_string)
        })
        .collect()
}

/// The names not in the scrape `body`. A counter may be named with or
/// without `_total`; a histogram by its family name.
fn missing_metrics(names: &BTreeSet<String>, body: &str) -> Vec<String> {
    let scraped = scraped_names(body);
    let found = |n: &String| {
        scraped.contains(n)
            || scraped.contains(&format!("{n}_total"))
            || n.strip_suffix("_total")
                .is_some_and(|f| scraped.contains(f))
    };
    names.iter().filter(|n| !found(n)).cloned().collect()
}

#[test]
fn a_metric_missing_from_the_scrape_is_reported() {
    let docs = vec![Doc {
        path: PathBuf::from("m.md"),
        text: "`podgate_up` and `podgate_requests_total{a=\"b\"}`, `podgate_lat_seconds`, \
               `podgate_gone`; not metrics: `podgate_cni::log`, `podgate_integration`, `my_podgate_x`"
            .to_string(),
    }];
    let names = metric_names(&docs);
    assert_eq!(
        names.iter().map(String::as_str).collect::<Vec<_>>(),
        [
            "podgate_gone",
            "podgate_lat_seconds",
            "podgate_requests_total",
            "podgate_up"
        ]
    );
    let body = "# HELP podgate_up up\n# TYPE podgate_up gauge\npodgate_up 1\n\
                # TYPE podgate_requests counter\npodgate_requests_total{a=\"b\"} 2\n\
                # TYPE podgate_lat_seconds histogram\npodgate_lat_seconds_bucket{le=\"+Inf\"} 0\n";
    assert_eq!(missing_metrics(&names, body), ["podgate_gone"]);
}

/// A stand-in for the IPsec agent's private status socket (`GET /readyz`,
/// `GET /status` in the agent's JSON shape), so that the agent's
/// certificate expiry is exported too.
fn serve_agent_status(socket: &Path) {
    let listener = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let body = if req.starts_with(b"GET /status") {
                r#"{"phase":"Running","expires":"2099-01-01T00:00:00Z"}"#
            } else {
                "ok"
            };
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

#[test]
fn every_metric_the_docs_name_appears_in_a_real_scrape() {
    require_root();
    podgate_integration::built_shipped();
    let names = metric_names(&docs());
    assert!(
        names.len() >= 10,
        "only {} podgate_* metric names found in the docs: {names:?}",
        names.len()
    );
    let node = TestNode::new("docs");
    let status = node.root().join("agent-status.sock");
    serve_agent_status(&status);
    node.write_conflist(
        "10-docsnet",
        &node.bridge_conflist("docsnet", "1.0.0", "10.25.0.0/16", vec![]),
    );
    let entries = json!([
        {"type": "podgate-tunnel-guard", "required": "always", "mode": "audit",
         "agentSocket": status, "eventFile": node.event_file()},
        {"type": "podgate-router", "stateDir": node.state_dir(),
         "profiles": {"vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}}}}
    ]);
    std::fs::write(
        node.root().join("plugins.json"),
        serde_json::to_vec(&entries).unwrap(),
    )
    .unwrap();
    let agent = Agent::start(&node);
    let body = agent::wait_for(&node, &agent, "a scrape with the chain in place", |b| {
        b.lines().any(|l| l == "podgate_install_ready 1")
    });
    let missing = missing_metrics(&names, &body);
    assert!(
        missing.is_empty(),
        "metrics named in the docs but not in a scrape: {missing:?}\n--- /metrics ---\n{body}"
    );
    agent.kill();
}
