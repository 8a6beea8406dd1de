//! One pass of install, check or uninstall over a node's CNI dirs.
//!
//! Install order: binaries first, then the chain, so a chain never names a
//! plugin the runtime cannot find. Uninstall goes the other way round.

use super::chain::{self, converted_name, kind_of, Kind, List, ORIG_SUFFIX};
use super::fsx;
use super::json::Json;
use super::state::{Backup, StateDir};
use super::validate::{self, BINARIES};
use super::InstallError;
use std::path::{Path, PathBuf};

/// Where things are on this node.
#[derive(Debug, Clone)]
pub struct Node {
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub state: StateDir,
}

/// What the installer chains, from where.
#[derive(Debug, Clone)]
pub struct Source {
    pub binaries_dir: PathBuf,
    pub plugins_file: PathBuf,
    /// `--primary`: a file name in the conf dir.
    pub primary: Option<String>,
}

/// What one install pass did to the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Unchanged {
        file: String,
    },
    /// `fresh`: the file held no podgate entries (new, or rewritten by its owner).
    Updated {
        file: String,
        fresh: bool,
    },
    Converted {
        from: String,
        to: String,
    },
}

impl Applied {
    pub fn file(&self) -> &str {
        match self {
            Applied::Unchanged { file } | Applied::Updated { file, .. } => file,
            Applied::Converted { to, .. } => to,
        }
    }

    /// Whether podgate's entries had to be put back into a primary's own write.
    pub fn fresh(&self) -> bool {
        match self {
            Applied::Unchanged { .. } => false,
            Applied::Updated { fresh, .. } => *fresh,
            Applied::Converted { .. } => true,
        }
    }
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Applied::Unchanged { file } => write!(f, "{file} already chained"),
            Applied::Updated { file, .. } => write!(f, "chained podgate into {file}"),
            Applied::Converted { from, to } => write!(
                f,
                "converted {from} into {to} with podgate chained ({from} kept as {from}{ORIG_SUFFIX})"
            ),
        }
    }
}

/// podgate's entries from the plugins file, validated as the plugins would.
pub fn load_entries(path: &Path) -> Result<Vec<Json>, InstallError> {
    let text = fsx::read(path).map_err(|source| InstallError::PluginsFile {
        path: path.into(),
        msg: source.to_string(),
    })?;
    let entries = chain::parse_entries(&text).map_err(|e| InstallError::PluginsFile {
        path: path.into(),
        msg: e.to_string(),
    })?;
    validate::validate_entries(&entries).map_err(|e| InstallError::PluginsFile {
        path: path.into(),
        msg: e.to_string(),
    })?;
    Ok(entries)
}

/// Copy the plugin binaries that differ. Returns the names written.
pub fn install_binaries(src: &Source, node: &Node) -> Result<Vec<&'static str>, InstallError> {
    std::fs::create_dir_all(&node.bin_dir)
        .map_err(|e| fsx::IoError::new("creating", &node.bin_dir, e))?;
    let mut written = Vec::new();
    for name in BINARIES {
        if fsx::install_executable(&src.binaries_dir.join(name), &node.bin_dir.join(name))? {
            written.push(name);
        }
    }
    Ok(written)
}

/// The first binary that is missing or differs from the source, if any.
fn stale_binary(src: &Source, node: &Node) -> Result<Option<&'static str>, InstallError> {
    for name in BINARIES {
        let want = fsx::read(&src.binaries_dir.join(name))?;
        if !fsx::executable_with(&node.bin_dir.join(name), &want)? {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

pub fn remove_binaries(node: &Node) -> Result<Vec<&'static str>, InstallError> {
    let mut removed = Vec::new();
    for name in BINARIES {
        if fsx::remove(&node.bin_dir.join(name))? {
            removed.push(name);
        }
    }
    Ok(removed)
}

/// The file a runtime loads first: the first `.conflist`/`.conf`/`.json` in
/// bytewise order (libcni's `ConfFiles`, as containerd and CRI-O use it), or
/// `--primary` (followed to its conversion once podgate converted it).
fn find_primary(node: &Node, src: &Source) -> Result<String, InstallError> {
    if let Some(name) = &src.primary {
        if node.conf_dir.join(name).exists() {
            return Ok(name.clone());
        }
        if kind_of(name) == Some(Kind::Single) {
            let target = converted_name(name);
            let ours = node
                .state
                .load(&target)?
                .is_some_and(|b| b.converted_from.as_deref() == Some(name));
            if ours && node.conf_dir.join(&target).exists() {
                return Ok(target);
            }
        }
        return Err(InstallError::PrimaryMissing {
            name: name.clone(),
            dir: node.conf_dir.clone(),
        });
    }
    fsx::list_files(&node.conf_dir)?
        .into_iter()
        .find(|n| kind_of(n).is_some())
        .ok_or_else(|| InstallError::NoPrimary(node.conf_dir.clone()))
}

/// Read a conf-dir file that was just listed; vanishing meanwhile is a race
/// with its writer, not a failure.
fn read_listed(node: &Node, name: &str) -> Result<Vec<u8>, InstallError> {
    fsx::read(&node.conf_dir.join(name)).map_err(|e| {
        if e.not_found() {
            InstallError::Vanished(name.into())
        } else {
            e.into()
        }
    })
}

fn mode_or_default(path: &Path) -> u32 {
    fsx::mode_of(path).unwrap_or(0o644)
}

/// Put `entries` at the end of the primary's chain (converting a single
/// `.conf` first), then give back any file chained before that is no longer
/// the primary.
pub fn apply(node: &Node, src: &Source, entries: &[Json]) -> Result<Applied, InstallError> {
    let name = find_primary(node, src)?;
    let text = read_listed(node, &name)?;
    let applied = match kind_of(&name) {
        Some(Kind::Single) => convert(node, &name, &text, entries)?,
        _ => chain_list(node, &name, &text, entries)?,
    };
    for b in node.state.list()? {
        if b.file != applied.file() {
            restore(node, &b)?;
        }
    }
    Ok(applied)
}

fn chain_list(
    node: &Node,
    name: &str,
    text: &[u8],
    entries: &[Json],
) -> Result<Applied, InstallError> {
    let list = List::parse(name, text)?;
    list.check_chainable(name)?;
    if list.is_chained(entries) {
        return Ok(Applied::Unchanged { file: name.into() });
    }
    let out = list
        .merged(entries)
        .to_text()
        .map_err(InstallError::Encode)?;
    // Rewriting our own earlier write (new entries): keep the real original.
    let (original, converted_from) = match node.state.load(name)? {
        Some(b) if b.written.as_bytes() == text => (b.original, b.converted_from),
        // Still our conversion, edited by someone: the `.conf` stays what
        // uninstall restores (if the rest still matches it then).
        Some(b) if b.converted_from.is_some() => (b.original, b.converted_from),
        _ if list.has_podgate() => (None, None),
        _ => (Some(utf8(name, text)?), None),
    };
    let path = node.conf_dir.join(name);
    // The record goes first: a crash before the write leaves a record that
    // does not match the file, which uninstall then handles semantically.
    node.state.save(&Backup {
        file: name.into(),
        written: out.clone(),
        original,
        converted_from,
    })?;
    fsx::atomic_write(&path, out.as_bytes(), mode_or_default(&path))?;
    Ok(Applied::Updated {
        file: name.into(),
        fresh: !list.has_podgate(),
    })
}

/// A single-plugin `.conf` becomes `<stem>.conflist` with podgate chained;
/// the `.conf` is then renamed to `<name>.podgate-orig` so the runtime does
/// not load it first. Writing the conflist before renaming means the runtime
/// always finds a config (the unchained `.conf` sorts first meanwhile).
fn convert(
    node: &Node,
    name: &str,
    text: &[u8],
    entries: &[Json],
) -> Result<Applied, InstallError> {
    let list = List::from_single(name, text)?;
    list.check_chainable(name)?;
    let target = converted_name(name);
    let target_path = node.conf_dir.join(&target);
    if let Some(existing) = fsx::read_opt(&target_path)? {
        let ours = node
            .state
            .load(&target)?
            .is_some_and(|b| b.converted_from.as_deref() == Some(name))
            || List::parse(&target, &existing).is_ok_and(|l| l.has_podgate());
        if !ours {
            return Err(InstallError::Conflict {
                conf: name.into(),
                target,
            });
        }
    }
    let out = list
        .merged(entries)
        .to_text()
        .map_err(InstallError::Encode)?;
    let conf_path = node.conf_dir.join(name);
    node.state.save(&Backup {
        file: target.clone(),
        written: out.clone(),
        original: Some(utf8(name, text)?),
        converted_from: Some(name.into()),
    })?;
    fsx::atomic_write(&target_path, out.as_bytes(), mode_or_default(&conf_path))?;
    fsx::rename(
        &conf_path,
        &node.conf_dir.join(format!("{name}{ORIG_SUFFIX}")),
    )?;
    Ok(Applied::Converted {
        from: name.into(),
        to: target,
    })
}

fn utf8(name: &str, text: &[u8]) -> Result<String, InstallError> {
    String::from_utf8(text.to_vec()).map_err(|_| InstallError::NotUtf8(name.into()))
}

/// Ok(file) when the chain is in place with exactly these entries and the
/// binaries are current; Err(reason) otherwise.
pub fn status(
    node: &Node,
    src: &Source,
    entries: &[Json],
) -> Result<Result<String, String>, InstallError> {
    if let Some(bin) = stale_binary(src, node)? {
        return Ok(Err(format!(
            "{bin} in {} is missing or differs from {}",
            node.bin_dir.display(),
            src.binaries_dir.display()
        )));
    }
    let name = match find_primary(node, src) {
        Ok(n) => n,
        Err(e) if e.is_transient() => return Ok(Err(e.to_string())),
        Err(e) => return Err(e),
    };
    if kind_of(&name) == Some(Kind::Single) {
        return Ok(Err(format!(
            "{name} is a single-plugin config: not converted and chained yet"
        )));
    }
    let text = match read_listed(node, &name) {
        Ok(t) => t,
        Err(e) if e.is_transient() => return Ok(Err(e.to_string())),
        Err(e) => return Err(e),
    };
    Ok(match List::parse(&name, &text) {
        Err(e) => Err(e.to_string()),
        Ok(list) if list.is_chained(entries) => Ok(name),
        Ok(list) if list.has_podgate() => Err(format!(
            "{name} holds other podgate entries than {}",
            src.plugins_file.display()
        )),
        Ok(_) => Err(format!("{name} has no podgate entries")),
    })
}

/// Give a chained file back: its original bytes while it still holds what
/// podgate wrote, else the current content minus podgate's entries.
fn restore(node: &Node, b: &Backup) -> Result<String, InstallError> {
    let path = node.conf_dir.join(&b.file);
    let conversion = match (&b.converted_from, &b.original) {
        (Some(conf), orig) => Some((conf.as_str(), orig.as_deref())),
        _ => None,
    };
    let msg = match fsx::read_opt(&path)? {
        Some(cur) if cur == b.written.as_bytes() => match (conversion, &b.original) {
            (Some((conf, orig)), _) => {
                restore_conf(node, conf, orig)?;
                fsx::remove(&path)?;
                format!("restored {conf}, removed {}", b.file)
            }
            (None, Some(orig)) => {
                fsx::atomic_write(&path, orig.as_bytes(), mode_or_default(&path))?;
                format!("restored {} byte for byte", b.file)
            }
            (None, None) => strip_file(node, &b.file, &cur)?,
        },
        Some(cur) => match (conversion, List::parse(&b.file, &cur)) {
            (_, Err(e)) => format!("left {} alone: {e}", b.file),
            (Some((conf, Some(orig))), Ok(list))
                if List::from_single(conf, orig.as_bytes())
                    .is_ok_and(|l| l.same(&list.stripped().unwrap_or_else(|| list.clone()))) =>
            {
                restore_conf(node, conf, Some(orig))?;
                fsx::remove(&path)?;
                format!("restored {conf}, removed {}", b.file)
            }
            _ => strip_file(node, &b.file, &cur)?,
        },
        None => match conversion {
            Some((conf, orig)) => {
                restore_conf(node, conf, orig)?;
                format!("restored {conf}")
            }
            None => format!("{} is gone", b.file),
        },
    };
    node.state.remove(&b.file)?;
    Ok(msg)
}

/// Put a converted `.conf` back: its renamed original, or the recorded bytes.
/// A `.conf` the primary has rewritten since wins over both.
fn restore_conf(node: &Node, conf: &str, original: Option<&str>) -> Result<(), InstallError> {
    let conf_path = node.conf_dir.join(conf);
    let orig_path = node.conf_dir.join(format!("{conf}{ORIG_SUFFIX}"));
    if conf_path.exists() {
        fsx::remove(&orig_path)?;
    } else if orig_path.exists() {
        fsx::rename(&orig_path, &conf_path)?;
    } else if let Some(o) = original {
        fsx::atomic_write(&conf_path, o.as_bytes(), 0o644)?;
    }
    Ok(())
}

/// Remove podgate's entries from a conflist, keeping everything else.
fn strip_file(node: &Node, name: &str, text: &[u8]) -> Result<String, InstallError> {
    let list = match List::parse(name, text) {
        Ok(l) => l,
        Err(e) => return Ok(format!("left {name} alone: {e}")),
    };
    let Some(stripped) = list.stripped() else {
        return Ok(format!("{name} has no podgate entries"));
    };
    if stripped.plugins().is_empty() {
        return Ok(format!("left {name} alone: it holds only podgate plugins"));
    }
    let path = node.conf_dir.join(name);
    let out = stripped.to_text().map_err(InstallError::Encode)?;
    fsx::atomic_write(&path, out.as_bytes(), mode_or_default(&path))?;
    Ok(format!("removed podgate entries from {name}"))
}

/// Take podgate out of every conflist in the conf dir: recorded files get
/// their original bytes back, converted `.conf` files return, and any other
/// conflist holding podgate entries loses just those.
pub fn unchain_all(node: &Node) -> Result<Vec<String>, InstallError> {
    let _lock = node.state.lock()?;
    let mut msgs = Vec::new();
    for b in node.state.list()? {
        msgs.push(restore(node, &b)?);
    }
    let files = match fsx::list_files(&node.conf_dir) {
        Ok(f) => f,
        Err(e) if e.not_found() => return Ok(msgs),
        Err(e) => return Err(e.into()),
    };
    for name in &files {
        if kind_of(name) == Some(Kind::List) {
            if let Some(text) = fsx::read_opt(&node.conf_dir.join(name))? {
                if List::parse(name, &text).is_ok_and(|l| l.has_podgate()) {
                    msgs.push(strip_file(node, name, &text)?);
                }
            }
        }
    }
    // Renamed `.conf` files without a record (state dir lost).
    for name in &files {
        if let Some(conf) = name.strip_suffix(ORIG_SUFFIX) {
            msgs.push(restore_orphan(node, conf)?);
        }
    }
    Ok(msgs)
}

fn restore_orphan(node: &Node, conf: &str) -> Result<String, InstallError> {
    let orig_path = node.conf_dir.join(format!("{conf}{ORIG_SUFFIX}"));
    if node.conf_dir.join(conf).exists() {
        fsx::remove(&orig_path)?;
        return Ok(format!("removed stale {conf}{ORIG_SUFFIX}"));
    }
    let target = converted_name(conf);
    let target_path = node.conf_dir.join(&target);
    let orig = fsx::read(&orig_path)?;
    match fsx::read_opt(&target_path)? {
        None => {}
        Some(t) => {
            let same = match (List::parse(&target, &t), List::from_single(conf, &orig)) {
                (Ok(cur), Ok(want)) => cur.stripped().unwrap_or(cur).same(&want),
                _ => false,
            };
            if !same {
                return Ok(format!(
                    "left {conf}{ORIG_SUFFIX}: {target} differs from it; restore by hand"
                ));
            }
        }
    }
    fsx::rename(&orig_path, &node.conf_dir.join(conf))?;
    fsx::remove(&target_path)?;
    Ok(format!("restored {conf}"))
}

/// A whole install pass: entries, binaries, chain.
pub fn install_once(node: &Node, src: &Source) -> Result<Applied, InstallError> {
    let entries = load_entries(&src.plugins_file)?;
    let _lock = node.state.lock()?;
    let written = install_binaries(src, node)?;
    if !written.is_empty() {
        super::log(format!(
            "installed {} into {}",
            written.join(", "),
            node.bin_dir.display()
        ));
    }
    apply(node, src, &entries)
}
